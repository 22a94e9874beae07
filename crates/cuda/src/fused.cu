// Kernels added after kernels.cu: the profiler's spin_wait, the split-mode residual fold (add2_rms_norm) and the
// warp-per-channel-group conv (gdn_conv_prep_run).

// Keeps the stream busy for about `cycles` clock cycles (one thread), so that the host can queue a whole
// forward before the GPU starts it: the profiler's events then time the GPU's work, not the host's launches.
KERNEL(simt) void spin_wait(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// The split-mode folds. Consumers of a GEMM run once over both bf16 planes ([hi; lo] stacked as 2N rows): the two halves of
// its output are summed where they are read, so the weights are read once instead of twice.

// x += f[:N] + f[N:] (f: [2N, dim], the lo half `lo` values after the hi half), then RMSNorm as rms_norm (the
// same body, `norm_rows` in kernels.cu). x: [R, dim] stride ldx; out: [R, dim] stride ldo, stored as `store_act`
// with `mode`. One warp per row; grid ceil(R / warps per block).
KERNEL(simt) void add2_rms_norm(float* x, int ldx, const float* __restrict__ f, long long lo,
                                const float* gain, float eps, int dim, void* out, int mode, int ldo,
                                int rows) {
    norm_rows<true>(x, ldx, f, lo, gain, eps, dim, out, mode, ldo, rows);
}

// The gates of row n: g = neg_a * softplus(a + dt_bias), beta = sigmoid(b), one head per lane.
__device__ __forceinline__ void gdn_gates_row(const float* __restrict__ x, int ld, int n, int off_a, int off_b,
                                              const float* neg_a, const float* dt_bias, int hv, float* g,
                                              float* beta, int lane) {
    for (int h = lane; h < hv; h += 32) {
        float a = x[(idx_t)n * ld + off_a + h] + dt_bias[h];
        float sp = a > 20.0f ? a : log1pf(expf(a));
        g[(idx_t)n * hv + h] = neg_a[h] * sp;
        beta[(idx_t)n * hv + h] = sigmoid_f(x[(idx_t)n * ld + off_b + h]);
    }
}

// The channels of conv warp group `grp`: a q or k head (grp < 2 hk, dk channels: L2-normalised) or 128 v channels.
// → whether the group exists (c0, size: its first channel and count).
__device__ __forceinline__ bool conv_group(int grp, int hk, int dk, int cd, int& c0, int& size) {
    const int nqk = 2 * hk, vch = cd - nqk * dk;
    if (grp < nqk) {
        c0 = grp * dk;
        size = dk;
        return true;
    }
    const int vg = grp - nqk;
    c0 = nqk * dk + vg * 128;
    size = min(128, vch - vg * 128);
    return vg * 128 < vch;
}

// One row's conv outputs v (channel lane + 32 i of the group) to o: a q or k head (grp < 2 hk) L2-normalised
// (shuffle reduction, whole warp), q also times scale.
__device__ __forceinline__ void conv_store(const float (&v)[8], int grp, int hk, int size, float scale, float* o,
                                           int lane) {
    const bool norm = grp < 2 * hk;
    float mul = 1.0f;
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (lane + 32 * i < size) ss += v[i] * v[i];
        ss = warp_sum(ss);
        mul = 1.0f / sqrtf(ss + 1e-6f);
        if (grp < hk) mul *= scale;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (lane + 32 * i < size) o[lane + 32 * i] = norm ? v[i] * mul : v[i];
}

// One token's conv outputs for channel group grp (c0, size from conv_group): depthwise causal conv1d + SiLU as
// gdn_conv_prep (the K-1 inputs before a segment from its conv state or parent rows, taps summed in the same order),
// stored through conv_store. The row each tap reads is found once per token, not per channel.
__device__ __forceinline__ void conv_token(const float* __restrict__ x, int ld, float* __restrict__ out,
                                           const float* __restrict__ w, int K, int cd, const int* seg,
                                           const int* tok, const u64* states, const int* par, int hk, float scale,
                                           int n, int grp, int c0, int size, int lane) {
    int s = tok[2 * n];
    int start = seg[3 * s], t = n - start, pend = conv_parent_end(seg, par, s);
    const float* st = (const float*)states[s];
    // The row each tap reads: this token's own rows, the parent's or the conv state's (found once per token: the
    // one-token-per-warp kernel was bound by issuing that index arithmetic per channel, ncu: 62% SM throughput).
    const float* tap[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int tau = t - (K - 1) + j;
        tap[j] = tau >= 0    ? x + (idx_t)(start + tau) * ld
                 : pend >= 0 ? x + (idx_t)(pend + tau) * ld
                             : st + (idx_t)(K - 1 + tau) * cd;
    }
    const bool w4 = K == 4 && ((u64)w & 15) == 0;  // the usual kernel: one 16-byte load of a channel's taps
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int cc = lane + 32 * i;
        v[i] = 0.0f;
        if (cc < size) {
            int c = c0 + cc;
            float acc = 0.0f;
            if (w4) {
                float4 wc = *(const float4*)(w + 4 * c);
                acc += wc.x * tap[0][c];
                acc += wc.y * tap[1][c];
                acc += wc.z * tap[2][c];
                acc += wc.w * tap[3][c];
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < K) acc += w[c * K + j] * tap[j][c];
            }
            v[i] = silu_f(acc);
        }
    }
    conv_store(v, grp, hk, size, scale, out + (idx_t)n * cd + c0, lane);
}

// The Gated DeltaNet mixer inputs, one warp per channel group and run of CONV_RUN consecutive token rows: the q and
// k heads (dk channels each, L2-normalised; q also times `scale`) and the v channels in groups of 128; depthwise
// causal conv1d + SiLU as gdn_conv_prep, the norms with the same per-lane order and shuffle reduction (so the result
// equals gdn_conv_prep's bit for bit), and the gates (block y 0, warp 0). Many small blocks instead of one block per
// token: every load of a warp in flight at once. When a run's rows are one segment's, past its first K - 1 (and K =
// 4), the warp loads the run's CONV_RUN + 3 input rows once and computes every output from them: 7 row loads for 4
// outputs instead of 16 (workload 3's conv op 2.32 -> 2.13 ms, run s11e, against one token per warp; a sliding
// window of 8 rows per warp, each output waiting for its row's load, had gone 2.30 -> 2.61); other runs go token by
// token (conv_token). grid (ceil(N / CONV_RUN), ceil(groups / 4)), block 128; needs dk <= 256; n: the rows.
// gdn_conv_state then advances the states.
#define CONV_RUN 4
KERNEL(simt) void gdn_conv_prep_run(const float* __restrict__ x, int ld, float* __restrict__ out,
                                    const float* __restrict__ w, int K, int cd, const int* seg,
                                    const int* tok, const u64* states, const int* par, int hk, int dk,
                                    float scale,
                                    int off_a, int off_b, const float* neg_a, const float* dt_bias, int hv,
                                    float* g, float* beta, int n) {
    pdl_wait();
    pdl_launch();
    const int n0 = CONV_RUN * blockIdx.x, nt = min(CONV_RUN, n - n0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (blockIdx.y == 0 && warp == 0)
        for (int j = 0; j < nt; j++) gdn_gates_row(x, ld, n0 + j, off_a, off_b, neg_a, dt_bias, hv, g, beta, lane);
    const int grp = blockIdx.y * 4 + warp;
    int c0, size;
    if (!conv_group(grp, hk, dk, cd, c0, size)) return;
    const int s = tok[2 * n0];
    const bool run = K == 4 && ((u64)w & 15) == 0 && nt == CONV_RUN && tok[2 * (n0 + nt - 1)] == s &&
                     n0 - seg[3 * s] >= K - 1;
    if (!run) {
        for (int j = 0; j < nt; j++)
            conv_token(x, ld, out, w, K, cd, seg, tok, states, par, hk, scale, n0 + j, grp, c0, size, lane);
        return;
    }
    const float* r = x + (idx_t)(n0 - 3) * ld;  // rows n0 - 3 .. n0 + CONV_RUN - 1
    float v[CONV_RUN][8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int cc = lane + 32 * i;
#pragma unroll
        for (int j = 0; j < CONV_RUN; j++) v[j][i] = 0.0f;
        if (cc < size) {
            const int c = c0 + cc;
            const float4 wc = *(const float4*)(w + 4 * c);
            float xr[CONV_RUN + 3];
#pragma unroll
            for (int j = 0; j < CONV_RUN + 3; j++) xr[j] = r[(idx_t)j * ld + c];
#pragma unroll
            for (int j = 0; j < CONV_RUN; j++) {
                float acc = 0.0f;
                acc += wc.x * xr[j];
                acc += wc.y * xr[j + 1];
                acc += wc.z * xr[j + 2];
                acc += wc.w * xr[j + 3];
                v[j][i] = silu_f(acc);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_RUN; j++) conv_store(v[j], grp, hk, size, scale, out + (idx_t)(n0 + j) * cd + c0, lane);
}

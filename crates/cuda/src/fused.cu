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
// same body, `norm_rows` in norms.cu). x: [R, dim] stride ldx; out: [R, dim] stride ldo, stored as `store_act`
// with `mode`. One warp per row; grid ceil(R / warps per block).
KERNEL(simt) void add2_rms_norm(float* x, int ldx, const float* __restrict__ f, long long lo,
                                const float* gain, float eps, int dim, void* out, int mode, int ldo,
                                int rows) {
    norm_rows<true>(x, ldx, f, lo, gain, eps, dim, out, mode, ldo, rows);
}

// The gates of rows n0 .. n0 + nt - 1: g = neg_a * softplus(a + dt_bias), beta = sigmoid(b), one (row, head) per
// lane and step, four steps' loads issued before any is used (in one loop each step's loads waited for the step
// before: its stores and the sigmoid's division, whose slow path is a call, came first).
#define GATE_STEPS 4
__device__ __forceinline__ void gdn_gates_rows(const float* __restrict__ x, int ld, int n0, int nt, int off_a,
                                               int off_b, const float* __restrict__ neg_a,
                                               const float* __restrict__ dt_bias, int hv, float* __restrict__ g,
                                               float* __restrict__ beta, int lane) {
    for (int i0 = lane; i0 < nt * hv; i0 += 32 * GATE_STEPS) {
        float a[GATE_STEPS], b[GATE_STEPS], dt[GATE_STEPS], na[GATE_STEPS];
#pragma unroll
        for (int u = 0; u < GATE_STEPS; u++) {
            const int i = i0 + 32 * u, n = n0 + i / hv, h = i % hv;
            const bool in = i < nt * hv;
            a[u] = in ? x[(idx_t)n * ld + off_a + h] : 0.0f;
            b[u] = in ? x[(idx_t)n * ld + off_b + h] : 0.0f;
            dt[u] = in ? dt_bias[h] : 0.0f;
            na[u] = in ? neg_a[h] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GATE_STEPS; u++) {
            const int i = i0 + 32 * u, n = n0 + i / hv, h = i % hv;
            if (i < nt * hv) {
                const float av = a[u] + dt[u];
                const float sp = av > 20.0f ? av : log1pf(expf(av));
                g[(idx_t)n * hv + h] = na[u] * sp;
                beta[(idx_t)n * hv + h] = sigmoid_f(b[u]);
            }
        }
    }
}
#undef GATE_STEPS

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

// One row's conv outputs v to o, v[4 i + e] being channel 128 i + 4 lane + e of the group (NC chunks of 128): a q
// or k head (grp < 2 hk) L2-normalised (shuffle reduction, whole warp), q also times scale. Every caller holds the
// channels the same way and sums the squares in the same order (chunk, then channel), so a row's result does not
// depend on which path computed it. V4: one 16-byte store per chunk (o 16-byte aligned, size a multiple of 4, and v
// 0 on a lane past size: its squares summed without the channel test, the same sum).
template <int NC, bool V4>
__device__ __forceinline__ void conv_store(const float (&v)[4 * NC], int grp, int hk, int size, float scale, float* o,
                                           int lane) {
    const bool norm = grp < 2 * hk;
    float mul = 1.0f;
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 4 * NC; i++)
            if (V4 || 128 * (i / 4) + 4 * lane + i % 4 < size) ss += v[i] * v[i];
        ss = warp_sum(ss);
        mul = 1.0f / sqrtf(ss + 1e-6f);
        if (grp < hk) mul *= scale;
    }
    float r[4 * NC];
#pragma unroll
    for (int i = 0; i < 4 * NC; i++) r[i] = norm ? v[i] * mul : v[i];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        const int c = 128 * i + 4 * lane;
        if constexpr (V4) {
            // (a plain float4 store came out of NVRTC as four 4-byte stores here)
            if (c < size) __stwb((float4*)(o + c), make_float4(r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]));
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (c + e < size) o[c + e] = r[4 * i + e];
        }
    }
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
    // Addressed from the lane's first channel cl, each channel at a constant offset ci from it: one pointer a tap
    // row and one for the weights, not one a channel (which the compiler had kept live across the whole run).
    const int cl = c0 + 4 * lane;
    const float* tap[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int tau = t - (K - 1) + j;
        tap[j] = conv_input_row(x, ld, st, cd, K, start, pend, tau) + cl;
    }
    const bool w4 = K == 4 && ((u64)w & 15) == 0;  // the usual kernel: one 16-byte load of a channel's taps
    const float* wl = w + 4 * cl;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int ci = 128 * (i / 4) + i % 4, cc = 4 * lane + ci;
        v[i] = 0.0f;
        if (cc < size) {
            int c = c0 + cc;
            float acc = 0.0f;
            if (w4) {
                float4 wc = *(const float4*)(wl + 4 * ci);
                acc += wc.x * tap[0][ci];
                acc += wc.y * tap[1][ci];
                acc += wc.z * tap[2][ci];
                acc += wc.w * tap[3][ci];
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < K) acc += w[c * K + j] * tap[j][ci];
            }
            v[i] = silu_f(acc);
        }
    }
    conv_store<2, false>(v, grp, hk, size, scale, out + (idx_t)n * cd + c0, lane);
}

#define CONV_RUN 8
// Output rows n0 .. n0 + m - 1 (m <= R) of channel group grp (size <= 128, a multiple of 4), K = 4, from the window
// xr (row jr: the input of row n0 - 3 + jr, channels 4 lane .. 4 lane + 3; zero on a lane that owns none): four taps
// in order, SiLU, conv_store. With m a constant R (conv_run4) the loop unrolls without exits.
template <int R>
__device__ __forceinline__ void conv_rows4_out(const float4 (&xr)[R + 3], const float* __restrict__ w,
                                               float* __restrict__ out, int cd, int hk, float scale, int n0, int m,
                                               int grp, int c0, int size, int lane) {
    const bool own = 4 * lane < size;
    const float* wl = w + 4 * (c0 + 4 * lane);
    float4 wc[4];  // the taps of channels c0 + 4 lane .. c0 + 4 lane + 3
#pragma unroll
    for (int e = 0; e < 4; e++)
        wc[e] = own ? __ldg((const float4*)(wl + 4 * e)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float* o = out + (idx_t)n0 * cd + c0;
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (j >= m) break;
        const float4 x0 = xr[j], x1 = xr[j + 1], x2 = xr[j + 2], x3 = xr[j + 3];
        const float a0[4] = {x0.x, x0.y, x0.z, x0.w}, a1[4] = {x1.x, x1.y, x1.z, x1.w};
        const float a2[4] = {x2.x, x2.y, x2.z, x2.w}, a3[4] = {x3.x, x3.y, x3.z, x3.w};
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float acc = 0.0f;
            acc += wc[e].x * a0[e];
            acc += wc[e].y * a1[e];
            acc += wc[e].z * a2[e];
            acc += wc[e].w * a3[e];
            // A lane without channels: taps and inputs 0, so acc = 0 and v = silu(0) = 0 (never stored nor summed);
            // no select around the SiLU (which had cost a branch and a convergence barrier a channel).
            v[e] = silu_f(acc);
        }
        conv_store<1, true>(v, grp, hk, size, scale, o, lane);
        o += cd;
    }
}

// Rows n0 .. n0 + m - 1 (m <= R, all of one segment: `start`, parent end `pend`, conv state `st`) of channel group grp
// (size <= 128, a multiple of 4), K = 4: lane owns channels 4 lane .. 4 lane + 3 (one 16-byte load of each of the
// m + 3 window rows, four of the taps, one 16-byte store per output row). The window's rows before the segment come
// from its parent's rows or its conv state, as conv_token's taps; the same sums in the same order.
template <int R>
__device__ __forceinline__ void conv_rows4(const float* __restrict__ x, int ld, float* __restrict__ out,
                                           const float* __restrict__ w, int cd, int start, int pend,
                                           const float* st, int hk, float scale, int n0, int m, int grp, int c0,
                                           int size, int lane) {
    const int c = c0 + 4 * lane;
    const bool own = 4 * lane < size;
    float4 xr[R + 3];  // window row jr: segment time t0 - 3 + jr
#pragma unroll
    for (int jr = 0; jr < R + 3; jr++) {
        const int tau = n0 - start - 3 + jr;
        const float* row = conv_input_row(x, ld, st, cd, 4, start, pend, tau);
        xr[jr] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (own && jr < m + 3) xr[jr] = __ldg((const float4*)(row + c));
    }
    conv_rows4_out<R>(xr, w, out, cd, hk, scale, n0, m, grp, c0, size, lane);
}

// conv_rows4 of a full run whose window lies in its segment's own rows (rows n0 - 3 .. n0 + CONV_RUN - 1 of x): the
// same loads (one row pointer stepped by ld, no segment lookup) and the same conv_rows4_out, for all CONV_RUN rows.
__device__ __forceinline__ void conv_run4(const float* __restrict__ x, int ld, float* __restrict__ out,
                                          const float* __restrict__ w, int cd, int hk, float scale, int n0, int grp,
                                          int c0, int size, int lane) {
    const bool own = 4 * lane < size;
    const float* row = x + (idx_t)(n0 - 3) * ld + c0 + 4 * lane;
    float4 xr[CONV_RUN + 3];
#pragma unroll
    for (int jr = 0; jr < CONV_RUN + 3; jr++) {
        xr[jr] = own ? __ldg((const float4*)row) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        row += ld;
    }
    conv_rows4_out<CONV_RUN>(xr, w, out, cd, hk, scale, n0, CONV_RUN, grp, c0, size, lane);
}

// The Gated DeltaNet mixer inputs, one warp per channel group and run of CONV_RUN consecutive token rows: the q and k
// heads (dk channels each, L2-normalised; q also times `scale`) and the v channels in groups of 128; depthwise causal
// conv1d + SiLU as gdn_conv_prep, and the gates (block y 0, warp 0). Many small blocks instead of one block per token:
// every load of a warp in flight at once. History: with CONV_RUN 4, lane owning channels lane + 32 i (4-byte loads), a
// warp loading a run's 7 input rows once for its 4 outputs (16 loads token by token) when the run was one segment's,
// past its first K - 1, other runs token by token: workload 3's conv op 2.32 -> 2.13 ms, run s11e, against one token
// per warp (a sliding window of 8 rows per warp, each output waiting for its row's load, had gone 2.30 -> 2.61); 122 us
// a layer on a 3,691-token request, about 2x off the H100's bandwidth. Now: lane owns 4 consecutive channels (16-byte
// loads and stores, conv_rows4), runs of 8 (11 row loads for 8 outputs), each segment's part of a run in that path, its
// rows before the segment from the parent or the conv state (H100, the same request: 87 us a layer, 57% of DRAM
// bandwidth at 118 registers; the conv op 2.21 -> 1.73 ms). Then (H100, the same request: 87.3 -> 72.7 us a layer, 68%
// of DRAM bandwidth; the conv op 1.72 -> 1.49 ms): a full run (CONV_RUN rows of a segment that started at least 3 rows
// before them, found by one check of tok) loads its window from x's rows with one stepped pointer, before any segment
// lookup, and unrolls without exits (conv_run4); the SiLU runs on every lane (no branch around it) and the V4 norm sums
// without channel tests; other runs take windows of 4 rows (conv_rows4<4>, 7 loads for 4 outputs) and conv_token
// addresses its channels from one pointer, so that 96 registers hold the kernel without spills (ptxas: 118 before; 5
// blocks of 128 an SM instead of 4). The same sums in the same order on every path: no output bit changes. It needs
// K = 4, groups of at most 128 channels (dk <= 128) and 16-byte aligned rows (x, ld, out, cd, w, dk; a segment's state
// when the window reads it); otherwise token by token (conv_token). Both hold the channels the same way, so the result
// does not depend on the path (batch invariance); it equals gdn_conv_prep's up to the order of the norm's sum. grid
// (ceil(N / CONV_RUN), ceil(groups / 4)), block 128; needs dk <= 256; n: the rows. gdn_conv_state then advances the
// states.
KERNEL(simt) void __launch_bounds__(128, 5)
    gdn_conv_prep_run(const float* __restrict__ x, int ld, float* __restrict__ out, const float* __restrict__ w, int K,
                      int cd, const int* seg, const int* tok, const u64* states, const int* par, int hk, int dk,
                      float scale, int off_a, int off_b, const float* neg_a, const float* dt_bias, int hv, float* g,
                      float* beta, int n) {
    pdl_wait();
    pdl_launch();
    const int n0 = CONV_RUN * blockIdx.x, nt = min(CONV_RUN, n - n0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (blockIdx.y == 0 && warp == 0) gdn_gates_rows(x, ld, n0, nt, off_a, off_b, neg_a, dt_bias, hv, g, beta, lane);
    const int grp = blockIdx.y * 4 + warp;
    int c0, size;
    if (!conv_group(grp, hk, dk, cd, c0, size)) return;
    const bool vec = K == 4 && dk <= 128 && dk % 4 == 0 && cd % 4 == 0 && ld % 4 == 0 &&
                     (((u64)x | (u64)out | (u64)w) & 15) == 0;
    // The usual run: CONV_RUN rows of a segment that started at least 3 rows before them (rows n0 - 3 and n0 +
    // CONV_RUN - 1 of one segment, whose rows are consecutive): one check of tok, not the segment's start, parent
    // and state, before the window's loads.
    if (vec && nt == CONV_RUN && n0 >= 3 && tok[2 * (n0 - 3)] == tok[2 * (n0 + CONV_RUN - 1)]) {
        conv_run4(x, ld, out, w, cd, hk, scale, n0, grp, c0, size, lane);
        return;
    }
    for (int j0 = 0; j0 < nt;) {
        const int s = tok[2 * (n0 + j0)], start = seg[3 * s], pend = conv_parent_end(seg, par, s);
        const int j1 = min(nt, start + seg[3 * s + 1] - n0);  // the run's rows j0 .. j1 - 1 are segment s's
        const float* st = (const float*)states[s];
        if (vec && (n0 + j0 - start >= 3 || pend >= 0 || ((u64)st & 15) == 0))
            for (int j = j0; j < j1; j += 4)
                conv_rows4<4>(x, ld, out, w, cd, start, pend, st, hk, scale, n0 + j, min(4, j1 - j), grp, c0, size,
                              lane);
        else
            for (int j = j0; j < j1; j++)
                conv_token(x, ld, out, w, K, cd, seg, tok, states, par, hk, scale, n0 + j, grp, c0, size, lane);
        j0 = j1;
    }
}

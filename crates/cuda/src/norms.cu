// The row norms: RMSNorm one warp per row (rms_norm, and rms_norm_lean past one wave of it; fused.cu's
// add2_rms_norm runs the same body) and the Gated DeltaNet's gated RMSNorm per value head. Concatenated after
// kernels.cu (nvrtc.rs), whose helpers they use (ld_vec, st_vec, store_act_vec, vec_act_ok, warp_sum).

// The row norms (rms_norm, add2_rms_norm) are latency-bound: a row of 1024 f32 is 4 KB, so a block per row with a
// block-wide reduction spent its time in barriers and the second pass's loads. One warp per row instead (shuffle
// reduction only, no barrier), its values kept in registers between the sum and the store (KEEP per lane: rows of
// dim <= 32 * KEEP are read once; longer ones read their tail again), 16-byte accesses where aligned. KEEP 32 (8
// float4 groups, or 32 single values: a 0.8B row in registers) takes 136 registers (ptxas, sm_90), three blocks of
// 4 warps a multiprocessor; KEEP 16 takes 64 (eight blocks) and reads the second half of a 1024-value row again
// after the reduction, the same sums in the same order, so both give the same bits (H100, 3,691 rows of 1,024:
// 49 norms 0.59 -> 0.54 ms).
#define NORM_KEEP 32
#define NORM_KEEP_LEAN 16

// One row of `norm_rows`, in groups of W values: group g = lane + 32k holds row[W*g .. W*g + W). The first
// KEEP / W groups of each lane stay in registers; the rest are read again (the row written back under ADD2).
// The kernel is latency-bound, so each pass issues all of its loads before it uses any (groups past dim are 0,
// and add nothing). Both kernels run this one body: add2_rms_norm's output is rms_norm's of the summed x, bit for
// bit (when both take the same W).
template <bool ADD2, int W, int KEEP>
__device__ __forceinline__ void norm_row(float* row, const float* __restrict__ fr, long long lo,
                                         const float* gain, float eps, int dim, void* out, idx_t o, int mode,
                                         int lane) {
    constexpr int K = KEEP / W;
    const int ng = dim / W;  // W divides dim (norm_rows)
    float v[K][W], a[K][W], b[K][W], w[K][W];  // a, b: ADD2's f halves; w: gain
#pragma unroll
    for (int k = 0; k < K; ++k) {
        int c = (lane + 32 * k) * W;
        for (int j = 0; j < W; ++j) v[k][j] = a[k][j] = b[k][j] = 0.0f;
        if (c < dim) {
            ld_vec<W>(row + c, v[k]);
            if constexpr (ADD2) {
                ld_vec<W>(fr + c, a[k]);
                ld_vec<W>(fr + c + lo, b[k]);
            }
        }
    }
    if constexpr (ADD2) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            int c = (lane + 32 * k) * W;
            for (int j = 0; j < W; ++j) v[k][j] = v[k][j] + (a[k][j] + b[k][j]);
            if (c < dim) st_vec<W>(row + c, v[k]);
        }
    }
    // The gain's loads go out before the reduction, which hides their latency.
#pragma unroll
    for (int k = 0; k < K; ++k) {
        int c = (lane + 32 * k) * W;
        if (c < dim) ld_vec<W>(gain + c, w[k]);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k)
        for (int j = 0; j < W; ++j) s += v[k][j] * v[k][j];
    for (int g = lane + 32 * K; g < ng; g += 32) {  // dim > 32 * KEEP: the tail, one group at a time
        float t[W];
        ld_vec<W>(row + g * W, t);
        if constexpr (ADD2) {
            float p[W], q[W];
            ld_vec<W>(fr + g * W, p);
            ld_vec<W>(fr + g * W + lo, q);
            for (int j = 0; j < W; ++j) t[j] = t[j] + (p[j] + q[j]);
            st_vec<W>(row + g * W, t);
        }
        for (int j = 0; j < W; ++j) s += t[j] * t[j];
    }
    s = warp_sum(s);
    float inv = 1.0f / sqrtf(s / dim + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        int c = (lane + 32 * k) * W;
        if (c < dim) {
            for (int j = 0; j < W; ++j) v[k][j] = v[k][j] * inv * w[k][j];
            store_act_vec<W>(out, o + c, v[k], mode);
        }
    }
    for (int g = lane + 32 * K; g < ng; g += 32) {
        float t[W], u[W];
        ld_vec<W>(row + g * W, t);  // this lane's own values (under ADD2 the sums it stored above)
        ld_vec<W>(gain + g * W, u);
        for (int j = 0; j < W; ++j) t[j] = t[j] * inv * u[j];
        store_act_vec<W>(out, o + g * W, t, mode);
    }
}

// RMSNorm of row r = blockIdx.x * (warps per block) + warp; under ADD2 x[r] += f[r] + (f[r] `lo` values on) first
// (f: [2R, dim], rows of dim). Warps past `rows` idle. 16-byte accesses when every row of x, f, out (and out's lo
// plane) and gain is 16-byte aligned (8-byte for bf16 out), else one value per lane.
template <bool ADD2, int KEEP = NORM_KEEP>
__device__ __forceinline__ void norm_rows(float* x, int ldx, const float* __restrict__ f, long long lo,
                                          const float* gain, float eps, int dim, void* out, int mode, int ldo,
                                          int rows) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;  // the whole warp: the shuffles in warp_sum see full warps only
    float* row = x + (idx_t)r * ldx;
    const float* fr = ADD2 ? f + (idx_t)r * dim : nullptr;
    idx_t o = (idx_t)r * ldo;
    bool vec = (dim & 3) == 0 && (ldx & 3) == 0 && (ldo & 3) == 0 && aligned16(x) && aligned16(gain) &&
               vec_act_ok(out, mode);
    if constexpr (ADD2) vec = vec && aligned16(f) && (lo & 3) == 0;
    if (vec)
        norm_row<ADD2, 4, KEEP>(row, fr, lo, gain, eps, dim, out, o, mode, lane);
    else
        norm_row<ADD2, 1, KEEP>(row, fr, lo, gain, eps, dim, out, o, mode, lane);
}

// RMSNorm of each row: x * rsqrt(mean(x^2) + eps) * gain, stored as `store_act` with `mode`.
// x: [R, dim] stride ldx; out: [R, dim] stride ldo. One warp per row (`norm_rows`); grid ceil(R / warps per block).
KERNEL(simt) void rms_norm(const float* x, int ldx, const float* gain, float eps, int dim,
                           void* out, int mode, int ldo, int rows) {
    pdl_wait();
    pdl_launch();
    // x is only read: the cast is for norm_rows' add2 variant, which writes its row back.
    norm_rows<false>((float*)x, ldx, nullptr, 0, gain, eps, dim, out, mode, ldo, rows);
}
// rms_norm keeping NORM_KEEP_LEAN values a lane: more blocks a multiprocessor, for row counts that would take the
// full kernel more than one wave (ops.rs). The same bits as rms_norm.
KERNEL(simt) void rms_norm_lean(const float* x, int ldx, const float* gain, float eps, int dim,
                                void* out, int mode, int ldo, int rows) {
    pdl_wait();
    pdl_launch();
    norm_rows<false, NORM_KEEP_LEAN>((float*)x, ldx, nullptr, 0, gain, eps, dim, out, mode, ldo, rows);
}

// Gated RMSNorm of Gated DeltaNet per value head: norm(x) * w * silu(z), stored as `store_act` with `mode`.
// x: [N, HV, DV] f32; z: row n at z + n*ldz, [HV, DV]; out: [N, HV*DV]. One warp per (row, head), rows = N*HV, a
// shuffle reduction and no barrier (a block per (row, head) with block_sum took 11.6 us per call on 402 rows of the
// 0.8B model, ncu). Every load (x, z, w) is issued before the reduction. When dv % 4 == 0, dv <= 256 and every
// pointer allows it, each lane takes 4 adjacent columns (16-byte loads, store_act_vec); else lane + 32k, the first
// 256 values in registers (8 per lane). grid ceil(rows / warps per block).
KERNEL(simt) void rms_norm_gated(const float* x, const float* z, int ldz, const float* w, float eps,
                                 int hv, int dv, void* out, int mode, int rows) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;  // the whole warp: warp_sum sees full warps only
    int n = r / hv, h = r % hv;
    const float* row = x + (idx_t)r * dv;
    const float* zr = z + (idx_t)n * ldz + h * dv;
    const idx_t o = (idx_t)r * dv;
    const bool vec = (dv & 3) == 0 && dv <= 256 && (ldz & 3) == 0 && (h * dv & 3) == 0 && aligned16(x) &&
                     aligned16(z) && aligned16(w) &&
                     vec_act_ok(out, mode);
    float v[8], zv[8], wv[8], s = 0.0f;
    if (vec) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int c = 4 * lane + 128 * k;
            for (int j = 0; j < 4; j++) v[4 * k + j] = zv[4 * k + j] = wv[4 * k + j] = 0.0f;
            if (c < dv) {
                ld_vec<4>(row + c, v + 4 * k);
                ld_vec<4>(zr + c, zv + 4 * k);
                ld_vec<4>(w + c, wv + 4 * k);
            }
        }
#pragma unroll
        for (int k = 0; k < 8; k++) s += v[k] * v[k];
        s = warp_sum(s);
        const float inv = 1.0f / sqrtf(s / dv + eps);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int c = 4 * lane + 128 * k;
            if (c < dv) {
                float t[4];
                for (int j = 0; j < 4; j++) t[j] = v[4 * k + j] * inv * wv[4 * k + j] * silu_f(zv[4 * k + j]);
                store_act_vec<4>(out, o + c, t, mode);
            }
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int c = lane + 32 * k;
        const bool in = c < dv;
        v[k] = in ? row[c] : 0.0f;
        zv[k] = in ? zr[c] : 0.0f;
        wv[k] = in ? w[c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) s += v[k] * v[k];
    for (int c = lane + 256; c < dv; c += 32) s += row[c] * row[c];
    s = warp_sum(s);
    const float inv = 1.0f / sqrtf(s / dv + eps);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int c = lane + 32 * k;
        if (c < dv) store_act(out, o + c, v[k] * inv * wv[k] * silu_f(zv[k]), mode);
    }
    for (int c = lane + 256; c < dv; c += 32) store_act(out, o + c, row[c] * inv * w[c] * silu_f(zr[c]), mode);
}

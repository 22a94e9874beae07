// Decode's kernels (one token per sequence and step), compiled after kernels.cu (whose helpers they use): the
// one-token gated delta step, the few-row bf16 GEMV of the projections and head, and the argmax of greedy decoding.

// One-token gated delta rule step for segments of exactly one row (decode): S *= e^g; d = b (v_j - sum_c S_cj k_c);
// S_cj += k_c d; o_j = sum_c S_cj q_c. A block takes STEP_COLS value columns j of one head: 16 row groups of 16
// columns, each thread holding its column's rows c = rg + 16 i (dk <= 16 * STEP_ROWS) in registers, so S is read
// and written once, every load of a row group independent of the others; the two sums over c are a thread's
// rows, then the 16 groups in order. grid (hv, ceil(dv / STEP_COLS), nseg), 256 threads; shared memory 2*dk floats.
#define STEP_COLS 16
#define STEP_GROUPS 16
#define STEP_ROWS 16
KERNEL(simt) void gdn_step(const float* qkv, int ld, const float* g, const float* beta, float* out,
                           const int* seg, const u64* states, int hk, int hv, int dk, int dv) {
    pdl_wait();
    pdl_launch();
    extern __shared__ float sm[];
    __shared__ float red[STEP_GROUPS][STEP_COLS + 1];
    float* q = sm;
    float* k = sm + dk;
    int h = blockIdx.x, s = blockIdx.z;
    int jj = threadIdx.x % STEP_COLS, rg = threadIdx.x / STEP_COLS;
    int j = blockIdx.y * STEP_COLS + jj;
    bool col = j < dv;
    // Two round trips of loads: the row and the state's address, then everything else (q, k, the gates, this
    // column's v and its state rows) before any is used (loaded where first used, about 20: ptxas waited for each
    // of the 16 state rows before loading the next).
    int row = seg[3 * s];
    float* S = (float*)states[s] + (idx_t)h * dk * dv;
    int kh = h / (hv / hk);
    const float* xr = qkv + (idx_t)row * ld;
    const float gr = g[(idx_t)row * hv + h], b = beta[(idx_t)row * hv + h];
    const float vj = col ? xr[2 * hk * dk + h * dv + j] : 0.0f;
    float sv[STEP_ROWS];
#pragma unroll
    for (int i = 0; i < STEP_ROWS; i++) {
        int c = rg + STEP_GROUPS * i;
        sv[i] = (col && c < dk) ? S[(idx_t)c * dv + j] : 0.0f;
    }
    for (int c = threadIdx.x; c < dk; c += blockDim.x) {
        q[c] = xr[kh * dk + c];
        k[c] = xr[hk * dk + kh * dk + c];
    }
    __syncthreads();
    float decay = expf(gr);
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < STEP_ROWS; i++) {
        int c = rg + STEP_GROUPS * i;
        sv[i] = (col && c < dk) ? sv[i] * decay : 0.0f;
        if (c < dk) kv += sv[i] * k[c];
    }
    red[rg][jj] = kv;
    __syncthreads();
    float total = 0.0f;
    for (int r = 0; r < STEP_GROUPS; r++) total += red[r][jj];
    float d = col ? (vj - total) * b : 0.0f;
    __syncthreads();
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < STEP_ROWS; i++) {
        int c = rg + STEP_GROUPS * i;
        if (col && c < dk) {
            float v = sv[i] + k[c] * d;
            S[(idx_t)c * dv + j] = v;
            o += v * q[c];
        }
    }
    red[rg][jj] = o;
    __syncthreads();
    if (rg == 0 && col) {
        float t = 0.0f;
        for (int r = 0; r < STEP_GROUPS; r++) t += red[r][jj];
        out[((idx_t)row * hv + h) * dv + j] = t;
    }
}

// Small-batch projection (decode): y[r, n] (row stride ldy) = alpha · sum_{e < group} x[r*group + e, :K] · w[n, :K]
// + beta · y[r, n] for the rows / group output rows (rows <= GEMV_ROWS, group 1 or 2), x and w bf16 (or both f16:
// the half precision's projections, alpha undoing their weights' and inputs' powers of two), f32 products and sums.
// Each weight row is read once, 16 bytes per lane: `wpr` warps per row n (see gemv_rows), lanes over K, then a
// warp sum. K, ldx and ldw multiples of 8 and x, w 16-byte aligned (the caller checks). beta 0 (y not read) or 1.
#define GEMV_ROWS 8
// The low and high 16-bit values of a word as f32: bf16, or f16 (HALF).
template <bool HALF>
__device__ __forceinline__ float lo16(unsigned u) {
    return HALF ? h2f((unsigned short)u) : __uint_as_float(u << 16);
}
template <bool HALF>
__device__ __forceinline__ float hi16(unsigned u) {
    return HALF ? h2f((unsigned short)(u >> 16)) : __uint_as_float(u & 0xffff0000u);
}
// The dot product of 8 bf16 (or f16: HALF) values packed in a and b.
template <bool HALF = false>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const unsigned* pa = (const unsigned*)&a;
    const unsigned* pb = (const unsigned*)&b;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s += lo16<HALF>(pa[i]) * lo16<HALF>(pb[i]);
        s += hi16<HALF>(pa[i]) * hi16<HALF>(pb[i]);
    }
    return s;
}
// ROWS: the most x rows of the instantiation (its accumulators and loads live in registers); UNROLL: 16-byte weight
// loads in flight per lane. `wpr` warps (1, 2, 4 or 8) share a weight row, each over every wpr-th 256-value slice of
// K (more loads in flight where N is small), their sums added in warp order through shared memory.
// HALF: x and w hold f16 values instead of bf16.
template <int ROWS, int UNROLL, bool HALF = false>
__device__ __forceinline__ void gemv_rows(const bf16_t* __restrict__ x, int ldx, int rows, int group, int K,
                                          const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y,
                                          int ldy, float beta, int wpr, float alpha = 1.0f) {
    __shared__ float part[8][ROWS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * (8 / wpr) + warp / wpr, slice = warp % wpr;
    bool live = n < N;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    if (live) {
        const bf16_t* wr = w + (idx_t)n * ldw;
#pragma unroll UNROLL
        for (int c = (slice * 32 + lane) * 8; c < K; c += 256 * wpr) {
            uint4 wv = __ldg((const uint4*)(wr + c));
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (r < rows) {
                    uint4 xv = *(const uint4*)(x + (idx_t)r * ldx + c);
                    acc[r] += dot8<HALF>(wv, xv);
                }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        if (r < rows) acc[r] = warp_sum(acc[r]);
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < ROWS; r++) part[warp][r] = acc[r];
        }
        __syncthreads();
        if (slice == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float t = 0.0f;
                for (int i = 0; i < wpr; i++) t += part[warp + i][r];
                acc[r] = t;
            }
        }
    }
    if (!live || lane != 0 || slice != 0) return;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r >= rows) break;
        float v;
        int o;
        if (group == 1) {
            v = acc[r];
            o = r;
        } else {
            if ((r & 1) || r + 1 >= ROWS) continue;
            v = acc[r] + acc[r + 1];
            o = r / 2;
        }
        if (HALF) v *= alpha;
        float* yo = y + (idx_t)o * ldy + n;
        *yo = beta != 0.0f ? v + beta * *yo : v;
    }
}
// rows <= 2 (one decode row in split precision, or two plain ones), and rows <= GEMV_ROWS. grid ceil(N / (8 / wpr)),
// 256 threads.
KERNEL(simt) void gemv_bf16_2(const bf16_t* __restrict__ x, int ldx, int rows, int group, int K,
                              const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y, int ldy,
                              float beta, int wpr) {
    pdl_wait();
    pdl_launch();
    gemv_rows<2, 8>(x, ldx, rows, group, K, w, ldw, N, y, ldy, beta, wpr);
}
KERNEL(simt) void gemv_bf16_8(const bf16_t* __restrict__ x, int ldx, int rows, int group, int K,
                              const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y, int ldy,
                              float beta, int wpr) {
    pdl_wait();
    pdl_launch();
    gemv_rows<GEMV_ROWS, 4>(x, ldx, rows, group, K, w, ldw, N, y, ldy, beta, wpr);
}
// The same over f16 x and w (group 1), the sums times alpha.
KERNEL(simt) void gemv_half_2(const bf16_t* __restrict__ x, int ldx, int rows, int K, const bf16_t* __restrict__ w,
                             int ldw, int N, float* __restrict__ y, int ldy, float beta, int wpr, float alpha) {
    pdl_wait();
    pdl_launch();
    gemv_rows<2, 8, true>(x, ldx, rows, 1, K, w, ldw, N, y, ldy, beta, wpr, alpha);
}
KERNEL(simt) void gemv_half_8(const bf16_t* __restrict__ x, int ldx, int rows, int K, const bf16_t* __restrict__ w,
                             int ldw, int N, float* __restrict__ y, int ldy, float beta, int wpr, float alpha) {
    pdl_wait();
    pdl_launch();
    gemv_rows<GEMV_ROWS, 4, true>(x, ldx, rows, 1, K, w, ldw, N, y, ldy, beta, wpr, alpha);
}

// Decode's norm and input projection in one launch, for one token row x [K] f32: y[n] = sum over the planes of
// plane(rms_norm(x) * gain) · w[n], the normed row rounded to bf16 (PLANES 1) or split into bf16 hi and lo planes
// (PLANES 2, split precision), in dynamic shared memory (2 * PLANES * K bytes); then as gemv_bf16 over those rows.
// Every block forms the norm itself (x is read by every block, from L2), so no launch writes it. grid and wpr as
// gemv_bf16, 256 threads; K a multiple of 8.
// HALF (PLANES 1): the normed row rounded to f16 and w f16, the sums times alpha.
template <int PLANES, bool HALF = false>
__device__ __forceinline__ void gemv_norm(const float* __restrict__ x, const float* __restrict__ gain, float eps,
                                          int K, const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y,
                                          int wpr, float alpha = 1.0f) {
    extern __shared__ float sm[];
    bf16_t* xs = (bf16_t*)sm;
    float s = 0.0f;
    for (int c = threadIdx.x; c < K; c += blockDim.x) s += x[c] * x[c];
    s = block_sum(s);
    float inv = 1.0f / sqrtf(s / K + eps);
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        float v = x[c] * inv * gain[c];
        if (HALF) {
            xs[c] = f2h(v);
            continue;
        }
        bf16_t h = f2bf(v);
        xs[c] = h;
        if (PLANES == 2) xs[K + c] = f2bf(v - bf2f(h));
    }
    __syncthreads();
    gemv_rows<2, 8, HALF>(xs, K, PLANES, PLANES, K, w, ldw, N, y, N, 0.0f, wpr, alpha);
}
KERNEL(simt) void gemv_norm_bf16(const float* __restrict__ x, const float* __restrict__ gain, float eps, int K,
                                 int planes, const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y,
                                 int wpr) {
    if (planes == 2)
        gemv_norm<2>(x, gain, eps, K, w, ldw, N, y, wpr);
    else
        gemv_norm<1>(x, gain, eps, K, w, ldw, N, y, wpr);
}
// gemv_norm_bf16 with one f16 plane and f16 weights (the half precision), the sums times alpha.
KERNEL(simt) void gemv_norm_half(const float* __restrict__ x, const float* __restrict__ gain, float eps, int K,
                                const bf16_t* __restrict__ w, int ldw, int N, float* __restrict__ y, int wpr,
                                float alpha) {
    gemv_norm<1, true>(x, gain, eps, K, w, ldw, N, y, wpr, alpha);
}

// Greedy decoding's next token: out[r] = the index of the highest of x[r, :n] (the lowest index among equal ones;
// NaN never wins; 0 when nothing beats -inf), as the host's argmax over the same logits. grid rows, 1024 threads.
// The warp's highest (v, i), the lowest i among equal v; every lane gets it.
__device__ __forceinline__ void argmax_warp(float& v, int& i) {
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (v2 > v || (v2 == v && i2 < i)) {
            v = v2;
            i = i2;
        }
    }
}
// The block's highest (v, i), the lowest i among equal v, in every lane of warp 0 (the other warps keep their own).
// Every thread of the block calls it; blockDim.x a multiple of 32, at most 1024; it may be called again in a kernel.
__device__ __forceinline__ void argmax_block(float& v, int& i) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    argmax_warp(v, i);
    int wi = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();  // a call before this one has read bv and bi
    if (l == 0) {
        bv[wi] = v;
        bi[wi] = i;
    }
    __syncthreads();
    if (wi == 0) {
        int nw = blockDim.x >> 5;
        v = l < nw ? bv[l] : -__int_as_float(0x7f800000);
        i = l < nw ? bi[l] : 0x7fffffff;
        argmax_warp(v, i);
    }
}
KERNEL(simt) void argmax_rows(const float* __restrict__ x, int n, int* __restrict__ out) {
    pdl_wait();
    pdl_launch();
    const float* xr = x + (idx_t)blockIdx.x * n;
    float v = -__int_as_float(0x7f800000);
    int i = 0x7fffffff;
#pragma unroll 8
    for (int c = threadIdx.x; c < n; c += blockDim.x) {
        float t = xr[c];
        if (t > v) {
            v = t;
            i = c;
        }
    }
    argmax_block(v, i);
    if (threadIdx.x == 0) out[blockIdx.x] = i == 0x7fffffff ? 0 : i;
}

// Greedy decoding's head and pick in one launch: out[0] = the n of the highest bf16(h) · w[n] over the N weight rows
// (the lowest n among equal values; NaN never wins; 0 when nothing beats -inf). Each product is formed as gemv_bf16
// forms it for one x row (lanes over K in 16-byte loads, in the same order, then the warp sum), so the pick is the
// argmax of the head's logits; h [K] f32 is rounded to bf16 as to_bf16 rounds it, into shared memory (2K bytes of
// dynamic shared memory). Each warp takes rows warp, warp + W, ... (W: the grid's warps) and keeps its best; the
// block's best goes to (part_v, part_i)[block]; the last block to finish picks among the blocks' and sets *count back
// to 0 for the next launch. K and ldw multiples of 8, w 16-byte aligned. grid at most HEAD_BLOCKS, 256 threads.
#define HEAD_BLOCKS 2048
KERNEL(simt) void head_argmax_bf16(const float* __restrict__ h, int K, const bf16_t* __restrict__ w, int ldw,
                                   int N, float* part_v, int* part_i, unsigned* count, int* out) {
    extern __shared__ float sm[];
    bf16_t* xs = (bf16_t*)sm;
    __shared__ bool last;
    for (int c = threadIdx.x; c < K; c += blockDim.x) xs[c] = f2bf(h[c]);
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float v = -__int_as_float(0x7f800000);
    int i = 0x7fffffff;
    for (int n = blockIdx.x * 8 + warp; n < N; n += gridDim.x * 8) {
        const bf16_t* wr = w + (idx_t)n * ldw;
        float acc = 0.0f;
#pragma unroll 8
        for (int c = lane * 8; c < K; c += 256) acc += dot8(__ldg((const uint4*)(wr + c)), *(const uint4*)(xs + c));
        acc = warp_sum(acc);
        // Rows ascend within a warp, so a tie keeps the lower one.
        if (acc > v) {
            v = acc;
            i = n;
        }
    }
    argmax_block(v, i);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = i;
        __threadfence();
        last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    v = -__int_as_float(0x7f800000);
    i = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        float v2 = __ldcg(part_v + b);
        int i2 = __ldcg(part_i + b);
        if (v2 > v || (v2 == v && i2 < i)) {
            v = v2;
            i = i2;
        }
    }
    argmax_block(v, i);
    if (threadIdx.x == 0) {
        out[0] = i == 0x7fffffff ? 0 : i;
        *count = 0;
    }
}

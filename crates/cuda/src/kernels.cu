// onepass CUDA kernels, compiled at run time by NVRTC (see runtime.rs). No headers: bf16 is
// handled as raw 16-bit words so that NVRTC needs no include path.
//
// Conventions: row-major buffers, outermost dimension first; `ld` is a row stride in elements.
// Segment tables: seg[3*s + {0,1,2}] = {start row, rows, position of the first row}; tok[2*n + {0,1}]
// = {segment, position} of stacked row n; state pointer tables hold one device address per segment.

// Kernel groups: KERNEL(group) opens every kernel (`simt`, or the kernel's own name for the tensor-core kernels).
// runtime.rs compiles the source as several NVRTC programs at once and defines KERNEL so that each program compiles
// the kernels of its own groups; a kernel of another group becomes a template that is never instantiated (parsed,
// not compiled). Without that definition (tools/cuda/ptx-check.py) every kernel is compiled.
#ifndef KERNEL
#define KERNEL(group) extern "C" __global__
#endif

typedef unsigned short bf16_t;
typedef unsigned long long u64;
typedef unsigned long long idx_t;

__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(((unsigned)x) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                              // round to nearest even
    return (bf16_t)(u >> 16);
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// A GEMM input value, its form chosen per launch by `mode`: 0 bf16, 1 f32 (the exact mode), 2 to 255 f16 of v
// times 2^(mode - 128) (the half precision: 2^-11 relative, the scaled values bounded well inside f16's range; the
// factor's f32 bits are (mode - 1) << 23), negative: split into two bf16 planes -mode values apart, hi = bf16(v)
// at i and lo = bf16(v - hi) at i - mode (hi + lo carries v to about 2^-16 relative; the GEMM multiplies both
// planes).
__device__ __forceinline__ float act_scale(int mode) { return __int_as_float((mode - 1) << 23); }
__device__ __forceinline__ void store_act(void* out, idx_t i, float v, int mode) {
    if (mode == 1) {
        ((float*)out)[i] = v;
        return;
    }
    if (mode >= 2) {
        ((unsigned short*)out)[i] = f2h(v * act_scale(mode));
        return;
    }
    bf16_t h = f2bf(v);
    ((bf16_t*)out)[i] = h;
    if (mode < 0) ((bf16_t*)out)[i + (idx_t)(-(long long)mode)] = f2bf(v - bf2f(h));
}
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// One value of a weight row stored as `mode` says: 0 bf16, 1 f32, 2 PQ2_0, 3 Q8_0, 4 f16 (d: the scales of 2 and 3;
// the block formats' device layout is in quant.cu).
__device__ __forceinline__ float load_wq(const void* w, const unsigned short* d, int mode, idx_t row, int K,
                                         int c) {
    if (mode == 0) return bf2f(((const bf16_t*)w)[row * K + c]);
    if (mode == 1) return ((const float*)w)[row * K + c];
    if (mode == 4) return h2f(((const unsigned short*)w)[row * K + c]);
    const unsigned char* q = (const unsigned char*)w;
    if (mode == 2) {
        int code = (q[row * (K / 4) + c / 4] >> (2 * (c & 3))) & 3;
        return (float)(code - 1) * h2f(d[row * (K / 128) + c / 128]);
    }
    return (float)(signed char)q[row * K + c] * h2f(d[row * (K / 32) + c / 32]);
}

// Programmatic dependent launch (Hopper on; a no-op before sm_90 and for a kernel launched without the attribute):
// a kernel that the host launches with `launch_pdl!` (runtime.rs) may start while the kernel before it in the stream
// is finishing, so it calls pdl_wait() before its first read of anything an earlier kernel wrote and its first
// write (the weights, which nothing writes, may be read before), in every block and on every path: a block that
// returned without it would let the kernels after it overtake the one before. pdl_launch() lets the next kernel
// start its own launch early (it still waits for this one's completion in its pdl_wait()).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    v = warp_sum(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = (l < (int)(blockDim.x >> 5)) ? part[l] : 0.0f;
        s = warp_sum(s);
        if (l == 0) total = s;
    }
    __syncthreads();
    return total;
}

// x[n, :] = embed[ids[n], :]        embed: [V, H] stored as `load_wq`'s mode says; x: [N, H] f32. grid N.
KERNEL(simt) void embed_gather(const void* embed, const unsigned short* d, int mode, const int* ids, float* x,
                               int hid) {
    int n = blockIdx.x;
    idx_t row = ids[n];
    for (int c = threadIdx.x; c < hid; c += blockDim.x) x[(idx_t)n * hid + c] = load_wq(embed, d, mode, row, hid, c);
}

// W consecutive floats at p (W = 4: p 16-byte aligned).
template <int W>
__device__ __forceinline__ void ld_vec(const float* p, float* v) {
    if constexpr (W == 4) {
        float4 t = *(const float4*)p;
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
        v[0] = *p;
    }
}
template <int W>
__device__ __forceinline__ void st_vec(float* p, const float* v) {
    if constexpr (W == 4) {
        *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        *p = v[0];
    }
}
// store_act of W consecutive values at i; for W = 4, i % 4 == 0 and out (and the lo plane, -mode values on)
// 16-byte (f32) or 8-byte (bf16, f16) aligned: vec_act_ok.
template <int W>
__device__ __forceinline__ void store_act_vec(void* out, idx_t i, const float* v, int mode) {
    if constexpr (W == 4) {
        if (mode == 1) {
            st_vec<4>((float*)out + i, v);
            return;
        }
        bf16_t h[4];
        for (int j = 0; j < 4; ++j) h[j] = mode >= 2 ? f2h(v[j] * act_scale(mode)) : f2bf(v[j]);
        *(uint2*)((bf16_t*)out + i) = make_uint2(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16));
        if (mode < 0) {
            bf16_t l[4];
            for (int j = 0; j < 4; ++j) l[j] = f2bf(v[j] - bf2f(h[j]));
            *(uint2*)((bf16_t*)out + i + (idx_t)(-(long long)mode)) =
                make_uint2(l[0] | ((unsigned)l[1] << 16), l[2] | ((unsigned)l[3] << 16));
        }
    } else {
        store_act(out, i, v[0], mode);
    }
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }
__device__ __forceinline__ bool aligned8(const void* p) { return ((u64)p & 7) == 0; }
// Whether store_act_vec<4> takes `out` in `mode`: 16-byte aligned for f32, 8-byte for bf16 and f16, and a split
// mode's lo plane a multiple of 4 values on.
__device__ __forceinline__ bool vec_act_ok(const void* out, int mode) {
    return mode == 1 ? aligned16(out) : aligned8(out) && (mode >= 0 || (mode & 3) == 0);
}

// Chunked gated delta rule in the WY form, in two launches: a parallel pre-pass over every chunk of every
// (segment, value head), then a state pass per (value head, segment, slice of value columns) that only carries S.
// Per chunk of n <= GDN_C tokens with cumulative log decay gam,
//   A_ij = b_i (k_i.k_j) e^(gam_i - gam_j) (j < i),  M_ij = (q_i.k_j) e^(gam_i - gam_j) (j <= i),
// and T = (I + A)^-1:
//   U = T diag(b) V,  W = T diag(b e^gam) K      (so the chunk's v' = U - W S)
//   o_t = e^gam_t q_t S + sum_{b<=t} M_tb v'_b,  S <- e^gam_last S + sum_t e^(gam_last - gam_t) k_t (x) v'_t
// Scratch, indexed by stacked token row r and value head h: U [N, HV, DV], W [N, HV, DK], M [N, HV, GDN_C]
// (row t of its chunk; zero past t), E [N, HV, 2] = (e^gam_t, e^(gam_last - gam_t)).
#define GDN_C 64

// dst[t * ldd + c] = rs[t] * src[t * lds + c] (rs null: 1) for t < n, c < w: 16 loads per thread in flight
// before the first store (a loop of one load then one store waits a full memory latency per element).
__device__ __forceinline__ void tile_load(float* __restrict__ dst, int ldd, const float* __restrict__ src, idx_t lds,
                                          int n, int w, const float* rs) {
    int nt = blockDim.x;
    if (w <= nt) {
        // Thread owns column tid % w of every (nt / w)-th row: no division per element.
        int rstep = nt / w, c = threadIdx.x % w, r0 = threadIdx.x / w;
        if (r0 >= rstep) return;
        for (int t0 = r0; t0 < n; t0 += 16 * rstep) {
            float v[16];
#pragma unroll
            for (int u = 0; u < 16; u++) {
                int t = t0 + u * rstep;
                v[u] = t < n ? src[(idx_t)t * lds + c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 16; u++) {
                int t = t0 + u * rstep;
                if (t < n) dst[t * ldd + c] = rs ? rs[t] * v[u] : v[u];
            }
        }
        return;
    }
    int total = n * w;
    for (int i0 = threadIdx.x; i0 < total; i0 += 16 * nt) {
        float v[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {
            int i = i0 + u * nt;
            v[u] = i < total ? src[(idx_t)(i / w) * lds + i % w] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
            int i = i0 + u * nt;
            if (i < total) {
                int t = i / w;
                dst[t * ldd + i % w] = rs ? rs[t] * v[u] : v[u];
            }
        }
    }
}

// Pre-pass. grid (max chunks per segment, nseg, hv), block 256 (the 64x64 products as 4x4 tiles per thread);
// dynamic shared memory (2*GDN_C*(dk+1) + GDN_C*GDN_C + 3*GDN_C) floats. The solve is one thread per column
// of [U | W], its 64 unknowns in registers (rows past n have zero A rows and right-hand sides).
KERNEL(gdn_wy_prep) void __launch_bounds__(256) gdn_wy_prep(const float* __restrict__ qkv, int ld,
                                                            const float* __restrict__ g,
                                                            const float* __restrict__ beta, const int* seg, int hk,
                                                            int hv, int dk, int dv, float* __restrict__ U,
                                                            float* __restrict__ W, float* __restrict__ M,
                                                            float* __restrict__ E) {
    extern __shared__ float sm[];
    int lk = dk + 1;
    float* Q = sm;                 // [C, dk+1]
    float* K = Q + GDN_C * lk;     // [C, dk+1]
    float* A = K + GDN_C * lk;     // [C, C]
    float* gam = A + GDN_C * GDN_C;
    float* bet = gam + GDN_C;
    float* eg = bet + GDN_C;
    int ci = blockIdx.x, s = blockIdx.y, h = blockIdx.z, tid = threadIdx.x, nt = blockDim.x;
    int start = seg[3 * s], len = seg[3 * s + 1];
    int c0 = ci * GDN_C;
    if (c0 >= len) return;
    int n = min(GDN_C, len - c0), r0 = start + c0;
    int kh = h / (hv / hk);
    // Rows past n stay unset: every product that reads them is masked below.
    tile_load(Q, lk, qkv + (idx_t)r0 * ld + kh * dk, ld, n, dk, nullptr);
    tile_load(K, lk, qkv + (idx_t)r0 * ld + hk * dk + kh * dk, ld, n, dk, nullptr);
    for (int t = tid; t < GDN_C; t += nt) {
        float gv = 0.0f, bv = 0.0f;
        if (t < n) {
            idx_t r = (idx_t)(r0 + t) * hv + h;
            gv = g[r];
            bv = beta[r];
        }
        gam[t] = gv;  // g until the scan below
        bet[t] = bv;
    }
    __syncthreads();
    // Cumulative log decay: thread t sums g_0..g_t in order (the CPU's order).
    float cum = 0.0f;
    if (tid < GDN_C)
        for (int t = 0; t <= tid; t++) cum += gam[t];
    __syncthreads();
    if (tid < GDN_C) {
        gam[tid] = cum;
        eg[tid] = expf(cum);
    }
    __syncthreads();
    if (tid < n) {
        idx_t r = (idx_t)(r0 + tid) * hv + h;
        E[2 * r] = eg[tid];
        E[2 * r + 1] = expf(gam[n - 1] - gam[tid]);
    }
    // A and M: thread (ta, tb) owns rows ta + 16i, columns tb + 16j.
    {
        int ta = tid >> 4, tb = tid & 15;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) kk[i][j] = qk[i][j] = 0.0f;
        for (int c = 0; c < dk; c++) {
            float ka[4], qa[4], kb[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                ka[i] = K[(ta + 16 * i) * lk + c];
                qa[i] = Q[(ta + 16 * i) * lk + c];
                kb[i] = K[(tb + 16 * i) * lk + c];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kk[i][j] += ka[i] * kb[j];
                    qk[i][j] += qa[i] * kb[j];
                }
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int a = ta + 16 * i, b = tb + 16 * j;
                bool live = a < n && b <= a;
                float d = live ? expf(gam[a] - gam[b]) : 0.0f;
                A[a * GDN_C + b] = (live && b < a) ? bet[a] * kk[i][j] * d : 0.0f;
                if (a < n) M[((idx_t)(r0 + a) * hv + h) * GDN_C + b] = live ? qk[i][j] * d : 0.0f;
            }
    }
    __syncthreads();
    // Forward substitution (I + A) x = r for each column of [U | W].
    for (int col = tid; col < dv + dk; col += nt) {
        bool isu = col < dv;
        float x[GDN_C];
#pragma unroll
        for (int t = 0; t < GDN_C; t++) {
            float r = 0.0f;
            if (t < n)
                r = isu ? bet[t] * qkv[(idx_t)(r0 + t) * ld + 2 * hk * dk + h * dv + col]
                        : bet[t] * eg[t] * K[t * lk + col - dv];
            x[t] = r;
        }
#pragma unroll
        for (int i = 1; i < GDN_C; i++) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < i; j++) acc += A[i * GDN_C + j] * x[j];
            x[i] -= acc;
        }
#pragma unroll
        for (int t = 0; t < GDN_C; t++) {
            if (t < n) {
                idx_t r = (idx_t)(r0 + t) * hv + h;
                if (isu) U[r * dv + col] = x[t]; else W[r * dk + col - dv] = x[t];
            }
        }
    }
}

// State pass. grid (hv, nseg, ceil(dv/dvs)), block 256, dvs in {8, 16, 32}; dynamic shared memory
// (dk*dvs + 2*GDN_C*(dk+1) + GDN_C*(GDN_C+1) + GDN_C*dvs + 2*GDN_C) floats. Per chunk, the block's S[:, j0:j0+dvs]
// (shared memory) goes through v' = U - W S, o = e^gam Q S + M v', S <- e^gam_last S + (e^(gam_last-gam) K)^T v';
// thread (rg, j) owns column j and rows rg, rg + 256/dvs, ... of each product. W, M and Q load in one phase,
// the decayed K (into W's buffer) in a second, overlapping the o product: four barriers per chunk.
template <int DVS>
__device__ __forceinline__ void gdn_wy_state_t(const float* __restrict__ qkv, int ld, const float* __restrict__ U,
                                               const float* __restrict__ W, const float* __restrict__ M,
                                               const float* __restrict__ E, float* __restrict__ out, const int* seg,
                                               const u64* states, int hk, int hv, int dk, int dv, float* sm) {
    const int dvs = DVS, NG = 256 / DVS;  // NG row groups; rows per thread: GDN_C / NG in v' and o, dk / NG in S
    int lk = dk + 1, lm = GDN_C + 1;
    float* S = sm;                  // [dk, dvs]
    float* X = S + dk * dvs;        // [C, dk+1]: W, then the decayed K
    float* X2 = X + GDN_C * lk;     // [C, dk+1]: Q
    float* Ms = X2 + GDN_C * lk;    // [C, C+1]
    float* Vp = Ms + GDN_C * lm;    // [C, dvs]
    float* eg = Vp + GDN_C * dvs;   // [C]
    float* ed = eg + GDN_C;         // [C]
    int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int j0 = blockIdx.z * dvs, w = min(dvs, dv - j0);
    int start = seg[3 * s], len = seg[3 * s + 1];
    int kh = h / (hv / hk);
    float* Sg = (float*)states[s] + (idx_t)h * dk * dv;
    for (int i = tid; i < dk * dvs; i += nt)
        if (i % dvs >= w) S[i] = 0.0f;  // columns past dv (the loads below fill the rest)
    tile_load(S, dvs, Sg + j0, dv, dk, w, nullptr);
    int j = tid % dvs, rg = tid / dvs;
    bool jok = j < w;
    for (int c0 = 0; c0 < len; c0 += GDN_C) {
        int n = min(GDN_C, len - c0), r0 = start + c0;
        __syncthreads();
        tile_load(X, lk, W + ((idx_t)r0 * hv + h) * dk, (idx_t)hv * dk, n, dk, nullptr);
        tile_load(Ms, lm, M + ((idx_t)r0 * hv + h) * GDN_C, (idx_t)hv * GDN_C, n, GDN_C, nullptr);
        tile_load(X2, lk, qkv + (idx_t)r0 * ld + kh * dk, ld, n, dk, nullptr);
        for (int t = tid; t < n; t += nt) {
            idx_t r = (idx_t)(r0 + t) * hv + h;
            eg[t] = E[2 * r];
            ed[t] = E[2 * r + 1];
        }
        __syncthreads();
        // v' = U - W S
        {
            const int RT = GDN_C / NG;
            int t0 = rg;
            float acc[RT];
#pragma unroll
            for (int i = 0; i < RT; i++) acc[i] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < dk; c++) {
                float sv = S[c * dvs + j];
#pragma unroll
                for (int i = 0; i < RT; i++) acc[i] += X[(t0 + i * NG) * lk + c] * sv;
            }
#pragma unroll
            for (int i = 0; i < RT; i++) {
                int t = t0 + i * NG;
                if (t < n) Vp[t * dvs + j] = jok ? U[((idx_t)(r0 + t) * hv + h) * dv + j0 + j] - acc[i] : 0.0f;
            }
        }
        __syncthreads();
        // The decayed K for the S update goes into X (W is done) while the block computes o.
        tile_load(X, lk, qkv + (idx_t)r0 * ld + hk * dk + kh * dk, ld, n, dk, ed);
        // o = e^gam Q S + M v'
        {
            const int RT = GDN_C / NG;
            int t0 = rg;
            float acc[RT];
#pragma unroll
            for (int i = 0; i < RT; i++) acc[i] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < dk; c++) {
                float sv = S[c * dvs + j];
#pragma unroll
                for (int i = 0; i < RT; i++) acc[i] += X2[(t0 + i * NG) * lk + c] * sv;
            }
#pragma unroll
            for (int i = 0; i < RT; i++) {
                int t = t0 + i * NG;
                if (t < n) {
                    float o = eg[t] * acc[i];
#pragma unroll 4
                    for (int b = 0; b <= t; b++) o += Ms[t * lm + b] * Vp[b * dvs + j];
                    if (jok) out[((idx_t)(r0 + t) * hv + h) * dv + j0 + j] = o;
                }
            }
        }
        __syncthreads();
        // S <- e^gam_last S + Kd^T v'
        float el = eg[n - 1];
        const int RC = 128 / NG;  // rows of S per thread per pass (one pass when dk <= 128)
        for (int cb = rg; cb < dk; cb += RC * NG) {
            float acc[RC];
#pragma unroll
            for (int i = 0; i < RC; i++) acc[i] = 0.0f;
#pragma unroll 2
            for (int t = 0; t < n; t++) {
                float vv = Vp[t * dvs + j];
#pragma unroll
                for (int i = 0; i < RC; i++) {
                    int c = min(cb + i * NG, dk - 1);  // rows past dk compute a duplicate, never stored
                    acc[i] += X[t * lk + c] * vv;
                }
            }
#pragma unroll
            for (int i = 0; i < RC; i++) {
                int c = cb + i * NG;
                if (c < dk) S[c * dvs + j] = el * S[c * dvs + j] + acc[i];
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < dk * dvs; i += nt) {
        int c = i / dvs, jj = i % dvs;
        if (jj < w) Sg[(idx_t)c * dv + j0 + jj] = S[i];
    }
}

// State pass. grid (hv, nseg, ceil(dv/dvs)), block 256, dvs in {8, 16, 32}.
KERNEL(gdn_wy_state) void __launch_bounds__(256) gdn_wy_state(const float* __restrict__ qkv, int ld,
                                                              const float* __restrict__ U,
                                                              const float* __restrict__ W,
                                                              const float* __restrict__ M,
                                                              const float* __restrict__ E, float* __restrict__ out,
                                                              const int* seg, const u64* states,
                                                              int hk, int hv, int dk, int dv, int dvs) {
    extern __shared__ float sm[];
    if (dvs == 8) gdn_wy_state_t<8>(qkv, ld, U, W, M, E, out, seg, states, hk, hv, dk, dv, sm);
    else if (dvs == 16) gdn_wy_state_t<16>(qkv, ld, U, W, M, E, out, seg, states, hk, hv, dk, dv, sm);
    else gdn_wy_state_t<32>(qkv, ld, U, W, M, E, out, seg, states, hk, hv, dk, dv, sm);
}

// The conv inputs before a segment: a child segment (par[s] >= 0: it continues its parent segment of the same
// forward, see CudaModel::forward_tree) reads its parent's last rows of x, at least K-1 of them (the host's rule);
// any other segment its conv state. → the row of x that segment time tau < 0 reads, or -1 for the conv state.
__device__ __forceinline__ int conv_parent_end(const int* seg, const int* par, int s) {
    int p = par ? par[s] : -1;
    return p >= 0 ? seg[3 * p] + seg[3 * p + 1] : -1;
}
// The input row segment time tau of a segment (first row `start`, conv_parent_end `pend`, conv state `st` of K - 1
// rows of cd) reads: its own row of x (tau >= 0), its parent's, or its conv state's.
__device__ __forceinline__ const float* conv_input_row(const float* x, int ld, const float* st, int cd, int K,
                                                       int start, int pend, int tau) {
    return tau >= 0    ? x + (idx_t)(start + tau) * ld
           : pend >= 0 ? x + (idx_t)(pend + tau) * ld
                       : st + (idx_t)(K - 1 + tau) * cd;
}

// The Gated DeltaNet mixer inputs of one token per block, parallel over tokens: depthwise causal conv1d + SiLU
// (the K-1 inputs before the segment come from its conv state, which this kernel only reads), then the L2 norm
// of each q and k head (q also times `scale`; one warp per head), then the gates g = neg_a * softplus(a +
// dt_bias), beta = sigmoid(b). x: [N, ld] (channels 0..cd; a, b at off_a, off_b); out: [N, cd]; w: [cd, K];
// g, beta: [N, HV]; tok: [N, 2]; states[s]: [K-1, cd]; par: [S] or null (conv_parent_end). grid N, block 256.
// gdn_conv_state then advances the states.
KERNEL(simt) void gdn_conv_prep(const float* __restrict__ x, int ld, float* __restrict__ out,
                                const float* __restrict__ w, int K, int cd,
                                const int* seg, const int* tok, const u64* states, const int* par, int hk,
                                int dk,
                                float scale, int off_a, int off_b, const float* neg_a,
                                const float* dt_bias, int hv, float* g, float* beta) {
    int n = blockIdx.x, tid = threadIdx.x;
    int s = tok[2 * n];
    int start = seg[3 * s], t = n - start, pend = conv_parent_end(seg, par, s);
    const float* st = (const float*)states[s];
#pragma unroll 4
    for (int c = tid; c < cd; c += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j < K) {
                int tau = t - (K - 1) + j;
                float xv = tau >= 0    ? x[(idx_t)(start + tau) * ld + c]
                           : pend >= 0 ? x[(idx_t)(pend + tau) * ld + c]
                                       : st[(idx_t)(K - 1 + tau) * cd + c];
                acc += w[c * K + j] * xv;
            }
        }
        out[(idx_t)n * cd + c] = silu_f(acc);
    }
    __syncthreads();
    int warp = tid >> 5, lane = tid & 31, nw = blockDim.x >> 5;
    for (int hh = warp; hh < 2 * hk; hh += nw) {
        float* row = out + (idx_t)n * cd + hh * dk;
        float ss = 0.0f;
        for (int c = lane; c < dk; c += 32) ss += row[c] * row[c];
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss + 1e-6f);
        if (hh < hk) inv *= scale;
        for (int c = lane; c < dk; c += 32) row[c] *= inv;
    }
    for (int h = tid; h < hv; h += blockDim.x) {
        float a = x[(idx_t)n * ld + off_a + h] + dt_bias[h];
        float sp = a > 20.0f ? a : log1pf(expf(a));
        g[(idx_t)n * hv + h] = neg_a[h] * sp;
        beta[(idx_t)n * hv + h] = sigmoid_f(x[(idx_t)n * ld + off_b + h]);
    }
}

// Advances each segment's conv state past its rows: state row j (oldest first) becomes the input at segment time
// len - (K-1) + j, from x or, for short segments, from the older state rows (a child segment: from its parent's
// rows, conv_parent_end). grid (ceil(cd/256), nseg), block 256.
KERNEL(simt) void gdn_conv_state(const float* x, int ld, int K, int cd, const int* seg, const u64* states,
                                 const int* par) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (c >= cd) return;
    int start = seg[3 * s], len = seg[3 * s + 1], pend = conv_parent_end(seg, par, s);
    float* st = (float*)states[s];
    // Eight rows' loads before their stores (one after the other, each load waited for the store before it: st
    // may alias x as far as the compiler knows). A state row read, len + j > j, is one no earlier store wrote.
    for (int j0 = 0; j0 < K - 1; j0 += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int j = j0 + u, tau = len - (K - 1) + j;
            v[u] = j >= K - 1   ? 0.0f
                   : tau >= 0   ? x[(idx_t)(start + tau) * ld + c]
                   : pend >= 0  ? x[(idx_t)(pend + tau) * ld + c]
                                : st[(idx_t)(len + j) * cd + c];
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (j0 + u < K - 1) st[(idx_t)(j0 + u) * cd + c] = v[u];
    }
}

// Attention inputs: per-head RMSNorm of q and k, partial rotary (rotate-half, first 2*half dims) at
// each row's position; q to q_out, k and v appended to the segment's KV cache at that position (attn_prep_h: as f16,
// rounded to nearest).
// proj: [N, ld] with per head h: q at h*2D, gate at h*2D + D; k at H*2D + kh*D; v at H*2D + HKV*D + kh*D.
// q_out: [N, H, D]. KV table per segment (KV_ENTRIES addresses): own k, own v caches [cap, HKV, D], base k,
// base v (a forked-from cache, read-only), base length. Position p < base lives at base row p, else at own
// row p - base. grid (N, H + HKV); D <= 1024.
#define KV_ENTRIES 5
// H16: the caches hold f16 (attn_prep_h, for attention_h), else f32 (attn_prep). ATP_MAX: columns a thread holds
// in registers (head dims to ATP_MAX x 128; larger ones take attn_prep_wide).
#define ATP_MAX 4
// The general path, for head dims past ATP_MAX x blockDim.x: each value loaded where it is first used.
template <bool H16>
__device__ __forceinline__ void attn_prep_wide(const float* src, const float* gain, const float* vs,
                                               const float* inv_freq, float eps, int half, int H, int HKV, int D,
                                               int n, int j, int s, int pos, const u64* kv, float* q_out,
                                               float* xs) {
    const bool isq = j < H;
    const int kh = j - H;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) ss += src[c] * src[c];
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / D + eps);
    for (int c = threadIdx.x; c < D; c += blockDim.x) xs[c] = src[c] * inv * gain[c];
    __syncthreads();
    const u64* kvs = kv + KV_ENTRIES * s;
    int own = pos - (int)kvs[4];
    idx_t at = isq ? ((idx_t)n * H + j) * D : ((idx_t)own * HKV + kh) * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float v = xs[c];
        if (c < 2 * half) {
            int f = c < half ? c : c - half;
            float ang = (float)pos * inv_freq[f];
            float cs = cosf(ang), sn = sinf(ang);
            v = c < half ? xs[c] * cs - xs[c + half] * sn : xs[c] * cs + xs[c - half] * sn;
        }
        if (isq) q_out[at + c] = v;
        else if (H16) ((unsigned short*)kvs[0])[at + c] = f2h(v);
        else ((float*)kvs[0])[at + c] = v;
    }
    if (!isq) {
        for (int c = threadIdx.x; c < D; c += blockDim.x) {
            if (H16) ((unsigned short*)kvs[1])[at + c] = f2h(vs[c]);
            else ((float*)kvs[1])[at + c] = vs[c];
        }
    }
}
template <bool H16>
__device__ __forceinline__ void attn_prep_t(const float* proj, int ld, const float* qn, const float* kn, float eps,
                                            const float* inv_freq, int half, int H, int HKV, int D, const int* tok,
                                            const u64* kv, float* q_out, float* xs) {
    pdl_wait();
    pdl_launch();
    int n = blockIdx.x, j = blockIdx.y;
    int s = tok[2 * n], pos = tok[2 * n + 1];
    bool isq = j < H;
    int kh = j - H;
    const float* src = proj + (idx_t)n * ld + (isq ? j * 2 * D : H * 2 * D + kh * D);
    const float* gain = isq ? qn : kn;
    const float* vs = proj + (idx_t)n * ld + H * 2 * D + HKV * D + kh * D;
    if (D > ATP_MAX * (int)blockDim.x) {
        attn_prep_wide<H16>(src, gain, vs, inv_freq, eps, half, H, HKV, D, n, j, s, pos, kv, q_out, xs);
        return;
    }
    // Every load before any use: two round trips (the row's segment and position, then the rest) where loading each
    // value at its first use (attn_prep_wide) took six. A thread's columns c = threadIdx.x + u blockDim.x, u <
    // ATP_MAX; the sums and products as attn_prep_wide's, in the same order.
    const u64* kvs = kv + KV_ENTRIES * s;
    const u64 base = kvs[4], kdst = kvs[0], vdst = isq ? 0 : kvs[1];
    float sv[ATP_MAX], gv[ATP_MAX], fv[ATP_MAX], vv[ATP_MAX];
#pragma unroll
    for (int u = 0; u < ATP_MAX; u++) {
        const int c = threadIdx.x + u * blockDim.x;
        const bool in = c < D;
        sv[u] = in ? src[c] : 0.0f;
        gv[u] = in ? gain[c] : 0.0f;
        fv[u] = in && c < 2 * half ? inv_freq[c < half ? c : c - half] : 0.0f;
        vv[u] = in && !isq ? vs[c] : 0.0f;
    }
    // The rotary angles' cosines and sines here, before the reduction (later, ptxas moved inv_freq's loads down
    // to them, one round trip each).
    float cs[ATP_MAX], sn[ATP_MAX];
#pragma unroll
    for (int u = 0; u < ATP_MAX; u++) {
        const int c = threadIdx.x + u * blockDim.x;
        cs[u] = 1.0f;
        sn[u] = 0.0f;
        if (c < D && c < 2 * half) {
            float ang = (float)pos * fv[u];
            cs[u] = cosf(ang);
            sn[u] = sinf(ang);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < ATP_MAX; u++)
        if (threadIdx.x + u * blockDim.x < D) ss += sv[u] * sv[u];
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / D + eps);
#pragma unroll
    for (int u = 0; u < ATP_MAX; u++) {
        const int c = threadIdx.x + u * blockDim.x;
        if (c < D) xs[c] = sv[u] * inv * gv[u];
    }
    __syncthreads();
    int own = pos - (int)base;
    idx_t at = isq ? ((idx_t)n * H + j) * D : ((idx_t)own * HKV + kh) * D;
#pragma unroll
    for (int u = 0; u < ATP_MAX; u++) {
        const int c = threadIdx.x + u * blockDim.x;
        if (c >= D) break;
        float v = xs[c];
        if (c < 2 * half)
            v = c < half ? xs[c] * cs[u] - xs[c + half] * sn[u] : xs[c] * cs[u] + xs[c - half] * sn[u];
        if (isq) q_out[at + c] = v;
        else if (H16) ((unsigned short*)kdst)[at + c] = f2h(v);
        else ((float*)kdst)[at + c] = v;
    }
    if (!isq) {
#pragma unroll
        for (int u = 0; u < ATP_MAX; u++) {
            const int c = threadIdx.x + u * blockDim.x;
            if (c >= D) break;
            if (H16) ((unsigned short*)vdst)[at + c] = f2h(vv[u]);
            else ((float*)vdst)[at + c] = vv[u];
        }
    }
}
KERNEL(simt) void attn_prep(const float* proj, int ld, const float* qn, const float* kn, float eps,
                            const float* inv_freq, int half, int H, int HKV, int D, const int* tok,
                            const u64* kv, float* q_out) {
    __shared__ float xs[1024];
    attn_prep_t<false>(proj, ld, qn, kn, eps, inv_freq, half, H, HKV, D, tok, kv, q_out, xs);
}
KERNEL(simt) void attn_prep_h(const float* proj, int ld, const float* qn, const float* kn, float eps,
                              const float* inv_freq, int half, int H, int HKV, int D, const int* tok,
                              const u64* kv, float* q_out) {
    __shared__ float xs[1024];
    attn_prep_t<true>(proj, ld, qn, kn, eps, inv_freq, half, H, HKV, D, tok, kv, q_out, xs);
}

// Tiled causal attention (the SIMT twin of attention_tc, for head dims it does not take; online softmax, grouped KV
// heads, the output times sigmoid(gate) stored as `store_act` with `mode` for o_proj): one block per (tile of ATT_Q query rows
// of one segment, head); keys and values come through shared memory ATT_K at a time and serve every query of
// the tile. Scores are 2x2 register tiles per thread, the online softmax is one warp per query row, and the
// output tile [ATT_Q, D] stays in registers (thread owns 8 rows x D/64 columns). q: [N, H, D]; seg: [S, 3];
// KV table as in attn_prep; out: [N, H*D]. grid (ceil(longest segment / ATT_Q), nseg, H), block 256,
// dynamic shared memory ((ATT_Q + 2*ATT_K) * (D+1) + ATT_Q*(ATT_K+1) + 3*ATT_Q) floats; D <= 512.
#define ATT_Q 32
#define ATT_K 32
template <int CW>
__device__ __forceinline__ void attention_tiled_t(const float* __restrict__ q, const float* __restrict__ proj, int ld,
                                                  const int* seg, const u64* kv, int H, int HKV, int D, float scale,
                                                  void* out, int mode, float* sm) {
    int ldd = D + 1;
    float* Qs = sm;                       // [ATT_Q, D+1]
    float* Ks = Qs + ATT_Q * ldd;         // [ATT_K, D+1]
    float* Vs = Ks + ATT_K * ldd;         // [ATT_K, D+1]
    float* P = Vs + ATT_K * ldd;          // [ATT_Q, ATT_K+1]
    float* mrow = P + ATT_Q * (ATT_K + 1);
    float* lrow = mrow + ATT_Q;
    float* crow = lrow + ATT_Q;
    int tile = blockIdx.x, s = blockIdx.y, h = blockIdx.z, tid = threadIdx.x;
    int start = seg[3 * s], len = seg[3 * s + 1], pos0 = seg[3 * s + 2];
    int t0 = tile * ATT_Q;
    if (t0 >= len) return;
    int nq = min(ATT_Q, len - t0);
    int kh = h / (H / HKV);
    const u64* kvs = kv + KV_ENTRIES * s;
    int base = (int)kvs[4];
    const float* kb = (const float*)kvs[2];
    const float* vb = (const float*)kvs[3];
    const float* ko = (const float*)kvs[0];
    const float* vo = (const float*)kvs[1];
    for (int i = tid; i < ATT_Q * D; i += 256) {
        int r = i / D, c = i % D;
        Qs[r * ldd + c] = r < nq ? q[((idx_t)(start + t0 + r) * H + h) * D + c] * scale : 0.0f;
    }
    if (tid < ATT_Q) {
        mrow[tid] = __int_as_float(0xff800000);
        lrow[tid] = 0.0f;
    }
    int orow = tid >> 6, ocol = tid & 63;  // rows orow + 4i (i < 8), columns ocol + 64k (k < CW, < D)
    float acc[8][CW];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int k = 0; k < CW; k++) acc[i][k] = 0.0f;
    int last = pos0 + t0 + nq - 1;  // the last key any row of the tile sees
    int sq = tid >> 4, sk = tid & 15; // score tile: rows sq, sq+16; keys sk, sk+16
    int warp = tid >> 5, lane = tid & 31;
    for (int k0 = 0; k0 <= last; k0 += ATT_K) {
        __syncthreads();
        // 16 loads per thread in flight; keys past `last` are zeros (their p is 0, and 0 * garbage could be NaN).
        // Thread owns columns c0 + 256m of rows rr0 + rstep*u (no division per element).
        {
            int rstep = D >= 256 ? 1 : 256 / D;
            int cc = D >= 256 ? tid : tid % D, rr0 = D >= 256 ? 0 : tid / D;
            if (rr0 < rstep) {
                for (int cm = cc; cm < D; cm += 256) {
                    for (int r1 = rr0; r1 < ATT_K; r1 += 8 * rstep) {
                        float xk[8], xv[8];
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            int r = r1 + u * rstep, kp = k0 + r;
                            xk[u] = 0.0f;
                            xv[u] = 0.0f;
                            if (r < ATT_K && kp <= last) {
                                bool inb = kp < base;
                                idx_t off = ((idx_t)(inb ? kp : kp - base) * HKV + kh) * D + cm;
                                xk[u] = inb ? kb[off] : ko[off];
                                xv[u] = inb ? vb[off] : vo[off];
                            }
                        }
#pragma unroll
                        for (int u = 0; u < 8; u++) {
                            int r = r1 + u * rstep;
                            if (r < ATT_K) {
                                Ks[r * ldd + cm] = xk[u];
                                Vs[r * ldd + cm] = xv[u];
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();
        {
            float sc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
            for (int c = 0; c < D; c++) {
                float qa = Qs[sq * ldd + c], qb = Qs[(sq + 16) * ldd + c];
                float ka = Ks[sk * ldd + c], kb2 = Ks[(sk + 16) * ldd + c];
                sc[0][0] += qa * ka;
                sc[0][1] += qa * kb2;
                sc[1][0] += qb * ka;
                sc[1][1] += qb * kb2;
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    int r = sq + 16 * i, kk = sk + 16 * j;
                    bool ok = r < nq && k0 + kk <= pos0 + t0 + r;
                    P[r * (ATT_K + 1) + kk] = ok ? sc[i][j] : __int_as_float(0xff800000);
                }
        }
        __syncthreads();
        // Online softmax, one warp per row (lane = key).
        for (int r = warp; r < ATT_Q; r += 8) {
            float d = P[r * (ATT_K + 1) + lane];
            float mx = d;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mo = mrow[r];
            float mn = fmaxf(mo, mx);
            float p = d == __int_as_float(0xff800000) ? 0.0f : expf(d - mn);
            float ps = warp_sum(p);
            P[r * (ATT_K + 1) + lane] = p;
            __syncwarp();
            if (lane == 0) {
                float corr = mo == __int_as_float(0xff800000) ? 0.0f : expf(mo - mn);
                crow[r] = corr;
                lrow[r] = lrow[r] * corr + ps;
                mrow[r] = mn;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float cr = crow[orow + 4 * i];
#pragma unroll
            for (int k = 0; k < CW; k++) acc[i][k] *= cr;
        }
        int nk = min(ATT_K, last + 1 - k0);
        for (int kk = 0; kk < nk; kk++) {
            float vv[CW];
#pragma unroll
            for (int k = 0; k < CW; k++) vv[k] = Vs[kk * ldd + min(ocol + 64 * k, D - 1)];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float p = P[(orow + 4 * i) * (ATT_K + 1) + kk];
#pragma unroll
                for (int k = 0; k < CW; k++) acc[i][k] += p * vv[k];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = orow + 4 * i;
        if (r < nq) {
            idx_t n = start + t0 + r;
            const float* gate = proj + n * ld + h * 2 * D + D;
            float inv = 1.0f / lrow[r];
#pragma unroll
            for (int k = 0; k < CW; k++) {
                int c = ocol + 64 * k;
                if (c < D) store_act(out, n * H * D + h * D + c, acc[i][k] * inv * sigmoid_f(gate[c]), mode);
            }
        }
    }
}

KERNEL(attention_tiled) void __launch_bounds__(256) attention_tiled(const float* __restrict__ q,
                                                                    const float* __restrict__ proj, int ld,
                                                                    const int* seg, const u64* kv, int H, int HKV,
                                                                    int D, float scale, void* out, int mode) {
    extern __shared__ float sm[];
    if (D <= 64) attention_tiled_t<1>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, sm);
    else if (D <= 128) attention_tiled_t<2>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, sm);
    else if (D <= 256) attention_tiled_t<4>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, sm);
    else attention_tiled_t<8>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, sm);
}

// SwiGLU: out[n][c] = silu(gate) * up with gate = gu[n][c] and up = gu[n][inter + c]. gu: [rows, 2 inter] f32;
// out: [rows, inter] as `store_act` with `mode`. grid (ceil(inter / (VW * blockDim.x)), up to 65535 rows, walked by
// stride), VW = 4 (vec: inter % 4 == 0, gu and out aligned for 16-byte loads and store_act_vec) or 1: no division
// per value (the one-thread-per-value kernel spent its time on 64-bit divisions).
KERNEL(simt) void swiglu(const float* __restrict__ gu, int inter, int rows, void* out, int mode, int vec) {
    const int vw = vec ? 4 : 1;
    const int c = vw * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= inter) return;
    for (int n = blockIdx.y; n < rows; n += gridDim.y) {
        const float* r = gu + (idx_t)n * 2 * inter + c;
        const idx_t o = (idx_t)n * inter + c;
        if (vec) {
            float4 gt = *(const float4*)r, up = *(const float4*)(r + inter);
            const float v[4] = {silu_f(gt.x) * up.x, silu_f(gt.y) * up.y, silu_f(gt.z) * up.z, silu_f(gt.w) * up.w};
            store_act_vec<4>(out, o, v, mode);
        } else {
            store_act(out, o, silu_f(r[0]) * r[inter], mode);
        }
    }
}

// f32 to bf16 (n values).
KERNEL(simt) void to_bf16(const float* x, bf16_t* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(x[i]);
}

// Label-row readout: out[p] = hidden[pairs[2p]] . head[pairs[2p+1]]. hidden: [N, H] f32; head: [V, H] stored as
// `load_wq`'s mode says. One warp per pair: grid ceil(P/4), block 128.
KERNEL(simt) void rows_dot(const float* hidden, int hid, const int* pairs, int P, const void* head,
                           const unsigned short* scales, int mode, float* out) {
    int p = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (p >= P) return;
    const float* x = hidden + (idx_t)pairs[2 * p] * hid;
    idx_t w = pairs[2 * p + 1];
    float d = 0.0f;
    for (int c = lane; c < hid; c += 32) d += x[c] * load_wq(head, scales, mode, w, hid, c);
    d = warp_sum(d);
    if (lane == 0) out[p] = d;
}

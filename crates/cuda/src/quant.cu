// Block-format weights on the device (compiled after kernels.cu, whose helpers they use): the few-row GEMVs of
// PQ2_0 and Q8_0 matrices, and of float rows kept as stored in split mode (f16, f32: decode), their dequantisation to bf16 / f32 rows (prefill: cuBLAS multiplies the
// dequantised chunk), and the blockwise Hadamard rotation of a Bonsai pack's activations.
//
// Device layout of a block-format matrix [N, K] (crates/cuda/src/qgemm.rs uploads it): the blocks' code bytes of
// every row first, row after row (PQ2_0: K/4 bytes per row, weight j of a row in bits 2(j % 4) of byte j / 4, so
// four bytes read as a little-endian word hold 16 consecutive weights, weight i of the word at bits 2i; Q8_0: K
// signed bytes per row), then the f16 scales [N, K / block] (block 128 and 32). The same bytes as the file's
// 34-byte blocks (2.125 and 8.5 bits per weight), with the scales moved out so that every code load is aligned.
// PQ2_0 code c is the value (c - 1) d (code 3 is +2d, as the CPU kernels read it).

// Code conversion without tables, branches or int-to-float instructions: a value v (a few bits) placed in the
// mantissa of 2^23 at bit offset 8p reads as 2^23 + v * 2^(8p), so one logic op (mask and or) and one subtraction
// give (v - bias) * 2^(8p) exactly. Each 16-weight group is decoded into f[16] in that scaled form: f[i] holds
// weight i times 2^(8 CLS[i]), and the dot of a group sums each class apart, then scales the classes back.
#define QMAGIC 0x4B000000u
#define QMAGIC_F 8388608.0f

// PQ2_0: the 16 weights of word w. Weight 4b + j is in bits 8b + 2j: shifted right by 2j, its code sits at bit 8b
// (b < 3: class b; b = 3, shifted 8 more: class 2).
__device__ __forceinline__ void decode_pq2(unsigned w, float* f) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        unsigned a = w >> (2 * j), b = w >> (2 * j + 8);
        f[j] = __uint_as_float((a & 0x3u) | QMAGIC) - (QMAGIC_F + 1.0f);
        f[4 + j] = __uint_as_float((a & 0x300u) | QMAGIC) - (QMAGIC_F + 256.0f);
        f[8 + j] = __uint_as_float((a & 0x30000u) | QMAGIC) - (QMAGIC_F + 65536.0f);
        f[12 + j] = __uint_as_float((b & 0x30000u) | QMAGIC) - (QMAGIC_F + 65536.0f);
    }
}
// Σ f[i] x[i] with PQ2_0's classes (weights 0..3 class 0, 4..7 class 1, 8..15 class 2).
__device__ __forceinline__ float dot_pq2(const float* f, const float* x) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        s0 = fmaf(f[j], x[j], s0);
        s1 = fmaf(f[4 + j], x[4 + j], s1);
        s2 = fmaf(f[8 + j], x[8 + j], s2);
        s2 = fmaf(f[12 + j], x[12 + j], s2);
    }
    return s0 + s1 * (1.0f / 256.0f) + s2 * (1.0f / 65536.0f);
}
// Q8_0: 16 signed bytes (weights 4m .. 4m + 3 in word m). With the sign bit flipped a byte is q + 128; bytes 0 and
// 1 of a word (and of the word shifted by 16) sit at bit offsets 0 and 8: classes 0 and 1, alternating by weight.
__device__ __forceinline__ void decode_q8(uint4 v, float* f) {
    const unsigned* u = (const unsigned*)&v;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        unsigned t = u[m] ^ 0x80808080u, h = t >> 16;
        f[4 * m] = __uint_as_float((t & 0xffu) | QMAGIC) - (QMAGIC_F + 128.0f);
        f[4 * m + 1] = __uint_as_float((t & 0xff00u) | QMAGIC) - (QMAGIC_F + 32768.0f);
        f[4 * m + 2] = __uint_as_float((h & 0xffu) | QMAGIC) - (QMAGIC_F + 128.0f);
        f[4 * m + 3] = __uint_as_float((h & 0xff00u) | QMAGIC) - (QMAGIC_F + 32768.0f);
    }
}
__device__ __forceinline__ float dot_q8(const float* f, const float* x) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
        s0 = fmaf(f[i], x[i], s0);
        s1 = fmaf(f[i + 1], x[i + 1], s1);
    }
    return s0 + s1 * (1.0f / 256.0f);
}

// 16 consecutive activation values at element offset `off` as f32, from the layout XM: 0 bf16, 1 f32, 2 split
// (bf16 hi at off, bf16 lo `lo` elements on: the value hi + lo). off % 16 == 0 and 16-byte aligned rows.
template <int XM>
__device__ __forceinline__ void load_x16(const void* x, idx_t off, long long lo, float* v) {
    if constexpr (XM == 1) {
        const float4* p = (const float4*)((const float*)x + off);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 t = __ldg(p + i);
            v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
        }
    } else {
        const uint4* p = (const uint4*)((const bf16_t*)x + off);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 t = __ldg(p + i);
            const unsigned* u = (const unsigned*)&t;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[8 * i + 2 * k] = __uint_as_float(u[k] << 16);
                v[8 * i + 2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
            }
        }
        if constexpr (XM == 2) {
            const uint4* q = (const uint4*)((const bf16_t*)x + off + lo);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                uint4 t = __ldg(q + i);
                const unsigned* u = (const unsigned*)&t;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    v[8 * i + 2 * k] += __uint_as_float(u[k] << 16);
                    v[8 * i + 2 * k + 1] += __uint_as_float(u[k] & 0xffff0000u);
                }
            }
        }
    }
}

// Float rows multiplied like the block formats (split mode: weights bf16 does not hold exactly, kept as stored):
// FMT 2 f16, FMT 3 f32; the 16 values of group gi of a row (32 or 64 bytes) as f32.
template <int FMT>
__device__ __forceinline__ void load_rows16(const unsigned char* q, idx_t row, int K, int gi, float* f) {
    if constexpr (FMT == 2) {
        const uint4* p = (const uint4*)(q + row * K * 2) + 2 * gi;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint4 t = __ldg(p + i);
            const unsigned* u = (const unsigned*)&t;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                f[8 * i + 2 * k] = h2f((unsigned short)(u[k] & 0xffffu));
                f[8 * i + 2 * k + 1] = h2f((unsigned short)(u[k] >> 16));
            }
        }
    } else {
        load_x16<1>(q + row * K * 4, (idx_t)gi * 16, 0, f);
    }
}
__device__ __forceinline__ float dot16(const float* f, const float* x) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) s = fmaf(f[i], x[i], s);
    return s;
}

// Few-row projection with a block-format weight (decode): y[r, n] (row stride ldy) = x[r, :K] · w[n, :K] + beta
// y[r, n] for r < rows <= ROWS, f32 products and sums. A block of 8 warps takes 8 / wpr row sets of R weight rows;
// the wpr warps of a row set split K (warp s of them takes the 16-weight groups s·32 + lane, + 32 wpr, ...), so that
// enough loads are in flight where N is small. Each lane reads its group's code bytes of the R rows once (PQ2_0: a
// 4-byte word per row, Q8_0: 16 bytes), decodes them once for every x row, and loads each x row's 16 values once
// for the R rows (x is read from L1 R times less often than with one row per warp); each group's dot is scaled by
// its block's scale. The sums: per lane, then the warp, then the row set's warps in order (shared memory). x rows at
// x + r ldx (split: lo `lo` elements after hi); K % 128 == 0 (PQ2_0) or K % 32 == 0 (Q8_0), 16-byte aligned x rows
// (the caller checks). beta 0 (y not read) or 1. grid ceil(N / (R · 8 / wpr)), 256 threads.
template <int FMT, int XM, int ROWS, int R>
__device__ __forceinline__ void gemv_q_rows(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                            const void* __restrict__ x, int ldx, long long lo, int rows, int K,
                                            int N, float* __restrict__ y, int ldy, float beta, int wpr) {
    __shared__ float part[8][ROWS][R];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int sets = 8 / wpr, slice = warp % wpr;
    int n0 = (blockIdx.x * sets + warp / wpr) * R;
    constexpr int BLK = FMT == 0 ? 128 : FMT == 1 ? 32 : 16;
    float acc[ROWS][R];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[r][i] = 0.0f;
    // Rows past N read row N - 1 (their sums are dropped): no branch in the loop.
    idx_t row[R];
#pragma unroll
    for (int i = 0; i < R; i++) row[i] = (idx_t)min(n0 + i, N - 1);
    int groups = K / 16;
#pragma unroll 2
    for (int gi = slice * 32 + lane; gi < groups; gi += 32 * wpr) {
        float f[R][16], sc[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            if constexpr (FMT == 0)
                decode_pq2(__ldg((const unsigned*)(q + row[i] * (K / 4)) + gi), f[i]);
            else if constexpr (FMT == 1)
                decode_q8(__ldg((const uint4*)(q + row[i] * K) + gi), f[i]);
            else
                load_rows16<FMT>(q, row[i], K, gi, f[i]);
            sc[i] = FMT < 2 ? h2f(__ldg(d + row[i] * (K / BLK) + gi * 16 / BLK)) : 1.0f;
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < rows) {
                float xv[16];
                load_x16<XM>(x, (idx_t)r * ldx + gi * 16, lo, xv);
#pragma unroll
                for (int i = 0; i < R; i++)
                    acc[r][i] = fmaf(sc[i], FMT == 0 ? dot_pq2(f[i], xv) : FMT == 1 ? dot_q8(f[i], xv) : dot16(f[i], xv),
                                     acc[r][i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[r][i] = warp_sum(acc[r][i]);
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int i = 0; i < R; i++) part[warp][r][i] = acc[r][i];
        }
        __syncthreads();
        if (slice != 0) return;
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int i = 0; i < R; i++) {
                    float t = 0.0f;
                    for (int s2 = 0; s2 < wpr; s2++) t += part[warp + s2][r][i];
                    acc[r][i] = t;
                }
        }
    }
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r >= rows) break;
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (n0 + i < N) {
                float* yo = y + (idx_t)r * ldy + n0 + i;
                *yo = beta != 0.0f ? acc[r][i] + beta * *yo : acc[r][i];
            }
        }
    }
}

// The instantiations: one x row with 4 weight rows per set, up to GEMV_ROWS x rows with 2.
#define GEMV_Q(name, FMT, XM, ROWS)                                                                              \
    KERNEL(simt) void name(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,              \
                           const void* __restrict__ x, int ldx, long long lo, int rows, int K, int N,             \
                           float* __restrict__ y, int ldy, float beta, int wpr) {                                \
        gemv_q_rows<FMT, XM, ROWS, ROWS == 1 ? 4 : 2>(q, d, x, ldx, lo, rows, K, N, y, ldy, beta, wpr);          \
    }
GEMV_Q(gemv_pq2_bf16_1, 0, 0, 1)
GEMV_Q(gemv_pq2_bf16_8, 0, 0, GEMV_ROWS)
GEMV_Q(gemv_pq2_f32_1, 0, 1, 1)
GEMV_Q(gemv_pq2_f32_8, 0, 1, GEMV_ROWS)
GEMV_Q(gemv_pq2_split_1, 0, 2, 1)
GEMV_Q(gemv_pq2_split_8, 0, 2, GEMV_ROWS)
GEMV_Q(gemv_q8_bf16_1, 1, 0, 1)
GEMV_Q(gemv_q8_bf16_8, 1, 0, GEMV_ROWS)
GEMV_Q(gemv_q8_f32_1, 1, 1, 1)
GEMV_Q(gemv_q8_f32_8, 1, 1, GEMV_ROWS)
GEMV_Q(gemv_q8_split_1, 1, 2, 1)
GEMV_Q(gemv_q8_split_8, 1, 2, GEMV_ROWS)
GEMV_Q(gemv_f16_bf16_1, 2, 0, 1)
GEMV_Q(gemv_f16_bf16_8, 2, 0, GEMV_ROWS)
GEMV_Q(gemv_f16_f32_1, 2, 1, 1)
GEMV_Q(gemv_f16_f32_8, 2, 1, GEMV_ROWS)
GEMV_Q(gemv_f16_split_1, 2, 2, 1)
GEMV_Q(gemv_f16_split_8, 2, 2, GEMV_ROWS)
GEMV_Q(gemv_f32r_bf16_1, 3, 0, 1)
GEMV_Q(gemv_f32r_bf16_8, 3, 0, GEMV_ROWS)
GEMV_Q(gemv_f32r_f32_1, 3, 1, 1)
GEMV_Q(gemv_f32r_f32_8, 3, 1, GEMV_ROWS)
GEMV_Q(gemv_f32r_split_1, 3, 2, 1)
GEMV_Q(gemv_f32r_split_8, 3, 2, GEMV_ROWS)

// Streaming loads of weight codes and scales (not kept in L1), as volatile asm so that the compiler issues a tile's
// loads where they are written, all before the arithmetic that waits for them, instead of one row at a time.
__device__ __forceinline__ uint4 ld_stream_v2(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    v.z = v.w = 0u;
    return v;
}
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned short ld_stream_u16(const void* p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// One tile of the wide GEMV: the codes (PQ2_0: two words in .x .y; Q8_0: 16 bytes) and the f16 scale of 8 rows from
// row nt (rows past N read row N - 1: their sums are dropped).
template <int FMT>
__device__ __forceinline__ void wide_tile_load(const unsigned char* q, const unsigned short* d, int nt, int N,
                                               idx_t row_bytes, idx_t row_scales, int c0, int s0, uint4* wv,
                                               unsigned short* sc) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        idx_t r = (idx_t)min(nt + i, N - 1);
        if constexpr (FMT == 0)
            wv[i] = ld_stream_v2((const uint2*)(q + r * row_bytes) + c0 / 32);
        else
            wv[i] = ld_stream_v4((const uint4*)(q + r * row_bytes) + c0 / 16);
        sc[i] = ld_stream_u16(d + r * row_scales + s0);
    }
}

// One-row GEMV of a block-format matrix (decode) with float products (PQ2_0 with f32 inputs, Q8_0): y[n] = x ·
// w[n, :K] + beta y[n]. The block's warps split K: lane l of warp w takes the C columns from (32 w + l) C (PQ2_0:
// C = 32, two code words of every row in one 8-byte load; Q8_0: C = 16, one 16-byte load), whose x values it reads
// once, as f32 (split: hi + lo), and keeps in registers, and one block scale per row. The block walks its `rpb` rows
// in tiles of 8, loading the next tile (PQ2_0; Q8_0's 16-byte codes take the registers of a second tile) while it
// multiplies the current one; a tile's 8 lane sums are reduced over the warp by halving exchanges (after which lane
// l holds row 4 b4 + 2 b3 + b2 of its bits), the warps' sums added in shared memory in warp order (the same order
// for every call: deterministic), y written by the first 8 threads. The K columns multiplied are the first of rows
// of ldk (the caller offsets q, d and x to take a later range: a long K runs as several calls adding into y, so
// that a block stays within 16 warps of these register-heavy threads). K % (32 C) == 0, 16-byte aligned x, rpb % 8
// == 0; grid ceil(N / rpb), K / C threads.
template <int FMT, int XM>
__device__ __forceinline__ void gemv_q_wide(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                            const void* __restrict__ x, long long lo, int K, int ldk, int N,
                                            float* __restrict__ y, float beta, int rpb) {
    constexpr int C = FMT == 0 ? 32 : 16, BLK = FMT == 0 ? 128 : 32;
    __shared__ float part[2][32][8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    int c0 = (warp * 32 + lane) * C;
    int n0 = blockIdx.x * rpb, n1 = min(n0 + rpb, N);
    idx_t row_bytes = FMT == 0 ? ldk / 4 : ldk, row_scales = ldk / BLK;
    int s0 = c0 / BLK, buf = 0;
    uint4 wv[8];
    unsigned short sc[8];
    // The first tile's weights are read before the wait for the kernel before (nothing writes them).
    wide_tile_load<FMT>(q, d, n0, N, row_bytes, row_scales, c0, s0, wv, sc);
    pdl_wait();
    float xv[C];
#pragma unroll
    for (int i = 0; i < C; i += 16) load_x16<XM>(x, c0 + i, lo, xv + i);
#pragma unroll 1
    for (int nt = n0; nt < n1; nt += 8) {
        float p[8];
        // The next kernel may launch once every block is in its last tile (earlier, its blocks would take the
        // places of this one's and be placed unevenly).
        if (nt + 8 >= n1) pdl_launch();
        if constexpr (FMT == 0) {
            uint4 nw[8];
            unsigned short ns[8];
            if (nt + 8 < n1) wide_tile_load<FMT>(q, d, nt + 8, N, row_bytes, row_scales, c0, s0, nw, ns);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float f[16];
                decode_pq2(wv[i].x, f);
                float s = dot_pq2(f, xv);
                decode_pq2(wv[i].y, f);
                p[i] = (s + dot_pq2(f, xv + 16)) * h2f(sc[i]);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = nw[i], sc[i] = ns[i];
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float f[16];
                decode_q8(wv[i], f);
                p[i] = dot_q8(f, xv) * h2f(sc[i]);
            }
            if (nt + 8 < n1) wide_tile_load<FMT>(q, d, nt + 8, N, row_bytes, row_scales, c0, s0, wv, sc);
        }
        bool up = lane & 16;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float send = up ? p[i] : p[i + 4], keep = up ? p[i + 4] : p[i];
            p[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
        }
        up = lane & 8;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float send = up ? p[i] : p[i + 2], keep = up ? p[i + 2] : p[i];
            p[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
        }
        up = lane & 4;
        {
            float send = up ? p[0] : p[1], keep = up ? p[1] : p[0];
            p[0] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
        }
        p[0] += __shfl_xor_sync(0xffffffffu, p[0], 2);
        p[0] += __shfl_xor_sync(0xffffffffu, p[0], 1);
        if ((lane & 3) == 0) part[buf][warp][((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1)] = p[0];
        __syncthreads();
        if (threadIdx.x < 8 && nt + (int)threadIdx.x < n1) {
            float t = 0.0f;
            for (int w = 0; w < warps; w++) t += part[buf][w][threadIdx.x];
            float* yo = y + nt + threadIdx.x;
            *yo = beta != 0.0f ? t + beta * *yo : t;
        }
        buf ^= 1;
    }
}

// The activations' int16 rounding of the integer products (the one-row PQ2_0 GEMV below and qmma.cu's prefill
// GEMM): per 128-value block, q = round(x · q16_inv(m)), m the block's largest |x| (its scale m / 32767).
__device__ __forceinline__ float q16_inv(float m) { return m > 0.0f ? 32767.0f / m : 0.0f; }
// Rounds v to q and puts q's signed high and unsigned low bytes (q = 256 h + l) at byte b of h and l. → q
__device__ __forceinline__ int q16_put(float v, float inv, int b, unsigned& h, unsigned& l) {
    int q = __float2int_rn(v * inv);
    h |= (unsigned)((q >> 8) & 0xff) << (8 * b);
    l |= (unsigned)(q & 0xff) << (8 * b);
    return q;
}

// The one-row PQ2_0 GEMV with integer products (bf16 or split inputs; decode's GEMV on a Bonsai pack): the
// arguments, grid and split of K of `gemv_q_wide`, and N >= 8.
//
// x: each lane's 32 values become int16 q = round(x / s) with s = max |x| / 32767 over their 128-value block
// (shared by the block's 4 lanes; about 2^-16 of the block's largest value, split's own precision), each split into
// a signed high and an unsigned low byte, q = 256 h + l, packed four to a word in the order of the codes j of each
// byte (weights j, 4 + j, 8 + j, 12 + j of a code word), which a mask of the word (j = 0, 1) or of the word shifted
// by 4 (j = 2, 3) isolates (j = 1, 3 in place: 4 c). Per row and word Σ c q = 256 Σ c h + Σ c l in 8 dp4a (codes c =
// value + 1, 0..3), the row's lane sum Σ (c - 1) q = that - Σ q exactly in int32.
//
// The reduction of a tile's 8 rows over the warp: two halving exchanges (lanes 1 and 2 apart) add the 4 lanes of a
// weight block in int32 (exact: they share s), after which lane l holds rows 4 b0 + 2 b1 + {0, 1} of its bits;
// those two are scaled by s and their weight scales (2 scale loads a tile, not 8), one more halving exchange leaves
// one row a lane, two plain ones sum the warp's 8 blocks. The warps' sums are added in shared memory in warp order
// (deterministic), y written by the first 8 threads.
//
// A tile's 8 rows are consecutive: one base address a tile and fixed offsets from it; the last tile of a matrix
// whose N is not a multiple of 8 is moved back to end at row N (its rows before the block's current one are not
// written again) instead of clamping every row. 0.79 of the warp instructions of clamped rows, 8 scales a tile and
// per-lane x scales (ncu, 27B gate|up, before the in-place masks), and 6-31% less time a call on the 27B shape's
// matrices (docs/benchmarks/ternary-gpu.md).
//
// One tile of it: this lane's 8 code bytes of rows r .. r + 7 (row stride rb bytes from qc) and the scales of its
// two rows after the exchanges (dc: this lane's scale column, offset by those rows).
__device__ __forceinline__ void int_tile_load(const unsigned char* qc, const unsigned short* dc, int r, unsigned rb,
                                              unsigned rs, uint2* w, unsigned short* sc) {
    const unsigned char* p = qc + (idx_t)r * rb;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint4 t = ld_stream_v2(p + i * rb);
        w[i] = make_uint2(t.x, t.y);
    }
    const unsigned short* ps = dc + (idx_t)r * rs;
    sc[0] = ld_stream_u16(ps), sc[1] = ld_stream_u16(ps + rs);
}
template <int XM>
__device__ __forceinline__ void gemv_pq2_int(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             const void* __restrict__ x, long long lo, int K, int ldk, int N,
                                             float* __restrict__ y, float beta, int rpb) {
    __shared__ float part[2][32][8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    int c0 = (warp * 32 + lane) * 32;
    int n0 = blockIdx.x * rpb, n1 = min(n0 + rpb, N);
    unsigned rb = (unsigned)(ldk / 4), rs = (unsigned)(ldk / 128);
    // This lane's two rows of a tile after the integer exchanges.
    int rsel = 4 * (lane & 1) + 2 * ((lane >> 1) & 1);
    const unsigned char* qc = q + c0 / 4;
    const unsigned short* dc = d + c0 / 128 + (idx_t)rsel * rs;
    int r0 = min(n0, N - 8), buf = 0;
    uint2 wv[8];
    unsigned short sc[2];
    // The first tile's weights are read before the wait for the kernel before (nothing writes them).
    int_tile_load(qc, dc, r0, rb, rs, wv, sc);
    pdl_wait();
    float xv[32];
#pragma unroll
    for (int i = 0; i < 32; i += 16) load_x16<XM>(x, c0 + i, lo, xv + i);
    unsigned hq[2][4], lq[2][4];
    int qsum = 0;
    float xs;
    {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(xv[i]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        float inv = q16_inv(m);
        xs = m / 32767.0f;
#pragma unroll
        for (int w = 0; w < 2; w++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned hw = 0u, lw = 0u;
#pragma unroll
                for (int b = 0; b < 4; b++) qsum += q16_put(xv[16 * w + 4 * b + j], inv, b, hw, lw);
                hq[w][j] = hw, lq[w][j] = lw;
            }
    }
    bool b0 = lane & 1, b1 = lane & 2, b2 = lane & 4;
#pragma unroll 1
    for (int nt = n0; nt < n1; nt += 8) {
        // The next kernel may launch once every block is in its last tile.
        if (nt + 8 >= n1) pdl_launch();
        int rn = min(nt + 8, N - 8);
        uint2 nw[8];
        unsigned short ns[2];
        if (nt + 8 < n1) int_tile_load(qc, dc, rn, rb, rs, nw, ns);
        int v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            // Codes j = 0 and 2 of each byte after no shift and one of 4, masked to 0..3; j = 1 and 3 masked in
            // place (4 c, still one byte): 5 logic instructions a word instead of 7, the second class's sums
            // (multiples of 4) divided by 4 exactly at the end.
            int ahe = 0, aho = 0;
            unsigned ale = 0u, alo = 0u;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                unsigned word = w == 0 ? wv[i].x : wv[i].y, sh = word >> 4;
                unsigned c0 = word & 0x03030303u, c1 = word & 0x0c0c0c0cu;
                unsigned c2 = sh & 0x03030303u, c3 = sh & 0x0c0c0c0cu;
                ahe = __dp4a((int)c0, (int)hq[w][0], ahe);
                ale = __dp4a(c0, lq[w][0], ale);
                ahe = __dp4a((int)c2, (int)hq[w][2], ahe);
                ale = __dp4a(c2, lq[w][2], ale);
                aho = __dp4a((int)c1, (int)hq[w][1], aho);
                alo = __dp4a(c1, lq[w][1], alo);
                aho = __dp4a((int)c3, (int)hq[w][3], aho);
                alo = __dp4a(c3, lq[w][3], alo);
            }
            v[i] = ahe * 256 + (int)ale + ((aho * 256 + (int)alo) >> 2) - qsum;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int send = b0 ? v[i] : v[i + 4], keep = b0 ? v[i + 4] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int send = b1 ? v[i] : v[i + 2], keep = b1 ? v[i + 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
        }
        // |4-lane sum| <= 4 * 32 * 2 * 32767 < 2^24: exact in f32.
        float f0 = (float)v[0] * (xs * h2f(sc[0])), f1 = (float)v[1] * (xs * h2f(sc[1]));
        float f = (b2 ? f1 : f0) + __shfl_xor_sync(0xffffffffu, b2 ? f0 : f1, 4);
        f += __shfl_xor_sync(0xffffffffu, f, 8);
        f += __shfl_xor_sync(0xffffffffu, f, 16);
        if (lane < 8) part[buf][warp][rsel + (b2 ? 1 : 0)] = f;
        __syncthreads();
        if (threadIdx.x < 8) {
            int r = r0 + (int)threadIdx.x;
            if (r >= nt && r < n1) {
                float t = 0.0f;
                for (int w = 0; w < warps; w++) t += part[buf][w][threadIdx.x];
                float* yo = y + r;
                *yo = beta != 0.0f ? t + beta * *yo : t;
            }
        }
        buf ^= 1;
        r0 = rn;
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = nw[i];
        sc[0] = ns[0], sc[1] = ns[1];
    }
}
// The instantiations. The integer-product ones (PQ2_0, bf16 / split inputs) are bounded to 22 warps a block (at most
// 92 registers a thread), so that 27B's K of 17,408 (17 warps) runs in one call; the others take up to 16.
#define GEMV_Q_WIDE(name, FN, BOUND)                                                                              \
    KERNEL(simt) void __launch_bounds__(BOUND)                                                                    \
        name(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,                           \
             const void* __restrict__ x, long long lo, int K, int ldk, int N, float* __restrict__ y, float beta,  \
             int rpb) {                                                                                           \
        FN(q, d, x, lo, K, ldk, N, y, beta, rpb);                                                                 \
    }
GEMV_Q_WIDE(gemv_pq2_wide_bf16, gemv_pq2_int<0>, 704)
GEMV_Q_WIDE(gemv_pq2_wide_f32, (gemv_q_wide<0, 1>), 512)
GEMV_Q_WIDE(gemv_pq2_wide_split, gemv_pq2_int<2>, 704)
GEMV_Q_WIDE(gemv_q8_wide_bf16, (gemv_q_wide<1, 0>), 512)
GEMV_Q_WIDE(gemv_q8_wide_f32, (gemv_q_wide<1, 1>), 512)
GEMV_Q_WIDE(gemv_q8_wide_split, (gemv_q_wide<1, 2>), 512)

// Rows n0 .. n0 + nrows of a block-format matrix (fmt 0 PQ2_0, 1 Q8_0, 2 f16 rows, 3 f32 rows) decoded into out
// [nrows, K] (prefill: a GEMM multiplies the chunk): mode 0 bf16 (rounded to nearest), 1 f32 (exact), 2 bf16 hi and
// lo planes (lo nrows K values after hi, hi + lo the value to about 2^-16; a PQ2_0 value, an f16 times -1, 0, 1 or 2,
// and an f16 exactly).
// One thread per 16-weight group; grid ceil(nrows K / 16 / 256), 256 threads.
KERNEL(simt) void dequant_rows(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d, int fmt,
                               int K, int n0, int nrows, void* __restrict__ out, int mode) {
    idx_t gi = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;
    idx_t gpr = K / 16;
    if (gi >= (idx_t)nrows * gpr) return;
    idx_t r = gi / gpr, c = (gi % gpr) * 16, n = n0 + r;
    float f[16], v[16];
    float sc;
    if (fmt == 0) {
        decode_pq2(__ldg((const unsigned*)(q + n * (K / 4)) + c / 16), f);
        sc = h2f(d[n * (K / 128) + c / 128]);
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = f[i] * (i < 4 ? 1.0f : i < 8 ? (1.0f / 256.0f) : (1.0f / 65536.0f)) * sc;
    } else if (fmt == 1) {
        decode_q8(__ldg((const uint4*)(q + n * K) + c / 16), f);
        sc = h2f(d[n * (K / 32) + c / 32]);
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = f[i] * ((i & 1) ? (1.0f / 256.0f) : 1.0f) * sc;
    } else if (fmt == 2) {
        load_rows16<2>(q, n, K, (int)(c / 16), v);
    } else {
        load_rows16<3>(q, n, K, (int)(c / 16), v);
    }
    idx_t o = r * K + c;
    if (mode == 1) {
        float4* p = (float4*)((float*)out + o);
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
        return;
    }
    unsigned hi[8], lo[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        bf16_t a = f2bf(v[2 * i]), b = f2bf(v[2 * i + 1]);
        hi[i] = a | ((unsigned)b << 16);
        lo[i] = f2bf(v[2 * i] - bf2f(a)) | ((unsigned)f2bf(v[2 * i + 1] - bf2f(b)) << 16);
    }
    uint4* ph = (uint4*)((bf16_t*)out + o);
    ph[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    ph[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    if (mode == 2) {
        uint4* pl = (uint4*)((bf16_t*)out + (idx_t)nrows * K + o);
        pl[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        pl[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    }
}

// The five butterfly stages across a warp's lanes (stage k: lane bit k) of E values a lane: value e of lane l
// pairs with value e of lane l ^ 2^k, the lane with the bit set keeping the difference (the FWHT's spans of E to
// 16 E, where each lane holds E consecutive values).
template <int E>
__device__ __forceinline__ void fwht_warp_stages(float* v, int lane) {
#pragma unroll
    for (int k = 0; k < 5; k++) {
        bool up = lane & (1 << k);
#pragma unroll
        for (int e = 0; e < E; e++) {
            float o = __shfl_xor_sync(0xffffffffu, v[e], 1 << k);
            v[e] = up ? o - v[e] : v[e] + o;
        }
    }
}

// The 10 butterfly stages of the FWHT over s[1024] (a block's values, signed already unless `inverse`), then / 32
// (and the signs for the inverse), stored as `store_act` with `mode` at out[o + c0 + i]. Every thread of the block
// (256) calls it; it synchronises first, so s may have been written just before. Thread t holds values 4t .. 4t + 3:
// the stages of span 1 and 2 in its registers, 4 to 64 by shuffles within the warp, 128 to 512 through s (the
// same sums in the same order as one stage at a time in shared memory, with 6 barriers instead of 10 and no index
// division).
__device__ __forceinline__ void fwht1024_store(float* s, idx_t o, int c0, const float* __restrict__ signs,
                                               int inverse, void* out, int mode) {
    __syncthreads();
    int t = threadIdx.x;
    float v[4];
    {
        float4 q = ((const float4*)s)[t];
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    }
    float a = v[0], b = v[1];
    v[0] = a + b, v[1] = a - b;
    a = v[2], b = v[3];
    v[2] = a + b, v[3] = a - b;
    a = v[0], b = v[2];
    v[0] = a + b, v[2] = a - b;
    a = v[1], b = v[3];
    v[1] = a + b, v[3] = a - b;
    fwht_warp_stages<4>(v, t);
#pragma unroll
    for (int k = 5; k < 8; k++) {
        __syncthreads();
        ((float4*)s)[t] = make_float4(v[0], v[1], v[2], v[3]);
        __syncthreads();
        float4 q = ((const float4*)s)[t ^ (1 << k)];
        float other[4] = {q.x, q.y, q.z, q.w};
        bool up = t & (1 << k);
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = up ? other[e] - v[e] : v[e] + other[e];
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int c = c0 + 4 * t + e;
        float x = v[e] * (1.0f / 32.0f);
        store_act(out, o + c, inverse ? x * signs[c] : x, mode);
    }
}

// The blockwise Hadamard rotation of a Bonsai pack (docs/formats.md): per row and 1024-block, R x = H (S x) / 32
// (signs first), or with `inverse` R^T z = S (H z / 32) (the embedding after its gather). With a gain (not null) the
// row is first RMS-normed (x * rsqrt(mean(x^2) + eps) * gain, the whole row's sum of squares, recomputed by each of
// its blocks) and, where `raw` is not null, also stored unrotated there (raw_mode, row stride ldr: the input of the
// linears that read the normed input as it is). The rotated row is stored as `store_act` with `mode` (row stride
// ldo). x: [R, K] (stride ldx), K % 1024 == 0; `out` may be x when there is no gain (each block reads its own
// 1024 values before it writes them). With `swiglu` (and no gain) x holds an MLP's [gate | up] rows (stride ldx,
// each K wide) and the rotated values are silu(gate) * up (the SwiGLU fused in front). grid (R, K / 1024), 256
// threads: the 10 butterfly stages in shared memory.
KERNEL(simt) void hadamard_rows(const float* x, int ldx, const float* __restrict__ gain, float eps, int K,
                                const float* __restrict__ signs, int inverse, void* out, int mode, int ldo,
                                void* raw, int raw_mode, int ldr, int swiglu) {
    pdl_wait();
    pdl_launch();
    __shared__ __align__(16) float s[1024];
    idx_t r = blockIdx.x;
    int c0 = blockIdx.y * 1024;
    const float* row = x + r * ldx;
    float inv = 1.0f;
    if (gain) {
        float ss = 0.0f;
        if ((ldx & 3) == 0 && ((unsigned long long)x & 15) == 0) {
            // 16-byte loads, all of a thread's issued together (K % 1024 == 0).
            for (int c = 4 * threadIdx.x; c < K; c += 4 * blockDim.x) {
                float4 q = *(const float4*)(row + c);
                ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
            }
        } else {
            for (int c = threadIdx.x; c < K; c += blockDim.x) ss += row[c] * row[c];
        }
        ss = block_sum(ss);
        inv = 1.0f / sqrtf(ss / K + eps);
    }
    // Four steps' loads (the row's values, the up half, the signs, the gains) before any is used: one round trip,
    // where each step's loads had waited for the step before (its SiLU's division has a slow path behind a call).
    for (int i0 = threadIdx.x; i0 < 1024; i0 += 4 * blockDim.x) {
        float a[4], b[4], sg[4], gn[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int i = i0 + u * blockDim.x, c = c0 + i;
            const bool in = i < 1024;
            a[u] = in ? row[c] : 0.0f;
            b[u] = in && swiglu ? row[K + c] : 0.0f;
            sg[u] = in && !inverse ? signs[c] : 0.0f;
            gn[u] = in && gain ? gain[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int i = i0 + u * blockDim.x, c = c0 + i;
            if (i < 1024) {
                float v = swiglu ? silu_f(a[u]) * b[u] : a[u];
                if (gain) {
                    v = v * inv * gn[u];
                    if (raw) store_act(raw, r * ldr + c, v, raw_mode);
                }
                s[i] = inverse ? v : v * sg[u];
            }
        }
    }
    fwht1024_store(s, r * ldo, c0, signs, inverse, out, mode);
}

// One token row of a rotated pack's norm site (rotate_row_norm; docs/cuda.md, "Rotated packs"): the residual row x,
// RMS-normed over the whole row (gain w, eps) and, with `raw` not null, also stored as it is (raw_mode: store_act's;
// for the linears that read the normed row unrotated, launched after this one); then the signs and the FWHT of each
// 1024-block, / 32: R x as hadamard_rows forms it.
struct RotSrc {
    const float* x;
    const float* w;
    const float* signs;
    void* raw;
    float eps;
    int raw_mode;
};

// rotate_row_norm: one block of K / 1024 warps (at most 24), warp `warp` holding the 1024-block at 1024 warp, lane
// `lane` its 32 values from c0 = 1024 warp + 32 lane: the butterflies of span 1 to 16 in the lane's registers, 32 to
// 512 by shuffles (lane bit k: span 32 * 2^k); one barrier, for the norm's sum of squares (added in warp order).
// Output stored as store_act with `mode` at out[0 .. K).
KERNEL(simt) void __launch_bounds__(768) rotate_row_norm(RotSrc rs, int K, void* out, int mode) {
    pdl_wait();
    pdl_launch();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c0 = warp * 1024 + lane * 32, warps = blockDim.x >> 5;
    // Every load first (one round trip): the row, the signs, the gains.
    float xv[32], sg[32], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 t = *((const float4*)(rs.x + c0) + i), g4 = *((const float4*)(rs.signs + c0) + i);
        float4 w = *((const float4*)(rs.w + c0) + i);
        float tv[4] = {t.x, t.y, t.z, t.w}, f[4] = {w.x, w.y, w.z, w.w};
        sg[4 * i] = g4.x, sg[4 * i + 1] = g4.y, sg[4 * i + 2] = g4.z, sg[4 * i + 3] = g4.w;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            ss = fmaf(tv[j], tv[j], ss);
            xv[4 * i + j] = tv[j] * f[j];
        }
    }
    __shared__ float wss[32];
    ss = warp_sum(ss);
    if (lane == 0) wss[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < warps; w++) tot += wss[w];
    float inv = 1.0f / sqrtf(tot / K + rs.eps);
#pragma unroll
    for (int i = 0; i < 32; i++) xv[i] *= inv;
    if (rs.raw) {
#pragma unroll
        for (int i = 0; i < 32; i += 4) store_act_vec<4>(rs.raw, c0 + i, xv + i, rs.raw_mode);
    }
#pragma unroll
    for (int i = 0; i < 32; i++) xv[i] *= sg[i];
#pragma unroll
    for (int h = 1; h < 32; h <<= 1)
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (!(i & h)) {
                float a = xv[i], b = xv[i + h];
                xv[i] = a + b, xv[i + h] = a - b;
            }
    fwht_warp_stages<32>(xv, lane);
#pragma unroll
    for (int i = 0; i < 32; i += 4) {
        float v[4] = {xv[i] * (1.0f / 32.0f), xv[i + 1] * (1.0f / 32.0f), xv[i + 2] * (1.0f / 32.0f),
                      xv[i + 3] * (1.0f / 32.0f)};
        store_act_vec<4>(out, c0 + i, v, mode);
    }
}

// The gated RMSNorm of a Gated DeltaNet's core output (rms_norm_gated: per value head of dv values, x * rsqrt(mean(x^2)
// + eps) * w * silu(z)) and the rotation of the result in one launch (a rotated pack's out_proj site). x: [N, K]
// (K = HV dv, K % 1024 == 0, 1024 % dv == 0, dv % 4 == 0); z row n at z + n ldz ([HV, dv]); w: [dv]. Each block
// takes 1024 values of a row, whole heads: thread t holds values 4t .. 4t + 3 (one head), the head's sum of squares
// by shuffles over its dv / 4 threads (and the warps' sums in shared memory for dv > 128). grid (N, K / 1024), 256
// threads.
KERNEL(simt) void gated_norm_rotate(const float* __restrict__ x, const float* __restrict__ z, int ldz,
                                    const float* __restrict__ w, float eps, int dv, int K,
                                    const float* __restrict__ signs, void* out, int mode, int ldo) {
    __shared__ __align__(16) float s[1024];
    __shared__ float wsum[8];
    idx_t r = blockIdx.x;
    int c0 = blockIdx.y * 1024, i0 = 4 * threadIdx.x, c = c0 + i0;
    // Every load first (one round trip): the values, and the gain, z and signs they are multiplied by (loaded after
    // the reduction, each waited for the SiLU before it).
    float v[4], wv[4], zv[4], sg[4], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = x[r * K + c + j];
        wv[j] = w[(c + j) % dv];
        zv[j] = z[r * ldz + c + j];
        sg[j] = signs[c + j];
    }
#pragma unroll
    for (int j = 0; j < 4; j++) ss += v[j] * v[j];
    int seg = min(dv / 4, 32);
    for (int o = seg / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (dv > 128) {
        int warp = threadIdx.x >> 5, per = dv / 128;
        if ((threadIdx.x & 31) == 0) wsum[warp] = ss;
        __syncthreads();
        ss = 0.0f;
        for (int k = 0; k < per; k++) ss += wsum[warp / per * per + k];
    }
    float inv = 1.0f / sqrtf(ss / dv + eps);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float g = v[j] * inv * wv[j] * silu_f(zv[j]);
        s[i0 + j] = g * sg[j];
    }
    fwht1024_store(s, r * ldo, c0, signs, 0, out, mode);
}

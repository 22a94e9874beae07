
// ---------------------------------------------------------------------------------------------------------------
// The prefill GEMM of block-format weights (PQ2_0, Q8_0) on the int8 tensor cores (crates/cuda/src/qgemm.rs
// launches it; compiled after quant.cu and tc_common.cu, whose layout and cp.async helpers it uses):
// y[T, N] = x[T, K] · w[N, K]ᵀ (+ beta y), the weight read as the file stores it (quant.cu's device layout).
//
// The activations are first quantized (`qmma_quant`), per row and 128-value block, to int16 q = round(x / s),
// s = max |x| / 32767 (the one-row GEMV's integer products do the same), stored as two byte planes: h = q >> 8
// (signed) and l = q & 255 (unsigned), q = 256 h + l. Then per block of 128 K the GEMM multiplies each plane by
// the weight bytes (m16n8k32 int8 mma, int32 sums, exact): Σ w q = 256 Σ w h + Σ w l, scaled once into the f32
// accumulator by s · d (the weight block's scale). PQ2_0's bytes are the codes c = value + 1 (0..3, one shift
// and one mask per four weights), so its sum is Σ c q - Σ q, Σ q kept per (row, block) beside s. Q8_0 blocks are
// 32 long: the sum is scaled per 32 (the activation scale still per 128), and K must be a multiple of 128 (each
// stage's 4 scales of a row one aligned 8-byte copy). The sums are in a fixed order (no split K): two runs give
// the same bits.
// ---------------------------------------------------------------------------------------------------------------

// The k order of a PQ2_0 block inside the quantized activations, chosen so that a code word is the mma's weight
// fragment after one shift and mask: the 128 positions are 4 mma steps s of 8 quads p of 4 bytes b (position
// 32 s + 4 p + b), and lane t's weight fragment of step s is bytes 8t .. 8t + 7 of the row's 32 code bytes (words
// 2t and 2t + 1) shifted right by 2s and masked, whose byte b is weight 16 (2t + w) + 4b + s (w = 0, 1: fragment
// registers b0, b1, quads p = t and 4 + t). → the weight (0..127) at position pos.
__device__ __forceinline__ int qmma_pq2_weight(int pos) {
    int s = pos >> 5, p = (pos >> 2) & 7, b = pos & 3;
    return 16 * (2 * (p & 3) + (p >> 2)) + 4 * b + s;
}

// Quantizes x [T, K] (bf16 rows, or split: hi + lo, `lo` elements after hi; row stride ldx elements) for
// the GEMMs: h, l planes [T, Kp] (Kp = K rounded up to 128; zeros past K), in PQ2_0's k order (`pq2`) or the
// natural one; s and Σ q [Kp / 128, tp] (block-major, tp rows apart). `tt` > 0: the planes tiled instead for
// the warpgroup GEMM (qwgmma.cu), per 128-K block tt rows (a multiple of 8, at least T) of 8-row groups of 8 x
// 16-byte core matrices: row r, position p of block b at b 128 tt + (r / 8) 1024 + (p / 16) 128 + (r % 8) 16 + p % 16,
// so that a block's run of rows is one contiguous copy. One warp per (row, block): lane i takes positions
// 4i .. 4i + 3. grid (ceil(Kp / 128 / 8), T), 256 threads.
KERNEL(simt) void qmma_quant(const unsigned short* __restrict__ x, int ldx, long long lo, int split, int K, int Kp,
                             int pq2, signed char* __restrict__ xh, unsigned char* __restrict__ xl,
                             float* __restrict__ sx, int* __restrict__ qs, int tp, int tt) {
    int lane = threadIdx.x & 31, blk = blockIdx.x * 8 + (threadIdx.x >> 5);
    idx_t r = blockIdx.y;
    if (blk * 128 >= Kp) return;
    const unsigned short* row = x + r * ldx;
    float v[4], m = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        int pos = 4 * lane + b;
        int k = blk * 128 + (pq2 ? qmma_pq2_weight(pos) : pos);
        float f = 0.0f;
        if (k < K) {
            f = __uint_as_float((unsigned)row[k] << 16);
            if (split) f += __uint_as_float((unsigned)row[lo + k] << 16);
        }
        v[b] = f;
        m = fmaxf(m, fabsf(f));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float inv = q16_inv(m);
    unsigned hw = 0u, lw = 0u;
    int sum = 0;
#pragma unroll
    for (int b = 0; b < 4; b++) sum += q16_put(v[b], inv, b, hw, lw);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    idx_t o = tt ? (idx_t)blk * 128 * tt + (r >> 3) * 1024 + (lane >> 2) * 128 + (r & 7) * 16 + 4 * (lane & 3)
                 : r * Kp + blk * 128 + 4 * lane;
    *(unsigned*)(xh + o) = hw;
    *(unsigned*)(xl + o) = lw;
    if (lane == 0) {
        sx[(idx_t)blk * tp + r] = m / 32767.0f;
        qs[(idx_t)blk * tp + r] = sum;
    }
}

// c[16x8] (+)= a[16x32] · b[32x8], int8 in (four per register), int32 sums: fragments as tc_mma's with four bytes
// per register (PTX ISA m16n8k32): a0 (g, 4t..4t+3), a1 (g+8, 4t..), a2 (g, 16+4t..), a3 (g+8, 16+4t..); b0 (k
// 4t..4t+3, n g), b1 (k 16+4t.., n g); c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1). AT, BT: s8 or u8. The
// _z form starts from zero.
#define QMMA_MMA(name, AT, BT)                                                                                     \
    __device__ __forceinline__ void name(int* c, const unsigned* a, unsigned b0, unsigned b1) {                   \
        asm("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "    \
            "{%0,%1,%2,%3};\n"                                                                                    \
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                                                      \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                     \
    }                                                                                                             \
    __device__ __forceinline__ void name##_z(int* c, const unsigned* a, unsigned b0, unsigned b1) {               \
        asm("mma.sync.aligned.m16n8k32.row.col.s32." AT "." BT ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "    \
            "{%10,%10,%10,%10};\n"                                                                                \
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])                                                      \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));                              \
    }
QMMA_MMA(qmma_s8u8, "s8", "u8")
QMMA_MMA(qmma_u8u8, "u8", "u8")
QMMA_MMA(qmma_s8s8, "s8", "s8")
QMMA_MMA(qmma_u8s8, "u8", "s8")

// The four 8x16-byte matrices at shared address `addr` (each lane passes its row's): a 16x32 int8 A fragment.
__device__ __forceinline__ void qmma_ldsm4(unsigned* a, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}
__device__ __forceinline__ void qmma_cp8(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

// Q8_0's block tile: QMMA_BM rows of x by QMMA_BN rows of w, 8 warps of QMMA_MT x QMMA_NT mma tiles (16 x 8 each),
// QMMA_WARPS_N of them along w; one 128-K block per pipeline stage, QMMA_STAGES stages in flight (cp.async).
// qgemm.rs's QMMA_* constants repeat these. Now 64 x 256, warps of 64 x 32 side by side along w: the x planes
// (2 bytes a value, the larger operand) are read once per 256 weight rows. Measured on an H200 (27B PQ2_0 shapes,
// T 512, split, docs/benchmarks/ternary-gpu.md), µs for gate|up 34816 x 5120, down 5120 x 17408, qkv|z 16384 x
// 5120: 128 x 128 tiles of 64 x 32 warps 934 / 730 / 431; of 32 x 64 warps 1028 / 806 / 472; 64 x 256 of 32 x 64
// warps 979 / 760 / 450 (4 stages: 982 / 756 / 447); this tile 858 / 664 / 395 (Q8_0 down 950 against 872 for
// the first tile).
#define QMMA_MT 4       // 16-row mma tiles of x per warp
#define QMMA_NT 4       // 8-row mma tiles of w per warp
#define QMMA_WARPS_N 8  // warps along w
#define QMMA_BM (16 * QMMA_MT * (8 / QMMA_WARPS_N))
#define QMMA_BN (8 * QMMA_NT * QMMA_WARPS_N)
#define QMMA_STAGES 3
#define QMMA_APITCH 144  // bytes per x row of a plane in a stage (128 + 16: ldmatrix rows on distinct banks)

struct QmmaTile {
    static constexpr int WPITCH = 144;                   // weight bytes per row in a stage
    static constexpr int A = 2 * QMMA_BM * QMMA_APITCH;  // the h and l planes
    static constexpr int W = QMMA_BN * WPITCH;
    static constexpr int S = 2 * QMMA_BM * 4;            // s and Σ q of the stage's x rows
    static constexpr int D = QMMA_BN * 8;                // the 4 scales per w row
    static constexpr int STAGE = A + W + S + D;
};

// y rows m0.. (x rows, T in all) by columns n0.. (w rows, N in all) of one block tile, over the 128-K blocks
// b0 .. b1 of the row (all of them: 0 .. Kp / 128). q, d: the weight (codes, f16 scales; K values per row); xh, xl,
// sx, qs: qmma_quant's output for these T rows (row stride Kp, tp).
__device__ __forceinline__ void qmma_q8_gemm(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             const signed char* __restrict__ xh, const unsigned char* __restrict__ xl,
                                             const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
                                             int K, int Kp, int tp, int b0, int b1, float* __restrict__ y, int ldy,
                                             float beta) {
    using L = QmmaTile;
    extern __shared__ __align__(16) unsigned char qmma_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int wm = warp / QMMA_WARPS_N, wn = warp % QMMA_WARPS_N;
    const int m0 = blockIdx.x * QMMA_BM, n0 = blockIdx.y * QMMA_BN;
    const int nb = max(0, b1 - b0);
    const idx_t row_bytes = K, row_scales = K / 32;
    const unsigned base = tc_smem_addr(qmma_smem);

    // Stage `st` <- block `b` (every thread issues its copies; rows past T or N and bytes past K zero-filled).
    auto load = [&](int st, int b) {
        unsigned s0 = base + st * L::STAGE;
        constexpr int ACH = QMMA_BM * 8;  // 16-byte chunks of a plane
#pragma unroll
        for (int i = 0; i < 2 * ACH / 256; i++) {
            int c = tid + 256 * i, plane = c / ACH, r = (c % ACH) >> 3, col = c & 7;
            bool ok = m0 + r < T;
            const unsigned char* src = plane ? (const unsigned char*)xl : (const unsigned char*)xh;
            if (ok) src += (idx_t)(m0 + r) * Kp + b * 128 + col * 16;
            tc_cp16(s0 + plane * QMMA_BM * QMMA_APITCH + r * QMMA_APITCH + col * 16, src, ok ? 16 : 0);
        }
        unsigned sw = s0 + L::A;
#pragma unroll
        for (int u = 0; u < 8 * QMMA_BN / 256; u++) {
            int c = tid + 256 * u, r = c >> 3, col = c & 7;
            bool ok = n0 + r < N;
            const unsigned char* src = ok ? q + (idx_t)(n0 + r) * row_bytes + b * 128 + col * 16 : q;
            tc_cp16(sw + r * L::WPITCH + col * 16, src, ok ? 16 : 0);
        }
        for (int r = tid; r < QMMA_BN; r += 256) {
            bool ok = n0 + r < N;
            const unsigned short* src = ok ? d + (idx_t)(n0 + r) * row_scales + 4 * b : d;
            qmma_cp8(s0 + L::A + L::W + L::S + r * 8, src, ok ? 8 : 0);
        }
        if (tid < QMMA_BM / 2) {
            int which = tid / (QMMA_BM / 4), r = (tid % (QMMA_BM / 4)) * 4, have = max(0, min(4, T - (m0 + r)));
            idx_t at = (idx_t)b * tp + m0 + r;
            const void* src = which ? (const void*)(qs + at) : (const void*)(sx + at);
            tc_cp16(s0 + L::A + L::W + which * QMMA_BM * 4 + r * 4, have ? src : (const void*)sx, 4 * have);
        }
    };

    float acc[QMMA_MT][QMMA_NT][4];
#pragma unroll
    for (int i = 0; i < QMMA_MT; i++)
#pragma unroll
        for (int j = 0; j < QMMA_NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int st = 0; st < QMMA_STAGES - 1; st++) {
        if (st < nb) load(st, b0 + st);
        tc_commit();
    }
    // This lane's ldmatrix row and 16-byte half within an m tile, and its weight rows / columns.
    const int arow = (lane & 7) + ((lane >> 3) & 1) * 8, acol = (lane >> 4) * 16;
#pragma unroll 1
    for (int b = 0; b < nb; b++) {
        tc_wait<QMMA_STAGES - 2>();
        __syncthreads();
        if (b + QMMA_STAGES - 1 < nb) load((b + QMMA_STAGES - 1) % QMMA_STAGES, b0 + b + QMMA_STAGES - 1);
        tc_commit();
        const int st = b % QMMA_STAGES;
        const unsigned sa = base + st * L::STAGE + (wm * (16 * QMMA_MT) + arow) * QMMA_APITCH + acol;
        const unsigned char* stg = qmma_smem + st * L::STAGE;
        const float* ssx = (const float*)(stg + L::A + L::W);
        int c[QMMA_MT][QMMA_NT][4];
        // Q8_0: per 32-step s, c = 256 (w · h) + w · l for the step, scaled by its block's d.
        const unsigned char* sw = stg + L::A;
        const unsigned short* sd = (const unsigned short*)(stg + L::A + L::W + L::S);
        float sv[QMMA_MT][2];
#pragma unroll
        for (int i = 0; i < QMMA_MT; i++) {
            int r = wm * (16 * QMMA_MT) + 16 * i + g;
            sv[i][0] = ssx[r], sv[i][1] = ssx[r + 8];
        }
#pragma unroll
        for (int s = 0; s < 4; s++) {
            unsigned bw[QMMA_NT][2];
            float dv[QMMA_NT][2];
#pragma unroll
            for (int j = 0; j < QMMA_NT; j++) {
                int r = wn * (8 * QMMA_NT) + 8 * j + g, col = wn * (8 * QMMA_NT) + 8 * j + 2 * t4;
                bw[j][0] = *(const unsigned*)(sw + r * L::WPITCH + 32 * s + 4 * t4);
                bw[j][1] = *(const unsigned*)(sw + r * L::WPITCH + 32 * s + 16 + 4 * t4);
                dv[j][0] = h2f(sd[col * 4 + s]);
                dv[j][1] = h2f(sd[(col + 1) * 4 + s]);
            }
#pragma unroll
            for (int i = 0; i < QMMA_MT; i++) {
                unsigned ah[4], al[4];
                qmma_ldsm4(ah, sa + i * 16 * QMMA_APITCH + 32 * s);
                qmma_ldsm4(al, sa + QMMA_BM * QMMA_APITCH + i * 16 * QMMA_APITCH + 32 * s);
#pragma unroll
                for (int j = 0; j < QMMA_NT; j++) {
                    qmma_s8s8_z(c[i][j], ah, bw[j][0], bw[j][1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) c[i][j][e] *= 256;
                    qmma_u8s8(c[i][j], al, bw[j][0], bw[j][1]);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[i][j][e] = fmaf((float)c[i][j][e], sv[i][e >> 1] * dv[j][e & 1], acc[i][j][e]);
                }
            }
        }
    
    }
    tc_wait<0>();
    // The tile out: y = acc (+ beta y), rows below T and columns below N only.
#pragma unroll
    for (int i = 0; i < QMMA_MT; i++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            int r = m0 + wm * (16 * QMMA_MT) + 16 * i + g + 8 * e2;
            if (r >= T) continue;
#pragma unroll
            for (int j = 0; j < QMMA_NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int n = n0 + wn * (8 * QMMA_NT) + 8 * j + 2 * t4 + e;
                    if (n >= N) continue;
                    float* yo = y + (idx_t)r * ldy + n;
                    float v = acc[i][j][2 * e2 + e];
                    *yo = beta != 0.0f ? v + beta * *yo : v;
                }
        }
}
// grid (ceil(T / QMMA_BM), ceil(N / QMMA_BN), S), 256 threads, QMMA_STAGES · QmmaTile::STAGE bytes of dynamic
// shared memory. With S = 1, y = x · wᵀ + beta y; with S > 1 the row's 128-K blocks are cut into S runs of
// ceil(nb / S), and run z writes its sums alone to part + z T N ([T, N] each; qmma_split_sum adds them up in z
// order, so the answers do not depend on which block finishes first).
KERNEL(qmma_q8) void __launch_bounds__(256, 1)
    qmma_q8(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d, const signed char* __restrict__ xh,
            const unsigned char* __restrict__ xl, const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
            int K, int Kp, int tp, float* __restrict__ y, int ldy, float beta, float* __restrict__ part) {
    const int nb = Kp / 128;
    if (gridDim.z == 1) {
        qmma_q8_gemm(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, 0, nb, y, ldy, beta);
        return;
    }
    const int per = (nb + gridDim.z - 1) / gridDim.z, b0 = blockIdx.z * per;
    qmma_q8_gemm(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, b0, min(nb, b0 + per), part + (idx_t)blockIdx.z * T * N, N,
                 0.0f);
}

// y[T, N] (row stride ldy) = the sum over z of part[z] ([S, T, N], added in z order) + beta y. One thread an output.
KERNEL(simt) void qmma_split_sum(const float* __restrict__ part, int S, int T, int N, float* __restrict__ y, int ldy,
                                 float beta) {
    idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x, tn = (idx_t)T * N;
    if (i >= tn) return;
    float v = 0.0f;
    for (int z = 0; z < S; z++) v += part[z * tn + i];
    float* yo = y + (i / N) * ldy + i % N;
    *yo = beta != 0.0f ? v + beta * *yo : v;
}

// PQ2_0's GEMM: the weight is the mma's A operand, straight from its code words in registers (one shift and mask
// per register and 32-K step; the k order of qmma_quant's PQ2_0 planes makes words 2t and 2t + 1 of rows g and
// g + 8 the fragment a0..a3, computed once per 128-K block for both planes and every token tile), the activation
// planes the B operand (8 tokens by 32 k, one ldmatrix.x4 for two 8-token tiles). A warp takes MI 16-row weight
// tiles by NJ 8-token tiles, two token tiles at a time: their int32 sums over both planes (the h plane, c = 256 c
// - Σ q, the l plane) are folded into the f32 accumulator as acc += c (s d) per 128-K block before the next two,
// so that few int32 sums are live. WW warps along the weight, NW / WW along the tokens; 3 stages of cp.async.
// Every tile shape sums each output in the same order (the 128-K blocks in turn, exact int32 sums within one):
// the tile choice (qgemm.rs) changes no bit. Measured on an H200 against the earlier kernel (x as A by ldmatrix,
// the codes as B, 64 x 256 tiles of 8 warps, docs/benchmarks/ternary-gpu.md): 27B gate|up at 512 tokens 841 ->
// 665 µs, down 631 -> 419, down at 400 tokens 617 -> 346 (the 16-warp tile).
template <int MI, int NJ, int WW, int NW>
struct QmmaPq2Tile {
    static constexpr int NT = 32 * NW;       // threads
    static constexpr int BW = WW * 16 * MI;  // weight rows per block
    static constexpr int BT = NW / WW * 8 * NJ;  // tokens per block
    static constexpr int XP = QMMA_APITCH;   // bytes per token row of a plane in a stage
    static constexpr int A = 2 * BT * XP;    // the h and l planes
    static constexpr int W = BW * 32;        // the code bytes
    static constexpr int S = 2 * BT * 4;     // s and Σ q of the stage's tokens
    static constexpr int STAGE = A + W + S;
    static constexpr int STAGES = 3;
};

template <int MI, int NJ, int WW, int NW>
__device__ __forceinline__ void qmma_pq2_gemm(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                              const signed char* __restrict__ xh, const unsigned char* __restrict__ xl,
                                              const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
                                              int K, int Kp, int tp, float* __restrict__ y, int ldy, float beta) {
    using L = QmmaPq2Tile<MI, NJ, WW, NW>;
    static_assert(NJ % 2 == 0 && L::BT / 2 <= L::NT, "token tiles in pairs; the scale copies one per thread");
    extern __shared__ __align__(16) unsigned char qmma_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int ww = warp % WW, wt = warp / WW;
    const int m0 = blockIdx.x * L::BT, n0 = blockIdx.y * L::BW;
    const int nb = Kp / 128;
    const idx_t row_bytes = K / 4, row_scales = K / 128;
    const unsigned base = tc_smem_addr(qmma_smem);

    // Each thread's copies of a stage, their sources a fixed offset per block b: x chunks c = tid + NT i (plane
    // c / ACH, token row (c % ACH) / 8, 16 bytes at (c % 8) 16), weight chunks c = tid + NT u (row c / 2, half
    // c % 2). Rows past T or N are zero-filled.
    constexpr int ACH = L::BT * 8, NX = 2 * ACH / L::NT, NWC = (2 * L::BW + L::NT - 1) / L::NT;
    static_assert(2 * ACH % L::NT == 0, "whole rounds of x chunks");
    const unsigned char* xsrc[NX];
    unsigned xdst[NX];
#pragma unroll
    for (int i = 0; i < NX; i++) {
        int c = tid + L::NT * i, plane = c / ACH, r = (c % ACH) >> 3, col = c & 7;
        const unsigned char* p = plane ? (const unsigned char*)xl : (const unsigned char*)xh;
        xsrc[i] = m0 + r < T ? p + (idx_t)(m0 + r) * Kp + col * 16 : nullptr;
        xdst[i] = plane * L::BT * L::XP + r * L::XP + col * 16;
    }
    const unsigned char* wsrc[NWC];
#pragma unroll
    for (int u = 0; u < NWC; u++) {
        int c = tid + L::NT * u, r = c >> 1, half = c & 1;
        wsrc[u] = c < 2 * L::BW && n0 + r < N ? q + (idx_t)(n0 + r) * row_bytes + half * 16 : nullptr;
    }
    auto load = [&](int st, int b) {
        unsigned s0 = base + st * L::STAGE;
#pragma unroll
        for (int i = 0; i < NX; i++)
            tc_cp16(s0 + xdst[i], xsrc[i] ? xsrc[i] + b * 128 : (const unsigned char*)xh, xsrc[i] ? 16 : 0);
#pragma unroll
        for (int u = 0; u < NWC; u++)
            if (tid + L::NT * u < 2 * L::BW)
                tc_cp16(s0 + L::A + (tid + L::NT * u) * 16, wsrc[u] ? wsrc[u] + b * 32 : q, wsrc[u] ? 16 : 0);
        if (tid < L::BT / 2) {
            int which = tid / (L::BT / 4), r = (tid % (L::BT / 4)) * 4, have = max(0, min(4, T - (m0 + r)));
            idx_t at = (idx_t)b * tp + m0 + r;
            const void* src = which ? (const void*)(qs + at) : (const void*)(sx + at);
            tc_cp16(s0 + L::A + L::W + which * L::BT * 4 + r * 4, have ? src : (const void*)sx, 4 * have);
        }
    };

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
#pragma unroll
    for (int st = 0; st < L::STAGES - 1; st++) {
        if (st < nb) load(st, st);
        tc_commit();
    }
    // This lane's ldmatrix row (token) and 16-byte half; the warp's first weight row and token.
    const int xrow = (lane & 7) + ((lane >> 4) << 3), xcol = ((lane >> 3) & 1) * 16;
    const int wr = ww * 16 * MI, tk = wt * 8 * NJ;
#pragma unroll 1
    for (int b = 0; b < nb; b++) {
        tc_wait<L::STAGES - 2>();
        __syncthreads();
        if (b + L::STAGES - 1 < nb) load((b + L::STAGES - 1) % L::STAGES, b + L::STAGES - 1);
        tc_commit();
        const int st = b % L::STAGES;
        const unsigned char* stg = qmma_smem + st * L::STAGE;
        const float* ssx = (const float*)(stg + L::A + L::W);
        const int* sqs = (const int*)(stg + L::A + L::W + L::BT * 4);
        // This lane's weight rows: their block scales and code words, then every step's A fragments.
        float dv[MI][2];
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int n = n0 + wr + 16 * i + g + 8 * h;
                dv[i][h] = n < N ? h2f(__ldg(d + (idx_t)n * row_scales + b)) : 0.0f;
            }
        uint2 cw[MI][2];
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) cw[i][h] = *(const uint2*)(stg + L::A + (wr + 16 * i + g + 8 * h) * 32 + 8 * t4);
        unsigned af[4][MI][4];
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int i = 0; i < MI; i++) {
                af[s][i][0] = (cw[i][0].x >> (2 * s)) & 0x03030303u, af[s][i][1] = (cw[i][1].x >> (2 * s)) & 0x03030303u;
                af[s][i][2] = (cw[i][0].y >> (2 * s)) & 0x03030303u, af[s][i][3] = (cw[i][1].y >> (2 * s)) & 0x03030303u;
            }
        const unsigned sb = base + st * L::STAGE + (tk + xrow) * L::XP + xcol;
#pragma unroll
        for (int j0 = 0; j0 < NJ; j0 += 2) {
            int c[MI][2][4];
#pragma unroll
            for (int plane = 0; plane < 2; plane++) {
                if (plane == 1) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        int t = tk + 8 * (j0 + j) + 2 * t4, q0 = sqs[t], q1 = sqs[t + 1];
#pragma unroll
                        for (int i = 0; i < MI; i++) {
                            c[i][j][0] = c[i][j][0] * 256 - q0, c[i][j][1] = c[i][j][1] * 256 - q1;
                            c[i][j][2] = c[i][j][2] * 256 - q0, c[i][j][3] = c[i][j][3] * 256 - q1;
                        }
                    }
                }
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    unsigned bf[4];
                    qmma_ldsm4(bf, sb + plane * L::BT * L::XP + (j0 / 2) * 16 * L::XP + 32 * s);
#pragma unroll
                    for (int i = 0; i < MI; i++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            if (plane == 0 && s == 0)
                                qmma_u8s8_z(c[i][j], af[s][i], bf[2 * j], bf[2 * j + 1]);
                            else if (plane == 0)
                                qmma_u8s8(c[i][j], af[s][i], bf[2 * j], bf[2 * j + 1]);
                            else
                                qmma_u8u8(c[i][j], af[s][i], bf[2 * j], bf[2 * j + 1]);
                        }
                }
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int t = tk + 8 * (j0 + j) + 2 * t4;
                float s0 = ssx[t], s1 = ssx[t + 1];
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    acc[i][j0 + j][0] = fmaf((float)c[i][j][0], s0 * dv[i][0], acc[i][j0 + j][0]);
                    acc[i][j0 + j][1] = fmaf((float)c[i][j][1], s1 * dv[i][0], acc[i][j0 + j][1]);
                    acc[i][j0 + j][2] = fmaf((float)c[i][j][2], s0 * dv[i][1], acc[i][j0 + j][2]);
                    acc[i][j0 + j][3] = fmaf((float)c[i][j][3], s1 * dv[i][1], acc[i][j0 + j][3]);
                }
            }
        }
    }
    tc_wait<0>();
    // The tile out: y = acc (+ beta y), tokens below T and rows below N only.
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = m0 + tk + 8 * j + 2 * t4 + (e & 1), n = n0 + wr + 16 * i + g + 8 * (e >> 1);
                if (r >= T || n >= N) continue;
                float* yo = y + (idx_t)r * ldy + n;
                float v = acc[i][j][e];
                *yo = beta != 0.0f ? v + beta * *yo : v;
            }
}
// grid (ceil(T / BT), ceil(N / BW)), 32 NW threads, STAGES · STAGE bytes of dynamic shared memory (QmmaPq2Tile);
// qgemm.rs's QMMA_PQ2 repeats the shapes. `qmma_pq2`: 64 tokens by 128 rows, 8 warps, two blocks a multiprocessor
// (128 registers); `qmma_pq2_16`: 32 tokens by 256 rows, 16 warps, one block: fewer, wider blocks, for the shapes
// where the first leaves a last wave mostly idle (N 5,120 at 400 tokens).
#define QMMA_PQ2(name, MI, NJ, WW, NW, MINB)                                                                       \
    KERNEL(name) void __launch_bounds__(32 * NW, MINB)                                                             \
        name(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,                            \
             const signed char* __restrict__ xh, const unsigned char* __restrict__ xl,                             \
             const float* __restrict__ sx, const int* __restrict__ qs, int T, int N, int K, int Kp, int tp,        \
             float* __restrict__ y, int ldy, float beta) {                                                         \
        qmma_pq2_gemm<MI, NJ, WW, NW>(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, y, ldy, beta);                        \
    }
QMMA_PQ2(qmma_pq2, 2, 4, 4, 8, 2)
QMMA_PQ2(qmma_pq2_16, 2, 2, 8, 16, 1)

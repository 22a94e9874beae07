
// ---------------------------------------------------------------------------------------------------------------
// PQ2_0's prefill GEMM on Hopper's warpgroup mma (`wgmma.mma_async`, sm_90a only; compiled after qmma.cu, whose
// quantized activations and code-word fragments it reads the same way): y[T, N] = x[T, K] · w[N, K]ᵀ (+ beta y).
//
// The weight is the A operand from registers, as in qmma_pq2_gemm: one shift and mask per register and 32-K step
// (the k order of qmma_quant's PQ2_0 planes makes words 2t and 2t + 1 of a warp's rows g and g + 8 the fragment;
// wgmma's A fragment is mma.m16n8k32's, warp w of the warpgroup holding rows 16 w .. 16 w + 15). The activation
// planes are the B operand, read by the tensor cores from shared memory through a descriptor: a stage's plane is
// BT tokens by 128 bytes in 8 x 16-byte core matrices (token r, 16-byte chunk c at (r / 8) 1024 + c 128 + (r % 8)
// 16: no swizzle, K-major; the two chunks of a 32-K step 128 bytes apart, token groups 1024). Per 128-K block a
// warpgroup multiplies its 64 MW rows by the BT tokens: the h plane's four steps (int32 sums, exact), c = 256 c -
// Σ q, the l plane's four steps onto c, then acc += c (s d) in f32, the same integers and the same f32 operations
// in the same order as qmma_pq2_gemm: the outputs are that kernel's to the bit. WGS warpgroups side by side along
// the weight share a stage's activation planes; STAGES stages in flight (the planes by cp.async or bulk copies, the
// code bytes, scales and Σ q by cp.async: qwg_pq2_gemm's CL). The engine's tile (qgemm.rs's QWG_*): 2 warpgroups
// of 64 rows by 64 tokens, two blocks a multiprocessor, the planes tiled and bulk-copied.
// ---------------------------------------------------------------------------------------------------------------

template <int WGS, int MW, int BT, int STAGES>
struct QwgTile {
    static constexpr int NT = 128 * WGS;      // threads
    static constexpr int BW = 64 * MW * WGS;  // weight rows per block
    static constexpr int XP = BT * 128;       // bytes of one plane in a stage
    static constexpr int A = 2 * XP;          // the h and l planes
    static constexpr int W = BW * 32;         // the code bytes
    static constexpr int S = 2 * BT * 4;      // s and Σ q of the stage's tokens
    static constexpr int STAGE = A + W + S;
    static_assert(STAGE % 16 == 0, "stages 16-byte aligned");
};

// A no-swizzle K-major descriptor of the B operand at shared address `addr` (16-byte aligned): 32-K steps of two
// 16-byte chunks 128 bytes apart (leading byte offset), 8-token groups 1024 bytes apart (stride byte offset).
__device__ __forceinline__ unsigned long long qwg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | ((unsigned long long)(128 >> 4) << 16) |
           ((unsigned long long)(1024 >> 4) << 32);
}

// Pins a register in place across the asynchronous mma (no read or write of it moved past a fence or wait).
__device__ __forceinline__ void qwg_pin(int& r) { asm volatile("" : "+r"(r)::"memory"); }

#define QWG_R8(i) "+r"(c[i]), "+r"(c[i + 1]), "+r"(c[i + 2]), "+r"(c[i + 3]), "+r"(c[i + 4]), "+r"(c[i + 5]), \
                  "+r"(c[i + 6]), "+r"(c[i + 7])
#define QWG_D32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25," \
                "%26,%27,%28,%29,%30,%31}"
#define QWG_D64                                                                                                  \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28," \
    "%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55," \
    "%56,%57,%58,%59,%60,%61,%62,%63}"

// c[64 x BT] (+)= a[64 x 32] · b[32 x BT] (BT 64 or 128): a from registers (u8 codes), b by descriptor (the h
// plane as s8, or with LO the l plane as u8), int32 sums; `acc` 0: c = a · b, else c += a · b.
template <int BT, bool LO>
__device__ __forceinline__ void qwg_mma(int* c, const unsigned* a, unsigned long long desc, int acc);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QWG_ISA 1
__device__ __forceinline__ void qwg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void qwg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void qwg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// One specialization: BT tokens, the B type BTYPE, the accumulator list DLIST (%0 .. %(BT / 2 - 1)), then the
// operand numbers of a's four registers (NA), the descriptor (ND) and `acc` (NACC), OUTS the accumulators.
#define QWG_MMA(BT, LO, BTYPE, DLIST, NA, ND, NACC, OUTS)                                                         \
    template <>                                                                                                  \
    __device__ __forceinline__ void qwg_mma<BT, LO>(int* c, const unsigned* a, unsigned long long desc, int acc) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " NACC ", 0;\n"                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #BT "k32.s32.u8." BTYPE " " DLIST ", {" NA "}, " ND      \
                     ", p;\n}\n"                                                                                \
                     : OUTS                                                                                      \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc)                          \
                     : "memory");                                                                                \
    }
#define QWG_OUT32 QWG_R8(0), QWG_R8(8), QWG_R8(16), QWG_R8(24)
#define QWG_OUT64 QWG_OUT32, QWG_R8(32), QWG_R8(40), QWG_R8(48), QWG_R8(56)
QWG_MMA(64, false, "s8", QWG_D32, "%32,%33,%34,%35", "%36", "%37", QWG_OUT32)
QWG_MMA(64, true, "u8", QWG_D32, "%32,%33,%34,%35", "%36", "%37", QWG_OUT32)
QWG_MMA(128, false, "s8", QWG_D64, "%64,%65,%66,%67", "%68", "%69", QWG_OUT64)
QWG_MMA(128, true, "u8", QWG_D64, "%64,%65,%66,%67", "%68", "%69", QWG_OUT64)
#undef QWG_MMA
#undef QWG_OUT32
#undef QWG_OUT64
#else
#define QWG_ISA 0
__device__ __forceinline__ void qwg_fence() {}
__device__ __forceinline__ void qwg_commit() {}
__device__ __forceinline__ void qwg_wait0() {}
// Not sm_90a: never launched (qgemm.rs picks these kernels on compute capability 9.0 only, compiled as sm_90a).
template <int BT, bool LO>
__device__ __forceinline__ void qwg_mma(int* c, const unsigned* a, unsigned long long desc, int acc) {
    __trap();
}
#endif
#undef QWG_R8
#undef QWG_D32
#undef QWG_D64


// The stage barriers and bulk copies of the cluster form (CL >= 1): an mbarrier per stage, the activation tile of
// a stage one bulk copy (or CL pieces, each CTA's multicast to the whole cluster).
__device__ __forceinline__ void qwg_bar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void qwg_bar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void qwg_bar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred P;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n@!P bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void qwg_bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#if QWG_ISA
__device__ __forceinline__ void qwg_bulk_mc(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                            unsigned short mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "h"(mask)
        : "memory");
}
#else
__device__ __forceinline__ void qwg_bulk_mc(unsigned, const void*, unsigned, unsigned, unsigned short) { __trap(); }
#endif
__device__ __forceinline__ void qwg_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void qwg_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
__device__ __forceinline__ unsigned qwg_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// CL 0: every copy cp.async (the planes in qmma_quant's row layout); CL >= 1: the planes tiled (qmma_quant's `tt`
// = tt here), a stage's two plane tiles bulk-copied and, in a cluster of CL blocks along the weight (the same
// tokens), multicast: each block copies a CL-th of the tiles into every block's shared memory, so that the
// activations are read from L2 once per CL blocks. A stage is refilled after a cluster barrier says every block
// finished with it.
template <int WGS, int MW, int BT, int STAGES, int CL>
__device__ __forceinline__ void qwg_pq2_gemm(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             const signed char* __restrict__ xh, const unsigned char* __restrict__ xl,
                                             const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
                                             int K, int Kp, int tp, int tt, int b0, int b1,
                                             float* __restrict__ y, int ldy, float beta) {
    using L = QwgTile<WGS, MW, BT, STAGES>;
    static_assert(CL == 0 || 2 * L::XP % (16 * CL) == 0, "whole 16-byte pieces");
    extern __shared__ __align__(16) unsigned char qmma_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int wg = warp >> 2, wq = warp & 3;
    const int m0 = blockIdx.x * BT, n0 = blockIdx.y * L::BW;
    const int nb = max(0, b1 - b0);  // this block's 128-K blocks: b0 .. b1
    const idx_t row_bytes = K / 4, row_scales = K / 128;
    const unsigned base = tc_smem_addr(qmma_smem);

    // Each thread's copies of a stage, their sources a fixed offset per block b: x chunks c = tid + NT i (plane
    // c / (8 BT), token row (c % (8 BT)) / 8, chunk c % 8, stored as a core matrix row), weight chunks c = tid +
    // NT u (row c / 2, half c % 2). Rows past T or N are zero-filled.
    constexpr int ACH = BT * 8, NX = 2 * ACH / L::NT, NWC = (2 * L::BW + L::NT - 1) / L::NT;
    static_assert(2 * ACH % L::NT == 0, "whole rounds of x chunks");
    const unsigned char* xsrc[NX];
    unsigned xdst[NX];
#pragma unroll
    for (int i = 0; i < NX; i++) {
        int c = tid + L::NT * i, plane = c / ACH, r = (c % ACH) >> 3, col = c & 7;
        const unsigned char* p = plane ? (const unsigned char*)xl : (const unsigned char*)xh;
        xsrc[i] = m0 + r < T ? p + (idx_t)(m0 + r) * Kp + col * 16 : nullptr;
        xdst[i] = plane * L::XP + (r >> 3) * 1024 + col * 128 + (r & 7) * 16;
    }
    const unsigned char* wsrc[NWC];
#pragma unroll
    for (int u = 0; u < NWC; u++) {
        int c = tid + L::NT * u, r = c >> 1, half = c & 1;
        wsrc[u] = c < 2 * L::BW && n0 + r < N ? q + (idx_t)(n0 + r) * row_bytes + half * 16 : nullptr;
    }
    const unsigned bars = base + STAGES * L::STAGE;  // the stages' mbarriers (CL >= 1)
    const unsigned rank = CL > 1 ? qwg_cluster_rank() : 0;
    auto load = [&](int st, int b) {
        unsigned s0 = base + st * L::STAGE;
        if (CL == 0) {
#pragma unroll
            for (int i = 0; i < NX; i++)
                tc_cp16(s0 + xdst[i], xsrc[i] ? xsrc[i] + b * 128 : (const unsigned char*)xh, xsrc[i] ? 16 : 0);
        } else if (tid == 0) {
            unsigned bar = bars + 8 * st;
            qwg_bar_expect(bar, 2 * L::XP);
            idx_t at = (idx_t)b * 128 * tt + (idx_t)m0 * 128;
            if (CL == 1) {
                qwg_bulk(s0, xh + at, L::XP, bar);
                qwg_bulk(s0 + L::XP, xl + at, L::XP, bar);
            } else {
                constexpr unsigned P = 2 * L::XP / (CL > 1 ? CL : 1);
                unsigned off = rank * P, plane = off >= (unsigned)L::XP, in = off - plane * L::XP;
                const unsigned char* src = (plane ? (const unsigned char*)xl : (const unsigned char*)xh) + at + in;
                qwg_bulk_mc(s0 + off, src, P, bar, (unsigned short)((1u << CL) - 1));
            }
        }
#pragma unroll
        for (int u = 0; u < NWC; u++)
            if (tid + L::NT * u < 2 * L::BW)
                tc_cp16(s0 + L::A + (tid + L::NT * u) * 16, wsrc[u] ? wsrc[u] + b * 32 : q, wsrc[u] ? 16 : 0);
        if (tid < BT / 2) {
            int which = tid / (BT / 4), r = (tid % (BT / 4)) * 4, have = max(0, min(4, T - (m0 + r)));
            idx_t at = (idx_t)b * tp + m0 + r;
            const void* src = which ? (const void*)(qs + at) : (const void*)(sx + at);
            tc_cp16(s0 + L::A + L::W + which * BT * 4 + r * 4, have ? src : (const void*)sx, 4 * have);
        }
    };

    constexpr int NC = BT / 2;  // int32 sums (and f32 accumulators) per thread and 64-row tile
    float acc[MW][NC];
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
        for (int e = 0; e < NC; e++) acc[m][e] = 0.0f;
    if (CL >= 1) {
        if (tid == 0) {
            for (int st = 0; st < STAGES; st++) qwg_bar_init(bars + 8 * st);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
        // Every block's barriers initialized before any block's multicast reaches them.
        if (CL > 1) {
            qwg_cluster_arrive();
            qwg_cluster_wait();
        }
    }
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nb) load(st, b0 + st);
        tc_commit();
    }
    // The loop's first cluster wait (before the refill of block STAGES - 1) waits for this arrival.
    if (CL > 1) qwg_cluster_arrive();
    // This thread's first weight row within the block (rows r and r + 8 of each 64-row tile m at r + 64 m).
    const int wr = wg * 64 * MW + 16 * wq + g;
#pragma unroll 1
    for (int b = 0; b < nb; b++) {
        const int st = b % STAGES;
        tc_wait<STAGES - 2>();
        if (CL >= 1) qwg_bar_wait(bars + 8 * st, (b / STAGES) & 1);
        // The copies are generic-proxy writes; the tensor cores read the stage through the async proxy.
        if (CL == 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        // The stage refilled now was every block's stage of block b - 1: all of them are done with it.
        if (CL > 1) qwg_cluster_wait();
        if (b + STAGES - 1 < nb) load((b + STAGES - 1) % STAGES, b0 + b + STAGES - 1);
        tc_commit();
        const unsigned char* stg = qmma_smem + st * L::STAGE;
        const float* ssx = (const float*)(stg + L::A + L::W);
        const int* sqs = (const int*)(stg + L::A + L::W + BT * 4);
        const unsigned xb = base + st * L::STAGE;
        float dv[MW][2];
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int n = n0 + wr + 64 * m + 8 * h;
                dv[m][h] = n < N ? h2f(__ldg(d + (idx_t)n * row_scales + b0 + b)) : 0.0f;
            }
        unsigned af[MW][4][4];
#pragma unroll
        for (int m = 0; m < MW; m++) {
            uint2 c0 = *(const uint2*)(stg + L::A + (wr + 64 * m) * 32 + 8 * t4);
            uint2 c1 = *(const uint2*)(stg + L::A + (wr + 64 * m + 8) * 32 + 8 * t4);
#pragma unroll
            for (int s = 0; s < 4; s++) {
                af[m][s][0] = (c0.x >> (2 * s)) & 0x03030303u, af[m][s][1] = (c1.x >> (2 * s)) & 0x03030303u;
                af[m][s][2] = (c0.y >> (2 * s)) & 0x03030303u, af[m][s][3] = (c1.y >> (2 * s)) & 0x03030303u;
            }
        }
        int c[MW][NC];
        // The h plane: c = Σ code h over the block.
        qwg_fence();
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int s = 0; s < 4; s++) qwg_mma<BT, false>(c[m], af[m][s], qwg_desc(xb + 256 * s), s);
        qwg_commit();
        qwg_wait0();
        // c = 256 c - Σ q (tokens 8 j + 2 t4 and + 1 of sums 4 j .. 4 j + 3), then the l plane onto it.
#pragma unroll
        for (int j = 0; j < BT / 8; j++) {
            int2 qv = *(const int2*)(sqs + 8 * j + 2 * t4);
#pragma unroll
            for (int m = 0; m < MW; m++) {
                qwg_pin(c[m][4 * j]);
                qwg_pin(c[m][4 * j + 1]);
                qwg_pin(c[m][4 * j + 2]);
                qwg_pin(c[m][4 * j + 3]);
                c[m][4 * j] = c[m][4 * j] * 256 - qv.x, c[m][4 * j + 1] = c[m][4 * j + 1] * 256 - qv.y;
                c[m][4 * j + 2] = c[m][4 * j + 2] * 256 - qv.x, c[m][4 * j + 3] = c[m][4 * j + 3] * 256 - qv.y;
            }
        }
        qwg_fence();
#pragma unroll
        for (int m = 0; m < MW; m++)
#pragma unroll
            for (int s = 0; s < 4; s++) qwg_mma<BT, true>(c[m], af[m][s], qwg_desc(xb + L::XP + 256 * s), 1);
        qwg_commit();
        qwg_wait0();
#pragma unroll
        for (int j = 0; j < BT / 8; j++) {
            float2 sv = *(const float2*)(ssx + 8 * j + 2 * t4);
#pragma unroll
            for (int m = 0; m < MW; m++) {
#pragma unroll
                for (int e = 0; e < 4; e++) qwg_pin(c[m][4 * j + e]);
                acc[m][4 * j] = fmaf((float)c[m][4 * j], sv.x * dv[m][0], acc[m][4 * j]);
                acc[m][4 * j + 1] = fmaf((float)c[m][4 * j + 1], sv.y * dv[m][0], acc[m][4 * j + 1]);
                acc[m][4 * j + 2] = fmaf((float)c[m][4 * j + 2], sv.x * dv[m][1], acc[m][4 * j + 2]);
                acc[m][4 * j + 3] = fmaf((float)c[m][4 * j + 3], sv.y * dv[m][1], acc[m][4 * j + 3]);
            }
        }
        if (CL > 1) qwg_cluster_arrive();
    }
    tc_wait<0>();
    // No block leaves while a peer may still multicast into it or wait on the barrier above.
    if (CL > 1) qwg_cluster_wait();
    // The tile out: y = acc (+ beta y), tokens below T and rows below N only.
#pragma unroll
    for (int m = 0; m < MW; m++)
#pragma unroll
        for (int e = 0; e < NC; e++) {
            int r = m0 + 8 * (e >> 2) + 2 * t4 + (e & 1), n = n0 + wr + 64 * m + 8 * ((e >> 1) & 1);
            if (r >= T || n >= N) continue;
            float* yo = y + (idx_t)r * ldy + n;
            float v = acc[m][e];
            *yo = beta != 0.0f ? v + beta * *yo : v;
        }
}
// grid (ceil(T / BT), ceil(N / BW) rounded up to CL, S), 128 WGS threads, STAGES · STAGE (+ 8 STAGES where
// CL >= 1) bytes of dynamic shared memory (QwgTile); qgemm.rs's QWG_PQ2 repeats the shapes. With S > 1, K's
// 128-K blocks are cut into S runs of ceil(nb / S) and run z writes its sums alone to part + z T N, which
// qmma_split_sum adds up in z order (as qmma_q8's).
#define QWG_PQ2(name, WGS, MW, BT, STAGES, CL, MINB)                                                               \
    KERNEL(name) void __launch_bounds__(128 * WGS, MINB) __cluster_dims__(1, CL > 1 ? CL : 1, 1)                  \
        name(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,                            \
             const signed char* __restrict__ xh, const unsigned char* __restrict__ xl,                             \
             const float* __restrict__ sx, const int* __restrict__ qs, int T, int N, int K, int Kp, int tp,        \
             int tt, float* __restrict__ y, int ldy, float beta, float* __restrict__ part) {                       \
        const int nb = Kp / 128;                                                                                   \
        if (gridDim.z == 1) {                                                                                      \
            qwg_pq2_gemm<WGS, MW, BT, STAGES, CL>(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, tt, 0, nb, y, ldy, beta); \
            return;                                                                                                \
        }                                                                                                          \
        const int per = (nb + gridDim.z - 1) / gridDim.z, b0 = blockIdx.z * per;                                   \
        qwg_pq2_gemm<WGS, MW, BT, STAGES, CL>(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, tt, b0, min(nb, b0 + per),    \
                                              part + (idx_t)blockIdx.z * T * N, N, 0.0f);                          \
    }
QWG_PQ2(qwg_pq2, 2, 1, 64, 4, 1, 2)

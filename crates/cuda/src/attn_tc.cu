
// ---------------------------------------------------------------------------------------------------------------
// Attention on tensor cores (attn_tc.cu; launcher crates/cuda/src/attn_tc.rs): twins of `attention_tiled` (same
// inputs, same result within the products' rounding), online softmax in f32, in four arithmetics:
// - attention_tc: Q·Kᵀ and P·V as mma.sync m16n8k8 TF32 products in 3xTF32 form (x = big + small, both TF32;
//   acc += big·big + big·small + small·big): f32 accuracy. attention_tc_tf32: the big·big products only.
// - attention_bf: m16n8k16 bf16 products in bf16x3 form (x = hi + lo, both bf16, the three products as above):
//   operands carried to about 2^-17, as the split GEMMs carry theirs. attention_bf1: hi·hi only (bf16 operands).
//   The bf16 kernels convert each tile once in shared memory, in place (an f32 pair's 8 bytes become its hi pair
//   and its lo pair), where the TF32 kernels split every fragment in every warp.
//
// Work item: one block per (tile of query rows of a segment, KV head, split of the tile's keys). The block's 64
// "rows" are (token, query head of the KV group) pairs, row r = token r / G, head kh*G + r % G (G = H / HKV), so
// one K/V tile in shared memory serves every query head that reads it; warp w owns rows 16w..16w+15. Keys come
// ATC_NK at a time (cp.async, K and V in separate groups so each loads under the other's product). A tile whose
// keys are split over several blocks writes per-row partials (max, sum, unnormalised output) to a scratch and
// `attention_tc_combine` merges them; a tile with one split writes the gated output directly.
// ---------------------------------------------------------------------------------------------------------------
#define ATC_M 64          // rows (token, head) per block: 4 warps x 16
#define ATC_NK 16         // keys per shared-memory tile
#define ATC_MIN_CHUNK 32  // fewest keys per split
#define ATC_MAX_SPLITS 16

// Key splits per tile of a segment of `len` rows (> 0): at most `ns`, and at most `target` blocks over the segment's
// tiles and KV heads (batch invariance: from the segment alone; target INT_MAX: `ns` for every segment).
__device__ __forceinline__ int atc_seg_splits(int len, int TQ, int HKV, int ns, int target) {
    int blocks = (len + TQ - 1) / TQ * HKV;
    return min(ns, max(1, target / blocks));
}

// Keys per split and splits used for a tile that sees `nkeys` keys, with at most `ns` splits.
__device__ __forceinline__ void atc_plan(int nkeys, int ns, int& chunk, int& used) {
    int c = (nkeys + ns - 1) / ns;
    c = (c + ATC_NK - 1) / ATC_NK * ATC_NK;
    chunk = max(ATC_MIN_CHUNK, c);
    used = (nkeys + chunk - 1) / chunk;
}

// One block's work item: its tile of a segment, KV head and split, and that split's keys kbeg..kend-1.
struct AtcWork {
    int kh, split, start, t0, nq, pos0, kbeg, kend, used, base;
    const float *ko, *vo, *kb, *vb;  // own K and V caches, the base (shared prefix) caches
};
// Longest tiles first (they see the most keys), both KV heads of a tile together, and the last segments first:
// in a tree (CudaModel::forward_tree) those are the children, whose one tile sees its root's keys as well, so
// started last they would run alone at the end. False: the block has nothing to do.
__device__ __forceinline__ bool atc_work(AtcWork& w, const int* seg, const u64* kv, int HKV, int TQ, int ns,
                                         int target, int nseg) {
    w.kh = (int)blockIdx.x % HKV;
    int bx = (int)blockIdx.x / HKV;
    int s = nseg - 1 - (int)blockIdx.y;
    // The segment's row of `seg` and its KV table entries, loaded together before the exits below: one round trip.
    w.start = seg[3 * s];
    int len = seg[3 * s + 1];
    w.pos0 = seg[3 * s + 2];
    const u64* kvs = kv + KV_ENTRIES * s;
    u64 e[KV_ENTRIES];
#pragma unroll
    for (int i = 0; i < KV_ENTRIES; i++) e[i] = kvs[i];
    // len <= 0, in one test that also reads start, pos0 and the base length (never negative): it keeps their loads
    // with the others (a load nothing reads before an exit was issued after it, another round trip).
    if (min(len - 1, w.start | w.pos0 | (int)e[KV_ENTRIES - 1]) < 0) return false;
    int sns = atc_seg_splits(len, TQ, HKV, ns, target), tiles = (len + TQ - 1) / TQ;
    if (bx >= tiles * sns) return false;
    int tile = tiles - 1 - bx / sns;
    w.split = bx % sns;
    w.t0 = tile * TQ;
    w.nq = min(TQ, len - w.t0);
    int nkeys = w.pos0 + w.t0 + w.nq;  // keys 0..nkeys-1 are seen by some row of the tile
    int chunk;
    atc_plan(nkeys, sns, chunk, w.used);
    if (w.split >= w.used) return false;
    w.kbeg = w.split * chunk;
    w.kend = min(nkeys, w.kbeg + chunk);
    w.ko = (const float*)e[0];
    w.vo = (const float*)e[1];
    w.kb = (const float*)e[2];
    w.vb = (const float*)e[3];
    w.base = (int)e[4];
    return true;
}

// A thread's share of a tile of rows of Dp floats copied 16 bytes at a time by the block's 128 threads, C4N = Dp / 4
// chunks per row (16, 32 or 64, a divisor of 128): chunk i = tid + 128 j is row i / C4N = r + j * STEP, column
// c = 4 (tid % C4N), the same in every row the thread copies. Computed once, so the per-tile copies do no division.
template <int C4N>
struct AtcShare {
    static constexpr int STEP = 128 / C4N;  // rows between a thread's chunks
    int r, c;
    __device__ __forceinline__ explicit AtcShare(int tid) : r(tid / C4N), c((tid % C4N) * 4) {}
};
// Global byte addresses of one KV head's keys, K or V, at a thread's column c: key kp < base from the base (shared
// prefix) cache, else own row kp - base ("own" is where own-cache key 0 would sit if it were key `base`).
struct AtcSrc {
    u64 bas, own;
    unsigned rs;  // bytes per key: HKV * D * 4
};
__device__ __forceinline__ AtcSrc atc_src(const AtcWork& w, bool v, int HKV, int D, int c) {
    AtcSrc s;
    s.rs = (unsigned)(HKV * D) * 4u;
    u64 col = ((u64)w.kh * D + c) * 4u;
    s.bas = (u64)(v ? w.vb : w.kb) + col;
    s.own = (u64)(v ? w.vo : w.ko) + col - (u64)w.base * s.rs;
    return s;
}
// The Q tile (unscaled; the scale goes on the scores) into Qs [ATC_M, ldq]; rows past the tile and columns >= D
// are zeros.
template <int C4N>
__device__ __forceinline__ void atc_load_q(float* Qs, const float* q, const AtcWork& w, int H, int G, int D, int ldq,
                                           AtcShare<C4N> sh) {
    unsigned s0 = tc_smem_addr(Qs) + (unsigned)(sh.r * ldq + sh.c) * 4u;
#pragma unroll 4
    for (int j = 0; j < ATC_M / sh.STEP; j++) {
        int r = sh.r + j * sh.STEP, t = r / G, hg = r - t * G;
        bool ok = t < w.nq && sh.c < D;
        const float* src = q;
        if (ok) src = q + ((idx_t)(w.start + w.t0 + t) * H + w.kh * G + hg) * D + sh.c;
        tc_cp16(s0 + (unsigned)(j * sh.STEP * ldq) * 4u, src, ok ? 16 : 0);
    }
}
// Keys k0..k0+ATC_NK-1 (K or V as `src` says) into dst [ATC_NK, ld]; keys >= kend and columns >= D are zeros.
// PAIRS: the thread copies rows 2r', 2r' + 1 for its share's rows r' (for atc_bf_vcols, which pairs them).
template <int C4N, bool PAIRS>
__device__ __forceinline__ void atc_load_keys(float* dst, const AtcSrc& src, const AtcWork& w, int k0, int D, int ld,
                                              AtcShare<C4N> sh) {
    unsigned s0 = tc_smem_addr(dst) + (unsigned)sh.c * 4u;
    bool col = sh.c < D;
#pragma unroll
    for (int j = 0; j < (PAIRS ? ATC_NK / 2 : ATC_NK) / sh.STEP; j++)
#pragma unroll
        for (int e = 0; e < (PAIRS ? 2 : 1); e++) {
            int r = PAIRS ? 2 * (sh.r + j * sh.STEP) + e : sh.r + j * sh.STEP, kp = k0 + r;
            bool ok = col && kp < w.kend;
            u64 at = (kp < w.base ? src.bas : src.own) + (u64)(unsigned)kp * src.rs;
            tc_cp16(s0 + (unsigned)(r * ld) * 4u, (const void*)(ok ? at : src.bas), ok ? 16 : 0);
        }
}

// A row's running max and sum, and the causal mask, scale and online softmax of one key tile's scores:
// sc[j][e] (NJ tiles of 8 keys) is (row e < 2 ? r0 : r1, key k0 + 8j + 2tg + (e & 1)) and becomes its unnormalised
// probability. Scores are kept in base-2 units (scale2 = scale · log2 e, so exp2 replaces exp; m too, as the partials
// store it). The output accumulators are rescaled to the new max only when some row of the warp has a new max (a
// factor of exactly 1 elsewhere: skipping it changes nothing).
template <int NT, int NJ = ATC_NK / 8>
__device__ __forceinline__ void atc_softmax(float (&sc)[NJ][4], float (&o)[NT][4], int k0, int kend, int p0,
                                            int p1, float scale2, int tg, float& m0, float& m1, float& l0,
                                            float& l1) {
    const float NEG = __int_as_float(0xff800000);  // -inf
    float mx0 = NEG, mx1 = NEG;
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * tg + (e & 1);
            int p = e < 2 ? p0 : p1;
            float x = key <= p && key < kend ? sc[j][e] * scale2 : NEG;
            sc[j][e] = x;
            if (e < 2) mx0 = fmaxf(mx0, x);
            else mx1 = fmaxf(mx1, x);
        }
    // A row lives in the 4 lanes of a quad.
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row that has seen no key yet keeps max -inf: use 0 so that exp2 gives 0, not NaN.
    float mu0 = mn0 == NEG ? 0.0f : mn0, mu1 = mn1 == NEG ? 0.0f : mn1;
    float cr0 = exp2f(m0 - mu0), cr1 = exp2f(m1 - mu1);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        sc[j][0] = exp2f(sc[j][0] - mu0);
        sc[j][1] = exp2f(sc[j][1] - mu0);
        sc[j][2] = exp2f(sc[j][2] - mu1);
        sc[j][3] = exp2f(sc[j][3] - mu1);
        s0 += sc[j][0] + sc[j][1];
        s1 += sc[j][2] + sc[j][3];
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    l0 = l0 * cr0 + s0;
    l1 = l1 * cr1 + s1;
    // A row whose old max was -inf has seen no key: its outputs are zeros, any factor leaves them so.
    bool moved = (cr0 != 1.0f && m0 != NEG) || (cr1 != 1.0f && m1 != NEG);
    m0 = mn0;
    m1 = mn1;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] *= cr0;
            o[nt][1] *= cr0;
            o[nt][2] *= cr1;
            o[nt][3] *= cr1;
        }
    }
}

// The block's result: o[nt][e] is (row e < 2 ? r0 : r1, column 8nt + 2tg + (e & 1)). With one split, the gated,
// normalised output; else the partial row ((split, token row), head): output [.., D], and (max in base-2 units,
// sum) after all outputs. D % 4 == 0, so c < D means c + 1 < D.
// The gated store reads the gate (one value per output) in groups of ATC_GATE column tiles, every load of a group
// issued before any is used: element by element, each load waited for the sigmoid's division (its slow path a
// call) of the one before, so a one-split block spent one L2 round trip per output value of its lane (128 at
// D = 256; likely the fixed cost of short attention, read from the disassembly, not profiled). The products are
// the same, in the same order.
#define ATC_GATE 8
template <int NT>
__device__ __forceinline__ void atc_store(const float (&o)[NT][4], const AtcWork& w, int r0, int p0, int p1,
                                          float m0, float m1, float l0, float l1, const float* __restrict__ proj,
                                          int ld, int H, int G, int D, void* out, int mode, int ns, int nrows,
                                          float* __restrict__ scratch, int tg) {
    if (w.used == 1) {
        const float* gate[2];
        idx_t ob[2];
        float inv[2];
        bool ok[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int r = r0 + 8 * half, t = r / G, h = w.kh * G + (r - t * G);
            idx_t n = w.start + w.t0 + t;
            ok[half] = (half ? p1 : p0) >= 0;
            gate[half] = proj + n * ld + h * 2 * D + D;
            ob[half] = n * H * D + h * D;
            inv[half] = ok[half] ? 1.0f / (half ? l1 : l0) : 0.0f;
        }
        constexpr int GN = NT < ATC_GATE ? NT : ATC_GATE;
#pragma unroll
        for (int n0 = 0; n0 < NT; n0 += GN) {
            float gv[2][GN][2];
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int j = 0; j < GN; j++) {
                    int c = (n0 + j) * 8 + 2 * tg;
                    bool in = ok[half] && c < D;
                    gv[half][j][0] = in ? gate[half][c] : 0.0f;
                    gv[half][j][1] = in ? gate[half][c + 1] : 0.0f;
                }
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int j = 0; j < GN; j++) {
                    int c = (n0 + j) * 8 + 2 * tg;
                    if (ok[half] && c < D) {
                        store_act(out, ob[half] + c, o[n0 + j][2 * half] * inv[half] * sigmoid_f(gv[half][j][0]),
                                  mode);
                        store_act(out, ob[half] + c + 1,
                                  o[n0 + j][2 * half + 1] * inv[half] * sigmoid_f(gv[half][j][1]), mode);
                    }
                }
        }
        return;
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int r = r0 + 8 * half;
        if ((half ? p1 : p0) < 0) continue;
        float m = half ? m1 : m0, l = half ? l1 : l0;
        int t = r / G, h = w.kh * G + (r - t * G);
        idx_t n = w.start + w.t0 + t;
        idx_t pr = ((idx_t)w.split * nrows + n) * H + h;
        float* po = scratch + pr * D;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int c = nt * 8 + 2 * tg;
            if (c < D) *(float2*)(po + c) = make_float2(o[nt][2 * half], o[nt][2 * half + 1]);  // D, c even
        }
        if (tg == 0) {
            float* ml = scratch + (idx_t)ns * nrows * H * D + pr * 2;
            ml[0] = m;
            ml[1] = l;
        }
    }
}

// The kernels' shared prologue: this thread's rows r0 = 16 warp + g and r1 = r0 + 8, their positions (-1: not
// a row of the tile, sees nothing), whether the warp has rows, and the last key any row of the warp sees.
struct AtcRows {
    int r0, p0, p1, pw;
    bool wrows;
};
__device__ __forceinline__ AtcRows atc_rows(const AtcWork& w, int G, int warp, int g) {
    AtcRows r;
    r.r0 = warp * 16 + g;
    int r1 = r.r0 + 8;
    r.p0 = r.r0 / G < w.nq ? w.pos0 + w.t0 + r.r0 / G : -1;
    r.p1 = r1 / G < w.nq ? w.pos0 + w.t0 + r1 / G : -1;
    r.wrows = (warp * 16) / G < w.nq;
    r.pw = w.pos0 + w.t0 + min((warp * 16 + 15) / G, w.nq - 1);
    return r;
}

// ---- TF32 products --------------------------------------------------------------------------------------------

// S[16 x ATC_NK] = Q[16 x Dp] · K[ATC_NK x Dp]ᵀ of this warp's rows r0, r0 + 8, 8 head-dim columns per step, in
// 3xTF32 (X3) or 1xTF32; four independent accumulators per key tile (big·big and the cross terms, even and odd
// steps) keep the mma chains short. sc[j][e] is (row e < 2 ? r0 : r0 + 8, key 8j + 2tg + (e & 1)).
template <int NT, bool X3>
__device__ __forceinline__ void atc_qk_tf32(float (&sc)[ATC_NK / 8][4], const float* Qs, const float* Ks, int r0,
                                            int ldq, int g, int tg) {
    float sa[2][ATC_NK / 8][4], sx[2][ATC_NK / 8][4];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int j = 0; j < ATC_NK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sa[u][j][e] = sx[u][j][e] = 0.0f;
#pragma unroll 4
    for (int kk = 0; kk < NT; kk += 2) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            // The k step's 8 head-dim columns in permuted order, the same for Q and K (a dot product does not
            // care): logical k t <-> column 2t, t+4 <-> 2t+1, so each lane's two values of a row are adjacent (one
            // 64-bit load). Measured on an H200: 3,400 tokens 1,333 -> 1,290 µs, the short shapes unchanged.
            const float2 qlo = *(const float2*)(Qs + r0 * ldq + (kk + u) * 8 + 2 * tg);
            const float2 qhi = *(const float2*)(Qs + (r0 + 8) * ldq + (kk + u) * 8 + 2 * tg);
            unsigned ab[4], as[4];
            tc_split(qlo.x, ab[0], as[0]);
            tc_split(qhi.x, ab[1], as[1]);
            tc_split(qlo.y, ab[2], as[2]);
            tc_split(qhi.y, ab[3], as[3]);
#pragma unroll
            for (int j = 0; j < ATC_NK / 8; j++) {
                const float2 kv2 = *(const float2*)(Ks + (j * 8 + g) * ldq + (kk + u) * 8 + 2 * tg);
                unsigned bb0, bs0, bb1, bs1;
                tc_split(kv2.x, bb0, bs0);
                tc_split(kv2.y, bb1, bs1);
                if (X3) {
                    tc_mma(sx[u][j], as, bb0, bb1);
                    tc_mma(sx[u][j], ab, bs0, bs1);
                }
                tc_mma(sa[u][j], ab, bb0, bb1);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < ATC_NK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[j][e] = (sx[0][j][e] + sx[1][j][e]) + (sa[0][j][e] + sa[1][j][e]);
}
// O[16 x Dp] += P[16 x ATC_NK] · V[ATC_NK x Dp]. The score fragment is the A operand with its 8 keys permuted: A
// column t ↔ key 2t, column t+4 ↔ key 2t+1 (so a = c0, c2, c1, c3), and B reads V rows in the same order.
template <int NT, bool X3>
__device__ __forceinline__ void atc_pv_tf32(float (&o)[NT][4], const float (&sc)[ATC_NK / 8][4], const float* Vs,
                                            int lds, int g, int tg) {
#pragma unroll
    for (int j = 0; j < ATC_NK / 8; j++) {
        unsigned pb[4], ps[4];
        tc_split(sc[j][0], pb[0], ps[0]);
        tc_split(sc[j][2], pb[1], ps[1]);
        tc_split(sc[j][1], pb[2], ps[2]);
        tc_split(sc[j][3], pb[3], ps[3]);
        const float* vr = Vs + (j * 8 + 2 * tg) * lds + g;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            unsigned bb0, bs0, bb1, bs1;
            tc_split(vr[nt * 8], bb0, bs0);
            tc_split(vr[lds + nt * 8], bb1, bs1);
            tc_mma3<X3>(o[nt], pb, ps, bb0, bb1, bs0, bs1);
        }
    }
}

// ---- bf16 products -------------------------------------------------------------------------------------------

// Two f32 values as bf16 pairs: hi = (bf16(x), bf16(y)) rounded to nearest even, and with X3 lo = (bf16(x - hi.x),
// bf16(y - hi.y)) (else 0, unused); x in the low half (the lower k index of an mma fragment register).
template <bool X3>
__device__ __forceinline__ uint2 atc_bf_split(float x, float y) {
    unsigned hi, lo = 0;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(y), "f"(x));
    if (X3) {
        float hx = __uint_as_float(hi << 16), hy = __uint_as_float(hi & 0xffff0000u);
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(y - hy), "f"(x - hx));
    }
    return make_uint2(hi, lo);
}
// In place, the Q (ROWS = ATC_M) or K (ATC_NK) chunks this thread copied (atc_load_q, atc_load_keys): each f32
// pair (columns c, c+1) becomes its hi pair then its lo pair in the same 8 bytes, so one 64-bit load reads both.
template <int C4N, int ROWS, bool X3>
__device__ __forceinline__ void atc_bf_tile(float* dst, int ld, AtcShare<C4N> sh) {
#pragma unroll 4
    for (int j = 0; j < ROWS / sh.STEP; j++) {
        float* p = dst + (sh.r + j * sh.STEP) * ld + sh.c;
        float4 v = *(const float4*)p;
        uint2 a = atc_bf_split<X3>(v.x, v.y), b = atc_bf_split<X3>(v.z, v.w);
        *(uint4*)p = make_uint4(a.x, a.y, b.x, b.y);
    }
}
// In place, the V rows this thread copied (atc_load_keys with PAIRS): keys 2r', 2r'+1 at columns c..c+3 become,
// for each column n, the key pair's (hi pair, lo pair) at row 2r' + (n & 1), columns (n & ~1, (n & ~1) + 1): the
// B operand register of P·V (keys 2t, 2t+1 of column n) is one 64-bit load.
template <int C4N, bool X3>
__device__ __forceinline__ void atc_bf_vcols(float* dst, int ld, AtcShare<C4N> sh) {
#pragma unroll
    for (int j = 0; j < (ATC_NK / 2) / sh.STEP; j++) {
        float* a = dst + 2 * (sh.r + j * sh.STEP) * ld + sh.c;
        float* b = a + ld;
        float4 x = *(const float4*)a, y = *(const float4*)b;
        uint2 c0 = atc_bf_split<X3>(x.x, y.x), c1 = atc_bf_split<X3>(x.y, y.y);
        uint2 c2 = atc_bf_split<X3>(x.z, y.z), c3 = atc_bf_split<X3>(x.w, y.w);
        *(uint4*)a = make_uint4(c0.x, c0.y, c2.x, c2.y);
        *(uint4*)b = make_uint4(c1.x, c1.y, c3.x, c3.y);
    }
}

// S[16 x 16] = Q[16 x Dp] · K[16 x Dp]ᵀ from the converted tiles, 16 head-dim columns per step, bf16x3 (X3) or one
// bf16 product; per 8-key half j the hi·hi and the cross products in separate accumulators, even and odd steps
// apart (short mma chains). Q and K are read as 64-bit (hi, lo) words at (row, 16s + 2tg [+ 8]).
template <int NT, bool X3>
__device__ __forceinline__ void atc_qk_bf(float (&sc)[ATC_NK / 8][4], const float* Qs, const float* Ks, int r0,
                                          int ldq, int g, int tg) {
    const float* qa = Qs + r0 * ldq + 2 * tg;
    const float* kb = Ks + g * ldq + 2 * tg;
    float sa[2][2][4], sx[2][2][4];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sa[u][j][e] = sx[u][j][e] = 0.0f;
#pragma unroll 2
    for (int ks = 0; ks < NT / 2; ks += 2) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const float* qs = qa + (ks + u) * 16;
            uint2 a0 = *(const uint2*)qs, a1 = *(const uint2*)(qs + 8 * ldq);
            uint2 a2 = *(const uint2*)(qs + 8), a3 = *(const uint2*)(qs + 8 * ldq + 8);
            unsigned ah[4] = {a0.x, a1.x, a2.x, a3.x}, al[4] = {a0.y, a1.y, a2.y, a3.y};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float* kj = kb + j * 8 * ldq + (ks + u) * 16;
                uint2 b0 = *(const uint2*)kj, b1 = *(const uint2*)(kj + 8);
                if (X3) {
                    tc_mma_bf16(sx[u][j], al, b0.x, b1.x);
                    tc_mma_bf16(sx[u][j], ah, b0.y, b1.y);
                }
                tc_mma_bf16(sa[u][j], ah, b0.x, b1.x);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[j][e] = (sx[0][j][e] + sx[1][j][e]) + (sa[0][j][e] + sa[1][j][e]);
}
// O[16 x Dp] += P[16 x 16] · V[16 x Dp]: the score fragments of the two 8-key halves are the A operand as they stand
// (c0 c1 of half j = row g, keys 8j + 2tg, +1; c2 c3 the same for row g + 8); V read at (key pair row
// 2tg + (g & 1), column 8nt + (g & ~1)).
template <int NT, bool X3>
__device__ __forceinline__ void atc_pv_bf(float (&o)[NT][4], const float (&sc)[ATC_NK / 8][4], const float* Vs,
                                          int lds, int g, int tg) {
    const float* vb = Vs + (2 * tg + (g & 1)) * lds + (g & ~1);
    uint2 p0 = atc_bf_split<X3>(sc[0][0], sc[0][1]), p1 = atc_bf_split<X3>(sc[0][2], sc[0][3]);
    uint2 p2 = atc_bf_split<X3>(sc[1][0], sc[1][1]), p3 = atc_bf_split<X3>(sc[1][2], sc[1][3]);
    unsigned ph[4] = {p0.x, p1.x, p2.x, p3.x}, pl[4] = {p0.y, p1.y, p2.y, p3.y};
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        uint2 b0 = *(const uint2*)(vb + nt * 8), b1 = *(const uint2*)(vb + 8 * lds + nt * 8);
        if (X3) {
            tc_mma_bf16(o[nt], pl, b0.x, b1.x);
            tc_mma_bf16(o[nt], ph, b0.y, b1.y);
        }
        tc_mma_bf16(o[nt], ph, b0.x, b1.x);
    }
}

// ---- the kernel ----------------------------------------------------------------------------------------------

// NT: 8-column tiles of the padded head dim Dp = 8 NT >= D (columns D..Dp-1 are zeros); KIND: AttnArith's order,
// 0 3xTF32, 1 1xTF32, 2 bf16x3, 3 one bf16 product. The bf16 kinds convert each tile in place after it lands (V
// copied by key pairs for that) and read 64-bit (hi, lo) words; the TF32 kinds split every fragment as they read it.
template <int NT, int KIND>
__device__ __forceinline__ void attention_tc_t(const float* __restrict__ q, const float* __restrict__ proj, int ld,
                                               const int* seg, const u64* kv, int H, int HKV, int D, float scale,
                                               void* out, int mode, int ns, int target, int nrows, int nseg,
                                               float* __restrict__ scratch, float* sm) {
    constexpr bool BF = KIND >= 2, X3 = KIND == 0 || KIND == 2;
    const int G = H / HKV;
    // Row pitches: Q and K are read as 64-bit pairs (pitch = 8 mod 32: the 16 lanes of a half warp hit 32 distinct
    // banks); V down its columns as single floats (TF32) or 64-bit key-pair words (bf16) (pitch = 4 mod 32). Must
    // match smem() in attn_tc.rs.
    const int Dp = NT * 8, ldq = Dp + 8, lds = Dp + 4;
    float* Qs = sm;                 // [ATC_M, ldq]
    float* Ks = Qs + ATC_M * ldq;   // [ATC_NK, ldq]
    float* Vs = Ks + ATC_NK * ldq;  // [ATC_NK, lds]
    AtcWork w;
    if (!atc_work(w, seg, kv, HKV, ATC_M / G, ns, target, nseg)) return;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const float scale2 = scale * 1.4426950408889634f;  // log2 e
    const AtcShare<NT * 2> sh(tid);
    const AtcSrc ksrc = atc_src(w, false, HKV, D, sh.c), vsrc = atc_src(w, true, HKV, D, sh.c);

    // Q tile, then the first K and V tiles.
    atc_load_q(Qs, q, w, H, G, D, ldq, sh);
    atc_load_keys<NT * 2, false>(Ks, ksrc, w, w.kbeg, D, ldq, sh);
    tc_commit();
    atc_load_keys<NT * 2, BF>(Vs, vsrc, w, w.kbeg, D, lds, sh);
    tc_commit();

    const AtcRows rw = atc_rows(w, G, warp, g);
    const int r0 = rw.r0;
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = __int_as_float(0xff800000), m1 = m0, l0 = 0.0f, l1 = 0.0f;

    for (int k0 = w.kbeg; k0 < w.kend; k0 += ATC_NK) {
        bool next = k0 + ATC_NK < w.kend;
        bool act = rw.wrows && k0 <= rw.pw;  // warp-uniform
        tc_wait<1>();                        // Q and K(k0) have landed (V(k0) may be in flight)
        if (BF) {
            if (k0 == w.kbeg) atc_bf_tile<NT * 2, ATC_M, X3>(Qs, ldq, sh);
            atc_bf_tile<NT * 2, ATC_NK, X3>(Ks, ldq, sh);
        }
        __syncthreads();
        float sc[ATC_NK / 8][4];
        if (act) {
            if (BF) atc_qk_bf<NT, X3>(sc, Qs, Ks, r0, ldq, g, tg);
            else atc_qk_tf32<NT, X3>(sc, Qs, Ks, r0, ldq, g, tg);
        }
        __syncthreads();  // every warp is done with Ks
        if (next) atc_load_keys<NT * 2, false>(Ks, ksrc, w, k0 + ATC_NK, D, ldq, sh);
        tc_commit();
        if (act) atc_softmax<NT>(sc, o, k0, w.kend, rw.p0, rw.p1, scale2, tg, m0, m1, l0, l1);
        tc_wait<1>();  // V(k0) has landed (K(k0 + ATC_NK) may be in flight)
        if (BF) atc_bf_vcols<NT * 2, X3>(Vs, lds, sh);
        __syncthreads();
        if (act) {
            if (BF) atc_pv_bf<NT, X3>(o, sc, Vs, lds, g, tg);
            else atc_pv_tf32<NT, X3>(o, sc, Vs, lds, g, tg);
        }
        __syncthreads();  // every warp is done with Vs
        if (next) atc_load_keys<NT * 2, BF>(Vs, vsrc, w, k0 + ATC_NK, D, lds, sh);
        tc_commit();
    }
    atc_store<NT>(o, w, r0, rw.p0, rw.p1, m0, m1, l0, l1, proj, ld, H, G, D, out, mode, ns, nrows, scratch, tg);
}

// q: [N, H, D]; proj: [N, ld] (gate of head h at h*2D + D); seg: [S, 3]; kv: [S, KV_ENTRIES]; out: [N, H*D] as
// `store_act` with `mode`. ns: most key splits per tile; target: most blocks of a segment's tiles and splits (a
// segment's splits follow from its own length: atc_seg_splits; INT_MAX: ns for every segment); scratch: [ns, nrows,
// H] x (D + 2) floats when ns > 1 (nrows: the token rows N). grid (x, nseg) with x at least HKV times the most (tiles
// x splits) of any segment (attention_tc in attn_tc.rs), block 128, dynamic shared memory
// (ATC_M + ATC_NK) * (Dp + 8) + ATC_NK * (Dp + 4) floats, Dp = 64, 128 or 256 (the least >= D); D % 4 == 0,
// D <= 256, G = H / HKV <= 64.
// attention_tc: 3xTF32 products; attention_tc_tf32: 1xTF32; attention_bf: bf16x3; attention_bf1: one bf16.
#define ATTENTION_TC(NAME, KIND)                                                                                     \
    KERNEL(NAME) void __launch_bounds__(128, 2)                                                                      \
        NAME(const float* __restrict__ q, const float* __restrict__ proj, int ld, const int* seg, const u64* kv,     \
             int H, int HKV, int D, float scale, void* out, int mode, int ns, int target, int nrows, int nseg,       \
             float* __restrict__ scratch) {                                                                          \
        extern __shared__ float atc_sm[];                                                                            \
        if (D <= 64)                                                                                                 \
            attention_tc_t<8, KIND>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg,     \
                                    scratch, atc_sm);                                                                \
        else if (D <= 128)                                                                                           \
            attention_tc_t<16, KIND>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg,    \
                                     scratch, atc_sm);                                                               \
        else                                                                                                         \
            attention_tc_t<32, KIND>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg,    \
                                     scratch, atc_sm);                                                               \
    }
ATTENTION_TC(attention_tc, 0)
ATTENTION_TC(attention_tc_tf32, 1)
ATTENTION_TC(attention_bf, 2)
ATTENTION_TC(attention_bf1, 3)
#undef ATTENTION_TC

// ---- f16 K/V cache: attention_h ----------------------------------------------------------------------------------
// The KV cache in f16 (attn_prep_h writes it; the model keeps it so where the bounds of q, k and v fit f16's range:
// CudaModel's KV form), one f16 product per step (mma m16n8k16, f32 accumulation: operands rounded to 2^-11, as
// 1xTF32 rounds them). The block's work item, rows, online softmax, partials and store are attention_tc_t's; what
// differs is how the operands get to the tensor cores:
// - K and V tiles are copied from the cache by cp.async as they are (no conversion: half the bytes of an f32 cache
//   and none of the per-fragment TF32 rounding), ATH_NK = 32 keys a tile, double-buffered, so each tile costs one
//   barrier (its copy waited for, then the next tile's copy issued into the buffer the last tile used).
// - The Q tile is converted to f16 once per block, under the first tile's copy.
// - Every fragment is read by ldmatrix (Q, K) or ldmatrix.trans (V) from rows padded to a pitch of 4 mod 32 words,
//   conflict-free; the score fragments become P·V's A operand in registers.
#define ATH_NK 32

// Keys k0..k0+ATH_NK-1 of one f16 cache (K or V) into dst [ATH_NK][LDH] (byte address): this thread's 16-byte
// column c8 of rows r0, r0 + 128 / NT, ...; keys >= kend and columns >= D are zeros. bas / own: the addresses of the
// thread's column in the base cache and (offset back by the base length) its own; rs: bytes per key.
template <int NT, int LDH>
__device__ __forceinline__ void ath_load_keys(unsigned dst, u64 bas, u64 own, unsigned rs, const AtcWork& w, int k0,
                                              int r0, bool col) {
    constexpr int STEP = 128 / NT;  // NT 16-byte chunks per padded row
#pragma unroll
    for (int j = 0; j < ATH_NK / STEP; j++) {
        const int kp = k0 + r0 + j * STEP;
        const bool ok = col && kp < w.kend;
        const u64 at = (kp < w.base ? bas : own) + (u64)(unsigned)kp * rs;
        tc_cp16(dst + (unsigned)(j * STEP * LDH) * 2u, (const void*)(ok ? at : bas), ok ? 16 : 0);
    }
}

// The Q tile (f32, [N, H, D]) into Qh [ATC_M][LDH] as f16: the same thread columns as ath_load_keys, rows past the
// tile and columns >= D zeros. Up to eight rows' loads in flight at a time (two round trips at Dp = 256, where four
// rows at a time took four).
template <int NT, int LDH>
__device__ __forceinline__ void ath_load_q(unsigned short* Qh, const float* q, const AtcWork& w, int H, int G, int D,
                                           int r0, int c8) {
    constexpr int STEP = 128 / NT, QB = ATC_M / STEP < 8 ? ATC_M / STEP : 8;
#pragma unroll 1
    for (int j0 = 0; j0 < ATC_M / STEP; j0 += QB) {
        float4 v[QB][2];
#pragma unroll
        for (int j = 0; j < QB; j++) {
            const int r = r0 + (j0 + j) * STEP, t = r / G, hg = r - t * G;
            v[j][0] = v[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < w.nq && c8 < D) {
                const float* src = q + ((idx_t)(w.start + w.t0 + t) * H + w.kh * G + hg) * D + c8;
                v[j][0] = *(const float4*)src;
                v[j][1] = *(const float4*)(src + 4);
            }
        }
#pragma unroll
        for (int j = 0; j < QB; j++) {
            const int r = r0 + (j0 + j) * STEP;
            *(uint4*)(Qh + r * LDH + c8) = make_uint4(tc_f16x2(v[j][0].x, v[j][0].y), tc_f16x2(v[j][0].z, v[j][0].w),
                                                      tc_f16x2(v[j][1].x, v[j][1].y), tc_f16x2(v[j][1].z, v[j][1].w));
        }
    }
}

// S[16 x 32] = Q[16 x Dp] · K[32 x Dp]ᵀ of this warp's rows: qa, ka this lane's ldmatrix addresses (bytes) at head-dim
// column 0 (Q: row 16 warp + (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4); K: key (l & 7) + 8 (l >> 4), column
// 8 ((l >> 3) & 1), so registers 0, 1 are the B operand of keys 0-7 and 2, 3 of keys 8-15). Even and odd k steps in
// separate accumulators (eight independent mma chains). sc[j][e] is (row e < 2 ? g : g + 8, key 8j + 2tg + (e & 1)).
template <int NT, int LDH>
__device__ __forceinline__ void ath_qk(float (&sc)[ATH_NK / 8][4], unsigned qa, unsigned ka) {
    float s[2][ATH_NK / 8][4];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
        for (int j = 0; j < ATH_NK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[u][j][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++) {
        unsigned a[4], b[ATH_NK / 16][4];
        tc_ldsm4<false>(qa + ks * 32u, a);
#pragma unroll
        for (int h = 0; h < ATH_NK / 16; h++) tc_ldsm4<false>(ka + (unsigned)(h * 16 * LDH) * 2u + ks * 32u, b[h]);
#pragma unroll
        for (int h = 0; h < ATH_NK / 16; h++) {
            tc_mma_f16(s[ks & 1][2 * h], a, b[h][0], b[h][1]);
            tc_mma_f16(s[ks & 1][2 * h + 1], a, b[h][2], b[h][3]);
        }
    }
#pragma unroll
    for (int j = 0; j < ATH_NK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[j][e] = s[0][j][e] + s[1][j][e];
}

// O[16 x Dp] += P[16 x 32] · V[32 x Dp]: P's A fragments straight from the score fragments (keys 16kk + 2tg, +1 in
// tile 2kk, + 8 in tile 2kk + 1), rounded to f16; V by ldmatrix.trans, va this lane's address at key 0, column 0
// (key (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4): registers 0, 1 the B operand of columns 0-7, 2, 3 of 8-15).
template <int NT, int LDH>
__device__ __forceinline__ void ath_pv(float (&o)[NT][4], const float (&sc)[ATH_NK / 8][4], unsigned va) {
#pragma unroll
    for (int kk = 0; kk < ATH_NK / 16; kk++) {
        const unsigned a[4] = {tc_f16x2(sc[2 * kk][0], sc[2 * kk][1]), tc_f16x2(sc[2 * kk][2], sc[2 * kk][3]),
                               tc_f16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               tc_f16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
        const unsigned vk = va + (unsigned)(kk * 16 * LDH) * 2u;
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            unsigned b[4];
            tc_ldsm4<true>(vk + nt * 16u, b);
            tc_mma_f16(o[nt], a, b[0], b[1]);
            tc_mma_f16(o[nt + 1], a, b[2], b[3]);
        }
    }
}

// NT: 8-column tiles of the padded head dim Dp = 8 NT (columns D..Dp-1 zeros; D % 8 == 0).
template <int NT>
__device__ __forceinline__ void attention_h_t(const float* __restrict__ q, const float* __restrict__ proj, int ld,
                                              const int* seg, const u64* kv, int H, int HKV, int D, float scale,
                                              void* out, int mode, int ns, int target, int nrows, int nseg,
                                              float* __restrict__ scratch, unsigned short* sm) {
    constexpr int LDH = NT * 8 + 8;         // row pitch in halves: 4 mod 32 words
    constexpr unsigned TILE = ATH_NK * LDH * 2;  // bytes of one K or V buffer
    const int G = H / HKV;
    unsigned short* Qh = sm;  // [ATC_M][LDH], then K [2][ATH_NK][LDH], V [2][ATH_NK][LDH]
    const unsigned qs = tc_smem_addr(Qh), ks = qs + ATC_M * LDH * 2, vs = ks + 2 * TILE;
    AtcWork w;
    if (!atc_work(w, seg, kv, HKV, ATC_M / G, ns, target, nseg)) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const float scale2 = scale * 1.4426950408889634f;  // log2 e
    // This thread's share of every copy: 16-byte column c8 of rows r0, r0 + 128 / NT, ...
    const int r0 = tid / NT, c8 = (tid % NT) * 8;
    const bool col = c8 < D;
    const unsigned rs = (unsigned)(HKV * D) * 2u;
    const u64 cb = ((u64)w.kh * D + c8) * 2u, ob = (u64)w.base * rs;
    const u64 kbas = (u64)w.kb + cb, kown = (u64)w.ko + cb - ob, vbas = (u64)w.vb + cb, vown = (u64)w.vo + cb - ob;
    const unsigned cdst = (unsigned)(r0 * LDH + c8) * 2u;
    ath_load_keys<NT, LDH>(ks + cdst, kbas, kown, rs, w, w.kbeg, r0, col);
    ath_load_keys<NT, LDH>(vs + cdst, vbas, vown, rs, w, w.kbeg, r0, col);
    tc_commit();
    ath_load_q<NT, LDH>(Qh, q, w, H, G, D, r0, c8);

    const AtcRows rw = atc_rows(w, G, warp, g);
    const unsigned qa = qs + (unsigned)((warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + (lane >> 4) * 8) * 2u;
    const unsigned ka = ks + (unsigned)(((lane & 7) + (lane >> 4) * 8) * LDH + ((lane >> 3) & 1) * 8) * 2u;
    const unsigned va = vs + (unsigned)(((lane & 7) + ((lane >> 3) & 1) * 8) * LDH + (lane >> 4) * 8) * 2u;
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = __int_as_float(0xff800000), m1 = m0, l0 = 0.0f, l1 = 0.0f;
    unsigned buf = 0;
    for (int k0 = w.kbeg; k0 < w.kend; k0 += ATH_NK, buf ^= TILE) {
        tc_wait<0>();     // this tile's K and V
        __syncthreads();  // ... visible to every warp, and every warp done with the other buffer (and Q stored)
        if (k0 + ATH_NK < w.kend) {
            ath_load_keys<NT, LDH>(ks + (buf ^ TILE) + cdst, kbas, kown, rs, w, k0 + ATH_NK, r0, col);
            ath_load_keys<NT, LDH>(vs + (buf ^ TILE) + cdst, vbas, vown, rs, w, k0 + ATH_NK, r0, col);
        }
        tc_commit();
        if (rw.wrows && k0 <= rw.pw) {  // warp-uniform
            float sc[ATH_NK / 8][4];
            ath_qk<NT, LDH>(sc, qa, ka + buf);
            atc_softmax<NT, ATH_NK / 8>(sc, o, k0, w.kend, rw.p0, rw.p1, scale2, tg, m0, m1, l0, l1);
            ath_pv<NT, LDH>(o, sc, va + buf);
        }
    }
    atc_store<NT>(o, w, rw.r0, rw.p0, rw.p1, m0, m1, l0, l1, proj, ld, H, G, D, out, mode, ns, nrows, scratch, tg);
}

// As attention_tc (arguments, grid, block, partials), over f16 K/V caches; D % 8 == 0, D <= 256; dynamic shared memory
// (ATC_M + 4 ATH_NK) * (Dp + 8) halves, Dp = 64, 128 or 256 (the least >= D; `smem` with AttnArith::F16 in
// attn_tc.rs).
KERNEL(attention_h) void __launch_bounds__(128, 2)
    attention_h(const float* __restrict__ q, const float* __restrict__ proj, int ld, const int* seg, const u64* kv,
                int H, int HKV, int D, float scale, void* out, int mode, int ns, int target, int nrows, int nseg,
                float* __restrict__ scratch) {
    extern __shared__ __align__(16) unsigned short ath_sm[];
    if (D <= 64)
        attention_h_t<8>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg, scratch, ath_sm);
    else if (D <= 128)
        attention_h_t<16>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg, scratch, ath_sm);
    else
        attention_h_t<32>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, target, nrows, nseg, scratch, ath_sm);
}

// Merges the key splits of `attention_tc`: per (token, head) o = Σ_j e^(m_j - M) o_j / Σ_j e^(m_j - M) l_j, times
// sigmoid(gate). Tokens whose tile had one split were written by attention_tc and are skipped. scratch as
// attention_tc's. One warp per (token, head), 4 columns per lane at a time; grid (ceil(maxlen * H / 8), nseg),
// block 256 (a block per (token, head) with 64 threads took 15.4 µs per call on the first workload's tree: 10,624
// blocks, most of them empty); D % 4 == 0, D <= 256, ns <= ATC_MAX_SPLITS.
KERNEL(simt) void __launch_bounds__(256)
    attention_tc_combine(const float* __restrict__ proj, int ld, const int* seg, int H, int HKV, int D, void* out,
                         int mode, int ns, int target, int nrows, int nseg, const float* __restrict__ scratch) {
    int pair = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, s = blockIdx.y;
    int t = pair / H, h = pair - t * H;
    int start = seg[3 * s], len = seg[3 * s + 1], pos0 = seg[3 * s + 2];
    // t >= len (the whole warp), in one test that also reads start and pos0 (never negative): one round trip.
    if (min(len - 1 - t, start | pos0) < 0) return;
    int TQ = ATC_M / (H / HKV);
    int t0 = t / TQ * TQ;
    int nkeys = pos0 + t0 + min(TQ, len - t0);
    int chunk, used;
    atc_plan(nkeys, atc_seg_splits(len, TQ, HKV, ns, target), chunk, used);
    if (used == 1) return;
    idx_t stride = (idx_t)nrows * H;             // partial rows between splits
    idx_t row = ((idx_t)start + t) * H + h;      // partial row of (split 0, this token, this head)
    const float* ml = scratch + (idx_t)ns * stride * D;
    const idx_t n = start + t;
    // The gate's values, loaded with the maxima and sums below (one round trip, not one per value: atc_store).
    const float* gate = proj + n * ld + h * 2 * D + D;
    float gv[2][4];
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = 4 * lane + 128 * k + i;
            gv[k][i] = c < D ? gate[c] : 0.0f;
        }
    float w[ATC_MAX_SPLITS], lj[ATC_MAX_SPLITS];
    float mx = __int_as_float(0xff800000);
#pragma unroll
    for (int j = 0; j < ATC_MAX_SPLITS; j++) {
        bool ok = j < used;
        w[j] = ok ? ml[(j * stride + row) * 2] : __int_as_float(0xff800000);
        lj[j] = ok ? ml[(j * stride + row) * 2 + 1] : 0.0f;
        mx = fmaxf(mx, w[j]);
    }
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < ATC_MAX_SPLITS; j++) {
        w[j] = exp2f(w[j] - mx);  // base-2 maxima; a split where the row saw no key (or past `used`): weight 0
        l += w[j] * lj[j];
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < 2; k++) {  // D <= 256
        const int c = 4 * lane + 128 * k;
        if (c >= D) break;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < ATC_MAX_SPLITS; j++) {
            if (j < used) {
                float4 v = *(const float4*)(scratch + (j * stride + row) * D + c);
                acc.x += w[j] * v.x;
                acc.y += w[j] * v.y;
                acc.z += w[j] * v.z;
                acc.w += w[j] * v.w;
            }
        }
        idx_t oi = n * H * D + h * D + c;
        store_act(out, oi, acc.x * inv * sigmoid_f(gv[k][0]), mode);
        store_act(out, oi + 1, acc.y * inv * sigmoid_f(gv[k][1]), mode);
        store_act(out, oi + 2, acc.z * inv * sigmoid_f(gv[k][2]), mode);
        store_act(out, oi + 3, acc.w * inv * sigmoid_f(gv[k][3]), mode);
    }
}

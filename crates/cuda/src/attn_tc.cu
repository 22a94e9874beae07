
// ---------------------------------------------------------------------------------------------------------------
// Attention on tensor cores (attn_tc.cu; launcher crates/cuda/src/attn_tc.rs): the twin of `attention_tiled`
// (same inputs, same result within f32 rounding) with Q·Kᵀ and P·V as mma.sync m16n8k8 TF32 products in 3xTF32
// form (x = big + small, both TF32; acc += big·big + big·small + small·big), online softmax in f32;
// attention_tc_tf32, its 1xTF32 twin, runs the big·big products only.
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

// x = big + small: big = TF32(x) rounded to nearest (ties away, as cvt.rna; finite x), small = x - big exactly
// in f32, passed as is (the tensor core reads its top 19 bits): |x - big - tf32(small)| <= 2^-21 |x|. Two integer
// ops fewer than tc_split (tc_common.cu), which rounds small too.
__device__ __forceinline__ void atc_split(float x, unsigned& big, unsigned& small) {
    big = tc_tf32(x);
    small = __float_as_uint(x - __uint_as_float(big));
}
// Keys per split and splits used for a tile that sees `nkeys` keys, with at most `ns` splits.
__device__ __forceinline__ void atc_plan(int nkeys, int ns, int& chunk, int& used) {
    int c = (nkeys + ns - 1) / ns;
    c = (c + ATC_NK - 1) / ATC_NK * ATC_NK;
    chunk = max(ATC_MIN_CHUNK, c);
    used = (nkeys + chunk - 1) / chunk;
}

// Keys k0..k0+ATC_NK-1 of one KV head (K or V) into dst [ATC_NK, lds]: key p from the base cache when
// p < base, else own row p - base; keys >= kend and columns >= D are zeros.
__device__ __forceinline__ void atc_load_kv(float* dst, const float* own, const float* bas, int base, int k0,
                                            int kend, int HKV, int kh, int D, int c4n, int lds, int tid) {
    unsigned s0 = tc_smem_addr(dst);
    for (int i = tid; i < ATC_NK * c4n; i += 128) {
        int r = i / c4n, c = (i - r * c4n) * 4;
        int kp = k0 + r;
        bool ok = kp < kend && c < D;
        const float* src = own;
        if (ok)
            src = kp < base ? bas + ((idx_t)kp * HKV + kh) * D + c : own + ((idx_t)(kp - base) * HKV + kh) * D + c;
        tc_cp16(s0 + (unsigned)(r * lds + c) * 4u, src, ok ? 16 : 0);
    }
}

// NT: 8-column tiles of the padded head dim Dp = 8 NT >= D (columns D..Dp-1 are zeros); X3: 3xTF32, else 1xTF32.
template <int NT, bool X3>
__device__ __forceinline__ void attention_tc_t(const float* __restrict__ q, const float* __restrict__ proj, int ld,
                                               const int* seg, const u64* kv, int H, int HKV, int D, float scale,
                                               void* out, int mode, int ns, int nrows, int nseg,
                                               float* __restrict__ scratch, float* sm) {
    const int G = H / HKV, TQ = ATC_M / G;
    // Row pitches: Q and K are read as float2 pairs (pitch = 8 mod 32: the 16 lanes of a half warp hit 32
    // distinct banks), V down its columns as single floats (pitch = 4 mod 32). Must match smem() in attn_tc.rs.
    const int Dp = NT * 8, ldq = Dp + 8, lds = Dp + 4, c4n = Dp / 4;
    float* Qs = sm;                 // [ATC_M, ldq]
    float* Ks = Qs + ATC_M * ldq;   // [ATC_NK, ldq]
    float* Vs = Ks + ATC_NK * ldq;  // [ATC_NK, lds]
    // Longest tiles first (they see the most keys), both KV heads of a tile together, and the last segments first:
    // in a tree (CudaModel::forward_tree) those are the children, whose one tile sees its root's keys as well, so
    // started last they would run alone at the end.
    int kh = (int)blockIdx.x % HKV, bx = (int)blockIdx.x / HKV;
    int tile = (int)(gridDim.x / HKV / ns) - 1 - bx / ns, split = bx % ns;
    int s = nseg - 1 - (int)blockIdx.y;
    int start = seg[3 * s], len = seg[3 * s + 1], pos0 = seg[3 * s + 2];
    int t0 = tile * TQ;
    if (t0 >= len) return;
    int nq = min(TQ, len - t0);
    int nkeys = pos0 + t0 + nq;  // keys 0..nkeys-1 are seen by some row of the tile
    int chunk, used;
    atc_plan(nkeys, ns, chunk, used);
    if (split >= used) return;
    int kbeg = split * chunk, kend = min(nkeys, kbeg + chunk);

    const u64* kvs = kv + KV_ENTRIES * s;
    const float* ko = (const float*)kvs[0];
    const float* vo = (const float*)kvs[1];
    const float* kb = (const float*)kvs[2];
    const float* vb = (const float*)kvs[3];
    int base = (int)kvs[4];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;

    // Q tile (unscaled; the scale goes on the scores), then the first K and V tiles.
    {
        unsigned s0 = tc_smem_addr(Qs);
        for (int i = tid; i < ATC_M * c4n; i += 128) {
            int r = i / c4n, c = (i - r * c4n) * 4;
            int t = r / G, hg = r - t * G;
            bool ok = t < nq && c < D;
            const float* src = q;
            if (ok) src = q + ((idx_t)(start + t0 + t) * H + kh * G + hg) * D + c;
            tc_cp16(s0 + (unsigned)(r * ldq + c) * 4u, src, ok ? 16 : 0);
        }
    }
    atc_load_kv(Ks, ko, kb, base, kbeg, kend, HKV, kh, D, c4n, ldq, tid);
    tc_commit();
    atc_load_kv(Vs, vo, vb, base, kbeg, kend, HKV, kh, D, c4n, lds, tid);
    tc_commit();

    // This thread's rows r0 = 16 warp + g and r1 = r0 + 8, their positions (-1: not a row of the tile, sees
    // nothing), and the last key any row of the warp sees.
    int r0 = warp * 16 + g, r1 = r0 + 8;
    int p0 = r0 / G < nq ? pos0 + t0 + r0 / G : -1;
    int p1 = r1 / G < nq ? pos0 + t0 + r1 / G : -1;
    bool wrows = (warp * 16) / G < nq;
    int pw = pos0 + t0 + min((warp * 16 + 15) / G, nq - 1);
    const float NEG = __int_as_float(0xff800000);  // -inf
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = NEG, m1 = NEG, l0 = 0.0f, l1 = 0.0f;

    for (int k0 = kbeg; k0 < kend; k0 += ATC_NK) {
        bool next = k0 + ATC_NK < kend;
        bool act = wrows && k0 <= pw;  // warp-uniform
        tc_wait<1>();                  // Q and K(k0) have landed (V(k0) may be in flight)
        __syncthreads();
        float sc[ATC_NK / 8][4];
        if (act) {
            // S[16 x ATC_NK] = Q[16 x Dp] · K[ATC_NK x Dp]ᵀ, 8 head-dim columns per step; four independent
            // accumulators per key tile (big·big and the cross terms, even and odd steps) keep the mma chains short.
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
                    // The k step's 8 head-dim columns in permuted order, the same for Q and K (a dot product
                    // does not care): logical k t <-> column 2t, t+4 <-> 2t+1, so each lane's two values of a
                    // row are adjacent (one 64-bit load). Measured on an H200: 3,400 tokens 1,333 -> 1,290 µs,
                    // the short shapes unchanged.
                    const float2 qlo = *(const float2*)(Qs + r0 * ldq + (kk + u) * 8 + 2 * tg);
                    const float2 qhi = *(const float2*)(Qs + (r0 + 8) * ldq + (kk + u) * 8 + 2 * tg);
                    unsigned ab[4], as[4];
                    atc_split(qlo.x, ab[0], as[0]);
                    atc_split(qhi.x, ab[1], as[1]);
                    atc_split(qlo.y, ab[2], as[2]);
                    atc_split(qhi.y, ab[3], as[3]);
#pragma unroll
                    for (int j = 0; j < ATC_NK / 8; j++) {
                        const float2 kv2 = *(const float2*)(Ks + (j * 8 + g) * ldq + (kk + u) * 8 + 2 * tg);
                        unsigned bb0, bs0, bb1, bs1;
                        atc_split(kv2.x, bb0, bs0);
                        atc_split(kv2.y, bb1, bs1);
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
        __syncthreads();  // every warp is done with Ks
        if (next) atc_load_kv(Ks, ko, kb, base, k0 + ATC_NK, kend, HKV, kh, D, c4n, ldq, tid);
        tc_commit();
        if (act) {
            // Causal mask and scale; sc[j][e] is (row e < 2 ? r0 : r1, key k0 + 8j + 2tg + (e & 1)).
            float mx0 = NEG, mx1 = NEG;
#pragma unroll
            for (int j = 0; j < ATC_NK / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + j * 8 + 2 * tg + (e & 1);
                    int p = e < 2 ? p0 : p1;
                    float x = key <= p && key < kend ? sc[j][e] * scale : NEG;
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
            // A row that has seen no key yet keeps max -inf: use 0 so that exp gives 0, not NaN.
            float mu0 = mn0 == NEG ? 0.0f : mn0, mu1 = mn1 == NEG ? 0.0f : mn1;
            float cr0 = expf(m0 - mu0), cr1 = expf(m1 - mu1);
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int j = 0; j < ATC_NK / 8; j++) {
                sc[j][0] = expf(sc[j][0] - mu0);
                sc[j][1] = expf(sc[j][1] - mu0);
                sc[j][2] = expf(sc[j][2] - mu1);
                sc[j][3] = expf(sc[j][3] - mu1);
                s0 += sc[j][0] + sc[j][1];
                s1 += sc[j][2] + sc[j][3];
            }
            s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
            s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
            s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
            s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
            l0 = l0 * cr0 + s0;
            l1 = l1 * cr1 + s1;
            m0 = mn0;
            m1 = mn1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                o[nt][0] *= cr0;
                o[nt][1] *= cr0;
                o[nt][2] *= cr1;
                o[nt][3] *= cr1;
            }
        }
        tc_wait<1>();  // V(k0) has landed (K(k0 + ATC_NK) may be in flight)
        __syncthreads();
        if (act) {
            // O[16 x Dp] += P[16 x ATC_NK] · V[ATC_NK x Dp]. The score fragment is the A operand with its 8 keys
            // permuted: A column t ↔ key 2t, column t+4 ↔ key 2t+1 (so a = c0, c2, c1, c3), and B reads V rows
            // in the same order.
#pragma unroll
            for (int j = 0; j < ATC_NK / 8; j++) {
                unsigned pb[4], ps[4];
                atc_split(sc[j][0], pb[0], ps[0]);
                atc_split(sc[j][2], pb[1], ps[1]);
                atc_split(sc[j][1], pb[2], ps[2]);
                atc_split(sc[j][3], pb[3], ps[3]);
                const float* vr = Vs + (j * 8 + 2 * tg) * lds + g;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    unsigned bb0, bs0, bb1, bs1;
                    atc_split(vr[nt * 8], bb0, bs0);
                    atc_split(vr[lds + nt * 8], bb1, bs1);
                    tc_mma3<X3>(o[nt], pb, ps, bb0, bb1, bs0, bs1);
                }
            }
        }
        __syncthreads();  // every warp is done with Vs
        if (next) atc_load_kv(Vs, vo, vb, base, k0 + ATC_NK, kend, HKV, kh, D, c4n, lds, tid);
        tc_commit();
    }

    // o[nt][e] is (row e < 2 ? r0 : r1, column 8nt + 2tg + (e & 1)); D % 4 == 0, so c < D means c + 1 < D.
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int r = half ? r1 : r0;
        if ((half ? p1 : p0) < 0) continue;
        float m = half ? m1 : m0, l = half ? l1 : l0;
        int t = r / G, h = kh * G + (r - t * G);
        idx_t n = start + t0 + t;
        if (used == 1) {
            const float* gate = proj + n * ld + h * 2 * D + D;
            float inv = 1.0f / l;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int c = nt * 8 + 2 * tg;
                if (c < D) {
                    idx_t oi = n * H * D + h * D + c;
                    store_act(out, oi, o[nt][2 * half] * inv * sigmoid_f(gate[c]), mode);
                    store_act(out, oi + 1, o[nt][2 * half + 1] * inv * sigmoid_f(gate[c + 1]), mode);
                }
            }
        } else {
            // Partial row ((split, token row), head): output [.., D] then (max, sum) after all outputs.
            idx_t pr = ((idx_t)split * nrows + n) * H + h;
            float* po = scratch + pr * D;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int c = nt * 8 + 2 * tg;
                if (c < D) {
                    po[c] = o[nt][2 * half];
                    po[c + 1] = o[nt][2 * half + 1];
                }
            }
            if (tg == 0) {
                float* ml = scratch + (idx_t)ns * nrows * H * D + pr * 2;
                ml[0] = m;
                ml[1] = l;
            }
        }
    }
}

// q: [N, H, D]; proj: [N, ld] (gate of head h at h*2D + D); seg: [S, 3]; kv: [S, KV_ENTRIES]; out: [N, H*D] as
// `store_act` with `mode`. ns: most key splits per tile; scratch: [ns, nrows, H] x (D + 2) floats when ns > 1
// (nrows: the token rows N). grid (ceil(maxlen / (ATC_M / G)) * ns * HKV, nseg), block 128, dynamic shared memory
// (ATC_M + ATC_NK) * (Dp + 8) + ATC_NK * (Dp + 4) floats, Dp = 64, 128 or 256 (the least >= D); D % 4 == 0,
// D <= 256, G = H / HKV <= 64.
// attention_tc: 3xTF32 products; attention_tc_tf32: 1xTF32.
#define ATTENTION_TC(NAME, X3)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128, 2)                                                             \
        NAME(const float* __restrict__ q, const float* __restrict__ proj, int ld, const int* seg, const u64* kv,     \
             int H, int HKV, int D, float scale, void* out, int mode, int ns, int nrows, int nseg,                   \
             float* __restrict__ scratch) {                                                                          \
        extern __shared__ float atc_sm[];                                                                            \
        if (D <= 64)                                                                                                 \
            attention_tc_t<8, X3>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, nrows, nseg, scratch,      \
                                  atc_sm);                                                                           \
        else if (D <= 128)                                                                                           \
            attention_tc_t<16, X3>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, nrows, nseg, scratch,     \
                                   atc_sm);                                                                          \
        else                                                                                                         \
            attention_tc_t<32, X3>(q, proj, ld, seg, kv, H, HKV, D, scale, out, mode, ns, nrows, nseg, scratch,     \
                                   atc_sm);                                                                          \
    }
ATTENTION_TC(attention_tc, true)
ATTENTION_TC(attention_tc_tf32, false)
#undef ATTENTION_TC

// Merges the key splits of `attention_tc`: per (token, head) o = Σ_j e^(m_j - M) o_j / Σ_j e^(m_j - M) l_j, times
// sigmoid(gate). Tokens whose tile had one split were written by attention_tc and are skipped. scratch as
// attention_tc's. grid (maxlen, nseg, H), block 64 (4 columns per thread); D % 4 == 0, D <= 256,
// ns <= ATC_MAX_SPLITS.
extern "C" __global__ void __launch_bounds__(64)
    attention_tc_combine(const float* __restrict__ proj, int ld, const int* seg, int H, int HKV, int D, void* out,
                         int mode, int ns, int nrows, int nseg, const float* __restrict__ scratch) {
    int t = blockIdx.x, s = blockIdx.y, h = blockIdx.z, c = 4 * threadIdx.x;
    int start = seg[3 * s], len = seg[3 * s + 1], pos0 = seg[3 * s + 2];
    if (t >= len || c >= D) return;
    int TQ = ATC_M / (H / HKV);
    int t0 = t / TQ * TQ;
    int nkeys = pos0 + t0 + min(TQ, len - t0);
    int chunk, used;
    atc_plan(nkeys, ns, chunk, used);
    if (used == 1) return;
    idx_t stride = (idx_t)nrows * H;             // partial rows between splits
    idx_t row = ((idx_t)start + t) * H + h;      // partial row of (split 0, this token, this head)
    const float* ml = scratch + (idx_t)ns * stride * D;
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
        w[j] = expf(w[j] - mx);  // a split where the row saw no key (or past `used`): m = -inf, weight 0
        l += w[j] * lj[j];
    }
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
    float inv = 1.0f / l;
    idx_t n = start + t;
    const float* gate = proj + n * ld + h * 2 * D + D + c;
    idx_t oi = n * H * D + h * D + c;
    store_act(out, oi, acc.x * inv * sigmoid_f(gate[0]), mode);
    store_act(out, oi + 1, acc.y * inv * sigmoid_f(gate[1]), mode);
    store_act(out, oi + 2, acc.z * inv * sigmoid_f(gate[2]), mode);
    store_act(out, oi + 3, acc.w * inv * sigmoid_f(gate[3]), mode);
}

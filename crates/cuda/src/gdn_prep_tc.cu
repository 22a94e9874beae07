
// ---------------------------------------------------------------------------------------------------------------
// The gated delta WY pre-pass on tensor cores (gdn_prep_tc.cu; launcher crates/cuda/src/gdn_prep_tc.rs):
// `gdn_tc_prep`, the drop-in twin of `gdn_wy_prep` (kernels.cu). Same inputs, same scratch (U, W, M, E for every
// token row and value head), same values within f32 rounding; gdn_tc_prep_tf32 is its 1xTF32 twin. Per chunk of
// n <= 64 tokens of a (segment, value head), with gam the cumulative log decay, A[a][b] = beta_a (k_a . k_b)
// e^(gam_a - gam_b) for b < a:
//   M[a][b] = (q_a . k_b) e^(gam_a - gam_b) (b <= a),   E[t] = (e^gam_t, e^(gam_last - gam_t)),
//   (I + A) [U | W] = [diag(beta) V | diag(beta e^gam) K].
//
// Why it is faster than gdn_wy_prep (one block per chunk-head, SIMT products, one thread per column walking 64
// unknowns in sequence, 228 registers):
// - K·Kᵀ and Q·Kᵀ are mma.sync m16n8k8 TF32 products in 3xTF32 form (x = big + small, both TF32; acc += small·big
//   + big·small + big·big), which keeps f32 accuracy (each product within ~2^-21 relative).
// - The solve is blocked by 16 tokens: the inverses T_ii = (I + A_ii)^-1 of the four 16x16 diagonal blocks come
//   from a 16-step substitution (one thread per column), then per 16-column tile of [U | W] one warp runs
//   X_k = T_kk R_k, R_i -= A_ik X_k (i > k) as 3xTF32 products. The warp works on the transposes (Y = Xᵀ: rows =
//   columns of [U | W], columns = tokens), so a product's C fragment is the next product's A fragment in
//   registers: C holds columns (2t, 2t+1) of an n8 tile, A wants (t, t+4) of a k8 step, so the k index is
//   permuted (logical t <-> token 2t, t+4 <-> 2t+1) and the B operand, read from shared memory, uses the same
//   permutation (then b0, b1 are adjacent floats: one 64-bit load). No shared-memory round trip, no barrier.
//   Against a full (I + A)^-1 this keeps the substitution's structure (closer rounding) at the same product count.
// - Persistent blocks of 16 warps, one per multiprocessor: block b takes work items b, b + blocks, ... of the
//   (chunk, segment, column slice, value head) items in order (a table of chunks per segment, built in shared memory
//   at the start, maps an item to its rows), and with two tile buffers the next item's Q, K, V, g and beta copies
//   (cp.async, one group per item) are in flight while the current item computes. Before, two independent blocks
//   of 8 warps shared a multiprocessor, each waiting out its own loads between its products (ncu, 0.8B heads, one
//   H100: 134 µs a layer, 44% of DRAM throughput, latency-bound). With 16 warps the 16 column tiles of [U | W] at
//   dk = dv = 128 are one per warp (the former short-input split into column slices is then only needed past 16
//   tiles), and K·Kᵀ / Q·Kᵀ take two n8 tiles per warp instead of four. Measured on an
//   H100 against the 8-warp form (1xTF32, µs): 1 x 175 tokens 21.4 -> 19.6, 7 x 33 23.5 -> 16.9, 7 x 23..66 31.9 ->
//   19.9, 1 x 3,400 129.1 -> 122.5; but 224 x 33 362.1 -> 396.4 (not profiled; likely two independent blocks had
//   overlapped one's serial phases, the decay sums and 16x16 inverses on 64 threads, with the other's products).
// - Every product, sum and exp of an output value is the one of the former one-item-per-block kernel, in the same
//   order (the cumulative sums per thread, the k loops per accumulator, the 16-step substitutions, the solve per
//   tile): only which warp computes a tile and when the tiles arrive changed, so the outputs are the same bits.
// - Chunks shorter than 64 skip the 16-token blocks past their end.
// Kept as in gdn_wy_prep: the cumulative decay summed g_0..g_t in order (the CPU's order), every exp taken of a
// difference (e^(gam_a - gam_b), never e^gam_a e^-gam_b: strong decays underflow the same way).
//
// gdn_tc_prep8*: the same kernel in blocks of 8 warps, two a multiprocessor (one tile buffer each, 123 / 124
// registers, no spills), each warp taking two of the K·Kᵀ tiles and two of the [U | W] tiles in turn: the same
// products in the same order, so the same bits. The launcher takes it where the items need more than one round of
// the 16-warp blocks but fit one round of these (the 402-token request's 176 items on 132 multiprocessors).
// Block 512 threads (16 warps), one per multiprocessor: registers capped at 128 (ptxas, sm_90a: 118 in the 1xTF32
// twin, 119 in the 3xTF32 one, no spills; the former 8-warp blocks with four K·Kᵀ tiles a warp spilled 188 and 128
// bytes at the same cap). Dynamic shared memory (floats), per tile buffer (one or two): K [64, dk16+4] | Q [64,
// dk16+4] (later the solve matrix S [64, 72]) | V [64, dv16+4] | g, gam, beta, e^gam [64 each], with x16 = x rounded
// up to 16; then the item table (3 nseg + 1 ints) and 16 ints of scan scratch. The row pitch = 4 mod 16 makes every
// fragment load conflict-free. S holds -A in its strictly lower 16x16 blocks and T_ii in its diagonal blocks. At
// dk = dv = 128 two buffers take 204,800 bytes, which leaves room (227 KB opt-in) for the table of about 2,300
// segments; one buffer (no overlap) past that, up to about 10,800; beyond, the launcher reports Unsupported and the
// caller falls back to gdn_wy_prep.
// ---------------------------------------------------------------------------------------------------------------

// 3xTF32 (X3) c += a · b, with a given as (big, small) and b as two f32 values split here: small products first.
// 1xTF32 (!X3): the big product only (a's small half, split by the caller, is then dead code).
template <bool X3>
__device__ __forceinline__ void gtp_mma3(float* c, const unsigned* ab, const unsigned* as, float b0, float b1) {
    unsigned bb0, bs0, bb1, bs1;
    tc_split(b0, bb0, bs0);
    tc_split(b1, bb1, bs1);
    tc_mma3<X3>(c, ab, as, bb0, bb1, bs0, bs1);
}
__device__ __forceinline__ void gtp_split4(const float* x, unsigned* big, unsigned* small) {
#pragma unroll
    for (int i = 0; i < 4; i++) tc_split(x[i], big[i], small[i]);
}
// Warps per block.
#define GTP_NW 16

// dst[t * ldd + c] = src[t * lds + c] for t < n, c < w; zero for n <= t < rows, w <= c < wp. Warp w of the NW
// takes rows w, w + NW, ...; lanes take columns (coalesced, no division); all copies asynchronous (cp.async).
// vec: 16-byte copies (src, lds, ldd and the destination 16-byte aligned, wp a multiple of 4), zero-filled past n
// and w; else 4-byte copies and plain zero stores. 16-byte copies issue a quarter of the copy instructions;
// measured on an H200 (0.8B heads, 3xTF32, µs): 1 x 175 tokens 27.7 -> 26.3, 7 x 33 28.2 -> 27.2, 1 x 3,400
// 158.4 -> 150.5, 224 x 33 457.6 -> 431.3.
template <int NW>
__device__ __forceinline__ void gtp_load(float* dst, int ldd, const float* __restrict__ src, idx_t lds, int n,
                                         int rows, int w, int wp, bool vec) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = warp; t < rows; t += NW) {
        const float* s = src + (idx_t)t * lds;
        float* d = dst + t * ldd;
        if (vec) {
            for (int c = 4 * lane; c < wp; c += 128) {
                const int bytes = t < n ? 4 * max(0, min(4, w - c)) : 0;
                tc_cp16(d + c, bytes ? s + c : src, bytes);
            }
        } else {
            for (int c = lane; c < wp; c += 32) {
                if (t < n && c < w) tc_cp4(d + c, s + c, 4);
                else d[c] = 0.0f;
            }
        }
    }
}

// Pitch of the solve matrix S: 72 = 8 mod 32, so the 64-bit B-fragment loads (rows g, columns 2t) are
// conflict-free per half warp.
#define GTP_LS 72
// One work item: chunk ci of segment s, value head h, column slice sl (item = ((pair * nslice) + sl) * hv + h, pairs
// (s, ci) in segment order). Rows r0 .. r0 + n - 1; the 16-column tiles mlo .. mhi - 1 of [U | W].
struct GtpItem {
    int r0, n, h, kh, mlo, mhi;
    bool doq, dov;
};
// cum [nseg + 1]: chunks before segment s; st, ln [nseg]: its start and length (the table the kernel builds).
__device__ __forceinline__ GtpItem gtp_item(const int* cum, const int* st, const int* ln, int nseg, int it, int hk,
                                            int hv, int nslice, int mtu, int mtall) {
    GtpItem w;
    w.h = it % hv;
    const int rest = it / hv, sl = rest % nslice, p = rest / nslice;
    int lo = 0, hi = nseg;  // cum[lo] <= p < cum[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (cum[mid] <= p) lo = mid;
        else hi = mid;
    }
    const int c0 = (p - cum[lo]) * GDN_C;
    w.r0 = st[lo] + c0;
    w.n = min(GDN_C, ln[lo] - c0);
    w.kh = w.h / (hv / hk);
    const int per = (mtall + nslice - 1) / nslice;
    w.mlo = sl * per;
    w.mhi = min(w.mlo + per, mtall);
    w.doq = sl == 0;
    w.dov = w.mlo < mtu;
    return w;
}

// One tile buffer (floats): K [64, lk] | Q [64, max(lk, GTP_LS)] (later the solve matrix S) | V [64, lv] | g, gam,
// beta, e^gam [64 each], with lk = dk16 + 4, lv = dv16 + 4 (x16: x rounded up to 16). `floats`: its size.
struct GtpBuf {
    float *Ks, *Qs, *Vs, *gs, *gam, *bet, *eg;
    int lk, lv, floats;
};
__device__ __forceinline__ GtpBuf gtp_buf(float* b, int dk, int dv) {
    GtpBuf t;
    t.lk = ((dk + 15) & ~15) + 4;
    t.lv = ((dv + 15) & ~15) + 4;
    t.Ks = b;
    t.Qs = t.Ks + GDN_C * t.lk;
    t.Vs = t.Qs + GDN_C * max(t.lk, GTP_LS);
    t.gs = t.Vs + GDN_C * t.lv;
    t.gam = t.gs + GDN_C;
    t.bet = t.gam + GDN_C;
    t.eg = t.bet + GDN_C;
    t.floats = GDN_C * (t.lk + max(t.lk, GTP_LS) + t.lv + 4);
    return t;
}

// Starts the copies of item w into buffer b (one cp.async group): K, Q (slice 0), V (slices with U tiles), g, beta.
template <int NW>
__device__ __forceinline__ void gtp_issue(float* b, const GtpItem& w, const float* __restrict__ qkv, int ld,
                                          const float* __restrict__ g, const float* __restrict__ beta, int hk, int hv,
                                          int dk, int dv) {
    const int dkp = (dk + 15) & ~15, dvp = (dv + 15) & ~15;
    const GtpBuf bf = gtp_buf(b, dk, dv);
    const int lk = bf.lk, lv = bf.lv;
    float *Ks = bf.Ks, *Qs = bf.Qs, *Vs = bf.Vs, *gs = bf.gs, *bet = bf.bet;
    const int rows = ((w.n + 15) >> 4) * 16;
    const float* row0 = qkv + (idx_t)w.r0 * ld;
    const bool vec = (ld & 3) == 0 && (dk & 3) == 0 && (dv & 3) == 0 && ((size_t)qkv & 15) == 0;
    if (w.mlo < w.mhi) {
        gtp_load<NW>(Ks, lk, row0 + hk * dk + w.kh * dk, ld, w.n, rows, dk, dkp, vec);
        if (w.doq) gtp_load<NW>(Qs, lk, row0 + w.kh * dk, ld, w.n, rows, dk, dkp, vec);
        if (w.dov) gtp_load<NW>(Vs, lv, row0 + 2 * hk * dk + w.h * dv, ld, w.n, rows, dv, dvp, vec);
    }
    const int tid = threadIdx.x;
    if (tid < GDN_C) {
        if (tid < w.n) {
            const idx_t r = (idx_t)(w.r0 + tid) * hv + w.h;
            tc_cp4(gs + tid, g + r, 4);
            tc_cp4(bet + tid, beta + r, 4);
        } else {
            gs[tid] = 0.0f;
            bet[tid] = 0.0f;
        }
    }
    tc_commit();
}

// One item from buffer b, its copies complete and visible (the caller waited and synchronised); NW warps.
template <bool X3, int NW>
__device__ __forceinline__ void gtp_compute(float* b, const GtpItem& w, int hv, int dk, int dv,
                                            float* __restrict__ U, float* __restrict__ W, float* __restrict__ M,
                                            float* __restrict__ E) {
    const int dvp = (dv + 15) & ~15;
    const GtpBuf bf = gtp_buf(b, dk, dv);  // g read once (the decay sums), then nothing; Q, then the solve matrix
    const int lk = bf.lk, lv = bf.lv;
    float *Ks = bf.Ks, *Qs = bf.Qs, *Vs = bf.Vs, *gs = bf.gs, *gam = bf.gam, *bet = bf.bet, *eg = bf.eg;
    float* Sm = Qs;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int n = w.n, r0 = w.r0, h = w.h;
    const int nb = (n + 15) >> 4;  // 16-token blocks in play; rows past n are zeros
    const int mtu = dvp >> 4;
    const bool doq = w.doq;

    // Cumulative log decay, thread t summing g_0..g_t in order (gdn_wy_prep's and the CPU's order).
    if (tid < GDN_C) {
        float cum = 0.0f;
#pragma unroll
        for (int t = 0; t < GDN_C; t++)
            if (t <= tid) cum += gs[t];
        gam[tid] = cum;
        const float e = expf(cum);
        eg[tid] = e;
        if (doq && tid < n) E[2 * ((idx_t)(r0 + tid) * hv + h)] = e;
    }
    __syncthreads();
    if (doq && tid < n) {
        idx_t r = (idx_t)(r0 + tid) * hv + h;
        E[2 * r + 1] = expf(gam[n - 1] - gam[tid]);
    }

    // K·Kᵀ (and Q·Kᵀ): warp tile i = (rb, qt) = (i / 4, i % 4) owns rows 16rb..16rb+15, columns 16qt..16qt+15 as
    // two n8 tiles; only the tiles on or below the diagonal block and left of token n are multiplied (10 of the
    // 16). Warp w takes tile w (16 warps), or tiles w and w + 8 (8 warps: KP passes). Masks and decays: -A into
    // registers (S overwrites Q, which other warps may still read), M to the scratch (zeros above the diagonal).
    constexpr int KP = 16 / NW;
    float nak[KP][2][4];
#pragma unroll
    for (int kp = 0; kp < KP; kp++) {
        const int ti = warp + NW * kp, rb = ti >> 2, qt = ti & 3;
        float ak[2][4], aq[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) ak[j][e] = aq[j][e] = 0.0f;
        if (rb < nb && qt <= rb) {
            const int ks = (dk + 7) >> 3;
            const int ra = (16 * rb + gq) * lk + tq;
            for (int k = 0; k < ks; k++) {
                const int k0 = 8 * k;
                float x[4] = {Ks[ra + k0], Ks[ra + 8 * lk + k0], Ks[ra + k0 + 4], Ks[ra + 8 * lk + k0 + 4]};
                unsigned kb[4], kl[4], qb[4], ql[4];
                gtp_split4(x, kb, kl);
                if (doq) {
                    float y[4] = {Qs[ra + k0], Qs[ra + 8 * lk + k0], Qs[ra + k0 + 4], Qs[ra + 8 * lk + k0 + 4]};
                    gtp_split4(y, qb, ql);
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int nt = 2 * qt + j;
                    if (8 * nt < n) {
                        const int rbk = (8 * nt + gq) * lk + k0 + tq;
                        const float b0 = Ks[rbk], b1 = Ks[rbk + 4];
                        gtp_mma3<X3>(ak[j], kb, kl, b0, b1);
                        if (doq) gtp_mma3<X3>(aq[j], qb, ql, b0, b1);
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = 16 * rb + gq + 8 * (e >> 1), bc = 8 * (2 * qt + j) + 2 * tq + (e & 1);
                const bool low = a < n && bc <= a;
                const float dcy = low ? expf(gam[a] - gam[bc]) : 0.0f;
                if (doq && a < n) M[((idx_t)(r0 + a) * hv + h) * GDN_C + bc] = low ? aq[j][e] * dcy : 0.0f;
                nak[kp][j][e] = (low && bc < a) ? -(bet[a] * ak[j][e] * dcy) : 0.0f;
            }
    }
    __syncthreads();
#pragma unroll
    for (int kp = 0; kp < KP; kp++) {
        const int ti = warp + NW * kp, rb = ti >> 2, qt = ti & 3;
        if (rb < nb && qt <= rb) {
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    Sm[(16 * rb + gq + 8 * (e >> 1)) * GTP_LS + 8 * (2 * qt + j) + 2 * tq + (e & 1)] = nak[kp][j][e];
        }
    }
    __syncthreads();
    // T_ii = (I + A_ii)^-1 column by column: x_r = [r == j] + sum_{s<r} (-A)[r][s] x_s (thread (i, j)).
    float tx[16];
    const int ti = tid >> 4, tj = tid & 15;
    if (tid < 64 && ti < nb) {
        const float* Sd = Sm + 16 * ti * GTP_LS + 16 * ti;
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float acc = r == tj ? 1.0f : 0.0f;
#pragma unroll
            for (int q = 0; q < r; q++) acc += Sd[r * GTP_LS + q] * tx[q];
            tx[r] = acc;
        }
    }
    __syncthreads();
    if (tid < 64 && ti < nb) {
        float* Sd = Sm + 16 * ti * GTP_LS + 16 * ti;
#pragma unroll
        for (int r = 0; r < 16; r++) Sd[r * GTP_LS + tj] = tx[r];
    }
    __syncthreads();

    // The solve, one 16-column tile of [U | W] per warp at a time, on Y = Xᵀ. Y[i][nt] is the C fragment of
    // columns (c0 + g, c0 + g + 8) x tokens 16i + 8nt + (2t, 2t+1); as the A operand of k step nt over block i,
    // (a0, a1, a2, a3) = (Y[i][nt][0], [2], [1], [3]) with logical k t <-> token 2t, t+4 <-> 2t+1.
    for (int mt = w.mlo + warp; mt < w.mhi; mt += NW) {
        const bool isu = mt < mtu;
        const int cbase = 16 * (isu ? mt : mt - mtu);
        const int width = isu ? dv : dk;
        float Y[4][2][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int t = 16 * i + 8 * nt + 2 * tq + (e & 1), c = cbase + gq + 8 * (e >> 1);
                    float r = 0.0f;
                    if (i < nb) r = isu ? bet[t] * Vs[t * lv + c] : bet[t] * eg[t] * Ks[t * lk + c];
                    Y[i][nt][e] = r;
                }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (k < nb) {
                // Y_k <- Y_k T_kkᵀ: B[k = token j][n = token i'] = T_kk[i'][j].
                unsigned yb[2][4], ys[2][4];
#pragma unroll
                for (int ks = 0; ks < 2; ks++) {
                    float x[4] = {Y[k][ks][0], Y[k][ks][2], Y[k][ks][1], Y[k][ks][3]};
                    gtp_split4(x, yb[ks], ys[ks]);
                }
                float out[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) out[nt][e] = 0.0f;
#pragma unroll
                    for (int ks = 0; ks < 2; ks++) {
                        const float2 bb =
                            *(const float2*)&Sm[(16 * k + 8 * nt + gq) * GTP_LS + 16 * k + 8 * ks + 2 * tq];
                        gtp_mma3<X3>(out[nt], yb[ks], ys[ks], bb.x, bb.y);
                    }
                }
                // Block k is final: to the scratch now (its registers die here but for the split copies).
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int t = 16 * k + 8 * nt + 2 * tq + (e & 1), c = cbase + gq + 8 * (e >> 1);
                        if (t < n && c < width) {
                            const idx_t r = (idx_t)(r0 + t) * hv + h;
                            if (isu) U[r * dv + c] = out[nt][e];
                            else W[r * dk + c] = out[nt][e];
                        }
                    }
                    float x[4] = {out[nt][0], out[nt][2], out[nt][1], out[nt][3]};
                    gtp_split4(x, yb[nt], ys[nt]);
                }
                // Y_i += Y_k (-A_ik)ᵀ for the later blocks: B[k = token j][n = token i'] = -A[16i + i'][16k + j].
#pragma unroll
                for (int i = k + 1; i < 4; i++) {
                    if (i < nb) {
#pragma unroll
                        for (int nt = 0; nt < 2; nt++)
#pragma unroll
                            for (int ks = 0; ks < 2; ks++) {
                                const float2 bb =
                                    *(const float2*)&Sm[(16 * i + 8 * nt + gq) * GTP_LS + 16 * k + 8 * ks + 2 * tq];
                                gtp_mma3<X3>(Y[i][nt], yb[ks], ys[ks], bb.x, bb.y);
                            }
                    }
                }
            }
        }
    }
}

// grid (blocks), block 32 NW threads (NW warps: GTP_NW, or 8 for gdn_tc_prep8*), persistent: block b takes items
// b, b + blocks, ... (GtpItem), the copies of the next one in flight while it computes the current one when nbuf
// is 2 (one buffer: no overlap). Dynamic
// shared memory: nbuf buffers (GtpBuf) | the item table: cum [nseg + 1], start [nseg], length [nseg],
// NW ints of scan scratch. Slice sl of a (chunk, head) solves the 16-column tiles sl*per .. sl*per + per - 1 of
// [U | W] (tiles 0..ceil(dv/16)-1 are U's, the rest W's; per = ceil(tiles / nslice)); slice 0 also writes M and E.
// X3: 3xTF32 products (gdn_tc_prep), else 1xTF32 (gdn_tc_prep_tf32).
template <bool X3, int NW>
__device__ __forceinline__ void gdn_tc_prep_t(const float* __restrict__ qkv, int ld, const float* __restrict__ g,
                                              const float* __restrict__ beta, const int* seg, int nseg, int hk,
                                              int hv, int dk, int dv, int nslice, int nbuf, float* __restrict__ U,
                                              float* __restrict__ W, float* __restrict__ M, float* __restrict__ E,
                                              float* sm) {
    const int dkp = (dk + 15) & ~15, dvp = (dv + 15) & ~15;
    const int bufsz = gtp_buf(sm, dk, dv).floats;
    int* cum = (int*)(sm + nbuf * bufsz);
    int* st = cum + nseg + 1;
    int* ln = st + nseg;
    int* part = ln + nseg;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mtu = dvp >> 4, mtall = mtu + (dkp >> 4);

    // The item table: each thread takes a run of segments, an exclusive scan of the runs' chunk counts.
    const int per = (nseg + NW * 32 - 1) / (NW * 32);
    const int s0 = min(tid * per, nseg), s1 = min(s0 + per, nseg);
    int mine = 0;
    for (int s = s0; s < s1; s++) {
        const int a = seg[3 * s], l = seg[3 * s + 1];
        st[s] = a;
        ln[s] = l;
        mine += (l + GDN_C - 1) / GDN_C;
    }
    int inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) part[warp] = inc;
    __syncthreads();
    int off = inc - mine;
    for (int v = 0; v < warp; v++) off += part[v];
    for (int s = s0; s < s1; s++) {
        cum[s] = off;
        off += (ln[s] + GDN_C - 1) / GDN_C;
    }
    if (s0 < s1 && s1 == nseg) cum[nseg] = off;
    __syncthreads();
    const int total = cum[nseg] * hv * nslice;

    int it = blockIdx.x;
    if (it >= total) return;
    // Item it computes from buffer j & 1 (two buffers) or 0. The copy calls stay at three sites: folded into one
    // loop over (current, next) ptxas kept more values live across the products (128 registers and 232 / 276 bytes
    // spilled instead of 118 / 119 registers and none).
    GtpItem w = gtp_item(cum, st, ln, nseg, it, hk, hv, nslice, mtu, mtall);
    gtp_issue<NW>(sm, w, qkv, ld, g, beta, hk, hv, dk, dv);
    for (int j = 0; it < total; j++) {
        const int nx = it + gridDim.x;
        float* cur = sm + (nbuf == 2 ? (j & 1) : 0) * bufsz;
        GtpItem wn = w;
        if (nx < total) wn = gtp_item(cum, st, ln, nseg, nx, hk, hv, nslice, mtu, mtall);
        if (nbuf == 2 && nx < total) {
            // The other buffer's last reader (the item before this one) passed the barrier below.
            gtp_issue<NW>(sm + ((j + 1) & 1) * bufsz, wn, qkv, ld, g, beta, hk, hv, dk, dv);
            tc_wait<1>();
        } else {
            tc_wait<0>();
        }
        __syncthreads();
        if (w.mlo < w.mhi) gtp_compute<X3, NW>(cur, w, hv, dk, dv, U, W, M, E);  // (no empty slices: the launcher)
        __syncthreads();
        it = nx;
        w = wn;
        if (nbuf == 1 && it < total) gtp_issue<NW>(sm, w, qkv, ld, g, beta, hk, hv, dk, dv);
    }
}

#define GDN_TC_PREP(NAME, X3, NW)                                                                                    \
    KERNEL(NAME) void __launch_bounds__(NW * 32, GTP_NW / NW)                                                        \
        NAME(const float* __restrict__ qkv, int ld, const float* __restrict__ g, const float* __restrict__ beta,     \
             const int* seg, int nseg, int hk, int hv, int dk, int dv, int nslice, int nbuf,                         \
             float* __restrict__ U, float* __restrict__ W, float* __restrict__ M, float* __restrict__ E) {           \
        extern __shared__ float sm[];                                                                                \
        gdn_tc_prep_t<X3, NW>(qkv, ld, g, beta, seg, nseg, hk, hv, dk, dv, nslice, nbuf, U, W, M, E, sm);            \
    }
GDN_TC_PREP(gdn_tc_prep, true, GTP_NW)
GDN_TC_PREP(gdn_tc_prep_tf32, false, GTP_NW)
GDN_TC_PREP(gdn_tc_prep8, true, 8)
GDN_TC_PREP(gdn_tc_prep8_tf32, false, 8)
#undef GDN_TC_PREP
#undef GTP_LS
#undef GTP_NW

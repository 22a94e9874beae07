
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
// - More blocks on short inputs: grid.z = hv x slices of the 16-column tiles of [U | W]; every slice recomputes
//   the cheap A (one K tile load and a few hundred mma), slice 0 also does M and E. The launcher picks one
//   tile per warp (2 slices at dk = dv = 128) when the grid is small (a prefix, a few suffixes: latency), one
//   slice when it is large (throughput: no recomputation).
// - Q, K, V of the chunk arrive in one cp.async phase (no registers, everything in flight at once) while the
//   cumulative decays are summed. Chunks shorter than 64 skip the 16-token blocks past their end.
// Kept as in gdn_wy_prep: the cumulative decay summed g_0..g_t in order (the CPU's order), every exp taken of a
// difference (e^(gam_a - gam_b), never e^gam_a e^-gam_b: strong decays underflow the same way).
//
// Block 256 threads (8 warps). Registers (ptxas, sm_90): capped at 128 for two blocks per multiprocessor (124 bytes
// spilled, 188 in the 1xTF32 twin; 183 registers and one block per multiprocessor uncapped). The solve's 16-token
// steps overlap (a step's diagonal product runs under the previous step's updates of later blocks), but one
// block's 8 warps left the multiprocessor mostly waiting (ncu, a System One tree: 12.5% occupancy, 21% SM
// throughput), so two blocks share it; the launcher's split keeps short inputs to one wave of blocks. Dynamic
// shared memory (floats): K [64, dk16+4] | Q [64, dk16+4] (later the solve matrix S [64, 72]) | V [64, dv16+4] |
// g, gam, beta, e^gam [64 each], with x16 = x rounded up to 16; the row pitch = 4 mod 16 makes every fragment
// load conflict-free. S holds -A in its strictly lower 16x16 blocks and T_ii in its diagonal blocks.
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
// dst[t * ldd + c] = src[t * lds + c] for t < n, c < w; zero for n <= t < rows, w <= c < wp. Warp w takes rows
// w, w + 8, ...; lanes take columns (coalesced, no division); all copies asynchronous (cp.async). vec: 16-byte
// copies (src, lds, ldd and the destination 16-byte aligned, wp a multiple of 4), zero-filled past n and w; else
// 4-byte copies and plain zero stores. 16-byte copies issue a quarter of the copy instructions; measured on an H200
// (0.8B heads, 3xTF32, µs): 1 x 175 tokens 27.7 -> 26.3, 7 x 33 28.2 -> 27.2, 1 x 3,400 158.4 -> 150.5,
// 224 x 33 457.6 -> 431.3.
__device__ __forceinline__ void gtp_load(float* dst, int ldd, const float* __restrict__ src, idx_t lds, int n,
                                         int rows, int w, int wp, bool vec) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = warp; t < rows; t += 8) {
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

// grid (max chunks per segment, nseg, hv * nslice), block 256. Slice sl of value head h solves the 16-column tiles
// sl*per .. sl*per + per - 1 of [U | W] (tiles 0..ceil(dv/16)-1 are U's, the rest W's; per = ceil(tiles /
// nslice)); slice 0 also writes M and E. X3: 3xTF32 products (gdn_tc_prep), else 1xTF32 (gdn_tc_prep_tf32).
template <bool X3>
__device__ __forceinline__ void gdn_tc_prep_t(const float* __restrict__ qkv, int ld, const float* __restrict__ g,
                                              const float* __restrict__ beta, const int* seg, int hk, int hv, int dk,
                                              int dv, int nslice, float* __restrict__ U, float* __restrict__ W,
                                              float* __restrict__ M, float* __restrict__ E, float* sm) {
    const int dkp = (dk + 15) & ~15, dvp = (dv + 15) & ~15;
    const int lk = dkp + 4, lv = dvp + 4;
    float* Ks = sm;                           // [64, lk]
    float* Qs = Ks + GDN_C * lk;              // [64, lk], then S [64, GTP_LS]
    float* Vs = Qs + GDN_C * max(lk, GTP_LS); // [64, lv]
    float* gs = Vs + GDN_C * lv;              // g, then nothing
    float* gam = gs + GDN_C;
    float* bet = gam + GDN_C;
    float* eg = bet + GDN_C;
    float* Sm = Qs;

    const int ci = blockIdx.x, s = blockIdx.y, h = blockIdx.z / nslice, sl = blockIdx.z % nslice;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int start = seg[3 * s], len = seg[3 * s + 1];
    const int c0 = ci * GDN_C;
    if (c0 >= len) return;
    const int n = min(GDN_C, len - c0), r0 = start + c0;
    const int nb = (n + 15) >> 4;  // 16-token blocks in play; rows past n are zeros
    const int rows = nb * 16;
    const int kh = h / (hv / hk);
    const int mtu = dvp >> 4, mtall = mtu + (dkp >> 4);
    const int per = (mtall + nslice - 1) / nslice;
    const int mlo = sl * per, mhi = min(mlo + per, mtall);
    if (mlo >= mtall) return;  // an empty slice (the launcher avoids them)
    const bool doq = sl == 0, dov = mlo < mtu;

    // Q, K, V of the chunk: every copy in flight at once.
    const float* row0 = qkv + (idx_t)r0 * ld;
    const bool vec = (ld & 3) == 0 && (dk & 3) == 0 && (dv & 3) == 0 && ((size_t)qkv & 15) == 0;
    gtp_load(Ks, lk, row0 + hk * dk + kh * dk, ld, n, rows, dk, dkp, vec);
    if (doq) gtp_load(Qs, lk, row0 + kh * dk, ld, n, rows, dk, dkp, vec);
    if (dov) gtp_load(Vs, lv, row0 + 2 * hk * dk + h * dv, ld, n, rows, dv, dvp, vec);
    tc_commit();
    if (tid < GDN_C) {
        float gv = 0.0f, bv = 0.0f;
        if (tid < n) {
            idx_t r = (idx_t)(r0 + tid) * hv + h;
            gv = g[r];
            bv = beta[r];
        }
        gs[tid] = gv;
        bet[tid] = bv;
    }
    __syncthreads();
    // Cumulative log decay, thread t summing g_0..g_t in order (gdn_wy_prep's and the CPU's order), under the loads.
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
    tc_wait<0>();
    __syncthreads();
    if (doq && tid < n) {
        idx_t r = (idx_t)(r0 + tid) * hv + h;
        E[2 * r + 1] = expf(gam[n - 1] - gam[tid]);
    }

    // K·Kᵀ (and Q·Kᵀ): warp (rb, half) owns rows 16rb..16rb+15, columns 32half..32half+31 as four n8 tiles; only
    // the tiles on or below the diagonal block and left of token n are multiplied.
    const int rb = warp >> 1, half = warp & 1;
    float ak[4][4], aq[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) ak[j][e] = aq[j][e] = 0.0f;
    if (rb < nb) {
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
            for (int j = 0; j < 4; j++) {
                const int nt = 4 * half + j;
                if (nt <= 2 * rb + 1 && 8 * nt < n) {
                    const int rbk = (8 * nt + gq) * lk + k0 + tq;
                    const float b0 = Ks[rbk], b1 = Ks[rbk + 4];
                    gtp_mma3<X3>(ak[j], kb, kl, b0, b1);
                    if (doq) gtp_mma3<X3>(aq[j], qb, ql, b0, b1);
                }
            }
        }
    }
    // Masks and decays: -A into registers (S overwrites Q, which other warps may still read), M to the scratch.
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int a = 16 * rb + gq + 8 * (e >> 1), b = 8 * (4 * half + j) + 2 * tq + (e & 1);
            const bool low = a < n && b <= a;
            const float dcy = low ? expf(gam[a] - gam[b]) : 0.0f;
            if (doq && a < n) M[((idx_t)(r0 + a) * hv + h) * GDN_C + b] = low ? aq[j][e] * dcy : 0.0f;
            ak[j][e] = (low && b < a) ? -(bet[a] * ak[j][e] * dcy) : 0.0f;
        }
    __syncthreads();
    if (rb < nb) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int nt = 4 * half + j;
            if (nt <= 2 * rb + 1) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    Sm[(16 * rb + gq + 8 * (e >> 1)) * GTP_LS + 8 * nt + 2 * tq + (e & 1)] = ak[j][e];
            }
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
    for (int mt = mlo + warp; mt < mhi; mt += 8) {
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
                        const float2 b =
                            *(const float2*)&Sm[(16 * k + 8 * nt + gq) * GTP_LS + 16 * k + 8 * ks + 2 * tq];
                        gtp_mma3<X3>(out[nt], yb[ks], ys[ks], b.x, b.y);
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
                                const float2 b =
                                    *(const float2*)&Sm[(16 * i + 8 * nt + gq) * GTP_LS + 16 * k + 8 * ks + 2 * tq];
                                gtp_mma3<X3>(Y[i][nt], yb[ks], ys[ks], b.x, b.y);
                            }
                    }
                }
            }
        }
    }
}

#define GDN_TC_PREP(NAME, X3)                                                                                        \
    KERNEL(NAME) void __launch_bounds__(256, 2)                                                                      \
        NAME(const float* __restrict__ qkv, int ld, const float* __restrict__ g, const float* __restrict__ beta,     \
             const int* seg, int hk, int hv, int dk, int dv, int nslice, float* __restrict__ U,                      \
             float* __restrict__ W, float* __restrict__ M, float* __restrict__ E) {                                  \
        extern __shared__ float sm[];                                                                                \
        gdn_tc_prep_t<X3>(qkv, ld, g, beta, seg, hk, hv, dk, dv, nslice, U, W, M, E, sm);                            \
    }
GDN_TC_PREP(gdn_tc_prep, true)
GDN_TC_PREP(gdn_tc_prep_tf32, false)
#undef GDN_TC_PREP
#undef GTP_LS

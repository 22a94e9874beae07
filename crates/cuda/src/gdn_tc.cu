// Gated DeltaNet on tensor cores (mma.sync): see the functions below.
//
// gdn_tc_state_{8,16,32,64}: the state pass of the WY-form chunked gated delta rule (the tensor-core twin of
// gdn_wy_state in kernels.cu: same scratch from gdn_wy_prep, same outputs). Per (value head h, segment s, slice of
// BV value columns j0..j0+BV) the block carries S = state[h][:, j0:j0+BV] ([dk, BV], f32) through the segment's
// chunks of GDN_C = 64 tokens; per chunk of n tokens (rows r0..r0+n):
//   v' = U - W S                                  [64, BV]  (k = dk)
//   o  = e^gam (Q S) + M v'                       [64, BV]  (k = dk, then k = 64, M lower triangular)
//   S <- e^gam_last S + K^T (e^(gam_last - gam) v')   [dk, BV]  (k = n)
// Every product runs on mma.sync.m16n8k8 TF32 with the 3xTF32 split (x = big + small, both TF32; acc += a_big b_big
// into one accumulator, a_big b_small + a_small b_big into a second, summed in f32 at the end), which keeps the
// products at f32 accuracy (the dropped small*small term is below 2^-22 relative); S itself stays f32. The _tf32
// kernels run one TF32 product per step instead (operands rounded to 2^-11 relative, f32 accumulation; S still f32
// between chunks): the precision the model picks for the kernels (crate::model::TcArith).
//
// Why this shape:
// - Block = 8 warps. Warps 0-3 own the 16-row tiles of v' (rows 16w..16w+15 of W S), warps 4-7 those of o (Q S,
//   then + M v' on the same rows): both halves share the B operand S and run at once. In the update, warp w owns S
//   rows 16w..16w+15 (dk <= 128) as mma C fragments in registers across the whole segment; after each update it
//   mirrors them into shared memory, transposed (Sᵀ), the B operand of the next chunk's W S and Q S.
// - Shared memory: the chunk's W, Q, K, M tiles (cp.async, 16 bytes when aligned, zero-filled past n rows and dk
//   columns so padded products add exact zeros; rows of 128 floats by unrolled copies whose only guard is the
//   chunk's length), v' and e^(gam_last - gam) v' (the B operands of M v' and of the update; scaling v' instead of
//   K leaves K as loaded), and S. Fragments come by ldmatrix.x4 (32-bit values as pairs of 16-bit ones): A from the
//   row-major W, Q, M tiles (one instruction for a0..a3), B from the transposes v'ᵀ, (e v')ᵀ and Sᵀ, which the
//   warps store transposed instead of row-major (one instruction for b0, b1 of two n tiles); only the update's A,
//   Kᵀ read down K's columns, takes four plain loads. Row pitches are 4 mod 32 words (K's 8 mod 32), so every
//   ldmatrix row, plain fragment load and transposed store falls on distinct banks. The 1xTF32 kernels store v',
//   e v' and S rounded to TF32 (they are read only as B operands; S itself stays f32 in the update's registers),
//   so their fragments need no rounding. U and the decays go from global memory into registers, pairs of columns
//   per 8-byte load where aligned.
// - Two barriers per chunk, loads overlapped: a chunk's M and K stream in during the W S / Q S products before
//   they are needed; its W and Q during the whole chunk before it (BV <= 16, two W, Q buffers: 1 x 3,400 tokens
//   at 1xTF32 217.9 -> 202.2 µs on an H100) or during the M v' and update products before it (wider slices, whose
//   shared memory holds one pair). The update accumulates K^T v' from zero and adds e^gam_last S in f32 (no long
//   accumulation chains inside the tensor cores' adder).
// - The same products in the same order, on the same TF32 values, as the form with plain fragment loads and
//   row-major tiles it replaced (so the same bits). Measured on an H100 (0.8B heads, 1xTF32, the
//   launcher's slice): 1 x 3,400 tokens 235.4 -> 217.2 µs, 1 x 175 17.5 -> 15.7; Nsight Compute on a 3,691-row
//   request: 4.23 -> 6.60 cycles between a warp's instructions, so the pass waits on latencies more than it issues.
// - Grid (hv, ceil(dv / BV), nseg), BV in {8, 16, 32, 64} chosen by the launcher (gdn_tc.rs) so small batches
//   still fill the multiprocessors; one block per multiprocessor (200 KB of shared memory at dk = 128, BV = 16, with
//   its two W, Q buffers; 184 KB at BV = 64).
// Needs dk <= 128 (the launcher returns Unsupported otherwise). dk, dv, chunk lengths: anything (padding).

static_assert(GDN_C == 64, "gdn_tc_state assumes chunks of 64 tokens");

// 3xTF32 (X3): hi += a_big b_big; lo += a_big b_small + a_small b_big. 1xTF32 (!X3): hi += a_big b_big only (the
// small halves, computed by the fragment loads, are then dead code).
template <bool X3>
__device__ __forceinline__ void gtc_mma3(float (&hi)[4], float (&lo)[4], const unsigned (&ab)[4],
                                         const unsigned (&as)[4], const unsigned (&bb)[2], const unsigned (&bs)[2]) {
    tc_mma(hi, ab, bb[0], bb[1]);
    if (X3) {
        tc_mma(lo, ab, bs[0], bs[1]);
        tc_mma(lo, as, bb[0], bb[1]);
    }
}
// An A fragment from a row-major tile: p points at element (g, t) of the 16x8 block, ld its row stride.
__device__ __forceinline__ void gtc_frag_a_row(const float* p, int ld, unsigned (&ab)[4], unsigned (&as)[4]) {
    tc_split(p[0], ab[0], as[0]);
    tc_split(p[8 * ld], ab[1], as[1]);
    tc_split(p[4], ab[2], as[2]);
    tc_split(p[8 * ld + 4], ab[3], as[3]);
}
// A B fragment from a row-major [k][n] tile: p points at element (k t, n g), ld its row stride.
__device__ __forceinline__ void gtc_frag_b(const float* p, int ld, unsigned (&bb)[2], unsigned (&bs)[2]) {
    tc_split(p[0], bb[0], bs[0]);
    tc_split(p[4 * ld], bb[1], bs[1]);
}
// (hi, lo) += A B over the k steps 0, 8, .. below kend: A's rows (g, g + 8) of a row-major tile, a at its element
// (g, t), row stride lda; B a row-major [k][n] tile, b at its element (k t, n g), row stride LDB, NT n tiles of 8
// columns. The k loop unrolled U times.
template <int NT, int U, int LDB, bool X3>
__device__ __forceinline__ void gtc_rows_mma(float (&hi)[NT][4], float (&lo)[NT][4], const float* a, int lda,
                                             const float* b, int kend) {
#pragma unroll U
    for (int kk = 0; kk < kend; kk += 8) {
        unsigned ab[4], as[4];
        gtc_frag_a_row(a + kk, lda, ab, as);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            unsigned bb[2], bs[2];
            gtc_frag_b(b + kk * LDB + nt * 8, LDB, bb, bs);
            gtc_mma3<X3>(hi[nt], lo[nt], ab, as, bb, bs);
        }
    }
}

// dst[t * ldd + c] = src[t * lds + c] for t < n, c < ws; zero for the rest of t < GDN_C, c < wd (cp.async, the
// caller commits and waits). vec: 16-byte copies (src, lds and ws multiples of 4 floats, wd too); else 4-byte.
// A thread copies one 16-byte (4-byte) column of every (256 / columns)-th row: one division per tile.
__device__ __forceinline__ void gtc_tile(float* dst, int ldd, const float* src, idx_t lds, int n, int ws, int wd,
                                         bool vec) {
    const int e = vec ? 4 : 1, q = wd / e, step = blockDim.x / q;
    const int t0 = threadIdx.x / q, c = (threadIdx.x - t0 * q) * e;
    if (t0 >= step) return;
    const bool cok = c < ws;
    float* d = dst + t0 * ldd + c;
    const float* p = src + (idx_t)t0 * lds + c;
    const idx_t sstep = (idx_t)step * lds;
    for (int t = t0; t < GDN_C; t += step, d += step * ldd, p += sstep) {
        bool ok = cok && t < n;
        if (vec) tc_cp16(d, ok ? p : src, ok ? 16 : 0);
        else tc_cp4(d, ok ? p : src, ok ? 4 : 0);
    }
}

// Row stride (floats) of a [*, BV] tile read down its columns by fragments: 8 * odd, so the four k rows of a
// fragment load fall in four distinct groups of 8 banks.
template <int BV>
struct GtcLd {
    static constexpr int v = ((BV + 8) / 8) % 2 ? BV + 8 : BV + 16;
};

// Columns j0..j0+w-1 of the [dk, dv] state at Si into Ss [dkp][LDV] by cp.async (the caller commits and waits),
// zero-filled past dk rows and w columns; 16-byte copies when the rows allow.
template <int BV, int LDV>
__device__ __forceinline__ void gtc_state_slice(float* Ss, const float* Si, int dk, int dkp, int dv, int j0, int w) {
    if ((dv & 3) == 0 && ((size_t)Si & 15) == 0) {
        constexpr int Q4 = BV / 4;
        for (int i = threadIdx.x; i < dkp * Q4; i += blockDim.x) {
            const int c = i / Q4, j = (i - c * Q4) * 4;
            const int bytes = c < dk ? 4 * max(0, min(4, w - j)) : 0;
            tc_cp16(Ss + c * LDV + j, bytes ? Si + (idx_t)c * dv + j0 + j : Si, bytes);
        }
    } else {
        for (int i = threadIdx.x; i < dkp * BV; i += blockDim.x) {
            const int c = i / BV, j = i - c * BV;
            const bool ok = c < dk && j < w;
            tc_cp4(Ss + c * LDV + j, ok ? Si + (idx_t)c * dv + j0 + j : Si, ok ? 4 : 0);
        }
    }
}

// The 16-byte columns of a tile whose rows are WD floats wide in memory and in shared memory (ws == wd == WD of
// gtc_tile, 16-byte copies, 256 threads): every copy's row and column known at compile time but for the t < n
// guard (gtc_tile's general loop spent about ten instructions a copy on its guards and addresses).
template <int WD>
__device__ __forceinline__ void gtc_tile_full(float* dst, int ldd, const float* src, idx_t lds, int n) {
    constexpr int Q = WD / 4, STEP = 256 / Q;
    static_assert(256 % Q == 0 && GDN_C % STEP == 0, "gtc_tile_full: rows must split evenly over 256 threads");
    const int t0 = threadIdx.x / Q, c = (threadIdx.x % Q) * 4;
    const unsigned d = tc_smem_addr(dst + t0 * ldd + c);
    const float* p = src + (idx_t)t0 * lds + c;
    const idx_t sstep = (idx_t)STEP * lds;
#pragma unroll
    for (int i = 0; i < GDN_C / STEP; i++) {
        const bool ok = t0 + i * STEP < n;
        tc_cp16(d + (unsigned)(i * STEP * ldd * 4), ok ? p + i * sstep : src, ok ? 16 : 0);
    }
}

// The TF32 operand(s) of a raw f32 (its bits): X3, big and small (tc_split); else big rounded to TF32, or taken as
// it is where the value was stored already rounded (ROUNDED).
template <bool X3, bool ROUNDED>
__device__ __forceinline__ void gtc_op(unsigned raw, unsigned& big, unsigned& small) {
    if (X3) tc_split(__uint_as_float(raw), big, small);
    else big = ROUNDED ? raw : tc_tf32_bits(raw);
}
// What the state pass stores of a value that is read again only as a product's B operand: X3 keeps it (split at
// the load), 1xTF32 rounds it to TF32 once here instead of at each of the fragment loads that read it.
template <bool X3>
__device__ __forceinline__ float gtc_store_op(float x) {
    return X3 ? x : __uint_as_float(tc_tf32(x));
}

// Two n tiles' products of one k step: B's (b0, b1) of the first in bb[0..1], of the second in bb[2..3] (the
// register order of one ldmatrix.x4 over the transpose, below).
template <bool X3>
__device__ __forceinline__ void gtc_mma_pair(float (&h0)[4], float (&l0)[4], float (&h1)[4], float (&l1)[4],
                                             const unsigned (&ab)[4], const unsigned (&as)[4],
                                             const unsigned (&bb)[4], const unsigned (&bs)[4]) {
    const unsigned b0[2] = {bb[0], bb[1]}, s0[2] = {bs[0], bs[1]}, b1[2] = {bb[2], bb[3]}, s1[2] = {bs[2], bs[3]};
    gtc_mma3<X3>(h0, l0, ab, as, b0, s0);
    gtc_mma3<X3>(h1, l1, ab, as, b1, s1);
}

// The products of one k step (kk) with A's fragments (ab, as) given and B from its TRANSPOSE ([n][k], row pitch
// ldt floats): one ldmatrix.x4 at this lane's address bt (row (lane & 7) + 8 (lane >> 4), column 4 ((lane >> 3) &
// 1)) gives b0 and b1 of two n tiles; an odd last tile is read by plain loads from tb, the transpose at this lane's
// (n g, k t). B's values are stored as gtc_store_op left them.
template <int NT, bool X3>
__device__ __forceinline__ void gtc_step_bt(float (&hi)[NT][4], float (&lo)[NT][4], const unsigned (&ab)[4],
                                            const unsigned (&as)[4], unsigned bt, const float* tb, int ldt, int kk) {
#pragma unroll
    for (int p = 0; p < NT / 2; p++) {
        unsigned br[4], bb[4], bs[4];
        tc_ldsm4<false>(bt + (unsigned)(p * 16 * ldt + kk) * 4u, br);
#pragma unroll
        for (int i = 0; i < 4; i++) gtc_op<X3, true>(br[i], bb[i], bs[i]);
        gtc_mma_pair<X3>(hi[2 * p], lo[2 * p], hi[2 * p + 1], lo[2 * p + 1], ab, as, bb, bs);
    }
    if (NT % 2) {
        const float* q = tb + (NT - 1) * 8 * ldt + kk;
        unsigned bb[2], bs[2];
        gtc_op<X3, true>(__float_as_uint(q[0]), bb[0], bs[0]);
        gtc_op<X3, true>(__float_as_uint(q[4]), bb[1], bs[1]);
        gtc_mma3<X3>(hi[NT - 1], lo[NT - 1], ab, as, bb, bs);
    }
}

// (hi, lo) += A B over the k steps 0, 8, .. below kend, both operands by ldmatrix: A the 16 rows of a row-major
// tile at this lane's address aa (bytes: row (lane & 7) + 8 ((lane >> 3) & 1), column 4 (lane >> 4) of the
// rows' first 8 columns; one ldmatrix.x4 gives a0..a3), B from its transpose as gtc_step_bt reads it. The k loop
// unrolled U times; the same products in the same order as gtc_rows_mma on the untransposed tiles.
template <int NT, int U, bool X3>
__device__ __forceinline__ void gtc_rows_mma_ld(float (&hi)[NT][4], float (&lo)[NT][4], unsigned aa, unsigned bt,
                                                const float* tb, int ldt, int kend) {
#pragma unroll U
    for (int kk = 0; kk < kend; kk += 8) {
        unsigned ar[4], ab[4], as[4];
        tc_ldsm4<false>(aa + kk * 4u, ar);
#pragma unroll
        for (int i = 0; i < 4; i++) gtc_op<X3, false>(ar[i], ab[i], as[i]);
        gtc_step_bt<NT, X3>(hi, lo, ab, as, bt, tb, ldt, kk);
    }
}

// Pitch (floats) of the transposed [BV][64] tiles of v' and e v': 4 mod 32, so the rows of an ldmatrix and a
// warp's column stores fall on distinct banks.
#define GTC_LDT (GDN_C + 4)

// Shared memory (floats), in this order: W, Q [64][kp8 + 4]; K [64][dkp + 8]; M [64][68]; v'ᵀ, (e v')ᵀ [BV][68];
// Sᵀ [BV][dkp + 4] (kp8, dkp: dk rounded up to 8, 16); at BV <= 16 a second W, Q pair [64][kp8 + 4] (the odd
// chunks'). The state slice arrives row-major [dkp][BV] over v'ᵀ onwards. Must match gdn_tc_smem in gdn_tc.rs.
template <int BV, bool X3>
__device__ __forceinline__ void gdn_tc_state_t(const float* __restrict__ qkv, int ld, const float* __restrict__ U,
                                               const float* __restrict__ W, const float* __restrict__ M,
                                               const float* __restrict__ E, float* __restrict__ out, const int* seg,
                                               const u64* states, const u64* init, int keep, int hk, int hv, int dk,
                                               int dv, int vec, float* sm) {
    constexpr int NT = BV / 8;  // n tiles of 8 value columns
    constexpr int LDM = GDN_C + 4;
    // k steps unrolled in the three products at BV <= 16 so that the next steps' fragment loads and splits issue
    // under this step's mma (H200, 0.8B heads: 3,400 tokens at BV 16 326.5 -> 307.5 µs, 175 tokens 22.7 -> 21.1;
    // at BV 32 and 64, whose wider accumulators already give each step independent mma, it gained nothing).
    constexpr int UNROLL = BV <= 16 ? 4 : 1;
    // Two W and Q buffers where shared memory allows them (BV <= 16: 191 / 200 KB at dk = 128): the next chunk's W
    // and Q then stream in during a whole chunk instead of during M v' and the update only.
    constexpr bool DB = BV <= 16;
    const int kp8 = (dk + 7) & ~7, dkp = (dk + 15) & ~15;
    const int ldx = kp8 + 4, ldk = dkp + 8, lds = dkp + 4;
    float* Wt = sm;                  // [C, ldx]   W of the chunk
    float* Qt = Wt + GDN_C * ldx;    // [C, ldx]   Q
    float* Kt = Qt + GDN_C * ldx;    // [C, ldk]   K
    float* Mt = Kt + GDN_C * ldk;    // [C, LDM]   M
    float* Vt = Mt + GDN_C * LDM;    // [BV, LDT]  v'ᵀ
    float* Et = Vt + BV * GTC_LDT;   // [BV, LDT]  (e^(gam_last - gam) v')ᵀ
    float* St = Et + BV * GTC_LDT;   // [BV, lds]  Sᵀ (k columns past dk and rows past w stay zero)
    float* Ss = Vt;                  // [dkp, BV]  the state slice as it arrives, before the loop
    float* Wt1 = St + BV * lds;      // [C, ldx]   W of the odd chunks (DB)
    float* Qt1 = Wt1 + GDN_C * ldx;  // [C, ldx]   Q of the odd chunks (DB)

    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, tg = lane & 3;
    // Segment-major blocks (a segment's slices launched together): a tree's longer child, two chunks among
    // one-chunk siblings, is not split over the first and a later wave of blocks (run s12h, the bench's suffixes 7 x
    // 23..66 at 64 columns: 38.2 -> 29.8 µs).
    const int h = blockIdx.x, j0 = blockIdx.y * BV, s = blockIdx.z, w = min(BV, dv - j0);
    const int start = seg[3 * s], len = seg[3 * s + 1];
    // keep 2: as 0, and a segment of at most one chunk is the leaf pass's (a batch-invariant tree's short children).
    if (keep == 2 && len <= GDN_C) return;  // the whole block
    keep = keep == 1;
    const int kh = h / (hv / hk);
    const bool vecb = vec != 0;
    // Rows of 128 floats (the Qwen3.5 heads): W, Q and K tiles by the unrolled copies; M's rows are always 64.
    const bool full = vecb && dk == 128;
    // Pairs of value columns in one 8-byte load or store: U and out rows of even length, 8-byte aligned.
    const bool pairs = (dv & 1) == 0 && (((size_t)U | (size_t)out) & 7) == 0;
    float* Sg = (float*)states[s] + (idx_t)h * dk * dv;
    const float* Si = (const float*)init[s] + (idx_t)h * dk * dv;  // states[s], or a parent's (forward_tree)
    const float* Qg = qkv + kh * dk;
    const float* Kg = qkv + hk * dk + kh * dk;
    const idx_t ldw = (idx_t)hv * dk, ldmg = (idx_t)hv * GDN_C;
    // The W and Q tiles of the chunk of nr rows from row r into Wb and Qb (the caller commits).
    const auto wq_tiles = [&](float* Wb, float* Qb, int r, int nr) {
        if (full) {
            gtc_tile_full<128>(Wb, ldx, W + ((idx_t)r * hv + h) * dk, ldw, nr);
            gtc_tile_full<128>(Qb, ldx, Qg + (idx_t)r * ld, ld, nr);
        } else {
            gtc_tile(Wb, ldx, W + ((idx_t)r * hv + h) * dk, ldw, nr, dk, kp8, vecb);
            gtc_tile(Qb, ldx, Qg + (idx_t)r * ld, ld, nr, dk, kp8, vecb);
        }
    };

    // The state slice, asynchronously with the first W and Q tiles (a plain copy loop waited out one global load
    // per iteration: several µs per block, most of a one-chunk segment's time). 16-byte copies when the rows
    // allow, zero-filled past dk rows and w columns.
    gtc_state_slice<BV, BV>(Ss, Si, dk, dkp, dv, j0, w);
    if (len > 0) wq_tiles(Wt, Qt, start, min(GDN_C, len));
    tc_commit();  // S (and W, Q)
    if (len > 0) {
        int n = min(GDN_C, len);
        if (DB) {
            if (len > GDN_C) wq_tiles(Wt1, Qt1, start + GDN_C, min(GDN_C, len - GDN_C));
            tc_commit();  // the second chunk's W and Q
        }
        if (vecb) gtc_tile_full<GDN_C>(Mt, LDM, M + ((idx_t)start * hv + h) * GDN_C, ldmg, n);
        else gtc_tile(Mt, LDM, M + ((idx_t)start * hv + h) * GDN_C, ldmg, n, GDN_C, GDN_C, vecb);
        if (full) gtc_tile_full<128>(Kt, ldk, Kg + (idx_t)start * ld, ld, n);
        else gtc_tile(Kt, ldk, Kg + (idx_t)start * ld, ld, n, dk, dkp, vecb);
        tc_commit();
        tc_wait<DB ? 2 : 1>();  // S, W, Q
    } else {
        tc_wait<0>();  // S
    }
    __syncthreads();

    // This warp's rows of S in the update (C fragments, kept across chunks): rows sm0 + g, sm0 + g + 8; into Sᵀ
    // (as gtc_store_op stores it) once every warp has read the slice, which Sᵀ overlaps.
    const int sm0 = 16 * wp;
    const bool sown = sm0 < dkp;
    float sacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int col = nt * 8 + 2 * tg;
#pragma unroll
        for (int i = 0; i < 4; i++) sacc[nt][i] = sown ? Ss[(sm0 + g + (i >> 1) * 8) * BV + col + (i & 1)] : 0.0f;
    }
    __syncthreads();
    if (sown) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                St[(nt * 8 + 2 * tg + (i & 1)) * lds + sm0 + g + (i >> 1) * 8] = gtc_store_op<X3>(sacc[nt][i]);
    }
    __syncthreads();

    // Rows of W S (warps 0-3, v') or Q S (warps 4-7, o) of this warp: m0 + g and m0 + g + 8.
    const bool vwarp = wp < 4;
    const int m0 = 16 * (wp & 3), ra = m0 + g, rb = m0 + g + 8;
    // This lane's ldmatrix addresses (bytes): A rows of W or Q and of M, B rows of Sᵀ, v'ᵀ, (e v')ᵀ.
    const int arow = m0 + (lane & 7) + ((lane >> 3) & 1) * 8, acol = (lane >> 4) * 4;
    const int brow = (lane & 7) + (lane >> 4) * 8, bcol = ((lane >> 3) & 1) * 4;
    const unsigned xa0 = tc_smem_addr((vwarp ? Wt : Qt) + arow * ldx + acol);
    const unsigned xa1 = tc_smem_addr((vwarp ? Wt1 : Qt1) + arow * ldx + acol);
    const unsigned ma = tc_smem_addr(Mt + arow * LDM + acol);
    const unsigned sbt = tc_smem_addr(St + brow * lds + bcol);
    const unsigned vbt = tc_smem_addr(Vt + brow * GTC_LDT + bcol);
    const unsigned ebt = tc_smem_addr(Et + brow * GTC_LDT + bcol);
    for (int c0 = 0; c0 < len; c0 += GDN_C) {
        const int n = min(GDN_C, len - c0), r0 = start + c0;
        const bool more = c0 + GDN_C < len;
        const bool odd = DB && ((c0 / GDN_C) & 1);  // this chunk's W and Q in the second buffer
        // From global memory, before the products: e^(gam_last - gam) (v' warps) or e^gam (o warps) of rows ra, rb,
        // e^gam_last, and U (v' warps). Zero past n rows and w columns.
        const int esel = vwarp ? 1 : 0;
        const float ea = ra < n ? E[2 * ((idx_t)(r0 + ra) * hv + h) + esel] : 0.0f;
        const float eb = rb < n ? E[2 * ((idx_t)(r0 + rb) * hv + h) + esel] : 0.0f;
        const float el = E[2 * ((idx_t)(r0 + n - 1) * hv + h)];
        // This lane's U and out elements: rows ra (rb = ra + 8), columns nt * 8 + 2 tg (+ 1).
        const idx_t rowa = ((idx_t)(r0 + ra) * hv + h) * dv + j0 + 2 * tg, row8 = (idx_t)8 * hv * dv;
        float u[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int col = nt * 8 + 2 * tg;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const bool rok = vwarp && (hf ? rb : ra) < n;
                const float* p = U + rowa + hf * row8 + nt * 8;
                if (pairs) {
                    const float2 x = rok && col < w ? *(const float2*)p : make_float2(0.0f, 0.0f);
                    u[nt][2 * hf] = x.x;
                    u[nt][2 * hf + 1] = x.y;
                } else {
                    u[nt][2 * hf] = rok && col < w ? p[0] : 0.0f;
                    u[nt][2 * hf + 1] = rok && col + 1 < w ? p[1] : 0.0f;
                }
            }
        }
        float hi[NT][4], lo[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) hi[nt][i] = lo[nt][i] = 0.0f;
        // W S (warps 0-3) and Q S (warps 4-7), k over dk.
        if (m0 < n) gtc_rows_mma_ld<NT, UNROLL, X3>(hi, lo, odd ? xa1 : xa0, sbt, St + g * lds + tg, lds, kp8);
        if (vwarp) {
            // v' = U - W S (rows past n: exactly zero, as W and U are zero there), and e^(gam_last - gam) v', both
            // transposed.
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = i < 2 ? ra : rb, col = nt * 8 + 2 * tg + (i & 1);
                    float v = u[nt][i] - (hi[nt][i] + lo[nt][i]);
                    Vt[col * GTC_LDT + r] = gtc_store_op<X3>(v);
                    Et[col * GTC_LDT + r] = gtc_store_op<X3>((i < 2 ? ea : eb) * v);
                }
            }
        } else {
            // e^gam Q S, kept in u (dead in these warps) until M v' is added.
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) u[nt][i] = (i < 2 ? ea : eb) * (hi[nt][i] + lo[nt][i]);
        }
        tc_wait<0>();     // this chunk's M and K (and with two buffers the next chunk's W and Q, issued earlier)
        __syncthreads();  // v' visible; W and Q tiles free
        // The W and Q tiles of the chunk after the next (two buffers: into the one this chunk's products freed), or
        // of the next one.
        const int ahead = DB ? 2 * GDN_C : GDN_C;
        if (c0 + ahead < len) {
            wq_tiles(odd ? Wt1 : Wt, odd ? Qt1 : Qt, r0 + ahead, min(GDN_C, len - c0 - ahead));
        }
        tc_commit();
        // o = e^gam Q S + M v' (warps 4-7): M[t][b] is zero for b > t, so k stops at the tile's last row.
        if (!vwarp && m0 < n) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) hi[nt][i] = lo[nt][i] = 0.0f;
            const int kend = min(m0 + 16, (n + 7) & ~7);
            gtc_rows_mma_ld<NT, UNROLL, X3>(hi, lo, ma, vbt, Vt + g * GTC_LDT + tg, GTC_LDT, kend);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int col = nt * 8 + 2 * tg;
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float* p = out + rowa + hf * row8 + nt * 8;
                    const float x = u[nt][2 * hf] + (hi[nt][2 * hf] + lo[nt][2 * hf]);
                    const float y = u[nt][2 * hf + 1] + (hi[nt][2 * hf + 1] + lo[nt][2 * hf + 1]);
                    if ((hf ? rb : ra) < n) {
                        if (pairs) {
                            if (col < w) *(float2*)p = make_float2(x, y);
                        } else {
                            if (col < w) p[0] = x;
                            if (col + 1 < w) p[1] = y;
                        }
                    }
                }
            }
        }
        // S <- e^gam_last S + K^T (e v'): this warp's 16 rows of S, k over the chunk's tokens. A = K^T, read down
        // K's columns: a0 = K[k t][row g], a1 = K[k t][row g+8], a2 = K[k t+4][row g], a3 = K[k t+4][row g+8]; B
        // from (e v')ᵀ by ldmatrix. Not after the last chunk of a state nobody keeps (keep = 0).
        if (sown && (more || keep)) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) hi[nt][i] = lo[nt][i] = 0.0f;
            const int kend = (n + 7) & ~7;
            const float* ka = Kt + tg * ldk + sm0 + g;
            const float* et = Et + g * GTC_LDT + tg;
#pragma unroll UNROLL
            for (int kk = 0; kk < kend; kk += 8) {
                const float* p = ka + kk * ldk;
                unsigned ab[4], as[4];
                tc_split(p[0], ab[0], as[0]);
                tc_split(p[8], ab[1], as[1]);
                tc_split(p[4 * ldk], ab[2], as[2]);
                tc_split(p[4 * ldk + 8], ab[3], as[3]);
                gtc_step_bt<NT, X3>(hi, lo, ab, as, ebt, et, GTC_LDT, kk);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = sm0 + g + (i >> 1) * 8, col = nt * 8 + 2 * tg + (i & 1);
                    sacc[nt][i] = fmaf(el, sacc[nt][i], hi[nt][i] + lo[nt][i]);
                    St[col * lds + r] = gtc_store_op<X3>(sacc[nt][i]);
                }
            }
        }
        tc_wait<DB ? 1 : 0>();  // the next chunk's W and Q (two buffers: the ones issued in the chunk before)
        __syncthreads();  // ... and the new S visible; M and K tiles free
        if (more) {
            int nn = min(GDN_C, len - c0 - GDN_C), rn = r0 + GDN_C;
            if (vecb) gtc_tile_full<GDN_C>(Mt, LDM, M + ((idx_t)rn * hv + h) * GDN_C, ldmg, nn);
            else gtc_tile(Mt, LDM, M + ((idx_t)rn * hv + h) * GDN_C, ldmg, nn, GDN_C, GDN_C, vecb);
            if (full) gtc_tile_full<128>(Kt, ldk, Kg + (idx_t)rn * ld, ld, nn);
            else gtc_tile(Kt, ldk, Kg + (idx_t)rn * ld, ld, nn, dk, dkp, vecb);
        }
        tc_commit();
    }
    if (sown && keep) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = sm0 + g + (i >> 1) * 8, col = nt * 8 + 2 * tg + (i & 1);
                if (r < dk && col < w) Sg[(idx_t)r * dv + j0 + col] = sacc[nt][i];
            }
        }
    }
}
#undef GTC_LDT

// State pass on tensor cores, BV value columns per block. grid (hv, ceil(dv / BV), nseg), block 256, dynamic shared
// memory from gdn_tc_smem (gdn_tc.rs). Arguments as gdn_wy_state's, plus init (init[s]: where segment s's state is
// read from; states[s] itself, or the state of the parent segment it continues, written by an earlier launch), keep
// (0: the states after the segments are not needed: neither the last chunk's update nor the write-back runs; 2: as
// 0, and segments of at most one chunk are skipped, left to gdn_tc_leaf) and
// vec (1: 16-byte tile copies are aligned). gdn_tc_state_<BV>: 3xTF32 products; gdn_tc_state_<BV>_tf32: 1xTF32
// (each operand rounded to TF32 once, a third of the mma and none of the small halves' splits).
#define GDN_TC_STATE(BV, NAME, X3)                                                                                   \
    KERNEL(NAME) void __launch_bounds__(256, 1) NAME(                                                                \
        const float* __restrict__ qkv, int ld, const float* __restrict__ U, const float* __restrict__ W,             \
        const float* __restrict__ M, const float* __restrict__ E, float* __restrict__ out, const int* seg,           \
        const u64* states, const u64* init, int keep, int hk, int hv, int dk, int dv, int vec) {                     \
        extern __shared__ float sm[];                                                                                \
        gdn_tc_state_t<BV, X3>(qkv, ld, U, W, M, E, out, seg, states, init, keep, hk, hv, dk, dv, vec, sm);          \
    }
GDN_TC_STATE(8, gdn_tc_state_8, true)
GDN_TC_STATE(16, gdn_tc_state_16, true)
GDN_TC_STATE(32, gdn_tc_state_32, true)
GDN_TC_STATE(64, gdn_tc_state_64, true)
GDN_TC_STATE(8, gdn_tc_state_8_tf32, false)
GDN_TC_STATE(16, gdn_tc_state_16_tf32, false)
GDN_TC_STATE(32, gdn_tc_state_32_tf32, false)
GDN_TC_STATE(64, gdn_tc_state_64_tf32, false)
#undef GDN_TC_STATE

// gdn_tc_leaf_{32,64,128}: the state pass of segments of one chunk (at most GDN_C tokens) whose states nobody keeps (a
// tree's children, CudaModel::forward_tree with keep = 0; the launcher holds callers to both): per segment
//   o = e^gam (Q S0) + M (U - W S0)
// with S0 the state it starts from (init[s]): no update, no K, no write-back. The fused pass above runs them with
// one block per multiprocessor, W S and Q S on different warps and M v' on half of them (7 suffixes of 33 tokens of
// the 0.8B heads: 21.9 µs at its slice of 64 columns). Here warp w owns rows 16 (w & 3) .. + 15 and value columns
// (w >> 2) BV / 2 .. + BV / 2 - 1 of the block's slice, and computes W S0, Q S0 and M v' for them, so every warp has
// the same work and no barrier waits on a longer half; and the slice is wide (up to all 128 value columns), so the
// chunk's W, Q and M tiles are read by fewer blocks (7 x 33: 20.0 / 18.9 / 15.7 µs at BV 32 / 64 / 128; 16 columns,
// two blocks per multiprocessor, 25.9). Shared memory (floats): W, Q [64][kp8 + 4]; M [64][68]; S0 [dkp][LDV]; v'
// [64][LDV] (185 KB at dk = 128, BV = 128). Grid (hv, nseg, ceil(dv / BV)), block 256. Needs dk <= 128.
template <int BV, bool X3>
__device__ __forceinline__ void gdn_tc_leaf_t(const float* __restrict__ qkv, int ld, const float* __restrict__ U,
                                              const float* __restrict__ W, const float* __restrict__ M,
                                              const float* __restrict__ E, float* __restrict__ out, const int* seg,
                                              const u64* init, int hk, int hv, int dk, int dv, int vec, float* sm) {
    constexpr int NH = BV / 16;  // n tiles of 8 value columns per warp
    constexpr int LDV = GtcLd<BV>::v;
    constexpr int LDM = GDN_C + 4;
    const int kp8 = (dk + 7) & ~7, dkp = (dk + 15) & ~15;
    const int ldx = kp8 + 4;
    float* Wt = sm;                // [C, ldx]   W of the chunk
    float* Qt = Wt + GDN_C * ldx;  // [C, ldx]   Q
    float* Mt = Qt + GDN_C * ldx;  // [C, LDM]   M
    float* Ss = Mt + GDN_C * LDM;  // [dkp, LDV] S0 (rows past dk and columns past w zero)
    float* Vs = Ss + dkp * LDV;    // [C, LDV]   v'

    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, tg = lane & 3;
    const int h = blockIdx.x, s = blockIdx.y, j0 = blockIdx.z * BV, w = min(BV, dv - j0);
    const int start = seg[3 * s], n = min(GDN_C, seg[3 * s + 1]);
    // Nothing to do, or a segment longer than one chunk (the state pass takes it: keep 2): the whole block.
    if (n <= 0 || seg[3 * s + 1] > GDN_C) return;
    const int kh = h / (hv / hk);
    const bool vecb = vec != 0;
    const float* Si = (const float*)init[s] + (idx_t)h * dk * dv;
    gtc_state_slice<BV, LDV>(Ss, Si, dk, dkp, dv, j0, w);
    gtc_tile(Wt, ldx, W + ((idx_t)start * hv + h) * dk, (idx_t)hv * dk, n, dk, kp8, vecb);
    gtc_tile(Qt, ldx, qkv + kh * dk + (idx_t)start * ld, ld, n, dk, kp8, vecb);
    gtc_tile(Mt, LDM, M + ((idx_t)start * hv + h) * GDN_C, (idx_t)hv * GDN_C, n, GDN_C, GDN_C, vecb);
    tc_commit();

    const int m0 = 16 * (wp & 3), cw = (wp >> 2) * (BV / 2);  // this warp's first row and column
    const int ra = m0 + g, rb = m0 + g + 8;
    // Under the copies: e^gam of rows ra, rb and U of this warp's rows and columns (zero past n rows, w columns).
    const float ea = ra < n ? E[2 * ((idx_t)(start + ra) * hv + h)] : 0.0f;
    const float eb = rb < n ? E[2 * ((idx_t)(start + rb) * hv + h)] : 0.0f;
    float u[NH][4];
#pragma unroll
    for (int nt = 0; nt < NH; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i < 2 ? ra : rb, col = cw + nt * 8 + 2 * tg + (i & 1);
            u[nt][i] = (r < n && col < w) ? U[((idx_t)(start + r) * hv + h) * dv + j0 + col] : 0.0f;
        }
    tc_wait<0>();
    __syncthreads();

    // W S0 and Q S0 on this warp's rows and columns, k over dk.
    float hw[NH][4], lw[NH][4], hq[NH][4], lq[NH][4];
#pragma unroll
    for (int nt = 0; nt < NH; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) hw[nt][i] = lw[nt][i] = hq[nt][i] = lq[nt][i] = 0.0f;
    if (m0 < n) {
        const float* wa = Wt + ra * ldx + tg;
        const float* qa = Qt + ra * ldx + tg;
        const float* sb = Ss + tg * LDV + g + cw;
#pragma unroll 4
        for (int kk = 0; kk < kp8; kk += 8) {
            unsigned wb[4], ws[4], qb[4], qs[4];
            gtc_frag_a_row(wa + kk, ldx, wb, ws);
            gtc_frag_a_row(qa + kk, ldx, qb, qs);
#pragma unroll
            for (int nt = 0; nt < NH; nt++) {
                unsigned bb[2], bs[2];
                gtc_frag_b(sb + kk * LDV + nt * 8, LDV, bb, bs);
                gtc_mma3<X3>(hw[nt], lw[nt], wb, ws, bb, bs);
                gtc_mma3<X3>(hq[nt], lq[nt], qb, qs, bb, bs);
            }
        }
    }
    // v' = U - W S0 for every row of the tile (exactly zero past n, as W and U are there: the M v' products below
    // read them), and e^gam Q S0 kept in hq.
#pragma unroll
    for (int nt = 0; nt < NH; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i < 2 ? ra : rb, col = cw + nt * 8 + 2 * tg + (i & 1);
            Vs[r * LDV + col] = u[nt][i] - (hw[nt][i] + lw[nt][i]);
            hq[nt][i] = (i < 2 ? ea : eb) * (hq[nt][i] + lq[nt][i]);
        }
    __syncthreads();  // v' visible
    if (m0 >= n) return;
    // o = e^gam Q S0 + M v': M[t][b] is zero for b > t, so k stops at the tile's last row.
#pragma unroll
    for (int nt = 0; nt < NH; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) hw[nt][i] = lw[nt][i] = 0.0f;
    const int kend = min(m0 + 16, (n + 7) & ~7);
    gtc_rows_mma<NH, 4, LDV, X3>(hw, lw, Mt + ra * LDM + tg, LDM, Vs + tg * LDV + g + cw, kend);
#pragma unroll
    for (int nt = 0; nt < NH; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i < 2 ? ra : rb, col = cw + nt * 8 + 2 * tg + (i & 1);
            if (r < n && col < w)
                out[((idx_t)(start + r) * hv + h) * dv + j0 + col] = hq[nt][i] + (hw[nt][i] + lw[nt][i]);
        }
}

// grid (hv, nseg, ceil(dv / BV)), block 256, dynamic shared memory from gdn_tc_leaf_smem (gdn_tc.rs). Arguments as
// gdn_tc_state's without states and keep (nothing is written but out). _tf32: 1xTF32 products.
#define GDN_TC_LEAF(BV, NAME, X3)                                                                                    \
    KERNEL(NAME) void __launch_bounds__(256, BV <= 32 ? 2 : 1) NAME(                                                 \
        const float* __restrict__ qkv, int ld, const float* __restrict__ U, const float* __restrict__ W,             \
        const float* __restrict__ M, const float* __restrict__ E, float* __restrict__ out, const int* seg,           \
        const u64* init, int hk, int hv, int dk, int dv, int vec) {                                                  \
        extern __shared__ float sm[];                                                                                \
        gdn_tc_leaf_t<BV, X3>(qkv, ld, U, W, M, E, out, seg, init, hk, hv, dk, dv, vec, sm);                         \
    }
GDN_TC_LEAF(32, gdn_tc_leaf_32, true)
GDN_TC_LEAF(64, gdn_tc_leaf_64, true)
GDN_TC_LEAF(128, gdn_tc_leaf_128, true)
GDN_TC_LEAF(32, gdn_tc_leaf_32_tf32, false)
GDN_TC_LEAF(64, gdn_tc_leaf_64_tf32, false)
GDN_TC_LEAF(128, gdn_tc_leaf_128_tf32, false)
#undef GDN_TC_LEAF

//! The float weights' kernel of [`super::matmul::matmul_t`]: `y[i, j] = x[i] · w[j]` for f32, bf16 and f16 weights,
//! with every output summed in one order that depends on K alone, never on the number of tokens (module docs of
//! matmul.rs): with AVX-512 one generic register tile over the weight's widening (1 or 2 tokens × 8 weight rows
//! streamed at memory speed for decode, 4 × 4 for prefill; 16 lanes), else portable tiles of 2 × 4 with 8 lanes.

use half::{bf16, f16};
use rayon::prelude::*;

use super::matmul::SharedMut;

/// A float weight `[N, K]`, row-major.
#[derive(Clone, Copy)]
pub(super) enum Rows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

/// Output features per task for one or two tokens (each weight row streamed once)...
const STREAM_ROWS: usize = 256;
/// ...and for more tokens: at least this many, at most that many (several blocks per thread to balance).
const BLOCK_N_MIN: usize = 64;
const BLOCK_N_MAX: usize = 512;

/// `y[T, N] = x[T, K] · w[N, K]ᵀ`; the shapes were checked by `matmul_t`.
pub(super) fn rows_tiled(x: &[f32], t: usize, k: usize, n: usize, w: Rows<'_>, y: &mut [f32]) {
    let block_n = if t <= 2 {
        STREAM_ROWS
    } else {
        let per_thread = 4 * rayon::current_num_threads().max(1);
        n.div_ceil(per_thread)
            .next_multiple_of(16)
            .clamp(BLOCK_N_MIN, BLOCK_N_MAX)
    };
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    // Every block writes a disjoint set of columns of y, straight into y.
    let dst = SharedMut(y.as_mut_ptr());
    let dst = &dst;
    (0..n.div_ceil(block_n)).into_par_iter().for_each(|b| {
        let r0 = b * block_n;
        let r1 = (r0 + block_n).min(n);
        // SAFETY (all three): y is [t, n] (checked by matmul_t) and this task writes only columns r0..r1 of each row,
        // which no other task writes; x is [t, k] and w [n, k]; the processor has the features enabled.
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            unsafe {
                match w {
                    Rows::F32(v) => {
                        avx512::tiles::<0>(x, t, k, v.as_ptr() as *const u8, r0, r1, dst.0, n)
                    }
                    Rows::Bf16(v) => {
                        avx512::tiles::<1>(x, t, k, v.as_ptr() as *const u8, r0, r1, dst.0, n)
                    }
                    Rows::F16(v) => {
                        avx512::tiles::<2>(x, t, k, v.as_ptr() as *const u8, r0, r1, dst.0, n)
                    }
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            unsafe { tiles_avx2(x, t, k, w, r0, r1, dst.0, n) };
            return;
        }
        unsafe { tiles_portable(x, t, k, w, r0, r1, dst.0, n) };
    });
}

/// [`tiles_portable`] compiled for AVX2 (the lanes' arrays vectorise; the same arithmetic: no fused products).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tiles_avx2(
    x: &[f32],
    t: usize,
    k: usize,
    w: Rows<'_>,
    r0: usize,
    r1: usize,
    y: *mut f32,
    n: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { tiles_portable(x, t, k, w, r0, r1, y, n) }
}

/// Lanes of the portable kernel.
const LANES: usize = 8;

/// `y[i, j] = x[i] · w[j]` for all tokens `i < t` and weight rows `r0 <= j < r1`, in tiles of 2 tokens × 4 weight rows:
/// per output [`LANES`] partial sums over the first K rounded down to the lanes (lane `l` the products at `l mod
/// LANES`, each a product then an add), summed lane 0 first, then the remaining products added in order.
///
/// # Safety
/// `y + i * n + j` must be valid for writes for every `i < t`, `r0 <= j < r1`, and no other thread may write them.
#[inline(always)]
unsafe fn tiles_portable(
    x: &[f32],
    t: usize,
    k: usize,
    w: Rows<'_>,
    r0: usize,
    r1: usize,
    y: *mut f32,
    n: usize,
) {
    let kl = k / LANES * LANES;
    let widen = |j: usize, c: usize| -> f32 {
        match w {
            Rows::F32(v) => v[j * k + c],
            Rows::Bf16(v) => f32::from_bits((v[j * k + c].to_bits() as u32) << 16),
            Rows::F16(v) => v[j * k + c].to_f32(),
        }
    };
    let mut i = 0;
    while i < t {
        let mr = (t - i).min(2);
        let mut j = r0;
        while j < r1 {
            let nr = (r1 - j).min(4);
            let mut acc = [[[0.0f32; LANES]; 4]; 2];
            let mut kk = 0;
            while kk < kl {
                let mut wv = [[0.0f32; LANES]; 4];
                for (c, wc) in wv.iter_mut().enumerate().take(nr) {
                    for (l, v) in wc.iter_mut().enumerate() {
                        *v = widen(j + c, kk + l);
                    }
                }
                for (r, ar) in acc.iter_mut().enumerate().take(mr) {
                    let xr = &x[(i + r) * k + kk..(i + r) * k + kk + LANES];
                    for (ac, wc) in ar.iter_mut().zip(&wv).take(nr) {
                        for l in 0..LANES {
                            ac[l] += xr[l] * wc[l];
                        }
                    }
                }
                kk += LANES;
            }
            for (r, ar) in acc.iter().enumerate().take(mr) {
                for (c, ac) in ar.iter().enumerate().take(nr) {
                    let mut s: f32 = ac.iter().sum();
                    for q in kl..k {
                        s += x[(i + r) * k + q] * widen(j + c, q);
                    }
                    // SAFETY: (i + r, j + c) is inside y's [t, n], in this task's columns.
                    unsafe { *y.add((i + r) * n + j + c) = s };
                }
            }
            j += nr;
        }
        i += mr;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Bytes of activations per token tile (half of a 1 MiB L2).
    const TOKEN_TILE_BYTES: usize = 512 * 1024;
    /// Weight rows per pass for one or two tokens: 8 rows (16 accumulators for two tokens) stream together, so
    /// several independent sums hide the multiply-add latency while the weights stream at memory speed.
    const STREAM_NR: usize = 8;
    /// Bytes of four tokens' activations that a prefill tile keeps in L1 (a third of a 48 KiB L1 data cache).
    const L1_ACTIVATIONS: usize = 16 * 1024;

    /// `y[i, j] = x[i] · w[j]` for all tokens `i < t` and weight rows `r0 <= j < r1` (`W` the weight's format: 0
    /// f32, 1 bf16, 2 f16). One or two tokens run tiles of t × [`STREAM_NR`] (each weight row read once); more
    /// run 4 × 4 tiles over token tiles of about equal size (their activations within half of L2). Where four
    /// tokens' activations fit [`L1_ACTIVATIONS`] (K ≤ 1,024), each group of four tokens meets every four-row group
    /// of the block, the block's weights from L2 (half the bytes of the activations for bf16 and f16: 31–40% more
    /// GFLOP/s on the 0.8B MLP shape, medians of eight rounds); for a longer K each four weight rows, in L1, meet
    /// every token of the tile from L2 (the other order lost about a quarter at K = 6,144). Every output is summed
    /// alike in every tile ([`tile`]), so the order never changes a bit.
    ///
    /// # Safety
    /// AVX-512F; x is [t, k], w [≥ r1, k] of the format `W`; `y + i * n + j` valid for writes for every `i < t`,
    /// `r0 <= j < r1`, written by no other thread.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tiles<const W: u8>(
        x: &[f32],
        t: usize,
        k: usize,
        w: *const u8,
        r0: usize,
        r1: usize,
        y: *mut f32,
        n: usize,
    ) {
        debug_assert!(x.len() >= t * k);
        let x = x.as_ptr();
        // SAFETY (every call): the tiles stay inside rows 0..t of x, r0..r1 of w and this task's outputs.
        unsafe {
            if t <= 2 {
                let mut j = r0;
                while j < r1 {
                    let nr = (r1 - j).min(STREAM_NR);
                    match (t, nr) {
                        (1, STREAM_NR) => {
                            tile::<W, 1, STREAM_NR, true, true>(x, 0, 1, k, w, j, nr, y, n)
                        }
                        (1, _) => tile::<W, 1, STREAM_NR, true, false>(x, 0, 1, k, w, j, nr, y, n),
                        (_, STREAM_NR) => {
                            tile::<W, 2, STREAM_NR, true, true>(x, 0, 2, k, w, j, nr, y, n)
                        }
                        _ => tile::<W, 2, STREAM_NR, true, false>(x, 0, t, k, w, j, nr, y, n),
                    }
                    j += nr;
                }
                return;
            }
            let most = (TOKEN_TILE_BYTES / (4 * k.max(1))).clamp(4, 256);
            let tile_t = t.div_ceil(t.div_ceil(most)).next_multiple_of(4);
            // Four tokens' activations in L1 against the weights from L2 where they fit beside them; else four
            // weight rows in L1 against the token tile's activations from L2.
            let tokens_outer = 4 * 4 * k <= L1_ACTIVATIONS;
            // Within the outer block's safety: the tile lies inside rows i..i + mr of x and j..j + nr of w.
            let one = |i: usize, j: usize, mr: usize, nr: usize| {
                if mr == 4 && nr == 4 {
                    tile::<W, 4, 4, false, true>(x, i, mr, k, w, j, nr, y, n);
                } else {
                    tile::<W, 4, 4, false, false>(x, i, mr, k, w, j, nr, y, n);
                }
            };
            let mut i0 = 0;
            while i0 < t {
                let i1 = (i0 + tile_t).min(t);
                if tokens_outer {
                    for i in (i0..i1).step_by(4) {
                        for j in (r0..r1).step_by(4) {
                            one(i, j, (i1 - i).min(4), (r1 - j).min(4));
                        }
                    }
                } else {
                    for j in (r0..r1).step_by(4) {
                        for i in (i0..i1).step_by(4) {
                            one(i, j, (i1 - i).min(4), (r1 - j).min(4));
                        }
                    }
                }
                i0 = i1;
            }
        }
    }

    /// One register tile: `y[i, j] = x[i] · w[j]` for tokens `i0 <= i < i0 + mr` and rows `j0 <= j < j0 + nr`
    /// (`mr <= MR`, `nr <= NR`; `FULL` tiles use the constants, so the checks fold away; `PREFETCH` asks for the
    /// next tile's weights while this one runs, for streaming one or two tokens). Every output
    /// is one 16-lane accumulator over the first K rounded down to 16 (lane `l` the fused products at `l mod 16`,
    /// in order), reduced by `_mm512_reduce_add_ps`, then the remaining products added in order: the same order
    /// in every tile shape, so a token's outputs never depend on the tokens beside it.
    ///
    /// # Safety
    /// AVX-512F; rows i0..i0+mr of x and j0..j0+nr of w exist; the outputs are the caller's to write.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // fixed-bound loops over register arrays unroll
    unsafe fn tile<
        const W: u8,
        const MR: usize,
        const NR: usize,
        const PREFETCH: bool,
        const FULL: bool,
    >(
        x: *const f32,
        i0: usize,
        mr: usize,
        k: usize,
        w: *const u8,
        j0: usize,
        nr: usize,
        y: *mut f32,
        n: usize,
    ) {
        let (mr, nr) = if FULL { (MR, NR) } else { (mr, nr) };
        let k16 = k / 16 * 16;
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let mut kk = 0;
        while kk < k16 {
            // SAFETY: rows i0..i0+mr of x and j0..j0+nr of w exist and kk + 16 <= k.
            unsafe {
                let mut wv = [_mm512_setzero_ps(); NR];
                if PREFETCH {
                    // The next tile's rows at the same offset: the weights then arrive as one stream (the
                    // hardware prefetchers alone kept 8 short interleaved rows well below the read bandwidth).
                    // Into L2, not L1 (`T1`): the 0.8B shape's K = 1,024 matrices, the head among them, streamed
                    // about 25% faster so (docs/benchmarks/cpu-matmul.md). A prefetch past the weights is
                    // harmless (the pointer is never read).
                    for c in 0..NR {
                        let idx = (j0 + NR + c) * k + kk;
                        let p = match W {
                            0 => (w as *const f32).wrapping_add(idx) as *const i8,
                            _ => (w as *const u16).wrapping_add(idx) as *const i8,
                        };
                        _mm_prefetch::<_MM_HINT_T1>(p);
                    }
                }
                for c in 0..NR {
                    if c < nr {
                        // 16 weights from element idx as f32 (written here, not in a helper, so that the
                        // tile's registers stay registers).
                        let idx = (j0 + c) * k + kk;
                        wv[c] = match W {
                            0 => _mm512_loadu_ps((w as *const f32).add(idx)),
                            1 => _mm512_castsi512_ps(_mm512_slli_epi32(
                                _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                    (w as *const u16).add(idx) as *const __m256i,
                                )),
                                16,
                            )),
                            _ => _mm512_cvtph_ps(_mm256_loadu_si256(
                                (w as *const u16).add(idx) as *const __m256i
                            )),
                        };
                    }
                }
                for r in 0..MR {
                    if r < mr {
                        let xv = _mm512_loadu_ps(x.add((i0 + r) * k + kk));
                        for c in 0..NR {
                            if c < nr {
                                acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
                            }
                        }
                    }
                }
            }
            kk += 16;
        }
        for r in 0..mr {
            for c in 0..nr {
                let mut s = _mm512_reduce_add_ps(acc[r][c]);
                for q in k16..k {
                    // SAFETY: q < k within rows i0 + r of x and j0 + c of w.
                    let (xq, wq) = unsafe {
                        let idx = (j0 + c) * k + q;
                        let wq = match W {
                            0 => *(w as *const f32).add(idx),
                            1 => f32::from_bits((*(w as *const u16).add(idx) as u32) << 16),
                            _ => half::f16::from_bits(*(w as *const u16).add(idx)).to_f32(),
                        };
                        (*x.add((i0 + r) * k + q), wq)
                    };
                    s += xq * wq;
                }
                // SAFETY: (i0 + r, j0 + c) is inside y's [t, n], in this task's columns.
                unsafe { *y.add((i0 + r) * n + j0 + c) = s };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable kernel (what a processor without AVX-512 runs) against f64 sums, on shapes with partial tiles
    /// and a remainder of the lanes; and a token's outputs alone equal its outputs among others, bit for bit.
    #[test]
    fn portable_tiles_match_f64_and_do_not_depend_on_the_tokens_stacked() {
        let (k, n) = (37, 11);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |x: &[f32], t: usize| {
            let mut y = vec![0.0f32; t * n];
            // SAFETY: y is [t, n], written by this call alone.
            unsafe { tiles_portable(x, t, k, Rows::F32(&w), 0, n, y.as_mut_ptr(), n) };
            y
        };
        let t = 5;
        let x: Vec<f32> = (0..t * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let y = run(&x, t);
        for i in 0..t {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|c| x[i * k + c] as f64 * w[j * k + c] as f64)
                    .sum();
                assert!((y[i * n + j] as f64 - want).abs() < 1e-4, "({i}, {j})");
            }
        }
        let alone = run(&x[3 * k..4 * k], 1);
        assert!(y[3 * n..4 * n]
            .iter()
            .zip(&alone)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

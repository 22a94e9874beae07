//! The float weights' kernel of [`super::matmul::matmul_t`]: `y[i, j] = x[i] · w[j]` for f32, bf16 and f16 weights,
//! with every output summed in one order that depends on K alone, never on the number of tokens (module docs of
//! matmul.rs): with AVX-512 one generic register tile over the weight's widening (1 or 2 tokens × 8 weight rows
//! streamed at memory speed for decode, 8 tokens × 3 rows for prefill; 16 lanes), else portable tiles of 2 × 4
//! with 8 lanes.

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
/// ...and for more tokens: four blocks per thread (to balance), each a multiple of 12 rows (whole prefill and
/// portable tiles, so only a matrix's last block has a partial tile) and at least this many.
const BLOCK_N_MIN: usize = 24;

/// `y[T, N] = x[T, K] · w[N, K]ᵀ`; the shapes were checked by `matmul_t`.
pub(super) fn rows_tiled(x: &[f32], t: usize, k: usize, n: usize, w: Rows<'_>, y: &mut [f32]) {
    let block_n = if t <= 2 {
        STREAM_ROWS
    } else {
        let blocks = 4 * rayon::current_num_threads().max(1);
        n.div_ceil(blocks).next_multiple_of(12).max(BLOCK_N_MIN)
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

    /// Weight rows per pass for one or two tokens: 8 rows (16 accumulators for two tokens) stream together, so
    /// several independent sums hide the multiply-add latency while the weights stream at memory speed.
    const STREAM_NR: usize = 8;
    /// A prefill tile: tokens × weight rows (24 accumulators, 3 widened weights and 1 activation of 32 registers).
    const PREFILL_MR: usize = 8;
    const PREFILL_NR: usize = 3;
    /// Bytes of weights that a prefill pass keeps in L2 (a quarter of a 2 MiB L2) while every token meets them.
    const L2_WEIGHTS: usize = 512 * 1024;
    /// K runs in spans of this many values (eight tokens' activations, 32 KiB, stay in L1 for a span), the sums
    /// carried from span to span.
    const L1_SPAN: usize = 1024;

    /// `y[i, j] = x[i] · w[j]` for all tokens `i < t` and weight rows `r0 <= j < r1` (`W` the weight's format: 0
    /// f32, 1 bf16, 2 f16). One or two tokens run tiles of t × [`STREAM_NR`] (each weight row read once). More run
    /// tiles of [`PREFILL_MR`] tokens × [`PREFILL_NR`] rows (the last tokens in tiles of four, then of what is
    /// left): the rows in groups whose weights fit [`L2_WEIGHTS`]; within a group each eight tokens meet every
    /// three rows, K in spans of [`L1_SPAN`], so the activations come from L1 and only the weights from L2.
    /// Widening bf16 or f16 takes two operations on the multiply-add ports, so eight tokens per widened weight
    /// leave more of those ports to the products than four did (about 70% of the multiply-adds' peak against 57%,
    /// one thread, everything in cache). Against the 4 × 4 tiles this replaced: 6–58% more GFLOP/s at 12, 128 and
    /// 512 tokens on the 0.8B and 2B shapes, bf16, f16 and f32, and within the noise at 5 (medians of rounds run in
    /// turn in one process, docs/benchmarks/cpu-matmul.md). Every output is summed alike in every tile and span
    /// ([`tile`]), so neither the shape, the order nor the spans change a bit.
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
            let k16 = k / 16 * 16;
            if t <= 2 {
                let (whole, none) = ((0, k16), std::ptr::null_mut());
                let mut j = r0;
                while j < r1 {
                    let nr = (r1 - j).min(STREAM_NR);
                    match (t, nr) {
                        (1, STREAM_NR) => tile::<W, 1, STREAM_NR, true, true>(
                            x, 0, 1, k, w, j, nr, y, n, whole, none,
                        ),
                        (1, _) => tile::<W, 1, STREAM_NR, true, false>(
                            x, 0, 1, k, w, j, nr, y, n, whole, none,
                        ),
                        (_, STREAM_NR) => tile::<W, 2, STREAM_NR, true, true>(
                            x, 0, 2, k, w, j, nr, y, n, whole, none,
                        ),
                        _ => tile::<W, 2, STREAM_NR, true, false>(
                            x, 0, t, k, w, j, nr, y, n, whole, none,
                        ),
                    }
                    j += nr;
                }
                return;
            }
            const MR: usize = PREFILL_MR;
            const NR: usize = PREFILL_NR;
            let weight_bytes = if W == 0 { 4 } else { 2 };
            let group = (L2_WEIGHTS / (k.max(1) * weight_bytes) / NR * NR).max(NR);
            let spans = k16.div_ceil(L1_SPAN).max(1);
            let mut carried = if spans > 1 {
                vec![_mm512_setzero_ps(); group.min(r1 - r0).div_ceil(NR) * MR * NR]
            } else {
                Vec::new()
            };
            let mut g0 = r0;
            while g0 < r1 {
                let g1 = (g0 + group).min(r1);
                let mut i = 0;
                while i < t {
                    // Eight tokens at a time, then four, then what is left (one to three).
                    let mr = match t - i {
                        left if left >= MR => MR,
                        left if left >= 4 => 4,
                        left => left,
                    };
                    for s in 0..spans {
                        let ks = (s * L1_SPAN, ((s + 1) * L1_SPAN).min(k16));
                        for (q, j) in (g0..g1).step_by(NR).enumerate() {
                            let nr = (g1 - j).min(NR);
                            let c = if spans > 1 {
                                carried.as_mut_ptr().add(q * MR * NR)
                            } else {
                                std::ptr::null_mut()
                            };
                            match (mr, nr == NR) {
                                (MR, true) => tile::<W, MR, NR, false, true>(
                                    x, i, mr, k, w, j, nr, y, n, ks, c,
                                ),
                                (4, true) => tile::<W, 4, NR, false, true>(
                                    x, i, mr, k, w, j, nr, y, n, ks, c,
                                ),
                                _ => tile::<W, MR, NR, false, false>(
                                    x, i, mr, k, w, j, nr, y, n, ks, c,
                                ),
                            }
                        }
                    }
                    i += mr;
                }
                g0 = g1;
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
    /// This call runs the products at `ks.0 <= kk < ks.1` (multiples of 16, `ks.1 <= k16`, where `k16` is K
    /// rounded down to 16). With `carried` not null the sums start from its `MR × NR` registers unless `ks.0` is 0,
    /// and go back to them unless `ks.1 == k16`; the call whose span ends at `k16` writes y. Spans run in order
    /// give the bits of one call over `(0, k16)`.
    ///
    /// # Safety
    /// AVX-512F; rows i0..i0+mr of x and j0..j0+nr of w exist; the outputs are the caller's to write; `carried` is
    /// null or valid for `MR × NR` registers that no other thread touches.
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
        ks: (usize, usize),
        carried: *mut __m512,
    ) {
        let (mr, nr) = if FULL { (MR, NR) } else { (mr, nr) };
        let k16 = k / 16 * 16;
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        if !carried.is_null() && ks.0 > 0 {
            for r in 0..MR {
                for c in 0..NR {
                    // SAFETY: carried holds MR × NR registers (the caller's contract).
                    acc[r][c] = unsafe { *carried.add(r * NR + c) };
                }
            }
        }
        let mut kk = ks.0;
        while kk < ks.1 {
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
        if !carried.is_null() && ks.1 < k16 {
            for r in 0..MR {
                for c in 0..NR {
                    // SAFETY: as above.
                    unsafe { *carried.add(r * NR + c) = acc[r][c] };
                }
            }
            return;
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

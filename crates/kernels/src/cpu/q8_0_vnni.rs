//! Q8_0 on VNNI integer dot products, for any number of tokens (decode and prefill run the same arithmetic; where
//! the processor has the AMX tile unit, `matmul_t` sends calls of 64 tokens or more to [`super::q8_0_amx`]): the
//! activations rounded once per call to the balanced two-level 16-bit form of [`super::act_q`] (`q = 256·h + l`,
//! both bytes signed), the weights as unsigned bytes `w + 128` against them:
//! `Σ w·q = 256·Σ (w + 128)·h + Σ (w + 128)·l − 128·Σ q`, both halves `vpdpbusd` with the weight byte as the
//! unsigned operand; `−128·Σ q` (per block and token, from the quantizer's lane sums) is the accumulator the low
//! dot starts from.
//!
//! Each 32-bit lane of a dot product sums four bytes, and a Q8_0 block (32 weights, one scale `d`) is eight such
//! groups: so the weights are read regrouped ([`DType::Q8_0G`](onepass_tensor::DType::Q8_0G), 16 blocks of a row
//! per 544-byte group, register `r` holding bytes `4r..4r + 4` of block `j` in lane `j`, then the 16 scales). The 16
//! dot products of a group accumulate in the lanes of one register per half, one lane per block, and one
//! conversion and one FMA with the lanes of `d·s` finish 512 weights (a per-block epilogue would cost as much as
//! the dots). A model prepared for the CPU holds its Q8_0 matrices regrouped (the same bytes as the file's blocks,
//! see `onepass_model::Model::prepare_for_cpu`); a Q8_0 weight as stored is regrouped per call, 64 rows per task
//! into a scratch, which costs about as much as the products at one token and little over a prefill. Activations
//! come in the matching layout, [`Q8_0_LAYOUT`]: value `4r + b` of the group's block `j` at byte `64r + 4j + b`.
//!
//! Tiles of 8 rows × one token over chunks of tokens whose activations fit in L2 beside the rows: the token's 16
//! activation registers of a group stay loaded across the 8 rows, whose groups stay in cache from one token to
//! the next; the first token of a chunk prefetches the rows ahead into L2 (decode streams them once). Every
//! output's arithmetic depends on its row and token alone (batch invariance). The integer lane sums reach 2²⁹, so
//! their conversion to f32 rounds (relative 2⁻²⁴); the rounding of the activations (at most `s / 2` per value, `s`
//! the block's max|x| / 32639) is the real difference from float arithmetic.

use onepass_tensor::{group_q8_0_row, Q8_0G_BYTES, Q8_0G_VALUES};

use super::act_q::{quantize, ActQ, Layout, ACT_BLOCK, LANES, MAX_GROUP};
use super::grouped;
use super::q8_0::{Q8_0_BLOCK, Q8_0_BYTES};
use super::ternary::for_row_tasks_many;

/// How many tiles ahead the first token of a chunk prefetches its rows into L2.
const FAR_TILES: usize = 4;

/// Where the regrouped weights put each activation value: value `v` of activation block `j` of a group of four is
/// value `u = 128j + v` of the group's 512, byte `u mod 32` of Q8_0 block `u / 32`, at byte
/// `64·((u mod 32) / 4) + 4·(u / 32) + u mod 4`.
pub const Q8_0_LAYOUT: Layout = {
    let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
    let mut j = 0;
    while j < 4 {
        let mut v = 0;
        while v < ACT_BLOCK {
            let u = ACT_BLOCK * j + v;
            let (qb, wi) = (u / Q8_0_BLOCK, u % Q8_0_BLOCK);
            slot[j][v] = (64 * (wi / 4) + 4 * qb + wi % 4) as u16;
            v += 1;
        }
        j += 1;
    }
    Layout {
        blocks: 4,
        regs: 8,
        slot,
        balanced: true,
    }
};

/// Whether the processor has what the kernels here need.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::act_q::avx512_vnni() && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The weight of a call: Q8_0 blocks as stored, or regrouped.
#[derive(Clone, Copy)]
pub enum Q8Weight<'a> {
    Blocks(&'a [u8]),
    Grouped(&'a [u8]),
}

/// `y[T, N] = x[T, K] · W[N, K]ᵀ`. Panics if the processor lacks the instructions ([`available`]), if K is not a
/// multiple of 128 (of 512 for regrouped weights) or the buffers do not match the shapes (programming errors).
/// One weight of [`q8_0_matmul_t_many`], for the tests.
#[cfg(test)]
fn q8_0_matmul_t_vnni(x: &[f32], t: usize, w: Q8Weight<'_>, n: usize, k: usize, y: &mut [f32]) {
    q8_0_matmul_t_many(x, t, &[(w, n)], k, &mut [y]);
}

/// `ys[i] = x · w_iᵀ` for weights that read one activation: `parts[i]` = (weight i, N_i), written to `ys[i]`
/// ([t, N_i]); x quantized once, then all the weights' row tasks in one parallel loop, each output the bits its
/// weight alone gives. Panics as [`q8_0_matmul_t_vnni`].
pub fn q8_0_matmul_t_many(
    x: &[f32],
    t: usize,
    parts: &[(Q8Weight<'_>, usize)],
    k: usize,
    ys: &mut [&mut [f32]],
) {
    assert_eq!(
        parts.len(),
        ys.len(),
        "Q8_0 VNNI matmul: one output per weight"
    );
    assert_eq!(x.len(), t * k, "Q8_0 VNNI matmul: x");
    for (&(w, n), y) in parts.iter().zip(ys.iter()) {
        check(w, n, k);
        assert_eq!(y.len(), t * n, "Q8_0 VNNI matmul: y");
    }
    if t == 0 {
        return;
    }
    let a = quantize(x, t, k, &Q8_0_LAYOUT);
    let ns: Vec<usize> = parts.iter().map(|&(_, n)| n).collect();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of output i; the instructions are
    // available.
    unsafe {
        for_row_tasks_many(&ns, ys, |i, r0, r1, y| {
            rows(&a, t, parts[i].0, r0, r1, y, ns[i])
        })
    };
}

/// `out[i] = x · W[rows[i]]` for one activation vector `x[K]`: each the value [`q8_0_matmul_t_vnni`] gives for
/// that row, to the bit. Panics as [`q8_0_matmul_t_vnni`], or if a row is out of range.
pub fn q8_0_dot_rows_vnni(
    x: &[f32],
    w: Q8Weight<'_>,
    n: usize,
    k: usize,
    rows: &[u32],
    out: &mut [f32],
) {
    check(w, n, k);
    assert_eq!(x.len(), k, "Q8_0 VNNI rows: x");
    assert_eq!(out.len(), rows.len(), "Q8_0 VNNI rows: out");
    let a = quantize(x, 1, k, &Q8_0_LAYOUT);
    let groups = a.pairs;
    let mut scratch = vec![0u8; groups * Q8_0G_BYTES];
    for (o, &r) in out.iter_mut().zip(rows) {
        let r = r as usize;
        assert!(r < n, "Q8_0 VNNI rows: row {r} of {n}");
        let row: &[u8] = match w {
            Q8Weight::Grouped(g) => &g[r * groups * Q8_0G_BYTES..][..groups * Q8_0G_BYTES],
            Q8Weight::Blocks(b) => {
                let rb = k / Q8_0_BLOCK * Q8_0_BYTES;
                group_q8_0_row(&b[r * rb..][..rb], &mut scratch);
                &scratch
            }
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the instructions are available (checked); the row holds the call's groups; o is one output.
        unsafe {
            tile::<1, false>(&a, 0, row.as_ptr(), row.len(), o)
        };
    }
}

/// Panics unless the instructions are available and `w` holds `n` rows of `k` values.
fn check(w: Q8Weight<'_>, n: usize, k: usize) {
    assert!(
        available(),
        "Q8_0 VNNI matmul: not available on this processor"
    );
    assert!(k.is_multiple_of(ACT_BLOCK), "Q8_0 VNNI matmul: K = {k}");
    match w {
        Q8Weight::Blocks(b) => assert_eq!(
            b.len(),
            n * k / Q8_0_BLOCK * Q8_0_BYTES,
            "Q8_0 VNNI matmul: w"
        ),
        Q8Weight::Grouped(g) => {
            assert!(k.is_multiple_of(Q8_0G_VALUES), "Q8_0 grouped: K = {k}");
            assert_eq!(
                g.len(),
                n * k / Q8_0G_VALUES * Q8_0G_BYTES,
                "Q8_0 grouped: w"
            );
        }
    }
}

/// Rows `r0..r1` of the output for every token of `a`.
///
/// # Safety
/// [`available`]; `y` is `[t, n]` and this call alone writes its columns `r0..r1`; `w` holds `n` rows of `a.k`
/// values.
#[cfg(target_arch = "x86_64")]
unsafe fn rows(a: &ActQ, t: usize, w: Q8Weight<'_>, r0: usize, r1: usize, y: *mut f32, n: usize) {
    let row_bytes = a.pairs * Q8_0G_BYTES;
    let scratch;
    let regrouped: &[u8] = match w {
        Q8Weight::Grouped(g) => &g[r0 * row_bytes..r1 * row_bytes],
        Q8Weight::Blocks(b) => {
            let rb = a.k / Q8_0_BLOCK * Q8_0_BYTES;
            let mut s = vec![0u8; (r1 - r0) * row_bytes];
            for (src, dst) in b[r0 * rb..r1 * rb]
                .chunks_exact(rb)
                .zip(s.chunks_exact_mut(row_bytes))
            {
                group_q8_0_row(src, dst);
            }
            scratch = s;
            &scratch
        }
    };
    // SAFETY: forwarded from the caller; `regrouped` holds rows r0..r1.
    unsafe { grouped::run(a, t, regrouped, row_bytes, r0, y, n, &grouped::tiles!(tile)) };
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One tile: the `R` regrouped rows from `rows` (`row_bytes` apart) × token `i` of `a`; with `PREFETCH`, the same
/// bytes [`FAR_TILES`] tiles ahead are prefetched into L2 (past the task's rows: the next task's or nothing; a
/// prefetch never faults).
///
/// # Safety
/// [`available`]; `rows` holds `R` rows of `a.pairs` groups, `row_bytes` apart; `y + j` writable for `j < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn tile<const R: usize, const PREFETCH: bool>(
    a: &ActQ,
    i: usize,
    rows: *const u8,
    row_bytes: usize,
    y: *mut f32,
) {
    let groups = a.pairs;
    assert!(a.pair_bytes == 512 && a.hi.len() >= (i + 1) * groups * 512);
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        let at = i * groups + g;
        // SAFETY: group g of token i of a (asserted above), and group g of rows rr < R (the contract).
        unsafe {
            let hp = a.hi.as_ptr().add(at * 512) as *const __m512i;
            let lp = a.lo.as_ptr().add(at * 512) as *const __m512i;
            let h: [__m512i; 8] = std::array::from_fn(|r| _mm512_loadu_si512(hp.add(r)));
            let l: [__m512i; 8] = std::array::from_fn(|r| _mm512_loadu_si512(lp.add(r)));
            let s = _mm512_loadu_ps(a.scale_lanes.as_ptr().add(at * LANES));
            // −128·Σ q of each block.
            let start = _mm512_slli_epi32::<7>(_mm512_loadu_si512(
                a.neg_lane_sums.as_ptr().add(at * LANES) as *const __m512i,
            ));
            for (rr, acc) in acc.iter_mut().enumerate() {
                let p = rows.add(rr * row_bytes + g * Q8_0G_BYTES);
                if PREFETCH {
                    let ahead = p.wrapping_add(FAR_TILES * R * row_bytes);
                    for line in 0..Q8_0G_BYTES.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * line) as *const i8);
                    }
                }
                // Two sums per half (even and odd registers), so that no chain of dependent dot products is
                // longer than 4.
                let mut hs = [_mm512_setzero_si512(); 2];
                let mut ls = [start, _mm512_setzero_si512()];
                for r in 0..8 {
                    let wv = _mm512_loadu_si512(p.add(64 * r) as *const __m512i);
                    hs[r % 2] = _mm512_dpbusd_epi32(hs[r % 2], wv, h[r]);
                    ls[r % 2] = _mm512_dpbusd_epi32(ls[r % 2], wv, l[r]);
                }
                let sum = _mm512_add_epi32(
                    _mm512_slli_epi32::<8>(_mm512_add_epi32(hs[0], hs[1])),
                    _mm512_add_epi32(ls[0], ls[1]),
                );
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(512) as *const __m256i));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, s), *acc);
            }
        }
    }
    for (rr, &v) in acc.iter().enumerate() {
        // SAFETY: see the function's contract.
        unsafe { *y.add(rr) = _mm512_reduce_add_ps(v) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::q8_0_test_data::{
        self, bits, grouped, weights_sharing_x_answer_as_each_alone,
    };
    use super::*;

    fn q8_0(n: usize, k: usize, seed: usize) -> Vec<u8> {
        q8_0_test_data::q8_0(n, k, seed, false)
    }

    /// The test rows' values, in f64.
    fn decoded(raw: &[u8]) -> Vec<f64> {
        q8_0_test_data::decoded(raw)
            .into_iter()
            .map(f64::from)
            .collect()
    }

    /// x rounded as the quantizer rounds it for the balanced layout, per 128-value block.
    fn rounded(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let mut out = Vec::new();
        let mut steps = Vec::new();
        for xs in x.chunks_exact(ACT_BLOCK) {
            let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (s, inv) = if max == 0.0 {
                (0.0, 0.0)
            } else {
                (max / 32639.0, 32639.0 / max)
            };
            out.extend(xs.iter().map(|v| f64::from((v * inv).round() * s)));
            steps.extend(std::iter::repeat_n(f64::from(s), ACT_BLOCK));
        }
        (out, steps)
    }

    #[test]
    fn the_vnni_gemm_matches_f64_on_the_rounded_activations_and_the_rounding_bound_on_odd_shapes() {
        if !available() {
            eprintln!("no AVX-512 VNNI: skipped");
            return;
        }
        let mut worst = 0f64;
        // K: one activation block (128 values, a group of 4 Q8_0 blocks short of 16), 12 blocks, 16 (one whole
        // group), 20 (a whole group and a quarter), 48; N: row tiles 1..8 and their tails, more than one task;
        // T: 1 to 9. Whole groups run regrouped as well, to the same bits.
        for (t, k, n, seed) in [
            (3, 128, 1, 1),
            (1, 384, 7, 2),
            (5, 512, 13, 3),
            (9, 640, 67, 4),
            (4, 1536, 9, 5),
            (1, 1536, 131, 6),
            (2, 512, 3, 7),
        ] {
            let raw = q8_0(n, k, seed);
            let wf = decoded(&raw);
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 7919 + seed) % 2003) as f32 / 500.0 - 2.0)
                .collect();
            let (xr, steps) = rounded(&x);
            let mut y = vec![f32::NAN; t * n];
            q8_0_matmul_t_vnni(&x, t, Q8Weight::Blocks(&raw), n, k, &mut y);
            if k.is_multiple_of(Q8_0G_VALUES) {
                let mut yg = vec![f32::NAN; t * n];
                let g = grouped(&raw, n, k);
                q8_0_matmul_t_vnni(&x, t, Q8Weight::Grouped(&g), n, k, &mut yg);
                assert_eq!(bits(&yg), bits(&y), "t={t} k={k} n={n}: regrouped");
            }
            for i in 0..t {
                for r in 0..n {
                    let row = &wf[r * k..(r + 1) * k];
                    let xi = &x[i * k..(i + 1) * k];
                    let exact: f64 = row.iter().zip(xi).map(|(w, &v)| w * f64::from(v)).sum();
                    let on_rounded: f64 = row.iter().zip(&xr[i * k..]).map(|(w, v)| w * v).sum();
                    let mag: f64 = row
                        .iter()
                        .zip(xi)
                        .map(|(w, &v)| (w * f64::from(v)).abs())
                        .sum();
                    let bound: f64 = row
                        .iter()
                        .zip(&steps[i * k..])
                        .map(|(w, s)| w.abs() * s / 2.0)
                        .sum();
                    let got = f64::from(y[i * n + r]);
                    let what = format!("t={t} k={k} n={n} ({i}, {r})");
                    assert!(
                        (got - on_rounded).abs() <= 2e-6 * mag + 1e-7,
                        "{what}: {got} vs {on_rounded}"
                    );
                    assert!(
                        (got - exact).abs() <= 1.01 * bound + 2e-6 * mag + 1e-7,
                        "{what}: {got} vs {exact}"
                    );
                    worst = worst.max((got - exact).abs() / mag.max(1e-30));
                }
            }
        }
        eprintln!("Q8_0 VNNI: max |error| / Σ|w·x| {worst:.2e}");
    }

    #[test]
    fn a_token_reads_the_same_bits_alone_stacked_with_others_and_row_by_row() {
        if !available() {
            return;
        }
        // 91 tokens: more than one chunk of tokens at K = 1024 (64 a chunk).
        let (t, k, n) = (91, 1024, 19);
        let raw = q8_0(n, k, 9);
        let g = grouped(&raw, n, k);
        let x: Vec<f32> = (0..t * k)
            .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
            .collect();
        for w in [Q8Weight::Blocks(&raw), Q8Weight::Grouped(&g)] {
            let mut all = vec![0f32; t * n];
            q8_0_matmul_t_vnni(&x, t, w, n, k, &mut all);
            for i in [0, 1, 63, 64, 90] {
                let xi = &x[i * k..(i + 1) * k];
                let mut one = vec![0f32; n];
                q8_0_matmul_t_vnni(xi, 1, w, n, k, &mut one);
                assert_eq!(bits(&one), bits(&all[i * n..(i + 1) * n]), "token {i}");
                let picked = [18u32, 0, 7, 7];
                let mut some = vec![0f32; picked.len()];
                q8_0_dot_rows_vnni(xi, w, n, k, &picked, &mut some);
                let want: Vec<f32> = picked.iter().map(|&r| one[r as usize]).collect();
                assert_eq!(bits(&some), bits(&want), "token {i}: rows picked");
            }
        }
    }

    #[test]
    fn weights_that_read_one_activation_answer_as_each_alone() {
        if !available() {
            return;
        }
        // One rounding of x for all three.
        let (t, k) = (5, 1024);
        let x: Vec<f32> = (0..t * k)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        weights_sharing_x_answer_as_each_alone(q8_0_matmul_t_many, &x, t, k);
    }
}

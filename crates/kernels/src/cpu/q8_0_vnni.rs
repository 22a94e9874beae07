//! Q8_0 prefill (several tokens) on VNNI integer dot products: the activations rounded once per call to the two-level
//! 16-bit form of [`super::act_q`] (high bytes stored as `h + 128`), the weights' signed bytes `w` against them:
//! `Σ w·q = 256·(Σ (h + 128)·w − 128·Σ w) + Σ l·w`, both halves `vpdpbusd` with the activation byte as the unsigned
//! operand and the weight as the signed one; `−128·Σ w` (per block, computed when the rows are repacked) is the
//! accumulator the high dot starts from.
//!
//! Each 32-bit lane of a dot product sums four bytes, and a Q8_0 block (32 weights, one scale `d`) is eight such
//! groups: so a task repacks each weight row once per call into groups of 16 blocks (512 weights) where register `r`
//! (of 8) holds the bytes `4r..4r + 4` of block `j` in lane `j`. The 16 dot products of a group then accumulate in
//! the lanes of one register per half, one lane per block, and one conversion and one FMA with the lanes of `d·s`
//! finish 512 weights (a per-block epilogue would cost as much as the dots). Activations come in the matching
//! layout, [`Q8_0_LAYOUT`]: value `4r + b` of the group's block `j` at byte `64r + 4j + b`.
//!
//! A task repacks its rows (64) once, then runs tiles of 8 rows × one token over chunks of tokens whose activations
//! fit in L2 beside them: the token's 16 activation registers of a group stay loaded across the 8 rows, whose
//! repacked groups stay in L1 from one token to the next. Every output's arithmetic depends on its row and token
//! alone. The integer lane sums reach 2³⁰, so their conversion to f32 rounds (relative 2⁻²⁴); the rounding of the
//! activations (at most `s / 2` per value, `s` the block's max|x| / 32767) is the real difference from the f32 path.

use half::f16;

use super::act_q::{quantize, ActQ, Layout, ACT_BLOCK, MAX_GROUP};
use super::q8_0::{Q8_0_BLOCK, Q8_0_BYTES};
use super::ternary::for_row_tasks;

/// Q8_0 blocks per group: one per lane.
const GROUP_BLOCKS: usize = 16;
/// Repacked bytes per group of one row: 8 code registers, the 16 scales (f32), the 16 corrections (i32).
const GROUP_PACKED: usize = 8 * 64 + 64 + 64;
/// Weight rows per tile.
const ROW_TILE: usize = 8;

/// Where the repacked weights put each activation value: value `v` of activation block `j` of a group of four is
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
        hi_plus_128: true,
    }
};

/// Whether the processor has what [`q8_0_matmul_t_vnni`] needs.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::act_q::avx512_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `y[T, N] = x[T, K] · W[N, K]ᵀ`, `w` the Q8_0 blocks of `W`. Panics if the processor lacks the instructions
/// ([`available`]), if K is not a multiple of 128 or the buffers do not match the shapes (programming errors).
pub fn q8_0_matmul_t_vnni(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &mut [f32]) {
    assert!(
        available(),
        "Q8_0 VNNI matmul: not available on this processor"
    );
    assert!(k.is_multiple_of(ACT_BLOCK), "Q8_0 VNNI matmul: K = {k}");
    assert_eq!(x.len(), t * k, "Q8_0 VNNI matmul: x");
    assert_eq!(y.len(), t * n, "Q8_0 VNNI matmul: y");
    assert_eq!(
        w.len(),
        n * k / Q8_0_BLOCK * Q8_0_BYTES,
        "Q8_0 VNNI matmul: w"
    );
    if t == 0 || n == 0 {
        return;
    }
    let a = quantize(x, t, k, &Q8_0_LAYOUT);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of y; the instructions are available.
    unsafe {
        for_row_tasks(n, y, |r0, r1, y| rows(&a, t, w, r0, r1, y, n))
    };
}

/// Repacks one row's Q8_0 blocks (`src`, K / 32 blocks) into `groups` groups of [`GROUP_PACKED`] bytes: code
/// register `r`, lane `j` = bytes `4r..4r + 4` of block `j`; then block `j`'s scale as f32 at `512 + 4j` and
/// `−128·Σ w` of block `j` as i32 at `576 + 4j`. Blocks past the row read as zeros.
fn repack_row(src: &[u8], groups: usize, dst: &mut [u8]) {
    let nb = src.len() / Q8_0_BYTES;
    for (g, out) in dst.chunks_exact_mut(GROUP_PACKED).take(groups).enumerate() {
        for j in 0..GROUP_BLOCKS {
            let qb = g * GROUP_BLOCKS + j;
            let (d, sum) = if qb < nb {
                let block = &src[qb * Q8_0_BYTES..][..Q8_0_BYTES];
                for r in 0..8 {
                    out[64 * r + 4 * j..][..4].copy_from_slice(&block[2 + 4 * r..][..4]);
                }
                let sum: i32 = block[2..].iter().map(|&c| i32::from(c as i8)).sum();
                (f16::from_le_bytes([block[0], block[1]]).to_f32(), sum)
            } else {
                for r in 0..8 {
                    out[64 * r + 4 * j..][..4].fill(0);
                }
                (0.0, 0)
            };
            out[512 + 4 * j..][..4].copy_from_slice(&d.to_le_bytes());
            out[576 + 4 * j..][..4].copy_from_slice(&(-128 * sum).to_le_bytes());
        }
    }
}

/// Rows `r0..r1` of the output for every token of `a`.
///
/// # Safety
/// [`available`]; `y` is `[t, n]` and this call alone writes its columns `r0..r1`; `w` holds `n` Q8_0 rows of
/// `a.k` values.
#[cfg(target_arch = "x86_64")]
unsafe fn rows(a: &ActQ, t: usize, w: &[u8], r0: usize, r1: usize, y: *mut f32, n: usize) {
    let row_bytes = a.k / Q8_0_BLOCK * Q8_0_BYTES;
    let groups = a.pairs;
    let per_row = groups * GROUP_PACKED;
    let mut packed = vec![0u8; (r1 - r0) * per_row];
    for (r, dst) in (r0..r1).zip(packed.chunks_exact_mut(per_row)) {
        repack_row(&w[r * row_bytes..(r + 1) * row_bytes], groups, dst);
    }
    // Tokens in chunks whose activations (2 bytes per value) fit in about 128 KB, next to the task's repacked rows.
    let chunk = ((128 << 10) / (2 * a.k)).max(4);
    for c0 in (0..t).step_by(chunk) {
        let mut r = r0;
        while r < r1 {
            let rt = ROW_TILE.min(r1 - r);
            let packed = &packed[(r - r0) * per_row..];
            for i in c0..(c0 + chunk).min(t) {
                let y = y.wrapping_add(i * n + r);
                // SAFETY: forwarded from the caller; the tile's outputs are columns r..r + rt of row i.
                unsafe {
                    match rt {
                        8 => tile::<8>(a, i, packed, y),
                        7 => tile::<7>(a, i, packed, y),
                        6 => tile::<6>(a, i, packed, y),
                        5 => tile::<5>(a, i, packed, y),
                        4 => tile::<4>(a, i, packed, y),
                        3 => tile::<3>(a, i, packed, y),
                        2 => tile::<2>(a, i, packed, y),
                        1 => tile::<1>(a, i, packed, y),
                        other => unreachable!("tile {other}"),
                    }
                }
            }
            r += rt;
        }
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One tile: the first `R` repacked rows of `packed` × token `i` of `a`.
///
/// # Safety
/// [`available`]; `y + j` writable for `j < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize>(a: &ActQ, i: usize, packed: &[u8], y: *mut f32) {
    let groups = a.pairs;
    assert!(packed.len() >= R * groups * GROUP_PACKED);
    assert!(a.pair_bytes == 512 && a.hi.len() >= (i + 1) * groups * 512);
    let mut acc = [_mm512_setzero_ps(); R];
    let pp = packed.as_ptr();
    for g in 0..groups {
        let off = (i * groups + g) * 512;
        // SAFETY: group g of token i of a, and group g of rows rr < R of packed (asserted above).
        unsafe {
            let hp = a.hi.as_ptr().add(off) as *const __m512i;
            let lp = a.lo.as_ptr().add(off) as *const __m512i;
            let hu: [__m512i; 8] = std::array::from_fn(|r| _mm512_loadu_si512(hp.add(r)));
            let lo: [__m512i; 8] = std::array::from_fn(|r| _mm512_loadu_si512(lp.add(r)));
            let s = _mm512_loadu_ps(a.scale_lanes.as_ptr().add((i * groups + g) * 16));
            for (rr, acc) in acc.iter_mut().enumerate() {
                let p = pp.add((rr * groups + g) * GROUP_PACKED);
                let mut hs = _mm512_loadu_si512(p.add(576) as *const __m512i);
                let mut ls = _mm512_setzero_si512();
                for r in 0..8 {
                    let wv = _mm512_loadu_si512(p.add(64 * r) as *const __m512i);
                    hs = _mm512_dpbusd_epi32(hs, hu[r], wv);
                    ls = _mm512_dpbusd_epi32(ls, lo[r], wv);
                }
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(hs), ls);
                let ds = _mm512_mul_ps(_mm512_loadu_ps(p.add(512) as *const f32), s);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ds, *acc);
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
    use super::*;

    /// Random-ish Q8_0 rows [n, k]: every code value, scales 0.001..0.01.
    fn q8_0(n: usize, k: usize, seed: usize) -> Vec<u8> {
        let mut raw = Vec::new();
        for b in 0..n * k / 32 {
            let d = 0.001 + 0.0007 * ((b + seed) % 13) as f32;
            raw.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            raw.extend((0..32).map(|i| ((i * 71 + b * 29 + seed) % 256) as u8));
        }
        raw
    }

    fn decoded(raw: &[u8]) -> Vec<f64> {
        raw.chunks_exact(Q8_0_BYTES)
            .flat_map(|b| {
                let d = f64::from(f16::from_le_bytes([b[0], b[1]]).to_f32());
                b[2..].iter().map(move |&c| f64::from(c as i8) * d)
            })
            .collect()
    }

    /// x rounded as the quantizer rounds it, per 128-value block.
    fn rounded(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let mut out = Vec::new();
        let mut steps = Vec::new();
        for xs in x.chunks_exact(ACT_BLOCK) {
            let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (s, inv) = if max == 0.0 {
                (0.0, 0.0)
            } else {
                (max / 32767.0, 32767.0 / max)
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
        // K: one group of 4 blocks (128), 12 blocks, 16 (one whole group), 20 (a whole group and a quarter);
        // N: row tiles 1..8 and their tails; T: 1 to 9.
        for (t, k, n, seed) in [
            (3, 128, 1, 1),
            (1, 384, 7, 2),
            (5, 512, 13, 3),
            (9, 640, 67, 4),
            (4, 1536, 9, 5),
        ] {
            let raw = q8_0(n, k, seed);
            let wf = decoded(&raw);
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 7919 + seed) % 2003) as f32 / 500.0 - 2.0)
                .collect();
            let (xr, steps) = rounded(&x);
            let mut y = vec![f32::NAN; t * n];
            q8_0_matmul_t_vnni(&x, t, &raw, n, k, &mut y);
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
    fn a_token_reads_the_same_bits_alone_and_stacked_with_others() {
        if !available() {
            return;
        }
        let (t, k, n) = (7, 640, 19);
        let raw = q8_0(n, k, 9);
        let x: Vec<f32> = (0..t * k)
            .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let mut all = vec![0f32; t * n];
        q8_0_matmul_t_vnni(&x, t, &raw, n, k, &mut all);
        for i in 0..t {
            let mut one = vec![0f32; n];
            q8_0_matmul_t_vnni(&x[i * k..(i + 1) * k], 1, &raw, n, k, &mut one);
            assert!(
                one.iter()
                    .zip(&all[i * n..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "token {i}"
            );
        }
    }
}

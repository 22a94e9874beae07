//! The PQ2_0 matvec/GEMM on integer dot products (AVX-512 VNNI): the activations rounded once per call to the
//! two-level 16-bit form of [`super::act_q`], each weight block's 2-bit codes `c` unpacked to bytes and dotted
//! with the activation bytes: `Σ (c − 1)·q = 256·Σ c·h + Σ c·l − Σ q` (`vpdpbusd` with `c` as the unsigned
//! operand against `h`, and `l` as the unsigned operand against `c`, which as a byte is also a valid signed one;
//! the `−Σ q` term is the accumulator the second dot starts from). Per block and token the 16 lanes of the exact
//! integer sum (below 2²⁴ in magnitude, so exact in f32) are converted once and added with the factor `d·s` into
//! 16 f32 lanes, which are reduced at the end of the row in a fixed tree: an output's arithmetic depends on its
//! token and row alone, not on how many tokens the call stacks (batch invariance).
//!
//! Unpacking: the 32 code bytes of a block are broadcast to both halves of a 64-byte register and shifted (as
//! 16-bit words) right by 0 and 2 (first register) or 4 and 6 (second), then masked to two bits: stored position
//! `p` holds the code of value `4·(p mod 32) + p / 32`, the order the activations are quantized in
//! ([`PQ2_0_ORDER`]).
//!
//! Tiles are 4 weight rows × up to 4 tokens: each unpacked block serves the tile's tokens, each activation load
//! the tile's rows. The rounding of the activations (at most `s / 2` per value, `s` the block's max|x| / 32767)
//! is the only difference from the f32 kernels: see docs/ARCHITECTURE.md's tolerance table for what it costs.

use super::act_q::{ActQ, ACT_BLOCK, LANES, PAIR_BYTES};
use super::ternary::{PQ2_0_BLOCK, PQ2_0_BYTES};

/// The activation order of the unpacked codes: stored position `p` holds value `4·(p mod 32) + p / 32`.
pub const PQ2_0_ORDER: [u8; ACT_BLOCK] = {
    let mut o = [0u8; ACT_BLOCK];
    let mut p = 0;
    while p < ACT_BLOCK {
        o[p] = (4 * (p % 32) + p / 32) as u8;
        p += 1;
    }
    o
};

/// Whether the processor has what [`rows`] needs.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("gfni")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Rows `r0..r1` of the output for every token of `a` (quantized in [`PQ2_0_ORDER`]).
///
/// # Safety
/// [`available`]; `y` is `[t, n]` and this call alone writes its columns `r0..r1`; `w` holds `n` rows of
/// `a.k / 128` blocks.
#[cfg(target_arch = "x86_64")]
pub unsafe fn rows(a: &ActQ, t: usize, w: &[u8], r0: usize, r1: usize, y: *mut f32, n: usize) {
    let row_bytes = a.k / PQ2_0_BLOCK * PQ2_0_BYTES;
    // One token: 4 rows share each activation load. Several: 2 rows × 4 tokens share each unpacked block.
    let row_tile = if t == 1 { 4 } else { 2 };
    let mut r = r0;
    while r < r1 {
        let rt = row_tile.min(r1 - r);
        let w = &w[r * row_bytes..(r + rt) * row_bytes];
        let mut t0 = 0;
        while t0 < t {
            let tt = 4.min(t - t0);
            let y = y.wrapping_add(t0 * n + r);
            // SAFETY: forwarded from the caller; the tile's outputs lie in columns r..r + rt of rows t0..t0 + tt.
            unsafe {
                match (rt, tt) {
                    (4, 1) => tile::<4, 1>(a, t0, w, row_bytes, y, n),
                    (3, 1) => tile::<3, 1>(a, t0, w, row_bytes, y, n),
                    (2, 1) => tile::<2, 1>(a, t0, w, row_bytes, y, n),
                    (1, 1) => tile::<1, 1>(a, t0, w, row_bytes, y, n),
                    (2, 2) => tile::<2, 2>(a, t0, w, row_bytes, y, n),
                    (2, 3) => tile::<2, 3>(a, t0, w, row_bytes, y, n),
                    (2, 4) => tile::<2, 4>(a, t0, w, row_bytes, y, n),
                    (1, 2) => tile::<1, 2>(a, t0, w, row_bytes, y, n),
                    (1, 3) => tile::<1, 3>(a, t0, w, row_bytes, y, n),
                    (1, 4) => tile::<1, 4>(a, t0, w, row_bytes, y, n),
                    other => unreachable!("tile {other:?}"),
                }
            }
            t0 += tt;
        }
        r += rt;
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One pair of blocks of one row, unpacked: the four code registers (stored chunk `c` of both blocks) and the
/// 16 lanes of the two scales `d`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Codes {
    c: [__m512i; 4],
    d: __m512,
}

/// Unpacks blocks `b` and `b + 1` (`two`: whether `b + 1` exists) of the row starting at `row`.
///
/// # Safety
/// [`available`]; block `b` (and `b + 1` if `two`) lies inside the row.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,gfni,f16c")]
unsafe fn unpack(row: *const u8, b: usize, two: bool) -> Codes {
    // SAFETY: per the contract: 34 bytes at block b (and b + 1).
    unsafe {
        let p = row.add(b * PQ2_0_BYTES);
        let lo = _mm256_loadu_si256(p.add(2) as *const __m256i);
        let (codes, d_bits) = if two {
            let q = p.add(PQ2_0_BYTES);
            let hi = _mm256_loadu_si256(q.add(2) as *const __m256i);
            let bits = u32::from((p as *const u16).read_unaligned())
                | (u32::from((q as *const u16).read_unaligned()) << 16);
            (_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), bits)
        } else {
            (
                _mm512_zextsi256_si512(lo),
                u32::from((p as *const u16).read_unaligned()),
            )
        };
        // Bits 2c and 2c + 1 of every byte to bits 0 and 1: an 8×8 bit-matrix product per byte (row 7 − i of the
        // matrix picks output bit i).
        let plane = |c: i64| {
            _mm512_gf2p8affine_epi64_epi8::<0>(
                codes,
                _mm512_set1_epi64(((1i64 << (2 * c)) << 56) | ((1i64 << (2 * c + 1)) << 48)),
            )
        };
        let two_d = _mm_cvtph_ps(_mm_cvtsi32_si128(d_bits as i32));
        let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        Codes {
            c: [plane(0), plane(1), plane(2), plane(3)],
            d: _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(two_d)),
        }
    }
}

/// One token's pair of blocks: the four h and four l registers, the lane sums and the lane scales.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Acts {
    h: [__m512i; 4],
    l: [__m512i; 4],
    neg_sums: __m512i,
    s: __m512,
}

/// # Safety
/// [`available`]; `pair` < the tokens × pairs of `a`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn acts(a: &ActQ, pair: usize) -> Acts {
    // SAFETY: pair `pair` of a's arrays (the contract).
    unsafe {
        let hp = a.hi.as_ptr().add(pair * PAIR_BYTES) as *const __m512i;
        let lp = a.lo.as_ptr().add(pair * PAIR_BYTES) as *const __m512i;
        Acts {
            h: [0, 1, 2, 3].map(|c| _mm512_loadu_si512(hp.add(c))),
            l: [0, 1, 2, 3].map(|c| _mm512_loadu_si512(lp.add(c))),
            neg_sums: _mm512_loadu_si512(a.neg_lane_sums.as_ptr().add(pair * LANES) as *const __m512i),
            s: _mm512_loadu_ps(a.scale_lanes.as_ptr().add(pair * LANES)),
        }
    }
}

/// `acc + d·s·Σ (c − 1)·q` over one pair of blocks, lane by lane (the same operations whatever the tile).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn dot_pair(w: &Codes, x: &Acts, acc: __m512) -> __m512 {
    let mut hs = _mm512_setzero_si512();
    let mut ls = x.neg_sums;
    for c in 0..4 {
        hs = _mm512_dpbusd_epi32(hs, w.c[c], x.h[c]);
        ls = _mm512_dpbusd_epi32(ls, x.l[c], w.c[c]);
    }
    let exact = _mm512_add_epi32(_mm512_slli_epi32::<8>(hs), ls);
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(w.d, x.s), acc)
}

/// One tile: `R` rows of `w` (from its start) × tokens `t0..t0 + TT` of `a`.
///
/// # Safety
/// [`available`]; `y + i·n + j` writable for `i < TT`, `j < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,gfni,f16c")]
unsafe fn tile<const R: usize, const TT: usize>(
    a: &ActQ,
    t0: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    let nb = a.k / ACT_BLOCK;
    assert!(w.len() >= R * row_bytes && a.hi.len() >= (t0 + TT) * a.pairs * PAIR_BYTES);
    let mut acc = [[_mm512_setzero_ps(); TT]; R];
    let wp = w.as_ptr();
    for pb in 0..a.pairs {
        let (b, two) = (2 * pb, 2 * pb + 1 < nb);
        // SAFETY (both branches): the blocks lie in rows rr < R of w, the pairs in tokens < t0 + TT of a
        // (asserted above).
        if TT == 1 {
            // Each row unpacked right before its dot: the token's registers stay loaded across the rows.
            let x = unsafe { acts(a, t0 * a.pairs + pb) };
            for (rr, acc) in acc.iter_mut().enumerate() {
                let c = unsafe { unpack(wp.add(rr * row_bytes), b, two) };
                acc[0] = dot_pair(&c, &x, acc[0]);
            }
        } else {
            let c: [Codes; R] =
                std::array::from_fn(|rr| unsafe { unpack(wp.add(rr * row_bytes), b, two) });
            for i in 0..TT {
                let x = unsafe { acts(a, (t0 + i) * a.pairs + pb) };
                for rr in 0..R {
                    acc[rr][i] = dot_pair(&c[rr], &x, acc[rr][i]);
                }
            }
        }
    }
    for (rr, acc) in acc.iter().enumerate() {
        for (i, &v) in acc.iter().enumerate() {
            // SAFETY: see the function's contract.
            unsafe { *y.add(i * n + rr) = _mm512_reduce_add_ps(v) };
        }
    }
}

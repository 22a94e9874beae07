//! Activations rounded for integer dot products: each block of 128 values of a token becomes 16-bit integers
//! `q = round(x / s)` with `s = max|x| / 32767` (so the rounding error is at most `s / 2`, 2⁻¹⁶ of the block's
//! largest value), stored in two bytes per value, `q = 256·h + l` with `h` signed (−128..127) and `l` unsigned
//! (0..255), so that the VNNI byte dot product (`vpdpbusd`, unsigned × signed bytes into 32-bit sums) can take
//! either half: `Σ w·q = 256·Σ w·h + Σ w·l`.
//!
//! Layout, made for 64-byte registers whose two halves hold two consecutive blocks: a block's 128 bytes are four
//! 32-byte chunks (stored position `p` of the block holds value `order[p]`, the order the kernel's weight unpacking
//! produces), and blocks go in pairs, chunk `c` of block `2P + j` at byte `64·c + 32·j` of pair `P`'s 256 bytes (an
//! odd last block is paired with zeros). Per pair and token come the 16 lanes `s` of the two blocks (lanes 0..8 the
//! first block's scale, 8..16 the second's) and minus the sums of `q` over the bytes that each 32-bit lane of the
//! dot products covers (`neg_lane_sums`): the correction for weights stored as unsigned codes `c` with value
//! `c − 1`, `Σ (c − 1)·q = 256·Σ c·h + Σ c·l − Σ q`.
//!
//! Quantized once per matmul call, shared by every weight row. A block whose values are not all finite gets the
//! scale NaN, so the outputs that read it are NaN as with float activations.

/// Values per activation block.
pub const ACT_BLOCK: usize = 128;
/// 32-bit lanes of a 64-byte dot product.
pub const LANES: usize = 16;
/// Bytes of a pair of blocks (per half: h or l).
pub const PAIR_BYTES: usize = 2 * ACT_BLOCK;

/// `x[T, K]` in the two-level 16-bit form.
pub struct ActQ {
    /// Values per token.
    pub k: usize,
    /// Pairs of blocks per token.
    pub pairs: usize,
    /// h: [T, pairs, 256] high bytes (signed), in the layout above.
    pub hi: Vec<i8>,
    /// l: [T, pairs, 256] low bytes (unsigned).
    pub lo: Vec<u8>,
    /// s: [T, pairs, 16], `x ≈ s·q`.
    pub scale_lanes: Vec<f32>,
    /// [T, pairs, 16]: lane `j` holds −Σ q over bytes `4·(j mod 8)..+4` of the four chunks of block `j / 8`.
    pub neg_lane_sums: Vec<i32>,
}

/// The natural order: stored position `p` holds value `p` of the block.
#[allow(dead_code)]
pub const NATURAL: [u8; ACT_BLOCK] = {
    let mut o = [0u8; ACT_BLOCK];
    let mut p = 0;
    while p < ACT_BLOCK {
        o[p] = p as u8;
        p += 1;
    }
    o
};

/// The largest `|q|`.
const Q_MAX: f32 = 32767.0;

/// Byte offset of stored position `p` of block `j` (0 or 1) within its pair.
#[inline(always)]
pub fn pair_offset(j: usize, p: usize) -> usize {
    64 * (p / 32) + 32 * j + p % 32
}

/// Quantizes `x[T, K]` (K a multiple of 128); stored position `p` of each block holds value `order[p]`.
pub fn quantize(x: &[f32], t: usize, k: usize, order: &[u8; ACT_BLOCK]) -> ActQ {
    assert!(k.is_multiple_of(ACT_BLOCK) && x.len() == t * k);
    let nb = k / ACT_BLOCK;
    let pairs = nb.div_ceil(2);
    let mut out = ActQ {
        k,
        pairs,
        hi: vec![0; t * pairs * PAIR_BYTES],
        lo: vec![0; t * pairs * PAIR_BYTES],
        scale_lanes: vec![0.0; t * pairs * LANES],
        neg_lane_sums: vec![0; t * pairs * LANES],
    };
    for i in 0..t {
        for b in 0..nb {
            let xs = &x[i * k + b * ACT_BLOCK..][..ACT_BLOCK];
            let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bad = xs.iter().any(|v| !v.is_finite());
            let (s, inv) = if bad {
                (f32::NAN, 0.0)
            } else if max == 0.0 {
                (0.0, 0.0)
            } else {
                (max / Q_MAX, Q_MAX / max)
            };
            let pair = i * pairs + b / 2;
            let j = b % 2;
            out.scale_lanes[pair * LANES + 8 * j..][..8].fill(s);
            let hi = &mut out.hi[pair * PAIR_BYTES..][..PAIR_BYTES];
            let lo = &mut out.lo[pair * PAIR_BYTES..][..PAIR_BYTES];
            let sums = &mut out.neg_lane_sums[pair * LANES + 8 * j..][..8];
            for (p, &src) in order.iter().enumerate() {
                let q = round_q(xs[usize::from(src)], inv);
                let o = pair_offset(j, p);
                hi[o] = (q >> 8) as i8;
                lo[o] = (q & 0xFF) as u8;
                sums[(p % 32) / 4] -= q;
            }
        }
    }
    out
}

/// `round(x · inv)` clamped to ±32767 (ties away from zero).
#[inline(always)]
pub fn round_q(x: f32, inv: f32) -> i32 {
    (x * inv).round().clamp(-Q_MAX, Q_MAX) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_bytes_give_back_q_and_q_gives_back_x_within_half_a_step() {
        let mut rev = NATURAL;
        rev.reverse();
        // Three blocks per token: one whole pair and one padded with zeros.
        let k = 3 * ACT_BLOCK;
        let x: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let a = quantize(&x, 2, k, &rev);
        assert_eq!(a.pairs, 2);
        for i in 0..2 {
            for b in 0..4 {
                let pair = i * 2 + b / 2;
                let (j, base) = (b % 2, pair * PAIR_BYTES);
                let mut sums = [0i32; 8];
                for p in 0..ACT_BLOCK {
                    let o = base + 64 * (p / 32) + 32 * j + p % 32;
                    let q = 256 * i32::from(a.hi[o]) + i32::from(a.lo[o]);
                    sums[(p % 32) / 4] -= q;
                    let s = a.scale_lanes[pair * LANES + 8 * j];
                    if b == 3 {
                        assert_eq!((q, s), (0, 0.0), "padding");
                        continue;
                    }
                    let xs = &x[i * k + b * ACT_BLOCK..][..ACT_BLOCK];
                    let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    assert_eq!(s, max / 32767.0);
                    let v = xs[usize::from(rev[p])];
                    assert!((q as f32 * s - v).abs() <= 0.5001 * s, "{v} vs {q}·{s}");
                }
                assert_eq!(&a.neg_lane_sums[pair * LANES + 8 * j..][..8], &sums);
                let lanes = &a.scale_lanes[pair * LANES + 8 * j..][..8];
                assert!(lanes.iter().all(|&v| v == lanes[0]));
            }
        }
    }

    #[test]
    fn zero_blocks_read_zero_and_non_finite_blocks_read_nan() {
        let mut x = vec![0f32; 3 * ACT_BLOCK];
        x[ACT_BLOCK + 5] = f32::INFINITY;
        x[2 * ACT_BLOCK + 9] = f32::NAN;
        let a = quantize(&x, 1, 3 * ACT_BLOCK, &NATURAL);
        assert_eq!(a.scale_lanes[0], 0.0);
        assert!(a.scale_lanes[8].is_nan() && a.scale_lanes[16].is_nan());
        assert!(a.hi.iter().all(|&h| h == 0) && a.lo.iter().all(|&l| l == 0));
    }
}

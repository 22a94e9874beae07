//! Activations rounded for integer dot products: each block of 128 values of a token becomes 16-bit integers
//! `q = round(x / s)` with `s = max|x| / 32767` (32639 in a balanced layout, below; so the rounding error is at
//! most `s / 2`, about 2⁻¹⁶ of the block's largest value), stored in two bytes per value, `q = 256·h + l` with `h`
//! signed (−128..127) and `l` unsigned (0..255), so that the VNNI byte dot product (`vpdpbusd`, unsigned × signed bytes into 32-bit sums) can take
//! either half: `Σ w·q = 256·Σ w·h + Σ w·l`.
//!
//! Blocks go in groups (pairs for the ternary kernels, four for Q8_0, eight for regrouped PQ2_0), each group filling a few 64-byte registers
//! in the order the kernel's weight unpacking produces (a [`Layout`]: which byte each value of the group's blocks
//! lands on; bytes no value lands on hold zero; a last group short of blocks is filled with zeros). Per group and
//! token come the 16 lanes of `s` (each 32-bit lane of the registers belongs to one block; lanes of none read 0)
//! and minus the sums of `q` over the bytes each lane covers (`neg_lane_sums`): the correction for weights stored
//! as unsigned codes `c` with value `c − 1`, `Σ (c − 1)·q = 256·Σ c·h + Σ c·l − Σ q`, is then the accumulator the
//! dot products start from. A layout may ask for both bytes signed (`balanced`: `l` in −128..127, so that `|q|`
//! stays within 32639 = 127·256 + 127), for weights stored as unsigned bytes `w + 128` that are the unsigned
//! operand of both dot products: `Σ w·q = 256·Σ (w + 128)·h + Σ (w + 128)·l − 128·Σ q`.
//!
//! Quantized once per matmul call (once for all the weights of a `matmul_t_many` call), shared by every weight row.
//! A block whose values are not all finite gets the scale NaN, so the outputs that read it are NaN as with float
//! activations.

use rayon::prelude::*;

/// Values per activation block.
pub const ACT_BLOCK: usize = 128;
/// 32-bit lanes of a 64-byte dot product.
pub const LANES: usize = 16;

/// Most blocks per group (the regrouped PQ2_0 layout's eight).
pub const MAX_GROUP: usize = 8;

/// Where a kernel reads each activation value of a group of blocks (a pair for the ternary kernels, four for Q8_0).
pub struct Layout {
    /// Blocks per group (at most [`MAX_GROUP`]).
    pub blocks: usize,
    /// 64-byte registers per group.
    pub regs: usize,
    /// `slot[j][v]`: the byte (below `64 · regs`) of value `v` of block `j` of the group (`j < blocks`).
    pub slot: [[u16; ACT_BLOCK]; MAX_GROUP],
    /// Whether both bytes are signed (`q = 256·h + l` with `l` in −128..127, `|q|` at most 32639); else `l` is
    /// unsigned (0..255) and `|q|` at most 32767.
    pub balanced: bool,
}

impl Layout {
    /// The largest `|q|` of the layout's rounding.
    pub const fn q_max(&self) -> i32 {
        if self.balanced {
            BALANCED_Q_MAX
        } else {
            Q_MAX
        }
    }

    /// `q` as its two bytes `(h, l)`, in the layout's split.
    #[inline(always)]
    pub fn split(&self, q: i32) -> (i8, u8) {
        if self.balanced {
            let h = (q + 128) >> 8;
            (h as i8, (q - 256 * h) as i8 as u8)
        } else {
            ((q >> 8) as i8, (q & 0xFF) as u8)
        }
    }

    /// Bytes per group (of h or of l).
    pub const fn pair_bytes(&self) -> usize {
        64 * self.regs
    }

    /// The block of the group each lane reads, if any. Panics if a lane mixes blocks (a wrong layout).
    fn lane_blocks(&self) -> [Option<usize>; LANES] {
        let mut lanes = [None; LANES];
        for (j, slots) in self.slot[..self.blocks].iter().enumerate() {
            for &o in slots {
                let lane = &mut lanes[(usize::from(o) % 64) / 4];
                assert!(lane.is_none_or(|b| b == j), "layout: a lane mixes blocks");
                *lane = Some(j);
            }
        }
        lanes
    }
}

/// `x[T, K]` in the two-level 16-bit form.
pub struct ActQ {
    /// Values per token.
    pub k: usize,
    /// Groups of blocks per token (pairs for the ternary layouts).
    pub pairs: usize,
    /// Bytes per pair of [`Self::hi`] and [`Self::lo`].
    pub pair_bytes: usize,
    /// h: [T, pairs, pair_bytes] high bytes (signed), in the layout's order.
    pub hi: Vec<i8>,
    /// l: [T, pairs, pair_bytes] low bytes (unsigned; the bits of signed bytes in a balanced layout).
    pub lo: Vec<u8>,
    /// s: [T, pairs, 16], `x ≈ s·q`, each lane its block's.
    pub scale_lanes: Vec<f32>,
    /// [T, pairs, 16]: lane `j` holds −Σ q over the bytes `4j..4j + 4` of each register.
    pub neg_lane_sums: Vec<i32>,
}

/// The largest `|q|`.
const Q_MAX: i32 = 32767;
/// The largest `|q|` of a balanced layout: `h` = 127 and `l` = 127.
const BALANCED_Q_MAX: i32 = 127 * 256 + 127;

/// Whether the processor has the AVX-512 integer dot products the kernels on these activations run (F, BW, VNNI;
/// the ternary ones need GFNI and F16C besides).
#[cfg(target_arch = "x86_64")]
pub fn avx512_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Quantizes `x[T, K]` (K a multiple of 128) into `layout`, the tokens in parallel when there are many values.
pub fn quantize(x: &[f32], t: usize, k: usize, layout: &Layout) -> ActQ {
    assert!(k.is_multiple_of(ACT_BLOCK) && x.len() == t * k);
    let pairs = (k / ACT_BLOCK).div_ceil(layout.blocks);
    let pair_bytes = layout.pair_bytes();
    let mut out = ActQ {
        k,
        pairs,
        pair_bytes,
        hi: vec![0; t * pairs * pair_bytes],
        lo: vec![0; t * pairs * pair_bytes],
        scale_lanes: vec![0.0; t * pairs * LANES],
        neg_lane_sums: vec![0; t * pairs * LANES],
    };
    let plan = Plan::new(layout);
    let per_token = pairs * pair_bytes;
    let tokens = out
        .hi
        .chunks_exact_mut(per_token)
        .zip(out.lo.chunks_exact_mut(per_token))
        .zip(out.scale_lanes.chunks_exact_mut(pairs * LANES))
        .zip(out.neg_lane_sums.chunks_exact_mut(pairs * LANES))
        .zip(x.chunks_exact(k));
    let one = |((((hi, lo), scales), sums), xs): TokenOut<'_>| {
        token(
            xs,
            &plan,
            Slices {
                hi,
                lo,
                scales,
                sums,
            },
        )
    };
    if t * k >= 1 << 16 {
        tokens.par_bridge().for_each(one);
    } else {
        tokens.for_each(one);
    }
    out
}

/// One token's output slices and its values.
type TokenOut<'a> = (
    (((&'a mut [i8], &'a mut [u8]), &'a mut [f32]), &'a mut [i32]),
    &'a [f32],
);

/// One token's slices of [`ActQ`].
struct Slices<'a> {
    hi: &'a mut [i8],
    lo: &'a mut [u8],
    scales: &'a mut [f32],
    sums: &'a mut [i32],
}

/// What a call reads of its layout, worked out once for all its tokens.
struct Plan<'a> {
    layout: &'a Layout,
    /// The block of the group each lane reads.
    lane_blocks: [Option<usize>; LANES],
    /// Whether the layout is PQ2_0's (value `4i + c` of block `j` at byte `i` of half `j` of register `c`), which is
    /// placed by strided copies instead of slot by slot.
    strided: bool,
}

impl<'a> Plan<'a> {
    fn new(layout: &'a Layout) -> Self {
        assert!(
            layout.pair_bytes() <= PLACED,
            "layout: {} bytes per group",
            layout.pair_bytes()
        );
        let strided = layout.blocks <= 2
            && layout.regs == 4
            && (0..layout.blocks).all(|j| {
                (0..ACT_BLOCK)
                    .all(|v| usize::from(layout.slot[j][v]) == 64 * (v % 4) + 32 * j + v / 4)
            });
        Plan {
            layout,
            lane_blocks: layout.lane_blocks(),
            strided,
        }
    }
}

/// Quantizes one token `xs` [K] into its slices of [`ActQ`] (with AVX-512 where the processor has it: the same
/// arithmetic, vectorised).
fn token(xs: &[f32], plan: &Plan<'_>, out: Slices<'_>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the features were just detected.
        unsafe { token_avx512(xs, plan, out) };
        return;
    }
    token_body(xs, plan, out);
}

/// [`token_body`] compiled for AVX-512.
///
/// # Safety
/// The processor has AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn token_avx512(xs: &[f32], plan: &Plan<'_>, out: Slices<'_>) {
    token_body(xs, plan, out);
}

/// One group of blocks at a time: each block's `q` in value order (loops the compiler vectorises), placed by the
/// layout into the group's bytes as 32-bit values, then split into the two byte planes and summed lane by lane.
#[inline(always)]
fn token_body(xs: &[f32], plan: &Plan<'_>, out: Slices<'_>) {
    let Slices {
        hi,
        lo,
        scales,
        sums,
    } = out;
    let layout = plan.layout;
    let pair_bytes = layout.pair_bytes();
    let q_max = layout.q_max();
    let mut placed = [0i32; PLACED];
    for (pair, xs) in xs.chunks(ACT_BLOCK * layout.blocks).enumerate() {
        placed[..pair_bytes].fill(NONE);
        for (j, xs) in xs.chunks_exact(ACT_BLOCK).enumerate() {
            // Lane-wise max|x| (a NaN is skipped here and caught by `bad`) and whether any value is not finite.
            let mut lanes = [0f32; 16];
            let mut finite = [true; 16];
            for c in xs.chunks_exact(16) {
                for ((m, f), &v) in lanes.iter_mut().zip(&mut finite).zip(c) {
                    let a = v.abs();
                    *m = if a > *m { a } else { *m };
                    *f &= a < f32::INFINITY;
                }
            }
            let max = lanes.iter().fold(0f32, |m, &v| m.max(v));
            let bad = finite.contains(&false);
            let (s, inv) = if bad {
                (f32::NAN, 0.0)
            } else if max == 0.0 {
                (0.0, 0.0)
            } else {
                (max / q_max as f32, q_max as f32 / max)
            };
            for (lane, block) in scales[pair * LANES..][..LANES]
                .iter_mut()
                .zip(&plan.lane_blocks)
            {
                if *block == Some(j) {
                    *lane = s;
                }
            }
            let mut q = [0i32; ACT_BLOCK];
            for (q, &v) in q.iter_mut().zip(xs) {
                *q = round_q(v, inv, q_max);
            }
            if plan.strided {
                // Value 4i + c at byte i of half j of register c: strided loads the compiler turns into shuffles.
                for c in 0..4 {
                    for i in 0..32 {
                        placed[64 * c + 32 * j + i] = q[4 * i + c];
                    }
                }
            } else {
                for (&q, &o) in q.iter().zip(&layout.slot[j]) {
                    // The mask keeps the index in bounds without a check (the layout's slots are below its bytes).
                    placed[usize::from(o) & (PLACED - 1)] = q;
                }
            }
        }
        let hi = &mut hi[pair * pair_bytes..][..pair_bytes];
        let lo = &mut lo[pair * pair_bytes..][..pair_bytes];
        // Bytes no value lands on read 0 in both planes and add nothing to the sums.
        for ((h, l), q) in hi
            .iter_mut()
            .zip(lo.iter_mut())
            .zip(&mut placed[..pair_bytes])
        {
            *q = if *q == NONE { 0 } else { *q };
            (*h, *l) = layout.split(*q);
        }
        let sums = &mut sums[pair * LANES..][..LANES];
        for reg in placed[..pair_bytes].chunks_exact(64) {
            for (sum, g) in sums.iter_mut().zip(reg.chunks_exact(4)) {
                *sum -= g[0] + g[1] + g[2] + g[3];
            }
        }
    }
}

/// A byte of a group no value lands on, while the group is placed (no `q` is this small).
const NONE: i32 = i32::MIN;

/// Bytes per group at most (a power of two): the regrouped PQ2_0 layout's sixteen registers.
const PLACED: usize = 1024;

/// `round(x · inv)` (ties away from zero, as `f32::round`, spelled so that it compiles without a library call)
/// clamped to ±`q_max`.
#[inline(always)]
pub fn round_q(x: f32, inv: f32, q_max: i32) -> i32 {
    let r = x * inv;
    // Truncate, then step away from zero if the (exact) remainder is at least a half.
    let t = r as i32;
    let f = r - t as f32;
    let q = t + i32::from(f >= 0.5) - i32::from(f <= -0.5);
    q.clamp(-q_max, q_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where [`ODD`] puts value `v` of block `j`: block 0 in the low halves, each 32 values reversed; block 1 in
    /// the high halves, the registers reversed.
    const fn odd_slot(j: usize, v: usize) -> usize {
        if j == 0 {
            64 * (v / 32) + 31 - v % 32
        } else {
            64 * (3 - v / 32) + 32 + v % 32
        }
    }

    /// A layout no kernel uses, to check that the quantizer follows the map.
    const ODD: Layout = {
        let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
        let mut v = 0;
        while v < ACT_BLOCK {
            slot[0][v] = odd_slot(0, v) as u16;
            slot[1][v] = odd_slot(1, v) as u16;
            v += 1;
        }
        Layout {
            blocks: 2,
            regs: 4,
            slot,
            balanced: false,
        }
    };

    #[test]
    fn the_two_bytes_give_back_q_and_q_gives_back_x_within_half_a_step() {
        // Three blocks per token: one whole pair and one padded with zeros.
        let k = 3 * ACT_BLOCK;
        let x: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let a = quantize(&x, 2, k, &ODD);
        assert_eq!((a.pairs, a.pair_bytes), (2, 256));
        for pair in 0..4 {
            let (i, base) = (pair / 2, pair * 256);
            let mut sums = [0i32; LANES];
            for j in 0..2 {
                let b = 2 * (pair % 2) + j;
                for v in 0..ACT_BLOCK {
                    let o = base + odd_slot(j, v);
                    let q = 256 * i32::from(a.hi[o]) + i32::from(a.lo[o]);
                    sums[(o % 64) / 4] -= q;
                    if b == 3 {
                        assert_eq!(q, 0, "padding");
                        continue;
                    }
                    let xs = &x[i * k + b * ACT_BLOCK..][..ACT_BLOCK];
                    let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let s = max / 32767.0;
                    assert!(
                        (q as f32 * s - xs[v]).abs() <= 0.5001 * s,
                        "{} vs {q}·{s}",
                        xs[v]
                    );
                }
            }
            assert_eq!(
                &a.neg_lane_sums[pair * LANES..][..LANES],
                &sums,
                "pair {pair}"
            );
        }
    }

    #[test]
    fn lanes_take_the_scale_of_their_block_and_zero_blocks_read_zero() {
        // PQ2_0-like halves: block 0 in the low 32 bytes of each register, block 1 in the high ones.
        let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
        for v in 0..ACT_BLOCK {
            slot[0][v] = (64 * (v / 32) + v % 32) as u16;
            slot[1][v] = (64 * (v / 32) + 32 + v % 32) as u16;
        }
        let halves = Layout {
            blocks: 2,
            regs: 4,
            slot,
            balanced: false,
        };
        let mut x = vec![0f32; 3 * ACT_BLOCK];
        x[5] = 2.0;
        x[ACT_BLOCK + 5] = f32::INFINITY;
        x[2 * ACT_BLOCK + 9] = f32::NAN;
        let a = quantize(&x, 1, 3 * ACT_BLOCK, &halves);
        let s = 2.0 / 32767.0;
        assert!(a.scale_lanes[..8].iter().all(|&v| v == s));
        assert!(a.scale_lanes[8..24].iter().all(|v| v.is_nan()));
        assert!(a.scale_lanes[24..].iter().all(|&v| v == 0.0), "padding");
        assert!(a
            .hi
            .iter()
            .zip(&a.lo)
            .enumerate()
            .all(|(o, (&h, &l))| (h, l) == if o == 5 { (127, 255) } else { (0, 0) }));
    }

    /// The quantizer value by value, as first written: each `q` stored at its slot and subtracted from its lane.
    fn value_by_value(x: &[f32], t: usize, k: usize, layout: &Layout) -> ActQ {
        let pairs = (k / ACT_BLOCK).div_ceil(layout.blocks);
        let pb = layout.pair_bytes();
        let lane_blocks = layout.lane_blocks();
        let mut a = ActQ {
            k,
            pairs,
            pair_bytes: pb,
            hi: vec![0; t * pairs * pb],
            lo: vec![0; t * pairs * pb],
            scale_lanes: vec![0.0; t * pairs * LANES],
            neg_lane_sums: vec![0; t * pairs * LANES],
        };
        for (i, xs) in x.chunks_exact(k).enumerate() {
            for (b, xs) in xs.chunks_exact(ACT_BLOCK).enumerate() {
                let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let (s, inv) = if xs.iter().any(|v| !v.is_finite()) {
                    (f32::NAN, 0.0)
                } else if max == 0.0 {
                    (0.0, 0.0)
                } else {
                    let q_max = layout.q_max() as f32;
                    (max / q_max, q_max / max)
                };
                let (pair, j) = (i * pairs + b / layout.blocks, b % layout.blocks);
                for (lane, block) in lane_blocks.iter().enumerate() {
                    if *block == Some(j) {
                        a.scale_lanes[pair * LANES + lane] = s;
                    }
                }
                for (&v, &o) in xs.iter().zip(&layout.slot[j]) {
                    let (q, o) = (round_q(v, inv, layout.q_max()), usize::from(o));
                    let (h, l) = if layout.balanced {
                        let h = (q + 128).div_euclid(256);
                        (h, q - 256 * h)
                    } else {
                        (q.div_euclid(256), q.rem_euclid(256))
                    };
                    a.hi[pair * pb + o] = i8::try_from(h).expect("high byte");
                    a.lo[pair * pb + o] = if layout.balanced {
                        i8::try_from(l).expect("signed low byte") as u8
                    } else {
                        u8::try_from(l).expect("unsigned low byte")
                    };
                    a.neg_lane_sums[pair * LANES + (o % 64) / 4] -= q;
                }
            }
        }
        a
    }

    #[test]
    fn every_kernel_layout_matches_the_value_by_value_quantizer() {
        use crate::cpu::q8_0_vnni::Q8_0_LAYOUT;
        use crate::cpu::ternary_grouped::PQ2_0G_LAYOUT;
        use crate::cpu::ternary_vnni::{PQ2_0_LAYOUT, PTQ1_0_LAYOUT};
        // Seven blocks per token (the last group short), three tokens; a zero block, a block with an infinity and
        // one with a NaN, values at the rounding ties.
        let (t, k) = (3, 7 * ACT_BLOCK);
        let mut seed = 0x05ee_da11_u64;
        let mut x: Vec<f32> = (0..t * k)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect();
        x[2 * ACT_BLOCK..3 * ACT_BLOCK].fill(0.0);
        x[k + 5] = f32::INFINITY;
        x[2 * k + ACT_BLOCK + 9] = f32::NAN;
        x[4 * ACT_BLOCK] = 32767.0;
        x[4 * ACT_BLOCK + 1] = 0.5;
        x[4 * ACT_BLOCK + 2] = -1.5;
        for (name, layout) in [
            ("PQ2_0", &PQ2_0_LAYOUT),
            ("PTQ1_0", &PTQ1_0_LAYOUT),
            ("Q8_0", &Q8_0_LAYOUT),
            ("PQ2_0G", &PQ2_0G_LAYOUT),
        ] {
            let (a, b) = (quantize(&x, t, k, layout), value_by_value(&x, t, k, layout));
            assert_eq!((a.pairs, a.pair_bytes), (b.pairs, b.pair_bytes), "{name}");
            assert_eq!(a.hi, b.hi, "{name}: high bytes");
            assert_eq!(a.lo, b.lo, "{name}: low bytes");
            assert_eq!(a.neg_lane_sums, b.neg_lane_sums, "{name}: lane sums");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.scale_lanes), bits(&b.scale_lanes), "{name}: scales");
        }
    }

    #[test]
    fn rounding_is_f32_round() {
        for r in [
            0.0f32,
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            0.499_999_97,
            32766.5,
            -32766.5,
            1e-8,
            7.25,
            -7.75,
            32767.2,
        ] {
            assert_eq!(
                round_q(r, 1.0, Q_MAX),
                r.round().clamp(-32767.0, 32767.0) as i32,
                "{r}"
            );
            assert_eq!(
                round_q(r, 1.0, BALANCED_Q_MAX),
                r.round().clamp(-32639.0, 32639.0) as i32,
                "{r}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "mixes blocks")]
    fn a_layout_whose_lane_mixes_blocks_is_refused() {
        let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
        for v in 0..ACT_BLOCK {
            slot[0][v] = (2 * v) as u16;
            slot[1][v] = (2 * v + 1) as u16;
        }
        let mixed = Layout {
            blocks: 2,
            regs: 4,
            slot,
            balanced: false,
        };
        quantize(&[0.0; ACT_BLOCK], 1, ACT_BLOCK, &mixed);
    }
}

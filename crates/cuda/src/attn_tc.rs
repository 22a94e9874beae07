//! Causal attention on tensor cores (`attn_tc.cu`): the twin of [`crate::ops::attention_tiled`] with Q·Kᵀ and P·V as
//! mma.sync TF32 products in 3xTF32 form (each f32 operand split into two TF32 parts, three products), so the
//! result stays within f32 rounding of the CPU reference; [`Arith::Tf32`] runs the 1xTF32 twin (one product per
//! step, 2^-11 operands).
//!
//! One block per (tile of query rows of a segment, KV head, split of the tile's keys): the block's 64 rows are
//! (token, query head of the KV group) pairs, so one K/V tile in shared memory serves all the query heads that
//! read it. When a segment has few query tiles but many keys (suffixes over a long base cache, short prefixes),
//! a tile's keys are split over several blocks (flash-decoding): each writes per-row partials (max, sum,
//! unnormalised output) to a scratch and a second kernel merges them.
//!
//! Measured on an H200 (`attention_tc_timings`, 0.8B shape, µs per call, attention_tiled → attention_tc): 175-token
//! prefix 98 → 51; 7 × 33 over a 175 base 121 → 50; 3,400-token prefix 4,917 → 1,365; 10 × 30 over a 3,400 base
//! 1,642 → 371 (fifth measurement, 3xTF32 / 1xTF32: 52 / 49, 48 / 43, 1,299 / 877, 366 / 263). Still far from the
//! tensor cores' rate: by a count of the code (not profiled), about 2,000 instructions per warp per 16-key tile,
//! the TF32 splits redone by every warp.

use crate::launch;
use crate::ops::{AttnDims, Out};
use crate::runtime::{cfg, cfg3, Arith, Gpu};
use crate::CudaError;

/// Rows (token, query head) per block (`ATC_M` in attn_tc.cu).
const ROWS: usize = 64;
/// Keys per shared-memory tile (`ATC_NK`).
const KEYS: usize = 16;
/// Most key splits per tile (`ATC_MAX_SPLITS`).
pub const MAX_SPLITS: usize = 16;
/// Blocks the split choice aims for per multiprocessor (two resident: `__launch_bounds__(128, 2)`).
const BLOCKS_PER_SM: usize = 2;

/// Tokens per query tile: 64 rows over the G = H / HKV query heads of a KV head.
fn tile_tokens(a: AttnDims) -> usize {
    ROWS / (a.heads / a.kv_heads.max(1)).max(1)
}

/// Key splits per tile for [`attention_tc`] over segments of `(rows, position of the first row)` on a GPU of `sms`
/// multiprocessors: enough blocks to fill it ([`BLOCKS_PER_SM`] each) counting every segment at the longest one's
/// tiles (the grid's shape), at most [`MAX_SPLITS`]; the kernel uses fewer for tiles with fewer keys (at least 32
/// keys per split). Measured on an H200 against a plan that cut the longest tile down to an even share of all the
/// tiles' work (µs, 0.8B shape): a 199-token prefix with 7 suffixes of 29 in one launch ran 71 at that plan's 5
/// splits (118 unsplit), the events of the System One bench 85 per layer at this one's 2 and 92 at 5; a 3,400-token
/// prefix with 10 suffixes of 30: 1,441 unsplit (this plan) against 1,641 at 2. Every split reloads the query
/// tile and writes partials, which only pays while blocks are too few to fill the GPU.
pub fn attention_tc_plan(
    segs: impl IntoIterator<Item = (usize, usize)>,
    a: AttnDims,
    sms: usize,
) -> usize {
    let (mut nseg, mut max_len) = (0usize, 0usize);
    for (len, _) in segs {
        nseg += 1;
        max_len = max_len.max(len);
    }
    if nseg == 0 || max_len == 0 {
        return 1;
    }
    let blocks = max_len.div_ceil(tile_tokens(a)) * nseg * a.kv_heads.max(1);
    (BLOCKS_PER_SM * sms.max(1))
        .div_ceil(blocks)
        .clamp(1, MAX_SPLITS)
}

/// Scratch (f32 values) of [`attention_tc`] with `splits` key splits over `rows` token rows: per (split, row,
/// head) the unnormalised output row [D] and (max, sum); none with one split.
pub fn attention_tc_scratch_len(splits: usize, rows: usize, a: AttnDims) -> usize {
    if splits <= 1 {
        0
    } else {
        splits * rows * a.heads * (a.head_dim + 2)
    }
}

/// Head dim as the kernel pads it (its template width): 64, 128 or 256; the padding columns are zeros.
fn padded_dim(d: usize) -> usize {
    if d <= 64 {
        64
    } else if d <= 128 {
        128
    } else {
        256
    }
}

/// Dynamic shared memory of `attention_tc` (bytes): the Q tile [64, Dp + 8], one K tile [16, Dp + 8] and one V tile
/// [16, Dp + 4], Dp the padded head dim (Q and K are read as float2 pairs, V down its columns: attn_tc.cu).
fn smem(a: AttnDims) -> usize {
    let dp = padded_dim(a.head_dim);
    4 * ((ROWS + KEYS) * (dp + 8) + KEYS * (dp + 4))
}

/// Whether [`attention_tc`] takes these dims: query heads a multiple of the KV heads (at most 64 per KV head), head
/// dim a multiple of 4 and at most 256, its tiles within the device's shared memory. The forward falls back to
/// [`crate::ops::attention_tiled`] otherwise.
pub fn attention_tc_supported(g: &Gpu, a: AttnDims) -> bool {
    let d = a.head_dim;
    a.kv_heads > 0
        && a.heads.is_multiple_of(a.kv_heads)
        && a.heads / a.kv_heads <= ROWS
        && d > 0
        && d <= 256
        && d.is_multiple_of(4)
        && smem(a) <= g.max_smem
}

/// Causal attention over each segment's KV cache, times sigmoid(gate), on tensor cores: same inputs and result
/// as [`crate::ops::attention_tiled`]. q: [N, H, D] (from [`crate::ops::attn_prep`]); proj: [N, ld] (gate of head h at
/// h*2D + D); segs: [S, 3] i32 (start row, rows, position of the first row); kv: [S, KV_ENTRIES]
/// ([`crate::ops::KV_ENTRIES`]); `max_len`: the longest segment; `rows`: N; out: [N, H*D]. At most `splits` key
/// splits per tile (1..=[`MAX_SPLITS`], [`attention_tc_plan`]; 1: no scratch, no merge kernel); scratch:
/// [`attention_tc_scratch_len`]`(splits, rows, a)` f32 values.
pub fn attention_tc(
    g: &Gpu,
    arith: Arith,
    q: u64,
    proj: u64,
    ld: usize,
    segs: u64,
    kv: u64,
    nseg: usize,
    max_len: usize,
    rows: usize,
    a: AttnDims,
    scale: f32,
    out: Out,
    scratch: u64,
    splits: usize,
) -> Result<(), CudaError> {
    let d = a.head_dim;
    if !attention_tc_supported(g, a) {
        return Err(CudaError::Unsupported(format!(
            "attention_tc: heads {} over kv_heads {}, head_dim {} (a multiple of 4, at most 256; at most 64 query heads per KV head)",
            a.heads, a.kv_heads, d
        )));
    }
    if !(1..=MAX_SPLITS).contains(&splits) {
        return Err(CudaError::Unsupported(format!(
            "attention_tc: {splits} key splits (1..={MAX_SPLITS})"
        )));
    }
    if nseg == 0 || max_len == 0 {
        return Ok(());
    }
    let (o, mode) = out.parts();
    let tiles = max_len.div_ceil(tile_tokens(a));
    // x: (tile, split, KV head), KV head fastest; y: segment (attn_tc.cu walks both in the order it wants).
    let lc = cfg(
        ((tiles * splits * a.kv_heads) as u32, nseg as u32),
        128,
        smem(a) as u32,
    );
    launch!(g, g.k.attention_tc[arith as usize], lc;
        q, proj, ld as i32, segs, kv, a.heads as i32, a.kv_heads as i32, d as i32, scale, o, mode,
        splits as i32, rows as i32, nseg as i32, scratch)?;
    if splits > 1 {
        let lc = cfg3((max_len as u32, nseg as u32, a.heads as u32), 64, 0);
        launch!(g, g.k.attention_tc_combine, lc;
            proj, ld as i32, segs, a.heads as i32, a.kv_heads as i32, d as i32, o, mode,
            splits as i32, rows as i32, nseg as i32, scratch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The fragment bookkeeping of `attention_tc`, emulated on the CPU: the m16n8k8 layouts, the P·V key
    //! permutation and the 3xTF32 split.

    /// m16n8k8 TF32 product of one warp from per-lane fragments, as the hardware defines it.
    fn mma(c: &mut [[f32; 4]; 32], a: &[[f32; 4]; 32], b: &[[f32; 2]; 32]) {
        let mut am = [[0f32; 8]; 16];
        let mut bm = [[0f32; 8]; 8];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            am[g][t] = a[lane][0];
            am[g + 8][t] = a[lane][1];
            am[g][t + 4] = a[lane][2];
            am[g + 8][t + 4] = a[lane][3];
            bm[t][g] = b[lane][0];
            bm[t + 4][g] = b[lane][1];
        }
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for e in 0..4 {
                let (r, n) = (g + 8 * (e >> 1), 2 * t + (e & 1));
                c[lane][e] += (0..8).map(|k| am[r][k] * bm[k][n]).sum::<f32>();
            }
        }
    }

    #[test]
    fn score_fragment_feeds_pv_with_permuted_keys() {
        // S [16 x 8] as the C fragment of Q·Kᵀ; V [8 keys x 8 columns]; P·V through the kernel's reindexing.
        let s: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 17) as f32) * 0.25 - 2.0)
            .collect();
        let v: Vec<f32> = (0..64)
            .map(|i| ((i * 11 % 13) as f32) * 0.5 - 3.0)
            .collect();
        let mut c = [[0f32; 4]; 32];
        let mut a = [[0f32; 4]; 32];
        let mut b = [[0f32; 2]; 32];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            // The score fragment: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
            let sc = [
                s[g * 8 + 2 * t],
                s[g * 8 + 2 * t + 1],
                s[(g + 8) * 8 + 2 * t],
                s[(g + 8) * 8 + 2 * t + 1],
            ];
            a[lane] = [sc[0], sc[2], sc[1], sc[3]];
            // vr = Vs + (2t) * lds + g: b0 = V[2t][g], b1 = V[2t + 1][g].
            b[lane] = [v[(2 * t) * 8 + g], v[(2 * t + 1) * 8 + g]];
        }
        mma(&mut c, &a, &b);
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for e in 0..4 {
                let (r, n) = (g + 8 * (e >> 1), 2 * t + (e & 1));
                let want: f32 = (0..8).map(|k| s[r * 8 + k] * v[k * 8 + n]).sum();
                assert!((c[lane][e] - want).abs() < 1e-4, "P·V ({r}, {n})");
            }
        }
    }

    /// The kernel's Q·Kᵀ fragments: each lane reads float2 pairs, Q at (r0, 8s + 2tg) and (r0 + 8, 8s + 2tg), K at
    /// (key g, 8s + 2tg), and passes (x, y) as the k indices t and t + 4: the 8 head-dim columns of the step in a
    /// permuted order, the same on both sides, so the products still sum over all 8.
    #[test]
    fn q_k_fragments_give_scores() {
        let qm: Vec<f32> = (0..128)
            .map(|i| ((i * 7 % 19) as f32) * 0.1 - 0.9)
            .collect();
        let km: Vec<f32> = (0..64).map(|i| ((i * 5 % 23) as f32) * 0.1 - 1.1).collect();
        let mut c = [[0f32; 4]; 32];
        let mut a = [[0f32; 4]; 32];
        let mut b = [[0f32; 2]; 32];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            // qlo = Q[g][2t..2t+2], qhi = Q[g+8][2t..2t+2]; a = (qlo.x, qhi.x, qlo.y, qhi.y).
            let (qlo, qhi) = (g * 8 + 2 * t, (g + 8) * 8 + 2 * t);
            a[lane] = [qm[qlo], qm[qhi], qm[qlo + 1], qm[qhi + 1]];
            // kv2 = K[g][2t..2t+2]; b = (kv2.x, kv2.y).
            b[lane] = [km[g * 8 + 2 * t], km[g * 8 + 2 * t + 1]];
        }
        mma(&mut c, &a, &b);
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for e in 0..4 {
                let (r, key) = (g + 8 * (e >> 1), 2 * t + (e & 1));
                let want: f32 = (0..8).map(|k| qm[r * 8 + k] * km[key * 8 + k]).sum();
                assert!((c[lane][e] - want).abs() < 1e-4, "S ({r}, {key})");
            }
        }
    }

    /// The kernel's big part: round to 10 mantissa bits, ties away from zero (as cvt.rna.tf32.f32).
    fn tf32(x: f32) -> f32 {
        f32::from_bits((x.to_bits() + 0x1000) & 0xffff_e000)
    }

    /// What the tensor core reads of an f32 passed as TF32 (the small part): the top 19 bits.
    fn tf32_trunc(x: f32) -> f32 {
        f32::from_bits(x.to_bits() & 0xffff_e000)
    }

    #[test]
    fn three_tf32_products_keep_f32_accuracy() {
        let mut worst = 0f64;
        for i in 1..2000 {
            let x = (i as f32 * 0.7123).sin() * 3.0;
            let y = (i as f32 * 1.313).cos() * 0.01;
            let (xb, yb) = (tf32(x), tf32(y));
            let (xs, ys) = (tf32_trunc(x - xb), tf32_trunc(y - yb));
            let p = xb as f64 * yb as f64 + xb as f64 * ys as f64 + xs as f64 * yb as f64;
            let exact = x as f64 * y as f64;
            worst = worst.max((p - exact).abs() / exact.abs().max(1e-30));
        }
        assert!(worst < 1e-6, "3xTF32 relative error {worst:e}");
    }

    /// The split plan on the 0.8B attention shape (8 heads over 2 KV heads, 16 tokens per tile) and an H200's 132
    /// multiprocessors (264 resident blocks), worked by hand: a System One tree (a 199-token prefix and 7 suffixes
    /// of 29: 13 tiles x 8 segments x 2 KV heads = 208 blocks: 2 splits); a 175-token prefix alone (22 blocks:
    /// 12); a 3,400-token prefix with 10 suffixes (4,686 blocks: 1); nothing (1); at most MAX_SPLITS.
    #[test]
    fn split_plan_matches_hand_counts() {
        use super::{attention_tc_plan, AttnDims};
        let a = AttnDims {
            heads: 8,
            kv_heads: 2,
            head_dim: 256,
            half: 32,
        };
        let tree = |root: usize, kids: usize, len: usize| {
            std::iter::once((root, 0)).chain(std::iter::repeat_n((len, root), kids))
        };
        assert_eq!(attention_tc_plan(tree(199, 7, 29), a, 132), 2);
        assert_eq!(attention_tc_plan([(175, 0)], a, 132), 12);
        assert_eq!(attention_tc_plan(tree(3400, 10, 30), a, 132), 1);
        assert_eq!(attention_tc_plan(std::iter::empty(), a, 132), 1);
        // Capped at MAX_SPLITS: one short query over a long cache on a large GPU.
        assert_eq!(
            attention_tc_plan([(1, 100_000)], a, 1000),
            super::MAX_SPLITS
        );
    }
}

//! Causal attention on tensor cores (`attn_tc.cu`): twins of [`crate::ops::attention_tiled`] with Q·Kᵀ and P·V
//! on mma.sync, in the arithmetic [`AttnArith`] names: 3xTF32 (each f32 operand split into two TF32 parts, three
//! products: f32 rounding of the CPU reference), 1xTF32 (one product, 2^-11 operands), bf16x3 (two bf16 parts,
//! three m16n8k16 products: about 2^-17, split mode's default) or one bf16 product; or, over KV caches held in f16
//! (`attention_h`), one f16 product with 2^-11 operands as 1xTF32's (the half precision's default).
//!
//! One block per (tile of query rows of a segment, KV head, split of the tile's keys): the block's 64 rows are
//! (token, query head of the KV group) pairs, so one K/V tile in shared memory serves all the query heads that
//! read it. When a segment has few query tiles but many keys (suffixes over a long base cache, short prefixes),
//! a tile's keys are split over several blocks (flash-decoding): each writes per-row partials (max, sum,
//! unnormalised output) to a scratch and a second kernel merges them.
//!
//! Measured on an H200 (`attention_tc_timings`, 0.8B shape, µs per call; data/2026-11-30-run-s9-attn-tests.log):
//! attention_tiled → 3xTF32 / 1xTF32 / bf16x3 / bf16: 175-token prefix 98 → 48 / 45 / 48 / 46; 7 × 33 over a 175
//! base 121 → 40 / 35 / 40 / 38; 3,400-token prefix 4,903 → 1,030 / 584 / 782 / 618; 10 × 30 over a 3,400 base
//! 1,643 → 280 / 175 / 231 / 184. Nsight Compute on the bf16x3 kernel before its copies were made division- and
//! branch-free (docs/benchmarks/history/data/2026-11-30-run-s9-ncu-attention_bf-before.txt): 12.5% occupancy (two blocks of 4 warps per
//! multiprocessor, registers and shared memory both limit it), an issue slot used 47% of cycles, about 1,800
//! instructions per warp and 16-key tile (1xbf16). Since then the main loop's disassembly counts about 750 (static,
//! `tools/cuda/ptx-check.py --sass attention_bf1`); the faster kernels were not profiled again.

use crate::launch;
use crate::ops::{AttnDims, Out};
use crate::runtime::{cfg, cfg3, AttnArith, Gpu};
use crate::CudaError;

/// Rows (token, query head) per block (`ATC_M` in attn_tc.cu).
const ROWS: usize = 64;
/// Keys per shared-memory tile (`ATC_NK`).
const KEYS: usize = 16;
/// Keys per tile of `attention_h` (`ATH_NK`).
const F16_KEYS: usize = 32;
/// Most key splits per tile (`ATC_MAX_SPLITS`).
pub const MAX_SPLITS: usize = 16;
/// Blocks the split choice aims for per multiprocessor (two resident: `__launch_bounds__(128, 2)`).
const BLOCKS_PER_SM: usize = 2;

/// Tokens per query tile: 64 rows over the G = H / HKV query heads of a KV head.
fn tile_tokens(a: AttnDims) -> usize {
    ROWS / (a.heads / a.kv_heads.max(1)).max(1)
}

/// Key splits per tile for [`attention_tc`] over segments of `lens` rows on a GPU of `sms`
/// multiprocessors: the most that keep every block resident at once ([`BLOCKS_PER_SM`] per multiprocessor),
/// counting the tiles the segments have (the grid's blocks past a segment's end exit at once), at least 1, at most
/// [`MAX_SPLITS`]; the kernel uses fewer for tiles with fewer keys (at least 32 keys per split). Every split reloads
/// the query tile and writes partials, which only pays while blocks are too few to fill the GPU. Measured on an H200
/// (bf16x3, µs per call for 1 / 2 / 3 / 4 / 5 splits; runs s12g, s12i): the bench's first tree (a 166-token prefix,
/// 7 suffixes of 23 to 66 tokens: 56 blocks, picks 4) 83.7 / 57.9 / 57.7 / 58.3 / 59.3; its second (691-token
/// prefix: 122 blocks, picks 2) 211.7 / 129.7 / 145.2 / 151.6 / 164.9; its third (3,400 and 10 x 30: 466 blocks,
/// picks one) 902 / 964 / 1,007. Until run s12i the plan counted every segment at the longest one's tiles and
/// rounded up, which ran the second tree unsplit.
pub fn attention_tc_plan(lens: impl IntoIterator<Item = usize>, a: AttnDims, sms: usize) -> usize {
    let tiles: usize = lens.into_iter().map(|l| l.div_ceil(tile_tokens(a))).sum();
    if tiles == 0 {
        return 1;
    }
    let blocks = tiles * a.kv_heads.max(1);
    (BLOCKS_PER_SM * sms.max(1) / blocks).clamp(1, MAX_SPLITS)
}

/// Key splits per tile of one segment of `len` rows, from that segment alone: [`attention_tc_plan`] as if it were
/// the only segment of its forward. The batch-invariant plan ([`attention_tc`] with `per_segment`): a tile's splits,
/// and so the order its keys are summed in, then depend on its own segment, never on the others in the forward.
pub fn attention_tc_segment_splits(len: usize, a: AttnDims, sms: usize) -> usize {
    attention_tc_plan([len], a, sms)
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
/// [16, Dp + 4], Dp the padded head dim (Q and K are read as float2 pairs, V down its columns: attn_tc.cu). With
/// [`AttnArith::F16`] (`attention_h`) f16 tiles: Q [64, Dp + 8] and two buffers each of K and V [32, Dp + 8].
fn smem(a: AttnDims, arith: AttnArith) -> usize {
    let dp = padded_dim(a.head_dim);
    match arith {
        AttnArith::F16 => 2 * (ROWS + 4 * F16_KEYS) * (dp + 8),
        _ => 4 * ((ROWS + KEYS) * (dp + 8) + KEYS * (dp + 4)),
    }
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
        && smem(a, AttnArith::X3) <= g.max_smem
}

/// Whether [`attention_tc`] takes these dims with [`AttnArith::F16`] (f16 KV caches): as
/// [`attention_tc_supported`], the head dim a multiple of 8 (a cache row's 16-byte copies), its tiles within the
/// device's shared memory.
pub fn attention_f16_supported(g: &Gpu, a: AttnDims) -> bool {
    attention_tc_supported(g, a)
        && a.head_dim.is_multiple_of(8)
        && smem(a, AttnArith::F16) <= g.max_smem
}

/// Causal attention over each segment's KV cache, times sigmoid(gate), on tensor cores: same inputs and result
/// as [`crate::ops::attention_tiled`]. q: [N, H, D] (from [`crate::ops::attn_prep`]); proj: [N, ld] (gate of head h at
/// h*2D + D); segs: [S, 3] i32 (start row, rows, position of the first row); kv: [S, KV_ENTRIES]
/// ([`crate::ops::KV_ENTRIES`]; f16 caches with [`AttnArith::F16`], f32 with the others); `max_len`: the longest
/// segment; `rows`: N; out: [N, H*D]. At most `splits` key splits per tile (1..=[`MAX_SPLITS`], [`attention_tc_plan`]; 1: no scratch, no merge kernel); scratch:
/// [`attention_tc_scratch_len`]`(splits, rows, a)` f32 values. `per_segment`: each segment's splits from its own
/// length (at most its share of the grid's blocks over its tiles and KV heads, the kernel's `atc_seg_splits`, as
/// [`attention_tc_plan`] counts them; `splits` caps them), so a tile's sums do not depend on the other segments of the
/// forward (batch invariance); else `splits` for every segment.
pub fn attention_tc(
    g: &Gpu,
    arith: AttnArith,
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
    per_segment: bool,
) -> Result<(), CudaError> {
    let target = per_segment.then(|| BLOCKS_PER_SM * g.sms.max(1));
    let d = a.head_dim;
    if !attention_tc_supported(g, a) {
        return Err(CudaError::Unsupported(format!(
            "attention_tc: heads {} over kv_heads {}, head_dim {} (a multiple of 4, at most 256; at most 64 query heads per KV head)",
            a.heads, a.kv_heads, d
        )));
    }
    if arith == AttnArith::F16 && !attention_f16_supported(g, a) {
        return Err(CudaError::Unsupported(format!(
            "attention on f16 KV caches: head_dim {d} (a multiple of 8)"
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
    let kvh = a.kv_heads.max(1);
    // x: (tile, split, KV head), KV head fastest; y: segment (attn_tc.cu walks both in the order it wants). With a
    // target, a segment of t tiles has min(splits, max(1, target / (t kvh))) splits, so t x splits is at most
    // max(t, target / kvh).
    let (per_seg, target) = match target {
        None => (tiles * splits, i32::MAX),
        Some(b) => (
            (tiles * splits).min(tiles.max(b / kvh)),
            b.min(i32::MAX as usize) as i32,
        ),
    };
    let lc = cfg(
        ((per_seg * kvh) as u32, nseg as u32),
        128,
        smem(a, arith) as u32,
    );
    launch!(g, g.k.attention_tc[arith as usize], lc;
        q, proj, ld as i32, segs, kv, a.heads as i32, a.kv_heads as i32, d as i32, scale, o, mode,
        splits as i32, target, rows as i32, nseg as i32, scratch)?;
    if splits > 1 {
        let pairs = (max_len * a.heads).div_ceil(8) as u32;
        let lc = cfg3((pairs, nseg as u32, 1), 256, 0);
        launch!(g, g.k.attention_tc_combine, lc;
            proj, ld as i32, segs, a.heads as i32, a.kv_heads as i32, d as i32, o, mode,
            splits as i32, target, rows as i32, nseg as i32, scratch)?;
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

    /// The kernel's bf16 split of an f32 pair (atc_bf_split): hi = bf16 pair rounded to nearest even, lo = the
    /// rounded remainders; the lower index in the low half.
    fn bf_split(x: f32, y: f32) -> (u32, u32) {
        use half::bf16;
        let (hx, hy) = (bf16::from_f32(x), bf16::from_f32(y));
        let (lx, ly) = (
            bf16::from_f32(x - hx.to_f32()),
            bf16::from_f32(y - hy.to_f32()),
        );
        let pack = |a: bf16, b: bf16| a.to_bits() as u32 | (b.to_bits() as u32) << 16;
        (pack(hx, hy), pack(lx, ly))
    }

    /// m16n8k16 bf16 product of one warp from per-lane registers, as the PTX ISA lays the fragments out.
    fn mma16(c: &mut [[f64; 4]; 32], a: &[[u32; 4]; 32], b: &[[u32; 2]; 32]) {
        mma16_of(c, a, b, |h| half::bf16::from_bits(h).to_f32() as f64);
    }

    /// m16n8k16 product of one warp from per-lane registers, each 16-bit value read by `val` (bf16 or f16).
    fn mma16_of(
        c: &mut [[f64; 4]; 32],
        a: &[[u32; 4]; 32],
        b: &[[u32; 2]; 32],
        val: impl Fn(u16) -> f64,
    ) {
        let lo16 = |r: u32| val(r as u16);
        let hi16 = |r: u32| val((r >> 16) as u16);
        let mut am = [[0f64; 16]; 16];
        let mut bm = [[0f64; 8]; 16];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for (i, (r, k)) in [
                (g, 2 * t),
                (g + 8, 2 * t),
                (g, 2 * t + 8),
                (g + 8, 2 * t + 8),
            ]
            .into_iter()
            .enumerate()
            {
                am[r][k] = lo16(a[lane][i]);
                am[r][k + 1] = hi16(a[lane][i]);
            }
            for (i, k) in [2 * t, 2 * t + 8].into_iter().enumerate() {
                bm[k][g] = lo16(b[lane][i]);
                bm[k + 1][g] = hi16(b[lane][i]);
            }
        }
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for e in 0..4 {
                let (r, n) = (g + 8 * (e >> 1), 2 * t + (e & 1));
                c[lane][e] += (0..16).map(|k| am[r][k] * bm[k][n]).sum::<f64>();
            }
        }
    }

    /// A [rows, cols] f32 tile in shared memory (pitch `ld` words) converted in place as atc_bf_tile does: each
    /// f32 pair's two words become its hi pair and its lo pair.
    fn bf_rows(m: &[f32], rows: usize, cols: usize, ld: usize) -> Vec<u32> {
        let mut w = vec![0u32; rows * ld];
        for r in 0..rows {
            for c in (0..cols).step_by(2) {
                let (hi, lo) = bf_split(m[r * cols + c], m[r * cols + c + 1]);
                w[r * ld + c] = hi;
                w[r * ld + c + 1] = lo;
            }
        }
        w
    }

    /// attention_bf's Q·Kᵀ and P·V fragments on the CPU: Q and K tiles converted in place (atc_bf_tile), V by key
    /// pairs (atc_bf_vcols), the registers loaded at the kernel's offsets, the score fragment fed to P·V as it
    /// stands, three products each: the results match f64 products within 2^-15 of the sum of |terms| (bf16x3 carries
    /// each operand to about 2^-17; a misplaced fragment is off by O(1)).
    #[test]
    fn bf16_fragments_give_scores_and_outputs() {
        const D: usize = 32; // two 16-column k steps
        let (ldq, lds) = (D + 8, 8 + 4); // pitches as attention_bf_t's (V: one 8-column tile)
        let qm: Vec<f32> = (0..16 * D)
            .map(|i| ((i * 7 % 19) as f32) * 0.113 - 0.97)
            .collect();
        let km: Vec<f32> = (0..16 * D)
            .map(|i| ((i * 5 % 23) as f32) * 0.0917 - 1.1)
            .collect();
        let vm: Vec<f32> = (0..16 * 8)
            .map(|i| ((i * 11 % 13) as f32) * 0.377 - 2.3)
            .collect();
        let (qs, ks) = (bf_rows(&qm, 16, D, ldq), bf_rows(&km, 16, D, ldq));
        // V [16 keys, 8 columns]: keys 2i, 2i+1 at column n -> row 2i + (n & 1), words (n & !1, +1).
        let mut vs = vec![0u32; 16 * lds];
        for rp in 0..8 {
            for n in 0..8 {
                let (hi, lo) = bf_split(vm[2 * rp * 8 + n], vm[(2 * rp + 1) * 8 + n]);
                let at = (2 * rp + (n & 1)) * lds + (n & !1);
                vs[at] = hi;
                vs[at + 1] = lo;
            }
        }
        let mut s = [[[0f64; 4]; 32]; 2];
        for kstep in 0..D / 16 {
            let (mut ah, mut al) = ([[0u32; 4]; 32], [[0u32; 4]; 32]);
            let (mut bh, mut bl) = ([[[0u32; 2]; 32]; 2], [[[0u32; 2]; 32]; 2]);
            for lane in 0..32 {
                let (g, t) = (lane >> 2, lane & 3);
                let qa = g * ldq + 2 * t + kstep * 16;
                for (i, off) in [0, 8 * ldq, 8, 8 * ldq + 8].into_iter().enumerate() {
                    ah[lane][i] = qs[qa + off];
                    al[lane][i] = qs[qa + off + 1];
                }
                for j in 0..2 {
                    let kb = (j * 8 + g) * ldq + 2 * t + kstep * 16;
                    bh[j][lane] = [ks[kb], ks[kb + 8]];
                    bl[j][lane] = [ks[kb + 1], ks[kb + 9]];
                }
            }
            for j in 0..2 {
                mma16(&mut s[j], &al, &bh[j]);
                mma16(&mut s[j], &ah, &bl[j]);
                mma16(&mut s[j], &ah, &bh[j]);
            }
        }
        // sc[j][e] is (row e < 2 ? g : g + 8, key 8j + 2t + (e & 1)).
        let mut sc = [[[0f32; 4]; 2]; 32];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for j in 0..2 {
                for e in 0..4 {
                    let (r, key) = (g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1));
                    let prod = |k: usize| qm[r * D + k] as f64 * km[key * D + k] as f64;
                    let want: f64 = (0..D).map(prod).sum();
                    let mag: f64 = (0..D).map(|k| prod(k).abs()).sum();
                    let got = s[j][lane][e];
                    assert!(
                        (got - want).abs() <= 3e-5 * mag,
                        "S ({r}, {key}): {got} vs {want}"
                    );
                    sc[lane][j][e] = got as f32;
                }
            }
        }
        let (mut ph, mut pl) = ([[0u32; 4]; 32], [[0u32; 4]; 32]);
        let (mut vh, mut vl) = ([[0u32; 2]; 32], [[0u32; 2]; 32]);
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            let c = sc[lane];
            for (i, (x, y)) in [
                (c[0][0], c[0][1]),
                (c[0][2], c[0][3]),
                (c[1][0], c[1][1]),
                (c[1][2], c[1][3]),
            ]
            .into_iter()
            .enumerate()
            {
                (ph[lane][i], pl[lane][i]) = bf_split(x, y);
            }
            let vb = (2 * t + (g & 1)) * lds + (g & !1);
            vh[lane] = [vs[vb], vs[vb + 8 * lds]];
            vl[lane] = [vs[vb + 1], vs[vb + 8 * lds + 1]];
        }
        let mut o = [[0f64; 4]; 32];
        mma16(&mut o, &pl, &vh);
        mma16(&mut o, &ph, &vl);
        mma16(&mut o, &ph, &vh);
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for e in 0..4 {
                let (r, n) = (g + 8 * (e >> 1), 2 * t + (e & 1));
                let srow = |key: usize| {
                    sc[4 * (r % 8) + (key % 8) / 2][key / 8][2 * (r / 8) + key % 2] as f64
                };
                let want: f64 = (0..16).map(|k| srow(k) * vm[k * 8 + n] as f64).sum();
                let mag: f64 = (0..16)
                    .map(|k| (srow(k) * vm[k * 8 + n] as f64).abs())
                    .sum();
                assert!(
                    (o[lane][e] - want).abs() <= 3e-5 * mag,
                    "O ({r}, {n}): {} vs {want}",
                    o[lane][e]
                );
            }
        }
    }

    /// ldmatrix .x4 as the PTX ISA defines it, on a shared-memory tile of 16-bit values `sm` (row pitch `ld`
    /// values): lane l gives (row, column) of row l & 7 of matrix l >> 3; register i of lane (g, t) gets matrix i's
    /// row g, columns 2t and 2t + 1 (low half first), or with `trans` its rows 2t and 2t + 1 of column g.
    fn ldsm4(
        sm: &[u16],
        ld: usize,
        at: impl Fn(usize) -> (usize, usize),
        trans: bool,
    ) -> [[u32; 4]; 32] {
        let mut r = [[0u32; 4]; 32];
        for (lane, regs) in r.iter_mut().enumerate() {
            let (g, t) = (lane >> 2, lane & 3);
            for (i, reg) in regs.iter_mut().enumerate() {
                let v = |row: usize, col: usize| {
                    let (r0, c0) = at(8 * i + row);
                    sm[r0 * ld + c0 + col] as u32
                };
                *reg = if trans {
                    v(2 * t, g) | v(2 * t + 1, g) << 16
                } else {
                    v(g, 2 * t) | v(g, 2 * t + 1) << 16
                };
            }
        }
        r
    }

    /// m16n8k16 f16 product of one warp: `mma16_of` with the B registers as `ldsm4` returned them (two of four).
    fn mma16h(c: &mut [[f64; 4]; 32], a: &[[u32; 4]; 32], b0: &[u32; 32], b1: &[u32; 32]) {
        let b: [[u32; 2]; 32] = std::array::from_fn(|lane| [b0[lane], b1[lane]]);
        mma16_of(c, a, &b, |h| half::f16::from_bits(h).to_f32() as f64);
    }

    /// attention_h's operand paths on the CPU: Q, K and V tiles as f16 rows of pitch Dp + 8, each fragment read by
    /// ldmatrix at the lane addresses the kernel computes (qa, ka, va in attn_tc.cu, warp 1 of the block, D = 32: two
    /// 16-column k steps, 32 keys, 16 value columns), the score fragments packed to f16 as P·V's A operand (ath_pv).
    /// Scores and outputs match f64 products of the same f16 values (a misplaced fragment is off by O(1)).
    #[test]
    fn f16_ldmatrix_fragments_give_scores_and_outputs() {
        use half::f16;
        const D: usize = 32;
        const LD: usize = D + 8;
        let val = |i: usize, m: usize, s: f32| f16::from_f32(((i * m % 29) as f32) * s - 1.3);
        // Q rows 16..31 (warp 1's), K [32 keys, D], V [32 keys, 16 columns].
        let mut q = vec![0u16; 32 * LD];
        let mut k = vec![0u16; 32 * LD];
        let mut v = vec![0u16; 32 * LD];
        for r in 0..32 {
            for c in 0..D {
                q[r * LD + c] = val(r * D + c, 7, 0.09).to_bits();
                k[r * LD + c] = val(r * D + c, 11, 0.083).to_bits();
            }
            for c in 0..16 {
                v[r * LD + c] = val(r * 16 + c, 5, 0.101).to_bits();
            }
        }
        let h = |bits: u16| f16::from_bits(bits).to_f32() as f64;
        let warp = 1;
        // S: per k step one ldmatrix of Q and one of K per 16 keys (registers 0, 1 keys 0-7; 2, 3 keys 8-15).
        let mut s = [[[0f64; 4]; 32]; 4];
        for ks in 0..D / 16 {
            let a = ldsm4(
                &q,
                LD,
                |l| {
                    (
                        warp * 16 + (l & 7) + ((l >> 3) & 1) * 8,
                        (l >> 4) * 8 + ks * 16,
                    )
                },
                false,
            );
            for hh in 0..2 {
                let b = ldsm4(
                    &k,
                    LD,
                    |l| {
                        (
                            hh * 16 + (l & 7) + (l >> 4) * 8,
                            ((l >> 3) & 1) * 8 + ks * 16,
                        )
                    },
                    false,
                );
                let pick = |i: usize| -> [u32; 32] { std::array::from_fn(|lane| b[lane][i]) };
                mma16h(&mut s[2 * hh], &a, &pick(0), &pick(1));
                mma16h(&mut s[2 * hh + 1], &a, &pick(2), &pick(3));
            }
        }
        let mut p = [[[0f32; 4]; 4]; 32];
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for j in 0..4 {
                for e in 0..4 {
                    let (r, key) = (g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1));
                    let want: f64 = (0..D)
                        .map(|c| h(q[(16 * warp + r) * LD + c]) * h(k[key * LD + c]))
                        .sum();
                    let got = s[j][lane][e];
                    assert!(
                        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                        "S ({r}, {key}): {got} vs {want}"
                    );
                    p[lane][j][e] = (got / 16.0) as f32;
                }
            }
        }
        // O = P·V: A from the score fragments, V by ldmatrix.trans (registers 0, 1 columns 0-7; 2, 3 columns 8-15).
        let pack = |x: f32, y: f32| {
            f16::from_f32(x).to_bits() as u32 | (f16::from_f32(y).to_bits() as u32) << 16
        };
        let mut o = [[[0f64; 4]; 32]; 2];
        for kk in 0..2 {
            let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                let c = &p[lane];
                [
                    pack(c[2 * kk][0], c[2 * kk][1]),
                    pack(c[2 * kk][2], c[2 * kk][3]),
                    pack(c[2 * kk + 1][0], c[2 * kk + 1][1]),
                    pack(c[2 * kk + 1][2], c[2 * kk + 1][3]),
                ]
            });
            let b = ldsm4(
                &v,
                LD,
                |l| (kk * 16 + (l & 7) + ((l >> 3) & 1) * 8, (l >> 4) * 8),
                true,
            );
            let pick = |i: usize| -> [u32; 32] { std::array::from_fn(|lane| b[lane][i]) };
            mma16h(&mut o[0], &a, &pick(0), &pick(1));
            mma16h(&mut o[1], &a, &pick(2), &pick(3));
        }
        for lane in 0..32 {
            let (g, t) = (lane >> 2, lane & 3);
            for (nt, on) in o.iter().enumerate() {
                for e in 0..4 {
                    let (r, n) = (g + 8 * (e >> 1), 8 * nt + 2 * t + (e & 1));
                    // The row's probabilities as the kernel rounds them, times V.
                    let prow = |key: usize| {
                        let (j, tt, e2) = (key / 8, (key % 8) / 2, 2 * (r / 8) + key % 2);
                        h(f16::from_f32(p[4 * (r % 8) + tt][j][e2]).to_bits())
                    };
                    let want: f64 = (0..32).map(|key| prow(key) * h(v[key * LD + n])).sum();
                    let got = on[lane][e];
                    assert!(
                        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                        "O ({r}, {n}): {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The split plan on the 0.8B attention shape (8 heads over 2 KV heads, 16 tokens per tile) and an H200's 132
    /// multiprocessors (264 resident blocks), worked by hand: a tree of a 199-token prefix and 7 suffixes of 29
    /// ((13 + 7 x 2) tiles x 2 KV heads = 54 blocks: 264 / 54, 4 splits); the bench's first and second trees (166
    /// and 691 tokens with suffixes of 30, 24, 66, 23, 31, 31, 31: 11 + 17 and 44 + 17 tiles, 56 and 122 blocks: 4
    /// and 2); a 175-token prefix alone (22 blocks: 12); a 3,400-token prefix with 10 suffixes of 30 (466 blocks:
    /// 1); nothing (1); at most MAX_SPLITS.
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
            std::iter::once(root).chain(std::iter::repeat_n(len, kids))
        };
        assert_eq!(attention_tc_plan(tree(199, 7, 29), a, 132), 4);
        let bench = |root: usize| std::iter::once(root).chain([30, 24, 66, 23, 31, 31, 31]);
        assert_eq!(attention_tc_plan(bench(166), a, 132), 4);
        assert_eq!(attention_tc_plan(bench(691), a, 132), 2);
        assert_eq!(attention_tc_plan([175], a, 132), 12);
        assert_eq!(attention_tc_plan(tree(3400, 10, 30), a, 132), 1);
        assert_eq!(attention_tc_plan(std::iter::empty(), a, 132), 1);
        // Capped at MAX_SPLITS: one short query (over a long cache) on a large GPU.
        assert_eq!(attention_tc_plan([1], a, 1000), super::MAX_SPLITS);
    }

    /// The batch-invariant plan: each segment's splits as if it were alone (264 blocks on an H200 over its tiles and
    /// 2 KV heads), whatever the other segments: a 175-token prefix 12 (11 tiles), a 29-token child 16 (capped), a
    /// 3,400-token prefix 1; the grid bound of `attention_tc` (tiles x splits at most max(tiles, 132)) holds.
    #[test]
    fn segment_splits_follow_from_the_segment_alone() {
        use super::{attention_tc_segment_splits as seg, AttnDims};
        let a = AttnDims {
            heads: 8,
            kv_heads: 2,
            head_dim: 256,
            half: 32,
        };
        assert_eq!(seg(175, a, 132), 12);
        assert_eq!(seg(29, a, 132), super::MAX_SPLITS);
        assert_eq!(seg(3400, a, 132), 1);
        assert_eq!(seg(691, a, 132), 3);
        for len in [1usize, 15, 16, 17, 100, 175, 691, 2000, 3400] {
            let tiles = len.div_ceil(16);
            assert!(tiles * seg(len, a, 132) <= tiles.max(264 / 2), "{len}");
        }
    }
}

//! The WY pre-pass of the chunked gated delta rule on tensor cores (`gdn_prep_tc.cu`): [`gdn_tc_prep`], a drop-in
//! for [`crate::ops::gdn_wy_prep`] (same arguments, same scratch layout, same values within f32 rounding).
//!
//! Per chunk of 64 tokens of a (segment, value head) it writes the cumulative decays E, the masked decayed Q·Kᵀ
//! matrix M and the solution [U | W] of `(I + A)[U | W] = [diag(β) V | diag(β e^γ) K]`, with K·Kᵀ, Q·Kᵀ and the
//! blocked triangular solve (16×16 diagonal inverses, then 16-token steps) as mma.sync TF32 products in 3xTF32
//! form, so the result stays within f32 rounding of `gdn_wy_prep` (`Arith::Tf32`: the 1xTF32 twin, one product
//! per step). The kernel is persistent: at most one block of 16 warps per multiprocessor, each taking every
//! `blocks`-th (chunk, segment, head, column slice) work item and loading the next item's tiles while it computes
//! the current one (two tile buffers in shared memory): faster than the former two 8-warp blocks per multiprocessor
//! on every System One shape, slower on grids of thousands of short items (gdn_prep_tc.cu's header). Where the
//! items are more than one block a multiprocessor takes in one round but no more than two blocks do, the launcher
//! takes the 8-warp twin (`gdn_tc_prep8*`, two blocks a multiprocessor, one buffer each): every item at once
//! instead of two rounds.

use crate::launch;
use crate::ops::{self, GdnDims, GDN_CHUNK};
use crate::runtime::{cfg, Arith, Gpu, BLOCK_RESERVED_SMEM};
use crate::CudaError;

/// Threads per block (16 warps, `GTP_NW` in gdn_prep_tc.cu): one block per multiprocessor
/// (`__launch_bounds__(512, 1)`: at most 128 registers, as the former two blocks of 8 warps had), so that one
/// 16-column tile of [U | W] per warp covers the 16 tiles of dk = dv = 128 and the 16 warps share one item's
/// phases instead of two blocks each waiting out its own loads.
const THREADS: u32 = 512;
/// Warps per block.
const WARPS: usize = THREADS as usize / 32;
/// Warps per block of the twin that runs two blocks a multiprocessor (`gdn_tc_prep8*`).
pub const WARPS_PAIRED: usize = 8;
/// Row pitch of the solve matrix in shared memory (`GTP_LS` in gdn_prep_tc.cu).
const SOLVE_PITCH: usize = 72;

/// 16-column tiles of [U | W]: ceil(DV / 16) of U, then ceil(DK / 16) of W.
pub fn gdn_tc_prep_tiles(d: GdnDims) -> usize {
    d.dv.div_ceil(16) + d.dk.div_ceil(16)
}

/// Dynamic shared memory (bytes) of one block with `nbuf` (1 or 2) tile buffers, each K [64, dk16 + 4] | Q or the
/// solve matrix | V [64, dv16 + 4] | g, γ, β, e^γ [64 each] (x16: x rounded up to 16), then the item table of
/// `nseg` segments (chunks before each, start, length: 3 nseg + 1 ints) and 16 ints of scan scratch.
pub fn gdn_tc_prep_smem(d: GdnDims, nbuf: usize, nseg: usize) -> usize {
    let lk = d.dk.next_multiple_of(16) + 4;
    let lv = d.dv.next_multiple_of(16) + 4;
    4 * (nbuf * GDN_CHUNK * (lk + lk.max(SOLVE_PITCH) + lv + 4) + 3 * nseg + 1 + WARPS)
}

/// Column slices per (chunk, value head) for `items` (chunk, segment, head) triples on `sms` multiprocessors: one
/// 16-column tile per warp (`ceil(tiles / 16)` slices, 1 up to dk + dv = 256) while the items still fit one block per
/// multiprocessor, fewer otherwise, down to 1 (no recomputation of A when there is work enough anyway). Normalised
/// so that no slice is empty.
pub fn gdn_tc_prep_slices(d: GdnDims, items: usize, sms: usize) -> usize {
    let tiles = gdn_tc_prep_tiles(d).max(1);
    let mut s = tiles.div_ceil(WARPS).max(1);
    while s > 1 && items * s > sms {
        s -= 1;
    }
    tiles.div_ceil(tiles.div_ceil(s))
}

/// The launch shape of [`gdn_tc_prep`]: (column slices, blocks, tile buffers, warps per block). Work items:
/// `chunks` (chunk, segment) pairs (0: not known, at most `min(chunks of max_len * nseg, rows / 64 + nseg)`)
/// times `hv` heads times the slices; blocks of 16 warps, one per multiprocessor, or one per item when there are
/// fewer; two buffers (the next item's loads under the current one's products) when a block has more than one
/// item and they fit in shared memory. Blocks of 8 warps, two a multiprocessor with one buffer each, instead where
/// the items need more than one round of the 16-warp blocks but fit one round of these (measured on an H100, 0.8B
/// heads: the 402-token request's 176 items 32.0 -> 29.0 µs), and where there are more than eight items a
/// multiprocessor of chunks shorter than 48 tokens on average (224 segments of 33 tokens: 392.6 -> 349.5 µs; one
/// of 3,400, 848 full chunks, stays: 122.9 against 126.8).
pub fn gdn_tc_prep_shape(
    g: &Gpu,
    d: GdnDims,
    rows: usize,
    nseg: usize,
    max_len: usize,
    chunks: usize,
) -> (usize, usize, usize, usize) {
    let pairs = if chunks > 0 {
        chunks
    } else {
        (max_len.div_ceil(GDN_CHUNK).max(1) * nseg.max(1)).min(rows.div_ceil(GDN_CHUNK) + nseg)
    };
    let items = pairs.max(1) * d.hv;
    let nslice = gdn_tc_prep_slices(d, items, g.sms);
    let sms = g.sms.max(1);
    let paired_fits = 2 * (gdn_tc_prep_smem(d, 1, nseg) + BLOCK_RESERVED_SMEM) <= g.sm_smem;
    let one_round = items * nslice > sms && items * nslice <= 2 * sms;
    let many_short = items * nslice > 8 * sms && rows < 48 * pairs;
    if paired_fits && (one_round || many_short) {
        return (nslice, (items * nslice).min(2 * sms), 1, WARPS_PAIRED);
    }
    let blocks = (items * nslice).min(sms);
    let nbuf = if items * nslice > blocks && gdn_tc_prep_smem(d, 2, nseg) <= g.max_smem {
        2
    } else {
        1
    };
    (nslice, blocks, nbuf, WARPS)
}

/// The WY pre-pass on tensor cores, a drop-in for [`crate::ops::gdn_wy_prep`]: qkv [N, ld] (q | k | v, q and k
/// L2-normalised), gg, beta [N, HV], segs [S, 3]; fills U, W, M, E of every token row of every segment in
/// `scratch` (room for `rows * ops::gdn_wy_scratch(d)` f32). `max_len`: the longest segment. The launch shape
/// comes from [`gdn_tc_prep_shape`].
pub fn gdn_tc_prep(
    g: &Gpu,
    arith: Arith,
    qkv: u64,
    ld: usize,
    gg: u64,
    beta: u64,
    segs: u64,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    max_len: usize,
    scratch: u64,
) -> Result<(), CudaError> {
    let shape = gdn_tc_prep_shape(g, d, rows, nseg, max_len, 0);
    gdn_tc_prep_sliced(
        g, arith, qkv, ld, gg, beta, segs, nseg, d, rows, max_len, scratch, shape,
    )
}

/// [`gdn_tc_prep`] with the launch shape given: (`nslice` column slices per chunk, 1 ..= [`gdn_tc_prep_tiles`];
/// `blocks` persistent blocks, at least 1; `nbuf` tile buffers, 1 or 2; `warps` per block, 16 or
/// [`WARPS_PAIRED`]). The tests run several shapes on the same inputs (every split; one block taking every item;
/// an odd block count; one buffer; both block sizes).
pub fn gdn_tc_prep_sliced(
    g: &Gpu,
    arith: Arith,
    qkv: u64,
    ld: usize,
    gg: u64,
    beta: u64,
    segs: u64,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    max_len: usize,
    scratch: u64,
    (nslice, blocks, nbuf, warps): (usize, usize, usize, usize),
) -> Result<(), CudaError> {
    if d.hk == 0 || !d.hv.is_multiple_of(d.hk) {
        return Err(CudaError::Unsupported(format!(
            "gated delta heads: {} value heads over {} key heads",
            d.hv, d.hk
        )));
    }
    let tiles = gdn_tc_prep_tiles(d);
    if nslice == 0
        || nslice > tiles
        || blocks == 0
        || !(1..=2).contains(&nbuf)
        || ![WARPS, WARPS_PAIRED].contains(&warps)
    {
        return Err(CudaError::Unsupported(format!(
            "gdn_tc_prep: {nslice} column slices for {tiles} tiles, {blocks} blocks, {nbuf} buffers, {warps} warps"
        )));
    }
    let smem = gdn_tc_prep_smem(d, nbuf, nseg);
    if smem > g.max_smem {
        return Err(CudaError::Unsupported(format!(
            "gated delta head dims {}x{} and {nseg} segments do not fit gdn_tc_prep's shared memory ({smem} bytes)",
            d.dk, d.dv
        )));
    }
    if nseg == 0 || max_len == 0 {
        return Ok(());
    }
    let (u, w, m, e) = ops::gdn_wy_parts(d, rows, scratch);
    let lc = cfg((blocks as u32, 1), 32 * warps as u32, smem as u32);
    let k = if warps == WARPS {
        &g.k.gdn_tc_prep[arith as usize]
    } else {
        &g.k.gdn_tc_prep8[arith as usize]
    };
    launch!(g, *k, lc;
        qkv, ld as i32, gg, beta, segs, nseg as i32, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32,
        nslice as i32, nbuf as i32, u, w, m, e)
}

#[cfg(test)]
mod tests {
    //! The kernel's fragment index math, emulated on the CPU: m16n8k8 products built from per-lane fragments
    //! (the PTX layouts), the permuted-k reuse of C fragments as A fragments, and the blocked solve, against a
    //! plain forward substitution. Exact arithmetic (f64) on both sides, so only an index error can fail it.
    use super::*;

    /// Lane fragments of one warp: `[lane][register]`.
    type Frag<const R: usize> = [[f64; R]; 32];

    /// C[16x8] += A[16x8] · B[8x8] from fragments: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4);
    /// b0 (k t, n g), b1 (k t+4, n g); c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
    fn mma(c: &mut Frag<4>, a: &Frag<4>, b: &Frag<2>) {
        let mut am = [[0.0; 8]; 16];
        let mut bm = [[0.0; 8]; 8];
        let mut cm = [[0.0; 8]; 16];
        for l in 0..32 {
            let (g, t) = (l >> 2, l & 3);
            am[g][t] = a[l][0];
            am[g + 8][t] = a[l][1];
            am[g][t + 4] = a[l][2];
            am[g + 8][t + 4] = a[l][3];
            bm[t][g] = b[l][0];
            bm[t + 4][g] = b[l][1];
            cm[g][2 * t] = c[l][0];
            cm[g][2 * t + 1] = c[l][1];
            cm[g + 8][2 * t] = c[l][2];
            cm[g + 8][2 * t + 1] = c[l][3];
        }
        for (i, row) in cm.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v += (0..8).map(|k| am[i][k] * bm[k][j]).sum::<f64>();
            }
        }
        for l in 0..32 {
            let (g, t) = (l >> 2, l & 3);
            c[l] = [
                cm[g][2 * t],
                cm[g][2 * t + 1],
                cm[g + 8][2 * t],
                cm[g + 8][2 * t + 1],
            ];
        }
    }

    fn rnd(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(6364136223846793005) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// K·Kᵀ tiles as the kernel's 16 warps compute them (warp (rb, qt), n8 tiles 2 qt + j, k steps of 8 over a
    /// zero-padded dk) against the plain product.
    #[test]
    fn kkt_fragments_match_plain_product() {
        let (n, dk) = (64usize, 60usize);
        let dkp = dk.next_multiple_of(16);
        let k = rnd(n * dk, 3);
        let at = |t: usize, c: usize| if c < dk { k[t * dk + c] } else { 0.0 };
        for warp in 0..WARPS {
            let (rb, qt) = (warp >> 2, warp & 3);
            for j in 0..2 {
                let nt = 2 * qt + j;
                let mut c: Frag<4> = [[0.0; 4]; 32];
                for k0 in (0..dkp).step_by(8) {
                    let mut a: Frag<4> = [[0.0; 4]; 32];
                    let mut b: Frag<2> = [[0.0; 2]; 32];
                    for l in 0..32 {
                        let (g, t) = (l >> 2, l & 3);
                        let r = 16 * rb + g;
                        a[l] = [
                            at(r, k0 + t),
                            at(r + 8, k0 + t),
                            at(r, k0 + t + 4),
                            at(r + 8, k0 + t + 4),
                        ];
                        b[l] = [at(8 * nt + g, k0 + t), at(8 * nt + g, k0 + t + 4)];
                    }
                    mma(&mut c, &a, &b);
                }
                for l in 0..32 {
                    let (g, t) = (l >> 2, l & 3);
                    for e in 0..4 {
                        let (ra, cb) = (16 * rb + g + 8 * (e >> 1), 8 * nt + 2 * t + (e & 1));
                        let want: f64 = (0..dk).map(|x| at(ra, x) * at(cb, x)).sum();
                        assert!((c[l][e] - want).abs() < 1e-12, "warp {warp} tile {nt}");
                    }
                }
            }
        }
    }

    /// The blocked solve of one 16-column tile on Y = Xᵀ, exactly as the kernel indexes it, against forward
    /// substitution of (I + A) X = R, for chunk lengths that use 1 to 4 token blocks.
    #[test]
    fn blocked_solve_fragments_match_substitution() {
        for n in [1usize, 16, 33, 47, 64] {
            let nb = n.div_ceil(16);
            // A: strictly lower, rows and columns past n zero; R: [64 tokens, 16 columns].
            let av = rnd(64 * 64, 10 + n as u64);
            let rv = rnd(64 * 16, 20 + n as u64);
            let a = |i: usize, j: usize| {
                if i < n && j < i {
                    0.3 * av[i * 64 + j]
                } else {
                    0.0
                }
            };
            let r = |t: usize, c: usize| if t < n { rv[t * 16 + c] } else { 0.0 };
            // Reference: x_i = r_i - sum_{j<i} A_ij x_j.
            let mut x = vec![[0.0f64; 16]; 64];
            for i in 0..64 {
                for c in 0..16 {
                    x[i][c] = r(i, c) - (0..i).map(|j| a(i, j) * x[j][c]).sum::<f64>();
                }
            }
            // The solve matrix S: -A below the diagonal blocks, T_ii = (I + A_ii)^-1 on them.
            let mut s = vec![[0.0f64; 64]; 64];
            for i in 0..64 {
                for j in 0..i {
                    s[i][j] = -a(i, j);
                }
            }
            for ti in 0..4 {
                for tj in 0..16 {
                    let mut tx = [0.0f64; 16];
                    for rr in 0..16 {
                        let mut acc = if rr == tj { 1.0 } else { 0.0 };
                        for q in 0..rr {
                            acc += s[16 * ti + rr][16 * ti + q] * tx[q];
                        }
                        tx[rr] = acc;
                    }
                    for rr in 0..16 {
                        s[16 * ti + rr][16 * ti + tj] = tx[rr];
                    }
                }
            }
            // The kernel's register arrays, per lane: y[i][nt][e].
            let mut y = vec![[[[0.0f64; 4]; 2]; 4]; 32];
            for (l, yl) in y.iter_mut().enumerate() {
                let (g, t) = (l >> 2, l & 3);
                for i in 0..nb {
                    for nt in 0..2 {
                        for e in 0..4 {
                            yl[i][nt][e] = r(16 * i + 8 * nt + 2 * t + (e & 1), g + 8 * (e >> 1));
                        }
                    }
                }
            }
            let afrag = |y: &Vec<[[[f64; 4]; 2]; 4]>, k: usize, ks: usize| -> Frag<4> {
                std::array::from_fn(|l| {
                    let v = y[l][k][ks];
                    [v[0], v[2], v[1], v[3]]
                })
            };
            for k in 0..nb {
                let a0 = afrag(&y, k, 0);
                let a1 = afrag(&y, k, 1);
                for nt in 0..2 {
                    let mut out: Frag<4> = [[0.0; 4]; 32];
                    for (ks, af) in [&a0, &a1].into_iter().enumerate() {
                        let b: Frag<2> = std::array::from_fn(|l| {
                            let (g, t) = (l >> 2, l & 3);
                            let row = 16 * k + 8 * nt + g;
                            let col = 16 * k + 8 * ks + 2 * t;
                            [s[row][col], s[row][col + 1]]
                        });
                        mma(&mut out, af, &b);
                    }
                    for l in 0..32 {
                        y[l][k][nt] = out[l];
                    }
                }
                let a0 = afrag(&y, k, 0);
                let a1 = afrag(&y, k, 1);
                for i in k + 1..nb {
                    for nt in 0..2 {
                        let mut c: Frag<4> = std::array::from_fn(|l| y[l][i][nt]);
                        for (ks, af) in [&a0, &a1].into_iter().enumerate() {
                            let b: Frag<2> = std::array::from_fn(|l| {
                                let (g, t) = (l >> 2, l & 3);
                                let row = 16 * i + 8 * nt + g;
                                let col = 16 * k + 8 * ks + 2 * t;
                                [s[row][col], s[row][col + 1]]
                            });
                            mma(&mut c, af, &b);
                        }
                        for l in 0..32 {
                            y[l][i][nt] = c[l];
                        }
                    }
                }
            }
            for (l, yl) in y.iter().enumerate() {
                let (g, t) = (l >> 2, l & 3);
                for i in 0..nb {
                    for nt in 0..2 {
                        for e in 0..4 {
                            let tok = 16 * i + 8 * nt + 2 * t + (e & 1);
                            let col = g + 8 * (e >> 1);
                            let want = x[tok][col];
                            assert!(
                                (yl[i][nt][e] - want).abs() < 1e-9 * (1.0 + want.abs()),
                                "n {n} token {tok} column {col}: {} vs {want}",
                                yl[i][nt][e]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slices_fill_one_wave_and_are_never_empty() {
        let d = GdnDims {
            hk: 16,
            hv: 16,
            dk: 128,
            dv: 128,
        };
        assert_eq!(gdn_tc_prep_tiles(d), 16);
        assert_eq!(gdn_tc_prep_slices(d, 3 * 16, 132), 1);
        assert_eq!(gdn_tc_prep_slices(d, 54 * 16, 132), 1);
        let wide = GdnDims { dv: 256, ..d };
        assert_eq!(gdn_tc_prep_slices(wide, 3 * 16, 132), 2);
        assert_eq!(gdn_tc_prep_slices(wide, 7 * 16, 132), 1);
        let small = GdnDims {
            hk: 2,
            hv: 4,
            dk: 60,
            dv: 24,
        };
        for nslice in 1..=gdn_tc_prep_tiles(small) {
            let tiles = gdn_tc_prep_tiles(small);
            let per = tiles.div_ceil(nslice);
            // The kernel's split: slice s takes tiles s*per .. min(s*per + per, tiles).
            let covered: usize = (0..nslice)
                .map(|s| (s * per + per).min(tiles).saturating_sub(s * per))
                .sum();
            assert_eq!(covered, tiles, "nslice {nslice}");
        }
        // 0.8B dims: 102,400 bytes a tile buffer; two and the table of 11 segments under the 227 KB opt-in limit.
        assert_eq!(gdn_tc_prep_smem(d, 1, 0), 102_400 + 4 * 17);
        assert_eq!(gdn_tc_prep_smem(d, 2, 11), 204_800 + 4 * (34 + 16));
        assert!(gdn_tc_prep_smem(d, 2, 2_000) <= 232_448);
    }
}

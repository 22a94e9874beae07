//! The WY pre-pass of the chunked gated delta rule on tensor cores (`gdn_prep_tc.cu`): [`gdn_tc_prep`], a drop-in
//! for [`crate::ops::gdn_wy_prep`] (same arguments, same scratch layout, same values within f32 rounding).
//!
//! Per chunk of 64 tokens of a (segment, value head) it writes the cumulative decays E, the masked decayed Q·Kᵀ
//! matrix M and the solution [U | W] of `(I + A)[U | W] = [diag(β) V | diag(β e^γ) K]`, with K·Kᵀ, Q·Kᵀ and the
//! blocked triangular solve (16×16 diagonal inverses, then 16-token steps) as mma.sync TF32 products in 3xTF32
//! form, so the result stays within f32 rounding of `gdn_wy_prep` (`Arith::Tf32`: the 1xTF32 twin, one product
//! per step). The 16-column tiles of [U | W] can be split
//! over several blocks per chunk (each recomputing the cheap A), which the launcher does when the grid would
//! otherwise leave multiprocessors idle (a prefix, a few suffixes).

use crate::launch;
use crate::ops::{self, GdnDims, GDN_CHUNK};
use crate::runtime::{cfg3, Arith, Gpu};
use crate::CudaError;

/// Threads per block (8 warps). Two blocks are resident per multiprocessor (`__launch_bounds__(256, 2)` in
/// gdn_prep_tc.cu: at most 128 registers, 144 bytes spilled then (124 since the TF32 rounding became integer ops; 188
/// in the 1xTF32 twin),
/// instead of 183 and one block; measured on an H200, 0.8B heads: 1 × 3,400 tokens 199.8 → 158.9 µs, 224 × 33
/// 656 → 458 µs, 1 × 175 26.1 → 27.6 µs).
const THREADS: u32 = 256;
/// Row pitch of the solve matrix in shared memory (`GTP_LS` in gdn_prep_tc.cu).
const SOLVE_PITCH: usize = 72;

/// 16-column tiles of [U | W]: ceil(DV / 16) of U, then ceil(DK / 16) of W.
pub fn gdn_tc_prep_tiles(d: GdnDims) -> usize {
    d.dv.div_ceil(16) + d.dk.div_ceil(16)
}

/// Dynamic shared memory (bytes) of one block: K [64, dk16 + 4] | Q or the solve matrix | V [64, dv16 + 4] |
/// g, γ, β, e^γ [64 each] (x16: x rounded up to 16).
pub fn gdn_tc_prep_smem(d: GdnDims) -> usize {
    let lk = d.dk.next_multiple_of(16) + 4;
    let lv = d.dv.next_multiple_of(16) + 4;
    4 * GDN_CHUNK * (lk + lk.max(SOLVE_PITCH) + lv + 4)
}

/// Column slices per (chunk, value head) for a grid of `blocks` (chunk, segment, head) triples on `sms`
/// multiprocessors: one 16-column tile per warp (`ceil(tiles / 8)` slices) while the grid still fits one block per
/// multiprocessor, fewer otherwise, down to 1 (no recomputation of A when the grid is large anyway). Normalised so
/// that no slice is empty. Counting both resident blocks instead split 7 × 33 tokens of the 0.8B heads too: 29.9 µs
/// (H200), against 25.7 µs unsplit with one resident block.
pub fn gdn_tc_prep_slices(d: GdnDims, blocks: usize, sms: usize) -> usize {
    let tiles = gdn_tc_prep_tiles(d).max(1);
    let mut s = tiles.div_ceil(8).max(1);
    while s > 1 && blocks * s > sms {
        s -= 1;
    }
    tiles.div_ceil(tiles.div_ceil(s))
}

/// The WY pre-pass on tensor cores, a drop-in for [`crate::ops::gdn_wy_prep`]: qkv [N, ld] (q | k | v, q and k
/// L2-normalised), gg, beta [N, HV], segs [S, 3]; fills U, W, M, E of every token row of every segment in
/// `scratch` (room for `rows * ops::gdn_wy_scratch(d)` f32). `max_len`: the longest segment. The column slices
/// per chunk come from [`gdn_tc_prep_slices`].
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
    let blocks = max_len.div_ceil(GDN_CHUNK).max(1) * nseg.max(1) * d.hv;
    let nslice = gdn_tc_prep_slices(d, blocks, g.sms);
    gdn_tc_prep_sliced(
        g, arith, qkv, ld, gg, beta, segs, nseg, d, rows, max_len, scratch, nslice,
    )
}

/// [`gdn_tc_prep`] with `nslice` column slices per chunk (1 ..= [`gdn_tc_prep_tiles`]; the tests run every
/// split on the same inputs).
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
    nslice: usize,
) -> Result<(), CudaError> {
    if d.hk == 0 || !d.hv.is_multiple_of(d.hk) {
        return Err(CudaError::Unsupported(format!(
            "gated delta heads: {} value heads over {} key heads",
            d.hv, d.hk
        )));
    }
    let tiles = gdn_tc_prep_tiles(d);
    if nslice == 0 || nslice > tiles {
        return Err(CudaError::Unsupported(format!(
            "gdn_tc_prep: {nslice} column slices for {tiles} tiles"
        )));
    }
    let smem = gdn_tc_prep_smem(d);
    if smem > g.max_smem {
        return Err(CudaError::Unsupported(format!(
            "gated delta head dims {}x{} do not fit gdn_tc_prep's shared memory ({smem} bytes)",
            d.dk, d.dv
        )));
    }
    if nseg == 0 || max_len == 0 {
        return Ok(());
    }
    let (u, w, m, e) = ops::gdn_wy_parts(d, rows, scratch);
    let lc = cfg3(
        (
            ops::blocks(max_len, GDN_CHUNK),
            nseg as u32,
            (d.hv * nslice) as u32,
        ),
        THREADS,
        smem as u32,
    );
    launch!(g, g.k.gdn_tc_prep[arith as usize], lc;
        qkv, ld as i32, gg, beta, segs, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32, nslice as i32,
        u, w, m, e)
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

    /// K·Kᵀ tiles as the kernel's warps compute them (warp (rb, half), n8 tiles 4 half + j, k steps of 8 over
    /// a zero-padded dk) against the plain product.
    #[test]
    fn kkt_fragments_match_plain_product() {
        let (n, dk) = (64usize, 60usize);
        let dkp = dk.next_multiple_of(16);
        let k = rnd(n * dk, 3);
        let at = |t: usize, c: usize| if c < dk { k[t * dk + c] } else { 0.0 };
        for warp in 0..8 {
            let (rb, half) = (warp >> 1, warp & 1);
            for j in 0..4 {
                let nt = 4 * half + j;
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
        assert_eq!(gdn_tc_prep_slices(d, 3 * 16, 132), 2);
        assert_eq!(gdn_tc_prep_slices(d, 7 * 16, 132), 1);
        assert_eq!(gdn_tc_prep_slices(d, 54 * 16, 132), 1);
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
        // 0.8B dims: 102,400 bytes of shared memory (under the 227 KB opt-in limit).
        assert_eq!(gdn_tc_prep_smem(d), 102_400);
    }
}

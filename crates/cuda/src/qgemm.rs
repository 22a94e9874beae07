//! Projections with block-format weights (PQ2_0 ternary, Q8_0), kept on the device as the file stores them
//! (quant.cu's layout: code bytes per row, then the f16 scales; a PTQ1_0 matrix is transcoded to PQ2_0 words at
//! load). `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and accumulation.
//!
//! - One row (decode) where K is a multiple of 1024 (PQ2_0) or 512 (Q8_0): `gemv_{pq2,q8}_wide_*`, each lane's 32
//!   (16) x values read once into registers, the block's rows streamed through them in tiles of 8 (8 or 16 code
//!   bytes per row and lane, all 8 rows' loads issued before the arithmetic), sums in a fixed order; PQ2_0 with
//!   bf16 or split inputs and N >= 8 on integer products (`gemv_pq2_int`).
//! - Otherwise at most [`GEMV_ROWS`] rows (decode): `gemv_pq2_*` / `gemv_q8_*`, 4 (one x row) or 2 weight rows per warp
//!   sharing each x load, K split over up to 8 warps where N is small, each code byte read once and decoded in
//!   registers (one logic op and one subtraction per weight, no table, no branch), the dot of
//!   each 16-weight group scaled by its block's scale; x read in the precision's layout ([`Act`]: bf16, f32, or
//!   split, whose hi + lo is the value the sums see).
//! - More rows (prefill), bf16 or split inputs, PQ2_0 or Q8_0 (K a multiple of 128): the int8 tensor cores
//!   ([`gemm_qmma`], qmma.cu). x is quantized per row and 128-value block to int16 (scale max |x| / 32767, the
//!   one-row integer GEMV's rounding, about 2^-16 of each block's largest value: split mode's precision) as two
//!   byte planes h, l (q = 256 h + l) into `scratch`; then tiles multiply both planes by the weight bytes as
//!   stored (PQ2_0 codes after one shift and mask as the mma's A operand, in one of two tile shapes
//!   ([`qmma_pq2_tile`]); Q8_0 bytes in 64 x 256 tiles; m16n8k32 mma, exact int32 sums per block), scaled per
//!   block into f32 accumulators. A fixed summation order, the same for either PQ2_0 tile: bit-identical runs.
//! - Otherwise (f32 inputs, the exact mode; float rows; Q8_0 with another K): the weight dequantised in chunks of
//!   rows into the scratch (f32 for f32 inputs, exactly; bf16, or bf16 hi + lo planes and three bf16 GEMMs
//!   `x_hi·W_hi + x_lo·W_hi + x_hi·W_lo` for split inputs) and cuBLAS multiplying each chunk
//!   ([`gemm_q_dequant`]).

use cudarc::driver::CudaSlice;

use crate::gemm::{gemm_ld, GEMV_ROWS};
use crate::launch;
use crate::ops::W;
use crate::runtime::{cfg, cfg3, Gpu};
use crate::CudaError;

/// Bytes of the scratch a model keeps for prefill ([`gemm_q`]'s `scratch`): the int8 GEMM's quantized activations
/// ([`qmma_scratch_bytes`]: about 1,800 rows of 27B's K of 17,408 a call, more calls past that), or the dequantised
/// weight in chunks of 16 M values (f32, or bf16 hi and lo planes).
pub const DEQUANT_BYTES: usize = 64 << 20;

/// A GEMM input (activation) for a block-format weight, in the precision's layout: rows at `x + r·ldx` (elements).
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// bf16 rows.
    Bf16 { x: u64, ldx: usize },
    /// f32 rows.
    F32 { x: u64, ldx: usize },
    /// Two bf16 planes: hi at `x`, lo `lo` elements after it; the value is hi + lo.
    Split { x: u64, ldx: usize, lo: usize },
}

impl Act {
    /// 0 bf16, 1 f32, 2 split (`XM` in quant.cu).
    fn mode(self) -> usize {
        match self {
            Act::Bf16 { .. } => 0,
            Act::F32 { .. } => 1,
            Act::Split { .. } => 2,
        }
    }

    /// (address, row stride, lo offset).
    fn parts(self) -> (u64, usize, usize) {
        match self {
            Act::Bf16 { x, ldx } | Act::F32 { x, ldx } => (x, ldx, 0),
            Act::Split { x, ldx, lo } => (x, ldx, lo),
        }
    }

    /// Whether the GEMV's 16-value loads take it: 16-byte aligned rows (and lo plane).
    fn vec_ok(self) -> bool {
        let (x, ldx, lo) = self.parts();
        let (align, per) = match self {
            Act::F32 { .. } => (16, 4),
            _ => (16, 8),
        };
        x.is_multiple_of(align) && ldx.is_multiple_of(per) && lo.is_multiple_of(per)
    }
}

/// Uploads a block-format matrix in quant.cu's layout: `blocks`, the 34-byte PQ2_0 (or, with `q8`, Q8_0) blocks of
/// its rows in order (the parts of a stacked matrix one after another), become every block's code bytes in order,
/// then, from a 256-byte boundary, every block's f16 scale. → the buffer and its [`W`]
pub fn upload_blocks(g: &Gpu, blocks: &[&[u8]], q8: bool) -> Result<(CudaSlice<u8>, W), CudaError> {
    let total: usize = blocks.iter().map(|b| b.len()).sum();
    if !total.is_multiple_of(34) {
        return Err(CudaError::Unsupported(format!(
            "{total} bytes of blocks: not whole 34-byte blocks"
        )));
    }
    let mut codes: Vec<u8> = Vec::with_capacity(total + 256);
    let mut scales: Vec<u8> = Vec::with_capacity(total / 17);
    for b in blocks.iter().flat_map(|b| b.chunks_exact(34)) {
        scales.extend_from_slice(&b[..2]);
        codes.extend_from_slice(&b[2..]);
    }
    let d_off = codes.len().next_multiple_of(256);
    codes.resize(d_off, 0);
    codes.extend_from_slice(&scales);
    let buf = g.upload(&codes)?;
    let (q, d) = (g.ptr(&buf), g.ptr(&buf) + d_off as u64);
    Ok((buf, if q8 { W::Q8 { q, d } } else { W::Pq2 { q, d } }))
}

/// Uploads float rows kept as stored (split mode's form of weights bf16 does not hold exactly): `rows`, the
/// little-endian values of the parts one after another, f16 (`f16`) or f32. → the buffer and its [`W`]
pub fn upload_rows(g: &Gpu, rows: &[&[u8]], f16: bool) -> Result<(CudaSlice<u8>, W), CudaError> {
    let bytes: Vec<u8> = rows.concat();
    let buf = g.upload(&bytes)?;
    let p = g.ptr(&buf);
    Ok((buf, if f16 { W::F16(p) } else { W::F32Rows(p) }))
}

/// The format index of a block weight (0 PQ2_0, 1 Q8_0, 2 f16 rows, 3 f32 rows), its codes, scales and block
/// length (for float rows: the 16 values of a GEMV group; they have no scales).
fn block_parts(w: W) -> Result<(usize, u64, u64, usize), CudaError> {
    match w {
        W::Pq2 { q, d } => Ok((0, q, d, 128)),
        W::Q8 { q, d } => Ok((1, q, d, 32)),
        W::F16(p) => Ok((2, p, 0, 16)),
        W::F32Rows(p) => Ok((3, p, 0, 16)),
        W::Bf16(_) | W::F32(_) | W::Half { .. } => Err(CudaError::Unsupported(
            "a float weight in the block-format GEMM".into(),
        )),
    }
}

/// The fewest rows of bf16 or split activations for which a PQ2_0 weight takes the int8 GEMM instead of the
/// few-row GEMV.
pub const PQ2_GEMM_ROWS: usize = 4;

/// `y = x · wᵀ + beta · y` for a block-format `w` [N, K]: the GEMV for at most [`GEMV_ROWS`] rows, else the int8
/// tensor-core GEMM over `scratch` (address, bytes; [`qmma_scratch_bytes`]), or for f32 inputs and float rows the
/// weight dequantised chunk by chunk into it and multiplied by cuBLAS.
pub fn gemm_q(
    g: &Gpu,
    x: Act,
    t: usize,
    k: usize,
    w: W,
    n: usize,
    (y, ldy): (u64, usize),
    beta: f32,
    scratch: (u64, usize),
) -> Result<(), CudaError> {
    let (fmt, q, d, block) = block_parts(w)?;
    if t == 0 || n == 0 {
        return Ok(());
    }
    if !k.is_multiple_of(block) || ldy < n {
        return Err(CudaError::Unsupported(format!(
            "block-format GEMM: K {k} not a multiple of the block {block}, or ldy {ldy} below N {n}"
        )));
    }
    // One row, K a multiple of the columns per warp (PQ2_0 1024, Q8_0 512: every matrix of a Bonsai pack and of the
    // Qwen3.5 shapes): x in registers, the weights streamed (`gemv_*_wide`). At most 16 warps per block (these
    // threads take about 100 registers; 22 for PQ2_0's integer products, quant.cu's launch bounds, which need N >= 8):
    // a longer K runs as calls over column ranges of at most that many warps, the later ones adding into y. Rows per
    // block (a multiple of 8) such that the blocks fill the multiprocessors in one wave: 16 resident warps each, 20
    // for the integer products' blocks of at most 5 warps (about 72 registers: 4 blocks of 5 warps were 8-9% faster
    // than 3 on the 27B shape's gdn and head matrices, 3 blocks of 6 slower than 2).
    let per_warp = if fmt == 0 { 1024 } else { 512 };
    let int = fmt == 0 && x.mode() != 1;
    if t == 1 && fmt < 2 && k.is_multiple_of(per_warp) && x.vec_ok() && (n >= 8 || !int) {
        let (xp, _, lo) = x.parts();
        let (cols, el) = (k / per_warp, if x.mode() == 1 { 4 } else { 2 });
        let most = if int { 22 } else { 16 };
        let calls = cols.div_ceil(most);
        let f = &g.k.gemv_q_wide[fmt][x.mode()];
        let (mut w0, mut beta) = (0, beta);
        for c in 0..calls {
            let warps = (cols - w0) / (calls - c);
            let k0 = w0 * per_warp;
            let (qo, dofs) = (if fmt == 0 { k0 / 4 } else { k0 }, k0 / block);
            let resident = if int && warps <= 5 { 20 } else { 16 };
            let blocks = g.sms * (resident / warps).max(1);
            let rpb = n.div_ceil(blocks).next_multiple_of(8);
            crate::launch_pdl!(g, *f, cfg((n.div_ceil(rpb) as u32, 1), 32 * warps as u32, 0);
                q + qo as u64, d + 2 * dofs as u64, xp + (el * k0) as u64, lo as i64,
                (warps * per_warp) as i32, k as i32, n as i32, y, beta, rpb as i32)?;
            (w0, beta) = (w0 + warps, 1.0);
        }
        return Ok(());
    }
    // PQ2_0 from PQ2_GEMM_ROWS rows on takes the int8 GEMM below: its few-row GEMV was slower there (on an
    // H100, 8 rows of the 27B shape 32.6 ms a decode step against 23.7 for 32 rows on the GEMM).
    let pq2_gemm =
        fmt == 0 && t >= PQ2_GEMM_ROWS && matches!(x, Act::Bf16 { .. } | Act::Split { .. });
    if t <= GEMV_ROWS && x.vec_ok() && !pq2_gemm {
        let (xp, ldx, lo) = x.parts();
        let f = &g.k.gemv_q[fmt][x.mode()][usize::from(t > 1)];
        // Weight rows per row set (4 for one x row, 2 for more: `gemv_q_rows`' R), and warps per set splitting K:
        // enough warps in all (about 4096) to keep the loads in flight where N is small, each with at least one
        // step of 32 groups.
        let sets = n.div_ceil(if t > 1 { 2 } else { 4 });
        let wpr = (4096 / sets).clamp(1, 8).min((k / 16 / 32).max(1));
        let wpr = 1usize << wpr.ilog2();
        return launch!(g, *f, cfg((sets.div_ceil(8 / wpr) as u32, 1), 256, 0);
            q, d, xp, ldx as i32, lo as i64, t as i32, k as i32, n as i32, y, ldy as i32, beta, wpr as i32);
    }
    // Float rows in f32 (the exact mode, or f32 inputs): the weight itself, no chunk to decode.
    if let (W::F32Rows(p), Act::F32 { x, ldx }) = (w, x) {
        return gemm_ld(g, x, ldx, t, k, W::F32(p), k, n, y, ldy, beta);
    }
    // bf16 or split inputs and PQ2_0 or Q8_0 weights (Q8_0 with K a multiple of 128): the int8 tensor cores.
    let int8 = matches!(x, Act::Bf16 { .. } | Act::Split { .. })
        && (fmt == 0 || (fmt == 1 && k.is_multiple_of(128)));
    if int8 {
        return gemm_qmma(g, x, t, k, (fmt, q, d), n, (y, ldy), beta, scratch, None);
    }
    gemm_q_dequant(g, x, t, k, w, n, (y, ldy), beta, scratch)
}

/// The warps of `qmma_q8` (qmma.cu's constants of the same names): 8 warps of MT x NT mma tiles of 16 x 8, WARPS_N
/// of them along w.
const QMMA_MT: usize = 4;
const QMMA_NT: usize = 4;
const QMMA_WARPS_N: usize = 8;
/// Its block tile: rows of x, rows of w. Calls of more than one tile of rows split x at multiples of it.
const QMMA_BM: usize = 16 * QMMA_MT * (8 / QMMA_WARPS_N);
const QMMA_BN: usize = 8 * QMMA_NT * QMMA_WARPS_N;

/// Dynamic shared memory of `qmma_q8` (qmma.cu: `QMMA_STAGES` (3) stages of `QmmaTile::STAGE` bytes: the h and l
/// planes of the tile's x rows by 128 K at a row pitch of 144, its weight bytes (128 per row at a pitch of 144),
/// the x rows' scales and Σ q, the 4 weight scales per row).
const QMMA_Q8_SMEM: u32 =
    (3 * (2 * QMMA_BM * 144 + QMMA_BN * 144 + 8 * QMMA_BM + 8 * QMMA_BN)) as u32;

/// A tile shape of PQ2_0's prefill GEMM: the template arguments of its kernel in qmma.cu (`QMMA_PQ2(name, MI, NJ,
/// WW, NW, MINB)`: MI 16-row weight tiles by NJ 8-token tiles a warp, WW warps along the weight, NW warps, MINB
/// blocks a multiprocessor), and the time of one wave of its blocks relative to the first shape's. `wave`: 0.7 for
/// the 16-warp shape, between the 0.62 (27B gate|up at 512 tokens, many waves) and 0.84 (down at 400 tokens) that
/// the H200 lab runs give, so that the choice below takes the faster shape on every lab shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pq2Tile {
    pub mi: usize,
    pub nj: usize,
    pub ww: usize,
    pub nw: usize,
    pub per_sm: usize,
    pub wave: f64,
}
/// `qmma_pq2` (64 tokens by 128 rows, 8 warps, two blocks a multiprocessor) and `qmma_pq2_16` (32 by 256, 16 warps),
/// in the order of [`crate::runtime::Kernels::qmma_pq2`].
pub const QMMA_PQ2: [Pq2Tile; 2] = [
    Pq2Tile {
        mi: 2,
        nj: 4,
        ww: 4,
        nw: 8,
        per_sm: 2,
        wave: 1.0,
    },
    Pq2Tile {
        mi: 2,
        nj: 2,
        ww: 8,
        nw: 16,
        per_sm: 1,
        wave: 0.7,
    },
];
impl Pq2Tile {
    /// Weight rows a block.
    pub fn rows(&self) -> usize {
        self.ww * 16 * self.mi
    }
    /// Tokens a block.
    pub fn tokens(&self) -> usize {
        self.nw / self.ww * 8 * self.nj
    }
    pub fn threads(&self) -> u32 {
        32 * self.nw as u32
    }
    /// Dynamic shared memory: 3 stages of the h and l planes (a row pitch of 144), the code bytes (32 a row), the
    /// tokens' scales and Σ q.
    pub fn smem(&self) -> u32 {
        (3 * (2 * self.tokens() * 144 + self.rows() * 32 + 8 * self.tokens())) as u32
    }
}

/// The PQ2_0 tile for `t` tokens by `n` rows on `sms` multiprocessors: the one with the fewest waves weighted by
/// their time (a last wave mostly idle costs as much as a full one). Either gives the same bits.
pub fn qmma_pq2_tile(t: usize, n: usize, sms: usize) -> usize {
    let cost = |c: &Pq2Tile| {
        let blocks = t.div_ceil(c.tokens()) * n.div_ceil(c.rows());
        blocks.div_ceil(c.per_sm * sms.max(1)) as f64 * c.wave
    };
    usize::from(cost(&QMMA_PQ2[1]) < cost(&QMMA_PQ2[0]))
}

/// The warpgroup-mma tile of PQ2_0's prefill GEMM on compute capability 9.0 (qwgmma.cu's `QWG_PQ2(qwg_pq2, 2, 1,
/// 64, 4, 1, 2)`): 64 tokens by 128 rows, 2 warpgroups (256 threads), two blocks a multiprocessor, 4 stages of the
/// tiled activation planes (bulk copies) and the code bytes. Measured on an H200 (tools/cuda/gemm-lab.cu, 27B
/// shapes at 400 and 512 tokens) faster on every shape than 64 x 256 in 4 warpgroups (one block a multiprocessor:
/// its warpgroups wait at the same barriers), 128 x 128, or clusters multicasting the activations.
pub const QWG_TOKENS: usize = 64;
pub const QWG_ROWS: usize = 128;
pub const QWG_THREADS: u32 = 256;
pub const QWG_PER_SM: usize = 2;
/// Its dynamic shared memory: 4 stages of the h and l plane tiles (128 bytes a token each), the code bytes (32 a
/// row), the tokens' scales and Σ q; then the stages' barriers.
pub const QWG_SMEM: u32 =
    (4 * (2 * QWG_TOKENS * 128 + QWG_ROWS * 32 + 8 * QWG_TOKENS) + 4 * 8) as u32;
/// The kernel of PQ2_0's prefill GEMM for `t` tokens by `n` rows on `sms` multiprocessors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pq2Kernel {
    /// An mma.sync tile ([`QMMA_PQ2`]'s index).
    Mma(usize),
    /// The warpgroup-mma tile (`qwg_pq2`), on compute capability 9.0 only.
    Wg,
}

/// [`Pq2Kernel`] for `t` tokens by `n` rows: on a device with the warpgroup mma ([`Gpu::wgmma`]) the warpgroup tile
/// (faster than both mma.sync tiles on every shape of the H200 lab runs, 27B shapes at 400 and 512 tokens);
/// elsewhere [`qmma_pq2_tile`]. Every kernel gives the same bits.
pub fn pq2_kernel(t: usize, n: usize, sms: usize, wgmma: bool) -> Pq2Kernel {
    if wgmma {
        Pq2Kernel::Wg
    } else {
        Pq2Kernel::Mma(qmma_pq2_tile(t, n, sms))
    }
}

/// Bytes of `qmma_quant`'s output for `rows` rows of K values: the h and l planes [rows, Kp] (Kp = K rounded up to
/// 128), then the scales and Σ q [Kp / 128, rows rounded up to 4] (f32, i32). The warpgroup kernel's tiled planes
/// hold the rows rounded up to its 64 tokens; where those do not fit, the call takes an mma.sync kernel.
pub fn qmma_scratch_bytes(rows: usize, k: usize) -> usize {
    let kp = k.next_multiple_of(128);
    2 * rows * kp + 8 * (kp / 128) * rows.next_multiple_of(4)
}

/// `y = x · wᵀ + beta · y` on the int8 tensor cores (qmma.cu): x (bf16 or split) quantized per row and 128-value
/// block to int16 as two byte planes into `scratch` (`qmma_quant`), then `qmma_pq2` / `qmma_q8` multiply the
/// planes by the weight bytes as they are stored. x rows in calls of as many as the scratch holds (whole tiles
/// where it takes more than one call). `w`: (format index, codes, scales).
fn gemm_qmma(
    g: &Gpu,
    x: Act,
    t: usize,
    k: usize,
    (fmt, q, d): (usize, u64, u64),
    n: usize,
    (y, ldy): (u64, usize),
    beta: f32,
    (s, bytes): (u64, usize),
    force: Option<Pq2Kernel>,
) -> Result<(), CudaError> {
    let (xp, ldx, lo) = x.parts();
    let split = i32::from(matches!(x, Act::Split { .. }));
    let kp = k.next_multiple_of(128);
    let nb = kp / 128;
    // The most rows whose planes, scales and Σ q (rows padded to 4) fit the scratch, at most 32,768 a call (the
    // quantization's grid rows).
    let fit = (bytes.saturating_sub(32 * nb) / (2 * kp + 8 * nb)).min(1 << 15);
    let rows = if fit >= t { t } else { fit / QMMA_BM * QMMA_BM };
    if rows == 0 {
        return Err(CudaError::Unsupported(format!(
            "block-format GEMM: the quantized activations of {QMMA_BM} rows of K {k} ({} bytes) do not fit \
             the scratch of {bytes} bytes",
            qmma_scratch_bytes(QMMA_BM, k)
        )));
    }
    for r0 in (0..t).step_by(rows) {
        let tc = rows.min(t - r0);
        let tp = tc.next_multiple_of(4);
        let mut kern =
            (fmt == 0).then(|| force.unwrap_or_else(|| pq2_kernel(tc, n, g.sms, g.wgmma())));
        // The warpgroup kernel reads the planes tiled, tt rows a 128-K block (tc rounded up to its tile): where
        // those do not fit the scratch, an mma.sync kernel (the same bits).
        let tiled = tc.next_multiple_of(QWG_TOKENS);
        if kern == Some(Pq2Kernel::Wg) && 2 * tiled * kp + 8 * nb * tp > bytes {
            if force.is_some() {
                return Err(CudaError::Unsupported(format!(
                    "the warpgroup PQ2_0 GEMM: the tiled activations of {tc} rows of K {k} do not fit the scratch \
                     of {bytes} bytes"
                )));
            }
            kern = Some(Pq2Kernel::Mma(qmma_pq2_tile(tc, n, g.sms)));
        }
        let tt = if kern == Some(Pq2Kernel::Wg) {
            tiled
        } else {
            0
        };
        let rows_p = tt.max(tc);
        let (xh, xl) = (s, s + (rows_p * kp) as u64);
        let (sx, qs) = (
            xl + (rows_p * kp) as u64,
            xl + (rows_p * kp + 4 * nb * tp) as u64,
        );
        launch!(g, g.k.qmma_quant, cfg((nb.div_ceil(8) as u32, tc as u32), 256, 0);
            xp + (2 * r0 * ldx) as u64, ldx as i32, lo as i64, split, k as i32, kp as i32, i32::from(fmt == 0),
            xh, xl, sx, qs, tp as i32, tt as i32)?;
        let yo = y + (4 * r0 * ldy) as u64;
        // Where the tiles are too few for the multiprocessors, K cut into runs whose sums go to the scratch past
        // the activations and are added up in order by a second launch (not on a kernel the caller forces: the
        // GPU tests hold the kernels to each other's bits).
        let used = (qs + (4 * nb * tp) as u64 - s).next_multiple_of(256);
        let spare = bytes.saturating_sub(used as usize);
        let part = s + used;
        let sum_runs = |splits: usize| -> Result<(), CudaError> {
            if splits > 1 {
                launch!(g, g.k.qmma_split_sum, cfg(((tc * n).div_ceil(256) as u32, 1), 256, 0);
                    part, splits as i32, tc as i32, n as i32, yo, ldy as i32, beta)?;
            }
            Ok(())
        };
        if kern == Some(Pq2Kernel::Wg) {
            let (gx, gy) = (tc.div_ceil(QWG_TOKENS), n.div_ceil(QWG_ROWS));
            let splits = if force.is_some() {
                1
            } else {
                k_runs(gx * gy, QWG_PER_SM * g.sms, nb, 4 * tc * n, spare)
            };
            let grid = (gx as u32, gy as u32, splits as u32);
            launch!(g, g.k.qwg_pq2, cfg3(grid, QWG_THREADS, QWG_SMEM);
                q, d, xh, xl, sx, qs, tc as i32, n as i32, k as i32, kp as i32, tp as i32, tt as i32,
                yo, ldy as i32, beta, part)?;
            sum_runs(splits)?;
            continue;
        }
        if let Some(Pq2Kernel::Mma(i)) = kern {
            let c = QMMA_PQ2[i];
            let grid = (tc.div_ceil(c.tokens()) as u32, n.div_ceil(c.rows()) as u32);
            launch!(g, g.k.qmma_pq2[i], cfg(grid, c.threads(), c.smem());
                q, d, xh, xl, sx, qs, tc as i32, n as i32, k as i32, kp as i32, tp as i32,
                yo, ldy as i32, beta)?;
            continue;
        }
        // Q8_0 likewise (one block a multiprocessor).
        let splits = q8_splits(tc, n, nb, g.sms, spare);
        let grid = (
            tc.div_ceil(QMMA_BM) as u32,
            n.div_ceil(QMMA_BN) as u32,
            splits as u32,
        );
        launch!(g, g.k.qmma_q8, cfg3(grid, 256, QMMA_Q8_SMEM);
            q, d, xh, xl, sx, qs, tc as i32, n as i32, k as i32, kp as i32, tp as i32,
            yo, ldy as i32, beta, part)?;
        sum_runs(splits)?;
    }
    Ok(())
}

/// How many runs of K `qmma_q8` cuts a GEMM of `t` x rows by `n` weight rows and `nb` 128-K blocks into
/// ([`k_runs`], its tiles one a multiprocessor).
pub fn q8_splits(t: usize, n: usize, nb: usize, sms: usize, spare: usize) -> usize {
    let tiles = t.div_ceil(QMMA_BM) * n.div_ceil(QMMA_BN);
    k_runs(tiles, sms, nb, 4 * t * n, spare)
}

/// How many runs of K a tensor-core GEMM of `tiles` block tiles, `slots` of which the GPU runs at once, over `nb`
/// 128-K blocks is cut into: 1 where the tiles fill the slots; else enough runs for that, each of at least two
/// blocks (a pipeline to keep in flight), as many as the `spare` bytes of scratch hold partial sums of
/// `run_bytes` each.
pub fn k_runs(tiles: usize, slots: usize, nb: usize, run_bytes: usize, spare: usize) -> usize {
    let want = slots.div_ceil(tiles.max(1));
    want.min(nb / 2).min(spare / run_bytes.max(1)).max(1)
}

/// [`gemm_q`]'s tensor-core GEMM of a PQ2_0 weight (bf16 or split `x`, any T) on the kernel `kernel` instead of
/// the one the shape would take: how the GPU tests hold every kernel to the reference on the same shapes.
/// [`Pq2Kernel::Wg`] needs compute capability 9.0 ([`Gpu::wgmma`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_pq2_on(
    g: &Gpu,
    x: Act,
    t: usize,
    k: usize,
    w: W,
    n: usize,
    y: (u64, usize),
    beta: f32,
    scratch: (u64, usize),
    kernel: Pq2Kernel,
) -> Result<(), CudaError> {
    let W::Pq2 { q, d } = w else {
        return Err(CudaError::Unsupported(
            "a PQ2_0 kernel for another format".into(),
        ));
    };
    let ok = matches!(x, Act::Bf16 { .. } | Act::Split { .. }) && k.is_multiple_of(128) && y.1 >= n;
    let known = match kernel {
        Pq2Kernel::Mma(i) => i < QMMA_PQ2.len(),
        Pq2Kernel::Wg => g.wgmma(),
    };
    if !ok || !known {
        return Err(CudaError::Unsupported(format!(
            "PQ2_0 GEMM kernel {kernel:?} for these inputs (K {k}, N {n}) on compute capability {:?}",
            g.cc
        )));
    }
    if t == 0 || n == 0 {
        return Ok(());
    }
    gemm_qmma(g, x, t, k, (0, q, d), n, y, beta, scratch, Some(kernel))
}

/// `y = x · wᵀ + beta · y` with the weight dequantised chunk by chunk into `scratch` (address, bytes; bf16 rows
/// for bf16 inputs, f32 rows for f32 inputs, exactly, bf16 hi and lo planes for split inputs, three bf16 GEMMs
/// `x_hi·W_hi + x_lo·W_hi + x_hi·W_lo`) and cuBLAS multiplying each chunk: [`gemm_q`]'s path for f32 inputs and
/// float rows (and for Q8_0 with K not a multiple of 128); the peer the tensor-core path is timed against.
pub fn gemm_q_dequant(
    g: &Gpu,
    x: Act,
    t: usize,
    k: usize,
    w: W,
    n: usize,
    (y, ldy): (u64, usize),
    beta: f32,
    scratch: (u64, usize),
) -> Result<(), CudaError> {
    let (fmt, q, d, _) = block_parts(w)?;
    let (s, bytes) = scratch;
    let chunk = (bytes / 4 / k).min(n);
    if chunk == 0 {
        return Err(CudaError::Unsupported(format!(
            "block-format GEMM: a row of {k} values does not fit the dequantisation scratch"
        )));
    }
    let mut n0 = 0;
    while n0 < n {
        let nc = chunk.min(n - n0);
        // The dequantised chunk's layout: bf16, f32, or bf16 hi and lo planes (dequant_rows' mode).
        let mode = x.mode() as i32;
        let groups = nc * k / 16;
        launch!(g, g.k.dequant_rows, cfg((groups.div_ceil(256) as u32, 1), 256, 0);
            q, d, fmt as i32, k as i32, n0 as i32, nc as i32, s, mode)?;
        let yo = y + 4 * n0 as u64;
        match x {
            Act::Bf16 { x, ldx } => gemm_ld(g, x, ldx, t, k, W::Bf16(s), k, nc, yo, ldy, beta)?,
            Act::F32 { x, ldx } => gemm_ld(g, x, ldx, t, k, W::F32(s), k, nc, yo, ldy, beta)?,
            Act::Split { x, ldx, lo } => {
                let (whi, wlo) = (W::Bf16(s), W::Bf16(s + 2 * (nc * k) as u64));
                let xlo = x + 2 * lo as u64;
                gemm_ld(g, x, ldx, t, k, whi, k, nc, yo, ldy, beta)?;
                gemm_ld(g, xlo, ldx, t, k, whi, k, nc, yo, ldy, 1.0)?;
                gemm_ld(g, x, ldx, t, k, wlo, k, nc, yo, ldy, 1.0)?;
            }
        }
        n0 += nc;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_splits_k_only_where_its_tiles_leave_multiprocessors_idle() {
        // 32 rows by the 0.8B shape's N = 1,024 and K = 3,584 (28 blocks): 4 tiles on 132 multiprocessors, so
        // 14 runs of 2 blocks; a 512-row prefill of N = 1,024, K = 1,024: 32 tiles, 4 runs (each of 2 blocks).
        assert_eq!(q8_splits(32, 1024, 28, 132, 1 << 30), 14);
        assert_eq!(q8_splits(512, 1024, 8, 132, 1 << 30), 4);
        // Tiles enough (512 rows by 7,168), one block of K, or no scratch to spare: no split.
        assert_eq!(q8_splits(512, 7168, 8, 132, 1 << 30), 1);
        assert_eq!(q8_splits(32, 1024, 1, 132, 1 << 30), 1);
        assert_eq!(q8_splits(32, 1024, 28, 132, 4 * 32 * 1024 - 1), 1);
        // As many as the scratch holds.
        assert_eq!(q8_splits(32, 1024, 28, 132, 3 * 4 * 32 * 1024), 3);
        // The warpgroup PQ2_0 tile (64 x 128, two a multiprocessor): 32 rows by the 27B shape's down (N 5,120, K
        // 17,408: 136 blocks) are 40 tiles for 264 slots, so 7 runs; 512 rows of gate|up (N 34,816) no split.
        let wg = |t: usize, n: usize, nb: usize| {
            k_runs(
                t.div_ceil(QWG_TOKENS) * n.div_ceil(QWG_ROWS),
                QWG_PER_SM * 132,
                nb,
                4 * t * n,
                1 << 30,
            )
        };
        assert_eq!(wg(32, 5120, 136), 7);
        assert_eq!(wg(512, 34816, 40), 1);
    }

    /// The tile choice on an H200's 132 multiprocessors against the faster of the two in the tile lab
    /// (tools/cuda/gemm-lab.cu, 27B shapes; docs/benchmarks/ternary-gpu.md): the 16-warp tile only where the
    /// 8-warp one leaves most of a last wave idle. And the rule's choice under one wave (not measured): the wider
    /// blocks.
    #[test]
    fn pq2_tile_follows_the_waves() {
        // (tokens, rows, the faster tile measured)
        let measured = [
            (512, 34816, 0),
            (400, 34816, 0),
            (512, 5120, 0),
            (400, 5120, 1),
            (512, 16384, 0),
            (400, 16384, 0),
            (512, 14336, 0),
            (400, 14336, 0),
        ];
        for (t, n, want) in measured {
            assert_eq!(qmma_pq2_tile(t, n, 132), want, "T {t} N {n}");
        }
        assert_eq!(
            qmma_pq2_tile(9, 1000, 132),
            1,
            "under one wave: the wider blocks"
        );
    }

    /// The kernel choice on an H200 (132 multiprocessors, the warpgroup mma) against the fastest kernel of the lab
    /// run that measured them side by side (tools/cuda/gemm-lab.cu, 27B shapes, docs/benchmarks/ternary-gpu.md): the
    /// warpgroup tile on every shape. Without the warpgroup mma the mma.sync rule as before.
    #[test]
    fn pq2_kernel_follows_the_lab() {
        let measured = [
            (512, 34816, Pq2Kernel::Wg),
            (400, 34816, Pq2Kernel::Wg),
            (512, 5120, Pq2Kernel::Wg),
            (400, 5120, Pq2Kernel::Wg),
            (512, 16384, Pq2Kernel::Wg),
            (400, 16384, Pq2Kernel::Wg),
            (512, 14336, Pq2Kernel::Wg),
            (400, 14336, Pq2Kernel::Wg),
        ];
        for (t, n, want) in measured {
            assert_eq!(pq2_kernel(t, n, 132, true), want, "T {t} N {n}");
            assert_eq!(
                pq2_kernel(t, n, 132, false),
                Pq2Kernel::Mma(qmma_pq2_tile(t, n, 132)),
                "T {t} N {n}, no warpgroup mma"
            );
        }
    }

    /// The warpgroup tile's constants repeat qwgmma.cu's kernel line and stage layout (`QWG_PQ2(qwg_pq2, WGS, MW,
    /// BT, STAGES, CL, MINB)`, `QwgTile`).
    #[test]
    fn qwg_tile_matches_the_kernel_source() {
        let src = include_str!("qwgmma.cu");
        let key = "\nQWG_PQ2(qwg_pq2,";
        let at = src.find(key).expect("qwg_pq2 in qwgmma.cu") + key.len();
        let end = at + src[at..].find(')').unwrap();
        let args: Vec<usize> = src[at..end]
            .split(',')
            .map(|a| a.trim().parse().unwrap())
            .collect();
        let (wgs, mw, bt, stages) = (args[0], args[1], args[2], args[3]);
        assert_eq!(QWG_TOKENS, bt);
        assert_eq!(QWG_ROWS, 64 * mw * wgs);
        assert_eq!(QWG_THREADS as usize, 128 * wgs);
        assert_eq!(args[4], 1, "one block a cluster: no cluster launch here");
        assert_eq!(args[5], QWG_PER_SM, "blocks a multiprocessor");
        let stage = 2 * bt * 128 + QWG_ROWS * 32 + 8 * bt;
        assert_eq!(QWG_SMEM as usize, stages * stage + 8 * stages);
    }

    /// [`QMMA_PQ2`] repeats the kernels' template arguments in qmma.cu (`QMMA_PQ2(name, MI, NJ, WW, NW, MINB)`) and
    /// its stage layout (`QmmaPq2Tile`): a launch with other tiles would leave outputs unwritten, so the two are read
    /// against each other here.
    #[test]
    fn pq2_tiles_match_the_kernel_source() {
        let src = include_str!("qmma.cu");
        let num = |key: &str| -> usize {
            let at = src.find(key).unwrap_or_else(|| panic!("{key} in qmma.cu")) + key.len();
            let digits: String = src[at..]
                .chars()
                .skip_while(|c| c.is_whitespace())
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap()
        };
        let (stages, pitch) = (
            num("static constexpr int STAGES ="),
            num("#define QMMA_APITCH"),
        );
        for (name, tile) in [("qmma_pq2", QMMA_PQ2[0]), ("qmma_pq2_16", QMMA_PQ2[1])] {
            let key = format!("\nQMMA_PQ2({name},");
            let at = src
                .find(&key)
                .unwrap_or_else(|| panic!("{name} in qmma.cu"))
                + key.len();
            let end = at + src[at..].find(')').unwrap();
            let args: Vec<usize> = src[at..end]
                .split(',')
                .map(|a| a.trim().parse().unwrap())
                .collect();
            let t = tile;
            assert_eq!(
                args,
                [t.mi, t.nj, t.ww, t.nw, t.per_sm],
                "{name}: template arguments"
            );
            let stage = 2 * t.tokens() * pitch + t.rows() * 32 + 8 * t.tokens();
            assert_eq!(t.smem() as usize, stages * stage, "{name}: shared memory");
        }
        assert_eq!((QMMA_PQ2[0].tokens(), QMMA_PQ2[0].rows()), (64, 128));
        assert_eq!(
            (
                QMMA_PQ2[1].tokens(),
                QMMA_PQ2[1].rows(),
                QMMA_PQ2[1].threads()
            ),
            (32, 256, 512)
        );
    }
}

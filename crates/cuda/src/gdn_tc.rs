//! The WY state pass of the chunked gated delta rule on tensor cores (`gdn_tc.cu`): the fast twin of
//! [`ops::gdn_wy_state`], same scratch (from [`ops::gdn_wy_prep`]), same outputs. Every product of the pass
//! (`v' = U − W S`, `o = e^γ Q S + M v'`, `S ← e^{γ_C} S + Kᵀ (e^{γ_C−γ} v')`) runs on `mma.sync` TF32 with
//! the 3xTF32 split, so it keeps f32 accuracy ([`Arith::Tf32`]: the 1xTF32 twin, one product per step); the
//! recurrent state stays f32. Layout, grid and the reasons for them are at the top of `gdn_tc.cu`.

use crate::launch;
use crate::ops::{self, GdnDims, GDN_CHUNK};
use crate::runtime::{cfg3, Arith, Gpu, TcArith};
use crate::CudaError;

/// Where the state pass of [`gdn_tc_chunked`] reads and writes each segment's recurrent state.
#[derive(Clone, Copy, Debug)]
pub struct SegStates {
    /// [S] addresses of [HV, DK, DV] f32, each segment's state after its rows (written unless dropped, below).
    pub states: u64,
    /// [S] addresses each segment's state is read from: `states` itself, or for segments `roots..` the state of the
    /// segment they continue (one of `0..roots`, written by the first of two state pass launches).
    pub init: u64,
    /// Segments `0..roots` run first, `roots..` after them (`CudaModel::forward_tree`); `nseg` for a plain batch.
    pub roots: usize,
    /// Whether the states of segments `roots..` are written (false: they are dropped after the forward, so the last
    /// chunk's update and the write-back are skipped).
    pub keep_children: bool,
    /// With `keep_children` false, the segments `roots..` of at most one chunk ([`GDN_CHUNK`] tokens) take
    /// [`gdn_tc_leaf`] instead of the second state pass (set when some are, or only when all are: the caller's
    /// choice)...
    pub leaf_children: bool,
    /// ...and some of them are longer: those then take the second state pass (the leaf pass skips them, the state
    /// pass skips the short ones).
    pub long_children: bool,
    /// The segments' chunks of [`GDN_CHUNK`] tokens (each length rounded up, summed), which shape the pre-pass's
    /// launch ([`crate::gdn_prep_tc::gdn_tc_prep_shape`]); 0: not known, bounded from the rows and longest segment.
    pub chunks: usize,
}

impl SegStates {
    /// Every segment continues its own state (a plain batch).
    pub fn own(states: u64, nseg: usize) -> Self {
        SegStates {
            states,
            init: states,
            roots: nseg,
            keep_children: true,
            leaf_children: false,
            long_children: false,
            chunks: 0,
        }
    }
}

/// Row stride (floats) of a [*, bv] tile read down its columns by fragments (`GtcLd` in `gdn_tc.cu`): bv + 8, or
/// bv + 16 when (bv + 8) / 8 is even.
fn tile_ld(bv: usize) -> usize {
    if ((bv + 8) / 8) % 2 == 1 {
        bv + 8
    } else {
        bv + 16
    }
}

/// The chunk, dk rounded up to 8 and to 16, and [`tile_ld`] of `bv`: the shared-memory tile sizes of the state and
/// leaf passes (`kp8`, `dkp` in gdn_tc.cu; `LDV`, the row-major [*, bv] tiles' pitch, the leaf pass's only: the
/// state pass stores its [*, bv] tiles transposed).
fn tile_dims(d: GdnDims, bv: usize) -> (usize, usize, usize, usize) {
    (
        GDN_CHUNK,
        d.dk.div_ceil(8) * 8,
        d.dk.div_ceil(16) * 16,
        tile_ld(bv),
    )
}

/// Whether the state and leaf passes may copy tiles 16 bytes at a time: 16-byte aligned tile rows (the qkv, W and M
/// bases; q and k rows, `ld`; heads, dk).
fn vec_tiles(d: GdnDims, ld: usize, bases: [u64; 3]) -> bool {
    d.dk.is_multiple_of(4) && ld.is_multiple_of(4) && bases.iter().all(|a| a.is_multiple_of(16))
}

/// Value columns per block that [`gdn_tc_state`] supports (one kernel each).
pub const GDN_TC_SLICES: [usize; 4] = [8, 16, 32, 64];

/// Largest key head dim of [`gdn_tc_state`] (8 warps of 16 state rows each).
pub const GDN_TC_MAX_DK: usize = 128;

/// Shared memory (bytes) of [`gdn_tc_state`] with `bv` value columns per block; mirrors the layout in
/// `gdn_tc.cu`: W, Q [64, kp8 + 4]; K [64, dkp + 8]; M [64, 68]; v'ᵀ, (e v')ᵀ [bv, 68]; Sᵀ [bv, dkp + 4], with
/// kp8, dkp = dk rounded up to 8, 16 (the state slice arrives as [dkp, bv] over the last three, which hold more);
/// at bv <= 16 a second W, Q pair after them (the odd chunks': `DB` in gdn_tc.cu).
pub fn gdn_tc_smem(d: GdnDims, bv: usize) -> usize {
    let (c, kp8, dkp, _) = tile_dims(d, bv);
    let wq = if bv <= 16 { 2 } else { 1 };
    4 * (wq * 2 * c * (kp8 + 4) + c * (dkp + 8) + c * (c + 4) + 2 * bv * (c + 4) + bv * (dkp + 4))
}

/// Whether [`gdn_tc_state`] runs these dims with `bv` value columns per block (else it returns
/// [`CudaError::Unsupported`]).
pub fn gdn_tc_supported(g: &Gpu, d: GdnDims, bv: usize) -> bool {
    GDN_TC_SLICES.contains(&bv)
        && d.dk > 0
        && d.dk <= GDN_TC_MAX_DK
        && d.dv > 0
        && d.hk > 0
        && d.hv.is_multiple_of(d.hk)
        && gdn_tc_smem(d, bv) <= g.max_smem
}

/// The widest slice [`gdn_tc_slice`] picks.
const GDN_TC_SLICE_MAX: usize = 64;

/// Whether [`gdn_tc_state`] runs these dims at every slice width [`gdn_tc_slice`] may pick (shared memory grows with
/// the width, so the widest decides).
pub fn gdn_tc_takes(g: &Gpu, d: GdnDims) -> bool {
    gdn_tc_supported(g, d, GDN_TC_SLICE_MAX)
}

/// Value columns per block: the widest slice (64) unless that leaves fewer than 200 blocks, down to 16.
/// Measured on an H200 (0.8B heads, 16 x 128 x 128; µs for 8 / 16 / 32 / 64 columns): one 175-token segment
/// 36.6 / 24.9 / 31.4 / 46.3 (picks 16: 128 blocks), 7 x 33 tokens 87.6 / 60.0 / 51.4 / 44.3 (64: 224 blocks),
/// 1 x 3,400 523.7 / 327.5 / 444.2 / 654.1 (16), 224 x 33 3462 / 2289 / 1752 / 1518 (64).
pub fn gdn_tc_slice(d: GdnDims, nseg: usize) -> usize {
    let mut bv = GDN_TC_SLICE_MAX;
    while bv > 16 && d.hv * nseg * d.dv.div_ceil(bv) < 200 {
        bv /= 2;
    }
    bv
}

/// The WY state pass on tensor cores: the twin of [`ops::gdn_wy_state`] (its arguments, plus `init` and `keep`;
/// `dvs`, the value columns per block, is 8, 16, 32 or 64, see [`gdn_tc_slice`]). qkv: [N, ld] (q, k, v of every row);
/// out: [N, HV, DV]; segs: [S, 3] i32; states: [S] addresses of [HV, DK, DV] f32 (written at the end); init: [S]
/// addresses each segment's state is read from (`states` itself, or for a segment that continues another one of the
/// batch, that segment's state, written by an earlier launch: [`gdn_tc_chunked`]); scratch: `rows *
/// ops::gdn_wy_scratch(d)` f32 filled by [`ops::gdn_wy_prep`]; keep: false skips writing `states` (and the last
/// chunk's state update) when nobody reads the states after the segments. Needs DK ≤ 128.
pub fn gdn_tc_state(
    g: &Gpu,
    arith: Arith,
    qkv: u64,
    ld: usize,
    out: u64,
    segs: u64,
    (states, init, keep): (u64, u64, bool),
    nseg: usize,
    d: GdnDims,
    rows: usize,
    scratch: u64,
    dvs: usize,
) -> Result<(), CudaError> {
    state_pass(
        g,
        arith,
        qkv,
        ld,
        out,
        segs,
        (states, init, keep as i32),
        nseg,
        d,
        rows,
        scratch,
        dvs,
    )
}

/// [`gdn_tc_state`] with the kernel's `keep`: 0, 1, or 2 (as 0, and segments of at most one chunk skipped: the leaf
/// pass takes them).
fn state_pass(
    g: &Gpu,
    arith: Arith,
    qkv: u64,
    ld: usize,
    out: u64,
    segs: u64,
    (states, init, keep): (u64, u64, i32),
    nseg: usize,
    d: GdnDims,
    rows: usize,
    scratch: u64,
    dvs: usize,
) -> Result<(), CudaError> {
    if !gdn_tc_supported(g, d, dvs) {
        return Err(CudaError::Unsupported(format!(
            "tensor-core gated delta state pass: dims {d:?}, {dvs} value columns per block \
             (dk 1..={GDN_TC_MAX_DK}, hv a multiple of hk, slices {GDN_TC_SLICES:?}, {} of {} bytes of shared memory)",
            gdn_tc_smem(d, dvs),
            g.max_smem
        )));
    }
    if nseg == 0 {
        return Ok(());
    }
    // gdn_tc_supported holds dvs to one of GDN_TC_SLICES (the kernels of Gpu::k.gdn_tc_state, in that order).
    let slice = GDN_TC_SLICES
        .iter()
        .position(|&s| s == dvs)
        .unwrap_or(GDN_TC_SLICES.len() - 1);
    let (u, w, m, e) = ops::gdn_wy_parts(d, rows, scratch);
    let vec = vec_tiles(d, ld, [qkv, w, m]);
    // Segment-major grid (gdn_tc.cu).
    let lc = cfg3(
        (d.hv as u32, ops::blocks(d.dv, dvs), nseg as u32),
        256,
        gdn_tc_smem(d, dvs) as u32,
    );
    launch!(g, g.k.gdn_tc_state[arith as usize][slice], lc;
        qkv, ld as i32, u, w, m, e, out, segs, states, init, keep, d.hk as i32, d.hv as i32, d.dk as i32,
        d.dv as i32, vec as i32)
}

/// Value columns per block that [`gdn_tc_leaf`] supports (one kernel each).
pub const GDN_TC_LEAF_SLICES: [usize; 3] = [32, 64, 128];

/// Shared memory (bytes) of [`gdn_tc_leaf`] with `bv` value columns per block; mirrors the layout in `gdn_tc.cu`:
/// W, Q [64, kp8 + 4]; M [64, 68]; S0 [dkp, ldv]; v' [64, ldv] (kp8, dkp, ldv as in [`gdn_tc_smem`]).
pub fn gdn_tc_leaf_smem(d: GdnDims, bv: usize) -> usize {
    let (c, kp8, dkp, ldv) = tile_dims(d, bv);
    4 * (2 * c * (kp8 + 4) + c * (c + 4) + dkp * ldv + c * ldv)
}

/// Value columns per block of [`gdn_tc_leaf`] for `nseg` segments: the widest slice (128: every block reads the
/// chunk's W, Q and M tiles, so narrower slices read them more often) unless that leaves fewer than 96 blocks, down
/// to 32. Measured on an H200 (0.8B heads, µs for 32 / 64 / 128 columns; run s11d): 7 x 33 tokens 20.0 / 18.9 / 15.7,
/// 224 x 33 486.2 / 507.2 / 414.8, against 21.9 and 545.5 for the fused pass at its slice with the states dropped.
/// Fewer than 7 segments (the narrower picks) were not timed.
pub fn gdn_tc_leaf_slice(d: GdnDims, nseg: usize) -> usize {
    let mut bv = 128;
    while bv > 32 && d.hv * nseg * d.dv.div_ceil(bv) < 96 {
        bv /= 2;
    }
    bv
}

/// Whether [`gdn_tc_leaf`] runs these dims with `bv` value columns per block.
pub fn gdn_tc_leaf_supported(g: &Gpu, d: GdnDims, bv: usize) -> bool {
    GDN_TC_LEAF_SLICES.contains(&bv)
        && gdn_tc_supported(g, d, 16)
        && gdn_tc_leaf_smem(d, bv) <= g.max_smem
}

/// The state pass of segments of at most one chunk ([`GDN_CHUNK`] tokens) whose states are dropped, `o = e^γ Q S0 +
/// M (U − W S0)` with S0 read at `init` (a tree's children, `keep` false: [`gdn_tc_chunked`]): arguments as
/// [`gdn_tc_state`]'s without the states written; `dvs` is one of [`GDN_TC_LEAF_SLICES`]. Every segment must be at
/// most one chunk long (the kernel reads the first chunk only; the caller knows the lengths, the device table does
/// not say). Same products as the fused pass, shared so that every warp has the same work (see `gdn_tc.cu`).
pub fn gdn_tc_leaf(
    g: &Gpu,
    arith: Arith,
    qkv: u64,
    ld: usize,
    out: u64,
    segs: u64,
    init: u64,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    scratch: u64,
    dvs: usize,
) -> Result<(), CudaError> {
    if !gdn_tc_leaf_supported(g, d, dvs) {
        return Err(CudaError::Unsupported(format!(
            "tensor-core gated delta leaf pass: dims {d:?}, {dvs} value columns per block (slices \
             {GDN_TC_LEAF_SLICES:?}, {} of {} bytes of shared memory)",
            gdn_tc_leaf_smem(d, dvs),
            g.max_smem
        )));
    }
    if nseg == 0 {
        return Ok(());
    }
    let slice = GDN_TC_LEAF_SLICES
        .iter()
        .position(|&s| s == dvs)
        .unwrap_or(0);
    let (u, w, m, e) = ops::gdn_wy_parts(d, rows, scratch);
    let vec = vec_tiles(d, ld, [qkv, w, m]);
    let lc = cfg3(
        (d.hv as u32, nseg as u32, ops::blocks(d.dv, dvs)),
        256,
        gdn_tc_leaf_smem(d, dvs) as u32,
    );
    launch!(g, g.k.gdn_tc_leaf[arith as usize][slice], lc;
        qkv, ld as i32, u, w, m, e, out, segs, init, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32, vec as i32)
}

/// The chunked gated delta rule on tensor cores: [`crate::gdn_prep_tc::gdn_tc_prep`] (or [`ops::gdn_wy_prep`] for
/// dims it does not take) + [`gdn_tc_state`] (slice from [`gdn_tc_slice`]); same arguments and results as
/// [`ops::gdn_chunked_wy`], into which it falls back for dims the tensor-core state pass does not take (DK > 128).
/// The forward's path (`CudaModel`, unless `GdnKernels::Simt`).
///
/// `st` ([`SegStates`]): segments `st.roots..nseg` may continue others of the batch (`CudaModel::forward_tree`); the
/// state pass then runs twice, over `0..roots` and then over the rest, which read what the first wrote (the second
/// as [`gdn_tc_leaf`] when their states are dropped and each is at most one chunk long; with
/// [`SegStates::long_children`] the short ones as the leaf pass, the long ones as the state pass).
/// [`SegStates::own`]: every segment continues its own state (one pass). Continuing segments need the tensor-core
/// state pass ([`gdn_tc_supported`]; else [`CudaError::Unsupported`], nothing launched).
pub fn gdn_tc_chunked(
    g: &Gpu,
    tc: TcArith,
    qkv: u64,
    ld: usize,
    gg: u64,
    beta: u64,
    out: u64,
    segs: u64,
    st: SegStates,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    max_len: usize,
    scratch: u64,
) -> Result<(), CudaError> {
    let (states, init) = (st.states, st.init);
    let roots = st.roots.min(nseg);
    let dvs = gdn_tc_slice(d, roots);
    let dvs2 = gdn_tc_slice(d, nseg - roots);
    if !gdn_tc_supported(g, d, dvs) || (roots < nseg && !gdn_tc_supported(g, d, dvs2)) {
        if roots < nseg {
            return Err(CudaError::Unsupported(format!(
                "segments continuing others in one forward need the tensor-core state pass (dims {d:?})"
            )));
        }
        return ops::gdn_chunked_wy(
            g, qkv, ld, gg, beta, out, segs, states, nseg, d, rows, max_len, scratch,
        );
    }
    let shape = crate::gdn_prep_tc::gdn_tc_prep_shape(g, d, rows, nseg, max_len, st.chunks);
    match crate::gdn_prep_tc::gdn_tc_prep_sliced(
        g, tc.prep, qkv, ld, gg, beta, segs, nseg, d, rows, max_len, scratch, shape,
    ) {
        Err(CudaError::Unsupported(_)) => {
            ops::gdn_wy_prep(g, qkv, ld, gg, beta, segs, nseg, d, rows, max_len, scratch)?
        }
        r => r?,
    }
    gdn_tc_state(
        g,
        tc.state,
        qkv,
        ld,
        out,
        segs,
        (states, init, true),
        roots,
        d,
        rows,
        scratch,
        dvs,
    )?;
    if roots < nseg {
        let (o, a) = (12 * roots as u64, 8 * roots as u64); // segs: 3 i32 per segment; states, init: one u64
        let leaf = gdn_tc_leaf_slice(d, nseg - roots);
        let leaf_ok = st.leaf_children && !st.keep_children && gdn_tc_leaf_supported(g, d, leaf);
        if leaf_ok {
            gdn_tc_leaf(
                g,
                tc.state,
                qkv,
                ld,
                out,
                segs + o,
                init + a,
                nseg - roots,
                d,
                rows,
                scratch,
                leaf,
            )?;
            if !st.long_children {
                return Ok(());
            }
        }
        let keep = if leaf_ok { 2 } else { st.keep_children as i32 };
        state_pass(
            g,
            tc.state,
            qkv,
            ld,
            out,
            segs + o,
            (states + a, init + a, keep),
            nseg - roots,
            d,
            rows,
            scratch,
            dvs2,
        )?;
    }
    Ok(())
}

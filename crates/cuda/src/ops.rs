//! Launchers for the kernels in `kernels.cu`, one per op, over raw device addresses (`u64`).
//! Shapes are written outermost first; `ld` is a row stride in elements. The model ([`crate::model`])
//! and the op tests call these; each op has a CPU twin in `onepass-kernels`.

use crate::launch;
use crate::runtime::{cfg, cfg3, Gpu, LaunchConfig};
use crate::CudaError;

/// Threads per block for row-wise ops.
const ROW_THREADS: u32 = 256;

/// Blocks of `per` items that cover `n` (a grid dimension).
pub(crate) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// A weight matrix [N, K] on the device: its address and storage (bf16, f32 in the exact mode, or a block format
/// in quant.cu's device layout: the code bytes of every row at `q`, then the f16 scales [N, K / block] at `d`).
#[derive(Clone, Copy, Debug)]
pub enum W {
    Bf16(u64),
    F32(u64),
    /// PQ2_0: codes [N, K/4] bytes (16 weights per little-endian word), scales [N, K/128].
    Pq2 {
        q: u64,
        d: u64,
    },
    /// Q8_0: signed bytes [N, K], scales [N, K/32].
    Q8 {
        q: u64,
        d: u64,
    },
    /// f16 values [N, K] as the file stores them, multiplied like the block formats: split mode's form of f16
    /// weights that bf16 does not hold exactly.
    F16(u64),
    /// f32 values [N, K] multiplied like the block formats: split mode's form of f32 weights that bf16 does not
    /// hold exactly.
    F32Rows(u64),
    /// f16 values [N, K], each the weight times 2^s (s putting the matrix's largest in [2^14, 2^15)): the half
    /// precision's projections, multiplied by cuBLAS on f16 inputs and by the f16 GEMV, which scale their sums by
    /// 2^-`shift` (exact: a power of two). `shift` is s plus the power of two e the projection's input is stored
    /// times (0 for a norm's output; a residual projection's from its bound, `Out::F16`), so the sums come back to
    /// the unscaled product.
    Half {
        w: u64,
        shift: i32,
    },
}

impl W {
    /// (address, scales, mode) for the kernels' `w, d, mode` parameters (`load_wq` in kernels.cu).
    fn parts(self) -> (u64, u64, i32) {
        match self {
            W::Bf16(p) => (p, 0, 0),
            W::F32(p) => (p, 0, 1),
            W::Pq2 { q, d } => (q, d, 2),
            W::Q8 { q, d } => (q, d, 3),
            W::F16(p) => (p, 0, 4),
            W::F32Rows(p) => (p, 0, 1),
            // Scaled values: never an embedding or a head (only projections are uploaded so).
            W::Half { w, .. } => (w, 0, 4),
        }
    }

    /// Whether it is multiplied by [`crate::qgemm`] (a block format, or float rows kept as stored), not cuBLAS.
    pub fn is_block(self) -> bool {
        matches!(
            self,
            W::Pq2 { .. } | W::Q8 { .. } | W::F16(_) | W::F32Rows(_)
        )
    }
}

/// x[n] = embed[ids[n]]. embed: [V, H] (any [`W`]); ids: [N] i32; x: [N, H] f32.
pub fn embed_gather(
    g: &Gpu,
    embed: W,
    ids: u64,
    x: u64,
    n: usize,
    hid: usize,
) -> Result<(), CudaError> {
    let (e, d, mode) = embed.parts();
    launch!(g, g.k.embed_gather, cfg((n as u32, 1), ROW_THREADS, 0); e, d, mode, ids, x, hid as i32)
}

/// Output of a row op: bf16 (GEMM input), f32, f16 times a power of two (the half precision's GEMM input), or f32
/// split into two bf16 planes (hi at the address, lo `plane` values after it; hi + lo carries the value to about
/// 2^-16 relative).
#[derive(Clone, Copy, Debug)]
pub enum Out {
    Bf16(u64),
    F32(u64),
    /// IEEE half of each value times 2^e, e in [-126, 127] (the half precision's GEMM inputs: 0 for a norm's output,
    /// a residual projection's power of two for its input; the scaled values must stay inside f16's range).
    F16(u64, i32),
    Split(u64, usize),
}

impl Out {
    /// (address, mode) for the kernels' `out, mode` parameters (`store_act` in kernels.cu).
    pub fn parts(self) -> (u64, i32) {
        match self {
            Out::Bf16(p) => (p, 0),
            Out::F32(p) => (p, 1),
            Out::F16(p, e) => {
                debug_assert!((-126..=127).contains(&e));
                (p, 128 + e.clamp(-126, 127))
            }
            Out::Split(p, plane) => {
                debug_assert!(plane > 0 && plane < i32::MAX as usize);
                (p, -(plane as i32))
            }
        }
    }
}

/// Rows per block of the row norms ([`rms_norm`], [`add2_rms_norm`]): one warp per row. Four rather than eight
/// spreads a forward's few hundred rows over more SMs (these kernels are latency-bound).
pub(crate) const NORM_ROWS: usize = 4;

/// RMSNorm of `rows` rows of `dim`: x [R, dim] (stride ldx) → out [R, dim] (stride ldo). Rows past one wave of the
/// `rms_norm` kernel ([`Gpu::norm_wave_rows`]: 136 registers, three blocks a multiprocessor) take `rms_norm_lean`
/// (64 registers, eight blocks), which gives the same bits; fewer rows keep the kernel that reads each value once.
pub fn rms_norm(
    g: &Gpu,
    x: u64,
    ldx: usize,
    gain: u64,
    eps: f32,
    rows: usize,
    dim: usize,
    out: Out,
    ldo: usize,
) -> Result<(), CudaError> {
    let (o, mode) = out.parts();
    let c = cfg((blocks(rows, NORM_ROWS), 1), 32 * NORM_ROWS as u32, 0);
    let f = if rows > g.norm_wave_rows {
        &g.k.rms_norm_lean
    } else {
        &g.k.rms_norm
    };
    crate::launch_pdl!(g, *f, c; x, ldx as i32, gain, eps, dim as i32, o, mode, ldo as i32, rows as i32)
}

/// norm(x) * w * silu(z) per value head. x: [N, HV, DV] f32; z row n at z + n*ldz; out: [N, HV*DV].
pub fn rms_norm_gated(
    g: &Gpu,
    x: u64,
    z: u64,
    ldz: usize,
    w: u64,
    eps: f32,
    n: usize,
    hv: usize,
    dv: usize,
    out: Out,
) -> Result<(), CudaError> {
    let (o, mode) = out.parts();
    let rows = n * hv;
    launch!(g, g.k.rms_norm_gated, cfg((blocks(rows, 4), 1), 128, 0);
        x, z, ldz as i32, w, eps, hv as i32, dv as i32, o, mode, rows as i32)
}

/// The conv kernels keep the K-1 previous inputs in registers: K in 2..=8.
fn check_conv_kernel(kernel: usize) -> Result<(), CudaError> {
    if (2..=8).contains(&kernel) {
        Ok(())
    } else {
        Err(CudaError::Unsupported(format!(
            "conv kernel {kernel} (2..=8 supported)"
        )))
    }
}

/// Shape of the gated-delta ops.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// Chunk length of the WY-form gated delta rule ([`gdn_chunked_wy`]; `GDN_C` in kernels.cu).
pub const GDN_CHUNK: usize = 64;

/// f32 values per stacked row of the scratch of [`gdn_chunked_wy`]: per value head U [DV], W [DK], M [chunk]
/// and the two decays.
pub fn gdn_wy_scratch(d: GdnDims) -> usize {
    d.hv * (d.dv + d.dk + GDN_CHUNK + 2)
}

/// Shared memory of the two WY kernels (pre-pass, state pass with `dvs` value columns per block).
fn gdn_wy_smem(d: GdnDims, dvs: usize) -> (usize, usize) {
    let (c, lk) = (GDN_CHUNK, d.dk + 1);
    (
        4 * (2 * c * lk + c * c + 3 * c),
        4 * (d.dk * dvs + 2 * c * lk + c * (c + 1) + c * dvs + 2 * c),
    )
}

/// Chunked gated delta rule in the WY form (f32 SIMT; the twin of `gdn_tc::gdn_tc_chunked`):
/// a pre-pass over every chunk of every (segment, value head) at once (decays, K·Kᵀ, Q·Kᵀ, the triangular
/// solve for U and W), then a state pass per (value head, segment, slice of value columns) that carries S
/// through the chunks in order. `rows`: N (stacked rows); `max_len`: the longest segment; `scratch`: room
/// for `rows * gdn_wy_scratch(d)` f32.
pub fn gdn_chunked_wy(
    g: &Gpu,
    qkv: u64,
    ld: usize,
    gg: u64,
    beta: u64,
    out: u64,
    segs: u64,
    states: u64,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    max_len: usize,
    scratch: u64,
) -> Result<(), CudaError> {
    gdn_wy_prep(g, qkv, ld, gg, beta, segs, nseg, d, rows, max_len, scratch)?;
    let dvs = gdn_wy_slice(d, nseg);
    gdn_wy_state(g, qkv, ld, out, segs, states, nseg, d, rows, scratch, dvs)
}

/// Value columns per block of the WY state pass: the widest slice (32) unless that leaves the GPU mostly
/// idle (fewer than 256 blocks), down to 8.
pub fn gdn_wy_slice(d: GdnDims, nseg: usize) -> usize {
    let mut dvs = 32;
    while dvs > 8 && d.hv * nseg * d.dv.div_ceil(dvs) < 256 {
        dvs /= 2;
    }
    dvs
}

/// Addresses of U, W, M, E in the WY scratch of `rows` stacked rows.
pub fn gdn_wy_parts(d: GdnDims, rows: usize, scratch: u64) -> (u64, u64, u64, u64) {
    let (n, hv) = (rows as u64, d.hv as u64);
    let u = scratch;
    let w = u + 4 * n * hv * d.dv as u64;
    let m = w + 4 * n * hv * d.dk as u64;
    let e = m + 4 * n * hv * GDN_CHUNK as u64;
    (u, w, m, e)
}

fn gdn_wy_fits(g: &Gpu, d: GdnDims, dvs: usize) -> Result<(usize, usize), CudaError> {
    let (smem_prep, smem_state) = gdn_wy_smem(d, dvs);
    if smem_prep.max(smem_state) > g.max_smem {
        return Err(CudaError::Unsupported(format!(
            "gated delta head dims {}x{} do not fit the WY kernels' shared memory",
            d.dk, d.dv
        )));
    }
    Ok((smem_prep, smem_state))
}

/// The WY pre-pass alone (see [`gdn_chunked_wy`]): fills the scratch for every chunk.
pub fn gdn_wy_prep(
    g: &Gpu,
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
    let (smem, _) = gdn_wy_fits(g, d, 8)?;
    let (u, w, m, e) = gdn_wy_parts(d, rows, scratch);
    let lc = cfg3(
        (blocks(max_len, GDN_CHUNK), nseg as u32, d.hv as u32),
        256,
        smem as u32,
    );
    launch!(g, g.fallbacks()?.gdn_wy_prep, lc;
        qkv, ld as i32, gg, beta, segs, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32, u, w, m, e)
}

/// The WY state pass alone (see [`gdn_chunked_wy`]), `dvs` (8, 16 or 32) value columns per block.
pub fn gdn_wy_state(
    g: &Gpu,
    qkv: u64,
    ld: usize,
    out: u64,
    segs: u64,
    states: u64,
    nseg: usize,
    d: GdnDims,
    rows: usize,
    scratch: u64,
    dvs: usize,
) -> Result<(), CudaError> {
    if ![8, 16, 32].contains(&dvs) {
        return Err(CudaError::Unsupported(format!(
            "WY state slice {dvs} (8, 16 or 32)"
        )));
    }
    let (_, smem) = gdn_wy_fits(g, d, dvs)?;
    let (u, w, m, e) = gdn_wy_parts(d, rows, scratch);
    let lc = cfg3(
        (d.hv as u32, nseg as u32, blocks(d.dv, dvs)),
        256,
        smem as u32,
    );
    launch!(g, g.fallbacks()?.gdn_wy_state, lc;
        qkv, ld as i32, u, w, m, e, out, segs, states, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32, dvs as i32)
}

/// Token rows per warp of `gdn_conv_prep_run` (`CONV_RUN` in fused.cu).
const CONV_RUN: usize = 8;

/// The Gated DeltaNet mixer inputs, parallel over tokens (tests hold it to the CPU's causal conv1d,
/// L2 norm and gates): conv1d + SiLU of channels 0..cd of x [N, ld] into out [N, cd] (the K-1 inputs before a
/// segment from its conv state), q/k heads L2-normalised (q times `scale`), gates from columns off_a, off_b
/// into gout, beta [N, HV]; then each segment's conv state advanced. tok: [N, 2]; segs: [S, 3];
/// states: [S] addresses of [K-1, cd] f32; par: 0, or [S] i32: a segment with `par[s] >= 0` continues segment
/// `par[s]` of this batch and reads its inputs before it from that segment's last rows, of which there must be
/// at least K-1 (`CudaModel::forward_tree`).
pub fn gdn_conv_prep(
    g: &Gpu,
    x: u64,
    ld: usize,
    out: u64,
    w: u64,
    kernel: usize,
    cd: usize,
    segs: u64,
    tok: u64,
    states: u64,
    par: u64,
    nseg: usize,
    n: usize,
    d: GdnDims,
    scale: f32,
    gates: (usize, usize, u64, u64),
    gout: u64,
    beta: u64,
) -> Result<(), CudaError> {
    check_conv_kernel(kernel)?;
    let (off_a, off_b, neg_a, dt_bias) = gates;
    // One warp per channel group and run of CONV_RUN token rows (fused.cu gdn_conv_prep_run): the same arithmetic,
    // far more parallel; the block-per-token kernel for heads its warps do not hold (dk > 256). Same arguments.
    if d.dk <= 256 && cd >= 2 * d.hk * d.dk {
        let groups = blocks(2 * d.hk + (cd - 2 * d.hk * d.dk).div_ceil(128), 4);
        crate::launch_pdl!(g, g.k.gdn_conv_prep_run, cfg((blocks(n, CONV_RUN), groups), 128, 0);
            x, ld as i32, out, w, kernel as i32, cd as i32, segs, tok, states, par, d.hk as i32, d.dk as i32,
            scale, off_a as i32, off_b as i32, neg_a, dt_bias, d.hv as i32, gout, beta, n as i32)?;
    } else {
        launch!(g, g.k.gdn_conv_prep, cfg((n as u32, 1), 256, 0);
            x, ld as i32, out, w, kernel as i32, cd as i32, segs, tok, states, par, d.hk as i32, d.dk as i32,
            scale, off_a as i32, off_b as i32, neg_a, dt_bias, d.hv as i32, gout, beta)?;
    }
    launch!(g, g.k.gdn_conv_state, cfg((blocks(cd, 256), nseg as u32), 256, 0);
        x, ld as i32, kernel as i32, cd as i32, segs, states, par)
}

/// `out[r]` (i32) = the index of the highest of x[r, :n] (f32): the lowest index among equal values, NaN never
/// chosen, 0 when no value beats -inf (the host's `onepass_engine::argmax`).
pub fn argmax_rows(g: &Gpu, x: u64, rows: usize, n: usize, out: u64) -> Result<(), CudaError> {
    if n > i32::MAX as usize {
        return Err(CudaError::Unsupported(format!("argmax over {n} values")));
    }
    crate::launch_pdl!(g, g.k.argmax_rows, cfg((rows as u32, 1), 1024, 0); x, n as i32, out)
}

/// Blocks of [`head_argmax_bf16`] at most (`HEAD_BLOCKS` in decode.cu): the length of its partial buffers.
pub const HEAD_BLOCKS: usize = 2048;

/// Greedy decoding's head and pick in one launch: `out[0]` = the index of the highest `bf16(h) · w[n]` over the N
/// rows of `w` [N, K] (row stride `ldw`), as [`argmax_rows`] over the bf16 GEMV's logits picks it. `part_v`,
/// `part_i`: [`HEAD_BLOCKS`] values each; `count`: one u32, 0 before the launch (the launch leaves it 0). K and `ldw`
/// multiples of 8, `w` 16-byte aligned (the caller checks).
pub fn head_argmax_bf16(
    g: &Gpu,
    h: u64,
    k: usize,
    (w, ldw, n): (u64, usize, usize),
    (part_v, part_i, count): (u64, u64, u64),
    out: u64,
) -> Result<(), CudaError> {
    let blocks = n.div_ceil(8).clamp(1, (8 * g.sms).min(HEAD_BLOCKS));
    let smem = 2 * k.next_multiple_of(8);
    // Without an opt-in to more (48 KB: K up to 24,576).
    if smem > 48 * 1024 || n > i32::MAX as usize {
        return Err(CudaError::Unsupported(format!(
            "a head of {n} rows of {k} values for the fused pick"
        )));
    }
    launch!(g, g.k.head_argmax_bf16, cfg((blocks as u32, 1), 256, smem as u32);
        h, k as i32, w, ldw as i32, n as i32, part_v, part_i, count, out)
}

/// One-token gated delta step for segments of exactly one row.
pub fn gdn_step(
    g: &Gpu,
    qkv: u64,
    ld: usize,
    gg: u64,
    beta: u64,
    out: u64,
    segs: u64,
    states: u64,
    nseg: usize,
    d: GdnDims,
) -> Result<(), CudaError> {
    // The kernel keeps a value column's 16 row groups of at most 16 key rows each in registers.
    if d.dk > 256 {
        return Err(CudaError::Unsupported(format!(
            "gated delta step with key head dim {} (at most 256)",
            d.dk
        )));
    }
    let grid = (d.hv as u32, d.dv.div_ceil(16) as u32, nseg as u32);
    crate::launch_pdl!(g, g.k.gdn_step, cfg3(grid, 256, (8 * d.dk) as u32);
        qkv, ld as i32, gg, beta, out, segs, states, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32)
}

/// Attention shape.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Rotated pairs (rotary dims / 2).
    pub half: usize,
}

/// Addresses per segment in the KV table of [`attn_prep`] and the attention kernels: own k, own v (caches
/// [cap, HKV, D], f32 or f16 as the model keeps them), base k, base v (the read-only cache of the state this one was
/// forked from), base length (positions below it are read from the base, the rest from own rows `pos - base`).
pub const KV_ENTRIES: usize = 5;

/// q/k RMSNorm + partial RoPE; q to q_out [N, H, D]; k, v appended to each row's segment cache at
/// its position (`kv_f16`: the caches hold f16, rounded to nearest; else f32). proj: [N, ld]; tok: [N, 2] i32
/// (segment, position); kv: [S, KV_ENTRIES].
pub fn attn_prep(
    g: &Gpu,
    proj: u64,
    ld: usize,
    qn: u64,
    kn: u64,
    eps: f32,
    inv_freq: u64,
    a: AttnDims,
    n: usize,
    tok: u64,
    kv: u64,
    q_out: u64,
    kv_f16: bool,
) -> Result<(), CudaError> {
    if a.head_dim > 1024 {
        return Err(CudaError::Unsupported(format!(
            "head_dim {} (at most 1024)",
            a.head_dim
        )));
    }
    let k = if kv_f16 {
        &g.k.attn_prep_h
    } else {
        &g.k.attn_prep
    };
    crate::launch_pdl!(g, *k, cfg((n as u32, (a.heads + a.kv_heads) as u32), 128, 0);
        proj, ld as i32, qn, kn, eps, inv_freq, a.half as i32, a.heads as i32, a.kv_heads as i32, a.head_dim as i32, tok, kv, q_out)
}

/// Query rows and keys per tile of [`attention_tiled`] (`ATT_Q`, `ATT_K` in kernels.cu).
const ATT_Q: usize = 32;
const ATT_K: usize = 32;

/// Tiled causal attention over the caches, times sigmoid(gate) (gate at h*2D + D of proj rows) → out [N, H*D]
/// (f32 SIMT; the twin of `attn_tc::attention_tc`, and the path for head dims it does not take): per (tile of 32
/// query rows of a segment, head), keys and values through shared memory 32 at a time. q: [N, H, D]; segs: [S, 3]
/// i32; kv: the KV table of [`attn_prep`]; `max_len`: the longest segment.
pub fn attention_tiled(
    g: &Gpu,
    q: u64,
    proj: u64,
    ld: usize,
    segs: u64,
    kv: u64,
    nseg: usize,
    max_len: usize,
    a: AttnDims,
    scale: f32,
    out: Out,
) -> Result<(), CudaError> {
    let ldd = a.head_dim + 1;
    let smem = 4 * ((ATT_Q + 2 * ATT_K) * ldd + ATT_Q * (ATT_K + 1) + 3 * ATT_Q);
    if a.head_dim > 512 || smem > g.max_smem {
        return Err(CudaError::Unsupported(format!(
            "head_dim {} (at most 512)",
            a.head_dim
        )));
    }
    let (o, mode) = out.parts();
    let lc = cfg3(
        (blocks(max_len, ATT_Q), nseg as u32, a.heads as u32),
        256,
        smem as u32,
    );
    launch!(g, g.fallbacks()?.attention_tiled, lc;
        q, proj, ld as i32, segs, kv, a.heads as i32, a.kv_heads as i32, a.head_dim as i32, scale, o, mode)
}

/// out [N, I] = silu(gu[:, :I]) * gu[:, I:].
pub fn swiglu(g: &Gpu, gu: u64, inter: usize, n: usize, out: Out) -> Result<(), CudaError> {
    let (o, mode) = out.parts();
    let (lc, vec) = swiglu_cfg(gu, inter, n, o, mode);
    launch!(g, g.k.swiglu, lc; gu, inter as i32, n as i32, o, mode, vec as i32)
}

/// Grid of `swiglu`, and whether its 4-wide path applies: inter a multiple of 4, gu 16-byte aligned, out (and its lo
/// plane, `-mode` values on) aligned for `store_act_vec`.
fn swiglu_cfg(gu: u64, inter: usize, n: usize, o: u64, mode: i32) -> (LaunchConfig, bool) {
    let out_align = if mode == 1 { 16 } else { 8 };
    let vec = inter.is_multiple_of(4)
        && gu.is_multiple_of(16)
        && o.is_multiple_of(out_align)
        && (mode >= 0 || (mode % 4) == 0);
    let per = if vec { inter / 4 } else { inter };
    let lc = cfg((blocks(per, 256), n.clamp(1, 65535) as u32), 256, 0);
    (lc, vec)
}

/// f32 → bf16.
pub fn to_bf16(g: &Gpu, x: u64, y: u64, n: usize) -> Result<(), CudaError> {
    launch!(g, g.k.to_bf16, cfg((blocks(n, 256), 1), 256, 0); x, y, n as i32)
}

/// out[p] = hidden[pairs[p].0] · head[pairs[p].1]. pairs: [P, 2] i32.
pub fn rows_dot(
    g: &Gpu,
    hidden: u64,
    hid: usize,
    pairs: u64,
    p: usize,
    head: W,
    out: u64,
) -> Result<(), CudaError> {
    let (hd, d, mode) = head.parts();
    launch!(g, g.k.rows_dot, cfg((blocks(p, 4), 1), 128, 0); hidden, hid as i32, pairs, p as i32, hd, d, mode, out)
}

/// The RMSNorm in front of a [`hadamard_rows`]: its gain, epsilon, and where the normed rows go unrotated too (an
/// [`Out`] and its row stride), if anywhere.
pub type NormFirst = (u64, f32, Option<(Out, usize)>);

/// The blockwise Hadamard rotation of `rows` rows of `k` values (`k % 1024 == 0`; docs/formats.md): `out = R·x`
/// (signs, FWHT per 1024-block, ÷32), or with `inverse` `Rᵀ·x` (FWHT, ÷32, then signs: the embedding rows after
/// the gather). x: [R, k] f32 (row stride ldx); signs: [k]. `norm`: `(gain, eps, raw)` first RMS-norms each row
/// (`x·rsqrt(mean(x²) + eps)·gain`, gain [k]) and, where `raw` is given, also stores the normed rows unrotated there
/// (an [`Out`] and its row stride). `out` may be x itself when there is no norm. One launch.
pub fn hadamard_rows(
    g: &Gpu,
    (x, ldx): (u64, usize),
    rows: usize,
    k: usize,
    signs: u64,
    inverse: bool,
    norm: Option<NormFirst>,
    (out, ldo): (Out, usize),
) -> Result<(), CudaError> {
    if !k.is_multiple_of(1024) {
        return Err(CudaError::Unsupported(format!(
            "a Hadamard rotation of rows of {k} values (a multiple of 1024 needed)"
        )));
    }
    if rows == 0 {
        return Ok(());
    }
    let (o, mode) = out.parts();
    let (gain, eps, raw) = norm.map_or((0, 0.0, None), |(g, e, r)| (g, e, r));
    let ((r, raw_mode), ldr) = raw.map_or(((0, 0), 0), |(o, ld)| (o.parts(), ld));
    let c = cfg((rows as u32, (k / 1024) as u32), 256, 0);
    crate::launch_pdl!(g, g.k.hadamard_rows, c; x, ldx as i32, gain, eps, k as i32, signs, i32::from(inverse), o, mode,
        ldo as i32, r, raw_mode, ldr as i32, 0i32)
}

/// The input of [`rotate_row_norm`] (quant.cu's `RotSrc`, field for field): the residual row `x`, the norm's gain
/// `w` and `eps`, the rotation's signs, and `raw` (0 for none) where the normed row is also stored as it is, in
/// `store_act`'s mode `raw_mode` ([`Out::parts`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RotSrc {
    pub x: u64,
    pub w: u64,
    pub signs: u64,
    pub raw: u64,
    pub eps: f32,
    pub raw_mode: i32,
}

// SAFETY: a plain C struct of addresses and scalars, laid out as quant.cu's RotSrc.
unsafe impl cudarc::driver::DeviceRepr for RotSrc {}

/// Whether [`rotate_row_norm`] takes a row of `k` values: `k` a multiple of 1024, at most 24 of them (one block's
/// warps).
pub fn rotate_row_takes(k: usize) -> bool {
    k.is_multiple_of(1024) && (1..=24).contains(&(k / 1024))
}

/// A rotated pack's norm site for one token row in one block: `out = R · RMSNorm(x)` stored as `out`'s layout (one
/// row of `k`; split: the lo plane `k` values on), the normed row also at `src.raw`. One warp per 1024-block, the
/// butterflies in registers and shuffles: for one row, `hadamard_rows`' blocks would each re-read the whole row for
/// the norm and pass six barriers. (The SwiGLU, gated-norm and plain sites measured faster on their row kernels.)
pub fn rotate_row_norm(g: &Gpu, src: RotSrc, k: usize, out: Out) -> Result<(), CudaError> {
    if !rotate_row_takes(k) {
        return Err(CudaError::Unsupported(format!(
            "a one-block rotation of a row of {k} values"
        )));
    }
    let (o, mode) = out.parts();
    let c = cfg((1, 1), 32 * (k / 1024) as u32, 0);
    crate::launch_pdl!(g, g.k.rotate_row_norm, c; src, k as i32, o, mode)
}

/// Whether [`gated_norm_rotate`] takes value heads of `dv` values, `hv` of them: whole heads in each 1024-block.
pub fn gated_norm_rotate_takes(hv: usize, dv: usize) -> bool {
    dv >= 4 && dv.is_power_of_two() && dv <= 1024 && (hv * dv).is_multiple_of(1024)
}

/// [`rms_norm_gated`] and the rotation of its output in one launch (a rotated pack's out_proj site): `out = R ·
/// (norm(x)·w·silu(z))` per row. x: [N, HV·DV] f32; z row n at z + n·ldz; w: [DV]; signs: [HV·DV]. The dims must
/// pass [`gated_norm_rotate_takes`].
pub fn gated_norm_rotate(
    g: &Gpu,
    (x, z, ldz): (u64, u64, usize),
    w: u64,
    eps: f32,
    n: usize,
    (hv, dv): (usize, usize),
    signs: u64,
    (out, ldo): (Out, usize),
) -> Result<(), CudaError> {
    if !gated_norm_rotate_takes(hv, dv) {
        return Err(CudaError::Unsupported(format!(
            "the fused gated norm and rotation of {hv} heads of {dv} values"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (o, mode) = out.parts();
    let k = hv * dv;
    let c = cfg((n as u32, (k / 1024) as u32), 256, 0);
    launch!(g, g.k.gated_norm_rotate, c; x, z, ldz as i32, w, eps, dv as i32, k as i32, signs, o, mode, ldo as i32)
}

/// [`swiglu`] and the rotation of its output in one launch (a rotated pack's down-projection site): `out = R ·
/// (silu(gate) · up)` per row. gu: [N, 2·inter] f32 (gate, then up), `inter % 1024 == 0`; signs: [inter].
pub fn swiglu_rotate(
    g: &Gpu,
    gu: u64,
    inter: usize,
    n: usize,
    signs: u64,
    (out, ldo): (Out, usize),
) -> Result<(), CudaError> {
    if !inter.is_multiple_of(1024) {
        return Err(CudaError::Unsupported(format!(
            "a Hadamard rotation of rows of {inter} values (a multiple of 1024 needed)"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (o, mode) = out.parts();
    let c = cfg((n as u32, (inter / 1024) as u32), 256, 0);
    crate::launch_pdl!(g, g.k.hadamard_rows, c; gu, (2 * inter) as i32, 0u64, 0.0f32, inter as i32, signs, 0i32, o, mode,
        ldo as i32, 0u64, 0i32, 0i32, 1i32)
}

/// `x += f[..R] + f[R..]` (f: [2R, dim], the second half `lo` values after the first), then [`rms_norm`] of x:
/// the split-mode residual update, fused into the norm that reads it.
pub fn add2_rms_norm(
    g: &Gpu,
    x: u64,
    ldx: usize,
    f: u64,
    lo: usize,
    gain: u64,
    eps: f32,
    rows: usize,
    dim: usize,
    out: Out,
    ldo: usize,
) -> Result<(), CudaError> {
    let (o, mode) = out.parts();
    let c = cfg((blocks(rows, NORM_ROWS), 1), 32 * NORM_ROWS as u32, 0);
    launch!(g, g.k.add2_rms_norm, c; x, ldx as i32, f, lo as i64, gain, eps, dim as i32, o, mode, ldo as i32, rows as i32)
}

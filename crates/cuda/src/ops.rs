//! Launchers for the kernels in `kernels.cu`, one per op, over raw device addresses (`u64`).
//! Shapes are written outermost first; `ld` is a row stride in elements. The model ([`crate::model`])
//! and the op tests call these; each op has a CPU twin in `onepass-kernels`.

use crate::launch;
use crate::runtime::{cfg, Gpu};
use crate::CudaError;

/// Threads per block for row-wise ops.
const ROW_THREADS: u32 = 256;

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// A weight matrix on the device: its address and storage dtype (bf16, or f32 in the exact mode).
#[derive(Clone, Copy, Debug)]
pub enum W {
    Bf16(u64),
    F32(u64),
}

impl W {
    fn parts(self) -> (u64, i32) {
        match self {
            W::Bf16(p) => (p, 0),
            W::F32(p) => (p, 1),
        }
    }
}

/// x[n] = embed[ids[n]]. embed: [V, H]; ids: [N] i32; x: [N, H] f32.
pub fn embed_gather(
    g: &Gpu,
    embed: W,
    ids: u64,
    x: u64,
    n: usize,
    hid: usize,
) -> Result<(), CudaError> {
    let (e, f32w) = embed.parts();
    launch!(g, g.k.embed_gather, cfg((n as u32, 1), ROW_THREADS, 0); e, f32w, ids, x, hid as i32)
}

/// Output of a row op: bf16 (GEMM input) or f32.
#[derive(Clone, Copy, Debug)]
pub enum Out {
    Bf16(u64),
    F32(u64),
}

impl Out {
    /// (address, 1 if f32) for the kernels' `out, f32out` parameters.
    fn parts(self) -> (u64, i32) {
        match self {
            Out::Bf16(p) => (p, 0),
            Out::F32(p) => (p, 1),
        }
    }
}

/// RMSNorm of `rows` rows of `dim`: x [R, dim] (stride ldx) → out [R, dim] (stride ldo).
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
    let (ob, of) = match out {
        Out::Bf16(p) => (p, 0u64),
        Out::F32(p) => (0u64, p),
    };
    launch!(g, g.k.rms_norm, cfg((rows as u32, 1), ROW_THREADS, 0); x, ldx as i32, gain, eps, dim as i32, ob, of, ldo as i32)
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
    let (o, f32out) = out.parts();
    launch!(g, g.k.rms_norm_gated, cfg(((n * hv) as u32, 1), 128, 0); x, z, ldz as i32, w, eps, hv as i32, dv as i32, o, f32out)
}

/// L2-normalises the q and k heads of xc [N, cd] in place (q times `scale`).
pub fn qk_l2norm(
    g: &Gpu,
    xc: u64,
    n: usize,
    cd: usize,
    hk: usize,
    dk: usize,
    scale: f32,
) -> Result<(), CudaError> {
    launch!(g, g.k.qk_l2norm, cfg((n as u32, (2 * hk) as u32), 128, 0); xc, cd as i32, hk as i32, dk as i32, scale)
}

/// g = neg_a * softplus(a + dt_bias), beta = sigmoid(b); a, b at columns off_a, off_b of proj [N, ld].
pub fn gdn_gates(
    g: &Gpu,
    proj: u64,
    ld: usize,
    off_a: usize,
    off_b: usize,
    neg_a: u64,
    dt_bias: u64,
    hv: usize,
    n: usize,
    gout: u64,
    beta: u64,
) -> Result<(), CudaError> {
    launch!(g, g.k.gdn_gates, cfg((blocks(n * hv, 256), 1), 256, 0);
        proj, ld as i32, off_a as i32, off_b as i32, neg_a, dt_bias, hv as i32, n as i32, gout, beta)
}

/// Causal depthwise conv + SiLU per segment. x: [N, ld] (channels 0..cd); out: [N, cd]; w: [cd, K];
/// segs: [S, 3] i32; states: [S] addresses of [K-1, cd] f32.
pub fn conv1d_silu(
    g: &Gpu,
    x: u64,
    ld: usize,
    out: u64,
    w: u64,
    kernel: usize,
    cd: usize,
    segs: u64,
    states: u64,
    nseg: usize,
) -> Result<(), CudaError> {
    if !(2..=8).contains(&kernel) {
        return Err(CudaError::Unsupported(format!(
            "conv kernel {kernel} (2..=8 supported)"
        )));
    }
    launch!(g, g.k.conv1d_silu, cfg((blocks(cd, 128), nseg as u32), 128, 0);
        x, ld as i32, out, w, kernel as i32, cd as i32, segs, states)
}

/// Shape of the gated-delta ops.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// Value columns per block of [`gdn_chunked`] (the state's columns are independent; more blocks
/// per head fill more multiprocessors).
pub const GDN_DV_SLICE: usize = 32;

/// Shared memory of [`gdn_chunked`] for chunk `c` and `dvs` value columns per block.
pub fn gdn_chunked_smem(d: GdnDims, c: usize, dvs: usize) -> usize {
    4 * (d.dk * dvs + 2 * c * (d.dk + 1) + 2 * c * c + c * dvs + 4 * c)
}

/// Chunked gated delta rule per (value head, segment). qkv: [N, ld]; g, beta: [N, HV]; out: [N, HV, DV];
/// states: [S] addresses of [HV, DK, DV] f32.
pub fn gdn_chunked(
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
    chunk: usize,
) -> Result<(), CudaError> {
    let dvs = GDN_DV_SLICE.min(d.dv);
    let mut c = chunk;
    while c > 1 && gdn_chunked_smem(d, c, dvs) > g.max_smem {
        c /= 2;
    }
    let smem = gdn_chunked_smem(d, c, dvs);
    if smem > g.max_smem {
        return Err(CudaError::Unsupported(format!(
            "gated delta state {}x{} does not fit in shared memory",
            d.dk, d.dv
        )));
    }
    let mut lc = cfg((d.hv as u32, nseg as u32), 256, smem as u32);
    lc.grid_dim.2 = d.dv.div_ceil(dvs) as u32;
    launch!(g, g.k.gdn_chunked, lc;
        qkv, ld as i32, gg, beta, out, segs, states, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32, c as i32, dvs as i32)
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
    launch!(g, g.k.gdn_step, cfg((d.hv as u32, nseg as u32), 128, (8 * d.dk) as u32);
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

/// Addresses per segment in the KV table of [`attn_prep`] and [`attention`]: own k, own v (caches
/// [cap, HKV, D] f32), base k, base v (the read-only cache of the state this one was forked from), base
/// length (positions below it are read from the base, the rest from own rows `pos - base`).
pub const KV_ENTRIES: usize = 5;

/// q/k RMSNorm + partial RoPE; q to q_out [N, H, D]; k, v appended to each row's segment cache at
/// its position. proj: [N, ld]; tok: [N, 2] i32 (segment, position); kv: [S, KV_ENTRIES].
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
) -> Result<(), CudaError> {
    if a.head_dim > 1024 {
        return Err(CudaError::Unsupported(format!(
            "head_dim {} (at most 1024)",
            a.head_dim
        )));
    }
    launch!(g, g.k.attn_prep, cfg((n as u32, (a.heads + a.kv_heads) as u32), 128, 0);
        proj, ld as i32, qn, kn, eps, inv_freq, a.half as i32, a.heads as i32, a.kv_heads as i32, a.head_dim as i32, tok, kv, q_out)
}

/// Causal attention over the caches, times sigmoid(gate) (gate at h*2D + D of proj rows) → out [N, H*D].
pub fn attention(
    g: &Gpu,
    q: u64,
    proj: u64,
    ld: usize,
    tok: u64,
    kv: u64,
    n: usize,
    a: AttnDims,
    scale: f32,
    out: Out,
) -> Result<(), CudaError> {
    if a.head_dim > 512 || a.head_dim % 4 != 0 {
        return Err(CudaError::Unsupported(format!(
            "head_dim {} (a multiple of 4, at most 512)",
            a.head_dim
        )));
    }
    let (o, f32out) = out.parts();
    launch!(g, g.k.attention, cfg((blocks(n, 4), a.heads as u32), 128, 0);
        q, proj, ld as i32, tok, kv, n as i32, a.heads as i32, a.kv_heads as i32, a.head_dim as i32, scale, o, f32out)
}

/// out [N, I] = silu(gu[:, :I]) * gu[:, I:].
pub fn swiglu(g: &Gpu, gu: u64, inter: usize, n: usize, out: Out) -> Result<(), CudaError> {
    let (o, f32out) = out.parts();
    launch!(g, g.k.swiglu, cfg((blocks(n * inter, 256), 1), 256, 0); gu, inter as i32, n as i32, o, f32out)
}

/// x += y.
pub fn add_inplace(g: &Gpu, x: u64, y: u64, n: usize) -> Result<(), CudaError> {
    launch!(g, g.k.add_inplace, cfg((blocks(n, 256), 1), 256, 0); x, y, n as i32)
}

/// f32 → bf16.
pub fn to_bf16(g: &Gpu, x: u64, y: u64, n: usize) -> Result<(), CudaError> {
    launch!(g, g.k.to_bf16, cfg((blocks(n, 256), 1), 256, 0); x, y, n as i32)
}

/// f32 → hi, lo bf16 planes with hi + lo ≈ x (n values).
pub fn split_bf16(g: &Gpu, x: u64, hi: u64, lo: u64, n: usize) -> Result<(), CudaError> {
    launch!(g, g.k.split_bf16, cfg((blocks(n, 256), 1), 256, 0); x, hi, lo, n as i32)
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
    let (hd, f32w) = head.parts();
    launch!(g, g.k.rows_dot, cfg((blocks(p, 4), 1), 128, 0); hidden, hid as i32, pairs, p as i32, hd, f32w, out)
}

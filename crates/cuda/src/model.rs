//! The Qwen3.5 hybrid forward on one GPU, the twin of `onepass_model::Model::forward_batch`.
//!
//! ```text
//! x = embed[ids]                                        x: [N, H] f32 (all segments stacked)
//! per layer:
//!   h = rms_norm(x) → bf16
//!   GDN:  p = h·[W_qkv; W_z; W_a; W_b]ᵀ (one GEMM)      p: [N, cd + HV*DV + 2*HV] f32
//!         c = silu(conv1d(p[:, :cd])) per segment        (conv state in/out)
//!         q, k = l2norm(q)·DK^-½, l2norm(k); g, β from a, b
//!         o = gated_delta(q, k, v, g, β) per (value head, segment)   (chunked; one-token step)
//!         x += (rms_norm_gated(o, z) → bf16)·W_outᵀ      (the GEMM accumulates into x)
//!   Attn: p = h·[W_q|gate; W_k; W_v]ᵀ                    p: [N, H*2D + 2*HKV*D]
//!         q, k = rope(rms_norm(q)), rope(rms_norm(k)); k, v → the segment's KV cache
//!         x += (attention(q, cache)·σ(gate) → bf16)·W_oᵀ
//!   x += (swiglu(rms_norm(x)·[W_gate; W_up]ᵀ) → bf16)·W_downᵀ
//! hidden = rms_norm(x)                                  hidden: [N, H] f32, stays on the device
//! ```
//! Segment semantics are those of the CPU model: the projections see every token of every segment,
//! the token mixers walk each segment with its own [`CudaState`].

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;
use onepass_model::{LayerKind, MixerView, Model, ModelError};
use onepass_tensor::{Tensor, View};

use crate::ops::{self, AttnDims, GdnDims, Out};
use crate::runtime::Gpu;
use crate::CudaError;

/// Tokens per chunk of the chunked gated delta rule (as on the CPU).
pub const CHUNK: usize = 64;

/// A device buffer with its address.
struct Dev<T> {
    /// Owns the memory `ptr` points into.
    _buf: CudaSlice<T>,
    ptr: u64,
}

impl<T: cudarc::driver::DeviceRepr> Dev<T> {
    fn new(g: &Gpu, buf: CudaSlice<T>) -> Self {
        let ptr = g.ptr(&buf);
        Dev { _buf: buf, ptr }
    }
}

fn upload_f32(g: &Gpu, v: &[f32]) -> Result<Dev<f32>, CudaError> {
    Ok(Dev::new(g, g.upload(v)?))
}

/// Appends a weight's values as bf16 bits.
fn push_bf16(out: &mut Vec<u16>, t: &Tensor) {
    match t.view() {
        View::BF16(v) => out.extend(v.iter().map(|x| x.to_bits())),
        _ => out.extend(t.to_f32_vec().iter().map(|x| bf16::from_f32(*x).to_bits())),
    }
}

/// Uploads weights stacked by rows (all with the same column count) as one bf16 matrix.
fn upload_stacked(g: &Gpu, parts: &[&Tensor]) -> Result<Dev<u16>, CudaError> {
    let total: usize = parts.iter().map(|t| t.numel()).sum();
    let mut host = Vec::with_capacity(total);
    for t in parts {
        push_bf16(&mut host, t);
    }
    Ok(Dev::new(g, g.upload(&host)?))
}

struct GdnLayer {
    /// w_in: [cd + HV*DV + 2*HV, H] = in_proj_qkv; in_proj_z; in_proj_a; in_proj_b
    w_in: Dev<u16>,
    /// w_out: [H, HV*DV]
    w_out: Dev<u16>,
    conv: Dev<f32>,
    neg_a: Dev<f32>,
    dt_bias: Dev<f32>,
    norm: Dev<f32>,
    d: GdnDims,
    kernel: usize,
    eps: f32,
    cd: usize,
}

impl GdnLayer {
    fn proj_width(&self) -> usize {
        self.cd + self.d.hv * self.d.dv + 2 * self.d.hv
    }
}

struct AttnLayer {
    /// w_in: [H*2D + 2*HKV*D, hidden] = q_proj (q|gate per head); k_proj; v_proj
    w_in: Dev<u16>,
    /// w_o: [hidden, H*D]
    w_o: Dev<u16>,
    q_norm: Dev<f32>,
    k_norm: Dev<f32>,
    inv_freq: Dev<f32>,
    a: AttnDims,
    eps: f32,
}

impl AttnLayer {
    fn proj_width(&self) -> usize {
        let a = self.a;
        a.heads * 2 * a.head_dim + 2 * a.kv_heads * a.head_dim
    }
}

enum Mixer {
    Gdn(GdnLayer),
    Attn(AttnLayer),
}

struct Layer {
    in_norm: Dev<f32>,
    post_norm: Dev<f32>,
    mixer: Mixer,
    /// w_gu: [2I, H] = gate; up
    w_gu: Dev<u16>,
    /// w_down: [H, I]
    w_down: Dev<u16>,
}

/// A model on one GPU (weights bf16).
pub struct CudaModel {
    gpu: Arc<Gpu>,
    /// embed: [V, H]
    embed: Dev<u16>,
    /// lm_head: [V, H]; None when tied to the embedding.
    lm_head: Option<Dev<u16>>,
    final_norm: Dev<f32>,
    eps: f32,
    layers: Vec<Layer>,
    hid: usize,
    inter: usize,
    vocab: usize,
    max_pos: usize,
}

/// One layer's device state.
enum LayerState {
    /// k, v: [cap, HKV, D] f32
    Attn {
        k: CudaSlice<f32>,
        v: CudaSlice<f32>,
        cap: usize,
        row: usize,
    },
    /// conv: [K-1, cd]; ssm: [HV, DK, DV] f32
    Gdn {
        conv: CudaSlice<f32>,
        ssm: CudaSlice<f32>,
    },
}

/// The state of one sequence on the device.
pub struct CudaState {
    pos: usize,
    layers: Vec<LayerState>,
}

impl CudaState {
    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }
}

/// Final-normed hidden rows on the device. hidden: [N, H] f32
pub struct CudaHidden {
    buf: CudaSlice<f32>,
    pub rows: usize,
    pub hid: usize,
}

impl CudaModel {
    /// Uploads a loaded CPU model's weights to device `ordinal`.
    pub fn from_model(m: &Model, ordinal: usize) -> Result<Self, CudaError> {
        let gpu = Gpu::new(ordinal)?;
        Self::with_gpu(m, gpu)
    }

    /// Uploads onto an opened GPU.
    pub fn with_gpu(m: &Model, gpu: Arc<Gpu>) -> Result<Self, CudaError> {
        let g = &*gpu;
        let c = m.text_config();
        let w = m.weights();
        let embed = upload_stacked(g, &[w.embed])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(upload_stacked(g, &[w.lm_head])?)
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (li, l) in w.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                MixerView::GatedDeltaNet(v) => {
                    if v.hv % v.hk != 0 {
                        return Err(CudaError::Unsupported(format!(
                            "layer {li}: value heads {} not a multiple of key heads {}",
                            v.hv, v.hk
                        )));
                    }
                    Mixer::Gdn(GdnLayer {
                        w_in: upload_stacked(g, &[v.in_qkv, v.in_z, v.in_a, v.in_b])?,
                        w_out: upload_stacked(g, &[v.out])?,
                        conv: upload_f32(g, v.conv)?,
                        neg_a: upload_f32(g, v.neg_a)?,
                        dt_bias: upload_f32(g, v.dt_bias)?,
                        norm: upload_f32(g, v.norm)?,
                        d: GdnDims {
                            hk: v.hk,
                            hv: v.hv,
                            dk: v.dk,
                            dv: v.dv,
                        },
                        kernel: v.kernel,
                        eps: v.eps,
                        cd: 2 * v.hk * v.dk + v.hv * v.dv,
                    })
                }
                MixerView::Attention(v) => Mixer::Attn(AttnLayer {
                    w_in: upload_stacked(g, &[v.q, v.k, v.v])?,
                    w_o: upload_stacked(g, &[v.o])?,
                    q_norm: upload_f32(g, v.q_norm)?,
                    k_norm: upload_f32(g, v.k_norm)?,
                    inv_freq: upload_f32(
                        g,
                        if v.inv_freq.is_empty() {
                            &[0.0]
                        } else {
                            v.inv_freq
                        },
                    )?,
                    a: AttnDims {
                        heads: v.heads,
                        kv_heads: v.kv_heads,
                        head_dim: v.head_dim,
                        half: v.inv_freq.len(),
                    },
                    eps: v.eps,
                }),
            };
            layers.push(Layer {
                in_norm: upload_f32(g, l.input_norm)?,
                post_norm: upload_f32(g, l.post_norm)?,
                mixer,
                w_gu: upload_stacked(g, &[l.mlp_gate, l.mlp_up])?,
                w_down: upload_stacked(g, &[l.mlp_down])?,
            });
        }
        // The kinds must agree with the config (they are data, not inferred).
        for (li, (l, kind)) in layers.iter().zip(&c.layer_types).enumerate() {
            let ok = matches!(
                (&l.mixer, kind),
                (Mixer::Gdn(_), LayerKind::GatedDeltaNet) | (Mixer::Attn(_), LayerKind::Attention)
            );
            if !ok {
                return Err(CudaError::Unsupported(format!(
                    "layer {li}: mixer does not match layer_types"
                )));
            }
        }
        let final_norm = upload_f32(g, w.final_norm)?;
        g.sync()?;
        Ok(CudaModel {
            gpu: gpu.clone(),
            embed,
            lm_head,
            final_norm,
            eps: w.eps,
            layers,
            hid: c.hidden_size,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            max_pos: c.max_position_embeddings,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn hidden_size(&self) -> usize {
        self.hid
    }

    fn head(&self) -> &Dev<u16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match &l.mixer {
                Mixer::Gdn(m) => LayerState::Gdn {
                    conv: g.zeros((m.kernel - 1) * m.cd)?,
                    ssm: g.zeros(m.d.hv * m.d.dk * m.d.dv)?,
                },
                Mixer::Attn(m) => LayerState::Attn {
                    k: g.zeros(1)?,
                    v: g.zeros(1)?,
                    cap: 0,
                    row: m.a.kv_heads * m.a.head_dim,
                },
            });
        }
        Ok(CudaState { pos: 0, layers })
    }

    /// `n` independent device-side copies of `st` (the KV caches copied up to the position).
    pub fn fork(&self, st: &CudaState, n: usize) -> Result<Vec<CudaState>, CudaError> {
        (0..n).map(|_| self.copy_state(st)).collect()
    }

    /// A deep device-side copy (snapshot); restore by using the copy in place of the original.
    pub fn copy_state(&self, st: &CudaState) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let mut layers = Vec::with_capacity(st.layers.len());
        for l in &st.layers {
            layers.push(match l {
                LayerState::Gdn { conv, ssm } => {
                    let mut c2 = g.alloc(conv.len())?;
                    g.copy(conv, 0, &mut c2, 0, conv.len())?;
                    let mut s2 = g.alloc(ssm.len())?;
                    g.copy(ssm, 0, &mut s2, 0, ssm.len())?;
                    LayerState::Gdn { conv: c2, ssm: s2 }
                }
                LayerState::Attn { k, v, cap, row } => {
                    let used = st.pos * row;
                    let mut k2 = g.alloc(cap * row)?;
                    let mut v2 = g.alloc(cap * row)?;
                    g.copy(k, 0, &mut k2, 0, used)?;
                    g.copy(v, 0, &mut v2, 0, used)?;
                    LayerState::Attn {
                        k: k2,
                        v: v2,
                        cap: *cap,
                        row: *row,
                    }
                }
            });
        }
        Ok(CudaState {
            pos: st.pos,
            layers,
        })
    }

    fn reserve(&self, st: &mut CudaState, need: usize) -> Result<(), CudaError> {
        let g = &*self.gpu;
        let pos = st.pos;
        for l in st.layers.iter_mut() {
            if let LayerState::Attn { k, v, cap, row } = l {
                if need > *cap {
                    let ncap = need.next_multiple_of(256).max(*cap * 2);
                    let mut k2 = g.alloc(ncap * *row)?;
                    let mut v2 = g.alloc(ncap * *row)?;
                    g.copy(k, 0, &mut k2, 0, pos * *row)?;
                    g.copy(v, 0, &mut v2, 0, pos * *row)?;
                    *k = k2;
                    *v = v2;
                    *cap = ncap;
                }
            }
        }
        Ok(())
    }

    fn check_input(&self, st: &CudaState, ids: &[u32]) -> Result<(), CudaError> {
        let bad = |m: String| CudaError::Model(ModelError::Input(m));
        if ids.is_empty() {
            return Err(bad("empty token sequence".into()));
        }
        if let Some(b) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(bad(format!(
                "token id {b} is outside the vocabulary (0..{})",
                self.vocab
            )));
        }
        if st.pos + ids.len() > self.max_pos {
            return Err(bad(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                st.pos + ids.len(),
                self.max_pos
            )));
        }
        if st.layers.len() != self.layers.len() {
            return Err(bad("sequence state belongs to another model".into()));
        }
        Ok(())
    }

    /// Runs `ids` through the model, continuing `state`. → hidden [T, H] on the device
    pub fn forward(&self, state: &mut CudaState, ids: &[u32]) -> Result<CudaHidden, CudaError> {
        self.forward_batch(&mut [(state, ids)])
    }

    /// Runs several sequences at once (the projections see all tokens stacked, the mixers walk each
    /// segment with its own state). → hidden [ΣT, H] on the device, sequences in order.
    pub fn forward_batch(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
    ) -> Result<CudaHidden, CudaError> {
        let g = &*self.gpu;
        let (hid, inter) = (self.hid, self.inter);
        let nseg = items.len();
        // ints: ids [N] | segs [S, 3] | tok [N, 2]
        let mut ids = Vec::new();
        let mut segs = Vec::with_capacity(nseg * 3);
        let mut tok = Vec::new();
        for (si, (st, seq)) in items.iter_mut().enumerate() {
            self.check_input(st, seq)?;
            self.reserve(st, st.pos + seq.len())?;
            segs.extend([ids.len() as i32, seq.len() as i32, st.pos as i32]);
            for (i, &id) in seq.iter().enumerate() {
                tok.extend([si as i32, (st.pos + i) as i32]);
                ids.push(id as i32);
            }
        }
        let n = ids.len();
        if n == 0 {
            return Err(CudaError::Model(ModelError::Input("empty batch".into())));
        }
        let all_single = items.iter().all(|(_, s)| s.len() == 1);
        let mut ints = ids;
        ints.extend(&segs);
        ints.extend(&tok);
        let ints_d = g.upload(&ints)?;
        let ints_p = g.ptr(&ints_d);
        let (ids_p, segs_p, tok_p) = (
            ints_p,
            ints_p + 4 * n as u64,
            ints_p + 4 * (n + 3 * nseg) as u64,
        );
        // Per layer: state addresses of every segment. GDN: conv [S] | ssm [S]; attention: [S, 2] (k, v).
        let mut ptrs: Vec<u64> = Vec::with_capacity(self.layers.len() * 2 * nseg);
        for li in 0..self.layers.len() {
            for (st, _) in items.iter() {
                if let LayerState::Gdn { conv, .. } = &st.layers[li] {
                    ptrs.push(g.ptr(conv));
                }
            }
            for (st, _) in items.iter() {
                match &st.layers[li] {
                    LayerState::Gdn { ssm, .. } => ptrs.push(g.ptr(ssm)),
                    LayerState::Attn { k, v, .. } => ptrs.extend([g.ptr(k), g.ptr(v)]),
                }
            }
        }
        let ptrs_d = g.upload(&ptrs)?;
        let ptrs_p = g.ptr(&ptrs_d);
        // Scratch sized for the widest layer.
        let (mut proj_w, mut mid_w, mut bf_w, mut q_w, mut gates_w) =
            (2 * inter, 0usize, hid.max(inter), 0usize, 0usize);
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(m) => {
                    proj_w = proj_w.max(m.proj_width());
                    mid_w = mid_w.max(m.cd + m.d.hv * m.d.dv);
                    bf_w = bf_w.max(m.d.hv * m.d.dv);
                    gates_w = gates_w.max(2 * m.d.hv);
                }
                Mixer::Attn(m) => {
                    proj_w = proj_w.max(m.proj_width());
                    bf_w = bf_w.max(m.a.heads * m.a.head_dim);
                    q_w = q_w.max(m.a.heads * m.a.head_dim);
                }
            }
        }
        let x: CudaSlice<f32> = g.alloc(n * hid)?;
        let hb: CudaSlice<u16> = g.alloc(n * bf_w)?;
        let proj: CudaSlice<f32> = g.alloc(n * proj_w)?;
        let mid: CudaSlice<f32> = g.alloc(n * mid_w.max(q_w))?;
        let gates: CudaSlice<f32> = g.alloc(n * gates_w.max(1))?;
        let (xp, hbp, pp, midp, gp) = (
            g.ptr(&x),
            g.ptr(&hb),
            g.ptr(&proj),
            g.ptr(&mid),
            g.ptr(&gates),
        );
        ops::embed_gather(g, self.embed.ptr, ids_p, xp, n, hid)?;
        let mut poff = 0usize;
        for l in &self.layers {
            ops::rms_norm(
                g,
                xp,
                hid,
                l.in_norm.ptr,
                self.eps,
                n,
                hid,
                Out::Bf16(hbp),
                hid,
            )?;
            match &l.mixer {
                Mixer::Gdn(m) => {
                    let d = m.d;
                    let pw = m.proj_width();
                    let conv_p = ptrs_p + 8 * poff as u64;
                    let ssm_p = conv_p + 8 * nseg as u64;
                    poff += 2 * nseg;
                    g.gemm_bf16(hbp, n, hid, m.w_in.ptr, pw, pp, pw, 0.0)?;
                    // mid: conv output [N, cd] then core [N, HV*DV]
                    let core_p = midp + 4 * (n * m.cd) as u64;
                    ops::conv1d_silu(
                        g, pp, pw, midp, m.conv.ptr, m.kernel, m.cd, segs_p, conv_p, nseg,
                    )?;
                    ops::qk_l2norm(g, midp, n, m.cd, d.hk, d.dk, 1.0 / (d.dk as f32).sqrt())?;
                    let beta_p = gp + 4 * (n * d.hv) as u64;
                    let z_off = m.cd;
                    let a_off = m.cd + d.hv * d.dv;
                    ops::gdn_gates(
                        g,
                        pp,
                        pw,
                        a_off,
                        a_off + d.hv,
                        m.neg_a.ptr,
                        m.dt_bias.ptr,
                        d.hv,
                        n,
                        gp,
                        beta_p,
                    )?;
                    if all_single {
                        ops::gdn_step(g, midp, m.cd, gp, beta_p, core_p, segs_p, ssm_p, nseg, d)?;
                    } else {
                        ops::gdn_chunked(
                            g, midp, m.cd, gp, beta_p, core_p, segs_p, ssm_p, nseg, d, CHUNK,
                        )?;
                    }
                    ops::rms_norm_gated(
                        g,
                        core_p,
                        pp + 4 * z_off as u64,
                        pw,
                        m.norm.ptr,
                        m.eps,
                        n,
                        d.hv,
                        d.dv,
                        hbp,
                    )?;
                    g.gemm_bf16(hbp, n, d.hv * d.dv, m.w_out.ptr, hid, xp, hid, 1.0)?;
                }
                Mixer::Attn(m) => {
                    let a = m.a;
                    let pw = m.proj_width();
                    let kv_p = ptrs_p + 8 * poff as u64;
                    poff += 2 * nseg;
                    g.gemm_bf16(hbp, n, hid, m.w_in.ptr, pw, pp, pw, 0.0)?;
                    ops::attn_prep(
                        g,
                        pp,
                        pw,
                        m.q_norm.ptr,
                        m.k_norm.ptr,
                        m.eps,
                        m.inv_freq.ptr,
                        a,
                        n,
                        tok_p,
                        kv_p,
                        midp,
                    )?;
                    let scale = 1.0 / (a.head_dim as f32).sqrt();
                    ops::attention(g, midp, pp, pw, tok_p, kv_p, n, a, scale, hbp)?;
                    g.gemm_bf16(hbp, n, a.heads * a.head_dim, m.w_o.ptr, hid, xp, hid, 1.0)?;
                }
            }
            ops::rms_norm(
                g,
                xp,
                hid,
                l.post_norm.ptr,
                self.eps,
                n,
                hid,
                Out::Bf16(hbp),
                hid,
            )?;
            g.gemm_bf16(hbp, n, hid, l.w_gu.ptr, 2 * inter, pp, 2 * inter, 0.0)?;
            ops::swiglu(g, pp, inter, n, hbp)?;
            g.gemm_bf16(hbp, n, inter, l.w_down.ptr, hid, xp, hid, 1.0)?;
        }
        let out: CudaSlice<f32> = g.alloc(n * hid)?;
        ops::rms_norm(
            g,
            xp,
            hid,
            self.final_norm.ptr,
            self.eps,
            n,
            hid,
            Out::F32(g.ptr(&out)),
            hid,
        )?;
        for (st, seq) in items.iter_mut() {
            st.pos += seq.len();
        }
        // The scratch buffers are freed in stream order when they drop here.
        Ok(CudaHidden {
            buf: out,
            rows: n,
            hid,
        })
    }

    /// Label-row readout: `out[i] = hidden[picks[i].0] · lm_head[picks[i].1]`.
    pub fn logits_rows(
        &self,
        h: &CudaHidden,
        picks: &[(usize, u32)],
    ) -> Result<Vec<f32>, CudaError> {
        let g = &*self.gpu;
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        let mut pairs = Vec::with_capacity(2 * picks.len());
        for &(r, v) in picks {
            if r >= h.rows || v as usize >= self.vocab {
                return Err(CudaError::Model(ModelError::Input(format!(
                    "readout of row {r} (of {}), vocabulary row {v} (of {})",
                    h.rows, self.vocab
                ))));
            }
            pairs.extend([r as i32, v as i32]);
        }
        let pd = g.upload(&pairs)?;
        let out: CudaSlice<f32> = g.alloc(picks.len())?;
        ops::rows_dot(
            g,
            g.ptr(&h.buf),
            h.hid,
            g.ptr(&pd),
            picks.len(),
            self.head().ptr,
            g.ptr(&out),
        )?;
        g.download(&out, picks.len())
    }

    /// Full-vocabulary logits of every hidden row (bf16 GEMM; for tests and `onepass logits`). → [N, V]
    pub fn logits(&self, h: &CudaHidden) -> Result<Vec<f32>, CudaError> {
        let g = &*self.gpu;
        let hb: CudaSlice<u16> = g.alloc(h.rows * h.hid)?;
        ops::to_bf16(g, g.ptr(&h.buf), g.ptr(&hb), h.rows * h.hid)?;
        let out: CudaSlice<f32> = g.alloc(h.rows * self.vocab)?;
        g.gemm_bf16(
            g.ptr(&hb),
            h.rows,
            h.hid,
            self.head().ptr,
            self.vocab,
            g.ptr(&out),
            self.vocab,
            0.0,
        )?;
        g.download(&out, h.rows * self.vocab)
    }
}

impl CudaHidden {
    /// Copies the rows to the host. → [N, H]
    pub fn to_host(&self, g: &Gpu) -> Result<Vec<f32>, CudaError> {
        g.download(&self.buf, self.rows * self.hid)
    }
}

//! Gated softmax attention (Qwen3.5 `self_attn`).
//!
//! ```text
//! q, gate = split_per_head(q_proj(x))        (each head: D query dims, then D gate dims)
//! q = rope(q_norm(q)); k = rope(k_norm(k_proj(x))); v = v_proj(x)   (partial rotary: first R dims)
//! o = softmax(q kᵀ / sqrt(D), causal) v      (grouped KV heads)
//! out = o_proj(o * sigmoid(gate))
//! ```

use onepass_kernels::{apply_rope, causal_attention, rope_tables, times_sigmoid, AttnShape};
use onepass_tensor::Tensor;

use super::norm::RmsNorm;
use std::sync::Arc;

use super::{linear, linears, rotated, site, Seg};
use crate::config::TextConfig;
use crate::state::{KvCache, LayerState};
use crate::weights::Binder;
use crate::ModelError;

pub struct Attention {
    /// q_proj: [H*2D, hidden]; k_proj, v_proj: [HKV*D, hidden]; o_proj: [hidden, H*D]
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) o: Tensor,
    pub(crate) q_norm: RmsNorm,
    pub(crate) k_norm: RmsNorm,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) d: usize,
    /// inv_freq: [R/2]
    pub(crate) inv_freq: Vec<f32>,
    /// Hadamard sites of a rotated pack: the normed input (q, k, v) and the gated output (o). `None`: not rotated.
    pub(crate) rot_in: Option<Arc<[f32]>>,
    pub(crate) rot_out: Option<Arc<[f32]>>,
}

impl Attention {
    pub fn load(vb: &Binder, c: &TextConfig) -> Result<Self, ModelError> {
        let (hid, h, kvh, d) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let rot = c.rotary_dim();
        let inv_freq = (0..rot / 2)
            .map(|i| (1.0 / c.rope_theta.powf((2 * i) as f64 / rot as f64)) as f32)
            .collect();
        Ok(Attention {
            rot_in: site(vb, &["q_proj.weight", "k_proj.weight", "v_proj.weight"])?,
            rot_out: site(vb, &["o_proj.weight"])?,
            q: vb.get("q_proj.weight", &[h * 2 * d, hid])?,
            k: vb.get("k_proj.weight", &[kvh * d, hid])?,
            v: vb.get("v_proj.weight", &[kvh * d, hid])?,
            o: vb.get("o_proj.weight", &[hid, h * d])?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), d, c.rms_norm_eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), d, c.rms_norm_eps)?,
            heads: h,
            kv_heads: kvh,
            d,
            inv_freq,
        })
    }

    pub fn new_state(&self) -> LayerState {
        LayerState::Attention(KvCache::default())
    }

    pub fn tensors(&self) -> [&Tensor; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }

    /// The q|gate, k and v projections of the normed rows x: [N, hidden].
    pub fn project(&self, x: &[f32], n: usize) -> AttnScratch {
        let x = rotated(x, &self.rot_in);
        let [qg, k, v] = linears(&x, n, [&self.q, &self.k, &self.v]);
        AttnScratch {
            qg,
            q: Vec::new(),
            gate: Vec::new(),
            k,
            v,
            past: Vec::new(),
            o: Vec::new(),
        }
    }

    /// q and gate split per head, the q/k norms, RoPE at each segment's positions, and each segment's k, v
    /// appended to its KV cache.
    pub fn prep(&self, s: &mut AttnScratch, segs: &[Seg], states: &mut [&mut LayerState]) {
        let (h, kvh, d) = (self.heads, self.kv_heads, self.d);
        // De-interleave per head: q [N, H, D], gate [N, H*D] (half of q|gate each).
        let mut q = vec![0.0; s.qg.len() / 2];
        let mut gate = vec![0.0; s.qg.len() / 2];
        for (i, row) in s.qg.chunks_exact(2 * d).enumerate() {
            q[i * d..(i + 1) * d].copy_from_slice(&row[..d]);
            gate[i * d..(i + 1) * d].copy_from_slice(&row[d..]);
        }
        s.qg = Vec::new();
        self.q_norm.forward_inplace(&mut q);
        self.k_norm.forward_inplace(&mut s.k);
        s.past.clear();
        for (seg, st) in segs.iter().zip(states.iter_mut()) {
            let cache = kv_cache(st);
            let t = seg.len;
            let (r0, r1) = (seg.start, seg.start + t);
            let (cos, sin) = rope_tables(seg.pos, t, &self.inv_freq);
            let qs = &mut q[r0 * h * d..r1 * h * d];
            apply_rope(qs, t, h, d, &cos, &sin);
            let ks = &mut s.k[r0 * kvh * d..r1 * kvh * d];
            apply_rope(ks, t, kvh, d, &cos, &sin);
            s.past.push(cache.k.len() / (kvh * d));
            cache.k.extend_from_slice(ks);
            cache.v.extend_from_slice(&s.v[r0 * kvh * d..r1 * kvh * d]);
        }
        s.q = q;
        s.gate = gate;
    }

    /// Causal attention of each segment over its cache, gated by `sigmoid(gate)`.
    pub fn attend(&self, s: &mut AttnScratch, segs: &[Seg], states: &mut [&mut LayerState]) {
        let (h, kvh, d) = (self.heads, self.kv_heads, self.d);
        // [N, H*D], as q.
        let mut o = vec![0.0; s.q.len()];
        let scale = 1.0 / (d as f32).sqrt();
        for ((seg, st), &past) in segs.iter().zip(states.iter_mut()).zip(&s.past) {
            let cache = kv_cache(st);
            let t = seg.len;
            let (r0, r1) = (seg.start, seg.start + t);
            let sh = AttnShape {
                t,
                past,
                heads: h,
                kv_heads: kvh,
                head_dim: d,
            };
            causal_attention(
                sh,
                &s.q[r0 * h * d..r1 * h * d],
                &cache.k,
                &cache.v,
                scale,
                &mut o[r0 * h * d..r1 * h * d],
            );
        }
        times_sigmoid(&mut o, &s.gate);
        s.o = o;
    }

    /// `o_proj` of the gated attention output. → [N, hidden]
    pub fn project_out(&self, s: &AttnScratch, n: usize) -> Vec<f32> {
        linear(&rotated(&s.o, &self.rot_out), n, &self.o)
    }
}

/// An attention layer's activations between its ops.
pub struct AttnScratch {
    /// [N, H*2D] until [`Attention::prep`] splits it into q [N, H, D] and gate [N, H*D]
    qg: Vec<f32>,
    q: Vec<f32>,
    gate: Vec<f32>,
    /// [N, HKV*D] each
    k: Vec<f32>,
    v: Vec<f32>,
    /// Each segment's cached positions before this forward.
    past: Vec<usize>,
    /// [N, H*D]
    o: Vec<f32>,
}

fn kv_cache<'a>(st: &'a mut &mut LayerState) -> &'a mut KvCache {
    let LayerState::Attention(cache) = &mut **st else {
        unreachable!("an attention layer always holds a KV cache")
    };
    cache
}

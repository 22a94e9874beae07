//! Read-only access to a loaded model's tensors by role, for other backends (the CUDA crate uploads
//! them). The CPU forward does not use this; it exists so that no other crate needs the blocks'
//! private fields. Norm gains are the effective multipliers (`1 + w` already folded for the
//! zero-centred RMSNorms; the Gated DeltaNet norm weight as stored).

use onepass_tensor::Tensor;

use crate::qwen3_5::{Mixer, Model};

/// Every tensor of the model, by role.
pub struct WeightsView<'a> {
    /// embed: [V, H]
    pub embed: &'a Tensor,
    /// lm_head: [V, H] (the embedding when tied)
    pub lm_head: &'a Tensor,
    /// final norm gain: [H]
    pub final_norm: &'a [f32],
    pub eps: f32,
    pub layers: Vec<LayerView<'a>>,
}

/// One decoder layer.
pub struct LayerView<'a> {
    /// gains: [H]
    pub input_norm: &'a [f32],
    pub post_norm: &'a [f32],
    pub mixer: MixerView<'a>,
    /// gate, up: [I, H]; down: [H, I]
    pub mlp_gate: &'a Tensor,
    pub mlp_up: &'a Tensor,
    pub mlp_down: &'a Tensor,
}

/// The token mixer of a layer.
pub enum MixerView<'a> {
    GatedDeltaNet(GdnView<'a>),
    Attention(AttnView<'a>),
}

/// Gated DeltaNet weights.
pub struct GdnView<'a> {
    /// in_proj_qkv: [2*HK*DK + HV*DV, H]; in_proj_z: [HV*DV, H]; in_proj_a/b: [HV, H]
    pub in_qkv: &'a Tensor,
    pub in_z: &'a Tensor,
    pub in_a: &'a Tensor,
    pub in_b: &'a Tensor,
    /// out_proj: [H, HV*DV]
    pub out: &'a Tensor,
    /// conv: [conv_dim, K]
    pub conv: &'a [f32],
    /// -exp(A_log): [HV]
    pub neg_a: &'a [f32],
    /// dt_bias: [HV]
    pub dt_bias: &'a [f32],
    /// gated norm weight: [DV] (as stored, not 1 + w)
    pub norm: &'a [f32],
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
    pub eps: f32,
}

/// Gated attention weights.
pub struct AttnView<'a> {
    /// q_proj: [H*2D, hidden] (per head D query rows then D gate rows); k_proj, v_proj: [HKV*D, hidden]
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// o_proj: [hidden, H*D]
    pub o: &'a Tensor,
    /// q_norm, k_norm gains: [D] (1 + w folded)
    pub q_norm: &'a [f32],
    pub k_norm: &'a [f32],
    pub eps: f32,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// inv_freq: [R/2]
    pub inv_freq: &'a [f32],
}

impl Model {
    /// The model's tensors by role (read-only).
    pub fn weights(&self) -> WeightsView<'_> {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerView {
                input_norm: &l.input_norm.gain,
                post_norm: &l.post_norm.gain,
                mixer: match &l.mixer {
                    Mixer::GatedDeltaNet(m) => MixerView::GatedDeltaNet(GdnView {
                        in_qkv: &m.in_qkv,
                        in_z: &m.in_z,
                        in_a: &m.in_a,
                        in_b: &m.in_b,
                        out: &m.out,
                        conv: &m.conv,
                        neg_a: &m.neg_a,
                        dt_bias: &m.dt_bias,
                        norm: &m.norm,
                        hk: m.hk,
                        hv: m.hv,
                        dk: m.dk,
                        dv: m.dv,
                        kernel: m.kernel,
                        eps: m.eps,
                    }),
                    Mixer::Attention(m) => MixerView::Attention(AttnView {
                        q: &m.q,
                        k: &m.k,
                        v: &m.v,
                        o: &m.o,
                        q_norm: &m.q_norm.gain,
                        k_norm: &m.k_norm.gain,
                        eps: m.q_norm.eps,
                        heads: m.heads,
                        kv_heads: m.kv_heads,
                        head_dim: m.d,
                        inv_freq: &m.inv_freq,
                    }),
                },
                mlp_gate: &l.mlp.gate,
                mlp_up: &l.mlp.up,
                mlp_down: &l.mlp.down,
            })
            .collect();
        WeightsView {
            embed: &self.embed,
            lm_head: &self.lm_head,
            final_norm: &self.norm.gain,
            eps: self.norm.eps,
            layers,
        }
    }
}

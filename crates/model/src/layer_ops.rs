//! The Qwen3.5 layer sequence, written once over an op set.
//!
//! [`run_layers`] is the only place that knows what a decoder layer does and in which order; a backend
//! implements [`LayerOps`] (the CPU in [`crate::qwen3_5`], the GPU in `onepass-cuda` as launches into its stream
//! and CUDA graphs) and holds everything the sequence does not name: where the activations live, their
//! precision, which kernel runs the gated delta rule for the batch at hand, how a residual update is deferred
//! into the next norm. The final norm and the readout stay outside, so a backend can capture the layers alone.
//!
//! ```text
//! embed
//! for each layer:
//!     norm(Input)              (adds the last residual update first when the backend deferred it)
//!     Gated DeltaNet:  project_in(GdnIn); gdn_prep; gated_delta; gated_norm; project_residual(GdnOut)
//!     Attention:       project_in(AttnIn); attn_prep; attention; project_residual(AttnOut)
//!     norm(Post); project_in(MlpIn); swiglu; project_residual(MlpOut)
//! ```
//!
//! The same vocabulary names the weights: a backend that keeps its own copy asks the model for each layer's
//! [`Projection`]s and [`Param`]s (`Model::linear`, `Model::param`) instead of reading the blocks.

use crate::config::LayerKind;

/// Which of a layer's two RMSNorms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormSite {
    /// `input_layernorm`, before the token mixer.
    Input,
    /// `post_attention_layernorm`, before the MLP.
    Post,
}

/// A layer's projections: three read the normed residual (`*In`), three add into the residual (`*Out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    /// Gated DeltaNet `in_proj_qkv | in_proj_z | in_proj_a | in_proj_b`.
    GdnIn,
    /// Gated DeltaNet `out_proj`.
    GdnOut,
    /// Attention `q_proj | k_proj | v_proj`.
    AttnIn,
    /// Attention `o_proj`.
    AttnOut,
    /// MLP `gate_proj | up_proj`.
    MlpIn,
    /// MLP `down_proj`.
    MlpOut,
}

impl Projection {
    /// Every projection, in the order a layer runs them.
    pub const ALL: [Projection; 6] = [
        Projection::GdnIn,
        Projection::GdnOut,
        Projection::AttnIn,
        Projection::AttnOut,
        Projection::MlpIn,
        Projection::MlpOut,
    ];

    /// Its short name (`gdn_in`, …), as flags and messages spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Projection::GdnIn => "gdn_in",
            Projection::GdnOut => "gdn_out",
            Projection::AttnIn => "attn_in",
            Projection::AttnOut => "attn_out",
            Projection::MlpIn => "mlp_in",
            Projection::MlpOut => "mlp_out",
        }
    }

    /// Whether it reads the normed residual ([`LayerOps::project_in`]) rather than adding into the residual
    /// ([`LayerOps::project_residual`]).
    pub const fn is_input(self) -> bool {
        matches!(
            self,
            Projection::GdnIn | Projection::AttnIn | Projection::MlpIn
        )
    }
}

/// A layer's small f32 parameters, named by the op that reads them and held as that op applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// [`LayerOps::norm`]: the RMSNorm gain at a site, `1 + weight`. [H]
    NormGain(NormSite),
    /// [`LayerOps::gdn_prep`]: the depthwise conv taps, `conv1d.weight`. [conv_dim, K]
    ConvTaps,
    /// [`LayerOps::gdn_prep`]: `-exp(A_log)`, the decay rate of the gate g. [HV]
    NegDecay,
    /// [`LayerOps::gdn_prep`]: `dt_bias`, added to `a` before the softplus of g. [HV]
    DtBias,
    /// [`LayerOps::gated_norm`]: the weight of the gated RMSNorm, as stored (not `1 + w`). [DV]
    GatedNormWeight,
    /// [`LayerOps::attn_prep`]: the q and k RMSNorm gains, `1 + weight`. [D]
    QNormGain,
    KNormGain,
    /// [`LayerOps::attn_prep`]: the RoPE inverse frequencies of the rotary dims R. [R/2]
    RopeInvFreq,
}

/// The ops of one forward over a batch, each on layer `layer` (an index into the model's layers). A backend
/// binds the batch (its tokens, segments and states) when it builds the value that implements this.
pub trait LayerOps {
    type Error;
    /// `x = embed_tokens[ids]`.
    fn embed(&mut self) -> Result<(), Self::Error>;
    /// The RMSNorm of the residual `x` at `site`, into the input of the next projection; a residual update the
    /// backend deferred ([`LayerOps::project_residual`]) is added to `x` first (fused residual + norm).
    fn norm(&mut self, layer: usize, site: NormSite) -> Result<(), Self::Error>;
    /// An input projection (`GdnIn`, `AttnIn`, `MlpIn`) of the normed residual.
    fn project_in(&mut self, layer: usize, proj: Projection) -> Result<(), Self::Error>;
    /// Gated DeltaNet: the causal depthwise conv + SiLU (continuing each segment's conv history), the split into
    /// q, k, v with q and k L2-normed (q scaled by 1/√DK), and the gates g and β.
    fn gdn_prep(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// Gated DeltaNet: the gated delta rule over each segment's recurrent state (chunked for a prefill, one step
    /// for a single token, or a tree of segments continuing their roots; the backend picks from the batch).
    fn gated_delta(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// Gated DeltaNet: `rmsnorm(o) · weight · silu(z)` per value head, the input of `out_proj`.
    fn gated_norm(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// Attention: q and gate split per head, q/k norms, RoPE, and k, v appended to each segment's KV cache.
    fn attn_prep(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// Attention: causal softmax attention over each segment's cache, gated by `sigmoid(gate)`.
    fn attention(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// MLP: `silu(gate) · up`, the input of `down_proj`.
    fn swiglu(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// An output projection (`GdnOut`, `AttnOut`, `MlpOut`) added into the residual `x` (now, or deferred into
    /// the next [`LayerOps::norm`]).
    fn project_residual(&mut self, layer: usize, proj: Projection) -> Result<(), Self::Error>;
}

/// Every decoder layer of one forward, in order (`kinds`: each layer's token mixer, from `layer_types`).
pub fn run_layers<O: LayerOps>(kinds: &[LayerKind], ops: &mut O) -> Result<(), O::Error> {
    ops.embed()?;
    for (l, kind) in kinds.iter().enumerate() {
        ops.norm(l, NormSite::Input)?;
        match kind {
            LayerKind::GatedDeltaNet => {
                ops.project_in(l, Projection::GdnIn)?;
                ops.gdn_prep(l)?;
                ops.gated_delta(l)?;
                ops.gated_norm(l)?;
                ops.project_residual(l, Projection::GdnOut)?;
            }
            LayerKind::Attention => {
                ops.project_in(l, Projection::AttnIn)?;
                ops.attn_prep(l)?;
                ops.attention(l)?;
                ops.project_residual(l, Projection::AttnOut)?;
            }
        }
        ops.norm(l, NormSite::Post)?;
        ops.project_in(l, Projection::MlpIn)?;
        ops.swiglu(l)?;
        ops.project_residual(l, Projection::MlpOut)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the calls, to hold the sequence against the architecture written out by hand.
    #[derive(Default)]
    struct Trace(Vec<String>);

    /// The ops that take only the layer, each recorded as "{layer} {op}".
    macro_rules! one_layer_ops {
        ($($op:ident),*) => {
            $(
                fn $op(&mut self, l: usize) -> Result<(), ()> {
                    self.0.push(format!("{l} {}", stringify!($op)));
                    Ok(())
                }
            )*
        };
    }

    impl LayerOps for Trace {
        type Error = ();
        fn embed(&mut self) -> Result<(), ()> {
            self.0.push("embed".into());
            Ok(())
        }
        fn norm(&mut self, l: usize, site: NormSite) -> Result<(), ()> {
            self.0.push(format!("{l} norm {site:?}"));
            Ok(())
        }
        fn project_in(&mut self, l: usize, p: Projection) -> Result<(), ()> {
            self.0.push(format!("{l} {p:?}"));
            Ok(())
        }
        one_layer_ops!(
            gdn_prep,
            gated_delta,
            gated_norm,
            attn_prep,
            attention,
            swiglu
        );
        fn project_residual(&mut self, l: usize, p: Projection) -> Result<(), ()> {
            self.0.push(format!("{l} {p:?}"));
            Ok(())
        }
    }

    #[test]
    fn a_hybrid_stack_runs_each_layer_in_architecture_order() {
        let mut t = Trace::default();
        let kinds = [LayerKind::GatedDeltaNet, LayerKind::Attention];
        assert_eq!(run_layers(&kinds, &mut t), Ok(()));
        let want = [
            "embed",
            "0 norm Input",
            "0 GdnIn",
            "0 gdn_prep",
            "0 gated_delta",
            "0 gated_norm",
            "0 GdnOut",
            "0 norm Post",
            "0 MlpIn",
            "0 swiglu",
            "0 MlpOut",
            "1 norm Input",
            "1 AttnIn",
            "1 attn_prep",
            "1 attention",
            "1 AttnOut",
            "1 norm Post",
            "1 MlpIn",
            "1 swiglu",
            "1 MlpOut",
        ];
        assert_eq!(t.0, want);
    }
}

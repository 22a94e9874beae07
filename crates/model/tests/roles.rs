//! The weights by role (`Model::linear`, `Model::param`, the model-level getters) are the checkpoint's tensors under
//! their Hugging Face names, stacked in the documented order, with the parameters in the form their op applies;
//! asking a layer for a role of the other kind is an error that names the layer and the role.

mod common;

use onepass_formats::Checkpoint;
use onepass_model::layer_ops::{NormSite, Param, Projection};
use onepass_model::LayerKind;

/// The checkpoint tensor `name`, as f32.
fn stored(ck: &Checkpoint, name: &str) -> Vec<f32> {
    ck.get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_f32_vec()
}

fn plus_one(v: Vec<f32>) -> Vec<f32> {
    v.into_iter().map(|w| 1.0 + w).collect()
}

#[test]
fn every_role_is_the_checkpoint_tensor_it_names() {
    for preset in ["tiny-gva", "tiny-attn-first"] {
        let (dir, m) = common::load(preset);
        let ck = Checkpoint::open_dir(dir.path()).expect("checkpoint");
        let c = m.text_config().clone();
        assert_eq!(m.embedding().name(), "model.embed_tokens.weight");
        if c.tie_word_embeddings {
            assert_eq!(m.lm_head().to_f32_vec(), m.embedding().to_f32_vec());
        } else {
            assert_eq!(m.lm_head().name(), "lm_head.weight");
        }
        assert_eq!(
            m.final_norm_gain(),
            plus_one(stored(&ck, "model.norm.weight"))
        );
        for (l, kind) in c.layer_types.iter().enumerate() {
            let at = |rest: &str| format!("model.layers.{l}.{rest}");
            let names = |p: Projection| -> Vec<String> {
                let parts = m.linear(l, p).unwrap_or_else(|e| panic!("{l} {p:?}: {e}"));
                parts.iter().map(|t| t.name().to_string()).collect()
            };
            let (mixer, stacked) = match kind {
                LayerKind::GatedDeltaNet => (
                    "linear_attn",
                    [
                        (
                            Projection::GdnIn,
                            &["in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b"][..],
                        ),
                        (Projection::GdnOut, &["out_proj"][..]),
                    ],
                ),
                LayerKind::Attention => (
                    "self_attn",
                    [
                        (Projection::AttnIn, &["q_proj", "k_proj", "v_proj"][..]),
                        (Projection::AttnOut, &["o_proj"][..]),
                    ],
                ),
            };
            for (p, parts) in stacked {
                let want: Vec<String> = parts
                    .iter()
                    .map(|n| at(&format!("{mixer}.{n}.weight")))
                    .collect();
                assert_eq!(names(p), want, "{preset} layer {l} {p:?}");
            }
            assert_eq!(
                names(Projection::MlpIn),
                [at("mlp.gate_proj.weight"), at("mlp.up_proj.weight")]
            );
            assert_eq!(names(Projection::MlpOut), [at("mlp.down_proj.weight")]);
            let param = |p: Param| m.param(l, p).expect("param").to_vec();
            assert_eq!(
                param(Param::NormGain(NormSite::Input)),
                plus_one(stored(&ck, &at("input_layernorm.weight")))
            );
            assert_eq!(
                param(Param::NormGain(NormSite::Post)),
                plus_one(stored(&ck, &at("post_attention_layernorm.weight")))
            );
            match kind {
                LayerKind::GatedDeltaNet => {
                    let s = |n: &str| stored(&ck, &at(&format!("linear_attn.{n}")));
                    let neg_a: Vec<f32> = s("A_log").iter().map(|a| -a.exp()).collect();
                    assert_eq!(param(Param::ConvTaps), s("conv1d.weight"));
                    assert_eq!(param(Param::NegDecay), neg_a);
                    assert_eq!(param(Param::DtBias), s("dt_bias"));
                    assert_eq!(param(Param::GatedNormWeight), s("norm.weight"));
                }
                LayerKind::Attention => {
                    let s = |n: &str| stored(&ck, &at(&format!("self_attn.{n}")));
                    assert_eq!(param(Param::QNormGain), plus_one(s("q_norm.weight")));
                    assert_eq!(param(Param::KNormGain), plus_one(s("k_norm.weight")));
                    // RoPE over the first R = head_dim · partial_rotary_factor dims: R/2 frequencies θ^(-2i/R).
                    let r = c.rotary_dim();
                    let want: Vec<f32> = (0..r / 2)
                        .map(|i| (1.0 / c.rope_theta.powf((2 * i) as f64 / r as f64)) as f32)
                        .collect();
                    assert_eq!(param(Param::RopeInvFreq), want);
                }
            }
        }
    }
}

#[test]
fn a_role_the_layer_lacks_is_an_error_naming_it() {
    let (_d, m) = common::load("tiny-gva");
    // tiny-gva: three Gated DeltaNet layers, then attention.
    let e = m.linear(0, Projection::AttnIn).expect_err("gdn layer");
    assert_eq!(
        e.to_string(),
        "weights: layer 0 is a Gated DeltaNet layer: it has no attn_in"
    );
    let e = m.param(3, Param::DtBias).expect_err("attention layer");
    assert_eq!(
        e.to_string(),
        "weights: layer 3 is an attention layer: it has no DtBias"
    );
    let e = m.linear(4, Projection::MlpIn).expect_err("no layer 4");
    assert_eq!(e.to_string(), "weights: layer 4 is outside 0..4");
}

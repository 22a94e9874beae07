//! Qwen3.5 from an MLX folder: the affine 2-bit container of PrismML's ternary Bonsai packs (and of any MLX
//! 2-bit Qwen3.5 whose values are exactly ternary).
//!
//! A folder is MLX when its `config.json` has a `quantization` block. The packed linears are read by
//! [`onepass_formats::open_mlx_dir`] and become PQ2_0 tensors (exact: same codes, same scales, the bias
//! `−scale` folded into the code's `−1`), so the model runs on the ternary kernels with one binding, as a GGUF
//! pack does. What MLX's converters change is undone here:
//!
//! - `model_type: "prism_hadamard_qwen35"` (the marker that keeps stock loaders away from a rotated pack) is the
//!   composite Qwen3.5 form: the text model is `text_config`;
//! - tensor names: the text model's tensors may sit under `model.language_model.` (Hugging Face), under
//!   `language_model.model.` (mlx-vlm) or under `model.`, and the head under `lm_head.` or
//!   `language_model.lm_head.`; they are renamed to the prefix the configuration's form binds. The vision tower
//!   (`vision_tower.`, `multi_modal_projector.`, `model.visual.`) is skipped;
//! - the five zero-centred RMSNorm gains (`input_layernorm`, `post_attention_layernorm`, the final `norm`,
//!   `q_norm`, `k_norm`) are stored as `w + 1` (mlx-lm's sanitize adds 1): 1 is subtracted;
//!   `linear_attn.norm` is stored as is;
//! - `conv1d.weight` is MLX's `[channels, kernel, 1]`: read as `[channels, 1, kernel]` (the same order);
//! - value heads are in Hugging Face's grouped order already, and `A_log`, `dt_bias` are stored as they are.
//!
//! The rotation of a pack is `hadamard.json` beside `config.json`: the `prism.hadamard.*` keys of the GGUF
//! form (with or without that prefix), its names being the folder's tensor or module names. It is validated as
//! the GGUF keys are (docs/formats.md); a `prism_hadamard_qwen35` folder without it is refused.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use onepass_formats::hadamard::{
    split_signs, HADAMARD_AXIS, HADAMARD_BLOCK, HADAMARD_KEYS, HADAMARD_PREFIX, HADAMARD_TRANSFORM,
};
use onepass_formats::{open_mlx_dir, Checkpoint, MlxQuantization};
use onepass_tensor::Tensor;
use serde_json::Value;

use crate::config::{ModelConfig, ModelForm};
use crate::gguf::Rotations;
use crate::ModelError;

/// The top-level `model_type` of a PrismML pack.
pub const PRISM_MODEL_TYPE: &str = "prism_hadamard_qwen35";

/// An MLX folder read as a Qwen3.5 checkpoint under the model's names.
pub struct MlxModel {
    pub config: ModelConfig,
    pub checkpoint: Checkpoint,
    pub rotations: Option<Rotations>,
}

fn read_config(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether `dir` holds an MLX-quantized model (its `config.json` has a `quantization` block).
pub fn is_mlx_dir(dir: &Path) -> bool {
    read_config(dir).is_some_and(|v| v.get("quantization").is_some())
}

/// Reads an MLX folder.
pub fn read_mlx(dir: &Path) -> Result<MlxModel, ModelError> {
    let path = dir.join("config.json");
    let cfg_err = |m: String| ModelError::Config(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ModelError::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut v: Value =
        serde_json::from_str(&text).map_err(|e| cfg_err(format!("invalid JSON: {e}")))?;
    let q = MlxQuantization::from_config(&v)
        .map_err(cfg_err)?
        .ok_or_else(|| cfg_err("no \"quantization\" block (not an MLX-quantized folder)".into()))?;
    let prism = v.get("model_type").and_then(Value::as_str) == Some(PRISM_MODEL_TYPE);
    if prism {
        v["model_type"] = Value::String("qwen3_5".into());
    }
    let config = ModelConfig::from_json_str(&v.to_string()).map_err(|e| match e {
        ModelError::Config(m) => cfg_err(m),
        other => other,
    })?;
    let base = match config.form {
        ModelForm::Text => "model.",
        ModelForm::Composite => "model.language_model.",
    };
    let raw = open_mlx_dir(dir, q)?;
    let mut tensors = HashMap::new();
    for name in raw.names() {
        let Some(hf) = bound_name(name, base) else {
            continue;
        };
        let t = raw.get(name).expect("listed").renamed(&hf);
        let t = fix(&hf, t);
        if tensors.insert(hf.clone(), t).is_some() {
            return Err(ModelError::Weights(format!(
                "{}: two tensors are both {hf} (under two prefixes)",
                dir.display()
            )));
        }
    }
    let rotations = match std::fs::read_to_string(dir.join("hadamard.json")) {
        Ok(text) => Some(rotations(dir, &text, base, &tensors)?),
        Err(_) if prism => {
            return Err(cfg_err(format!(
                "model_type {PRISM_MODEL_TYPE:?} is a Hadamard-rotated pack, but the folder has no hadamard.json \
                 (its rotation); without it the weights would run as a different model"
            )))
        }
        Err(_) => None,
    };
    let checkpoint = Checkpoint::from_tensors(tensors, raw.files().to_vec(), raw.file_bytes());
    Ok(MlxModel {
        config,
        checkpoint,
        rotations,
    })
}

/// The name the model binds for a tensor of the folder (`None`: not part of the text model).
fn bound_name(name: &str, base: &str) -> Option<String> {
    const SKIPPED: [&str; 3] = ["vision_tower.", "multi_modal_projector.", "model.visual."];
    if SKIPPED.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    for head in ["language_model.lm_head.", "lm_head."] {
        if let Some(rest) = name.strip_prefix(head) {
            return Some(format!("lm_head.{rest}"));
        }
    }
    for prefix in ["model.language_model.", "language_model.model.", "model."] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return Some(format!("{base}{rest}"));
        }
    }
    // Anything else is left as it is, for the binder to report.
    Some(name.to_string())
}

/// Undoes MLX's storage conventions for one tensor (by its bound name).
fn fix(hf: &str, t: Tensor) -> Tensor {
    let plus_one = [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        ".self_attn.q_norm.weight",
        ".self_attn.k_norm.weight",
    ];
    let is_final_norm = hf == "model.norm.weight" || hf == "model.language_model.norm.weight";
    if is_final_norm || plus_one.iter().any(|s| hf.ends_with(s)) {
        let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x - 1.0).collect();
        return Tensor::from_f32(hf, t.shape().to_vec(), &v);
    }
    if hf.ends_with(".linear_attn.conv1d.weight") {
        if let [c, k, 1] = *t.shape() {
            return t.reshaped(vec![c, 1, k]);
        }
    }
    t
}

/// The validated `hadamard.json`: which bound tensors are folded, which stored rotated, with their signs.
fn rotations(
    dir: &Path,
    text: &str,
    base: &str,
    tensors: &HashMap<String, Tensor>,
) -> Result<Rotations, ModelError> {
    let path = dir.join("hadamard.json");
    let bad = |k: &str, why: String| ModelError::Config(format!("{}: {k}: {why}", path.display()));
    let v: Value =
        serde_json::from_str(text).map_err(|e| bad("(file)", format!("invalid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("(file)", "is not a JSON object".into()))?;
    let mut keys: HashMap<&str, &Value> = HashMap::new();
    for (k, val) in obj {
        let k = k.strip_prefix(HADAMARD_PREFIX).unwrap_or(k);
        if !HADAMARD_KEYS.contains(&k) {
            return Err(bad(k, "is not a key of rotation metadata version 1".into()));
        }
        keys.insert(k, val);
    }
    let get = |k: &str| {
        keys.get(k)
            .copied()
            .ok_or_else(|| bad(k, "is missing".into()))
    };
    let int = |k: &str| {
        get(k)?
            .as_u64()
            .ok_or_else(|| bad(k, "is not a non-negative integer".into()))
    };
    if int("version")? != 1 {
        return Err(bad("version", "onepass reads version 1".into()));
    }
    if int("block_size")? != HADAMARD_BLOCK as u64 {
        return Err(bad("block_size", format!("onepass reads {HADAMARD_BLOCK}")));
    }
    for (k, want) in [
        ("transform", HADAMARD_TRANSFORM),
        ("axis", HADAMARD_AXIS),
        ("sign_mode", "explicit"),
    ] {
        if get(k)?.as_str() != Some(want) {
            return Err(bad(k, format!("onepass reads {want:?}")));
        }
    }
    let widths: Vec<usize> = get("sign_widths")?
        .as_array()
        .and_then(|a| a.iter().map(|x| x.as_u64().map(|w| w as usize)).collect())
        .ok_or_else(|| bad("sign_widths", "is not an integer array".into()))?;
    let mut seen = BTreeSet::new();
    for &w in &widths {
        if w == 0 || !w.is_multiple_of(HADAMARD_BLOCK) || !seen.insert(w) {
            return Err(bad(
                "sign_widths",
                format!("width {w} is not a distinct positive multiple of {HADAMARD_BLOCK}"),
            ));
        }
    }
    let values: Vec<f64> = get("sign_values")?
        .as_array()
        .and_then(|a| a.iter().map(Value::as_f64).collect())
        .ok_or_else(|| bad("sign_values", "is not a number array".into()))?;
    let signs: HashMap<usize, Arc<[f32]>> = split_signs(&widths, &values)
        .map_err(|m| bad("sign_values", m))?
        .into_iter()
        .map(|(w, s)| (w, s.into()))
        .collect();
    match keys.get("gdn_v_grouped") {
        None | Some(Value::Bool(true)) => {}
        Some(other) => {
            return Err(bad(
                "gdn_v_grouped",
                format!("is {other}; an MLX pack's value heads are grouped (true or absent)"),
            ))
        }
    }
    let names = |k: &str| -> Result<HashMap<String, Arc<[f32]>>, ModelError> {
        let list = get(k)?
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad(k, "is not a string array".into()))?;
        let mut out = HashMap::new();
        for name in list {
            // A tensor name, or a module name (the tensor is its `.weight`).
            let found = [name.to_string(), format!("{name}.weight")]
                .iter()
                .filter_map(|n| bound_name(n, base))
                .find(|n| tensors.contains_key(n))
                .ok_or_else(|| {
                    bad(
                        k,
                        format!("names {name:?}, which is not a tensor of the folder"),
                    )
                })?;
            let width = tensors[&found].shape().last().copied().unwrap_or(0);
            let s = signs.get(&width).ok_or_else(|| {
                bad(
                    k,
                    format!("tensor {name:?} has input width {width}, which has no sign vector"),
                )
            })?;
            if out.insert(found, s.clone()).is_some() {
                return Err(bad(k, format!("names {name:?} twice")));
            }
        }
        Ok(out)
    };
    let folded = names("weight_names")?;
    let inverse = names("inverse_weight_names")?;
    if let Some(both) = folded.keys().find(|n| inverse.contains_key(*n)) {
        return Err(bad(
            "inverse_weight_names",
            format!("names {both:?}, which weight_names also names"),
        ));
    }
    Ok(Rotations { folded, inverse })
}

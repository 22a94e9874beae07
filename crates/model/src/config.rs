//! `config.json` of Qwen3.5-family checkpoints, as onepass needs it.
//!
//! Two forms are read: `model_type: "qwen3_5_text"` (`Qwen3_5ForCausalLM`, weights under
//! `model.`) and the composite `model_type: "qwen3_5"` (`Qwen3_5ForConditionalGeneration`, the text
//! model in `text_config`, weights under `model.language_model.`; the vision tower and the MTP head
//! are not used).

use std::path::Path;

use serde_json::Value;

use crate::ModelError;

/// The token mixer of one decoder layer, from `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`"linear_attention"`).
    GatedDeltaNet,
    /// Gated softmax attention (`"full_attention"`).
    Attention,
}

/// Which checkpoint layout the folder uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelForm {
    /// `qwen3_5_text`: weights `model.*` (+ `lm_head.weight` unless tied).
    Text,
    /// `qwen3_5`: weights `model.language_model.*` (+ `lm_head.weight` unless tied).
    Composite,
}

/// The text model's hyper-parameters.
#[derive(Debug, Clone)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub layer_types: Vec<LayerKind>,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    /// Multimodal RoPE sections; for text all position streams are equal, so they only have to be
    /// consistent with the rotary width.
    pub mrope_section: Option<Vec<usize>>,
    pub mrope_interleaved: bool,
}

/// The whole `config.json`.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub model_type: String,
    pub form: ModelForm,
    pub text: TextConfig,
}

impl TextConfig {
    /// Rotary dims per attention head (`head_dim * partial_rotary_factor`, even).
    pub fn rotary_dim(&self) -> usize {
        ((self.head_dim as f64 * self.partial_rotary_factor) as usize) & !1
    }
    /// `2 * key dim + value dim` of a GDN layer (the conv channels).
    pub fn gdn_conv_dim(&self) -> usize {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }
    pub fn count(&self, kind: LayerKind) -> usize {
        self.layer_types.iter().filter(|k| **k == kind).count()
    }
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ModelError::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_json_str(&text).map_err(|e| match e {
            ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// The configuration of a model path: `config.json` of a folder, or the metadata of a GGUF file (or of the
    /// one GGUF file a folder without safetensors weights holds).
    pub fn from_path(path: &Path) -> Result<Self, ModelError> {
        let files =
            onepass_formats::ModelFiles::locate(path).map_err(|e| ModelError::Io(e.to_string()))?;
        match &files.gguf {
            Some(g) => crate::gguf::config_from_gguf(&onepass_formats::Gguf::open(g)?),
            None => Self::from_dir(&files.dir),
        }
    }

    pub fn from_json_str(text: &str) -> Result<Self, ModelError> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("invalid JSON: {e}")))?;
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match model_type.as_str() {
            "qwen3_5_text" => Ok(ModelConfig { form: ModelForm::Text, text: parse_text(&v, None)?, model_type }),
            "qwen3_5" => {
                let tc = v
                    .get("text_config")
                    .filter(|t| t.is_object())
                    .ok_or_else(|| ModelError::Config("model_type qwen3_5 needs a \"text_config\" object".into()))?;
                // The composite model's own tie flag governs its lm_head.
                let tie = v.get("tie_word_embeddings").and_then(Value::as_bool);
                Ok(ModelConfig { form: ModelForm::Composite, text: parse_text(tc, tie)?, model_type })
            }
            "" => Err(ModelError::Config("no \"model_type\"".into())),
            other => Err(ModelError::Config(format!(
                "unsupported model_type {other:?}: onepass runs qwen3_5_text and qwen3_5 checkpoints"
            ))),
        }
    }
}

fn req_usize(v: &Value, key: &str) -> Result<usize, ModelError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| ModelError::Config(format!("missing or non-integer \"{key}\"")))
}

fn opt_usize(v: &Value, key: &str, default: usize) -> Result<usize, ModelError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| ModelError::Config(format!("\"{key}\" must be an integer"))),
    }
}

fn opt_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn parse_text(v: &Value, tie_override: Option<bool>) -> Result<TextConfig, ModelError> {
    let hidden_size = req_usize(v, "hidden_size")?;
    let num_hidden_layers = req_usize(v, "num_hidden_layers")?;
    let num_attention_heads = req_usize(v, "num_attention_heads")?;
    let head_dim = match v.get("head_dim") {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as usize,
        _ => hidden_size / num_attention_heads.max(1),
    };
    let layer_types = match v.get("layer_types") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(LayerKind::GatedDeltaNet),
                Some("full_attention") => Ok(LayerKind::Attention),
                _ => Err(ModelError::Config(format!(
                    "unknown layer type {t} in \"layer_types\""
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Null) | None => {
            let interval = opt_usize(v, "full_attention_interval", 4)?.max(1);
            (0..num_hidden_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        LayerKind::Attention
                    } else {
                        LayerKind::GatedDeltaNet
                    }
                })
                .collect()
        }
        Some(other) => {
            return Err(ModelError::Config(format!(
                "\"layer_types\" must be a list, got {other}"
            )))
        }
    };
    if layer_types.len() != num_hidden_layers {
        return Err(ModelError::Config(format!(
            "\"layer_types\" has {} entries for {num_hidden_layers} layers",
            layer_types.len()
        )));
    }
    if v.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::Config(
            "attention_bias = true is not a Qwen3.5 configuration".into(),
        ));
    }
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(ModelError::Config(format!(
                "hidden_act {act:?} is not supported (Qwen3.5 uses silu)"
            )));
        }
    }
    // RoPE: `rope_parameters` (transformers 5), else the older top-level keys / `rope_scaling`.
    let rp = v.get("rope_parameters").filter(|x| x.is_object());
    let rs = v.get("rope_scaling").filter(|x| x.is_object());
    let pick = |key: &str| {
        rp.and_then(|p| p.get(key))
            .or_else(|| v.get(key))
            .or_else(|| rs.and_then(|p| p.get(key)))
    };
    if let Some(t) = pick("rope_type").and_then(Value::as_str) {
        if t != "default" {
            return Err(ModelError::Config(format!(
                "rope_type {t:?} is not supported (onepass implements \"default\")"
            )));
        }
    }
    let rope_theta = pick("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let partial_rotary_factor = pick("partial_rotary_factor")
        .and_then(Value::as_f64)
        .unwrap_or(0.25);
    let mrope_section = pick("mrope_section").and_then(Value::as_array).map(|a| {
        a.iter()
            .map(|x| x.as_u64().unwrap_or(0) as usize)
            .collect::<Vec<_>>()
    });
    let mrope_interleaved = pick("mrope_interleaved")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cfg = TextConfig {
        vocab_size: req_usize(v, "vocab_size")?,
        hidden_size,
        intermediate_size: req_usize(v, "intermediate_size")?,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: opt_usize(v, "num_key_value_heads", num_attention_heads)?,
        head_dim,
        rms_norm_eps: opt_f64(v, "rms_norm_eps").unwrap_or(1e-6) as f32,
        max_position_embeddings: opt_usize(v, "max_position_embeddings", 32768)?,
        tie_word_embeddings: tie_override
            .or_else(|| v.get("tie_word_embeddings").and_then(Value::as_bool))
            .unwrap_or(false),
        linear_conv_kernel_dim: opt_usize(v, "linear_conv_kernel_dim", 4)?,
        linear_key_head_dim: opt_usize(v, "linear_key_head_dim", 128)?,
        linear_value_head_dim: opt_usize(v, "linear_value_head_dim", 128)?,
        linear_num_key_heads: opt_usize(v, "linear_num_key_heads", 16)?,
        linear_num_value_heads: opt_usize(v, "linear_num_value_heads", 32)?,
        layer_types,
        rope_theta,
        partial_rotary_factor,
        mrope_section,
        mrope_interleaved,
    };
    validate(&cfg)?;
    Ok(cfg)
}

#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(x > 0.0)` also rejects NaN
pub(crate) fn validate(c: &TextConfig) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Config(m));
    for (name, x) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("linear_conv_kernel_dim", c.linear_conv_kernel_dim),
        ("linear_key_head_dim", c.linear_key_head_dim),
        ("linear_value_head_dim", c.linear_value_head_dim),
        ("linear_num_key_heads", c.linear_num_key_heads),
        ("linear_num_value_heads", c.linear_num_value_heads),
        ("max_position_embeddings", c.max_position_embeddings),
    ] {
        if x == 0 {
            return bad(format!("\"{name}\" must be positive"));
        }
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return bad(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_attention_heads, c.num_key_value_heads
        ));
    }
    if !c
        .linear_num_value_heads
        .is_multiple_of(c.linear_num_key_heads)
    {
        return bad(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            c.linear_num_value_heads, c.linear_num_key_heads
        ));
    }
    if !(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0) || c.rotary_dim() == 0 {
        return bad(format!(
            "partial_rotary_factor {} gives no rotary dims",
            c.partial_rotary_factor
        ));
    }
    if let Some(sec) = &c.mrope_section {
        let sum: usize = sec.iter().sum();
        if sum != c.rotary_dim() / 2 {
            return bad(format!(
                "mrope_section {sec:?} sums to {sum}, but the rotary width is {} (head_dim {} x partial_rotary_factor {}) / 2 = {}",
                c.rotary_dim(),
                c.head_dim,
                c.partial_rotary_factor,
                c.rotary_dim() / 2
            ));
        }
    }
    if !(c.rope_theta > 0.0) || !(c.rms_norm_eps > 0.0) {
        return bad("rope_theta and rms_norm_eps must be positive".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{"model_type":"qwen3_5_text","vocab_size":100,"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,
        "linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":4,"linear_value_head_dim":4,
        "rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5,"mrope_section":[1,1,0]}}"#;

    #[test]
    fn layer_types_default_to_the_interval() {
        let c = ModelConfig::from_json_str(TEXT).expect("parse");
        assert_eq!(c.form, ModelForm::Text);
        use LayerKind::*;
        assert_eq!(
            c.text.layer_types,
            vec![GatedDeltaNet, GatedDeltaNet, GatedDeltaNet, Attention]
        );
        assert_eq!(c.text.rotary_dim(), 4);
    }

    #[test]
    fn unknown_model_type_and_bad_sections_are_named() {
        let e =
            ModelConfig::from_json_str(&TEXT.replace("qwen3_5_text", "llama")).expect_err("fail");
        assert!(e.to_string().contains("\"llama\""), "{e}");
        let e = ModelConfig::from_json_str(&TEXT.replace("[1,1,0]", "[2,2,2]")).expect_err("fail");
        assert!(e.to_string().contains("mrope_section"), "{e}");
    }

    #[test]
    fn composite_reads_text_config_and_top_level_tie() {
        let inner = TEXT.replace("\"model_type\":\"qwen3_5_text\",", "");
        let json = format!(
            r#"{{"model_type":"qwen3_5","tie_word_embeddings":true,"text_config":{inner}}}"#
        );
        let c = ModelConfig::from_json_str(&json).expect("parse");
        assert_eq!(c.form, ModelForm::Composite);
        assert!(c.text.tie_word_embeddings);
    }
}

//! Writing a Qwen3.5 text model as a `qwen35` GGUF file, the way llama.cpp's converter does, and
//! as PrismML-style ternary packs (PQ2_0 / PTQ1_0 with the blockwise Hadamard fold).
//!
//! The converter's conventions are applied to the Hugging Face tensors (docs/formats.md lists
//! them): names `token_embd`, `blk.N.*`, `output_norm`, `output`; the five RMSNorm gains that
//! the model uses as `1 + w` are stored as `w + 1` (`linear_attn.norm` is stored as is);
//! `A_log` becomes `ssm_a = -exp(A_log)`, `dt_bias` `ssm_dt.bias`; the depthwise conv is squeezed
//! to `[channels, kernel]`; when a layer has more value heads than key heads the value heads are
//! moved from grouped order (`[k0: v0 v1][k1: v0 v1]`) to tiled order (`[v0: k0 k1][v1: k0 k1]`)
//! in the V rows of `attn_qkv`, all rows of `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`,
//! `ssm_dt` and the V channels of `ssm_conv1d`, and in the input columns of `ssm_out` for float
//! files; a ternary pack leaves `ssm_out`'s columns grouped (`prism.hadamard.gdn_v_grouped`),
//! because a column permutation cannot pass through the fold.
//!
//! Types follow the converter: 1-D tensors, norms, `ssm_conv1d` and tensors not named `.weight`
//! stay F32; the other matrices take the file's type (Q8_0 falls back to F16 when a row is not a
//! whole number of 32-value blocks). A ternary pack makes every projection, the embedding and the
//! head ternary and folded, keeps `ssm_alpha`/`ssm_beta` BF16 and the rest F32, as PrismML's
//! packs do.
//!
//! Tensors are streamed: a few megabytes of rows are read, transformed, encoded and written at a
//! time, so converting never holds a second copy of the model.

mod synth_pack;
mod tokenizer;

pub use synth_pack::SynthSource;
pub use tokenizer::{tokenizer_metadata, TokenizerFiles};

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use onepass_formats::gguf::GgufStreamWriter;
use onepass_formats::hadamard::{
    HADAMARD_AXIS, HADAMARD_BLOCK, HADAMARD_PREFIX, HADAMARD_TRANSFORM,
};
use onepass_formats::quant::quantize;
use onepass_formats::{Checkpoint, GgmlType, GgufArray, GgufTensorPlan, GgufValue};
use onepass_tensor::DType;
use rayon::prelude::*;
use serde_json::Value;

use crate::config::{LayerKind, ModelForm, TextConfig};
use crate::synth::mix;
use crate::{ModelConfig, ModelError};

/// The type of a converted file (llama.cpp's `--outtype`, plus the two ternary packs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F16,
    BF16,
    Q8_0,
    PQ2_0,
    PTQ1_0,
}

impl OutType {
    pub fn parse(s: &str) -> Option<OutType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f16" => OutType::F16,
            "bf16" => OutType::BF16,
            "q8_0" => OutType::Q8_0,
            "pq2_0" => OutType::PQ2_0,
            "ptq1_0" => OutType::PTQ1_0,
            _ => return None,
        })
    }

    /// The type the file's large matrices get.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            OutType::F16 => GgmlType::F16,
            OutType::BF16 => GgmlType::BF16,
            OutType::Q8_0 => GgmlType::Q8_0,
            OutType::PQ2_0 => GgmlType::PQ2_0,
            OutType::PTQ1_0 => GgmlType::PTQ1_0,
        }
    }

    pub fn is_ternary(self) -> bool {
        matches!(self, OutType::PQ2_0 | OutType::PTQ1_0)
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`; 128 and 129 are PrismML's).
    pub fn file_type(self) -> u32 {
        match self {
            OutType::F16 => 1,
            OutType::BF16 => 32,
            OutType::Q8_0 => 7,
            OutType::PQ2_0 => 128,
            OutType::PTQ1_0 => 129,
        }
    }
}

/// What to do with a tensor's values before it is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueOp {
    None,
    /// `w + 1` (RMSNorm gains the model uses as `1 + w`).
    AddOne,
    /// `-exp(w)` (`A_log` to `ssm_a`).
    NegExp,
}

/// How a folded tensor's rows are rotated (both are `R·row` per row; the names record which
/// list of the metadata the tensor goes in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    None,
    /// A linear `W' = W·Rᵀ` (`prism.hadamard.weight_names`).
    Weight,
    /// The embedding table, rows stored as `R·e` (`prism.hadamard.inverse_weight_names`).
    Inverse,
}

/// One tensor of the output file and where its values come from.
#[derive(Clone, Debug)]
pub struct TensorJob {
    pub plan: GgufTensorPlan,
    /// The Hugging Face tensor (full name, prefix included).
    pub source: String,
    /// The source's shape (outermost first).
    pub source_shape: Vec<usize>,
    /// Rows × columns of the output (columns = `ne[0]`).
    pub rows: usize,
    pub cols: usize,
    /// Output row `r` is source row `row_perm[r]`.
    pub row_perm: Option<Vec<usize>>,
    /// Output column `c` is source column `col_perm[c]`.
    pub col_perm: Option<Vec<usize>>,
    pub op: ValueOp,
    pub fold: Fold,
}

/// Where tensor values come from: a checkpoint, or a generator (`onepass synth`).
pub trait TensorSource: Sync {
    /// The stored dtype and shape of `name`, if present.
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)>;
    /// Flat values `start..start + out.len()` of `name` as f32.
    fn read(&self, name: &str, start: usize, out: &mut [f32]);
    /// Rows `r0..r1` of a ternary job already encoded, for a source that makes packed weights
    /// directly (a random ternary pack); `None` to have them quantised from [`TensorSource::read`].
    fn packed_rows(&self, _job: &TensorJob, _r0: usize, _r1: usize, _out: &mut [u8]) -> Option<()> {
        None
    }
}

impl TensorSource for Checkpoint {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.get(name).map(|t| (t.dtype(), t.shape().to_vec()))
    }
    fn read(&self, name: &str, start: usize, out: &mut [f32]) {
        if let Some(t) = self.get(name) {
            t.read_f32(start, out);
        }
    }
}

/// Everything that goes into a file: metadata and tensor jobs, in order.
pub struct ConversionPlan {
    pub metadata: Vec<(String, GgufValue)>,
    pub jobs: Vec<TensorJob>,
    /// Sign vectors by input width (ternary packs).
    pub signs: Vec<(usize, Vec<f32>)>,
}

impl ConversionPlan {
    /// Bytes of tensor data in the file (before alignment padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.jobs.iter().map(|j| j.plan.nbytes().unwrap_or(0)).sum()
    }
}

/// Grouped-to-tiled value-head order: position `j·hk + k` holds head `k·r + j`, each head `d`
/// wide; the returned vector maps output index to source index, offset by `base` on both sides.
pub fn tiled_from_grouped(hk: usize, hv: usize, d: usize) -> Vec<usize> {
    let r = hv / hk;
    let mut perm = Vec::with_capacity(hv * d);
    for j in 0..r {
        for k in 0..hk {
            let src = k * r + j;
            perm.extend((0..d).map(|e| src * d + e));
        }
    }
    perm
}

fn with_prefix(perm: Vec<usize>, keep: usize) -> Vec<usize> {
    (0..keep)
        .chain(perm.into_iter().map(|p| p + keep))
        .collect()
}

/// The ±1 sign vector of `width` for `seed` (a counter-based generator: the same on every machine).
pub fn seeded_signs(seed: u64, width: usize) -> Vec<f32> {
    (0..width as u64)
        .map(|i| {
            let z = mix(seed ^ mix(width as u64) ^ mix(i.wrapping_add(0x5151)));
            if z >> 63 == 0 {
                1.0
            } else {
                -1.0
            }
        })
        .collect()
}

fn u32v(v: usize) -> GgufValue {
    GgufValue::U32(v as u32)
}

/// The general and `qwen35.*` keys of a model (after `general.architecture`).
fn hparams_metadata(
    name: &str,
    t: &TextConfig,
    out: OutType,
) -> Result<Vec<(String, GgufValue)>, ModelError> {
    let interval = attention_interval(t)?;
    let k = |s: &str| format!("qwen35.{s}");
    let sections: Vec<i32> = match &t.mrope_section {
        Some(s) => {
            let mut v: Vec<i32> = s.iter().map(|&x| x as i32).collect();
            v.resize(4.max(v.len()), 0);
            v
        }
        None => vec![11, 11, 10, 0],
    };
    Ok(vec![
        ("general.type".into(), GgufValue::String("model".into())),
        ("general.name".into(), GgufValue::String(name.into())),
        (k("block_count"), u32v(t.num_hidden_layers)),
        (k("context_length"), u32v(t.max_position_embeddings)),
        (k("embedding_length"), u32v(t.hidden_size)),
        (k("feed_forward_length"), u32v(t.intermediate_size)),
        (k("attention.head_count"), u32v(t.num_attention_heads)),
        (k("attention.head_count_kv"), u32v(t.num_key_value_heads)),
        (k("rope.freq_base"), GgufValue::F32(t.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(t.rms_norm_eps),
        ),
        (k("attention.key_length"), u32v(t.head_dim)),
        (k("attention.value_length"), u32v(t.head_dim)),
        ("general.file_type".into(), GgufValue::U32(out.file_type())),
        (
            k("rope.dimension_sections"),
            GgufValue::Array(GgufArray::I32(sections)),
        ),
        (k("ssm.conv_kernel"), u32v(t.linear_conv_kernel_dim)),
        (k("ssm.state_size"), u32v(t.linear_key_head_dim)),
        (k("ssm.group_count"), u32v(t.linear_num_key_heads)),
        (k("ssm.time_step_rank"), u32v(t.linear_num_value_heads)),
        (
            k("ssm.inner_size"),
            u32v(t.linear_value_head_dim * t.linear_num_value_heads),
        ),
        (k("full_attention_interval"), u32v(interval)),
        (
            k("rope.dimension_count"),
            u32v((t.head_dim as f64 * t.partial_rotary_factor) as usize),
        ),
    ])
}

/// The `full_attention_interval` that reproduces the layer kinds (GGUF has no per-layer list).
fn attention_interval(t: &TextConfig) -> Result<usize, ModelError> {
    let first = t
        .layer_types
        .iter()
        .position(|k| *k == LayerKind::Attention)
        .map(|i| i + 1)
        .unwrap_or(t.layer_types.len() + 1);
    let ok = t.layer_types.iter().enumerate().all(|(i, k)| {
        (*k == LayerKind::Attention) == (first <= t.layer_types.len() && (i + 1) % first == 0)
    });
    if !ok {
        return Err(ModelError::Config(format!(
            "the layer kinds ({}) are not \"full attention every N-th layer\", which is all a qwen35 GGUF can record",
            t.layer_types
                .iter()
                .map(|k| match k {
                    LayerKind::Attention => "A",
                    LayerKind::GatedDeltaNet => "G",
                })
                .collect::<String>()
        )));
    }
    Ok(first)
}

/// How a tensor is stored: Matrix (the file type, or ternary in a pack), Small (BF16 in a pack,
/// the file type otherwise), F32.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Matrix,
    Small,
    F32,
}

/// One tensor the config implies: its GGUF and Hugging Face names, the source shape it must
/// have, and its transforms.
struct Want {
    gguf: String,
    src: String,
    shape: Vec<usize>,
    kind: Kind,
    op: ValueOp,
    row_perm: Option<Vec<usize>>,
    col_perm: Option<Vec<usize>>,
    fold: Fold,
}

impl Want {
    fn new((gguf, src): (String, String), shape: Vec<usize>, kind: Kind, fold: Fold) -> Want {
        Want {
            gguf,
            src,
            shape,
            kind,
            op: ValueOp::None,
            row_perm: None,
            col_perm: None,
            fold,
        }
    }
    /// A linear weight (rotated in a ternary pack).
    fn matrix(names: (String, String), shape: Vec<usize>) -> Want {
        Want::new(names, shape, Kind::Matrix, Fold::Weight)
    }
    fn small(names: (String, String), shape: Vec<usize>) -> Want {
        Want::new(names, shape, Kind::Small, Fold::None)
    }
    fn f32(names: (String, String), shape: Vec<usize>) -> Want {
        Want::new(names, shape, Kind::F32, Fold::None)
    }
    /// An RMSNorm gain of `width` (stored as `1 + w`).
    fn gain(names: (String, String), width: usize) -> Want {
        Want::f32(names, vec![width]).op(ValueOp::AddOne)
    }
    fn op(self, op: ValueOp) -> Want {
        Want { op, ..self }
    }
    fn rows(self, row_perm: Option<Vec<usize>>) -> Want {
        Want { row_perm, ..self }
    }
    fn cols(self, col_perm: Option<Vec<usize>>) -> Want {
        Want { col_perm, ..self }
    }
    fn fold(self, fold: Fold) -> Want {
        Want { fold, ..self }
    }

    /// Checks the tensor against `source` and plans its output type and layout.
    fn job(self, source: &dyn TensorSource, out: OutType) -> Result<TensorJob, ModelError> {
        let ternary = out.is_ternary();
        let Want {
            gguf,
            src,
            shape: want,
            kind,
            op,
            row_perm,
            col_perm,
            fold,
        } = self;
        let Some((_, shape)) = source.describe(&src) else {
            return Err(ModelError::Weights(format!(
                "{src} is missing (expected shape {want:?})"
            )));
        };
        if shape != want {
            return Err(ModelError::Weights(format!(
                "{src} has shape {shape:?}, expected {want:?}"
            )));
        }
        // The converter squeezes every tensor: dimensions of size 1 disappear.
        let mut ne: Vec<u64> = shape
            .iter()
            .rev()
            .filter(|&&d| d != 1)
            .map(|&d| d as u64)
            .collect();
        if ne.is_empty() {
            ne.push(1);
        }
        let cols = ne[0] as usize;
        let rows = (ne.iter().product::<u64>() / ne[0]) as usize;
        let one_d = ne.len() == 1;
        let ty = if one_d || kind == Kind::F32 {
            GgmlType::F32
        } else if kind == Kind::Small && ternary {
            GgmlType::BF16
        } else if ternary {
            out.ggml_type()
        } else if out == OutType::Q8_0 && !cols.is_multiple_of(32) {
            GgmlType::F16
        } else {
            out.ggml_type()
        };
        let fold = if ty.block_len() == 128 {
            fold
        } else {
            Fold::None
        };
        if fold != Fold::None && !cols.is_multiple_of(HADAMARD_BLOCK) {
            return Err(ModelError::Config(format!(
                "{gguf}: a ternary pack rotates every matrix input in blocks of {HADAMARD_BLOCK}, but this one has {cols} inputs; the model's widths (hidden, intermediate, attention and value heads × head size) must be multiples of {HADAMARD_BLOCK}"
            )));
        }
        Ok(TensorJob {
            plan: GgufTensorPlan {
                name: gguf,
                ggml_type: ty,
                ne,
            },
            source: src,
            source_shape: shape,
            rows,
            cols,
            row_perm,
            col_perm,
            op,
            fold,
        })
    }
}

/// Plans a conversion: checks that `source` has every tensor the config implies (with its shape)
/// and lists the output tensors with their transforms.
pub fn plan(
    name: &str,
    config: &ModelConfig,
    config_json: &Value,
    tokenizer: &TokenizerFiles,
    source: &dyn TensorSource,
    out: OutType,
    seed: u64,
) -> Result<ConversionPlan, ModelError> {
    let t = &config.text;
    let base = match config.form {
        ModelForm::Text => "model.",
        ModelForm::Composite => "model.language_model.",
    };
    let ternary = out.is_ternary();
    let h = t.hidden_size;
    let (hk, hv, dk, dv) = (
        t.linear_num_key_heads,
        t.linear_num_value_heads,
        t.linear_key_head_dim,
        t.linear_value_head_dim,
    );
    let reorder = hk > 0 && hv != hk;
    if reorder && !hv.is_multiple_of(hk) {
        return Err(ModelError::Config(format!(
            "{hv} value heads are not a multiple of {hk} key heads"
        )));
    }
    let conv_dim = t.gdn_conv_dim();
    let (nh, kvh, d) = (t.num_attention_heads, t.num_key_value_heads, t.head_dim);
    let ffn = t.intermediate_size;
    let embed = format!("{base}embed_tokens.weight");
    let mut wants = vec![Want::matrix(
        ("token_embd.weight".into(), embed.clone()),
        vec![t.vocab_size, h],
    )
    .fold(Fold::Inverse)];
    for (i, kind) in t.layer_types.iter().enumerate() {
        let p = format!("{base}layers.{i}.");
        let b = format!("blk.{i}.");
        let norm =
            |g: &str, s: &str| Want::gain((format!("{b}{g}.weight"), format!("{p}{s}.weight")), h);
        wants.push(norm("attn_norm", "input_layernorm"));
        match kind {
            LayerKind::GatedDeltaNet => {
                let q = format!("{p}linear_attn.");
                let n = |g: &str, s: &str| (format!("{b}{g}"), format!("{q}{s}"));
                let vp = |dim: usize| reorder.then(|| tiled_from_grouped(hk, hv, dim));
                let qkv_perm = vp(dv).map(|p| with_prefix(p, 2 * hk * dk));
                let kernel = t.linear_conv_kernel_dim;
                let out_perm = if ternary { None } else { vp(dv) };
                wants.extend([
                    Want::matrix(
                        n("attn_qkv.weight", "in_proj_qkv.weight"),
                        vec![conv_dim, h],
                    )
                    .rows(qkv_perm.clone()),
                    Want::matrix(n("attn_gate.weight", "in_proj_z.weight"), vec![hv * dv, h])
                        .rows(vp(dv)),
                    Want::small(n("ssm_alpha.weight", "in_proj_a.weight"), vec![hv, h]).rows(vp(1)),
                    Want::small(n("ssm_beta.weight", "in_proj_b.weight"), vec![hv, h]).rows(vp(1)),
                    Want::f32(
                        n("ssm_conv1d.weight", "conv1d.weight"),
                        vec![conv_dim, 1, kernel],
                    )
                    .rows(qkv_perm),
                    Want::f32(n("ssm_a", "A_log"), vec![hv])
                        .op(ValueOp::NegExp)
                        .cols(vp(1)),
                    Want::f32(n("ssm_dt.bias", "dt_bias"), vec![hv]).cols(vp(1)),
                    Want::f32(n("ssm_norm.weight", "norm.weight"), vec![dv]),
                    Want::matrix(n("ssm_out.weight", "out_proj.weight"), vec![h, hv * dv])
                        .cols(out_perm),
                ]);
            }
            LayerKind::Attention => {
                let q = format!("{p}self_attn.");
                let n = |g: &str, s: &str| (format!("{b}{g}.weight"), format!("{q}{s}.weight"));
                wants.extend([
                    Want::matrix(n("attn_q", "q_proj"), vec![nh * 2 * d, h]),
                    Want::matrix(n("attn_k", "k_proj"), vec![kvh * d, h]),
                    Want::matrix(n("attn_v", "v_proj"), vec![kvh * d, h]),
                    Want::matrix(n("attn_output", "o_proj"), vec![h, nh * d]),
                    Want::f32(n("attn_q_norm", "q_norm"), vec![d]).op(ValueOp::AddOne),
                    Want::f32(n("attn_k_norm", "k_norm"), vec![d]).op(ValueOp::AddOne),
                ]);
            }
        }
        let m = format!("{p}mlp.");
        let n = |g: &str, s: &str| (format!("{b}{g}.weight"), format!("{m}{s}.weight"));
        wants.extend([
            norm("post_attention_norm", "post_attention_layernorm"),
            Want::matrix(n("ffn_gate", "gate_proj"), vec![ffn, h]),
            Want::matrix(n("ffn_up", "up_proj"), vec![ffn, h]),
            Want::matrix(n("ffn_down", "down_proj"), vec![h, ffn]),
        ]);
    }
    wants.push(Want::gain(
        ("output_norm.weight".into(), format!("{base}norm.weight")),
        h,
    ));
    // A tied model has no lm_head; llama.cpp then reads token_embd as the head. A ternary pack
    // always has its own (folded) head, as PrismML's packs do.
    let head = if !t.tie_word_embeddings {
        Some("lm_head.weight".to_string())
    } else if ternary {
        Some(embed)
    } else {
        None
    };
    if let Some(src) = head {
        wants.push(Want::matrix(
            ("output.weight".into(), src),
            vec![t.vocab_size, h],
        ));
    }
    let jobs = wants
        .into_iter()
        .map(|w| w.job(source, out))
        .collect::<Result<Vec<TensorJob>, ModelError>>()?;

    let mut metadata = vec![(
        "general.architecture".to_string(),
        GgufValue::String("qwen35".into()),
    )];
    metadata.extend(hparams_metadata(name, t, out)?);
    metadata.extend(tokenizer_metadata(tokenizer, config_json, t.vocab_size)?);
    metadata.push(("general.quantization_version".into(), GgufValue::U32(2)));

    let mut signs = Vec::new();
    if ternary {
        let mut widths: Vec<usize> = jobs
            .iter()
            .filter(|j| j.fold != Fold::None)
            .map(|j| j.cols)
            .collect();
        widths.sort_unstable();
        widths.dedup();
        for &w in &widths {
            signs.push((w, seeded_signs(seed, w)));
        }
        let names = |f: Fold| -> Vec<String> {
            jobs.iter()
                .filter(|j| j.fold == f)
                .map(|j| j.plan.name.clone())
                .collect()
        };
        let key = |k: &str| format!("{HADAMARD_PREFIX}{k}");
        metadata.extend([
            (key("version"), GgufValue::U32(1)),
            (key("block_size"), u32v(HADAMARD_BLOCK)),
            (
                key("transform"),
                GgufValue::String(HADAMARD_TRANSFORM.into()),
            ),
            (key("axis"), GgufValue::String(HADAMARD_AXIS.into())),
            (key("sign_mode"), GgufValue::String("explicit".into())),
            (
                key("sign_widths"),
                GgufValue::Array(GgufArray::U32(widths.iter().map(|&w| w as u32).collect())),
            ),
            (
                key("sign_values"),
                GgufValue::Array(GgufArray::I8(
                    signs
                        .iter()
                        .flat_map(|(_, s)| s.iter().map(|&v| v as i8))
                        .collect(),
                )),
            ),
            (
                key("weight_names"),
                GgufValue::Array(GgufArray::String(names(Fold::Weight))),
            ),
            (
                key("inverse_weight_names"),
                GgufValue::Array(GgufArray::String(names(Fold::Inverse))),
            ),
            (key("gdn_v_grouped"), GgufValue::Bool(true)),
        ]);
    }
    Ok(ConversionPlan {
        metadata,
        jobs,
        signs,
    })
}

/// Progress of a write: tensors done, tensors in all, bytes written, bytes in all.
pub type Progress<'a> = dyn FnMut(usize, usize, u64, u64) + 'a;

/// Values per chunk of rows transformed at once (~16 MB of f32).
const CHUNK_VALUES: usize = 1 << 22;

/// Writes `plan` to `out` (created; written as `out` + `.part` and renamed when complete, so a
/// failed conversion leaves no truncated file behind).
pub fn write(
    plan: &ConversionPlan,
    source: &dyn TensorSource,
    out: &Path,
    progress: &mut Progress<'_>,
) -> Result<(), ModelError> {
    let part = out.with_extension(match out.extension() {
        Some(e) => format!("{}.part", e.to_string_lossy()),
        None => "part".into(),
    });
    let io = |p: &Path, e: std::io::Error| ModelError::Io(format!("{}: {e}", p.display()));
    let file = File::create(&part).map_err(|e| io(&part, e))?;
    let result = write_to(
        plan,
        source,
        BufWriter::with_capacity(1 << 22, file),
        progress,
    )
    .map_err(|e| io(&part, e));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, out).map_err(|e| io(out, e))
}

/// Writes `plan` to any writer.
pub fn write_to<W: Write>(
    plan: &ConversionPlan,
    source: &dyn TensorSource,
    out: W,
    progress: &mut Progress<'_>,
) -> std::io::Result<()> {
    let plans: Vec<GgufTensorPlan> = plan.jobs.iter().map(|j| j.plan.clone()).collect();
    let mut w = GgufStreamWriter::new(out, &plan.metadata, &plans)?;
    let total = plan.tensor_bytes();
    let mut done_bytes = 0u64;
    let mut buf_f32: Vec<f32> = Vec::new();
    let mut buf_u8: Vec<u8> = Vec::new();
    for (i, job) in plan.jobs.iter().enumerate() {
        let ty = job.plan.ggml_type;
        let row_bytes = job.cols / ty.block_len() * ty.block_bytes();
        let chunk_rows = (CHUNK_VALUES / job.cols.max(1)).clamp(1, job.rows.max(1));
        let signs = plan
            .signs
            .iter()
            .find(|(w, _)| *w == job.cols)
            .map(|(_, s)| s.as_slice());
        let f16_source = matches!(source.describe(&job.source), Some((DType::F16, _)));
        let mut r0 = 0;
        while r0 < job.rows {
            let r1 = (r0 + chunk_rows).min(job.rows);
            let n = r1 - r0;
            buf_u8.resize(n * row_bytes, 0);
            if ty.block_len() == 128 && source.packed_rows(job, r0, r1, &mut buf_u8).is_some() {
                w.write_tensor(&buf_u8)?;
                r0 = r1;
                continue;
            }
            buf_f32.resize(n * job.cols, 0.0);
            buf_f32
                .par_chunks_mut(job.cols)
                .zip(buf_u8.par_chunks_mut(row_bytes))
                .enumerate()
                .for_each(|(k, (row, bytes))| {
                    let r = r0 + k;
                    let src_row = job.row_perm.as_ref().map_or(r, |p| p[r]);
                    match &job.col_perm {
                        None => source.read(&job.source, src_row * job.cols, row),
                        Some(p) => {
                            let mut tmp = vec![0f32; job.cols];
                            source.read(&job.source, src_row * job.cols, &mut tmp);
                            for (o, &c) in row.iter_mut().zip(p) {
                                *o = tmp[c];
                            }
                        }
                    }
                    apply_op(job.op, f16_source, row);
                    if let (Some(s), true) = (signs, job.fold != Fold::None) {
                        onepass_kernels::cpu::hadamard::hadamard_rotate(row, s);
                    }
                    quantize(ty, row, bytes).expect("row sizes are whole blocks");
                });
            w.write_tensor(&buf_u8)?;
            r0 = r1;
        }
        done_bytes += job.plan.nbytes()?;
        progress(i + 1, plan.jobs.len(), done_bytes, total);
    }
    w.finish()?;
    Ok(())
}

/// Applies `op`; on an f16 source the result is rounded to f16, as the converter computes in
/// the source's dtype.
fn apply_op(op: ValueOp, f16_source: bool, row: &mut [f32]) {
    let f = |v: f32| -> f32 {
        match op {
            ValueOp::None => v,
            ValueOp::AddOne => v + 1.0,
            // In f64, rounded once: correctly rounded, so no libm decides the bits.
            ValueOp::NegExp => (-f64::from(v).exp()) as f32,
        }
    };
    if op == ValueOp::None {
        return;
    }
    for v in row.iter_mut() {
        *v = f(*v);
        if f16_source {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
}

/// What a conversion reads.
pub enum Input<'a> {
    /// A model folder: `config.json`, the tokenizer files and the safetensors weights.
    Folder(&'a Path),
    /// The synthetic checkpoint `spec`, generated tensor by tensor (see [`SynthSource`]) and named `name`.
    Synth {
        spec: &'a crate::synth::SynthSpec,
        name: &'a str,
        tokenizer: &'a TokenizerFiles,
    },
}

/// Converts `input` to the GGUF file `out` of type `ty`; `seed` seeds the rotation signs of a ternary pack.
pub fn convert(
    input: Input<'_>,
    out: &Path,
    ty: OutType,
    seed: u64,
    progress: &mut Progress<'_>,
) -> Result<ConversionPlan, ModelError> {
    match input {
        Input::Folder(dir) => {
            let config = ModelConfig::from_dir(dir)?;
            let config_json: Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join("config.json"))
                    .map_err(|e| ModelError::Io(format!("{}: {e}", dir.display())))?,
            )
            .map_err(|e| ModelError::Config(e.to_string()))?;
            let tokenizer = TokenizerFiles::from_dir(dir)?;
            let ckpt = Checkpoint::open_dir(dir)?;
            let name = dir
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "model".into());
            let plan = plan(&name, &config, &config_json, &tokenizer, &ckpt, ty, seed)?;
            write(&plan, &ckpt, out, progress)?;
            Ok(plan)
        }
        Input::Synth {
            spec,
            name,
            tokenizer,
        } => {
            let config_json = crate::synth::config_json(spec);
            let config = ModelConfig::from_json_str(&config_json.to_string())?;
            let source = SynthSource::new(spec);
            let plan = plan(name, &config, &config_json, tokenizer, &source, ty, seed)?;
            write(&plan, &source, out, progress)?;
            Ok(plan)
        }
    }
}

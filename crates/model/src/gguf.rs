//! Qwen3.5 from a GGUF file: llama.cpp's `qwen35` architecture (also PrismML's ternary Bonsai packs).
//!
//! The model binds its weights by Hugging Face name ([`crate::weights::Binder`]), so a GGUF file is read
//! into the same name space: the `qwen35.*` keys become a [`ModelConfig`], and every tensor is renamed
//! (`blk.N.attn_qkv.weight` → `model.layers.N.linear_attn.in_proj_qkv.weight`, the table [`NAMES`]) with
//! the changes llama.cpp's converter made to it undone, so the forward is the same code for both formats:
//!
//! - the five zero-centred RMSNorm gains (`attn_norm`, `post_attention_norm`, `output_norm`,
//!   `attn_q_norm`, `attn_k_norm`) are stored as `w + 1`: 1 is subtracted (`ssm_norm` is stored as is);
//! - when key and value heads differ, the Gated DeltaNet value heads are stored in tiled order
//!   (`[k0 v0, k1 v0, …, k0 v1, k1 v1, …]`) instead of grouped by key head (`[k0 v0, k0 v1, …, k1 v0, …]`):
//!   the V rows of `attn_qkv`, all rows of `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt` and the
//!   V channels of `ssm_conv1d`, and the input columns of `ssm_out`, are put back in grouped order. A pack
//!   with `prism.hadamard.gdn_v_grouped` keeps `ssm_out`'s columns grouped (a column permutation cannot pass
//!   through the rotation folded into it), so they are left alone;
//! - `ssm_a` holds `-exp(A_log)`: `A_log = ln(-ssm_a)`; `ssm_dt.bias` is `dt_bias`;
//! - `ssm_conv1d` is squeezed to `[channels, kernel]`: the unit dimension is put back;
//! - the query|gate rows of `attn_q` are interleaved per head exactly as in `q_proj`: nothing to undo.
//!
//! Weights keep the type they are stored in (F32, F16, BF16, Q8_0, PQ2_0, PTQ1_0) and stay
//! slices of the memory map unless a row permutation above had to copy them. A Hadamard-rotated pack
//! (`prism.hadamard.*`) also yields which linears read a rotated activation ([`Rotations`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use onepass_formats::{Checkpoint, Gguf, GgufTensorInfo, GgufValue, HadamardMeta};
use onepass_tensor::Tensor;

use crate::config::{validate, LayerKind, ModelConfig, ModelForm, TextConfig};
use crate::ModelError;

/// The architecture this loader reads (`general.architecture`).
pub const ARCH: &str = "qwen35";

/// GGUF tensor names (per layer under `blk.N.`) and the Hugging Face names the model binds (per layer under
/// `model.layers.N.`).
pub const NAMES: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
    ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
    ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
    ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
];

/// The whole-model tensors.
pub const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The GGUF name of a Hugging Face name the model binds (for messages).
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL_NAMES.iter().find(|(_, h)| *h == hf) {
        return Some(g.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (n, role) = rest.split_once('.')?;
    let (g, _) = NAMES.iter().find(|(_, h)| *h == role)?;
    Some(format!("blk.{n}.{g}"))
}

/// Which linears read a Hadamard-rotated activation, by the Hugging Face name the model binds.
#[derive(Debug, Default)]
pub struct Rotations {
    /// Folded linears (`W' = W·Rᵀ`): the sign vector of their input width.
    pub folded: HashMap<String, Arc<[f32]>>,
    /// Tensors stored rotated by `R` per row (the embedding): their sign vector.
    pub inverse: HashMap<String, Arc<[f32]>>,
}

/// A GGUF file read as a Qwen3.5 checkpoint.
pub struct GgufModel {
    pub config: ModelConfig,
    /// Every tensor under the name the model binds, the conventions above undone.
    pub checkpoint: Checkpoint,
    pub rotations: Option<Rotations>,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

fn req(f: &Gguf, k: &str) -> Result<usize, ModelError> {
    Ok(f.u64_value(&key(k))? as usize)
}

fn opt(f: &Gguf, k: &str) -> Result<Option<usize>, ModelError> {
    match f.get(&key(k)) {
        None => Ok(None),
        Some(_) => req(f, k).map(Some),
    }
}

fn float(f: &Gguf, k: &str) -> Result<Option<f64>, ModelError> {
    match f.get(&key(k)) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .or_else(|| v.as_i128().map(|i| i as f64))
            .map(Some)
            .ok_or_else(|| {
                f.metadata_error(
                    &key(k),
                    format!("expected a number, found {}", v.type_name()),
                )
                .into()
            }),
    }
}

/// The layer count without the multi-token-prediction blocks llama.cpp appends (`nextn_predict_layers`).
fn text_layers(f: &Gguf) -> Result<usize, ModelError> {
    let blocks = req(f, "block_count")?;
    let nextn = opt(f, "nextn_predict_layers")?.unwrap_or(0);
    blocks.checked_sub(nextn).filter(|&n| n > 0).ok_or_else(|| {
        f.metadata_error(
            &key("block_count"),
            format!("{blocks} blocks leave no text layers beside {nextn} prediction layers"),
        )
        .into()
    })
}

/// The model configuration from the `qwen35.*` keys (and the embedding's shape for the vocabulary size).
pub fn config_from_gguf(f: &Gguf) -> Result<ModelConfig, ModelError> {
    let arch = f.str_value("general.architecture")?;
    if arch != ARCH {
        return Err(ModelError::Config(format!(
            "{}: architecture {arch:?} is not supported (onepass runs \"{ARCH}\", Qwen3.5)",
            f.path().display()
        )));
    }
    let layers = text_layers(f)?;
    let embd = f.tensor("token_embd.weight").ok_or_else(|| {
        ModelError::Weights(format!(
            "{}: missing tensor token_embd.weight",
            f.path().display()
        ))
    })?;
    let vocab_size = embd.shape()[0];
    if let Some(v) = opt(f, "vocab_size")? {
        if v != vocab_size {
            return Err(f
                .metadata_error(
                    &key("vocab_size"),
                    format!("{v} disagrees with token_embd.weight's {vocab_size} rows"),
                )
                .into());
        }
    }
    let heads = req(f, "attention.head_count")?;
    let head_dim = req(f, "attention.key_length")?;
    if let Some(v) = opt(f, "attention.value_length")? {
        if v != head_dim {
            return Err(f
                .metadata_error(
                    &key("attention.value_length"),
                    format!(
                        "{v} differs from the key length {head_dim} (Qwen3.5 has one head size)"
                    ),
                )
                .into());
        }
    }
    let hv = req(f, "ssm.time_step_rank")?;
    let inner = req(f, "ssm.inner_size")?;
    if hv == 0 || !inner.is_multiple_of(hv) {
        return Err(f
            .metadata_error(
                &key("ssm.inner_size"),
                format!("{inner} is not a multiple of the {hv} value heads (ssm.time_step_rank)"),
            )
            .into());
    }
    let interval = opt(f, "full_attention_interval")?.unwrap_or(4).max(1);
    let layer_types = (0..layers)
        .map(|i| {
            if (i + 1) % interval == 0 {
                LayerKind::Attention
            } else {
                LayerKind::GatedDeltaNet
            }
        })
        .collect();
    let rope_dims = req(f, "rope.dimension_count")?;
    let mrope_section = match f.get(&key("rope.dimension_sections")) {
        None => None,
        Some(GgufValue::Array(a)) => Some(
            a.to_i128_vec()
                .filter(|v| v.iter().all(|&x| x >= 0))
                .ok_or_else(|| {
                    f.metadata_error(
                        &key("rope.dimension_sections"),
                        "must be non-negative integers",
                    )
                })?
                .into_iter()
                .map(|x| x as usize)
                .collect(),
        ),
        Some(v) => {
            return Err(f
                .metadata_error(
                    &key("rope.dimension_sections"),
                    format!("expected an array, found {}", v.type_name()),
                )
                .into())
        }
    };
    let text = TextConfig {
        vocab_size,
        hidden_size: req(f, "embedding_length")?,
        intermediate_size: req(f, "feed_forward_length")?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: req(f, "attention.head_count_kv")?,
        head_dim,
        rms_norm_eps: float(f, "attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6) as f32,
        max_position_embeddings: req(f, "context_length")?,
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        linear_conv_kernel_dim: req(f, "ssm.conv_kernel")?,
        linear_key_head_dim: req(f, "ssm.state_size")?,
        linear_value_head_dim: inner / hv,
        linear_num_key_heads: req(f, "ssm.group_count")?,
        linear_num_value_heads: hv,
        layer_types,
        rope_theta: float(f, "rope.freq_base")?.unwrap_or(10_000.0),
        partial_rotary_factor: rope_dims as f64 / head_dim.max(1) as f64,
        mrope_section,
        mrope_interleaved: true,
    };
    validate(&text).map_err(|e| match e {
        ModelError::Config(m) => ModelError::Config(format!("{}: {m}", f.path().display())),
        other => other,
    })?;
    if text.rotary_dim() != rope_dims {
        return Err(f
            .metadata_error(
                &key("rope.dimension_count"),
                format!("{rope_dims} is not an even number of dimensions up to the head size {head_dim}"),
            )
            .into());
    }
    Ok(ModelConfig {
        model_type: "qwen3_5_text".into(),
        form: ModelForm::Text,
        text,
    })
}

/// How one tensor is brought back to the Hugging Face layout.
#[derive(Clone, Copy, PartialEq)]
enum Fix {
    None,
    /// `w + 1` stored: subtract 1.
    NormOffset,
    /// Rows from `start` on are value heads of `head` rows each, in tiled order.
    TiledRows {
        start: usize,
        head: usize,
    },
    /// `-exp(A_log)` stored, value heads tiled.
    NegExpTiled,
    /// Input columns are value heads of `dv` columns, tiled.
    TiledColumns,
}

/// Reads a `qwen35` GGUF file as a checkpoint under the model's names.
pub fn read_gguf(f: &Gguf) -> Result<GgufModel, ModelError> {
    let config = config_from_gguf(f)?;
    let c = &config.text;
    let rot = HadamardMeta::from_gguf(f)?;
    let grouped_out = rot.as_ref().is_some_and(|r| r.gdn_v_grouped);
    let (hk, hv, dk, dv) = (
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
    );
    let bad = |name: &str, why: String| {
        ModelError::Weights(format!("{}: tensor {name}: {why}", f.path().display()))
    };
    let mut tensors = HashMap::new();
    let mut rotations = Rotations::default();
    let mut unknown = Vec::new();
    for info in f.tensors() {
        let name = info.name.as_str();
        let (hf, role) = if let Some((_, h)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == name) {
            (h.to_string(), "")
        } else if let Some((n, rest)) = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
        {
            if n >= c.num_hidden_layers {
                // llama.cpp appends the multi-token-prediction blocks after the text layers.
                continue;
            }
            match NAMES.iter().find(|(g, _)| *g == rest) {
                Some((_, h)) => (format!("model.layers.{n}.{h}"), *h),
                None => {
                    unknown.push(name);
                    continue;
                }
            }
        } else {
            unknown.push(name);
            continue;
        };
        let fix = match role {
            "" if name == "output_norm.weight" => Fix::NormOffset,
            "input_layernorm.weight"
            | "post_attention_layernorm.weight"
            | "self_attn.q_norm.weight"
            | "self_attn.k_norm.weight" => Fix::NormOffset,
            "linear_attn.in_proj_qkv.weight" | "linear_attn.conv1d.weight" => Fix::TiledRows {
                start: 2 * hk * dk,
                head: dv,
            },
            "linear_attn.in_proj_z.weight" => Fix::TiledRows { start: 0, head: dv },
            "linear_attn.in_proj_a.weight"
            | "linear_attn.in_proj_b.weight"
            | "linear_attn.dt_bias" => Fix::TiledRows { start: 0, head: 1 },
            "linear_attn.A_log" => Fix::NegExpTiled,
            "linear_attn.out_proj.weight" if !grouped_out => Fix::TiledColumns,
            _ => Fix::None,
        };
        let folded = rot.as_ref().is_some_and(|r| r.is_folded(name));
        if folded && fix == Fix::TiledColumns && hk != hv {
            return Err(bad(
                name,
                "is folded with the rotation but its value-head columns are in tiled order; a pack must \
                 keep them grouped (prism.hadamard.gdn_v_grouped = true)"
                    .into(),
            ));
        }
        let mut t = f.tensor_data_as_tensor(info)?.renamed(&hf);
        let r = hv / hk.max(1);
        match fix {
            Fix::None => {}
            Fix::NormOffset => {
                let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x - 1.0).collect();
                t = Tensor::from_f32(&hf, t.shape().to_vec(), &v);
            }
            Fix::NegExpTiled => {
                let v = t.to_f32_vec();
                if let Some(x) = v.iter().find(|x| x.is_nan() || **x >= 0.0) {
                    return Err(bad(
                        name,
                        format!("holds {x}, but -exp(A_log) is always negative"),
                    ));
                }
                let v: Vec<f32> = v.iter().map(|x| (-x).ln()).collect();
                let v = untile_f32(&v, 1, hk, r, 1);
                t = Tensor::from_f32(&hf, t.shape().to_vec(), &v);
            }
            Fix::TiledRows { start, head } if r > 1 => {
                t = untile_rows(f, info, &t, start, hk, r, head).map_err(|w| bad(name, w))?;
            }
            Fix::TiledRows { .. } => {}
            Fix::TiledColumns if r > 1 => {
                t = untile_columns(f, info, &t, hk, r, dv).map_err(|w| bad(name, w))?;
            }
            Fix::TiledColumns => {}
        }
        if role == "linear_attn.conv1d.weight" {
            // Squeezed to [channels, kernel] by the converter; the model reads [channels, 1, kernel].
            if let [ch, k] = t.shape() {
                let shape = vec![*ch, 1, *k];
                t = t.reshaped(shape);
            }
        }
        if let Some(r) = &rot {
            let k = t.shape().last().copied().unwrap_or(0);
            let signs = |set: &str| {
                r.signs_for(k).map(Arc::<[f32]>::from).ok_or_else(|| {
                    bad(
                        name,
                        format!("is in {set} but no sign vector has width {k}"),
                    )
                })
            };
            if r.is_folded(name) {
                rotations.folded.insert(hf.clone(), signs("weight_names")?);
            }
            if r.inverse_weight_names.contains(name) {
                rotations
                    .inverse
                    .insert(hf.clone(), signs("inverse_weight_names")?);
            }
        }
        tensors.insert(hf, t);
    }
    if let Some(first) = unknown.first() {
        return Err(ModelError::Weights(format!(
            "{}: unexpected tensor {first}{} (not part of the {ARCH} architecture)",
            f.path().display(),
            if unknown.len() > 1 {
                format!(" and {} more", unknown.len() - 1)
            } else {
                String::new()
            }
        )));
    }
    let checkpoint = Checkpoint::from_tensors(tensors, vec![f.path().to_path_buf()], f.file_len());
    Ok(GgufModel {
        config,
        checkpoint,
        rotations: rot.map(|_| rotations),
    })
}

/// Grouped order from tiled: value head `g·r + j` (key head `g`, `j`-th of its `r`) is stored at `j·hk + g`.
fn tiled_index(grouped: usize, hk: usize, r: usize) -> usize {
    let (g, j) = (grouped / r, grouped % r);
    j * hk + g
}

/// `v` with its rows of `head · width` values (value heads) put back in grouped order.
fn untile_f32(v: &[f32], width: usize, hk: usize, r: usize, head: usize) -> Vec<f32> {
    let per = head * width;
    let mut out = vec![0.0; v.len()];
    for gh in 0..hk * r {
        let th = tiled_index(gh, hk, r);
        out[gh * per..(gh + 1) * per].copy_from_slice(&v[th * per..(th + 1) * per]);
    }
    out
}

/// A copy of `t` with its value-head rows (from row `start` on, `head` rows each) in grouped order. Rows are
/// whole blocks in every type, so the bytes move as they are; the file's pages are then released.
fn untile_rows(
    f: &Gguf,
    info: &GgufTensorInfo,
    t: &Tensor,
    start: usize,
    hk: usize,
    r: usize,
    head: usize,
) -> Result<Tensor, String> {
    let shape = t.shape().to_vec();
    let rows = shape[0];
    if rows != start + hk * r * head {
        return Err(format!(
            "has {rows} rows, expected {start} + {} value-head rows",
            hk * r * head
        ));
    }
    let row_bytes = t.byte_len() / rows.max(1);
    let raw = t.raw();
    let mut out = raw.to_vec();
    let per = head * row_bytes;
    let base = start * row_bytes;
    for gh in 0..hk * r {
        let th = tiled_index(gh, hk, r);
        out[base + gh * per..base + (gh + 1) * per]
            .copy_from_slice(&raw[base + th * per..base + (th + 1) * per]);
    }
    let copy = Tensor::from_raw(t.name(), t.dtype(), shape, &out).map_err(|e| e.to_string())?;
    if t.is_mapped() {
        f.release(info);
    }
    Ok(copy)
}

/// A copy of `t` ([rows, hv·dv]) with its input columns put back in grouped value-head order. When a head's
/// `dv` columns are whole blocks the blocks move as they are; otherwise the values are decoded to f32 (exact
/// for every type) and permuted.
fn untile_columns(
    f: &Gguf,
    info: &GgufTensorInfo,
    t: &Tensor,
    hk: usize,
    r: usize,
    dv: usize,
) -> Result<Tensor, String> {
    let shape = t.shape().to_vec();
    let (rows, cols) = match shape.as_slice() {
        [rows, cols] => (*rows, *cols),
        s => return Err(format!("has shape {s:?}, expected a matrix")),
    };
    if cols != hk * r * dv {
        return Err(format!(
            "has {cols} columns, expected {} value-head columns",
            hk * r * dv
        ));
    }
    let dtype = t.dtype();
    let copy = if dv.is_multiple_of(dtype.block_len()) {
        let head_bytes = dtype.bytes_for(dv);
        let row_bytes = dtype.bytes_for(cols);
        let raw = t.raw();
        let mut out = vec![0u8; raw.len()];
        for row in 0..rows {
            let (src, dst) = (
                &raw[row * row_bytes..(row + 1) * row_bytes],
                &mut out[row * row_bytes..(row + 1) * row_bytes],
            );
            for gh in 0..hk * r {
                let th = tiled_index(gh, hk, r);
                dst[gh * head_bytes..(gh + 1) * head_bytes]
                    .copy_from_slice(&src[th * head_bytes..(th + 1) * head_bytes]);
            }
        }
        Tensor::from_raw(t.name(), dtype, shape, &out).map_err(|e| e.to_string())?
    } else {
        let v = t.to_f32_vec();
        let mut out = vec![0.0; v.len()];
        for row in 0..rows {
            let grouped = untile_f32(&v[row * cols..(row + 1) * cols], 1, hk, r, dv);
            out[row * cols..(row + 1) * cols].copy_from_slice(&grouped);
        }
        Tensor::from_f32(t.name(), shape, &out)
    };
    if t.is_mapped() {
        f.release(info);
    }
    Ok(copy)
}

/// The value-head permutation llama.cpp's converter applies (grouped → tiled), for tests and conversions:
/// `v`'s blocks of `per` consecutive values (one value head each) reordered.
pub fn tile_value_heads<T: Copy>(v: &[T], hk: usize, r: usize, per: usize) -> Vec<T> {
    let mut out = v.to_vec();
    for gh in 0..hk * r {
        let th = tiled_index(gh, hk, r);
        out[th * per..(th + 1) * per].copy_from_slice(&v[gh * per..(gh + 1) * per]);
    }
    out
}

/// The tensors of a layer of `kind` (GGUF names under `blk.N.`), for messages and tests.
pub fn layer_tensors(kind: LayerKind) -> HashSet<&'static str> {
    let attn = [
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
    ];
    NAMES
        .iter()
        .map(|(g, _)| *g)
        .filter(|g| {
            let is_attn = attn.contains(g);
            let common = g.starts_with("ffn_")
                || g.ends_with("attn_norm.weight")
                || *g == "post_attention_norm.weight";
            common
                || match kind {
                    LayerKind::Attention => is_attn,
                    LayerKind::GatedDeltaNet => !is_attn,
                }
        })
        .collect()
}

impl From<onepass_formats::GgufError> for ModelError {
    fn from(e: onepass_formats::GgufError) -> Self {
        ModelError::Gguf(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_round_trips_and_matches_the_converter_order() {
        // 2 key heads, 3 value heads each, 1 value per head: grouped [g0v0 g0v1 g0v2 g1v0 g1v1 g1v2]
        // becomes tiled [g0v0 g1v0 g0v1 g1v1 g0v2 g1v2].
        let grouped = [0, 1, 2, 10, 11, 12];
        let tiled = tile_value_heads(&grouped, 2, 3, 1);
        assert_eq!(tiled, vec![0, 10, 1, 11, 2, 12]);
        let v: Vec<f32> = tiled.iter().map(|&x| x as f32).collect();
        let back = untile_f32(&v, 1, 2, 3, 1);
        assert_eq!(back, grouped.map(|x| x as f32).to_vec());
    }

    #[test]
    fn every_hf_role_has_one_gguf_name() {
        assert_eq!(
            gguf_name("model.layers.7.linear_attn.in_proj_qkv.weight").as_deref(),
            Some("blk.7.attn_qkv.weight")
        );
        assert_eq!(
            gguf_name("lm_head.weight").as_deref(),
            Some("output.weight")
        );
        let hf: HashSet<_> = NAMES.iter().map(|(_, h)| h).collect();
        assert_eq!(hf.len(), NAMES.len());
        assert_eq!(layer_tensors(LayerKind::Attention).len(), 11);
        assert_eq!(layer_tensors(LayerKind::GatedDeltaNet).len(), 14);
    }
}

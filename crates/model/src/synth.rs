//! Deterministic synthetic checkpoints.
//!
//! Tests and benchmarks need real checkpoint folders (`config.json` + `model.safetensors`) without
//! downloading weights. [`write_checkpoint`] writes one from a [`SynthSpec`]: every tensor is drawn
//! from a counter-based generator seeded by (seed, tensor name, block), so the bytes are the same on
//! every machine and thread count. The weights are scaled so that every block moves the logits
//! (embeddings std 0.3, projections std 1/sqrt(fan_in), random norm gains, mild GDN decay); the
//! default init of training code (std 0.02) would give near-uniform outputs and hide bugs. They
//! exercise every code path and the numerics, not model quality.
//!
//! Tokenizer files are written by the caller (the `onepass synth` command).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use onepass_formats::safetensors_header;
use onepass_tensor::DType;
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::config::{LayerKind, ModelForm};
use crate::ModelError;

/// Everything that defines a synthetic checkpoint.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layer_types: Vec<LayerKind>,
    /// Write `full_attention_interval` instead of `layer_types` (the config then derives them).
    pub write_interval: Option<usize>,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub partial_rotary_factor: f64,
    pub rope_theta: f64,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub conv_kernel: usize,
    pub tie_word_embeddings: bool,
    pub form: ModelForm,
    pub dtype: DType,
    pub max_position_embeddings: usize,
    pub seed: u64,
    /// Also write tensors the text model must ignore (`mtp.*`, `model.visual.*`).
    pub extra_ignored_tensors: bool,
}

use LayerKind::{Attention as A, GatedDeltaNet as G};

/// Named presets. `tiny-*` are the oracle configurations; `qwen3.5-0.8b` and `qwen3.5-2b` have the
/// shapes of the real models (random weights) for benchmarks.
pub fn preset(name: &str) -> Option<SynthSpec> {
    let tiny = SynthSpec {
        vocab_size: 320,
        hidden_size: 64,
        intermediate_size: 160,
        layer_types: vec![G, G, G, A],
        write_interval: None,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        partial_rotary_factor: 0.5,
        rope_theta: 10_000.0,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 16,
        linear_value_head_dim: 24,
        conv_kernel: 4,
        tie_word_embeddings: false,
        form: ModelForm::Text,
        dtype: DType::F32,
        max_position_embeddings: 4096,
        seed: 1,
        extra_ignored_tensors: false,
    };
    let big = |hidden: usize, inter: usize| SynthSpec {
        vocab_size: 248_320,
        hidden_size: hidden,
        intermediate_size: inter,
        layer_types: (0..24)
            .map(|i| if (i + 1) % 4 == 0 { A } else { G })
            .collect(),
        write_interval: None,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 256,
        partial_rotary_factor: 0.25,
        rope_theta: 10_000_000.0,
        linear_num_key_heads: 16,
        linear_num_value_heads: 16,
        linear_key_head_dim: 128,
        linear_value_head_dim: 128,
        conv_kernel: 4,
        tie_word_embeddings: true,
        form: ModelForm::Text,
        dtype: DType::BF16,
        max_position_embeddings: 262_144,
        seed: 8,
        extra_ignored_tensors: false,
    };
    Some(match name {
        // GVA (value heads 2x key heads), key dim != value dim, GQA, attention last, untied.
        "tiny-gva" => tiny,
        // Attention first and last, tied embeddings, MHA-style KV (1 KV head), equal key/value dims.
        "tiny-attn-first" => SynthSpec {
            layer_types: vec![A, G, G, A],
            num_key_value_heads: 1,
            linear_num_key_heads: 2,
            linear_num_value_heads: 2,
            linear_value_head_dim: 16,
            tie_word_embeddings: true,
            partial_rotary_factor: 0.25,
            seed: 2,
            ..tiny
        },
        // The composite (Qwen3_5ForConditionalGeneration) layout with ignored extra tensors.
        "tiny-composite" => SynthSpec {
            form: ModelForm::Composite,
            extra_ignored_tensors: true,
            seed: 3,
            ..tiny
        },
        // bf16 weights, layer kinds derived from full_attention_interval, 6 layers.
        "tiny-bf16" => SynthSpec {
            layer_types: vec![G, G, A, G, G, A],
            write_interval: Some(3),
            dtype: DType::BF16,
            seed: 4,
            ..tiny
        },
        // The real Qwen3.5 vocabulary size, for tests that use the real tokenizer.
        "tiny-qwen-vocab" => SynthSpec {
            vocab_size: 248_320,
            tie_word_embeddings: true,
            seed: 5,
            ..tiny
        },
        "tiny-qwen-vocab-composite" => SynthSpec {
            vocab_size: 248_320,
            form: ModelForm::Composite,
            seed: 6,
            ..tiny
        },
        "qwen3.5-0.8b" => big(1024, 3584),
        "qwen3.5-2b" => big(2048, 6144),
        // The shape of PrismML's Ternary Bonsai 2 27B (Qwen3.5-27B): untied, 24/4 attention
        // heads, 16 key / 48 value GDN heads, 64 layers.
        "qwen3.5-27b" => SynthSpec {
            layer_types: (0..64)
                .map(|i| if (i + 1) % 4 == 0 { A } else { G })
                .collect(),
            num_attention_heads: 24,
            num_key_value_heads: 4,
            linear_num_key_heads: 16,
            linear_num_value_heads: 48,
            tie_word_embeddings: false,
            seed: 27,
            ..big(5120, 17408)
        },
        // The smallest shape whose matrix inputs are all multiples of 1024 (what the ternary
        // packs' rotation needs), GVA (2 value heads per key head), untied: for ternary tests.
        "tiny-ternary" => SynthSpec {
            vocab_size: 320,
            hidden_size: 1024,
            intermediate_size: 1024,
            layer_types: vec![G, G, G, A],
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 256,
            partial_rotary_factor: 0.25,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 128,
            linear_value_head_dim: 256,
            seed: 9,
            ..tiny
        },
        _ => return None,
    })
}

pub const PRESETS: &[&str] = &[
    "tiny-gva",
    "tiny-attn-first",
    "tiny-composite",
    "tiny-bf16",
    "tiny-qwen-vocab",
    "tiny-qwen-vocab-composite",
    "qwen3.5-0.8b",
    "qwen3.5-2b",
    "qwen3.5-27b",
    "tiny-ternary",
];

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init {
    Normal(f32),
    /// 1 + N(0, s)
    OnePlus(f32),
    /// ln(U(lo, hi))
    LogUniform(f32, f32),
    Uniform(f32, f32),
}

pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) init: Init,
    pub(crate) dtype: DType,
}

fn mrope_section(rot: usize) -> [usize; 3] {
    let h = rot / 2;
    [h.div_ceil(3), (h + 1) / 3, h / 3]
}

/// The `config.json` for a spec.
pub fn config_json(s: &SynthSpec) -> Value {
    let rot = ((s.head_dim as f64 * s.partial_rotary_factor) as usize) & !1;
    let mut text = json!({
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.layer_types.len(),
        "num_attention_heads": s.num_attention_heads,
        "num_key_value_heads": s.num_key_value_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": s.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": s.tie_word_embeddings,
        "attention_bias": false,
        "linear_conv_kernel_dim": s.conv_kernel,
        "linear_key_head_dim": s.linear_key_head_dim,
        "linear_value_head_dim": s.linear_value_head_dim,
        "linear_num_key_heads": s.linear_num_key_heads,
        "linear_num_value_heads": s.linear_num_value_heads,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": s.rope_theta,
            "partial_rotary_factor": s.partial_rotary_factor,
            "mrope_section": mrope_section(rot),
            "mrope_interleaved": true
        },
        "eos_token_id": s.vocab_size.saturating_sub(1),
        "dtype": match s.dtype { DType::BF16 => "bfloat16", DType::F16 => "float16", _ => "float32" },
    });
    match s.write_interval {
        Some(k) => text["full_attention_interval"] = json!(k),
        None => {
            text["layer_types"] = json!(s
                .layer_types
                .iter()
                .map(|k| match k {
                    LayerKind::GatedDeltaNet => "linear_attention",
                    LayerKind::Attention => "full_attention",
                })
                .collect::<Vec<_>>())
        }
    }
    match s.form {
        ModelForm::Text => {
            text["model_type"] = json!("qwen3_5_text");
            text["architectures"] = json!(["Qwen3_5ForCausalLM"]);
            text
        }
        ModelForm::Composite => {
            text["model_type"] = json!("qwen3_5_text");
            json!({
                "model_type": "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "tie_word_embeddings": s.tie_word_embeddings,
                "text_config": text,
                "vision_config": {
                    "model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                    "num_heads": 2, "out_hidden_size": s.hidden_size, "patch_size": 4, "spatial_merge_size": 2,
                    "temporal_patch_size": 2, "num_position_embeddings": 64, "in_channels": 3
                },
                "image_token_id": 248056u32.min(s.vocab_size as u32 - 1),
                "video_token_id": 248057u32.min(s.vocab_size as u32 - 1),
                "vision_start_token_id": 248053u32.min(s.vocab_size as u32 - 1),
                "vision_end_token_id": 248054u32.min(s.vocab_size as u32 - 1),
            })
        }
    }
}

pub(crate) fn tensor_specs(s: &SynthSpec) -> Vec<Spec> {
    let h = s.hidden_size;
    let base = match s.form {
        ModelForm::Text => "model.".to_string(),
        ModelForm::Composite => "model.language_model.".to_string(),
    };
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, init: Init, dtype: DType| {
        out.push(Spec {
            name,
            shape,
            init,
            dtype,
        })
    };
    let lin = |fan_in: usize| Init::Normal(1.0 / (fan_in as f32).sqrt());
    let gain = Init::Normal(0.1);
    let dt = s.dtype;
    add(
        format!("{base}embed_tokens.weight"),
        vec![s.vocab_size, h],
        Init::Normal(0.3),
        dt,
    );
    let (hk, hv, dk, dv) = (
        s.linear_num_key_heads,
        s.linear_num_value_heads,
        s.linear_key_head_dim,
        s.linear_value_head_dim,
    );
    let conv_dim = 2 * hk * dk + hv * dv;
    let (nh, kvh, d) = (s.num_attention_heads, s.num_key_value_heads, s.head_dim);
    for (i, kind) in s.layer_types.iter().enumerate() {
        let p = format!("{base}layers.{i}.");
        add(format!("{p}input_layernorm.weight"), vec![h], gain, dt);
        add(
            format!("{p}post_attention_layernorm.weight"),
            vec![h],
            gain,
            dt,
        );
        match kind {
            LayerKind::GatedDeltaNet => {
                let q = format!("{p}linear_attn.");
                add(
                    format!("{q}in_proj_qkv.weight"),
                    vec![conv_dim, h],
                    lin(h),
                    dt,
                );
                add(format!("{q}in_proj_z.weight"), vec![hv * dv, h], lin(h), dt);
                add(format!("{q}in_proj_a.weight"), vec![hv, h], lin(h), dt);
                add(format!("{q}in_proj_b.weight"), vec![hv, h], lin(h), dt);
                add(
                    format!("{q}conv1d.weight"),
                    vec![conv_dim, 1, s.conv_kernel],
                    lin(s.conv_kernel),
                    dt,
                );
                add(
                    format!("{q}A_log"),
                    vec![hv],
                    Init::LogUniform(0.05, 1.0),
                    DType::F32,
                );
                add(
                    format!("{q}dt_bias"),
                    vec![hv],
                    Init::Uniform(-1.0, 1.0),
                    DType::F32,
                );
                add(
                    format!("{q}norm.weight"),
                    vec![dv],
                    Init::OnePlus(0.1),
                    DType::F32,
                );
                add(
                    format!("{q}out_proj.weight"),
                    vec![h, hv * dv],
                    lin(hv * dv),
                    dt,
                );
            }
            LayerKind::Attention => {
                let q = format!("{p}self_attn.");
                add(format!("{q}q_proj.weight"), vec![nh * 2 * d, h], lin(h), dt);
                add(format!("{q}k_proj.weight"), vec![kvh * d, h], lin(h), dt);
                add(format!("{q}v_proj.weight"), vec![kvh * d, h], lin(h), dt);
                add(
                    format!("{q}o_proj.weight"),
                    vec![h, nh * d],
                    lin(nh * d),
                    dt,
                );
                add(format!("{q}q_norm.weight"), vec![d], gain, dt);
                add(format!("{q}k_norm.weight"), vec![d], gain, dt);
            }
        }
        let m = format!("{p}mlp.");
        add(
            format!("{m}gate_proj.weight"),
            vec![s.intermediate_size, h],
            lin(h),
            dt,
        );
        add(
            format!("{m}up_proj.weight"),
            vec![s.intermediate_size, h],
            lin(h),
            dt,
        );
        add(
            format!("{m}down_proj.weight"),
            vec![h, s.intermediate_size],
            lin(s.intermediate_size),
            dt,
        );
    }
    add(format!("{base}norm.weight"), vec![h], gain, dt);
    if !s.tie_word_embeddings {
        add("lm_head.weight".into(), vec![s.vocab_size, h], lin(h), dt);
    }
    if s.extra_ignored_tensors {
        add("mtp.fc.weight".into(), vec![h, 2 * h], lin(h), dt);
        add("mtp.norm.weight".into(), vec![h], gain, dt);
    }
    out
}

/// `n` token ids below `vocab` from a seed: deterministic synthetic prompts for tests and
/// benchmarks (see [`xorshift_ids`]).
pub fn pseudo_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    xorshift_ids(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, n, vocab)
}

/// `n` token ids below `vocab` from the xorshift64 stream that starts at `state` (nonzero).
pub fn xorshift_ids(mut state: u64, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

/// The splitmix64 step of the counter-based generator: value `i` of a tensor depends only on
/// (seed, name, i); the rotation signs of a ternary pack are drawn with it too.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn unit(x: u64) -> f64 {
    // (0, 1): never exactly 0, so ln() is finite.
    ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

pub(crate) fn draw(init: Init, key: u64, i: u64) -> f32 {
    let a = mix(key ^ mix(2 * i));
    let b = mix(key ^ mix(2 * i + 1));
    let normal = || ((-2.0 * unit(a).ln()).sqrt() * (std::f64::consts::TAU * unit(b)).cos()) as f32;
    match init {
        Init::Normal(s) => s * normal(),
        Init::OnePlus(s) => 1.0 + s * normal(),
        Init::LogUniform(lo, hi) => (lo as f64 + (hi - lo) as f64 * unit(a)).ln() as f32,
        Init::Uniform(lo, hi) => (lo as f64 + (hi - lo) as f64 * unit(a)) as f32,
    }
}

fn encode(spec: &Spec, seed: u64) -> Vec<u8> {
    let n: usize = spec.shape.iter().product();
    let key = mix(seed ^ name_hash(&spec.name));
    let per = spec.dtype.size();
    let mut bytes = vec![0u8; n * per];
    bytes
        .par_chunks_mut(per * 65536)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (j, out) in chunk.chunks_exact_mut(per).enumerate() {
                let v = draw(spec.init, key, (c * 65536 + j) as u64);
                match spec.dtype {
                    DType::F32 => out.copy_from_slice(&v.to_le_bytes()),
                    DType::BF16 => {
                        out.copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes())
                    }
                    DType::F16 => {
                        out.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())
                    }
                    DType::Q8_0 | DType::PQ2_0 | DType::PTQ1_0 | DType::Q8_0G | DType::PQ2_0G => {
                        unreachable!("write_checkpoint refuses block types")
                    }
                }
            }
        });
    bytes
}

/// Writes `config.json` and `model.safetensors` for `spec` into `dir` (created if needed).
/// `progress` is called with (tensors done, tensors total).
pub fn write_checkpoint(
    spec: &SynthSpec,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(), ModelError> {
    let io = |e: std::io::Error| ModelError::Io(format!("{}: {e}", dir.display()));
    if !spec.dtype.is_float() {
        return Err(ModelError::Input(format!(
            "synthetic checkpoints are written as f32, bf16 or f16, not {}",
            spec.dtype
        )));
    }
    std::fs::create_dir_all(dir).map_err(io)?;
    let cfg = serde_json::to_string_pretty(&config_json(spec))
        .map_err(|e| ModelError::Io(e.to_string()))?;
    std::fs::write(dir.join("config.json"), cfg + "\n").map_err(io)?;
    let specs = tensor_specs(spec);
    let seed = spec.seed.to_string();
    let header = safetensors_header(
        specs
            .iter()
            .map(|s| (s.name.as_str(), s.dtype, s.shape.as_slice())),
        &[
            ("format", "pt"),
            ("generator", "onepass synth"),
            ("seed", &seed),
        ],
    );
    let path = dir.join("model.safetensors");
    let mut w = BufWriter::new(File::create(&path).map_err(io)?);
    w.write_all(&header).map_err(io)?;
    for (i, s) in specs.iter().enumerate() {
        w.write_all(&encode(s, spec.seed)).map_err(io)?;
        progress(i + 1, specs.len());
    }
    w.flush().map_err(io)?;
    Ok(())
}

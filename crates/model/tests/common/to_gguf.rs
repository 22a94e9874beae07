//! A test-side Hugging Face → GGUF converter that applies the changes llama.cpp's converter
//! (`conversion/qwen.py`: `Qwen3NextModel`, `_LinearAttentionVReorderBase`) makes to a Qwen3.5 checkpoint,
//! written from its description and not from the loader, so the loader's undoing of each is tested:
//! GGUF names, `w + 1` on every `*norm.weight` except `linear_attn.norm.weight`, value heads tiled when key and
//! value heads differ (V rows of in_proj_qkv, rows of in_proj_z / in_proj_a / in_proj_b / A_log / dt_bias,
//! V channels of conv1d, input columns of out_proj), `A_log → -exp(A_log)`, `dt_bias → ssm_dt.bias`, conv1d
//! squeezed. `Mutation` leaves one of them out (or adds a wrong one), to show that each matters.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use onepass_formats::{write_gguf, Checkpoint, GgmlType, GgufArray, GgufValue, GgufWriteTensor};
use onepass_model::{LayerKind, ModelConfig, ModelForm};

/// One convention left out, or a wrong one added.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mutation {
    None,
    /// No `+ 1` on norms whose HF name ends with this.
    NoNormOffset(&'static str),
    /// `+ 1` on the Gated DeltaNet norm too.
    SsmNormOffset,
    /// Value heads left grouped everywhere.
    NoVTiling,
    /// Value heads tiled except out_proj's columns.
    NoOutColumnTiling,
    /// A_log stored as is.
    NoNegExp,
}

pub struct Opts {
    /// Type of the matrices (F32, F16, BF16 or Q8_0); 1-D tensors and conv1d are F32.
    pub matrices: GgmlType,
    /// Store in_proj_a / in_proj_b (ssm_alpha / ssm_beta) as BF16, as the Bonsai packs do.
    pub ab_bf16: bool,
    pub mutation: Mutation,
    /// Extra metadata (e.g. `prism.hadamard.*`).
    pub extra: Vec<(String, GgufValue)>,
    /// Tensors written from given ternary blocks (PQ2_0 or PTQ1_0, rows in HF order) instead of the checkpoint's
    /// values, by HF name; their rows are reordered like any other tensor's.
    pub ternary: HashMap<String, (GgmlType, Vec<u8>)>,
    /// Leave out_proj's input columns grouped (a Bonsai pack's `gdn_v_grouped`).
    pub grouped_out_columns: bool,
}

impl Opts {
    pub fn new(matrices: GgmlType) -> Self {
        Opts {
            matrices,
            ab_bf16: false,
            mutation: Mutation::None,
            extra: Vec::new(),
            ternary: HashMap::new(),
            grouped_out_columns: false,
        }
    }
}

/// The GGUF name of a per-layer HF role (independent of the loader's table).
fn gguf_role(role: &str) -> &'static str {
    match role {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        other => panic!("no GGUF name for {other}"),
    }
}

/// `perm[i]` = the grouped index stored at tiled position `i` (heads of `per` values).
fn tiled_perm(hk: usize, r: usize, per: usize) -> Vec<usize> {
    let mut p = Vec::with_capacity(hk * r * per);
    for j in 0..r {
        for g in 0..hk {
            let head = g * r + j;
            p.extend(head * per..(head + 1) * per);
        }
    }
    p
}

/// Round-to-nearest Q8_0 as ggml's reference quantiser: `d = max|x| / 127`, `q = round(x / d)`.
fn quantize_q8_0(v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut raw = Vec::new();
    let mut deq = Vec::new();
    for block in v.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let dh = f16::from_f32(d);
        raw.extend_from_slice(&dh.to_le_bytes());
        for x in block {
            let q = (x * id).round() as i8;
            raw.push(q as u8);
            deq.push(f32::from(q) * dh.to_f32());
        }
    }
    (raw, deq)
}

/// What was written: the GGUF bytes are in the file; `dequantized` holds, under HF names and in HF layout,
/// the values of every Q8_0 tensor as the file stores them (the float model they stand for).
pub struct Written {
    pub dequantized: HashMap<String, Vec<f32>>,
}

/// The qwen35 metadata llama.cpp writes for a config.
pub fn metadata(c: &ModelConfig, interval: usize) -> Vec<(String, GgufValue)> {
    let t = &c.text;
    let k = |s: &str| format!("qwen35.{s}");
    let u = |x: usize| GgufValue::U32(x as u32);
    let mut m = vec![
        (
            "general.architecture".into(),
            GgufValue::String("qwen35".into()),
        ),
        ("general.name".into(), GgufValue::String("synthetic".into())),
        (k("block_count"), u(t.num_hidden_layers)),
        (k("context_length"), u(t.max_position_embeddings)),
        (k("embedding_length"), u(t.hidden_size)),
        (k("feed_forward_length"), u(t.intermediate_size)),
        (k("attention.head_count"), u(t.num_attention_heads)),
        (k("attention.head_count_kv"), u(t.num_key_value_heads)),
        (k("rope.freq_base"), GgufValue::F32(t.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(t.rms_norm_eps),
        ),
        (k("attention.key_length"), u(t.head_dim)),
        (k("attention.value_length"), u(t.head_dim)),
        (k("ssm.conv_kernel"), u(t.linear_conv_kernel_dim)),
        (k("ssm.state_size"), u(t.linear_key_head_dim)),
        (k("ssm.group_count"), u(t.linear_num_key_heads)),
        (k("ssm.time_step_rank"), u(t.linear_num_value_heads)),
        (
            k("ssm.inner_size"),
            u(t.linear_value_head_dim * t.linear_num_value_heads),
        ),
        (k("full_attention_interval"), u(interval)),
        (k("rope.dimension_count"), u(t.rotary_dim())),
    ];
    if let Some(sec) = &t.mrope_section {
        let mut s: Vec<i32> = sec.iter().map(|&x| x as i32).collect();
        s.resize(4, 0);
        m.push((
            k("rope.dimension_sections"),
            GgufValue::Array(GgufArray::I32(s)),
        ));
    }
    m
}

/// Converts the synthetic (or any text/composite) checkpoint in `dir` to a GGUF file at `out`.
pub fn convert(dir: &Path, out: &Path, opts: &Opts) -> Written {
    let config = ModelConfig::from_dir(dir).expect("config");
    let ck = Checkpoint::open_dir(dir).expect("checkpoint");
    let t = &config.text;
    // llama.cpp can only describe periodic layer patterns.
    let interval = t
        .layer_types
        .iter()
        .position(|k| *k == LayerKind::Attention)
        .map_or(t.num_hidden_layers + 1, |i| i + 1);
    for (i, k) in t.layer_types.iter().enumerate() {
        assert_eq!(
            *k == LayerKind::Attention,
            (i + 1) % interval == 0,
            "layer pattern is not periodic"
        );
    }
    let prefix = match config.form {
        ModelForm::Text => "model.",
        ModelForm::Composite => "model.language_model.",
    };
    let (hk, hv, dk, dv) = (
        t.linear_num_key_heads,
        t.linear_num_value_heads,
        t.linear_key_head_dim,
        t.linear_value_head_dim,
    );
    let r = hv / hk;
    let tile = r > 1 && opts.mutation != Mutation::NoVTiling;
    let mut names: Vec<&str> = ck
        .names()
        .filter(|n| n.starts_with(prefix) || *n == "lm_head.weight")
        .collect();
    names.sort();
    let mut out_tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut dequantized = HashMap::new();
    for hf in names {
        let tensor = ck.get(hf).expect("tensor");
        let mut v = tensor.to_f32_vec();
        let mut shape = tensor.shape().to_vec();
        let rel = hf.strip_prefix(prefix).unwrap_or(hf);
        let (name, role) = if hf == "lm_head.weight" {
            ("output.weight".to_string(), "")
        } else if rel == "embed_tokens.weight" {
            ("token_embd.weight".to_string(), "")
        } else if rel == "norm.weight" {
            ("output_norm.weight".to_string(), "final_norm.weight")
        } else {
            let rest = rel.strip_prefix("layers.").expect("a layer tensor");
            let (n, role) = rest.split_once('.').expect("layer.role");
            (format!("blk.{n}.{}", gguf_role(role)), role)
        };
        // The inverse of the tiling, to give the dequantized values back in HF layout.
        let mut untile: Option<Vec<usize>> = None;
        if tile {
            let rows_perm = |start: usize, head: usize, rows: usize, cols: usize| {
                let p = tiled_perm(hk, r, head);
                let mut idx: Vec<usize> = (0..rows * cols).collect();
                for (i, &src) in p.iter().enumerate() {
                    for c in 0..cols {
                        idx[(start + i) * cols + c] = (start + src) * cols + c;
                    }
                }
                idx
            };
            let perm: Option<Vec<usize>> = match role {
                "linear_attn.in_proj_qkv.weight" | "linear_attn.conv1d.weight" => {
                    let cols = v.len() / shape[0];
                    Some(rows_perm(2 * hk * dk, dv, shape[0], cols))
                }
                "linear_attn.in_proj_z.weight" => Some(rows_perm(0, dv, shape[0], shape[1])),
                "linear_attn.in_proj_a.weight" | "linear_attn.in_proj_b.weight" => {
                    Some(rows_perm(0, 1, shape[0], shape[1]))
                }
                "linear_attn.A_log" | "linear_attn.dt_bias" => Some(rows_perm(0, 1, shape[0], 1)),
                "linear_attn.out_proj.weight"
                    if opts.mutation != Mutation::NoOutColumnTiling
                        && !opts.grouped_out_columns =>
                {
                    let (rows, cols) = (shape[0], shape[1]);
                    let p = tiled_perm(hk, r, dv);
                    let mut idx = Vec::with_capacity(rows * cols);
                    for row in 0..rows {
                        idx.extend(p.iter().map(|&c| row * cols + c));
                    }
                    Some(idx)
                }
                _ => None,
            };
            if let Some(p) = perm {
                v = p.iter().map(|&i| v[i]).collect();
                untile = Some(p);
            }
        }
        let norm_offset = match role {
            "linear_attn.norm.weight" => opts.mutation == Mutation::SsmNormOffset,
            r if r.ends_with("norm.weight") => {
                !matches!(opts.mutation, Mutation::NoNormOffset(s) if r.ends_with(s))
            }
            _ => false,
        };
        if norm_offset {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        if role == "linear_attn.A_log" && opts.mutation != Mutation::NoNegExp {
            v.iter_mut().for_each(|x| *x = -x.exp());
        }
        if role == "linear_attn.conv1d.weight" {
            shape = vec![shape[0], shape[2]];
        }
        if let Some((ty, raw)) = opts.ternary.get(hf) {
            let rows = shape[0];
            let row_bytes = raw.len() / rows;
            let cols = v.len() / rows;
            let mut bytes = Vec::with_capacity(raw.len());
            for row in 0..rows {
                // The source row of stored row `row` (identity unless the rows were tiled).
                let src = untile.as_ref().map_or(row, |p| {
                    assert!(
                        p[row * cols] % cols == 0,
                        "{hf}: ternary columns cannot be permuted"
                    );
                    p[row * cols] / cols
                });
                bytes.extend_from_slice(&raw[src * row_bytes..(src + 1) * row_bytes]);
            }
            let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            out_tensors.push((name, *ty, ne, bytes));
            continue;
        }
        let matrix = shape.len() == 2 && role != "linear_attn.conv1d.weight";
        let ty = if !matrix {
            GgmlType::F32
        } else if opts.ab_bf16
            && matches!(
                role,
                "linear_attn.in_proj_a.weight" | "linear_attn.in_proj_b.weight"
            )
        {
            GgmlType::BF16
        } else {
            opts.matrices
        };
        let bytes: Vec<u8> = match ty {
            GgmlType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            GgmlType::F16 => v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            GgmlType::BF16 => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
            GgmlType::Q8_0 => {
                let (raw, deq) = quantize_q8_0(&v);
                let mut hf_layout = deq.clone();
                if let Some(p) = &untile {
                    for (i, &src) in p.iter().enumerate() {
                        hf_layout[src] = deq[i];
                    }
                }
                dequantized.insert(hf.to_string(), hf_layout);
                raw
            }
            other => panic!("the test converter does not write {other}"),
        };
        let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        out_tensors.push((name, ty, ne, bytes));
    }
    let mut meta = metadata(&config, interval);
    meta.extend(opts.extra.iter().cloned());
    let tensors: Vec<GgufWriteTensor> = out_tensors
        .iter()
        .map(|(name, ty, ne, data)| GgufWriteTensor {
            name,
            ggml_type: *ty,
            ne: ne.clone(),
            data,
        })
        .collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(out).expect("create"));
    write_gguf(&mut f, &meta, &tensors).expect("write gguf");
    Written { dequantized }
}

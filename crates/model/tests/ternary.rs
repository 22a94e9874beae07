//! Ternary Bonsai-style packs: a GGUF file whose linears are random ternary matrices `W'` (PQ2_0 and PTQ1_0
//! blocks) folded with the blockwise Hadamard rotation, run against the float model that has `W = W'·R` (and the
//! embedding `E = Z·R` for the stored rows `Z`), since `W'·(R·x) = (W'·R)·x`. The float reference is built here
//! with this file's own f64 transform, not the model's.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::to_gguf::{convert, Opts};
use common::{logits_split, worst};
use half::f16;
use onepass_formats::{ptq1_0_to_pq2_0, Checkpoint, GgmlType, GgufArray, GgufValue};
use onepass_kernels::TernaryPath;
use onepass_model::gguf::gguf_name;
use onepass_model::synth::{preset, pseudo_ids, write_checkpoint};
use onepass_model::{LayerKind, Model, ModelConfig};
use onepass_tensor::{DType, Tensor};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random ternary codes [n·k] (0, 1, 2 for −d, 0, +d) and one scale per 128.
fn ternary(rng: &mut Rng, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let codes = (0..n * k).map(|_| (rng.next() % 3) as u8).collect();
    let base = 1.6 / (k as f32).sqrt();
    let scales = (0..n * k / 128)
        .map(|_| f16::from_f32(base * (0.6 + (rng.next() % 1000) as f32 / 1250.0)).to_f32())
        .collect();
    (codes, scales)
}

fn pack_pq2_0(codes: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for (block, d) in codes.chunks(128).zip(scales) {
        out.extend_from_slice(&f16::from_f32(*d).to_le_bytes());
        for q in block.chunks(4) {
            out.push(q[0] | q[1] << 2 | q[2] << 4 | q[3] << 6);
        }
    }
    out
}

/// A byte of base-3 digits, the first most significant: ceil(256·v / 243).
fn trit_byte(t: &[u8]) -> u8 {
    let v = t.iter().fold(0u32, |a, &x| a * 3 + u32::from(x));
    let v = v * 3u32.pow(5 - t.len() as u32);
    (v * 256).div_ceil(243) as u8
}

/// PTQ1_0 as PrismML lays it out (docs/formats.md): 16 + 8 five-digit bytes, 2 four-digit bytes, the scale last.
fn pack_ptq1_0(codes: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for (c, d) in codes.chunks(128).zip(scales) {
        for m in 0..16 {
            out.push(trit_byte(
                &(0..5).map(|n| c[16 * n + m]).collect::<Vec<_>>(),
            ));
        }
        for m in 0..8 {
            out.push(trit_byte(
                &(0..5).map(|n| c[80 + 8 * n + m]).collect::<Vec<_>>(),
            ));
        }
        for h in 0..2 {
            out.push(trit_byte(
                &(0..4).map(|n| c[120 + 2 * n + h]).collect::<Vec<_>>(),
            ));
        }
        out.extend_from_slice(&f16::from_f32(*d).to_le_bytes());
    }
    out
}

/// Each row of `w` [N, K] times R = H·S/32 (per 1024-block, H the Sylvester Hadamard matrix): the row vector
/// `w·R = ((H·w) / 32) ⊙ s` (H is symmetric), in f64 with a recursive butterfly.
fn times_r(w: &mut [f32], signs: &[f32]) {
    let k = signs.len();
    for row in w.chunks_exact_mut(k) {
        let mut v: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
        for block in v.chunks_exact_mut(1024) {
            let mut h = 1;
            while h < 1024 {
                for i in (0..1024).step_by(2 * h) {
                    for j in i..i + h {
                        let (a, b) = (block[j], block[j + h]);
                        block[j] = a + b;
                        block[j + h] = a - b;
                    }
                }
                h *= 2;
            }
        }
        for ((o, x), s) in row.iter_mut().zip(&v).zip(signs) {
            *o = (x / 32.0 * f64::from(*s)) as f32;
        }
    }
}

fn signs(rng: &mut Rng, k: usize) -> Vec<f32> {
    (0..k)
        .map(|_| {
            if rng.next().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        })
        .collect()
}

/// A Qwen3.5 shape whose every input width is whole 1024-blocks: hidden 1024, MLP 2048 (two blocks for
/// down_proj), attention 4 heads × 256, Gated DeltaNet 2 key heads / 4 value heads of 256 (value heads tiled
/// in the file). Layers: GDN, attention.
fn spec() -> onepass_model::synth::SynthSpec {
    let mut s = preset("tiny-gva").expect("preset");
    s.vocab_size = 384;
    s.hidden_size = 1024;
    s.intermediate_size = 2048;
    s.layer_types = vec![LayerKind::GatedDeltaNet, LayerKind::Attention];
    s.num_attention_heads = 4;
    s.num_key_value_heads = 2;
    s.head_dim = 256;
    s.partial_rotary_factor = 0.25;
    s.linear_num_key_heads = 2;
    s.linear_num_value_heads = 4;
    s.linear_key_head_dim = 128;
    s.linear_value_head_dim = 256;
    s.seed = 11;
    s
}

/// A written pack: the float folder it came from and the pack file in `dir`, the float reference, and what the
/// pack holds (the ternary codes and scales by HF name, the sign vectors, the folded and inverse HF names).
struct Pack {
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    reference: Model,
    ternary: HashMap<String, (Vec<u8>, Vec<f32>)>,
    signs: Vec<(usize, Vec<f32>)>,
    folded: Vec<String>,
    inverse: Vec<String>,
}

/// Writes the pack (`ptq`: which HF names get PTQ1_0 blocks) and returns (its path, the float reference).
fn pack(ptq: &[&str], tied: bool) -> (tempfile::TempDir, std::path::PathBuf, Model) {
    let p = pack_full(ptq, tied);
    (p.dir, p.path, p.reference)
}

fn pack_full(ptq: &[&str], tied: bool) -> Pack {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = spec();
    s.tie_word_embeddings = tied;
    write_checkpoint(&s, dir.path(), &mut |_, _| {}).expect("synth");
    let config = ModelConfig::from_dir(dir.path()).expect("config");
    let ck = Checkpoint::open_dir(dir.path()).expect("ck");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let widths = [1024usize, 2048];
    let sign: HashMap<usize, Vec<f32>> = widths.iter().map(|&k| (k, signs(&mut rng, k))).collect();
    let mut reference: HashMap<String, Tensor> = ck
        .names()
        .map(|n| (n.to_string(), ck.get(n).expect("t").clone()))
        .collect();
    let mut opts = Opts::new(GgmlType::F32);
    opts.ab_bf16 = true;
    opts.grouped_out_columns = true;
    let (mut folded, mut inverse) = (Vec::new(), Vec::new());
    let (mut folded_hf, mut inverse_hf) = (Vec::new(), Vec::new());
    let mut held = HashMap::new();
    let mut names: Vec<String> = reference.keys().cloned().collect();
    names.sort();
    for name in names {
        let t = &reference[&name];
        let is_linear = name.ends_with("_proj.weight")
            && !name.ends_with("in_proj_a.weight")
            && !name.ends_with("in_proj_b.weight");
        let is_embed = name.ends_with("embed_tokens.weight");
        if !(is_linear || is_embed || name == "lm_head.weight") {
            if name.ends_with("in_proj_a.weight") || name.ends_with("in_proj_b.weight") {
                // Stored BF16 in the pack; the reference holds the same rounded values.
                let v = t.to_f32_vec();
                reference.insert(
                    name.clone(),
                    Tensor::from_f32_as_bf16(&name, t.shape().to_vec(), &v),
                );
            }
            continue;
        }
        let (n, k) = (t.shape()[0], t.shape()[1]);
        let (codes, scales) = ternary(&mut rng, n, k);
        let ty = if ptq.contains(&name.as_str()) {
            GgmlType::PTQ1_0
        } else {
            GgmlType::PQ2_0
        };
        let raw = match ty {
            GgmlType::PTQ1_0 => {
                let p = pack_ptq1_0(&codes, &scales);
                // The encoder above and the reader's transcoder agree.
                let mut words = vec![0u8; n * k / 128 * 34];
                ptq1_0_to_pq2_0(&p, &mut words).expect("transcode");
                assert_eq!(words, pack_pq2_0(&codes, &scales));
                p
            }
            _ => pack_pq2_0(&codes, &scales),
        };
        // W' (or Z) dequantized, then each row times R: the float model's weight.
        let mut w: Vec<f32> = codes
            .iter()
            .enumerate()
            .map(|(i, &c)| (f32::from(c) - 1.0) * scales[i / 128])
            .collect();
        times_r(&mut w, &sign[&k]);
        reference.insert(name.clone(), Tensor::from_f32(&name, vec![n, k], &w));
        opts.ternary.insert(name.clone(), (ty, raw));
        let g = gguf_name(&name).expect("gguf name");
        if is_embed {
            inverse.push(g);
            inverse_hf.push(name.clone());
        } else {
            folded.push(g);
            folded_hf.push(name.clone());
        }
        held.insert(name.clone(), (codes, scales));
    }
    let key = |k: &str| format!("prism.hadamard.{k}");
    let s = |v: &str| GgufValue::String(v.into());
    let mut values = Vec::new();
    for k in widths {
        values.extend(sign[&k].iter().map(|&x| x as i8));
    }
    opts.extra = vec![
        (key("version"), GgufValue::U32(1)),
        (key("block_size"), GgufValue::U32(1024)),
        (key("transform"), s("normalized-sylvester-walsh-hadamard")),
        (key("axis"), s("input-last-dimension")),
        (key("sign_mode"), s("explicit")),
        (
            key("sign_widths"),
            GgufValue::Array(GgufArray::U32(widths.iter().map(|&k| k as u32).collect())),
        ),
        (key("sign_values"), GgufValue::Array(GgufArray::I8(values))),
        (
            key("weight_names"),
            GgufValue::Array(GgufArray::String(folded)),
        ),
        (
            key("inverse_weight_names"),
            GgufValue::Array(GgufArray::String(inverse)),
        ),
        (key("gdn_v_grouped"), GgufValue::Bool(true)),
    ];
    let path = dir.path().join("pack.gguf");
    convert(dir.path(), &path, &opts);
    let reference = Model::from_checkpoint(
        config,
        Arc::new(Checkpoint::from_tensors(reference, vec![], 0)),
    )
    .expect("reference");
    Pack {
        dir,
        path,
        reference,
        ternary: held,
        signs: widths.iter().map(|&k| (k, sign[&k].clone())).collect(),
        folded: folded_hf,
        inverse: inverse_hf,
    }
}

/// Logits of a 7-token prompt run as 6 tokens, then one more.
fn logits(m: &Model) -> Vec<f32> {
    logits_split(m, &pseudo_ids(7, m.vocab_size(), 3), &[6])
}

#[test]
fn a_ternary_pack_gives_the_float_model_with_the_rotation_folded_in() {
    let ptq = [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.embed_tokens.weight",
        // Value-head rows reordered at load: whole 28-byte blocks move.
        "model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.0.linear_attn.in_proj_z.weight",
    ];
    let (_dir, path, reference) = pack(&ptq, false);
    let m = Model::load(&path).expect("pack");
    assert!(m.is_rotated());
    assert!(m.info().weight_dtypes.contains(&DType::PQ2_0));
    assert!(m.info().weight_dtypes.contains(&DType::PTQ1_0));
    let want = logits(&reference);
    let got = logits(&m);
    let d = worst(&got, &want, m.vocab_size());
    eprintln!("ternary pack vs float model with W = W'R: max rel {d:.2e}");
    assert!(d <= 1e-3, "{d}");
    // The rotation matters: the same pack read without it is far off.
    let plain = dir_without_rotation(&path);
    let plain = Model::load(plain.path()).expect("plain");
    assert!(worst(&got, &logits(&plain), m.vocab_size()) > 1e-2);
    // The label-row readout of the folded head agrees with the full head.
    let mut st = m.new_state();
    let h = m.forward(&mut st, &[5, 9]).expect("forward");
    let last = &h[m.hidden_size()..];
    let full = m.logits(last);
    let rows = [1u32, 100, 383];
    for (p, &r) in m.logits_rows(last, &rows).expect("rows").iter().zip(&rows) {
        assert!((p - full[r as usize]).abs() <= 1e-4 * (1.0 + p.abs()));
    }
    // The GPU path refuses the pack with a reason.
    assert!(m.float_only_reason().expect("refused").contains("Hadamard"));
    // Prepared for the CPU, its PQ2_0 matrices regrouped for the integer kernels: the same bound, and label rows
    // that are the full head's values to the bit.
    // (prepare_for_cpu also moves mapped weights into anonymous memory, so its count says nothing of regrouping.)
    if !onepass_kernels::runs_grouped(DType::PQ2_0) {
        eprintln!("no AVX-512 VNNI and GFNI: the pack is not regrouped, its check skipped");
        return;
    }
    let mut cpu = Model::load(&path).expect("pack");
    assert!(cpu.prepare_for_cpu() > 0);
    assert!(cpu.info().weight_dtypes.contains(&DType::PQ2_0G));
    assert!(cpu.info().weight_dtypes.contains(&DType::PTQ1_0));
    let got = logits(&cpu);
    let d = worst(&got, &want, m.vocab_size());
    eprintln!("ternary pack regrouped vs float model with W = W'R: max rel {d:.2e}");
    assert!(d <= 1e-3, "{d}");
    let mut st = cpu.new_state();
    let h = cpu.forward(&mut st, &[5, 9]).expect("forward");
    let last = &h[cpu.hidden_size()..];
    let full = cpu.logits(last);
    for (p, &r) in cpu
        .logits_rows(last, &rows)
        .expect("rows")
        .iter()
        .zip(&rows)
    {
        assert_eq!(p.to_bits(), full[r as usize].to_bits(), "row {r}");
    }
}

/// Every ternary tensor of the pack's linears, the embedding and the head.
fn all_ternary() -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(&spec(), dir.path(), &mut |_, _| {}).expect("synth");
    let ck = Checkpoint::open_dir(dir.path()).expect("ck");
    let mut v: Vec<String> = ck
        .names()
        .filter(|n| {
            (n.ends_with("_proj.weight")
                && !n.ends_with("in_proj_a.weight")
                && !n.ends_with("in_proj_b.weight"))
                || n.ends_with("embed_tokens.weight")
                || *n == "lm_head.weight"
        })
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn a_ptq1_0_pack_stays_packed_and_gives_the_pq2_0_pack_logits() {
    // The same trits and scales written once as PTQ1_0 and once as PQ2_0.
    let names = all_ternary();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_d1, ptq_path, _) = pack(&names, false);
    let (_d2, pq_path, _) = pack(&[], false);
    let ptq = Model::load(&ptq_path).expect("PTQ1_0 pack");
    let pq = Model::load(&pq_path).expect("PQ2_0 pack");
    assert!(!ptq.info().weight_dtypes.contains(&DType::PQ2_0));
    assert!(ptq.info().weight_dtypes.contains(&DType::PTQ1_0));
    let (a, b) = (logits(&ptq), logits(&pq));
    let d = worst(&a, &b, pq.vocab_size());
    eprintln!("PTQ1_0 pack vs PQ2_0 pack: max rel {d:.2e}");
    // The same values: with f32 activations the kernels run them in the same order (the same bits). The integer
    // kernels (AVX-512 VNNI) round the activations to 16 bits per block and spread each block's exact integer sum
    // over their lanes differently for the two layouts; a last-bit difference in one layer's output can move a
    // rounding step in the next layer's activations, so the packs agree within the activation rounding's error
    // (docs/ARCHITECTURE.md), not bit for bit.
    let bound = if TernaryPath::detect().rounds_activations() {
        1e-3
    } else {
        1e-6
    };
    assert!(d <= bound, "{d}");
}

#[test]
fn a_tied_ternary_pack_reads_its_head_through_the_rotated_table() {
    let (_dir, path, reference) = pack(&[], true);
    let m = Model::load(&path).expect("pack");
    let d = worst(&logits(&m), &logits(&reference), m.vocab_size());
    assert!(d <= 1e-3, "{d}");
}

/// A copy of the pack with the `prism.hadamard.*` keys dropped (the same weights read as plain PQ2_0).
fn dir_without_rotation(path: &std::path::Path) -> tempfile::TempDir {
    let f = onepass_formats::Gguf::open(path).expect("open");
    let meta: Vec<(String, GgufValue)> = f
        .metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with("prism.") && k != "general.alignment")
        .cloned()
        .collect();
    let tensors: Vec<onepass_formats::GgufWriteTensor> = f
        .tensors()
        .iter()
        .map(|t| onepass_formats::GgufWriteTensor {
            name: &t.name,
            ggml_type: t.ggml_type,
            ne: t.ne.clone(),
            data: f.tensor_data(t),
        })
        .collect();
    let out = tempfile::tempdir().expect("tempdir");
    let mut w = std::fs::File::create(out.path().join("plain.gguf")).expect("create");
    onepass_formats::write_gguf(&mut w, &meta, &tensors).expect("write");
    out
}

/// A minimal safetensors writer taking raw little-endian bytes per tensor (MLX's `U32` words included).
fn write_safetensors_raw(path: &std::path::Path, tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    std::fs::write(path, out).expect("write safetensors");
}

fn f16_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter()
        .flat_map(|x| f16::from_f32(x).to_le_bytes())
        .collect()
}

/// How [`write_mlx`] lays the folder out.
#[derive(Clone, Copy, PartialEq)]
enum MlxLayout {
    /// PrismML's pack: `model_type: prism_hadamard_qwen35` around `text_config`, mlx-vlm's
    /// `language_model.model.` / `language_model.lm_head.` names, module names in hadamard.json.
    Prism,
    /// mlx-lm's text form: the folder's own `qwen3_5_text` config, `model.` names, tensor names in hadamard.json.
    Text,
}

/// Writes the MLX affine 2-bit form of `p` into `out`, the way MLX's converters store it: per ternary linear the
/// codes as `U32 [N, K/16]` words (value j at bits 2·(j mod 16) of word j/16), f16 `scales [N, K/128]` and
/// `biases = −scales`; the five RMSNorm gains as `w + 1`; `conv1d.weight` as `[C, K, 1]`; in_proj_a/b BF16 (as the
/// GGUF pack has them); everything else as the float folder stores it; the rotation in hadamard.json.
fn write_mlx(p: &Pack, out: &std::path::Path, layout: MlxLayout, bias: impl Fn(f32) -> f32) {
    let src = p.dir.path();
    let ck = Checkpoint::open_dir(src).expect("float folder");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(cfg["model_type"], "qwen3_5_text");
    let quant = serde_json::json!({"group_size": 128, "bits": 2, "mode": "affine"});
    let cfg = match layout {
        MlxLayout::Prism => serde_json::json!({
            "model_type": "prism_hadamard_qwen35",
            "tie_word_embeddings": cfg["tie_word_embeddings"],
            "text_config": cfg,
            "quantization": quant,
        }),
        MlxLayout::Text => {
            let mut c = cfg.clone();
            c["quantization"] = quant;
            c
        }
    };
    std::fs::create_dir_all(out).expect("mkdir");
    std::fs::write(out.join("config.json"), cfg.to_string()).expect("config");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), out.join(f)).expect("copy tokenizer");
        }
    }
    let rename = |hf: &str| match layout {
        MlxLayout::Prism => match hf.strip_prefix("model.") {
            Some(rest) => format!("language_model.model.{rest}"),
            None => format!("language_model.{hf}"),
        },
        MlxLayout::Text => hf.to_string(),
    };
    let mut names: Vec<&str> = ck.names().collect();
    names.sort();
    let mut tensors = Vec::new();
    for hf in names {
        let t = ck.get(hf).expect("tensor");
        let name = rename(hf);
        if let Some((codes, scales)) = p.ternary.get(hf) {
            let (n, k) = (t.shape()[0], t.shape()[1]);
            let words: Vec<u8> = codes
                .chunks(4)
                .map(|q| q[0] | q[1] << 2 | q[2] << 4 | q[3] << 6)
                .collect();
            let base = name.strip_suffix(".weight").expect("weight");
            tensors.push((name.clone(), "U32", vec![n, k / 16], words));
            tensors.push((
                format!("{base}.scales"),
                "F16",
                vec![n, k / 128],
                f16_bytes(scales.iter().copied()),
            ));
            tensors.push((
                format!("{base}.biases"),
                "F16",
                vec![n, k / 128],
                f16_bytes(scales.iter().map(|&s| bias(s))),
            ));
            continue;
        }
        let plus_one = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "q_norm.weight",
            "k_norm.weight",
        ];
        let v = t.to_f32_vec();
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        if hf == "model.norm.weight" || plus_one.iter().any(|s| hf.ends_with(s)) {
            let w: Vec<f32> = v.iter().map(|x| x + 1.0).collect();
            tensors.push((name, "F32", t.shape().to_vec(), f32_bytes(&w)));
        } else if hf.ends_with("in_proj_a.weight") || hf.ends_with("in_proj_b.weight") {
            let b: Vec<u8> = v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect();
            tensors.push((name, "BF16", t.shape().to_vec(), b));
        } else if hf.ends_with("conv1d.weight") {
            let s = t.shape();
            tensors.push((name, "F32", vec![s[0], s[2], 1], f32_bytes(&v)));
        } else {
            tensors.push((name, t.dtype().name(), t.shape().to_vec(), t.raw().to_vec()));
        }
    }
    write_safetensors_raw(&out.join("model.safetensors"), &tensors);
    let module = |hf: &String| match layout {
        MlxLayout::Prism => rename(hf).trim_end_matches(".weight").to_string(),
        MlxLayout::Text => hf.clone(),
    };
    let mut values = Vec::new();
    for (_, s) in &p.signs {
        values.extend(s.iter().map(|&x| x as i32));
    }
    let hadamard = serde_json::json!({
        "version": 1,
        "block_size": 1024,
        "transform": "normalized-sylvester-walsh-hadamard",
        "axis": "input-last-dimension",
        "sign_mode": "explicit",
        "sign_widths": p.signs.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        "sign_values": values,
        "weight_names": p.folded.iter().map(module).collect::<Vec<_>>(),
        "inverse_weight_names": p.inverse.iter().map(module).collect::<Vec<_>>(),
        "gdn_v_grouped": true,
    });
    std::fs::write(out.join("hadamard.json"), hadamard.to_string()).expect("hadamard.json");
}

#[test]
fn an_mlx_pack_gives_the_logits_of_the_same_pack_as_gguf_pq2_0() {
    let p = pack_full(&[], false);
    let gguf = Model::load(&p.path).expect("GGUF pack");
    let want = logits(&gguf);
    for layout in [MlxLayout::Prism, MlxLayout::Text] {
        let out = tempfile::tempdir().expect("tempdir");
        write_mlx(&p, out.path(), layout, |s| -s);
        let m = Model::load(out.path()).expect("MLX pack");
        assert!(m.is_rotated());
        assert_eq!(
            m.info()
                .weight_dtypes
                .iter()
                .filter(|d| !d.is_float())
                .collect::<Vec<_>>(),
            [&DType::PQ2_0]
        );
        let d = worst(&logits(&m), &want, m.vocab_size());
        eprintln!(
            "MLX pack ({}) vs GGUF PQ2_0 pack: max rel {d:.2e}",
            if layout == MlxLayout::Prism {
                "prism"
            } else {
                "text"
            }
        );
        // The same codes and scales run on the same kernels: equal up to rounding (A_log takes a round trip
        // through −exp(A_log) in the GGUF file; here that is exact too and the logits are the same bits).
        assert!(d <= 1e-5, "{d}");
        // And it is the float model with the rotation folded in, as the GGUF pack is.
        let r = worst(&logits(&m), &logits(&p.reference), m.vocab_size());
        assert!(r <= 1e-3, "{r}");
    }
}

#[test]
fn an_mlx_pack_that_is_not_exactly_ternary_or_lacks_its_rotation_is_refused() {
    let p = pack_full(&[], false);
    let out = tempfile::tempdir().expect("tempdir");
    // Biases 0.1 % off −scale: the values are no longer −s, 0, +s.
    write_mlx(&p, out.path(), MlxLayout::Prism, |s| -s * 1.001);
    let e = Model::load(out.path()).err().expect("refused").to_string();
    assert!(
        e.contains("biases") && e.contains("not minus the scale"),
        "{e}"
    );
    // The rotation's file removed: a rotated pack must not run as a plain model.
    write_mlx(&p, out.path(), MlxLayout::Prism, |s| -s);
    std::fs::remove_file(out.path().join("hadamard.json")).expect("rm");
    let e = Model::load(out.path()).err().expect("refused").to_string();
    assert!(e.contains("hadamard.json"), "{e}");
    // Another bit width.
    write_mlx(&p, out.path(), MlxLayout::Text, |s| -s);
    let cfg = std::fs::read_to_string(out.path().join("config.json")).expect("config");
    std::fs::write(
        out.path().join("config.json"),
        cfg.replace("\"bits\":2", "\"bits\":4"),
    )
    .expect("write");
    let e = Model::load(out.path()).err().expect("refused").to_string();
    assert!(e.contains("bits 4"), "{e}");
}

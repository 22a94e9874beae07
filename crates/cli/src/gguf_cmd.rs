//! `onepass convert` (a model folder to a qwen35 GGUF file), `onepass info FILE.gguf`, and the
//! GGUF side of `onepass synth`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use onepass_formats::hadamard::HadamardMeta;
use onepass_formats::{Gguf, GgufArray, GgufValue};
use onepass_model::convert::{self, OutType, TokenizerFiles};
use onepass_model::synth::SynthSpec;
use serde_json::json;

#[derive(Args)]
pub struct ConvertArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json), or a Hub repo id
    /// ORG/NAME[@REVISION] already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// f16, bf16 or q8_0 (as llama.cpp's converter writes them), or a ternary pack: pq2_0
    /// (2.125 bits per weight) or ptq1_0 (1.75), with the weights rotated blockwise.
    #[arg(long = "type", value_name = "TYPE")]
    ty: String,
    /// Seed of the rotation's sign vectors (ternary packs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl ConvertArgs {
    pub fn model(&self) -> &str {
        &self.model
    }
}

pub fn parse_type(s: &str) -> Result<OutType> {
    OutType::parse(s)
        .with_context(|| format!("unknown type {s:?}; use f16, bf16, q8_0, pq2_0 or ptq1_0"))
}

fn progress_printer(what: String) -> impl FnMut(usize, usize, u64, u64) {
    let mut last = Instant::now();
    move |done, total, bytes, total_bytes| {
        if last.elapsed().as_secs_f64() > 2.0 || done == total {
            eprintln!(
                "{what}: {done}/{total} tensors, {:.2}/{:.2} GB",
                bytes as f64 / 1e9,
                total_bytes as f64 / 1e9
            );
            last = Instant::now();
        }
    }
}

fn check_out(out: &Path) -> Result<()> {
    if out.is_dir() {
        bail!(
            "--out {}: this is a folder; give the path of the .gguf file to write",
            out.display()
        );
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            bail!(
                "--out {}: the folder {} does not exist",
                out.display(),
                parent.display()
            );
        }
    }
    Ok(())
}

pub fn convert_cmd(a: ConvertArgs, dir: &Path) -> Result<()> {
    let ty = parse_type(&a.ty)?;
    check_out(&a.out)?;
    let t0 = Instant::now();
    let mut progress = progress_printer(format!("convert {}", a.ty));
    let plan = convert::convert(
        convert::Input::Folder(dir),
        &a.out,
        ty,
        a.seed,
        &mut progress,
    )
    .with_context(|| format!("converting {}", dir.display()))?;
    eprintln!(
        "wrote {} ({} tensors, {:.2} GB) in {:.1}s",
        a.out.display(),
        plan.jobs.len(),
        plan.tensor_bytes() as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `onepass synth --format TYPE --out FILE.gguf`.
pub fn synth_gguf(
    spec: &SynthSpec,
    preset: &str,
    format: &str,
    tokenizer: &TokenizerFiles,
    out: &Path,
    sign_seed: u64,
) -> Result<()> {
    let ty = parse_type(format)?;
    check_out(out)?;
    let t0 = Instant::now();
    let mut progress = progress_printer(format!("synth {preset} {format}"));
    let input = convert::Input::Synth {
        spec,
        name: preset,
        tokenizer,
    };
    let plan = convert::convert(input, out, ty, sign_seed, &mut progress)?;
    eprintln!(
        "wrote {} ({} tensors, {:.2} GB) in {:.1}s",
        out.display(),
        plan.jobs.len(),
        plan.tensor_bytes() as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} G", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

fn value_text(v: &GgufValue) -> String {
    match v {
        GgufValue::String(s) if s.len() > 60 => format!("<{} chars>", s.chars().count()),
        GgufValue::String(s) => format!("{s:?}"),
        GgufValue::Array(a) => match a {
            GgufArray::String(_) | GgufArray::Array(_) => {
                format!("[{} × {}]", a.len(), a.element_type_name())
            }
            _ if a.len() <= 8 => match (a.to_i128_vec(), a.to_f64_vec()) {
                (Some(v), _) => format!("{v:?}"),
                (_, Some(v)) => format!("{v:?}"),
                _ => format!("[{} × {}]", a.len(), a.element_type_name()),
            },
            _ => format!("[{} × {}]", a.len(), a.element_type_name()),
        },
        GgufValue::F32(x) => x.to_string(),
        other => match (other.as_i128(), other.as_f64(), other.as_bool()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(f), _) => f.to_string(),
            (_, _, Some(b)) => b.to_string(),
            _ => other.type_name(),
        },
    }
}

fn json_value(v: &GgufValue) -> serde_json::Value {
    match v {
        GgufValue::String(s) => json!(s),
        GgufValue::Bool(b) => json!(b),
        GgufValue::F32(x) => json!(x),
        GgufValue::Array(a) if a.len() > 64 => {
            json!({"array": a.element_type_name(), "len": a.len()})
        }
        GgufValue::Array(a) => match (a.as_strings(), a.to_i128_vec(), a.to_f64_vec()) {
            (Some(s), _, _) => json!(s),
            (_, Some(i), _) => json!(i.iter().map(|&x| x as f64).collect::<Vec<_>>()),
            (_, _, Some(f)) => json!(f),
            _ => json!({"array": a.element_type_name(), "len": a.len()}),
        },
        other => match (other.as_i128(), other.as_f64()) {
            (Some(i), _) => json!(i as f64),
            (_, Some(f)) => json!(f),
            _ => json!(null),
        },
    }
}

/// `onepass info FILE.gguf`: what the file holds, without loading the model.
pub fn gguf_info(path: &Path, as_json: bool) -> Result<()> {
    let file = Gguf::open(path).with_context(|| format!("reading {}", path.display()))?;
    let arch = file
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("(none)")
        .to_string();
    let hparams: Vec<(&str, &GgufValue)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{arch}.")))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    // type -> (tensors, values, bytes)
    let mut by_type: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    let (mut values, mut bytes) = (0u64, 0u64);
    for t in file.tensors() {
        let e = by_type.entry(t.ggml_type.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.numel();
        e.2 += t.nbytes;
        values += t.numel();
        bytes += t.nbytes;
    }
    let rotation = HadamardMeta::from_gguf(&file);
    let tok = |k: &str| file.get(&format!("tokenizer.ggml.{k}"));
    if as_json {
        let rot = match &rotation {
            Ok(None) => json!(null),
            Ok(Some(m)) => json!({
                "block_size": 1024,
                "sign_widths": m.signs.keys().collect::<Vec<_>>(),
                "negative_signs": m.signs.values().map(|s| s.iter().filter(|&&v| v < 0.0).count()).collect::<Vec<_>>(),
                "weight_names": m.weight_names.len(),
                "inverse_weight_names": m.inverse_weight_names.iter().collect::<Vec<_>>(),
                "gdn_v_grouped": m.gdn_v_grouped,
            }),
            Err(e) => json!({"error": e.to_string()}),
        };
        let out = json!({
            "file": path.display().to_string(),
            "version": file.version(),
            "file_bytes": file.file_len(),
            "architecture": arch,
            "name": file.get("general.name").and_then(GgufValue::as_str),
            "file_type": file.get("general.file_type").and_then(GgufValue::as_i128).map(|v| v as i64),
            "hparams": hparams.iter().map(|(k, v)| ((*k).to_string(), json_value(v))).collect::<serde_json::Map<_, _>>(),
            "tokenizer": {
                "model": tok("model").and_then(GgufValue::as_str),
                "pre": tok("pre").and_then(GgufValue::as_str),
                "tokens": tok("tokens").and_then(GgufValue::as_array).map(GgufArray::len),
                "merges": tok("merges").and_then(GgufValue::as_array).map(GgufArray::len),
                "chat_template": file.get("tokenizer.chat_template").is_some(),
            },
            "tensors": file.tensors().len(),
            "weights": values,
            "tensor_bytes": bytes,
            "bits_per_weight": if values > 0 { bytes as f64 * 8.0 / values as f64 } else { 0.0 },
            "types": by_type.iter().map(|(k, (n, v, b))| (k.clone(), json!({
                "tensors": n, "weights": v, "bytes": b,
                "bits_per_weight": if *v > 0 { *b as f64 * 8.0 / *v as f64 } else { 0.0 },
            }))).collect::<serde_json::Map<_, _>>(),
            "rotation": rot,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", path.display());
        println!(
            "  GGUF v{}, {} ({} bytes), alignment {}",
            file.version(),
            size(file.file_len()),
            file.file_len(),
            file.alignment()
        );
        println!("  architecture  {arch}");
        for k in ["general.name", "general.file_type"] {
            if let Some(v) = file.get(k) {
                println!(
                    "  {:<13} {}",
                    k.trim_start_matches("general."),
                    value_text(v)
                );
            }
        }
        if !hparams.is_empty() {
            println!("hyperparameters");
            for (k, v) in &hparams {
                println!(
                    "  {:<36} {}",
                    k.trim_start_matches(&format!("{arch}.")),
                    value_text(v)
                );
            }
        }
        if let Some(model) = tok("model").and_then(GgufValue::as_str) {
            println!(
                "tokenizer  {model} ({}), {} tokens, {} merges{}",
                tok("pre").and_then(GgufValue::as_str).unwrap_or("default"),
                tok("tokens")
                    .and_then(GgufValue::as_array)
                    .map_or(0, GgufArray::len),
                tok("merges")
                    .and_then(GgufValue::as_array)
                    .map_or(0, GgufArray::len),
                if file.get("tokenizer.chat_template").is_some() {
                    ", chat template"
                } else {
                    ""
                }
            );
        }
        println!(
            "tensors  {}, {} weights, {}, {:.3} bits per weight",
            file.tensors().len(),
            count(values),
            size(bytes),
            if values > 0 {
                bytes as f64 * 8.0 / values as f64
            } else {
                0.0
            }
        );
        println!(
            "  {:<8} {:>8} {:>16} {:>16} {:>8}",
            "type", "tensors", "weights", "bytes", "bits/w"
        );
        for (k, (n, v, b)) in &by_type {
            println!(
                "  {k:<8} {n:>8} {v:>16} {b:>16} {:>8.3}",
                *b as f64 * 8.0 / (*v).max(1) as f64
            );
        }
        match &rotation {
            Ok(None) => println!("rotation  none"),
            Ok(Some(m)) => {
                println!(
                    "rotation  blockwise Hadamard, block 1024, {} folded tensors, inverse: {}, gdn_v_grouped {}",
                    m.weight_names.len(),
                    m.inverse_weight_names.iter().cloned().collect::<Vec<_>>().join(", "),
                    m.gdn_v_grouped
                );
                for (w, s) in &m.signs {
                    println!(
                        "  signs for width {w}: {} of {} negative",
                        s.iter().filter(|&&v| v < 0.0).count(),
                        s.len()
                    );
                }
            }
            Err(e) => println!("rotation  INVALID: {e}"),
        }
    }
    if let Err(e) = rotation {
        bail!(
            "{}: the rotation metadata is not valid: {e}",
            path.display()
        );
    }
    Ok(())
}

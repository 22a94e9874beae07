//! The `onepass` command.
//!
//! Subcommands print machine-readable JSON on stdout (scripts depend on these shapes) and
//! human-readable progress and errors on stderr; every error exits non-zero with a message.

mod bench_systemone;
mod cuda_bench;
mod device;
mod gguf_cmd;
mod limits;
mod serve;
mod session;
mod systemone;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use onepass_decide::assemble::argmax;
use onepass_model::synth::{self, SynthSpec};
use onepass_model::{Model, ModelConfig};
use onepass_tensor::DType;
use onepass_tokenizer::Tokenizer;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "onepass",
    version,
    about = "Typed decisions (System One) and log-probabilities with Qwen3.5-family hybrid models, over HTTP or from the command line"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Architecture, parameters, weight dtype and bytes, state bytes per token and per sequence
    /// (--model); or, for a GGUF file, its hyperparameters, tensor types, bytes per weight and
    /// rotation (human-readable; --json for JSON).
    Info {
        /// A GGUF file to describe without loading the model.
        #[arg(conflicts_with = "model", required_unless_present = "model")]
        file: Option<PathBuf>,
        /// A model folder (config.json, *.safetensors weights, tokenizer.json), a .gguf file, or a Hub repo id ORG/NAME[@REVISION]
        /// already in the Hugging Face cache.
        #[arg(long)]
        model: Option<String>,
        /// With a GGUF file: print JSON instead of text.
        #[arg(long, requires = "file")]
        json: bool,
    },
    /// Writes a model folder as a GGUF file: f16, bf16 or q8_0 as llama.cpp's converter does, or a
    /// ternary pack (pq2_0, ptq1_0) with the weights rotated blockwise (Hadamard) and quantised.
    Convert(gguf_cmd::ConvertArgs),
    /// Reads JSON Lines from stdin (one JSON string per line); writes one JSON array of ids per line.
    Tokenize {
        /// A model folder, a .gguf file, or a Hub repo id ORG/NAME[@REVISION] already in the Hugging Face cache; only its
        /// tokenizer.json and tokenizer_config.json are read.
        #[arg(long)]
        model: String,
    },
    /// Prints {"logits": [[...], ...]}, one row per position (only the last with --last).
    Logits(LogitsArgs),
    /// Writes a deterministic synthetic checkpoint folder (random weights: for tests; its answers mean nothing).
    Synth {
        /// One of the presets (see --list).
        #[arg(long, required_unless_present = "list")]
        preset: Option<String>,
        /// Output folder.
        #[arg(long, required_unless_present = "list")]
        out: Option<PathBuf>,
        /// Copy tokenizer.json / tokenizer_config.json from this folder instead of writing the
        /// small synthetic tokenizer (a tokenizer without a chat template gets the synthetic one's).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// Override the preset's weight dtype (f32, bf16, f16).
        #[arg(long)]
        dtype: Option<String>,
        /// Override the preset's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Write one GGUF file (--out FILE.gguf) of this type instead of a folder: f16, bf16,
        /// q8_0, or a random ternary pack pq2_0 / ptq1_0, generated tensor by tensor.
        #[arg(long)]
        format: Option<String>,
        /// Seed of a ternary pack's rotation signs (with --format pq2_0 or ptq1_0).
        #[arg(long, default_value_t = 1)]
        sign_seed: u64,
        /// List the presets and exit.
        #[arg(long)]
        list: bool,
    },
    /// Prefill and decode throughput on one model, on the CPU or a GPU; prints one JSON object.
    Bench(BenchArgs),
    /// System One latency and throughput on three fixed request sizes (cpu or cuda): p50/p95, requests/s, decisions/s.
    BenchSystemone(bench_systemone::BenchSystemoneArgs),
    /// HTTP server: decider-ai's /v1/systemone, /decide, /v1/models, /health, plus /metrics (docs/server.md).
    Serve(serve::ServeArgs),
    /// Answers one /v1/systemone request body (file or `-`): prints the response JSON the server would send.
    Systemone(systemone::SystemoneArgs),
    /// Shows the prompts of one /v1/systemone request without running the model: prints
    /// {"rows":[{"ids","slots","nopts"}],"usage"}.
    Render(systemone::RenderArgs),
    /// Reads JSON lines on stdin ({"cmd": "generate", ...}; {"cmd": "decide", ...} with --decide) and writes one JSON
    /// line per request (docs/api.md).
    Session(session::SessionArgs),
    /// A conversation with the model's chat template, streamed; one message per line when stdin is not a terminal.
    Chat(session::ChatArgs),
}

#[derive(clap::Args)]
struct LogitsArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json), a .gguf file, or a Hub repo id ORG/NAME[@REVISION]
    /// already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// Comma-separated token ids.
    #[arg(long)]
    ids: String,
    /// Only the last position.
    #[arg(long)]
    last: bool,
    /// Feed the sequence in chunks of this many tokens (default: all at once).
    #[arg(long)]
    chunk: Option<usize>,
    #[command(flatten)]
    dev: device::DeviceArg,
    #[command(flatten)]
    precision: device::PrecisionArg,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json), a .gguf file, or a Hub repo id ORG/NAME[@REVISION]
    /// already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// Prompt lengths to prefill.
    #[arg(long, default_value = "128,512,2048", value_delimiter = ',')]
    prompt_lens: Vec<usize>,
    /// Tokens to decode after the first prompt (full-vocabulary logits each step).
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Repetitions per prompt length (the best is reported).
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// GPU: let a kernel start while the one before it finishes (programmatic dependent launch, compute capability
    /// 9.0 and later; measured slower on the decode step so far).
    #[arg(long)]
    gpu_pdl: bool,
    /// GPU: keep the ternary (PQ2_0) prefill GEMM to the older tensor-core kernels instead of Hopper's warpgroup
    /// ones (the same results, slower; for comparing the two).
    #[arg(long)]
    gpu_no_wgmma: bool,
    /// Also decode this many sequences at once, comma-separated (each step one forward over all of them, the next
    /// tokens greedy); reports the tokens per second of all of them together.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    #[command(flatten)]
    precision: device::PrecisionArg,
    #[command(flatten)]
    dev: device::DeviceArg,
}

fn main() {
    keep_freed_memory();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Every layer allocates and frees activation buffers of megabytes; by default glibc hands such
/// blocks back to the kernel (munmap, heap trim) and the next layer page-faults them in again,
/// which cost ~5% of a prefill. Keep freed memory in the process instead.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Info { file, model, json } => match (file, model) {
            (Some(f), _) => gguf_cmd::gguf_info(&f, json),
            (None, Some(m)) => info(&m),
            (None, None) => bail!("give a GGUF file or --model"),
        },
        Cmd::Convert(a) => {
            let dir = model_dir(a.model())?;
            gguf_cmd::convert_cmd(a, &dir)
        }
        Cmd::Tokenize { model } => tokenize(&model),
        Cmd::Logits(a) => match a.dev.resolve()? {
            device::Device::Cpu => logits(&a.model, &a.ids, a.last, a.chunk),
            device::Device::Cuda => {
                let precision = a.precision.parse()?;
                cuda_bench::logits_cuda(
                    &load_model(&a.model)?,
                    &parse_ids(&a.ids)?,
                    a.last,
                    a.chunk,
                    precision,
                )
            }
        },
        Cmd::Synth {
            preset,
            out,
            tokenizer,
            dtype,
            seed,
            format,
            sign_seed,
            list,
        } => {
            if list {
                for p in synth::PRESETS {
                    println!("{p}");
                }
                return Ok(());
            }
            let (Some(preset), Some(out)) = (preset, out) else {
                bail!("--preset and --out are required")
            };
            synth_cmd(
                &preset,
                &out,
                tokenizer.as_deref(),
                dtype.as_deref(),
                seed,
                format.as_deref().map(|f| (f, sign_seed)),
            )
        }
        Cmd::Bench(a) if a.batch.contains(&0) => {
            bail!("--batch takes sequence counts of at least 1")
        }
        Cmd::Bench(a) => match a.dev.resolve()? {
            device::Device::Cpu => bench(&a.model, &a.prompt_lens, a.decode, a.reps, &a.batch),
            // System One-like request: 7 rows of 175 shared + 33 own tokens (406 unique).
            device::Device::Cuda => {
                let precision = a.precision.parse()?;
                cuda_bench::bench_cuda(
                    &load_model(&a.model)?,
                    &a.prompt_lens,
                    a.decode,
                    a.reps,
                    (7, 175, 33),
                    (a.gpu_pdl, !a.gpu_no_wgmma),
                    &a.batch,
                    precision,
                )
            }
        },
        Cmd::BenchSystemone(a) => bench_systemone::bench_systemone(a),
        Cmd::Systemone(a) => systemone::systemone(a),
        Cmd::Serve(a) => serve::serve(a),
        Cmd::Render(a) => systemone::render(a),
        Cmd::Session(a) => session::session(a),
        Cmd::Chat(a) => session::chat(a),
    }
}

fn model_dir(arg: &str) -> Result<PathBuf> {
    Ok(onepass_formats::resolve_model(arg)?)
}

/// Loads a model in the file's forms (for `info` and for an upload to the GPU).
fn load_model(arg: &str) -> Result<Model> {
    load_model_with(arg, false)
}

/// Loads a model that stays on the CPU, its weights in the forms the CPU reads fastest.
fn load_cpu_model(arg: &str) -> Result<Model> {
    load_model_with(arg, true)
}

fn load_model_with(arg: &str, cpu: bool) -> Result<Model> {
    let dir = model_dir(arg)?;
    let t0 = Instant::now();
    let mut m = Model::load(&dir).with_context(|| format!("loading {}", dir.display()))?;
    if cpu {
        m.prepare_for_cpu();
    }
    eprintln!(
        "loaded {} in {:.2}s",
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(m)
}

/// The tokenizer of a model folder, read for its config.json `model_type` when there is one.
fn load_tokenizer(arg: &str) -> Result<Tokenizer> {
    let dir = model_dir(arg)?;
    Ok(Tokenizer::from_model(&dir, model_type_in(&dir).as_deref())?)
}

/// A model's `model_type` (config.json's, or the one a GGUF file's architecture stands for), when it has one.
pub(crate) fn model_type_in(dir: &Path) -> Option<String> {
    ModelConfig::from_path(dir).ok().map(|c| c.model_type)
}

/// `--flag`, else the environment variable `env` (the settings decider-ai reads from its environment).
pub(crate) fn flag_or_env(flag: Option<String>, env: &str) -> Option<String> {
    flag.or_else(|| std::env::var(env).ok())
}

fn info(arg: &str) -> Result<()> {
    let m = load_model(arg)?;
    let i = m.info();
    let c = m.text_config();
    let out = json!({
        "model_type": i.model_type,
        "form": format!("{:?}", i.form).to_lowercase(),
        "architecture": {
            "layers": i.layers,
            "gated_deltanet_layers": i.gdn_layers,
            "attention_layers": i.attention_layers,
            "layer_types": c.layer_types.iter().map(|k| match k {
                onepass_model::LayerKind::GatedDeltaNet => "linear_attention",
                onepass_model::LayerKind::Attention => "full_attention",
            }).collect::<Vec<_>>(),
            "hidden_size": i.hidden_size,
            "intermediate_size": c.intermediate_size,
            "attention_heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "rotary_dim": c.rotary_dim(),
            "gdn_key_heads": c.linear_num_key_heads,
            "gdn_value_heads": c.linear_num_value_heads,
            "gdn_key_dim": c.linear_key_head_dim,
            "gdn_value_dim": c.linear_value_head_dim,
            "vocab_size": i.vocab_size,
            "tie_word_embeddings": i.tied,
            "max_position_embeddings": i.max_position_embeddings,
        },
        "parameters": i.parameters,
        "weight_dtype": i.weight_dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join("+"),
        "weight_bytes": i.weight_bytes,
        "file_bytes": i.file_bytes,
        "state_bytes_per_token": i.state_bytes_per_token,
        "state_bytes_per_sequence": i.state_bytes_per_sequence,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn tokenize(arg: &str) -> Result<()> {
    let tok = load_tokenizer(arg)?;
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for (n, line) in stdin.lock().lines().enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let text: String = serde_json::from_str(&line)
            .with_context(|| format!("line {}: expected one JSON string per line", n + 1))?;
        let ids = tok
            .encode(&text)
            .with_context(|| format!("line {}", n + 1))?;
        writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    }
    out.flush()?;
    Ok(())
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Vec<u32> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<u32>()
                .with_context(|| format!("--ids: {x:?} is not a token id"))
        })
        .collect::<Result<_>>()?;
    if ids.is_empty() {
        bail!("--ids is empty: give at least one token id");
    }
    Ok(ids)
}

fn logits(arg: &str, ids: &str, last: bool, chunk: Option<usize>) -> Result<()> {
    let ids = parse_ids(ids)?;
    let m = load_cpu_model(arg)?;
    let chunk = chunk.unwrap_or(ids.len()).max(1);
    let mut state = m.new_state();
    let mut hidden = Vec::new();
    for piece in ids.chunks(chunk) {
        hidden.extend(m.forward(&mut state, piece)?);
    }
    let h = m.hidden_size();
    let rows = if last {
        &hidden[hidden.len() - h..]
    } else {
        &hidden[..]
    };
    print_logits(&m.logits(rows), m.vocab_size())
}

/// Writes `{"logits": [[...], ...]}` (one row of `vocab` values per position) to stdout: the
/// `onepass logits` contract.
pub(crate) fn print_logits(logits: &[f32], vocab: usize) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout());
    write!(out, "{{\"logits\": [")?;
    for (i, row) in logits.chunks_exact(vocab).enumerate() {
        if i > 0 {
            write!(out, ", ")?;
        }
        write!(out, "{}", serde_json::to_string(row)?)?;
    }
    writeln!(out, "]}}")?;
    out.flush()?;
    Ok(())
}

fn synth_cmd(
    preset: &str,
    out: &Path,
    tokenizer: Option<&Path>,
    dtype: Option<&str>,
    seed: Option<u64>,
    gguf: Option<(&str, u64)>,
) -> Result<()> {
    // "27b" is short for "qwen3.5-27b".
    let mut spec: SynthSpec = synth::preset(preset)
        .or_else(|| synth::preset(&format!("qwen3.5-{preset}")))
        .with_context(|| {
            format!(
                "unknown preset {preset:?}; presets: {}",
                synth::PRESETS.join(", ")
            )
        })?;
    if let Some(d) = dtype {
        spec.dtype = match d {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            other => bail!("--dtype {other:?}: use f32, bf16 or f16"),
        };
    }
    if let Some(s) = seed {
        spec.seed = s;
    }
    if let Some((format, sign_seed)) = gguf {
        let files = match tokenizer {
            Some(src) => onepass_model::convert::TokenizerFiles::from_dir(src)?,
            None => {
                let vocab = spec
                    .vocab_size
                    .min(onepass_tokenizer::synthetic_max_vocab());
                onepass_model::convert::TokenizerFiles {
                    tokenizer_json: serde_json::from_str(
                        &onepass_tokenizer::synthetic_tokenizer_json(vocab)?,
                    )?,
                    tokenizer_config: serde_json::from_str(
                        &onepass_tokenizer::synthetic_tokenizer_config_json(),
                    )?,
                    chat_template_file: None,
                }
            }
        };
        let name = if synth::preset(preset).is_some() {
            preset.to_string()
        } else {
            format!("qwen3.5-{preset}")
        };
        return gguf_cmd::synth_gguf(&spec, &name, format, &files, out, sign_seed);
    }
    if out.exists() && !out.is_dir() {
        bail!(
            "--out {}: this is a file; give the path of a folder to write the checkpoint into",
            out.display()
        );
    }
    let t0 = Instant::now();
    let mut last = Instant::now();
    synth::write_checkpoint(&spec, out, &mut |done, total| {
        if last.elapsed().as_secs_f64() > 2.0 || done == total {
            eprintln!("synth {preset}: {done}/{total} tensors");
            last = Instant::now();
        }
    })?;
    match tokenizer {
        Some(src) => {
            for f in [
                "tokenizer.json",
                "tokenizer_config.json",
                "chat_template.jinja",
            ] {
                let from = src.join(f);
                if from.is_file() {
                    std::fs::copy(&from, out.join(f))
                        .with_context(|| format!("copying {}", from.display()))?;
                } else if f == "tokenizer.json" {
                    bail!("{} has no tokenizer.json", src.display());
                }
            }
            add_chat_template(out)?;
        }
        None => {
            let vocab = spec
                .vocab_size
                .min(onepass_tokenizer::synthetic_max_vocab());
            std::fs::write(
                out.join("tokenizer.json"),
                onepass_tokenizer::synthetic_tokenizer_json(vocab)?,
            )?;
            std::fs::write(
                out.join("tokenizer_config.json"),
                onepass_tokenizer::synthetic_tokenizer_config_json(),
            )?;
        }
    }
    eprintln!(
        "wrote {} in {:.1}s",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A synthetic checkpoint always has a chat template: when the tokenizer copied into `out` has none, its
/// `tokenizer_config.json` gets the synthetic tokenizer's (Qwen3-style ChatML), so decisions and chat run on it.
fn add_chat_template(out: &Path) -> Result<()> {
    if out.join("chat_template.jinja").is_file() {
        return Ok(());
    }
    let path = out.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = if path.is_file() {
        serde_json::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("reading {}", path.display()))?
    } else {
        serde_json::json!({})
    };
    let Some(obj) = cfg.as_object_mut() else {
        bail!("{}: not a JSON object", path.display());
    };
    let has = obj
        .get("chat_template")
        .is_some_and(|t| !t.is_null() && t.as_str() != Some(""));
    if !has {
        obj.insert(
            "chat_template".into(),
            onepass_tokenizer::QWEN3_CHAT_TEMPLATE.into(),
        );
        std::fs::write(&path, serde_json::to_string(&cfg)?)?;
    }
    Ok(())
}

fn bench(arg: &str, lens: &[usize], decode: usize, reps: usize, batch: &[usize]) -> Result<()> {
    let m = load_cpu_model(arg)?;
    let v = m.vocab_size() as u32;
    let max_len = lens.iter().copied().max().unwrap_or(0);
    // A fixed pseudo-random prompt (ids spread over the vocabulary).
    let ids: Vec<u32> = (0..max_len as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % v as u64) as u32)
        .collect();
    let mut prefill = Vec::new();
    for &len in lens {
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let mut st = m.new_state();
            let t0 = Instant::now();
            let h = m.forward(&mut st, &ids[..len])?;
            let _last = m.logits(&h[h.len() - m.hidden_size()..]);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        eprintln!("prefill {len}: {:.1} tok/s", len as f64 / best);
        prefill.push(json!({"tokens": len, "seconds": best, "tokens_per_s": len as f64 / best}));
    }
    let first = lens.first().copied().unwrap_or(1).max(1);
    let mut st = m.new_state();
    let h = m.forward(&mut st, &ids[..first])?;
    let mut next = argmax(&m.logits(&h[h.len() - m.hidden_size()..])) as u32;
    let t0 = Instant::now();
    for _ in 0..decode {
        let h = m.forward(&mut st, &[next])?;
        next = argmax(&m.logits(&h)) as u32;
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("decode: {:.2} tok/s", decode as f64 / secs);
    let mut batched = Vec::new();
    for &b in batch {
        let mut seqs = st.fork(b);
        let mut toks: Vec<u32> = (0..b as u32).map(|i| (next + i) % v).collect();
        let t0 = Instant::now();
        for _ in 0..decode {
            let h = m.forward_batch(&mut one_token_each(&mut seqs, &toks))?;
            toks = h
                .chunks(m.hidden_size())
                .map(|r| argmax(&m.logits(r)) as u32)
                .collect();
        }
        batched.push(batch_row(b, decode, t0.elapsed().as_secs_f64()));
    }
    let rss = peak_rss_bytes();
    let info = m.info();
    println!(
        "{}",
        json!({
            "engine": "onepass",
            "threads": rayon_threads(),
            "prefill": prefill,
            "decode": {"tokens": decode, "after": first, "seconds": secs, "tokens_per_s": decode as f64 / secs},
            "batched_decode": batched,
            "weight_bytes": info.weight_bytes,
            "file_bytes": info.file_bytes,
            "peak_rss_bytes": rss,
        })
    );
    Ok(())
}

/// `--batch`'s forward items: each sequence with its one next token.
pub(crate) fn one_token_each<'a, S>(
    seqs: &'a mut [S],
    toks: &'a [u32],
) -> Vec<(&'a mut S, &'a [u32])> {
    seqs.iter_mut()
        .zip(toks)
        .map(|(s, t)| (s, std::slice::from_ref(t)))
        .collect()
}

/// One `--batch` measurement: `b` sequences decoded `steps` steps together in `secs`; printed and as JSON.
pub(crate) fn batch_row(b: usize, steps: usize, secs: f64) -> serde_json::Value {
    let tps = (b * steps) as f64 / secs;
    eprintln!(
        "decode {b} sequences at once: {tps:.1} tok/s together ({:.3} ms a step)",
        secs * 1e3 / steps.max(1) as f64
    );
    json!({"sequences": b, "steps": steps, "seconds": secs, "tokens_per_s": tps})
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Peak resident set size from /proc (Linux); None elsewhere.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

//! `--device cpu|cuda` for the commands that run the model, and their CUDA paths.
//!
//! The default is cuda when a usable GPU (driver, NVRTC, cuBLAS and a device) is present, else cpu;
//! asking for cuda where there is none is an error that says what is missing.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use onepass_cuda::CudaModel;
use onepass_model::Model;
use serde_json::json;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArg {
    /// Where the model runs: cpu or cuda (default: cuda when a GPU is present, else cpu).
    #[arg(long)]
    pub device: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl DeviceArg {
    pub fn resolve(&self) -> Result<Device> {
        match self.device.as_deref() {
            None => Ok(if onepass_cuda::available() {
                Device::Cuda
            } else {
                Device::Cpu
            }),
            Some("cpu") => Ok(Device::Cpu),
            Some("cuda") => match onepass_cuda::probe() {
                Ok(_) => Ok(Device::Cuda),
                Err(e) => bail!("--device cuda was asked for, but {e}; use --device cpu"),
            },
            Some(other) => bail!("--device {other:?}: expected cpu or cuda"),
        }
    }
}

/// Reads `--gpu-precision`.
pub fn parse_precision(s: &str) -> Result<onepass_cuda::Precision> {
    use onepass_cuda::Precision;
    Ok(match s {
        "mixed" => Precision::Mixed,
        "split" => Precision::Bf16Split,
        "bf16" => Precision::Bf16,
        "f32" => Precision::F32,
        other => bail!("--gpu-precision {other:?}: expected mixed, split, bf16 or f32"),
    })
}

/// Uploads `m` to GPU 0 in `precision` (the other options their defaults, no memory cap).
fn upload(m: &Model, precision: onepass_cuda::Precision) -> Result<CudaModel> {
    let t0 = Instant::now();
    let o = onepass_cuda::CudaOptions {
        precision,
        memory_budget_bytes: 0,
        ..onepass_cuda::CudaOptions::default()
    };
    let g = CudaModel::load(m, &o).context("uploading the model to the GPU")?;
    eprintln!(
        "uploaded to {} ({}) in {} precision in {:.2}s",
        g.gpu().name,
        g.gpu().arch(),
        precision.name(),
        t0.elapsed().as_secs_f64()
    );
    Ok(g)
}

/// `onepass logits --device cuda`: the same JSON as the CPU path.
pub fn logits_cuda(
    m: &Model,
    ids: &[u32],
    last: bool,
    chunk: Option<usize>,
    precision: onepass_cuda::Precision,
) -> Result<()> {
    let g = upload(m, precision)?;
    let chunk = chunk.unwrap_or(ids.len()).max(1);
    let mut st = g.new_state()?;
    let mut rows: Vec<f32> = Vec::new();
    let v = m.vocab_size();
    for piece in ids.chunks(chunk) {
        let h = g.forward(&mut st, piece)?;
        let l = g.logits(&h)?;
        if last {
            rows = l[l.len() - v..].to_vec();
        } else {
            rows.extend(l);
        }
    }
    crate::print_logits(&rows, v)
}

fn prompt(n: usize, vocab: u32, salt: u64) -> Vec<u32> {
    let state = 0x9e3779b97f4a7c15u64 ^ salt.wrapping_mul(0xbf58476d1ce4e5b9);
    onepass_model::synth::xorshift_ids(state, n, vocab as usize)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `onepass bench --device cuda`: prefill throughput per prompt length, a System One-like request
/// (a shared prefix, forked into rows whose suffixes run as one batch, label-row readout), decode.
/// Every timing ends with the result on the host (or a stream synchronisation).
pub fn bench_cuda(
    m: &Model,
    lens: &[usize],
    decode: usize,
    reps: usize,
    s1: (usize, usize, usize),
    (pdl, wgmma): (bool, bool),
    batch: &[usize],
    precision: onepass_cuda::Precision,
) -> Result<()> {
    let g = upload(m, precision)?;
    let gpu = g.gpu().clone();
    gpu.set_pdl(pdl);
    gpu.set_wgmma(wgmma);
    let v = m.vocab_size() as u32;
    let reps = reps.max(1);
    // Warm-up (kernel load, cuBLAS heuristics, allocator pools).
    let mut w = g.new_state()?;
    g.forward(&mut w, &prompt(64, v, 0))?;
    gpu.sync()?;
    let mut prefill = Vec::new();
    for &len in lens {
        let ids = prompt(len, v, len as u64);
        let mut times = Vec::new();
        for _ in 0..reps {
            let mut st = g.new_state()?;
            let t0 = Instant::now();
            let h = g.forward(&mut st, &ids)?;
            let _ = g.logits_rows(&h, &[(len - 1, 0)])?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = pct(&times, 0.5);
        eprintln!(
            "prefill {len}: median {:.2} ms, {:.0} tok/s",
            med * 1e3,
            len as f64 / med
        );
        prefill.push(json!({"tokens": len, "median_ms": med * 1e3, "best_ms": times[0] * 1e3, "tokens_per_s": len as f64 / med}));
    }
    // Where the longest prefill's time goes: GPU time by op (CUDA events after every op, without graphs).
    if let Some(&len) = lens.iter().max() {
        let ids = prompt(len, v, len as u64);
        let mut st = g.new_state()?;
        g.profile_start();
        g.forward(&mut st, &ids)?;
        print_ops(
            &format!("prefill {len} by op (CUDA events, no graphs)"),
            &g.profile_take()?,
            1,
            "forward",
        );
    }
    // System One-like: `rows` rows of `prefix + suffix` tokens sharing the prefix.
    let (rows, pre, suf) = s1;
    let prefix = prompt(pre, v, 7);
    let sufs: Vec<Vec<u32>> = (0..rows).map(|r| prompt(suf, v, 100 + r as u64)).collect();
    let labels: Vec<u32> = (0..8).collect();
    let mut times = Vec::new();
    for i in 0..reps.max(5) * 10 + 3 {
        let t0 = Instant::now();
        let mut st = g.new_state()?;
        g.forward(&mut st, &prefix)?;
        let mut forks = g.fork(&st, rows)?;
        let mut items: Vec<_> = forks
            .iter_mut()
            .zip(&sufs)
            .map(|(s, x)| (s, x.as_slice()))
            .collect();
        let h = g.forward_batch(&mut items)?;
        let picks: Vec<(usize, u32)> = (0..rows)
            .flat_map(|r| labels.iter().map(move |&l| ((r + 1) * suf - 1, l)))
            .collect();
        let _ = g.logits_rows(&h, &picks)?;
        if i >= 3 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let (p50, p95) = (pct(&times, 0.5), pct(&times, 0.95));
    eprintln!(
        "systemone-like {rows}x({pre}+{suf}): p50 {:.2} ms, p95 {:.2} ms",
        p50 * 1e3,
        p95 * 1e3
    );
    // Decode: one token at a time after the first prompt, the next token the argmax of the full-vocabulary
    // logits (what greedy generation reads); then the same steps reading one logit, and where a step's time goes.
    let mut st = g.new_state()?;
    g.forward(&mut st, &prompt(lens.first().copied().unwrap_or(128), v, 1))?;
    let argmax = |l: &[f32]| {
        l.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0 as u32
    };
    let mut next = 1u32;
    let mut full_step = |st: &mut onepass_cuda::CudaState, next: &mut u32| -> Result<()> {
        let h = g.forward(st, &[*next])?;
        *next = argmax(&g.logits(&h)?);
        Ok(())
    };
    for _ in 0..4.min(decode) {
        full_step(&mut st, &mut next)?;
    }
    let t0 = Instant::now();
    for _ in 0..decode {
        full_step(&mut st, &mut next)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..decode {
        let h = g.forward(&mut st, &[next])?;
        next = (g.logits_rows(&h, &[(0, 5)])?[0].to_bits() % v) as u32;
    }
    let one_secs = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    for _ in 0..decode {
        let h = g.forward(&mut st, &[next])?;
        next = g.argmax_at(&h, &[0])?[0];
    }
    let gpu_secs = t2.elapsed().as_secs_f64();
    // Greedy generation's path: each step one graph (layers, head, argmax), queued before the step before's token
    // is read; a few steps first, so that the step's graph is captured before the clock starts.
    let serial = std::sync::Mutex::new(());
    let greedy = |st: &mut onepass_cuda::CudaState, next: &mut u32, n: usize| -> Result<()> {
        let first = *next;
        g.greedy_steps(st, first, n, &serial, &mut |t| {
            *next = t;
            true
        })?
        .ok_or_else(|| anyhow::anyhow!("the decode buffers are busy"))?;
        Ok(())
    };
    greedy(&mut st, &mut next, 4.min(decode))?;
    let t3 = Instant::now();
    greedy(&mut st, &mut next, decode)?;
    let ahead_secs = t3.elapsed().as_secs_f64();
    if decode > 0 {
        eprintln!(
            "decode: {:.1} tok/s with full-vocabulary logits to the host ({:.3} ms a step), {:.1} tok/s with the \
             argmax on the GPU ({:.3} ms), {:.1} tok/s reading one logit, {:.1} tok/s decoding ahead of the host \
             (each step one graph: {:.3} ms)",
            decode as f64 / secs,
            secs * 1e3 / decode as f64,
            decode as f64 / gpu_secs,
            gpu_secs * 1e3 / decode as f64,
            decode as f64 / one_secs,
            decode as f64 / ahead_secs,
            ahead_secs * 1e3 / decode as f64,
        );
        decode_profile(&g, &mut st, &mut full_step, &mut next)?;
    }
    // Several sequences at once: each step one forward over all of them, the next tokens picked on the GPU.
    let mut batched = Vec::new();
    for &b in batch {
        let mut seqs = g.fork(&st, b)?;
        let mut toks: Vec<u32> = (0..b as u32).map(|i| (next + i) % v).collect();
        let rows: Vec<usize> = (0..b).collect();
        let mut step = || -> Result<()> {
            let h = g.forward_batch(&mut crate::one_token_each(&mut seqs, &toks))?;
            toks = g.argmax_at(&h, &rows)?;
            Ok(())
        };
        // Two steps first (each batch size's kernels and scratch), then the timed ones.
        for _ in 0..2.min(decode) {
            step()?;
        }
        let t0 = Instant::now();
        for _ in 0..decode {
            step()?;
        }
        let secs = t0.elapsed().as_secs_f64();
        batched.push(crate::batch_row(b, decode, secs));
    }
    println!(
        "{}",
        json!({
            "device": gpu.name, "arch": gpu.arch(),
            "prefill": prefill,
            "systemone_like": {"rows": rows, "prefix": pre, "suffix": suf, "unique_tokens": pre + rows * suf,
                "p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3, "requests": times.len()},
            "decode": {"tokens": decode, "seconds": secs, "tokens_per_s": if secs > 0.0 { decode as f64 / secs } else { 0.0 },
                "gpu_argmax_tokens_per_s": if gpu_secs > 0.0 { decode as f64 / gpu_secs } else { 0.0 },
                "one_logit_tokens_per_s": if one_secs > 0.0 { decode as f64 / one_secs } else { 0.0 },
                "ahead_tokens_per_s": if ahead_secs > 0.0 { decode as f64 / ahead_secs } else { 0.0 }},
            "batched_decode": batched,
        })
    );
    Ok(())
}

/// Prints a by-op table of `ops` ([`onepass_cuda::CudaModel::profile_take`]) over `n` forwards: per forward, each
/// op's ms, share and launches (a `per`: step, forward), after a line `what: total ms`.
fn print_ops(what: &str, ops: &[(&'static str, f64, usize)], n: usize, per: &str) {
    let n = n.max(1);
    let total: f64 = ops.iter().map(|o| o.1).sum();
    eprintln!("{what}: {:.3} ms", total / n as f64);
    for (name, ms, count) in ops {
        eprintln!(
            "  {name:<22} {:>8.4} ms {:>5.1}% {:>6} launches/{per}",
            ms / n as f64,
            100.0 * ms / total.max(f64::MIN_POSITIVE),
            count / n
        );
    }
}

/// Where a decode step's time goes: GPU time by op (CUDA events, 16 steps, without graphs), then 16 steps as they
/// run (graphs on) against the host time queueing their forwards and each forward's GPU span.
fn decode_profile(
    g: &onepass_cuda::CudaModel,
    st: &mut onepass_cuda::CudaState,
    step: &mut dyn FnMut(&mut onepass_cuda::CudaState, &mut u32) -> Result<()>,
    next: &mut u32,
) -> Result<()> {
    const STEPS: usize = 16;
    g.profile_start();
    for _ in 0..STEPS {
        step(st, next)?;
    }
    let ops = g.profile_take()?;
    print_ops(
        &format!("decode step by op (CUDA events, {STEPS} steps, no graphs)"),
        &ops,
        STEPS,
        "step",
    );
    for _ in 0..4 {
        step(st, next)?;
    }
    let (h0, t0) = (g.host_enqueue_ns(), Instant::now());
    g.span_start();
    for _ in 0..STEPS {
        step(st, next)?;
    }
    let wall = t0.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
    let spans = g.span_take()?;
    let gpu = spans.iter().sum::<f64>() / STEPS as f64;
    let queue = (g.host_enqueue_ns() - h0) as f64 / 1e6 / STEPS as f64;
    eprintln!(
        "decode step as it runs: {wall:.3} ms, of which {queue:.3} ms queueing the forward on the host; the GPU from \
         the table upload to the final norm: {gpu:.3} ms (the rest: the head, the logits' copy, the argmax)"
    );
    Ok(())
}

/// GPU options of the commands that run System One.
#[derive(clap::Args, Clone, Debug)]
pub struct CudaArgs {
    /// GPU memory for sequence state and forward scratch, in MiB; a request past it fails alone (cuda only).
    #[arg(long, default_value_t = 16384)]
    pub gpu_memory_mb: usize,
    /// GPU arithmetic: mixed (the default: bf16 weights, activations carried as two bf16 halves into every product,
    /// the attention and gated delta kernels in TF32; the fastest mode within 0.02 of float32 probabilities), split
    /// (the same products, f32-accurate attention and gated delta kernels; the closest to the CPU), bf16 (fastest,
    /// plain bf16 activations), or f32 (f32 weights; for checking).
    #[arg(long, default_value = "mixed")]
    pub gpu_precision: String,
    /// Make each request's answers on the GPU independent of the other requests batched with it, bit for bit
    /// (the GPU then runs one GEMM algorithm per shape and plans attention per sequence; docs/cuda.md).
    #[arg(long)]
    pub gpu_batch_invariant: bool,
    /// Arithmetic of the tensor-core kernels, comma-separated items applied in order: 3xtf32 (f32 accuracy),
    /// tf32 (faster, less exact), a kernel that runs tf32 (prep, state, attn), or attn=3xtf32|tf32|bf16x3|bf16.
    /// Default: the precision's (docs/cuda.md).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_kernels: Option<String>,
    /// Mixed and split precision only: the projections that multiply both bf16 halves of their input (all, none,
    /// or comma-separated gdn_in, gdn_out, attn_in, attn_out, mlp_in, mlp_out); the others round it to bf16.
    /// Default: all.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_split_gemms: Option<String>,
    /// Kernels of the gated delta rule: tc (tensor cores, the default), tc-no-leaf (tree children take the
    /// full state pass), simt (f32 SIMT kernels, no one-forward trees).
    #[arg(long, value_enum, default_value_t = GdnArg::Tc, help_heading = EXPERT)]
    pub gpu_gdn: GdnArg,
    /// Kernel of attention: tc (tensor cores where the head dim allows, the default) or tiled (f32 SIMT).
    #[arg(long, value_enum, default_value_t = AttnArg::Tc, help_heading = EXPERT)]
    pub gpu_attention: AttnArg,
    /// Run each request's shared prefix and its suffixes as two forwards, never as one.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_trees: bool,
    /// Launch every forward kernel by kernel (no CUDA graphs).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_graphs: bool,
    /// Let a kernel start while the one before it finishes (programmatic dependent launch, compute capability 9.0
    /// and later; measured slower on the decode step so far).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_pdl: bool,
    /// Keep the ternary (PQ2_0) prefill GEMM to the older tensor-core kernels instead of Hopper's warpgroup ones
    /// (the same results, slower; for comparing the two).
    #[arg(long, help_heading = EXPERT)]
    pub gpu_no_wgmma: bool,
    /// Hand freed GPU memory back to the driver at every synchronisation instead of keeping it for the next request.
    #[arg(long, help_heading = EXPERT)]
    pub gpu_release_memory: bool,
}

/// The help heading of the GPU flags most users never need.
const EXPERT: &str = "Expert GPU kernel options";

/// `--gpu-gdn`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnArg {
    Tc,
    TcNoLeaf,
    Simt,
}

/// `--gpu-attention`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnArg {
    Tc,
    Tiled,
}

impl CudaArgs {
    pub fn options(&self) -> Result<onepass_cuda::CudaOptions> {
        use onepass_cuda::{AttnKernels, GdnKernels, SplitGemms, TcArith};
        let precision = parse_precision(&self.gpu_precision)?;
        let kernels = parse_flag("--gpu-kernels", &self.gpu_kernels, TcArith::parse)?;
        let split_gemms = parse_flag(
            "--gpu-split-gemms",
            &self.gpu_split_gemms,
            SplitGemms::parse,
        )?;
        if split_gemms.is_some() && !precision.planes() {
            bail!(
                "--gpu-split-gemms applies to --gpu-precision mixed or split, not {}",
                self.gpu_precision
            );
        }
        Ok(onepass_cuda::CudaOptions {
            device: 0,
            precision,
            memory_budget_bytes: self.gpu_memory_mb << 20,
            kernels,
            split_gemms,
            gdn: match self.gpu_gdn {
                GdnArg::Tc => GdnKernels::TensorCore,
                GdnArg::TcNoLeaf => GdnKernels::TensorCoreNoLeaf,
                GdnArg::Simt => GdnKernels::Simt,
            },
            attention: if self.gpu_attention == AttnArg::Tiled {
                AttnKernels::Tiled
            } else {
                AttnKernels::TensorCore
            },
            trees: !self.gpu_no_trees,
            graphs: !self.gpu_no_graphs,
            pdl: self.gpu_pdl,
            wgmma: !self.gpu_no_wgmma,
            keep_freed_memory: !self.gpu_release_memory,
            batch_invariant: self.gpu_batch_invariant,
        })
    }
}

/// An optional flag's value through `parse`; an error names the flag.
fn parse_flag<T, E: std::fmt::Display>(
    flag: &str,
    value: &Option<String>,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<Option<T>> {
    value
        .as_deref()
        .map(parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("{flag} {e}"))
}

/// The one engine value every command holds: System One (and sessions, generation) over the model on the resolved
/// device.
pub type AnyEngine = onepass_decide::Engine<onepass_engine::AnyBackend>;

/// Loads `dir` onto `dev`: weights, tokenizer, `decider_config.json`; one stderr line says where and how long.
pub fn load_engine(
    dir: &std::path::Path,
    opts: onepass_decide::EngineOptions,
    dev: Device,
    cuda: &CudaArgs,
) -> Result<AnyEngine> {
    let t0 = Instant::now();
    let m = Model::load(dir).with_context(|| format!("loading {}", dir.display()))?;
    let model_type = m.config().model_type.clone();
    let backend = match dev {
        Device::Cpu => onepass_engine::AnyBackend::cpu(m),
        Device::Cuda => onepass_engine::AnyBackend::cuda(&m, &cuda.options()?)
            .with_context(|| format!("loading {} onto the GPU", dir.display()))?,
    };
    let e = onepass_decide::Engine::from_dir_with(dir, &model_type, backend, opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    eprintln!(
        "loaded {} on {} in {:.2}s",
        dir.display(),
        e.device(),
        t0.elapsed().as_secs_f64()
    );
    Ok(e)
}

#[derive(clap::Args, Debug)]
pub struct BenchSystemoneArgs {
    /// A model folder with tokenizer.json (e.g. `onepass synth --preset qwen3.5-0.8b --tokenizer testdata/qwen3_5-tokenizer --out DIR`).
    #[arg(long)]
    model: String,
    #[command(flatten)]
    dev: DeviceArg,
    #[command(flatten)]
    cuda: CudaArgs,
    /// Requests timed per workload, one at a time (after 3 warm-up requests).
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// Requests per engine call in the saturating load (what the server's batching worker hands `score`); 0: no
    /// saturating load.
    #[arg(long, default_value = "8,32", value_delimiter = ',')]
    batch: Vec<usize>,
    /// The workloads timed (1, 2, 3: about 406, 912 and 3,672 unique tokens), comma-separated.
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    workloads: Vec<usize>,
    /// Engine calls timed per batch size.
    #[arg(long, default_value_t = 10)]
    batch_reps: usize,
    /// Write the request bodies of the three workloads here (for benches/systemone_gpu_decider.py) and exit.
    #[arg(long)]
    write_requests: Option<std::path::PathBuf>,
    /// The workload (1, 2 or 3) whose GPU time is broken down by op (CUDA events, 10 requests); 0: none.
    #[arg(long, default_value_t = 1)]
    profile_workload: usize,
    /// MiB of prefix states kept, as `serve --prefix-cache-mb`: every request is timed repeatedly, so with the
    /// cache on each repeat starts from its kept context (warm); 0 times every request computing its context.
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: usize,
}

/// The state of the System One workloads: `n` events of a customer (as benches/systemone_cpu.py).
fn bench_state(n: usize) -> serde_json::Value {
    let kinds = ["login", "purchase", "refund", "ticket"];
    let ev: Vec<_> = (0..n)
        .map(|d| json!({"t": format!("2026-09-{:02}", 1 + d % 28), "kind": kinds[d % 4], "amount": (d as f64 * 7.25 * 100.0).round() / 100.0}))
        .collect();
    json!({"customer": {"name": "Ana Sousa", "tier": "gold", "region": "north"}, "events": ev,
           "note": "Asked twice about the late parcel and the refund."})
}

/// Five questions in 7 rows (the Score has 3 isolated levels); `extra` adds Choice questions, one row each.
fn bench_questions(extra: usize) -> serde_json::Value {
    let mut q = json!({
        "intent": {"instructions": "What does the customer want now?", "criteria": ["refund", "upgrade", "information", "cancel"]},
        "tier": {"instructions": "Customer tier", "criteria": {"bronze": null, "silver": null, "gold": "top tier"}},
        "kind": {"instructions": "Most frequent event kind", "criteria": ["login", "purchase", "refund", "ticket", "visit",
                 "call", "chat", "email", "return", "review", "other"]},
        "vip": {"type": "noul", "instructions": "Should this go to the VIP desk?"},
        "risk": {"type": "score", "instructions": "Churn risk", "criteria": ["low", "medium", "high"]},
    });
    for i in 0..extra {
        q[format!("channel{i}")] = json!({"instructions": format!("Best channel for follow-up {i}"), "criteria": ["email", "phone", "chat"]});
    }
    q
}

/// Rows, unique tokens (shared prefix once + every suffix) and mean row length of a plan.
fn plan_shape(p: &onepass_decide::Plan) -> (usize, usize, usize) {
    let rows: Vec<&[u32]> = p.rows.iter().map(|r| r.ids.as_slice()).collect();
    let lcp = onepass_decide::rows::common_prefix_len(&rows);
    let total: usize = rows.iter().map(|r| r.len()).sum();
    (
        rows.len(),
        lcp + total - lcp * rows.len(),
        total / rows.len().max(1),
    )
}

/// Parse and plan one request body: the host work before the engine; a client error is the HTTP answer it would be.
pub fn plan_body<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
    body: &[u8],
) -> Result<onepass_decide::Plan> {
    Ok(e.plan(&onepass_decide::parse_request(body)?)?)
}

/// One benchmark workload: (name, body, rows, unique tokens, mean row tokens).
type Workload = (String, Vec<u8>, usize, usize, usize);

/// The benchmark workloads: extra Choice questions, unique tokens aimed at.
const WORKLOADS: [(usize, usize); 3] = [(0, 406), (0, 912), (3, 3672)];

/// The three benchmark workloads.
fn bench_workloads<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
) -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    for (extra, target) in WORKLOADS {
        #[allow(clippy::type_complexity)]
        let mut best: Option<(usize, Vec<u8>, (usize, usize, usize))> = None;
        // Unique tokens grow with the events; find the count closest to the target (bisection, then neighbours).
        let shape = |n: usize| -> Result<(Vec<u8>, (usize, usize, usize))> {
            let body = serde_json::to_vec(
                &json!({"state": bench_state(n), "questions": bench_questions(extra)}),
            )?;
            let shape = plan_shape(&plan_body(e, &body)?);
            Ok((body, shape))
        };
        let (mut lo, mut hi) = (0usize, 400usize);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if shape(mid)?.1 .1 < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        for n in [lo, hi] {
            let (body, s) = shape(n)?;
            if best
                .as_ref()
                .is_none_or(|b| s.1.abs_diff(target) < b.2 .1.abs_diff(target))
            {
                best = Some((n, body, s));
            }
        }
        let (_, body, (rows, unique, mean)) = best.context("no workload")?;
        out.push((
            format!("{rows} rows ~{mean} tokens, {unique} unique"),
            body,
            rows,
            unique,
            mean,
        ));
    }
    Ok(out)
}

/// `onepass bench-systemone`: the three System One workloads through the engine, one request at a time
/// (p50/p95, requests/s, decisions/s), then a saturating load (many requests per `score` call, as the server's
/// batching worker does). Prints a table on stderr and one JSON object on stdout.
pub fn bench_systemone(a: BenchSystemoneArgs) -> Result<()> {
    let n = WORKLOADS.len();
    if let Some(w) = a.workloads.iter().find(|&&w| w == 0 || w > n) {
        bail!("--workloads {w}: the workloads are 1 to {n}");
    }
    if a.profile_workload > n {
        bail!(
            "--profile-workload {}: there are {n} workloads (0: none)",
            a.profile_workload
        );
    }
    let dir = onepass_formats::resolve_model(&a.model)?;
    let dev = a.dev.resolve()?;
    let opts = onepass_decide::EngineOptions {
        prefix_cache_bytes: a.prefix_cache_mb.saturating_mul(1 << 20),
        ..onepass_decide::EngineOptions::default()
    };
    if let Some(path) = &a.write_requests {
        let e = onepass_decide::Engine::load(&dir, opts)?;
        std::fs::create_dir_all(path)?;
        for (i, (name, body, ..)) in bench_workloads(&e)?.into_iter().enumerate() {
            std::fs::write(path.join(format!("workload{}.json", i + 1)), &body)?;
            eprintln!("workload{}: {name}", i + 1);
        }
        return Ok(());
    }
    let any = load_engine(&dir, opts, dev, &a.cuda)?;
    let device = any.device();
    let workloads = bench_workloads(&any)?;
    let timed: Vec<Workload> = workloads
        .iter()
        .enumerate()
        .filter(|(i, _)| a.workloads.contains(&(i + 1)))
        .map(|(_, w)| w.clone())
        .collect();
    let report = bench_engine(&any, &a, &timed)?;
    // Where the time goes: CUDA events after every op of 10 requests of the profiled workload.
    // Where the time goes (the profiled workload: GPU time by op, then host time against GPU time).
    let (mut profile, mut host) = (Vec::new(), serde_json::Value::Null);
    let pw = a.profile_workload;
    if let (Some(m), true) = (any.model().as_cuda(), pw > 0) {
        let body = &workloads[pw - 1].1;
        profile = ops_report(&any, m.model(), body, pw)?;
        host = host_report(&any, m.model(), body, pw)?;
    }
    println!(
        "{}",
        json!({"device": device, "model": dir.display().to_string(), "prefix_cache_mb": a.prefix_cache_mb, "workloads": report, "profile": profile, "host": host})
    );
    Ok(())
}

/// GPU time by op of workload `pw` (`body`): CUDA events after every op of 10 requests. Prints the table; → its
/// JSON rows.
fn ops_report(
    e: &AnyEngine,
    m: &CudaModel,
    body: &[u8],
    pw: usize,
) -> Result<Vec<serde_json::Value>> {
    m.profile_start();
    for _ in 0..10 {
        e.system_one(body)?;
    }
    let ops = m.profile_take()?;
    let total: f64 = ops.iter().map(|o| o.1).sum();
    eprintln!(
        "GPU time per request of workload {pw}, by op (CUDA events, 10 requests): {:.2} ms",
        total / 10.0
    );
    let mut rows = Vec::with_capacity(ops.len());
    for (name, ms, count) in &ops {
        eprintln!(
            "  {name:<22} {:>8.3} ms {:>5.1}% {:>6} launches/request",
            ms / 10.0,
            100.0 * ms / total,
            count / 10
        );
        rows.push(json!({"op": name, "ms_per_request": ms / 10.0, "per_request": count / 10}));
    }
    Ok(rows)
}

/// Host-bound or GPU-bound: the wall time of 10 requests of workload `pw` without profiling against the host time
/// queueing their forwards (by phase) and each forward's GPU span. Warm-up first: profiled requests run without
/// graphs, and a saturating load may have moved the forward scratch (which drops the captured graphs). Prints the
/// line; → its JSON.
fn host_report(e: &AnyEngine, m: &CudaModel, body: &[u8], pw: usize) -> Result<serde_json::Value> {
    for _ in 0..3 {
        e.system_one(body)?;
    }
    let (h0, p0, t0) = (
        m.host_enqueue_ns(),
        m.host_phases(),
        std::time::Instant::now(),
    );
    m.span_start();
    for _ in 0..10 {
        e.system_one(body)?;
    }
    let wall = t0.elapsed().as_secs_f64() * 1e3 / 10.0;
    let spans = m.span_take()?;
    let gpu = spans.iter().sum::<f64>() / 10.0;
    let (lo, hi) = spans
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
    let queue = (m.host_enqueue_ns() - h0) as f64 / 1e6 / 10.0;
    let phases: Vec<(&str, f64)> = m
        .host_phases()
        .iter()
        .zip(p0)
        .map(|(&(name, ns), (_, ns0))| (name, (ns - ns0) as f64 / 1e6 / 10.0))
        .collect();
    let parts: Vec<String> = phases
        .iter()
        .map(|(name, ms)| format!("{name} {ms:.3}"))
        .collect();
    eprintln!(
        "workload {pw} without profiling: {wall:.3} ms per request, of which {queue:.3} ms queueing forwards on \
         the host ({}); the GPU from each forward's table upload to its final norm: {gpu:.3} ms per request ({} \
         forwards, {lo:.3} to {hi:.3} ms each)",
        parts.join(", "),
        spans.len() / 10
    );
    Ok(
        json!({"workload": pw, "wall_ms_per_request": wall, "host_queue_ms_per_request": queue,
        "host_phases_ms": phases.iter().map(|(n, ms)| json!({"phase": n, "ms_per_request": ms})).collect::<Vec<_>>(),
        "gpu_span_ms_per_request": gpu, "gpu_span_ms_range": [lo, hi]}),
    )
}

fn bench_engine<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
    a: &BenchSystemoneArgs,
    workloads: &[Workload],
) -> Result<Vec<serde_json::Value>> {
    let mut report = Vec::new();
    let answer = |body: &[u8]| -> Result<()> { Ok(e.system_one(body).map(|_| ())?) };
    eprintln!(
        "{}",
        if a.prefix_cache_mb > 0 {
            "contexts kept between repeats (prefix cache on: warm; --prefix-cache-mb 0 computes each)"
        } else {
            "every request computes its context (prefix cache off: cold)"
        }
    );
    eprintln!(
        "{:<36} {:>9} {:>9} {:>9} {:>12}",
        "workload (one request at a time)", "p50 ms", "p95 ms", "req/s", "decisions/s"
    );
    for (name, body, rows, unique, mean) in workloads {
        let plan = plan_body(e, body)?;
        let decisions = plan.slot_count();
        // Host work before the engine: parse, render, tokenize, plan (part of every one-at-a-time timing below).
        let t0 = Instant::now();
        for _ in 0..20 {
            plan_body(e, body)?;
        }
        let plan_ms = t0.elapsed().as_secs_f64() * 1e3 / 20.0;
        for _ in 0..3 {
            answer(body)?;
        }
        let mut t = Vec::with_capacity(a.reps);
        for _ in 0..a.reps.max(1) {
            let t0 = Instant::now();
            answer(body)?;
            t.push(t0.elapsed().as_secs_f64());
        }
        t.sort_by(f64::total_cmp);
        let (p50, p95) = (pct(&t, 0.5), pct(&t, 0.95));
        let mean_s = t.iter().sum::<f64>() / t.len() as f64;
        eprintln!(
            "{name:<36} {:>9.2} {:>9.2} {:>9.1} {:>12.1}   (parse + render + tokenize + plan: {plan_ms:.3} ms)",
            p50 * 1e3,
            p95 * 1e3,
            1.0 / mean_s,
            decisions as f64 / mean_s
        );
        // Saturating load: `b` copies of the planned request per engine call (the engine alone: no parse or plan).
        let mut sat = Vec::new();
        for &b in a.batch.iter().filter(|&&b| b > 0) {
            let refs = vec![&plan; b];
            e.score(&refs)?;
            let t0 = Instant::now();
            for _ in 0..a.batch_reps.max(1) {
                e.score(&refs)?;
            }
            let secs = t0.elapsed().as_secs_f64() / a.batch_reps.max(1) as f64;
            let rps = b as f64 / secs;
            eprintln!(
                "  {b:>3} requests per engine call         {:>9.2} ms/call {:>9.1} {:>12.1}",
                secs * 1e3,
                rps,
                rps * decisions as f64
            );
            sat.push(json!({"requests_per_call": b, "ms_per_call": secs * 1e3, "requests_per_s": rps, "decisions_per_s": rps * decisions as f64}));
        }
        report.push(json!({"workload": name, "rows": rows, "unique_tokens": unique, "mean_row_tokens": mean,
            "decisions": decisions, "plan_ms": plan_ms, "p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3, "requests_per_s": 1.0 / mean_s,
            "decisions_per_s": decisions as f64 / mean_s, "saturating": sat}));
    }
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use onepass_cuda::{Arith, AttnArith, Precision, Projection, SplitGemms, TcArith};

    fn args(precision: &str, kernels: Option<&str>) -> CudaArgs {
        CudaArgs {
            gpu_memory_mb: 64,
            gpu_precision: precision.into(),
            gpu_kernels: kernels.map(str::to_string),
            gpu_split_gemms: None,
            gpu_gdn: GdnArg::Tc,
            gpu_attention: AttnArg::Tc,
            gpu_no_trees: false,
            gpu_no_graphs: false,
            gpu_pdl: false,
            gpu_no_wgmma: false,
            gpu_release_memory: false,
            gpu_batch_invariant: false,
        }
    }

    #[test]
    fn gpu_options_parse_precision_and_kernels() {
        let o = args("bf16", None).options().unwrap();
        assert_eq!(o.precision, Precision::Bf16);
        assert_eq!(o.kernels, None, "unset: the precision's default");
        assert!(o.trees && o.graphs && !o.pdl && o.wgmma && o.keep_freed_memory);
        assert_eq!(o.memory_budget_bytes, 64 << 20);
        let o = args("split", Some("tf32")).options().unwrap();
        assert_eq!(o.precision, Precision::Bf16Split);
        assert_eq!(o.kernels, Some(TcArith::all(Arith::Tf32)));
        let o = args("f32", Some("3xtf32")).options().unwrap();
        assert_eq!(o.kernels, Some(TcArith::all(Arith::X3)));
        let t = args("split", Some("state,attn"))
            .options()
            .unwrap()
            .kernels
            .unwrap();
        assert_eq!(
            (t.prep, t.state, t.attn),
            (Arith::X3, Arith::Tf32, AttnArith::Tf32)
        );
        let t = args("split", Some("attn=bf16x3")).options().unwrap();
        assert_eq!(t.kernels.map(|k| k.attn), Some(AttnArith::Bf16x3));
        let e = args("split", Some("fp8"))
            .options()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"fp8\"") && e.contains("expected 3xtf32, tf32"),
            "{e}"
        );
        let o = args("mixed", None).options().unwrap();
        assert_eq!(
            (o.precision, o.kernels, o.split_gemms),
            (Precision::Mixed, None, None)
        );
        let e = args("half", None).options().unwrap_err().to_string();
        assert!(e.contains("--gpu-precision \"half\""), "{e}");
    }

    /// The GPU flags' help speaks to users: no internal variables, issues or experiments; the expert kernel flags
    /// under their own heading, the everyday ones not.
    #[test]
    fn gpu_flags_help_names_no_internals_and_groups_the_expert_flags() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cuda: CudaArgs,
        }
        let help = Flags::command().render_long_help().to_string();
        // Jargon of earlier work ("issue", a run name): crates/cli/tests/cli.rs checks every command's help for the rest.
        for word in ["ONEPASS_", "issue", "run s"] {
            assert!(!help.contains(word), "{word:?} in the help:\n{help}");
        }
        let (everyday, expert) = help
            .split_once(&format!("{EXPERT}:"))
            .unwrap_or_else(|| panic!("no {EXPERT:?} heading:\n{help}"));
        assert!(everyday.contains("--gpu-precision") && everyday.contains("--gpu-memory-mb"));
        for flag in [
            "--gpu-kernels",
            "--gpu-split-gemms",
            "--gpu-gdn",
            "--gpu-attention",
            "--gpu-no-trees",
            "--gpu-no-graphs",
            "--gpu-pdl",
            "--gpu-no-wgmma",
            "--gpu-release-memory",
        ] {
            assert!(
                expert.contains(flag) && !everyday.contains(flag),
                "{flag}:\n{help}"
            );
        }
    }

    #[test]
    fn gpu_switches_map_to_options() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cuda: CudaArgs,
        }
        let options = |argv: &[&str]| Flags::try_parse_from(argv).unwrap().cuda.options().unwrap();
        let o = options(&[
            "t",
            "--gpu-gdn",
            "simt",
            "--gpu-attention",
            "tiled",
            "--gpu-no-trees",
            "--gpu-no-graphs",
            "--gpu-pdl",
            "--gpu-no-wgmma",
            "--gpu-release-memory",
        ]);
        assert_eq!(o.gdn, onepass_cuda::GdnKernels::Simt);
        assert_eq!(o.attention, onepass_cuda::AttnKernels::Tiled);
        assert!(!o.trees && !o.graphs && o.pdl && !o.wgmma && !o.keep_freed_memory);
        assert!(!o.batch_invariant);
        assert!(options(&["t", "--gpu-batch-invariant"]).batch_invariant);
        let o = options(&["t", "--gpu-gdn", "tc-no-leaf"]);
        assert_eq!(o.gdn, onepass_cuda::GdnKernels::TensorCoreNoLeaf);
        assert_eq!(o.attention, onepass_cuda::AttnKernels::TensorCore);
        let e = Flags::try_parse_from(["t", "--gpu-gdn", "wy"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("tc-no-leaf") && e.contains("simt"), "{e}");
    }

    #[test]
    fn gpu_split_gemms_parse_and_need_split_precision() {
        let with = |precision: &str, spec: &str| CudaArgs {
            gpu_split_gemms: Some(spec.into()),
            ..args(precision, None)
        };
        let o = with("split", "mlp_out, gdn_in").options().unwrap();
        let s = o.split_gemms.unwrap();
        assert!(s.has(Projection::MlpOut) && s.has(Projection::GdnIn));
        assert!(!s.has(Projection::MlpIn) && !s.has(Projection::AttnOut));
        assert_eq!(s.describe(), "gdn_in,mlp_out");
        assert_eq!(
            with("split", "none").options().unwrap().split_gemms,
            Some(SplitGemms::NONE)
        );
        assert_eq!(
            with("split", "all").options().unwrap().split_gemms,
            Some(SplitGemms::ALL)
        );
        let e = with("split", "mlp_out,lm_head")
            .options()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"lm_head\"") && e.contains("gdn_in"), "{e}");
        assert_eq!(
            with("mixed", "all").options().unwrap().split_gemms,
            Some(SplitGemms::ALL)
        );
        let e = with("bf16", "all").options().unwrap_err().to_string();
        assert!(
            e.contains("applies to --gpu-precision mixed or split, not bf16"),
            "{e}"
        );
    }
}

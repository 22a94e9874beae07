//! `--device cpu|cuda` for the commands that run the model, and their CUDA paths.
//!
//! The default is cuda when a usable GPU (driver, NVRTC, cuBLAS and a device) is present, else cpu;
//! asking for cuda where there is none is an error that says what is missing.

use std::io::Write;
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

fn upload(m: &Model) -> Result<CudaModel> {
    let t0 = Instant::now();
    let g = CudaModel::from_model(m, 0).context("uploading the model to the GPU")?;
    eprintln!(
        "uploaded to {} ({}) in {:.2}s",
        g.gpu().name,
        g.gpu().arch,
        t0.elapsed().as_secs_f64()
    );
    Ok(g)
}

/// `onepass logits --device cuda`: the same JSON as the CPU path.
pub fn logits_cuda(m: &Model, ids: &[u32], last: bool, chunk: Option<usize>) -> Result<()> {
    let g = upload(m)?;
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
    let mut out = std::io::BufWriter::new(std::io::stdout());
    write!(out, "{{\"logits\": [")?;
    for (i, row) in rows.chunks_exact(v).enumerate() {
        if i > 0 {
            write!(out, ", ")?;
        }
        write!(out, "{}", serde_json::to_string(row)?)?;
    }
    writeln!(out, "]}}")?;
    out.flush()?;
    Ok(())
}

fn prompt(n: usize, vocab: u32, salt: u64) -> Vec<u32> {
    let mut x = 0x9e3779b97f4a7c15u64 ^ salt.wrapping_mul(0xbf58476d1ce4e5b9);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
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
) -> Result<()> {
    let g = upload(m)?;
    let gpu = g.gpu().clone();
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
    // Decode: one token at a time after the first prompt.
    let mut st = g.new_state()?;
    g.forward(&mut st, &prompt(lens.first().copied().unwrap_or(128), v, 1))?;
    let mut next = 1u32;
    let t0 = Instant::now();
    for _ in 0..decode {
        let h = g.forward(&mut st, &[next])?;
        next = (g.logits_rows(&h, &[(0, 5)])?[0].to_bits() % v) as u32;
    }
    let secs = t0.elapsed().as_secs_f64();
    if decode > 0 {
        eprintln!("decode: {:.1} tok/s", decode as f64 / secs);
    }
    println!(
        "{}",
        json!({
            "device": gpu.name, "arch": gpu.arch,
            "prefill": prefill,
            "systemone_like": {"rows": rows, "prefix": pre, "suffix": suf, "unique_tokens": pre + rows * suf,
                "p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3, "requests": times.len()},
            "decode": {"tokens": decode, "seconds": secs, "tokens_per_s": if secs > 0.0 { decode as f64 / secs } else { 0.0 }},
        })
    );
    Ok(())
}

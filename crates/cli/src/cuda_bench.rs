//! The CUDA paths of `onepass logits` and `onepass bench`: the model uploaded in a chosen precision, logits as the
//! CPU path prints them, prefill / System One-like / decode timings and where a decode step's time goes.

use std::time::Instant;

use anyhow::{Context, Result};
use onepass_cuda::CudaModel;
use onepass_model::Model;
use serde_json::json;

/// Uploads `m` to GPU 0 in `precision` (the other options their defaults, no memory cap); its line on stderr names
/// the precision the model runs in (mixed where half does not fit it).
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
        g.precision().name(),
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

/// The `p` quantile of `sorted` (nearest rank).
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
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

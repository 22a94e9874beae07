//! `onepass bench-systemone`: System One latency and throughput on three fixed request sizes, on the CPU or a GPU
//! (p50/p95 one request at a time, saturating loads, and on the GPU where a request's time goes).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use onepass_cuda::CudaModel;
use serde_json::json;

use crate::cuda_bench::pct;
use crate::device::{load_engine, plan_body, AnyEngine, CudaArgs, DeviceArg};

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
    /// Also time this many requests per workload that the engine has not seen, one at a time: each has a few more
    /// words in its state than the one before, so none repeats an earlier request's shape (on the GPU: no CUDA
    /// graph to replay) or context (no prefix-cache hit), as in a stream of distinct users' requests. On the GPU,
    /// with --profile-workload, as many more of that workload split their time into the host's launches and the
    /// GPU's span. 0: none.
    #[arg(long, default_value_t = 0)]
    unseen: usize,
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

/// Variant `i` of a workload's request: its state's note (bench_state's) followed by `i` more words, so its
/// prefix has more tokens than variant `i - 1`'s.
fn unseen_body(body: &[u8], i: usize) -> Result<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(body)?;
    let note = v["state"]["note"]
        .as_str()
        .context("the workload's state has no note")?
        .to_string();
    v["state"]["note"] = json!(format!("{note}{}", " Again.".repeat(i)));
    Ok(serde_json::to_vec(&v)?)
}

/// `n` requests of a workload (`body`) the engine has not seen, timed one at a time (unseen_body's variants 1..=n;
/// planned first, untimed, to count their distinct row lengths), and how many CUDA graphs their forwards launched
/// (`graphs`: the count so far; with shape buckets, requests whose rows share a bucket replay one). Prints the line;
/// → its JSON.
fn time_unseen<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
    body: &[u8],
    n: usize,
    graphs: &dyn Fn() -> u64,
) -> Result<serde_json::Value> {
    let bodies: Vec<Vec<u8>> = (1..=n)
        .map(|i| unseen_body(body, i))
        .collect::<Result<_>>()?;
    let mut shapes = std::collections::BTreeSet::new();
    for b in &bodies {
        let p = plan_body(e, b)?;
        shapes.insert(p.rows.iter().map(|r| r.ids.len()).collect::<Vec<_>>());
    }
    let mut t = Vec::with_capacity(n);
    let graphs0 = graphs();
    for b in &bodies {
        let t0 = Instant::now();
        e.system_one(b)?;
        t.push(t0.elapsed().as_secs_f64());
    }
    let launched = graphs() - graphs0;
    t.sort_by(f64::total_cmp);
    let (p50, p95) = (pct(&t, 0.5), pct(&t, 0.95));
    eprintln!(
        "  {n:>3} unseen requests, one at a time {:>9.2} {:>9.2}   ({} distinct row lengths; each request new to the \
         engine; {launched} graph launches)",
        p50 * 1e3,
        p95 * 1e3,
        shapes.len()
    );
    Ok(
        json!({"requests": n, "distinct_row_lengths": shapes.len(), "p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3,
        "graph_launches": launched}),
    )
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
    // Graph launches so far (the GPU's; none on the CPU), for the new requests' line.
    let graphs = || {
        any.model()
            .as_cuda()
            .map_or(0, |m| m.model().graph_launches())
    };
    let report = bench_engine(&any, &a, &timed, &graphs)?;
    // Where the time goes (the profiled workload: GPU time by op, then host time against GPU time).
    let (mut profile, mut host, mut host_unseen) =
        (Vec::new(), serde_json::Value::Null, serde_json::Value::Null);
    let pw = a.profile_workload;
    if let (Some(m), true) = (any.model().as_cuda(), pw > 0) {
        let body = &workloads[pw - 1].1;
        profile = ops_report(&any, m.model(), body, pw)?;
        host = host_report(&any, m.model(), body, pw)?;
        if a.unseen > 0 {
            host_unseen = unseen_host_report(&any, m.model(), body, pw, a.unseen)?;
        }
    }
    println!(
        "{}",
        json!({"device": device, "model": dir.display().to_string(), "prefix_cache_mb": a.prefix_cache_mb, "workloads": report, "profile": profile, "host": host, "host_unseen": host_unseen})
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
    let phases: Vec<(&str, f64)> = phases_since(m, p0)
        .into_iter()
        .map(|(name, ms)| (name, ms / 10.0))
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

/// The host's time in each queueing phase since `p0` (an earlier [`CudaModel::host_phases`]), ms.
fn phases_since(m: &CudaModel, p0: [(&'static str, u64); 4]) -> Vec<(&'static str, f64)> {
    m.host_phases()
        .iter()
        .zip(p0)
        .map(|(&(name, ns), (_, ns0))| (name, (ns - ns0) as f64 / 1e6))
        .collect()
}

/// The same split for `n` requests of workload `pw` that the engine has not seen (unseen_body's variants n + 1 ..=
/// 2n, longer than the ones `--unseen` timed), each timed alone: its wall time, the host's time queueing its
/// forwards (by phase) and their GPU span, and whether any forward replayed a graph. A new shape runs its forward
/// kernel by kernel, so this says whether such a request waits on the host's launches or on the GPU. Prints the
/// line; → its JSON.
fn unseen_host_report(
    e: &AnyEngine,
    m: &CudaModel,
    body: &[u8],
    pw: usize,
    n: usize,
) -> Result<serde_json::Value> {
    let bodies: Vec<Vec<u8>> = (n + 1..=2 * n)
        .map(|i| unseen_body(body, i))
        .collect::<Result<_>>()?;
    let graphs0 = m.graph_launches();
    // Per request: wall, host queueing, GPU span, and the host's time in each phase (host_phases' order).
    let (mut wall, mut queue, mut gpu) = (vec![], vec![], vec![]);
    let mut phase = m.host_phases().map(|_| Vec::with_capacity(n));
    for b in &bodies {
        let (h0, p0) = (m.host_enqueue_ns(), m.host_phases());
        m.span_start();
        let t0 = Instant::now();
        e.system_one(b)?;
        wall.push(t0.elapsed().as_secs_f64() * 1e3);
        gpu.push(m.span_take()?.iter().sum::<f64>());
        queue.push((m.host_enqueue_ns() - h0) as f64 / 1e6);
        for (v, (_, ms)) in phase.iter_mut().zip(phases_since(m, p0)) {
            v.push(ms);
        }
    }
    let replays = m.graph_launches() - graphs0;
    let p50_max = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (pct(v, 0.5), v.last().copied().unwrap_or(0.0))
    };
    let [(w50, wmax), (q50, qmax), (g50, gmax)] = [&mut wall, &mut queue, &mut gpu].map(p50_max);
    let phase = phase.each_mut().map(p50_max);
    let names = m.host_phases().map(|(name, _)| name);
    let phases: Vec<String> = names
        .iter()
        .zip(&phase)
        .map(|(name, (p50, max))| format!("{name} {p50:.3} / {max:.3}"))
        .collect();
    eprintln!(
        "workload {pw}, {n} requests new to the engine, each alone: {w50:.3} ms p50 ({wmax:.3} the slowest), of which \
         {q50:.3} ms queueing forwards on the host ({qmax:.3} the most; by phase, p50 / most: {}); the GPU span \
         {g50:.3} ms ({gmax:.3} the most); graph launches {replays}",
        phases.join(", ")
    );
    Ok(
        json!({"workload": pw, "requests": n, "graph_launches": replays,
        "wall_ms": {"p50": w50, "max": wmax}, "host_queue_ms": {"p50": q50, "max": qmax},
        "host_phases_ms": names.iter().zip(&phase)
            .map(|(name, (p50, max))| json!({"phase": name, "p50": p50, "max": max})).collect::<Vec<_>>(),
        "gpu_span_ms": {"p50": g50, "max": gmax}}),
    )
}

fn bench_engine<B: onepass_decide::engine::Backend>(
    e: &onepass_decide::Engine<B>,
    a: &BenchSystemoneArgs,
    workloads: &[Workload],
    graphs: &dyn Fn() -> u64,
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
        let unseen = if a.unseen > 0 {
            time_unseen(e, body, a.unseen, graphs)?
        } else {
            serde_json::Value::Null
        };
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
            "decisions_per_s": decisions as f64 / mean_s, "unseen": unseen, "saturating": sat}));
    }
    Ok(report)
}

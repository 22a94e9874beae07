//! The GPU's sampler (`onepass_cuda::sample`) against the host's `sample` (onepass-model): the same token and the
//! generator one step on for every draw, over random and adversarial logits (ties, NaN of both signs, ±inf, a
//! dominant logit, all equal), temperatures 0.3 / 1 / 2, top-k 0 / 1 / 5 / 50 / 2,048 / 5,000, top-p 0.1 / 0.9 / 1,
//! vocabularies from 2 to 248,320, thousands of seeds; then sampled decoding queued on the device
//! (`CudaModel::sample_steps`) against the per-step host path (`logits_step`, then the host's `sample`), and the cost
//! of a draw. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
//!
//! A draw that differs is accepted only as a boundary case: the host's own algorithm (re-implemented here with two
//! knobs, checked against `sample` itself) gives the GPU's token once its total or its draw is moved by a relative
//! 1e-15 to 1e-12, the last-bit differences of f64 sums in another order (`onepass_cuda::sample`'s exactness
//! note). Those are counted and printed with their margin; any other difference fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::{gpu, per_call_us, rnd};
use onepass_cuda::sample::{SamplePlan, Sampler};
use onepass_cuda::{CudaModel, Precision};
use onepass_model::sample::{argmax, sample, Rng, Sampling};
use onepass_model::{synth, Model};
use onepass_tensor::DType;

/// Test logits of `kind` over `v` ids.
fn logits(kind: &str, v: usize, seed: u64) -> Vec<f32> {
    let u = rnd(v, seed);
    let pick = |i: usize, m: usize| (u[(i * 7919) % v].to_bits() as usize + i).is_multiple_of(m);
    match kind {
        "random" => u.iter().map(|x| 4.0 * x).collect(),
        // A model's shape: log-rank decay over shuffled ids, a little noise.
        "peaked" => (0..v)
            .map(|i| {
                let rank = (i * 48_271 + seed as usize) % v;
                -1.5 * ((rank + 1) as f32).ln() + 0.05 * u[i]
            })
            .collect(),
        "dominant" => {
            let mut l: Vec<f32> = u.iter().map(|x| 2.0 * x).collect();
            l[(seed as usize * 31) % v] = 30.0;
            l
        }
        "ties" => u.iter().map(|x| (4.0 * x).round()).collect(),
        "equal" => vec![0.0; v],
        "special" => (0..v)
            .map(|i| match i % 11 {
                0 if pick(i, 3) => f32::NAN,
                1 if pick(i, 3) => -f32::NAN,
                2 if pick(i, 2) => f32::NEG_INFINITY,
                3 => 0.0,
                4 => -0.0,
                _ => 3.0 * u[i],
            })
            .collect(),
        "mostly-inf" => {
            let mut l = vec![f32::NEG_INFINITY; v];
            for j in 0..3.min(v) {
                l[(j * 977 + seed as usize) % v] = j as f32 * 0.5;
            }
            l
        }
        "pos-inf" => {
            let mut l: Vec<f32> = u.iter().map(|x| 4.0 * x).collect();
            l[(seed as usize * 13) % v] = f32::INFINITY;
            l
        }
        "all-neg-inf" => vec![f32::NEG_INFINITY; v],
        _ => panic!("logits kind {kind}"),
    }
}

/// The host's draw as `sample` makes it, with the uniform `u` given, the total moved by `1 + dt` and the draw by
/// `1 + dr` (whole-vocabulary sort instead of the first cut: the same result, `sample`'s note on its first cut).
fn host_moved(l: &[f32], s: &Sampling, u: f64, dt: f64, dr: f64) -> u32 {
    let v = l.len();
    let t = s.temperature as f64;
    let max = l[argmax(l) as usize] as f64;
    let w = |x: f32| {
        if x.is_nan() {
            0.0
        } else {
            ((x as f64 - max) / t).exp()
        }
    };
    let top_p = s.top_p.clamp(0.0, 1.0) as f64;
    let k = if s.top_k == 0 { v } else { s.top_k.min(v) };
    let total = l.iter().map(|&x| w(x)).sum::<f64>() * (1.0 + dt);
    if k == v && top_p >= 1.0 {
        let mut r = u * total * (1.0 + dr);
        let mut last = 0;
        for (i, &x) in l.iter().enumerate() {
            let wi = w(x);
            if wi > 0.0 {
                last = i;
                if r < wi {
                    return i as u32;
                }
                r -= wi;
            }
        }
        return last as u32;
    }
    let mut order: Vec<u32> = (0..v as u32).collect();
    order.sort_unstable_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
    let mut n = k;
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (j, &i) in order[..k].iter().enumerate() {
            acc += w(l[i as usize]);
            if acc >= top_p * total {
                n = j + 1;
                break;
            }
        }
    }
    let mass: f64 = order[..n].iter().map(|&i| w(l[i as usize])).sum();
    let mut r = u * mass * (1.0 + dr);
    for &i in &order[..n] {
        let wi = w(l[i as usize]);
        if r < wi {
            return i;
        }
        r -= wi;
    }
    order[n - 1]
}

/// The smallest relative move of the total or the draw (1e-15 .. 1e-12) under which the host gives `got`, or `None`.
fn boundary_margin(l: &[f32], s: &Sampling, seed: u64, got: u32) -> Option<f64> {
    let u = Rng::new(seed).next_f64();
    assert_eq!(
        host_moved(l, s, u, 0.0, 0.0),
        sample(l, s, &mut Rng::new(seed)),
        "the test's copy of the host's draw"
    );
    [1e-15, 1e-14, 1e-13, 1e-12].into_iter().find(|&e| {
        [
            (e, 0.0),
            (-e, 0.0),
            (0.0, e),
            (0.0, -e),
            (e, e),
            (-e, -e),
            (e, -e),
            (-e, e),
        ]
        .iter()
        .any(|&(dt, dr)| host_moved(l, s, u, dt, dr) == got)
    })
}

/// Draw outcomes: equal to the host, boundary cases (with margins), and failures (described).
#[derive(Default)]
struct Tally {
    equal: usize,
    boundary: Vec<String>,
    fails: Vec<String>,
}

/// Every seed of `seeds` through the GPU and the host on logits `l` under `s`.
fn check(
    t: &mut Tally,
    sm: &Sampler,
    g: &onepass_cuda::Gpu,
    l: &[f32],
    s: &Sampling,
    seeds: &[u64],
    what: &str,
) {
    let x = g.upload(l).unwrap();
    let dev: Vec<(u32, u64)> = seeds
        .iter()
        .map(|&seed| sm.draw_at(g, g.ptr(&x), s, seed).unwrap())
        .collect();
    // The host's draws on every core (a 248,320-id draw takes milliseconds there).
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let host: Vec<(u32, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = seeds
            .chunks(seeds.len().div_ceil(threads).max(1))
            .map(|c| {
                sc.spawn(move || {
                    c.iter()
                        .map(|&seed| {
                            let mut r = Rng::new(seed);
                            (sample(l, s, &mut r), r.state())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    for ((&seed, &(gt, gs)), &(ht, hs)) in seeds.iter().zip(&dev).zip(&host) {
        let case = format!("{what} {s:?} seed {seed}");
        if gs != hs {
            t.fails
                .push(format!("{case}: generator state {gs:#x}, host {hs:#x}"));
        }
        if gt == ht {
            t.equal += 1;
            continue;
        }
        match boundary_margin(l, s, seed, gt) {
            Some(m) => t
                .boundary
                .push(format!("{case}: {gt} (host {ht}), margin {m:e}")),
            None => t.fails.push(format!("{case}: token {gt}, host {ht}")),
        }
    }
}

fn settings() -> Vec<Sampling> {
    let mut v = Vec::new();
    for temperature in [0.3f32, 1.0, 2.0] {
        for top_k in [0usize, 1, 5, 50, 2048, 5000] {
            for top_p in [0.1f32, 0.9, 1.0] {
                v.push(Sampling {
                    temperature,
                    top_k,
                    top_p,
                });
            }
        }
    }
    v
}

const KINDS: [&str; 9] = [
    "random",
    "peaked",
    "dominant",
    "ties",
    "equal",
    "special",
    "mostly-inf",
    "pos-inf",
    "all-neg-inf",
];

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn sampler_draws_what_the_host_draws() {
    let g = gpu();
    let mut t = Tally::default();
    let mut draws_by_size = Vec::new();
    // (vocabulary, seeds per logits and settings)
    for (v, per) in [
        (2usize, 40),
        (7, 40),
        (300, 120),
        (3000, 24),
        (5000, 24),
        (248_320, 4),
    ] {
        let sm = Sampler::new(&g, v).unwrap();
        let before = t.equal + t.boundary.len() + t.fails.len();
        for (ki, kind) in KINDS.iter().enumerate() {
            let l = logits(kind, v, 100 + ki as u64);
            for (si, s) in settings().iter().enumerate() {
                let seeds: Vec<u64> = (0..per as u64)
                    .map(|i| i * 1_000_003 + si as u64 * 7 + ki as u64)
                    .collect();
                check(&mut t, &sm, &g, &l, s, &seeds, &format!("V {v} {kind}"));
            }
        }
        draws_by_size.push((v, t.equal + t.boundary.len() + t.fails.len() - before));
    }
    // Thousands of seeds where a model's decode draws: 248,320 ids, a model's shape of logits.
    let v = 248_320;
    let sm = Sampler::new(&g, v).unwrap();
    let l = logits("peaked", v, 7);
    let seeds: Vec<u64> = (0..2000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9) ^ 0x5eed)
        .collect();
    for (temperature, top_k, top_p) in [
        (1.0f32, 0usize, 0.9f32),
        (0.7, 50, 1.0),
        (1.0, 0, 1.0),
        (0.8, 40, 0.95),
    ] {
        let s = Sampling {
            temperature,
            top_k,
            top_p,
        };
        check(
            &mut t,
            &sm,
            &g,
            &l,
            &s,
            &seeds,
            "V 248320 peaked, many seeds",
        );
    }
    let total = t.equal + t.boundary.len() + t.fails.len();
    eprintln!(
        "sampler: {total} draws ({draws_by_size:?} by vocabulary, then 8,000 at 248,320): {} equal to the host, {} \
         boundary cases, {} differences",
        t.equal,
        t.boundary.len(),
        t.fails.len()
    );
    for b in &t.boundary {
        eprintln!("  boundary: {b}");
    }
    for f in t.fails.iter().take(20) {
        eprintln!("  DIFFERS: {f}");
    }
    assert!(
        t.fails.is_empty(),
        "{} draws differ from the host's",
        t.fails.len()
    );
    assert!(
        t.boundary.len() * 1000 <= total,
        "more boundary cases than last-bit differences explain: {}",
        t.boundary.len()
    );
}

/// µs per draw at 248,320 ids: one draw as a CUDA graph (how a decode step runs it) and launched directly, for the
/// settings' paths, beside the greedy argmax.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn sampler_timing_at_248320() {
    let g = gpu();
    let v = 248_320;
    let sm = Sampler::new(&g, v).unwrap();
    let out: cudarc::driver::CudaSlice<i32> = g.zeros(1).unwrap();
    let o = g.ptr(&out);
    let argmax_us = {
        let x = g.upload(&logits("peaked", v, 3)).unwrap();
        let p = g.ptr(&x);
        per_call_us(&g, &|| {
            onepass_cuda::ops::argmax_rows(&g, p, 1, v, o).unwrap()
        })
    };
    eprintln!("draw at {v} ids, H200: greedy argmax {argmax_us:.1} µs (direct launch)");
    for (what, kind, temperature, top_k, top_p) in [
        ("top-k 50", "peaked", 0.7f32, 50usize, 1.0f32),
        ("top-k 20, top-p 0.95", "peaked", 0.6, 20, 0.95),
        (
            "top-p 0.9 (set within the first cut)",
            "peaked",
            1.0,
            0,
            0.9,
        ),
        (
            "top-p 0.9 (flat logits: the wide path)",
            "random",
            1.0,
            0,
            0.9,
        ),
        ("top-k 5000 (the wide path)", "peaked", 1.0, 5000, 1.0),
        ("full distribution", "peaked", 1.0, 0, 1.0),
    ] {
        let s = Sampling {
            temperature,
            top_k,
            top_p,
        };
        let x = g.upload(&logits(kind, v, 3)).unwrap();
        let p = g.ptr(&x);
        let plan = SamplePlan::new(&s, v).unwrap();
        sm.set(&g, &plan, 1).unwrap();
        let direct = per_call_us(&g, &|| sm.queue(&g, plan.mode, p, o).unwrap());
        g.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .unwrap();
        sm.queue(&g, plan.mode, p, o).unwrap();
        let graph = g
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .unwrap();
        let graphed = per_call_us(&g, &|| graph.launch().unwrap());
        // The host's draw over the same logits, as a sampled step ran before (after copying them to the host).
        let host_l = logits(kind, v, 3);
        let t0 = std::time::Instant::now();
        let mut rng = Rng::new(1);
        for _ in 0..10 {
            std::hint::black_box(sample(&host_l, &s, &mut rng));
        }
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / 10.0;
        eprintln!(
            "  {what} ({:?}): {graphed:.1} µs per draw as a graph, {direct:.1} launched directly; the host's \
             sample() {host_us:.0} µs",
            plan.mode
        );
    }
}

/// Sampled decoding queued on the device (each step one graph ending in the draw, the generator's state on the
/// device) against the per-step host path (`logits_step`: the same graph's logits to the host, then the host's
/// `sample`) for 16 steps, on a synthetic checkpoint with Qwen3.5's 248,320-id vocabulary, under settings that take
/// each path of the draw: the same tokens and positions. A difference is accepted only as a boundary case (the
/// module's text), and ends that setting's comparison.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn sample_steps_draw_what_host_steps_draw() {
    let g = gpu();
    let dir = tempfile::tempdir().unwrap();
    let spec = synth::SynthSpec {
        dtype: DType::BF16,
        ..synth::preset("tiny-qwen-vocab").unwrap()
    };
    synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).unwrap();
    let m = Model::load(dir.path()).unwrap();
    let vocab = m.vocab_size();
    let gm = CudaModel::with_precision(&m, g.clone(), Precision::Bf16Split).expect("upload");
    let serial = std::sync::Mutex::new(());
    let prompt = common::forward_check::ids(12, vocab, 5);
    const STEPS: usize = 16;
    let mut boundary = 0;
    for (si, (temperature, top_k, top_p)) in [
        (1.0f32, 0usize, 1.0f32),
        (0.8, 50, 1.0),
        (1.0, 0, 0.9),
        (0.5, 0, 0.5),
        (1.5, 5000, 1.0),
        (0.7, 20, 0.95),
    ]
    .into_iter()
    .enumerate()
    {
        let s = Sampling {
            temperature,
            top_k,
            top_p,
        };
        let seed = 40 + si as u64;
        let start = |gm: &CudaModel| {
            let mut st = gm.new_state().unwrap();
            let h = gm.forward(&mut st, &prompt).unwrap();
            let l = gm.logits_at(&h, &[prompt.len() - 1]).unwrap();
            let mut rng = Rng::new(seed);
            let first = sample(&l, &s, &mut rng);
            (st, first, rng)
        };
        // The host path: each step's logits to the host, drawn there.
        let (mut a, first, mut rng) = start(&gm);
        let mut host = Vec::new();
        let mut step_logits = Vec::new();
        let mut tok = first;
        let t0 = std::time::Instant::now();
        for _ in 0..STEPS {
            let l = gm
                .logits_step(&mut a, tok)
                .unwrap()
                .expect("the decode buffers are free");
            let seed_here = rng.state();
            tok = sample(&l, &s, &mut rng);
            host.push(tok);
            step_logits.push((l, seed_here));
        }
        let host_secs = t0.elapsed().as_secs_f64();
        // The device path, continuing the generator where the first draw left it.
        let (mut b, first_b, rng_b) = start(&gm);
        assert_eq!(first, first_b);
        let mut dev = Vec::new();
        let t0 = std::time::Instant::now();
        let fed = gm
            .sample_steps(&mut b, first, STEPS, &s, rng_b.state(), &serial, &mut |t| {
                dev.push(t);
                true
            })
            .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!(fed, Some(STEPS));
        assert_eq!(b.position(), a.position());
        let plan = SamplePlan::new(&s, vocab).unwrap();
        eprintln!(
            "{s:?} ({:?}): {STEPS} steps, drawn on the device {:.0} tok/s, on the host {:.0} tok/s; tokens \
             {host:?}",
            plan.mode,
            STEPS as f64 / secs,
            STEPS as f64 / host_secs
        );
        match (0..STEPS).find(|&i| dev[i] != host[i]) {
            None => {}
            Some(i) => {
                let (l, seed_here) = &step_logits[i];
                let m = boundary_margin(l, &s, *seed_here, dev[i]);
                assert!(
                    m.is_some(),
                    "{s:?}: step {i} drew {} on the device, {} on the host (device {dev:?})",
                    dev[i],
                    host[i]
                );
                eprintln!("  boundary case at step {i}: margin {m:?}");
                boundary += 1;
            }
        }
    }
    // Greedy settings run the greedy decode (no number drawn), as on the host.
    let s = Sampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };
    let mut st = gm.new_state().unwrap();
    gm.forward(&mut st, &prompt).unwrap();
    let mut greedy = Vec::new();
    let t0 = std::time::Instant::now();
    gm.sample_steps(&mut st, 1, STEPS, &s, 9, &serial, &mut |t| {
        greedy.push(t);
        true
    })
    .unwrap();
    eprintln!(
        "greedy through sample_steps: {:.0} tok/s; {boundary} boundary cases above",
        STEPS as f64 / t0.elapsed().as_secs_f64()
    );
    let mut st = gm.new_state().unwrap();
    gm.forward(&mut st, &prompt).unwrap();
    let mut want = Vec::new();
    gm.greedy_steps(&mut st, 1, STEPS, &serial, &mut |t| {
        want.push(t);
        true
    })
    .unwrap();
    assert_eq!(greedy, want);
}

//! The tensor-core WY state pass (`onepass_cuda::gdn_tc`) against the CPU recurrence and against its SIMT twin
//! `ops::gdn_wy_state`, outputs and final states, on the shapes of the WY tests in tests/ops.rs plus shapes whose
//! tiles cannot take 16-byte copies, every slice width, many segments. Runs only with ONEPASS_CUDA_TESTS=1;
//! `gdn_tc_timings` (ONEPASS_CUDA_BENCH=1 too) times the pair on the Qwen3.5-0.8B head shape.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::gdn_tc;
use onepass_cuda::ops::{self, GdnDims};
use onepass_cuda::{CudaError, Gpu};
use onepass_kernels as cpu;

struct DeltaCase {
    d: GdnDims,
    lens: Vec<usize>,
    /// qkv: [N, cd] (q, k normalised; q scaled)
    qkv: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<Vec<f32>>,
}

/// The inputs of tests/ops.rs's gated delta tests: L2-normalised q and k (q times 1/sqrt(dk)), decays in
/// [-1.01, -0.01), beta in [0, 1), non-zero initial states.
fn delta_case(d: GdnDims, lens: &[usize], seed: u64) -> DeltaCase {
    let n: usize = lens.iter().sum();
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let mut qkv = rnd(n * cd, seed);
    let scale = 1.0 / (d.dk as f32).sqrt();
    for row in qkv.chunks_exact_mut(cd) {
        cpu::l2_normalize(&mut row[..2 * d.hk * d.dk], d.dk, 1e-6);
        row[..d.hk * d.dk].iter_mut().for_each(|v| *v *= scale);
    }
    let g = rnd(n * d.hv, seed + 1)
        .iter()
        .map(|x| -0.5 * (x + 1.0) - 0.01)
        .collect();
    let beta = rnd(n * d.hv, seed + 2)
        .iter()
        .map(|x| 0.5 * (x + 1.0))
        .collect();
    let s0 = (0..lens.len())
        .map(|s| rnd(d.hv * d.dk * d.dv, seed + 10 + s as u64))
        .collect();
    DeltaCase {
        d,
        lens: lens.to_vec(),
        qkv,
        g,
        beta,
        s0,
    }
}

/// CPU reference per segment: outputs [N, HV, DV] and final states.
fn delta_cpu(c: &DeltaCase) -> (Vec<f32>, Vec<Vec<f32>>) {
    let d = c.d;
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let n: usize = c.lens.iter().sum();
    let mut out = vec![0.0; n * d.hv * d.dv];
    let mut states = Vec::new();
    let mut start = 0;
    for (s, &t) in c.lens.iter().enumerate() {
        let rows = start..start + t;
        let col = |a: usize, b: usize| -> Vec<f32> {
            rows.clone()
                .flat_map(|r| c.qkv[r * cd + a..r * cd + b].to_vec())
                .collect()
        };
        let q = col(0, d.hk * d.dk);
        let k = col(d.hk * d.dk, 2 * d.hk * d.dk);
        let v = col(2 * d.hk * d.dk, cd);
        let sh = cpu::DeltaShape {
            t,
            hk: d.hk,
            hv: d.hv,
            dk: d.dk,
            dv: d.dv,
        };
        let mut st = c.s0[s].clone();
        let o = &mut out[start * d.hv * d.dv..(start + t) * d.hv * d.dv];
        cpu::gated_delta_recurrent(
            sh,
            &q,
            &k,
            &v,
            &c.g[start * d.hv..(start + t) * d.hv],
            &c.beta[start * d.hv..(start + t) * d.hv],
            &mut st,
            o,
        );
        states.push(st);
        start += t;
    }
    (out, states)
}

/// Which state pass [`delta_gpu`] runs after `ops::gdn_wy_prep`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pass {
    /// `ops::gdn_wy_state` with its own slice (`ops::gdn_wy_slice`).
    Wy,
    /// `gdn_tc::gdn_tc_state` with this many value columns per block.
    Tc(usize),
    /// `gdn_tc::gdn_tc_chunked` (prep + state pass, its own slice).
    TcChunked,
}

/// The device copies of a case: inputs, segment table, state pointer table, output and scratch.
struct DeltaDev {
    qkv: cudarc::driver::CudaSlice<f32>,
    g: cudarc::driver::CudaSlice<f32>,
    beta: cudarc::driver::CudaSlice<f32>,
    segs: cudarc::driver::CudaSlice<i32>,
    states: Vec<cudarc::driver::CudaSlice<f32>>,
    ptrs: cudarc::driver::CudaSlice<u64>,
    out: cudarc::driver::CudaSlice<f32>,
    scratch: cudarc::driver::CudaSlice<f32>,
    n: usize,
    cd: usize,
    max_len: usize,
}

fn upload(g: &Gpu, c: &DeltaCase) -> DeltaDev {
    let d = c.d;
    let n: usize = c.lens.iter().sum();
    let mut segs = Vec::new();
    let mut start = 0;
    for &t in &c.lens {
        segs.extend([start as i32, t as i32, 0]);
        start += t;
    }
    let states: Vec<_> = c.s0.iter().map(|s| g.upload(s).unwrap()).collect();
    let ptrs: Vec<u64> = states.iter().map(|s| g.ptr(s)).collect();
    DeltaDev {
        qkv: g.upload(&c.qkv).unwrap(),
        g: g.upload(&c.g).unwrap(),
        beta: g.upload(&c.beta).unwrap(),
        segs: g.upload(&segs).unwrap(),
        ptrs: g.upload(&ptrs).unwrap(),
        states,
        out: g.zeros::<f32>(n * d.hv * d.dv).unwrap(),
        scratch: g.alloc::<f32>(n * ops::gdn_wy_scratch(d)).unwrap(),
        n,
        cd: 2 * d.hk * d.dk + d.hv * d.dv,
        max_len: c.lens.iter().copied().max().unwrap_or(0),
    }
}

/// Runs `pass` once on a case's device copies (the states are overwritten in place).
fn run(g: &Gpu, c: &DeltaCase, dev: &DeltaDev, pass: Pass) -> Result<(), CudaError> {
    let d = c.d;
    let ns = c.lens.len();
    let (x, gp, bp, o, sp, pp, wy) = (
        g.ptr(&dev.qkv),
        g.ptr(&dev.g),
        g.ptr(&dev.beta),
        g.ptr(&dev.out),
        g.ptr(&dev.segs),
        g.ptr(&dev.ptrs),
        g.ptr(&dev.scratch),
    );
    match pass {
        Pass::TcChunked => gdn_tc::gdn_tc_chunked(
            g,
            x,
            dev.cd,
            gp,
            bp,
            o,
            sp,
            pp,
            ns,
            d,
            dev.n,
            dev.max_len,
            wy,
        ),
        Pass::Wy | Pass::Tc(_) => {
            ops::gdn_wy_prep(g, x, dev.cd, gp, bp, sp, ns, d, dev.n, dev.max_len, wy)?;
            match pass {
                Pass::Tc(dvs) => {
                    gdn_tc::gdn_tc_state(g, x, dev.cd, o, sp, pp, ns, d, dev.n, wy, dvs)
                }
                _ => ops::gdn_wy_state(
                    g,
                    x,
                    dev.cd,
                    o,
                    sp,
                    pp,
                    ns,
                    d,
                    dev.n,
                    wy,
                    ops::gdn_wy_slice(d, ns),
                ),
            }
        }
    }
}

/// Outputs and final states of `pass` on a fresh upload of the case.
fn delta_gpu(g: &Gpu, c: &DeltaCase, pass: Pass) -> (Vec<f32>, Vec<Vec<f32>>) {
    let dev = upload(g, c);
    run(g, c, &dev, pass).unwrap();
    let d = c.d;
    let out = g.download(&dev.out, dev.n * d.hv * d.dv).unwrap();
    let st = dev
        .states
        .iter()
        .map(|s| g.download(s, d.hv * d.dk * d.dv).unwrap())
        .collect();
    (out, st)
}

fn dims(hk: usize, hv: usize, dk: usize, dv: usize) -> GdnDims {
    GdnDims { hk, hv, dk, dv }
}

/// The tensor-core state pass at every slice width (and through `gdn_tc_chunked`) against the CPU recurrence and
/// against `ops::gdn_wy_state`, outputs and final states, on: the WY shapes of tests/ops.rs (T = 1, 63, 65, 130,
/// 200 in one batch; HV != HK; DK != DV both ways, not multiples of 8 or 16: dk 60, 36, dv 24, 100, 40; the 0.8B
/// head shape; decays x20 so e^gam underflows); shapes whose tiles take 4-byte copies (dk 30, odd dv and row
/// strides); 40 segments of 1 to 130 tokens.
#[test]
fn gdn_tc_state_matches_cpu_and_wy() {
    let Some(g) = gpu("gdn_tc_state_matches_cpu_and_wy") else {
        return;
    };
    let many: Vec<usize> = (0..40)
        .map(|i| [1, 33, 64, 65, 7, 130, 2, 128][i % 8])
        .collect();
    let cases: Vec<(GdnDims, Vec<usize>, f32)> = vec![
        (dims(2, 4, 60, 24), vec![1, 63, 65, 130, 200], 1.0),
        (dims(1, 3, 16, 40), vec![200, 1], 1.0),
        (dims(2, 6, 36, 100), vec![65, 130], 1.0),
        (dims(2, 2, 128, 128), vec![130, 7, 64], 1.0),
        (dims(2, 4, 128, 128), vec![1, 63, 65, 200], 1.0),
        (dims(2, 4, 60, 24), vec![130, 63], 20.0),
        (dims(2, 2, 128, 128), vec![200, 3], 20.0),
        (dims(1, 2, 30, 25), vec![70, 1, 129], 1.0),
        (dims(1, 1, 36, 25), vec![65, 3], 1.0),
        (dims(2, 4, 64, 72), many, 1.0),
    ];
    for (d, lens, gscale) in cases {
        let mut c = delta_case(d, &lens, 70);
        c.g.iter_mut().for_each(|v| *v *= gscale);
        let (want_o, want_s) = delta_cpu(&c);
        let (wy_o, wy_s) = delta_gpu(&g, &c, Pass::Wy);
        let short: Vec<usize> = lens.iter().copied().take(8).collect();
        let tag = format!(
            "{d:?} {short:?}{} g x{gscale}",
            if lens.len() > 8 { "..." } else { "" }
        );
        let passes = gdn_tc::GDN_TC_SLICES
            .iter()
            .map(|&b| Pass::Tc(b))
            .chain([Pass::TcChunked]);
        for pass in passes {
            let (o, s) = delta_gpu(&g, &c, pass);
            check(&format!("tc out vs cpu {pass:?} {tag}"), &o, &want_o, 1e-4);
            check(&format!("tc out vs wy {pass:?} {tag}"), &o, &wy_o, 1e-4);
            let (mut vs_cpu, mut vs_wy) = (0.0f32, 0.0f32);
            for ((a, b), w) in s.iter().zip(&want_s).zip(&wy_s) {
                vs_cpu = vs_cpu.max(rel_err(a, b));
                vs_wy = vs_wy.max(rel_err(a, w));
            }
            eprintln!(
                "tc states {pass:?} {tag}: max|diff|/max(1,max|ref|) vs cpu {vs_cpu:.3e}, vs wy {vs_wy:.3e} (tolerance 1e-4)"
            );
            assert!(vs_cpu <= 1e-4 && vs_wy <= 1e-4, "tc states {pass:?} {tag}");
        }
    }
}

/// Shapes the tensor-core pass does not take fail with `Unsupported` (nothing launched), and `gdn_tc_chunked`
/// falls back to the SIMT pass for them.
#[test]
fn gdn_tc_state_rejects_unsupported_dims() {
    let Some(g) = gpu("gdn_tc_state_rejects_unsupported_dims") else {
        return;
    };
    let d = dims(1, 2, 136, 24);
    let c = delta_case(d, &[70, 5], 90);
    let dev = upload(&g, &c);
    for bv in [16, 12] {
        let err = run(&g, &c, &dev, Pass::Tc(bv)).unwrap_err();
        assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    }
    let d2 = dims(2, 3, 16, 16);
    assert!(
        !gdn_tc::gdn_tc_supported(&g, d2, 16),
        "hv not a multiple of hk"
    );
    let (want_o, want_s) = delta_cpu(&c);
    let (o, s) = delta_gpu(&g, &c, Pass::TcChunked);
    check("tc chunked fallback out (dk 136)", &o, &want_o, 1e-4);
    for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
        check(
            &format!("tc chunked fallback state {i} (dk 136)"),
            a,
            b,
            1e-4,
        );
    }
}

/// Not a test: with ONEPASS_CUDA_BENCH=1 (and ONEPASS_CUDA_TESTS=1), the state pass on the Qwen3.5-0.8B head shape
/// (hk 16, hv 16, dk 128, dv 128) for the System One segment shapes: µs per call (warm-up, then 20 launches,
/// synchronize, host timer) of `ops::gdn_wy_state` (its slice and 8/16/32) against `gdn_tc_state` (8/16/32/64
/// and the launcher's pick), and the pre-pass they share.
#[test]
fn gdn_tc_timings() {
    if std::env::var("ONEPASS_CUDA_BENCH").as_deref() != Ok("1") {
        return;
    }
    let Some(g) = gpu("gdn_tc_timings") else {
        return;
    };
    let d = dims(16, 16, 128, 128);
    println!(
        "| segments | prep | wy_state (its slice) | wy 8 / 16 / 32 | tc 8 / 16 / 32 / 64 | tc (its slice) | speed-up |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for lens in [vec![175], vec![33; 7], vec![3400], vec![33; 224]] {
        let c = delta_case(d, &lens, 80);
        let dev = upload(&g, &c);
        let ns = lens.len();
        let time = |what: &dyn Fn()| {
            what();
            g.sync().unwrap();
            let reps = 20;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                what();
            }
            g.sync().unwrap();
            t0.elapsed().as_secs_f64() * 1e6 / reps as f64
        };
        let (x, gp, bp, o, sp, pp, wy) = (
            g.ptr(&dev.qkv),
            g.ptr(&dev.g),
            g.ptr(&dev.beta),
            g.ptr(&dev.out),
            g.ptr(&dev.segs),
            g.ptr(&dev.ptrs),
            g.ptr(&dev.scratch),
        );
        let prep = time(&|| {
            ops::gdn_wy_prep(&g, x, dev.cd, gp, bp, sp, ns, d, dev.n, dev.max_len, wy).unwrap()
        });
        let wy_at = |dvs: usize| {
            time(&|| ops::gdn_wy_state(&g, x, dev.cd, o, sp, pp, ns, d, dev.n, wy, dvs).unwrap())
        };
        let tc_at = |dvs: usize| {
            time(&|| gdn_tc::gdn_tc_state(&g, x, dev.cd, o, sp, pp, ns, d, dev.n, wy, dvs).unwrap())
        };
        let (wy_pick, tc_pick) = (ops::gdn_wy_slice(d, ns), gdn_tc::gdn_tc_slice(d, ns));
        let wy_best = wy_at(wy_pick);
        let wys: Vec<String> = [8, 16, 32]
            .iter()
            .map(|&b| format!("{:.1}", wy_at(b)))
            .collect();
        let tcs: Vec<String> = gdn_tc::GDN_TC_SLICES
            .iter()
            .map(|&b| format!("{:.1}", tc_at(b)))
            .collect();
        let tc_best = tc_at(tc_pick);
        println!(
            "| {} x {} | {prep:.1} | {wy_best:.1} ({wy_pick}) | {} | {} | {tc_best:.1} ({tc_pick}) | {:.1}x |",
            lens.len(),
            lens[0],
            wys.join(" / "),
            tcs.join(" / "),
            wy_best / tc_best
        );
    }
    println!("(µs per call, 0.8B heads: hk 16, hv 16, dk 128, dv 128)");
}

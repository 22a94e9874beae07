//! The tensor-core WY state pass (`onepass_cuda::gdn_tc`) against the CPU recurrence and against its SIMT twin
//! `ops::gdn_wy_state`, outputs and final states, on the shapes of the WY tests in tests/ops.rs plus shapes whose
//! tiles cannot take 16-byte copies, every slice width, many segments. GPU tests: `#[ignore]`d, run with
//! `--include-ignored` on a GPU machine; `gdn_tc_timings` times the pair on the Qwen3.5-0.8B head shape.
#![allow(clippy::unwrap_used)]

mod common;

use common::delta::{
    bench_lens, cols, delta_case, delta_cpu, dims, lens_label, wy_cases, DeltaCase, DeltaDev,
    HEADS_08B,
};
use common::*;
use onepass_cuda::gdn_tc;
use onepass_cuda::ops;
use onepass_cuda::{Arith, CudaError, Gpu, TcArith};

/// Which state pass [`delta_gpu`] runs after `ops::gdn_wy_prep`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pass {
    /// `ops::gdn_wy_state` with its own slice (`ops::gdn_wy_slice`).
    Wy,
    /// `gdn_tc::gdn_tc_state` with this many value columns per block, its products as given.
    Tc(usize, Arith),
    /// `gdn_tc::gdn_tc_chunked` (prep + state pass, its own slice), both kernels' products as given.
    TcChunked(Arith),
    /// `gdn_tc::gdn_tc_leaf` (segments of at most one chunk, their states read and left as they are) with this many
    /// value columns per block.
    Leaf(usize, Arith),
}

impl Pass {
    /// Max |diff| / max(1, max |reference|) allowed against the CPU and the SIMT twin: f32 rounding for 3xTF32;
    /// [`TF32_DELTA_TOL`] for 1xTF32.
    fn tol(self) -> f32 {
        match self {
            Pass::Tc(_, Arith::Tf32)
            | Pass::TcChunked(Arith::Tf32)
            | Pass::Leaf(_, Arith::Tf32) => TF32_DELTA_TOL,
            _ => 1e-4,
        }
    }
}

/// A case's device copies (inputs, segment table, states and their table), its output and the WY scratch.
struct TcDev {
    inp: DeltaDev,
    out: cudarc::driver::CudaSlice<f32>,
    scratch: cudarc::driver::CudaSlice<f32>,
}

fn upload(g: &Gpu, c: &DeltaCase) -> TcDev {
    let d = c.d;
    let n = c.rows();
    TcDev {
        inp: DeltaDev::upload(g, c),
        out: g.zeros::<f32>(n * d.hv * d.dv).unwrap(),
        scratch: g.alloc::<f32>(n * ops::gdn_wy_scratch(d)).unwrap(),
    }
}

/// Runs `pass` once on a case's device copies (the states are overwritten in place).
fn run(g: &Gpu, c: &DeltaCase, dev: &TcDev, pass: Pass) -> Result<(), CudaError> {
    let d = c.d;
    let (ns, n, cd, ml) = (c.lens.len(), c.rows(), cols(d), c.max_len());
    let p = dev.inp.ptrs(g);
    let (o, wy) = (g.ptr(&dev.out), g.ptr(&dev.scratch));
    match pass {
        Pass::TcChunked(a) => gdn_tc::gdn_tc_chunked(
            g,
            TcArith::all(a),
            p.x,
            cd,
            p.g,
            p.beta,
            o,
            p.segs,
            gdn_tc::SegStates::own(p.states, ns),
            ns,
            d,
            n,
            ml,
            wy,
        ),
        Pass::Wy | Pass::Tc(..) | Pass::Leaf(..) => {
            ops::gdn_wy_prep(g, p.x, cd, p.g, p.beta, p.segs, ns, d, n, ml, wy)?;
            match pass {
                Pass::Tc(dvs, a) => tc_state(g, c, dev, dvs, a, true),
                Pass::Leaf(dvs, a) => leaf(g, c, dev, dvs, a),
                _ => wy_state(g, c, dev, ops::gdn_wy_slice(d, ns)),
            }
        }
    }
}

/// `gdn_tc::gdn_tc_state` alone (`dvs` value columns per block, products `a`) over the scratch the pre-pass filled;
/// `keep` false drops the states (the last chunk's update and the write-back skipped), as for a tree's children.
fn tc_state(
    g: &Gpu,
    c: &DeltaCase,
    dev: &TcDev,
    dvs: usize,
    a: Arith,
    keep: bool,
) -> Result<(), CudaError> {
    let d = c.d;
    let p = dev.inp.ptrs(g);
    let (o, wy) = (g.ptr(&dev.out), g.ptr(&dev.scratch));
    let states = (p.states, p.states, keep);
    gdn_tc::gdn_tc_state(
        g,
        a,
        p.x,
        cols(d),
        o,
        p.segs,
        states,
        c.lens.len(),
        d,
        c.rows(),
        wy,
        dvs,
    )
}

/// `gdn_tc::gdn_tc_leaf` alone (`dvs` value columns per block, products `a`) over the scratch the pre-pass filled,
/// each segment starting from its own state.
fn leaf(g: &Gpu, c: &DeltaCase, dev: &TcDev, dvs: usize, a: Arith) -> Result<(), CudaError> {
    let d = c.d;
    let p = dev.inp.ptrs(g);
    let (o, wy) = (g.ptr(&dev.out), g.ptr(&dev.scratch));
    gdn_tc::gdn_tc_leaf(
        g,
        a,
        p.x,
        cols(d),
        o,
        p.segs,
        p.states,
        c.lens.len(),
        d,
        c.rows(),
        wy,
        dvs,
    )
}

/// `ops::gdn_wy_state` alone (`dvs` value columns per block) over the scratch the pre-pass filled.
fn wy_state(g: &Gpu, c: &DeltaCase, dev: &TcDev, dvs: usize) -> Result<(), CudaError> {
    let d = c.d;
    let p = dev.inp.ptrs(g);
    let (o, wy) = (g.ptr(&dev.out), g.ptr(&dev.scratch));
    ops::gdn_wy_state(
        g,
        p.x,
        cols(d),
        o,
        p.segs,
        p.states,
        c.lens.len(),
        d,
        c.rows(),
        wy,
        dvs,
    )
}

/// Outputs and final states of `pass` on a fresh upload of the case.
fn delta_gpu(g: &Gpu, c: &DeltaCase, pass: Pass) -> (Vec<f32>, Vec<Vec<f32>>) {
    let dev = upload(g, c);
    run(g, c, &dev, pass).unwrap();
    let d = c.d;
    let out = g.download(&dev.out, c.rows() * d.hv * d.dv).unwrap();
    (out, dev.inp.download_states(g, d))
}

/// The tensor-core state pass at every slice width (and through `gdn_tc_chunked`) against the CPU recurrence and
/// against `ops::gdn_wy_state`, outputs and final states, on: the WY shapes of tests/ops.rs (T = 1, 63, 65, 130,
/// 200 in one batch; HV != HK; DK != DV both ways, not multiples of 8 or 16: dk 60, 36, dv 24, 100, 40; the 0.8B
/// head shape; decays x20 so e^gam underflows); shapes whose tiles take 4-byte copies (dk 30, odd dv and row
/// strides); 40 segments of 1 to 130 tokens. Chunks of every row-tile count (1 to 16, 17 to 32, 33 to 48, 49 to 64
/// rows), which set how the warps share a chunk's products.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gdn_tc_state_matches_cpu_and_wy() {
    let g = gpu();
    let many: Vec<usize> = (0..40)
        .map(|i| [1, 33, 64, 65, 7, 130, 2, 128, 29, 90][i % 10])
        .collect();
    let mut cases = wy_cases();
    cases.extend([
        (dims(2, 2, 128, 128), vec![200, 3, 29], 20.0),
        (dims(1, 2, 30, 25), vec![70, 1, 129], 1.0),
        (dims(1, 1, 36, 25), vec![65, 3], 1.0),
        (dims(2, 4, 64, 72), many, 1.0),
    ]);
    for (d, lens, gscale) in cases {
        let c = delta_case(d, &lens, 70).decays_x(gscale);
        let (want_o, want_s) = delta_cpu(&c);
        let (wy_o, wy_s) = delta_gpu(&g, &c, Pass::Wy);
        let short: Vec<usize> = lens.iter().copied().take(8).collect();
        let tag = format!(
            "{d:?} {short:?}{} g x{gscale}",
            if lens.len() > 8 { "..." } else { "" }
        );
        let passes = [Arith::X3, Arith::Tf32].into_iter().flat_map(|a| {
            gdn_tc::GDN_TC_SLICES
                .iter()
                .map(move |&b| Pass::Tc(b, a))
                .chain([Pass::TcChunked(a)])
        });
        for pass in passes {
            let (o, s) = delta_gpu(&g, &c, pass);
            let tol = pass.tol();
            check(&format!("tc out vs cpu {pass:?} {tag}"), &o, &want_o, tol);
            check(&format!("tc out vs wy {pass:?} {tag}"), &o, &wy_o, tol);
            let (mut vs_cpu, mut vs_wy) = (0.0f32, 0.0f32);
            for ((a, b), w) in s.iter().zip(&want_s).zip(&wy_s) {
                vs_cpu = vs_cpu.max(rel_err(a, b));
                vs_wy = vs_wy.max(rel_err(a, w));
            }
            eprintln!(
                "tc states {pass:?} {tag}: max|diff|/max(1,max|ref|) vs cpu {vs_cpu:.3e}, vs wy {vs_wy:.3e} (tolerance {tol:.0e})"
            );
            assert!(vs_cpu <= tol && vs_wy <= tol, "tc states {pass:?} {tag}");
        }
    }
}

/// The leaf pass (segments of one chunk at most, states dropped: a tree's children) at every slice width and both
/// arithmetics against the CPU recurrence's outputs, with every state left as it was: segments of 1 to 64 tokens
/// (every row-tile count), HV != HK, DK != DV not multiples of 8 or 16 (60/24), tiles that take 4-byte copies (dk 30,
/// odd dv), the 0.8B heads, strong decays (e^gam underflows), 40 segments.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gdn_tc_leaf_matches_cpu() {
    let g = gpu();
    let many: Vec<usize> = (0..40)
        .map(|i| [1, 33, 64, 7, 2, 29, 48, 17, 63, 16][i % 10])
        .collect();
    let cases = [
        (dims(2, 4, 60, 24), vec![1, 63, 64, 17, 33], 1.0),
        (dims(2, 2, 128, 128), vec![33; 7], 20.0),
        (dims(1, 2, 30, 25), vec![29, 1, 64], 1.0),
        (dims(1, 1, 36, 25), vec![40, 3], 1.0),
        (HEADS_08B, vec![33, 29, 64, 1], 1.0),
        (dims(2, 4, 64, 72), many, 1.0),
    ];
    for (d, lens, gscale) in cases {
        let c = delta_case(d, &lens, 71).decays_x(gscale);
        let (want_o, _) = delta_cpu(&c);
        let short: Vec<usize> = lens.iter().copied().take(8).collect();
        for a in [Arith::X3, Arith::Tf32] {
            for &bv in &gdn_tc::GDN_TC_LEAF_SLICES {
                let pass = Pass::Leaf(bv, a);
                let (o, s) = delta_gpu(&g, &c, pass);
                check(
                    &format!("leaf out vs cpu {pass:?} {d:?} {short:?} g x{gscale}"),
                    &o,
                    &want_o,
                    pass.tol(),
                );
                assert!(s == c.s0, "{pass:?} {d:?}: the leaf pass wrote a state");
            }
        }
    }
}

/// Shapes the tensor-core pass does not take fail with `Unsupported` (nothing launched), and `gdn_tc_chunked`
/// falls back to the SIMT pass for them.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gdn_tc_state_rejects_unsupported_dims() {
    let g = gpu();
    let d = dims(1, 2, 136, 24);
    let c = delta_case(d, &[70, 5], 90);
    let dev = upload(&g, &c);
    for bv in [16, 12] {
        let err = run(&g, &c, &dev, Pass::Tc(bv, Arith::X3)).unwrap_err();
        assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    }
    let d2 = dims(2, 3, 16, 16);
    assert!(
        !gdn_tc::gdn_tc_supported(&g, d2, 16),
        "hv not a multiple of hk"
    );
    let (want_o, want_s) = delta_cpu(&c);
    let (o, s) = delta_gpu(&g, &c, Pass::TcChunked(Arith::X3));
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

/// Not a check (ignored like the GPU tests): the state pass on the Qwen3.5-0.8B head shape
/// (hk 16, hv 16, dk 128, dv 128) for the System One segment shapes: µs per call (warm-up, then 20 launches,
/// synchronize, host timer) of `ops::gdn_wy_state` (its slice and 8/16/32) against `gdn_tc_state` (8/16/32/64
/// and the launcher's pick), and the pre-pass they share.
#[test]
#[ignore = "a timing table on a CUDA GPU, not a check (run with --include-ignored on a GPU machine)"]
fn gdn_tc_timings() {
    let g = gpu();
    let d = HEADS_08B;
    println!(
        "| segments | prep | wy_state (its slice) | wy 8 / 16 / 32 | tc 8 / 16 / 32 / 64 | tc (its slice) | speed-up | tc 1xTF32 (its slice) | leaf 32 / 64 / 128 (1xTF32 its slice) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for lens in bench_lens() {
        let c = delta_case(d, &lens, 80);
        let dev = upload(&g, &c);
        let (ns, n, cd, ml) = (lens.len(), c.rows(), cols(d), c.max_len());
        let time = |what: &dyn Fn()| per_call_us(&g, what);
        let p = dev.inp.ptrs(&g);
        let wy = g.ptr(&dev.scratch);
        let prep =
            time(&|| ops::gdn_wy_prep(&g, p.x, cd, p.g, p.beta, p.segs, ns, d, n, ml, wy).unwrap());
        let wy_at = |dvs: usize| time(&|| wy_state(&g, &c, &dev, dvs).unwrap());
        let tc_at = |dvs: usize, a: Arith| time(&|| tc_state(&g, &c, &dev, dvs, a, true).unwrap());
        let (wy_pick, tc_pick) = (ops::gdn_wy_slice(d, ns), gdn_tc::gdn_tc_slice(d, ns));
        let wy_best = wy_at(wy_pick);
        let wys: Vec<String> = [8, 16, 32]
            .iter()
            .map(|&b| format!("{:.1}", wy_at(b)))
            .collect();
        let tcs: Vec<String> = gdn_tc::GDN_TC_SLICES
            .iter()
            .map(|&b| format!("{:.1}", tc_at(b, Arith::X3)))
            .collect();
        let tc_best = tc_at(tc_pick, Arith::X3);
        let tf_best = tc_at(tc_pick, Arith::Tf32);
        // The leaf pass takes one-chunk segments only.
        let leaf_cols = if ml <= ops::GDN_CHUNK {
            let at = |b: usize, a: Arith| time(&|| leaf(&g, &c, &dev, b, a).unwrap());
            // What the children took before: the fused pass at its slice, no state kept.
            let fused = time(&|| tc_state(&g, &c, &dev, tc_pick, Arith::X3, false).unwrap());
            let all: Vec<String> = gdn_tc::GDN_TC_LEAF_SLICES
                .iter()
                .map(|&b| format!("{:.1}", at(b, Arith::X3)))
                .collect();
            let pick = gdn_tc::gdn_tc_leaf_slice(d, ns);
            format!(
                "{} ({:.1}); fused, states dropped: {fused:.1}",
                all.join(" / "),
                at(pick, Arith::Tf32)
            )
        } else {
            "-".into()
        };
        println!(
            "| {} | {prep:.1} | {wy_best:.1} ({wy_pick}) | {} | {} | {tc_best:.1} ({tc_pick}) | {:.1}x | {tf_best:.1} | {leaf_cols} |",
            lens_label(&lens),
            wys.join(" / "),
            tcs.join(" / "),
            wy_best / tc_best
        );
    }
    println!("(µs per call, 0.8B heads: hk 16, hv 16, dk 128, dv 128)");
}

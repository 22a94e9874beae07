//! `gdn_tc_prep` (the tensor-core WY pre-pass) against `ops::gdn_wy_prep` on the same inputs: U, W, M and E of
//! the scratch, for every column split; then the state pass on its scratch against the CPU recurrence (outputs and
//! final states). Runs only with ONEPASS_CUDA_TESTS=1; `gdn_tc_prep_timings` also needs ONEPASS_CUDA_BENCH=1.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::gdn_prep_tc::{gdn_tc_prep, gdn_tc_prep_sliced, gdn_tc_prep_tiles};
use onepass_cuda::ops::{self, GdnDims, GDN_CHUNK};
use onepass_cuda::Gpu;
use onepass_kernels as cpu;

/// Scratch parts against gdn_wy_prep: f32 on both sides, other summation orders and 3xTF32 products.
const PREP_TOL: f32 = 1e-5;
/// Outputs and states after the state pass, against the CPU recurrence (the bound of tests/ops.rs).
const STATE_TOL: f32 = 1e-4;

struct Case {
    d: GdnDims,
    lens: Vec<usize>,
    /// qkv: [N, cd] (q, k L2-normalised, q scaled by 1/sqrt(dk))
    qkv: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<Vec<f32>>,
}

impl Case {
    fn new(d: GdnDims, lens: &[usize], seed: u64, gscale: f32) -> Case {
        let n: usize = lens.iter().sum();
        let cd = cols(d);
        let mut qkv = rnd(n * cd, seed);
        let scale = 1.0 / (d.dk as f32).sqrt();
        for row in qkv.chunks_exact_mut(cd) {
            cpu::l2_normalize(&mut row[..2 * d.hk * d.dk], d.dk, 1e-6);
            row[..d.hk * d.dk].iter_mut().for_each(|v| *v *= scale);
        }
        let g = rnd(n * d.hv, seed + 1)
            .iter()
            .map(|x| gscale * (-0.5 * (x + 1.0) - 0.01))
            .collect();
        let beta = rnd(n * d.hv, seed + 2)
            .iter()
            .map(|x| 0.5 * (x + 1.0))
            .collect();
        let s0 = (0..lens.len())
            .map(|s| rnd(d.hv * d.dk * d.dv, seed + 10 + s as u64))
            .collect();
        Case {
            d,
            lens: lens.to_vec(),
            qkv,
            g,
            beta,
            s0,
        }
    }

    fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// segs [S, 3] = (start row, rows, position).
    fn segs(&self) -> Vec<i32> {
        let mut segs = Vec::new();
        let mut start = 0;
        for &t in &self.lens {
            segs.extend([start as i32, t as i32, 0]);
            start += t;
        }
        segs
    }
}

/// Columns of a qkv row: q [HK, DK] | k [HK, DK] | v [HV, DV].
fn cols(d: GdnDims) -> usize {
    2 * d.hk * d.dk + d.hv * d.dv
}

/// CPU recurrence per segment: outputs [N, HV, DV] and final states.
fn cpu_ref(c: &Case) -> (Vec<f32>, Vec<Vec<f32>>) {
    let d = c.d;
    let cd = cols(d);
    let mut out = vec![0.0; c.rows() * d.hv * d.dv];
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
        cpu::gated_delta_recurrent(
            sh,
            &q,
            &k,
            &v,
            &c.g[start * d.hv..(start + t) * d.hv],
            &c.beta[start * d.hv..(start + t) * d.hv],
            &mut st,
            &mut out[start * d.hv * d.dv..(start + t) * d.hv * d.dv],
        );
        states.push(st);
        start += t;
    }
    (out, states)
}

/// Scratch parts, each over all rows: U [N, HV, DV], W [N, HV, DK], M [N, HV, 64], E [N, HV, 2].
fn split_parts(d: GdnDims, n: usize, s: &[f32]) -> [(&'static str, &[f32]); 4] {
    let (u, w, m) = (n * d.hv * d.dv, n * d.hv * d.dk, n * d.hv * GDN_CHUNK);
    [
        ("U", &s[..u]),
        ("W", &s[u..u + w]),
        ("M", &s[u + w..u + w + m]),
        ("E", &s[u + w + m..u + w + m + 2 * n * d.hv]),
    ]
}

/// Which pre-pass fills the scratch.
#[derive(Clone, Copy)]
enum Prep {
    /// ops::gdn_wy_prep (the reference).
    Wy,
    /// gdn_tc_prep with the launcher's split.
    Tc,
    /// gdn_tc_prep with this many column slices.
    TcSliced(usize),
}

/// Runs `prep` on the case's inputs; returns the whole scratch and, when `state` is set, the outputs and final
/// states of `ops::gdn_wy_state` run on that scratch.
#[allow(clippy::type_complexity)]
fn run(
    g: &Gpu,
    c: &Case,
    prep: Prep,
    state: bool,
) -> (Vec<f32>, Option<(Vec<f32>, Vec<Vec<f32>>)>) {
    let d = c.d;
    let (n, ns) = (c.rows(), c.lens.len());
    let (xd, gd, bd) = (
        g.upload(&c.qkv).unwrap(),
        g.upload(&c.g).unwrap(),
        g.upload(&c.beta).unwrap(),
    );
    let sd = g.upload(&c.segs()).unwrap();
    let scratch_len = n * ops::gdn_wy_scratch(d);
    let scratch = g.zeros::<f32>(scratch_len).unwrap();
    let (x, gp, bp, sp, wy) = (
        g.ptr(&xd),
        g.ptr(&gd),
        g.ptr(&bd),
        g.ptr(&sd),
        g.ptr(&scratch),
    );
    let (cd, ml) = (cols(d), c.max_len());
    match prep {
        Prep::Wy => ops::gdn_wy_prep(g, x, cd, gp, bp, sp, ns, d, n, ml, wy).unwrap(),
        Prep::Tc => gdn_tc_prep(g, x, cd, gp, bp, sp, ns, d, n, ml, wy).unwrap(),
        Prep::TcSliced(k) => gdn_tc_prep_sliced(g, x, cd, gp, bp, sp, ns, d, n, ml, wy, k).unwrap(),
    }
    let sc = g.download(&scratch, scratch_len).unwrap();
    if !state {
        return (sc, None);
    }
    let states: Vec<_> = c.s0.iter().map(|s| g.upload(s).unwrap()).collect();
    let ptrs: Vec<u64> = states.iter().map(|s| g.ptr(s)).collect();
    let pd = g.upload(&ptrs).unwrap();
    let od = g.alloc::<f32>(n * d.hv * d.dv).unwrap();
    let dvs = ops::gdn_wy_slice(d, ns);
    ops::gdn_wy_state(g, x, cd, g.ptr(&od), sp, g.ptr(&pd), ns, d, n, wy, dvs).unwrap();
    let out = g.download(&od, n * d.hv * d.dv).unwrap();
    let st = states
        .iter()
        .map(|s| g.download(s, d.hv * d.dk * d.dv).unwrap())
        .collect();
    (sc, Some((out, st)))
}

/// U, W, M, E of two scratches, each part within `tol` (max |diff| / max(1, max |ref|)).
fn check_parts(tag: &str, d: GdnDims, n: usize, got: &[f32], want: &[f32], tol: f32) {
    for ((name, a), (_, b)) in split_parts(d, n, got)
        .into_iter()
        .zip(split_parts(d, n, want))
    {
        check(
            &format!("gdn_tc_prep {name} vs gdn_wy_prep {tag}"),
            a,
            b,
            tol,
        );
    }
}

/// The shapes of tests/ops.rs's WY test: T = 1, 63, 65, 130, 200 in one batch; HV != HK; DK != DV both ways and
/// not multiples of 16 (60/24, 16/40, 36/100); the 0.8B head shape (128/128); strong decays (g x20: e^gam
/// underflows). Every column split of the tiles, then the state pass on the launcher's split against the CPU.
#[test]
fn gdn_tc_prep_matches_wy_prep_and_cpu() {
    let Some(g) = gpu("gdn_tc_prep_matches_wy_prep_and_cpu") else {
        return;
    };
    let dims = |hk, hv, dk, dv| GdnDims { hk, hv, dk, dv };
    let cases: Vec<(GdnDims, Vec<usize>, f32)> = vec![
        (dims(2, 4, 60, 24), vec![1, 63, 65, 130, 200], 1.0),
        (dims(1, 3, 16, 40), vec![200, 1], 1.0),
        (dims(2, 6, 36, 100), vec![65, 130], 1.0),
        (dims(2, 2, 128, 128), vec![130, 7, 64], 1.0),
        (dims(2, 4, 128, 128), vec![1, 63, 65, 200], 1.0),
        (dims(2, 4, 60, 24), vec![130, 63], 20.0),
    ];
    for (d, lens, gscale) in cases {
        let c = Case::new(d, &lens, 70, gscale);
        let n = c.rows();
        let tag = format!("{d:?} {lens:?} g x{gscale}");
        let (want, _) = run(&g, &c, Prep::Wy, false);
        let tiles = gdn_tc_prep_tiles(d);
        for k in [1, 2, 3, tiles.div_ceil(8), tiles] {
            if k > tiles {
                continue;
            }
            let (got, _) = run(&g, &c, Prep::TcSliced(k), false);
            check_parts(&format!("{tag} slices {k}"), d, n, &got, &want, PREP_TOL);
        }
        let (got, st) = run(&g, &c, Prep::Tc, true);
        check_parts(
            &format!("{tag} launcher split"),
            d,
            n,
            &got,
            &want,
            PREP_TOL,
        );
        let (o, s) = st.unwrap();
        let (want_o, want_s) = cpu_ref(&c);
        check(
            &format!("gdn_tc_prep + wy_state out vs cpu {tag}"),
            &o,
            &want_o,
            STATE_TOL,
        );
        for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
            check(
                &format!("gdn_tc_prep + wy_state state {i} vs cpu {tag}"),
                a,
                b,
                STATE_TOL,
            );
        }
    }
}

/// Not a test: with ONEPASS_CUDA_BENCH=1 (and ONEPASS_CUDA_TESTS=1), µs per call of gdn_wy_prep against
/// gdn_tc_prep on the Qwen3.5-0.8B head shape (hk = hv = 16, dk = dv = 128) for the System One segment shapes
/// (warm-up, then 20 launches, one sync, host timer); each pair's scratches also compared.
#[test]
fn gdn_tc_prep_timings() {
    if std::env::var("ONEPASS_CUDA_BENCH").as_deref() != Ok("1") {
        return;
    }
    let Some(g) = gpu("gdn_tc_prep_timings") else {
        return;
    };
    let d = GdnDims {
        hk: 16,
        hv: 16,
        dk: 128,
        dv: 128,
    };
    eprintln!("gdn pre-pass, 0.8B heads 16 x 128 x 128: µs per call (20 launches)");
    eprintln!(
        "{:>12} {:>10} {:>10} {:>8}",
        "segments", "wy_prep", "tc_prep", "speedup"
    );
    for lens in [vec![175], vec![33; 7], vec![3400], vec![33; 224]] {
        let c = Case::new(d, &lens, 80, 1.0);
        let (n, ns, ml, cd) = (c.rows(), lens.len(), c.max_len(), cols(d));
        let (xd, gd, bd) = (
            g.upload(&c.qkv).unwrap(),
            g.upload(&c.g).unwrap(),
            g.upload(&c.beta).unwrap(),
        );
        let sd = g.upload(&c.segs()).unwrap();
        let len = n * ops::gdn_wy_scratch(d);
        let (s1, s2) = (g.zeros::<f32>(len).unwrap(), g.zeros::<f32>(len).unwrap());
        let (x, gp, bp, sp, w1, w2) = (
            g.ptr(&xd),
            g.ptr(&gd),
            g.ptr(&bd),
            g.ptr(&sd),
            g.ptr(&s1),
            g.ptr(&s2),
        );
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
        let old = time(&|| ops::gdn_wy_prep(&g, x, cd, gp, bp, sp, ns, d, n, ml, w1).unwrap());
        let new = time(&|| gdn_tc_prep(&g, x, cd, gp, bp, sp, ns, d, n, ml, w2).unwrap());
        let shape = format!("{} x {}", ns, lens[0]);
        eprintln!("{shape:>12} {old:>10.1} {new:>10.1} {:>7.2}x", old / new);
        let (a, b) = (g.download(&s2, len).unwrap(), g.download(&s1, len).unwrap());
        check_parts(&shape, d, n, &a, &b, PREP_TOL);
    }
}

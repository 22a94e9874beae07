//! `gdn_tc_prep` (the tensor-core WY pre-pass) against `ops::gdn_wy_prep` on the same inputs: U, W, M and E of
//! the scratch, for every column split; then the state pass on its scratch against the CPU recurrence (outputs and
//! final states). GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::delta::{
    bench_lens, cols, delta_case, delta_cpu, lens_label, wy_cases, DeltaCase, DeltaDev, HEADS_08B,
};
use common::*;
use onepass_cuda::gdn_prep_tc::{
    gdn_tc_prep, gdn_tc_prep_shape, gdn_tc_prep_sliced, gdn_tc_prep_tiles, WARPS_PAIRED,
};
use onepass_cuda::ops::{self, GdnDims, GDN_CHUNK};
use onepass_cuda::{Arith, Gpu};

/// Scratch parts against gdn_wy_prep: f32 on both sides, other summation orders and 3xTF32 products.
const PREP_TOL: f32 = 1e-5;
/// Outputs and states after the state pass, against the CPU recurrence (the bound of tests/ops.rs).
const STATE_TOL: f32 = 1e-4;

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
    Tc(Arith),
    /// gdn_tc_prep with this launch shape: (column slices, persistent blocks, tile buffers, warps per block).
    TcShape((usize, usize, usize, usize), Arith),
}

/// Runs `prep` on the case's inputs; returns the whole scratch and, when `state` is set, the outputs and final
/// states of `ops::gdn_wy_state` run on that scratch.
#[allow(clippy::type_complexity)]
fn run(
    g: &Gpu,
    c: &DeltaCase,
    prep: Prep,
    state: bool,
) -> (Vec<f32>, Option<(Vec<f32>, Vec<Vec<f32>>)>) {
    let d = c.d;
    let (n, ns) = (c.rows(), c.lens.len());
    let dev = DeltaDev::upload(g, c);
    let p = dev.ptrs(g);
    let scratch_len = n * ops::gdn_wy_scratch(d);
    let scratch = g.zeros::<f32>(scratch_len).unwrap();
    let (x, gp, bp, sp, wy) = (p.x, p.g, p.beta, p.segs, g.ptr(&scratch));
    let (cd, ml) = (cols(d), c.max_len());
    match prep {
        Prep::Wy => ops::gdn_wy_prep(g, x, cd, gp, bp, sp, ns, d, n, ml, wy).unwrap(),
        Prep::Tc(a) => gdn_tc_prep(g, a, x, cd, gp, bp, sp, ns, d, n, ml, wy).unwrap(),
        Prep::TcShape(k, a) => {
            gdn_tc_prep_sliced(g, a, x, cd, gp, bp, sp, ns, d, n, ml, wy, k).unwrap()
        }
    }
    let sc = g.download(&scratch, scratch_len).unwrap();
    if !state {
        return (sc, None);
    }
    let od = g.alloc::<f32>(n * d.hv * d.dv).unwrap();
    let dvs = ops::gdn_wy_slice(d, ns);
    ops::gdn_wy_state(g, x, cd, g.ptr(&od), sp, p.states, ns, d, n, wy, dvs).unwrap();
    let out = g.download(&od, n * d.hv * d.dv).unwrap();
    (sc, Some((out, dev.download_states(g, d))))
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

/// The shapes of tests/ops.rs's WY test (`wy_cases`): T = 1, 63, 65, 130, 200 in one batch; HV != HK; DK != DV
/// both ways and not multiples of 16 (60/24, 16/40, 36/100); the 0.8B head shape (128/128); strong decays (g x20:
/// e^gam underflows). Every column split of the tiles (a block per item, one buffer); persistent blocks taking many
/// items each (one block for all, 3 blocks: an odd count, both with the next item's tiles loading under the current
/// one; 5 blocks with one buffer; more blocks than items); the 8-warp blocks likewise, each shape the same bits as
/// the 16-warp blocks' (the same products in the same order); then the state pass on the launcher's shape against
/// the CPU; the 3xTF32 kernel and the 1xTF32 one (to its own bound).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gdn_tc_prep_matches_wy_prep_and_cpu() {
    let g = gpu();
    let cases = wy_cases()
        .into_iter()
        .flat_map(|c| [(c.clone(), Arith::X3), (c, Arith::Tf32)]);
    for ((d, lens, gscale), arith) in cases {
        let (prep_tol, state_tol) = match arith {
            Arith::X3 => (PREP_TOL, STATE_TOL),
            Arith::Tf32 => (TF32_DELTA_TOL, TF32_DELTA_TOL),
        };
        let c = delta_case(d, &lens, 70).decays_x(gscale);
        let n = c.rows();
        let tag = format!("{d:?} {lens:?} g x{gscale} {arith:?}");
        let (want, _) = run(&g, &c, Prep::Wy, false);
        let tiles = gdn_tc_prep_tiles(d);
        let items = lens.iter().map(|l| l.div_ceil(GDN_CHUNK)).sum::<usize>() * d.hv;
        let shapes = [1, 2, 3, tiles.div_ceil(16), tiles]
            .into_iter()
            .filter(|&k| k <= tiles)
            .map(|k| (k, items * k, 1))
            .chain([(1, 1, 2), (1, 3, 2), (1, 5, 1), (1, 4 * items + 7, 2)]);
        for (k, blocks, nbuf) in shapes {
            let (got16, _) = run(&g, &c, Prep::TcShape((k, blocks, nbuf, 16), arith), false);
            check_parts(
                &format!("{tag} shape {:?}", (k, blocks, nbuf)),
                d,
                n,
                &got16,
                &want,
                prep_tol,
            );
            let shape8 = (k, blocks, nbuf, WARPS_PAIRED);
            let (got8, _) = run(&g, &c, Prep::TcShape(shape8, arith), false);
            let same = got8
                .iter()
                .zip(&got16)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{tag} shape {shape8:?}: 8-warp blocks differ from 16-warp blocks"
            );
        }
        let (got, st) = run(&g, &c, Prep::Tc(arith), true);
        check_parts(
            &format!("{tag} launcher split"),
            d,
            n,
            &got,
            &want,
            prep_tol,
        );
        let (o, s) = st.unwrap();
        let (want_o, want_s) = delta_cpu(&c);
        check(
            &format!("gdn_tc_prep + wy_state out vs cpu {tag}"),
            &o,
            &want_o,
            state_tol,
        );
        for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
            check(
                &format!("gdn_tc_prep + wy_state state {i} vs cpu {tag}"),
                a,
                b,
                state_tol,
            );
        }
    }
}

/// Not a check (ignored like the GPU tests): µs per call of gdn_wy_prep against
/// gdn_tc_prep on the Qwen3.5-0.8B head shape (hk = hv = 16, dk = dv = 128) for the System One segment shapes
/// (warm-up, then 20 launches, one sync, host timer), and the 1xTF32 kernel in blocks of 16 and of 8 warps with
/// the form the launcher picks; each pair's scratches also compared.
#[test]
#[ignore = "a timing table on a CUDA GPU, not a check (run with --include-ignored on a GPU machine)"]
fn gdn_tc_prep_timings() {
    let g = gpu();
    let d = HEADS_08B;
    eprintln!("gdn pre-pass, 0.8B heads 16 x 128 x 128: µs per call (20 launches)");
    eprintln!(
        "{:>12} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>9}",
        "segments", "wy_prep", "tc_prep", "speedup", "tc 1xTF32", "16 warps", "8 warps", "launcher"
    );
    // Also the one-forward trees of the first two workloads (a 166- or 691-token prefix and the seven suffixes): the
    // pre-pass takes a tree's segments alike, 11 and 19 chunks of 16 heads.
    let suffixes = [30, 24, 66, 23, 31, 31, 31];
    let trees = [166, 691].map(|p| std::iter::once(p).chain(suffixes).collect::<Vec<_>>());
    for lens in bench_lens().into_iter().chain(trees) {
        let c = delta_case(d, &lens, 80);
        let (n, ns, ml, cd) = (c.rows(), lens.len(), c.max_len(), cols(d));
        let dev = DeltaDev::upload(&g, &c);
        let p = dev.ptrs(&g);
        let len = n * ops::gdn_wy_scratch(d);
        let (s1, s2) = (g.zeros::<f32>(len).unwrap(), g.zeros::<f32>(len).unwrap());
        let (x, gp, bp, sp, w1, w2) = (p.x, p.g, p.beta, p.segs, g.ptr(&s1), g.ptr(&s2));
        let time = |what: &dyn Fn()| per_call_us(&g, what);
        let old = time(&|| ops::gdn_wy_prep(&g, x, cd, gp, bp, sp, ns, d, n, ml, w1).unwrap());
        let tf =
            time(&|| gdn_tc_prep(&g, Arith::Tf32, x, cd, gp, bp, sp, ns, d, n, ml, w2).unwrap());
        // 1xTF32 in each block size, whatever the launcher picks: the 16-warp blocks as the launcher shapes them
        // without the 8-warp rule, the 8-warp ones two a multiprocessor, one buffer.
        let chunks = lens.iter().map(|l| l.div_ceil(GDN_CHUNK)).sum::<usize>();
        let items = chunks * d.hv;
        let picked = gdn_tc_prep_shape(&g, d, n, ns, ml, chunks);
        let s16 = (1, items.min(g.sms), if items > g.sms { 2 } else { 1 }, 16);
        let s8 = (1, items.min(2 * g.sms), 1, WARPS_PAIRED);
        let form = |k| {
            time(&|| {
                gdn_tc_prep_sliced(&g, Arith::Tf32, x, cd, gp, bp, sp, ns, d, n, ml, w2, k).unwrap()
            })
        };
        let (t16, t8) = (form(s16), form(s8));
        // Last into w2: the 3xTF32 scratch compared with gdn_wy_prep's below.
        let new =
            time(&|| gdn_tc_prep(&g, Arith::X3, x, cd, gp, bp, sp, ns, d, n, ml, w2).unwrap());
        let shape = lens_label(&lens);
        eprintln!(
            "{shape:>12} {old:>10.1} {new:>10.1} {:>7.2}x {tf:>10.1} {t16:>10.1} {t8:>10.1} {:>6} w",
            old / new,
            picked.3
        );
        let (a, b) = (g.download(&s2, len).unwrap(), g.download(&s1, len).unwrap());
        check_parts(&shape, d, n, &a, &b, PREP_TOL);
    }
}

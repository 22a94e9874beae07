//! `attention_tc` (tensor-core attention in each of its arithmetics: 3xTF32, 1xTF32, bf16x3, bf16, and one f16
//! product over f16 KV caches) against the CPU reference and against its SIMT twin `ops::attention_tiled`, on the
//! segments of the attention op test (a forked base cache included), f32 and bf16 outputs, with the launcher's key
//! splits, none, and the most; and the f16 rows `attn_prep` writes for it. GPU tests:
//! `#[ignore]`d, run with `--include-ignored` on a GPU machine; `attention_tc_timings` times them on the Qwen3.5-0.8B
//! attention shape.
#![allow(clippy::unwrap_used)]

mod common;

use common::attn::{attn_prepped, kv_table, ATTN_08B, ATTN_ODD, BASES, SEGS};
use common::*;
use onepass_cuda::attn_tc;
use onepass_cuda::ops::{self, AttnDims, Out};
use onepass_cuda::AttnArith::{self, Bf16, Bf16x3, Tf32 as TF, F16, X3};

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn attention_tc_matches_cpu_and_tiled() {
    let g = gpu();
    // Odd head dims, then the Qwen3.5 attention shape (8 heads over 2 KV heads of 256, a quarter rotated).
    for a in [ATTN_ODD, ATTN_08B] {
        attention_tc_case(&g, a);
    }
}

/// As `attention_case` in tests/ops.rs: attn_prep on the four segments of `common::attn` (63 new tokens after 5
/// cached, 65 fresh, 1 after 130 of which the first 100 come from a base cache, 130 after 2), the CPU reference,
/// then attention_tiled and attention_tc on the q and caches attn_prep wrote.
fn attention_tc_case(g: &onepass_cuda::Gpu, a: AttnDims) {
    let (h, dd) = (a.heads, a.head_dim);
    let r = attn_prepped(g, a);
    let (ld, n, max_len, want_o) = (r.ld, r.n, r.max_len, &r.want_o);
    let (pd, kvd, sgd, qd) = (&r.proj, &r.kv, &r.segs, &r.q);
    let nseg = SEGS.len();
    let scale = 1.0 / (dd as f32).sqrt();
    let ot = g.alloc::<f32>(n * h * dd).unwrap();
    ops::attention_tiled(
        g,
        g.ptr(qd),
        g.ptr(pd),
        ld,
        g.ptr(sgd),
        g.ptr(kvd),
        nseg,
        max_len,
        a,
        scale,
        Out::F32(g.ptr(&ot)),
    )
    .unwrap();
    let tiled = g.download(&ot, n * h * dd).unwrap();
    check(
        &format!("attention_tiled (f32 out) D={dd}"),
        &tiled,
        want_o,
        F32_TOL,
    );
    // attn_prep's f16 rows: the CPU's k (norm, rotary) rounded once to f16; v as attn_prep writes it into the f32
    // caches (the projection's values), rounded once.
    let row = a.kv_heads * dd;
    for (s, (c16, &(t, past))) in r.caches16.iter().zip(&SEGS).enumerate() {
        let own = (past + t - BASES[s]) * row;
        let got = from_f16_bits(&g.download(&c16[0], own).unwrap());
        check(
            &format!("attn_prep f16 k cache, segment {s}, D={dd}"),
            &got,
            &r.want_k[s][BASES[s] * row..],
            F16_TOL,
        );
        let got_v = from_f16_bits(&g.download(&c16[1], own).unwrap());
        check(
            &format!("attn_prep f16 v cache, segment {s}, D={dd}"),
            &got_v,
            &g.download(&r.caches[s][1], own).unwrap(),
            F16_TOL,
        );
    }
    let auto = attn_tc::attention_tc_plan(SEGS.map(|(len, _)| len), a, g.sms);
    let runs = [X3, TF, Bf16x3, Bf16, F16]
        .into_iter()
        .flat_map(|ar| [auto, 1, attn_tc::MAX_SPLITS].map(|s| (ar, s)));
    for (arith, splits) in runs {
        // 3xTF32: f32 rounding; the others their own bounds (tests/common). One f16 product rounds its operands
        // (q, k, v, p) as 1xTF32 does.
        let tol = match arith {
            X3 => F32_TOL,
            TF | F16 => TF32_ATTN_TOL,
            Bf16x3 => BF16X3_ATTN_TOL,
            Bf16 => BF16_ATTN_TOL,
        };
        // f16 caches for their kernel, f32 for the rest.
        let kvd = if arith == F16 { &r.kv16 } else { kvd };
        let scratch = g
            .zeros::<f32>(attn_tc::attention_tc_scratch_len(splits, n, a))
            .unwrap();
        let run = |out: Out| {
            attn_tc::attention_tc(
                g,
                arith,
                g.ptr(qd),
                g.ptr(pd),
                ld,
                g.ptr(sgd),
                g.ptr(kvd),
                nseg,
                max_len,
                n,
                a,
                scale,
                out,
                g.ptr(&scratch),
                splits,
                false,
            )
            .unwrap()
        };
        let of = g.alloc::<f32>(n * h * dd).unwrap();
        run(Out::F32(g.ptr(&of)));
        let ob = g.alloc::<u16>(n * h * dd).unwrap();
        run(Out::Bf16(g.ptr(&ob)));
        let got = g.download(&of, n * h * dd).unwrap();
        check(
            &format!("attention_tc {arith:?} (f32 out) D={dd} splits {splits}"),
            &got,
            want_o,
            tol,
        );
        check(
            &format!("attention_tc {arith:?} vs attention_tiled D={dd} splits {splits}"),
            &got,
            &tiled,
            tol,
        );
        check(
            &format!("attention_tc {arith:?} (bf16 out) D={dd} splits {splits}"),
            &from_bf16_bits(&g.download(&ob, n * h * dd).unwrap()),
            want_o,
            BF16_TOL + tol,
        );
    }
}

/// Not a check (ignored like the GPU tests): prints µs per call of attention_tiled and
/// attention_tc on the Qwen3.5-0.8B attention shape (8 heads, 2 KV heads, D 256) for the System One segment
/// shapes: a 175-token prefix, 7 suffixes of 33 over a 175-token base, a 3,400-token prefix, 10 suffixes of 30
/// over a 3,400-token base, and the one-forward trees of workloads 1 and 3 (a 199-token prefix with 7 suffixes of
/// 29 over it; 3,400 with 10 of 30): attention_tc with its plan's splits (3xTF32, 1xTF32, bf16x3, bf16, one f16
/// product on f16 caches) and with none (3xTF32).
#[test]
#[ignore = "a timing table on a CUDA GPU, not a check (run with --include-ignored on a GPU machine)"]
fn attention_tc_timings() {
    let g = gpu();
    let a = ATTN_08B;
    let (h, kvh, dd) = (a.heads, a.kv_heads, a.head_dim);
    let ld = h * 2 * dd + 2 * kvh * dd;
    let row = kvh * dd;
    let same = |nseg: usize, t: usize, base: usize| vec![(t, base); nseg];
    let tree = |root: usize, kids: usize, t: usize| {
        let mut v = vec![(root, 0)];
        v.extend(std::iter::repeat_n((t, root), kids));
        v
    };
    let bench_tree = |root: usize| -> Vec<(usize, usize)> {
        std::iter::once((root, 0))
            .chain([30, 24, 66, 23, 31, 31, 31].map(|t| (t, root)))
            .collect()
    };
    // Per segment: (tokens, base cache length = position of its first token).
    for segs_h in [
        same(1, 175, 0),
        same(7, 33, 175),
        same(1, 3400, 0),
        same(10, 30, 3400),
        tree(199, 7, 29),
        tree(3400, 10, 30),
        // The first and second workloads' trees as the bench runs them: a 166- or 691-token prefix, the seven
        // questions' suffixes.
        bench_tree(166),
        bench_tree(691),
    ] {
        let nseg = segs_h.len();
        let n: usize = segs_h.iter().map(|s| s.0).sum();
        let max_len = segs_h.iter().map(|s| s.0).max().unwrap();
        let base_max = segs_h.iter().map(|s| s.1).max().unwrap();
        let qd = g.upload(&rnd(n * h * dd, 1)).unwrap();
        let pd = g.upload(&rnd(n * ld, 2)).unwrap();
        // The base cache (shared by every segment that has one) and each segment's own rows, f32 and (for
        // attention_h) f16, and each form's KV table.
        let base_h = [3, 4].map(|seed| rnd(base_max.max(1) * row, seed));
        let own_h: Vec<[Vec<f32>; 2]> = segs_h
            .iter()
            .enumerate()
            .map(|(s, &(t, _))| [10, 50].map(|seed| rnd(t * row, seed + s as u64)))
            .collect();
        let bases = || segs_h.iter().map(|s| s.1);
        let base32 = base_h.each_ref().map(|v| g.upload(v).unwrap());
        let own32: Vec<_> = own_h
            .iter()
            .map(|o| o.each_ref().map(|v| g.upload(v).unwrap()))
            .collect();
        let base16 = base_h
            .each_ref()
            .map(|v| g.upload(&to_f16_bits(v)).unwrap());
        let own16: Vec<_> = own_h
            .iter()
            .map(|o| o.each_ref().map(|v| g.upload(&to_f16_bits(v)).unwrap()))
            .collect();
        let ptrs = kv_table(
            &g,
            own32.iter().map(|[k, v]| [k, v, &base32[0], &base32[1]]),
            bases(),
        );
        let ptrs16 = kv_table(
            &g,
            own16.iter().map(|[k, v]| [k, v, &base16[0], &base16[1]]),
            bases(),
        );
        let mut start = 0;
        let segs: Vec<i32> = segs_h
            .iter()
            .flat_map(|&(t, base)| {
                let r = [start as i32, t as i32, base as i32];
                start += t;
                r
            })
            .collect();
        let (kvd, sgd) = (g.upload(&ptrs).unwrap(), g.upload(&segs).unwrap());
        let kvd16 = g.upload(&ptrs16).unwrap();
        let od = g.alloc::<u16>(n * h * dd).unwrap();
        let splits = attn_tc::attention_tc_plan(segs_h.iter().map(|&(len, _)| len), a, g.sms);
        // Room for the split sweep below.
        let scratch = g
            .alloc::<f32>(attn_tc::attention_tc_scratch_len(8, n, a).max(1))
            .unwrap();
        let scale = 1.0 / (dd as f32).sqrt();
        let (q, p, sg, kv, o, sc) = (
            g.ptr(&qd),
            g.ptr(&pd),
            g.ptr(&sgd),
            g.ptr(&kvd),
            g.ptr(&od),
            g.ptr(&scratch),
        );
        let time = |what: &dyn Fn()| per_call_us(&g, what);
        let tiled = time(&|| {
            ops::attention_tiled(&g, q, p, ld, sg, kv, nseg, max_len, a, scale, Out::Bf16(o))
                .unwrap()
        });
        let kv16 = g.ptr(&kvd16);
        let tc = |arith: AttnArith, splits| {
            let kv = if arith == F16 { kv16 } else { kv };
            time(&|| {
                attn_tc::attention_tc(
                    &g,
                    arith,
                    q,
                    p,
                    ld,
                    sg,
                    kv,
                    nseg,
                    max_len,
                    n,
                    a,
                    scale,
                    Out::Bf16(o),
                    sc,
                    splits,
                    false,
                )
                .unwrap()
            })
        };
        let (x3, tf, one) = (tc(X3, splits), tc(TF, splits), tc(X3, 1));
        let (bx3, b1, h1) = (tc(Bf16x3, splits), tc(Bf16, splits), tc(F16, splits));
        // Split mode's kernel (bf16x3) at every key split count up to 8: what the plan's choice costs.
        let sweep: Vec<String> = (1..=8)
            .map(|s| format!("{s}: {:.1}", tc(Bf16x3, s)))
            .collect();
        let shape = if segs_h[0].1 == segs_h[nseg - 1].1 {
            format!(
                "{nseg} x {} tokens over a {}-token base",
                segs_h[0].0, segs_h[0].1
            )
        } else {
            let kids = &segs_h[1..];
            let (lo, hi) = (
                kids.iter().map(|s| s.0).min().unwrap_or(0),
                kids.iter().map(|s| s.0).max().unwrap_or(0),
            );
            let each = if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}..{hi}")
            };
            format!(
                "tree: {} tokens and {} x {each} over them",
                segs_h[0].0,
                nseg - 1
            )
        };
        println!(
            "attention 0.8B heads, {shape}: attention_tiled {tiled:.1} µs, attention_tc {x3:.1} µs \
             ({splits} key splits; {one:.1} µs with none), 1xTF32 {tf:.1} µs, bf16x3 {bx3:.1} µs, \
             bf16 {b1:.1} µs, f16 KV {h1:.1} µs; bf16x3 by key splits {}",
            sweep.join(", ")
        );
    }
}

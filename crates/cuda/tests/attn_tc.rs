//! `attention_tc` (tensor-core attention, 3xTF32) against the CPU reference and against its SIMT twin
//! `ops::attention_tiled`, on the segments of the attention op test (a forked base cache included), f32 and bf16
//! outputs, with the launcher's key splits, none, and the most. Runs only with ONEPASS_CUDA_TESTS=1;
//! `attention_tc_timings` (ONEPASS_CUDA_BENCH=1 too) times the pair on the Qwen3.5-0.8B attention shape.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::attn_tc;
use onepass_cuda::ops::{self, AttnDims, Out};
use onepass_kernels as cpu;

/// f32 tolerance (f32 on both sides, different summation orders; 3xTF32 products).
const F32_TOL: f32 = 2e-5;
/// Outputs rounded to bf16 (8 bits of mantissa).
const BF16_TOL: f32 = 8e-3;

#[test]
fn attention_tc_matches_cpu_and_tiled() {
    let Some(g) = gpu("attention_tc_matches_cpu_and_tiled") else {
        return;
    };
    // Odd head dims, then the Qwen3.5 attention shape (8 heads over 2 KV heads of 256, a quarter rotated).
    for a in [
        AttnDims {
            heads: 4,
            kv_heads: 2,
            head_dim: 40,
            half: 10,
        },
        AttnDims {
            heads: 8,
            kv_heads: 2,
            head_dim: 256,
            half: 32,
        },
    ] {
        attention_tc_case(&g, a);
    }
}

/// As `attention_case` in tests/ops.rs: attn_prep on four segments (63 new tokens after 5 cached, 65 fresh,
/// 1 after 130 of which the first 100 come from a base cache, 130 after 2), the CPU reference, then
/// attention_tiled and attention_tc on the q and caches attn_prep wrote.
fn attention_tc_case(g: &onepass_cuda::Gpu, a: AttnDims) {
    let (h, kvh, dd) = (a.heads, a.kv_heads, a.head_dim);
    let ld = h * 2 * dd + 2 * kvh * dd;
    // (new tokens, past tokens already in the cache)
    let segs_spec = [(63usize, 5usize), (65, 0), (1, 130), (130, 2)];
    let n: usize = segs_spec.iter().map(|s| s.0).sum();
    let proj = rnd(n * ld, 70).iter().map(|v| 2.0 * v).collect::<Vec<_>>();
    let qn: Vec<f32> = rnd(dd, 71).iter().map(|v| 1.0 + 0.3 * v).collect();
    let kn: Vec<f32> = rnd(dd, 72).iter().map(|v| 1.0 + 0.3 * v).collect();
    let inv_freq: Vec<f32> = (0..a.half)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / (2 * a.half) as f32))
        .collect();
    let eps = 1e-6;
    let mut tok = Vec::new();
    let mut caches = Vec::new();
    let mut want_o = vec![0.0; n * h * dd];
    let mut start = 0;
    // Segment 2 reads its first 100 positions from a base cache (a forked-from state), the rest from its own.
    let bases = [0usize, 0, 100, 0];
    let row = kvh * dd;
    for (s, &(t, past)) in segs_spec.iter().enumerate() {
        let cap = past + t + 3;
        let mut kc = rnd(cap * row, 80 + s as u64);
        let mut vc = rnd(cap * row, 90 + s as u64);
        let b = bases[s] * row;
        let (kd, vd) = (g.upload(&kc[b..]).unwrap(), g.upload(&vc[b..]).unwrap());
        let (kb, vb) = (
            g.upload(&kc[..b.max(1)]).unwrap(),
            g.upload(&vc[..b.max(1)]).unwrap(),
        );
        caches.push((kd, vd, kb, vb));
        for i in 0..t {
            tok.extend([s as i32, (past + i) as i32]);
        }
        // CPU: norms, rope, cache append, attention, gate.
        let rows = start..start + t;
        let mut q: Vec<f32> = rows
            .clone()
            .flat_map(|r| (0..h).map(move |hh| (r, hh)))
            .flat_map(|(r, hh)| proj[r * ld + hh * 2 * dd..r * ld + hh * 2 * dd + dd].to_vec())
            .collect();
        let gate: Vec<f32> = rows
            .clone()
            .flat_map(|r| (0..h).map(move |hh| (r, hh)))
            .flat_map(|(r, hh)| {
                proj[r * ld + hh * 2 * dd + dd..r * ld + (hh + 1) * 2 * dd].to_vec()
            })
            .collect();
        let mut k: Vec<f32> = rows
            .clone()
            .flat_map(|r| proj[r * ld + h * 2 * dd..r * ld + h * 2 * dd + kvh * dd].to_vec())
            .collect();
        let v: Vec<f32> = rows
            .clone()
            .flat_map(|r| proj[r * ld + h * 2 * dd + kvh * dd..r * ld + ld].to_vec())
            .collect();
        cpu::rms_norm(&mut q, &qn, eps);
        cpu::rms_norm(&mut k, &kn, eps);
        let (cos, sin) = cpu::rope_tables(past, t, &inv_freq);
        cpu::apply_rope(&mut q, t, h, dd, &cos, &sin);
        cpu::apply_rope(&mut k, t, kvh, dd, &cos, &sin);
        kc[past * kvh * dd..(past + t) * kvh * dd].copy_from_slice(&k);
        vc[past * kvh * dd..(past + t) * kvh * dd].copy_from_slice(&v);
        let sh = cpu::AttnShape {
            t,
            past,
            heads: h,
            kv_heads: kvh,
            head_dim: dd,
        };
        let o = &mut want_o[start * h * dd..(start + t) * h * dd];
        cpu::causal_attention_reference(
            sh,
            &q,
            &kc[..(past + t) * kvh * dd],
            &vc[..(past + t) * kvh * dd],
            1.0 / (dd as f32).sqrt(),
            o,
        );
        for (x, gv) in o.iter_mut().zip(&gate) {
            *x *= cpu::sigmoid(*gv);
        }
        start += t;
    }
    let ptrs: Vec<u64> = caches
        .iter()
        .zip(bases)
        .flat_map(|((k, v, kb, vb), b)| [g.ptr(k), g.ptr(v), g.ptr(kb), g.ptr(vb), b as u64])
        .collect();
    let (pd, td, kvd) = (
        g.upload(&proj).unwrap(),
        g.upload(&tok).unwrap(),
        g.upload(&ptrs).unwrap(),
    );
    let (qnd, knd, fd) = (
        g.upload(&qn).unwrap(),
        g.upload(&kn).unwrap(),
        g.upload(&inv_freq).unwrap(),
    );
    let qd = g.alloc::<f32>(n * h * dd).unwrap();
    ops::attn_prep(
        g,
        g.ptr(&pd),
        ld,
        g.ptr(&qnd),
        g.ptr(&knd),
        eps,
        g.ptr(&fd),
        a,
        n,
        g.ptr(&td),
        g.ptr(&kvd),
        g.ptr(&qd),
    )
    .unwrap();
    let mut segs = Vec::new();
    let mut st = 0;
    for &(t, past) in &segs_spec {
        segs.extend([st as i32, t as i32, past as i32]);
        st += t;
    }
    let sgd = g.upload(&segs).unwrap();
    let nseg = segs_spec.len();
    let max_len = segs_spec.iter().map(|s| s.0).max().unwrap();
    let scale = 1.0 / (dd as f32).sqrt();
    let ot = g.alloc::<f32>(n * h * dd).unwrap();
    ops::attention_tiled(
        g,
        g.ptr(&qd),
        g.ptr(&pd),
        ld,
        g.ptr(&sgd),
        g.ptr(&kvd),
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
        &want_o,
        F32_TOL,
    );
    let auto = attn_tc::attention_tc_splits(nseg, max_len, a);
    for splits in [auto, 1, attn_tc::MAX_SPLITS] {
        let scratch = g
            .zeros::<f32>(attn_tc::attention_tc_scratch_len(splits, nseg, max_len, a))
            .unwrap();
        let run = |out: Out| {
            attn_tc::attention_tc_with(
                g,
                g.ptr(&qd),
                g.ptr(&pd),
                ld,
                g.ptr(&sgd),
                g.ptr(&kvd),
                nseg,
                max_len,
                a,
                scale,
                out,
                g.ptr(&scratch),
                splits,
            )
            .unwrap()
        };
        let of = g.alloc::<f32>(n * h * dd).unwrap();
        run(Out::F32(g.ptr(&of)));
        let ob = g.alloc::<u16>(n * h * dd).unwrap();
        run(Out::Bf16(g.ptr(&ob)));
        let got = g.download(&of, n * h * dd).unwrap();
        check(
            &format!("attention_tc (f32 out) D={dd} splits {splits}"),
            &got,
            &want_o,
            F32_TOL,
        );
        check(
            &format!("attention_tc vs attention_tiled D={dd} splits {splits}"),
            &got,
            &tiled,
            F32_TOL,
        );
        check(
            &format!("attention_tc (bf16 out) D={dd} splits {splits}"),
            &from_bf16_bits(&g.download(&ob, n * h * dd).unwrap()),
            &want_o,
            BF16_TOL,
        );
    }
    // The launcher's own entry (its split choice and scratch size).
    let scratch = g
        .alloc::<f32>(attn_tc::attention_tc_scratch(nseg, max_len, a))
        .unwrap();
    let of = g.alloc::<f32>(n * h * dd).unwrap();
    attn_tc::attention_tc(
        g,
        g.ptr(&qd),
        g.ptr(&pd),
        ld,
        g.ptr(&sgd),
        g.ptr(&kvd),
        nseg,
        max_len,
        a,
        scale,
        Out::F32(g.ptr(&of)),
        g.ptr(&scratch),
    )
    .unwrap();
    check(
        &format!("attention_tc (launcher's splits {auto}) D={dd}"),
        &g.download(&of, n * h * dd).unwrap(),
        &want_o,
        F32_TOL,
    );
}

/// Not a test: with ONEPASS_CUDA_BENCH=1 (and ONEPASS_CUDA_TESTS=1), prints µs per call of attention_tiled and
/// attention_tc on the Qwen3.5-0.8B attention shape (8 heads, 2 KV heads, D 256) for the System One segment
/// shapes: a 175-token prefix, 7 suffixes of 33 over a 175-token base, a 3,400-token prefix, 10 suffixes of 30
/// over a 3,400-token base.
#[test]
fn attention_tc_timings() {
    if std::env::var("ONEPASS_CUDA_BENCH").as_deref() != Ok("1") {
        return;
    }
    let Some(g) = gpu("attention_tc_timings") else {
        return;
    };
    let a = AttnDims {
        heads: 8,
        kv_heads: 2,
        head_dim: 256,
        half: 32,
    };
    let (h, kvh, dd) = (a.heads, a.kv_heads, a.head_dim);
    let ld = h * 2 * dd + 2 * kvh * dd;
    let row = kvh * dd;
    // (segments, tokens each, base cache length)
    for (nseg, t, base) in [
        (1usize, 175usize, 0usize),
        (7, 33, 175),
        (1, 3400, 0),
        (10, 30, 3400),
    ] {
        let n = nseg * t;
        let qd = g.upload(&rnd(n * h * dd, 1)).unwrap();
        let pd = g.upload(&rnd(n * ld, 2)).unwrap();
        // The base cache (shared by every segment) and each segment's own rows.
        let kb = g.upload(&rnd(base.max(1) * row, 3)).unwrap();
        let vb = g.upload(&rnd(base.max(1) * row, 4)).unwrap();
        let own: Vec<_> = (0..nseg)
            .map(|s| {
                (
                    g.upload(&rnd(t * row, 10 + s as u64)).unwrap(),
                    g.upload(&rnd(t * row, 50 + s as u64)).unwrap(),
                )
            })
            .collect();
        let ptrs: Vec<u64> = own
            .iter()
            .flat_map(|(k, v)| [g.ptr(k), g.ptr(v), g.ptr(&kb), g.ptr(&vb), base as u64])
            .collect();
        let segs: Vec<i32> = (0..nseg)
            .flat_map(|s| [(s * t) as i32, t as i32, base as i32])
            .collect();
        let (kvd, sgd) = (g.upload(&ptrs).unwrap(), g.upload(&segs).unwrap());
        let od = g.alloc::<u16>(n * h * dd).unwrap();
        let scratch = g
            .alloc::<f32>(attn_tc::attention_tc_scratch(nseg, t, a))
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
        let tiled = time(&|| {
            ops::attention_tiled(&g, q, p, ld, sg, kv, nseg, t, a, scale, Out::Bf16(o)).unwrap()
        });
        let tc = time(&|| {
            attn_tc::attention_tc(&g, q, p, ld, sg, kv, nseg, t, a, scale, Out::Bf16(o), sc)
                .unwrap()
        });
        let one = time(&|| {
            attn_tc::attention_tc_with(&g, q, p, ld, sg, kv, nseg, t, a, scale, Out::Bf16(o), 0, 1)
                .unwrap()
        });
        println!(
            "attention 0.8B heads, {nseg} x {t} tokens over a {base}-token base: attention_tiled {tiled:.1} µs, \
             attention_tc {tc:.1} µs ({} key splits; {one:.1} µs with none)",
            attn_tc::attention_tc_splits(nseg, t, a)
        );
    }
}

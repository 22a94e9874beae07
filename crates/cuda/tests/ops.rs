//! Every CUDA op against its CPU twin in `onepass-kernels`, on odd shapes (T = 63, 65, 130; dims
//! not multiples of 32; HV != HK), outputs and states. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::attn::{attn_prepped, ATTN_08B, ATTN_ODD, BASES, SEGS};
use common::conv::{conv_prep_gpu, ConvLaunch};
use common::delta::{
    bench_lens, cols, delta_case, delta_cpu, dims, lens_label, wy_cases, DeltaCase, DeltaDev,
    HEADS_08B,
};
use common::*;
use onepass_cuda::gemm;
use onepass_cuda::ops::{self, AttnDims, GdnDims, Out, W};
use onepass_kernels as cpu;
use onepass_tensor::Tensor;

/// Past one wave of the row norm (`Gpu::norm_wave_rows`) `ops::rms_norm` runs the lean kernel (fewer values a lane
/// in registers, the second half of a 1,024-value row read again): its rows equal the full kernel's bit for bit (the
/// first rows, run alone, take the full kernel) and the CPU's within f32 rounding, on 16-byte rows (dim 1,024, the
/// 0.8B's hidden size, and 2,048) and single values (dim 1,030 at an odd offset).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn lean_rms_norm_matches_the_full_one() {
    let g = gpu();
    let rows = g.norm_wave_rows + 9;
    for (dim, off) in [(1024, 0), (2048, 0), (1030, 3)] {
        let x = rnd(rows * dim + off, 13);
        let gain: Vec<f32> = rnd(dim, 14).iter().map(|v| 1.0 + 0.5 * v).collect();
        let mut want = x[off..].to_vec();
        cpu::rms_norm(&mut want, &gain, 1e-6);
        let (xd, gd) = (g.upload(&x).unwrap(), g.upload(&gain).unwrap());
        let xp = g.ptr(&xd) + 4 * off as u64;
        let norm = |n: usize| {
            let of = g.alloc::<f32>(n * dim).unwrap();
            ops::rms_norm(
                &g,
                xp,
                dim,
                g.ptr(&gd),
                1e-6,
                n,
                dim,
                Out::F32(g.ptr(&of)),
                dim,
            )
            .unwrap();
            g.download(&of, n * dim).unwrap()
        };
        let (lean, full) = (norm(rows), norm(g.norm_wave_rows));
        check(&format!("lean rms_norm dim {dim}"), &lean, &want, F32_TOL);
        assert!(
            lean[..full.len()] == full[..],
            "dim {dim}: the lean kernel's rows differ from the full kernel's"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn rms_norms_match_cpu() {
    let g = gpu();
    // The kernel's paths: 16-byte rows (dim 100), one value per lane (odd dim 37; rows at an odd offset and stride),
    // rows longer than a warp keeps in registers (2,048 and 1,030, the latter unaligned), row counts that do not
    // fill the last block.
    for (rows, dim, off, ldx) in [(7, 37, 1, 41), (5, 2048, 0, 2048), (9, 1030, 3, 1033)] {
        let x = rnd(rows * ldx + off, 11);
        let gain: Vec<f32> = rnd(dim, 12).iter().map(|v| 1.0 + 0.5 * v).collect();
        let mut want: Vec<f32> = (0..rows)
            .flat_map(|r| x[off + r * ldx..off + r * ldx + dim].to_vec())
            .collect();
        cpu::rms_norm(&mut want, &gain, 1e-6);
        let (xd, gd) = (g.upload(&x).unwrap(), g.upload(&gain).unwrap());
        let of = g.alloc::<f32>(rows * dim).unwrap();
        let xp = g.ptr(&xd) + 4 * off as u64;
        ops::rms_norm(
            &g,
            xp,
            ldx,
            g.ptr(&gd),
            1e-6,
            rows,
            dim,
            Out::F32(g.ptr(&of)),
            dim,
        )
        .unwrap();
        check(
            &format!("rms_norm f32 rows {rows} dim {dim} offset {off} stride {ldx}"),
            &g.download(&of, rows * dim).unwrap(),
            &want,
            F32_TOL,
        );
    }
    let (rows, dim) = (65, 100);
    let x = rnd(rows * dim, 1);
    let gain: Vec<f32> = rnd(dim, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
    let mut want = x.clone();
    cpu::rms_norm(&mut want, &gain, 1e-6);
    let (xd, gd) = (g.upload(&x).unwrap(), g.upload(&gain).unwrap());
    let norm = |out: Out| {
        ops::rms_norm(&g, g.ptr(&xd), dim, g.ptr(&gd), 1e-6, rows, dim, out, dim).unwrap()
    };
    let of = g.alloc::<f32>(rows * dim).unwrap();
    let ob = g.alloc::<u16>(rows * dim).unwrap();
    norm(Out::F32(g.ptr(&of)));
    norm(Out::Bf16(g.ptr(&ob)));
    check(
        "rms_norm f32",
        &g.download(&of, rows * dim).unwrap(),
        &want,
        F32_TOL,
    );
    check(
        "rms_norm bf16",
        &from_bf16_bits(&g.download(&ob, rows * dim).unwrap()),
        &want,
        BF16_TOL,
    );
    // Split planes: hi + lo carries the f32 value to about 2^-16 relative (hi alone is the bf16 output).
    let os = g.alloc::<u16>(2 * rows * dim).unwrap();
    norm(Out::Split(g.ptr(&os), rows * dim));
    let planes = from_bf16_bits(&g.download(&os, 2 * rows * dim).unwrap());
    let (hi, lo) = planes.split_at(rows * dim);
    let sum: Vec<f32> = hi.iter().zip(lo).map(|(h, l)| h + l).collect();
    check("rms_norm split hi+lo", &sum, &want, 3e-5);
    check("rms_norm split hi", hi, &want, BF16_TOL);

    // Gated: x [N, HV, DV], z in rows of a wider projection, `off` columns in. One warp per (row, head): fewer values
    // than lanes, the model's 128, and more than the 256 a warp keeps in registers, each with z misaligned (one value
    // per lane); the 16-byte path (z aligned, dv % 4 == 0, dv <= 256) at 128 and 256 and 36.
    for (n, hv, dv, ldz, off) in [
        (63, 3, 24, 100, 7),
        (9, 4, 128, 600, 7),
        (5, 2, 300, 700, 7),
        (9, 4, 128, 600, 8),
        (5, 2, 256, 520, 4),
        (11, 3, 36, 120, 4),
    ] {
        let x = rnd(n * hv * dv, 3);
        let zfull = rnd(n * ldz, 4);
        let w = rnd(dv, 5);
        let z: Vec<f32> = (0..n)
            .flat_map(|i| zfull[i * ldz + off..i * ldz + off + hv * dv].to_vec())
            .collect();
        let mut want = x.clone();
        cpu::rms_norm_gated(&mut want, &z, &w, 1e-6);
        let (xd, zd, wd) = (
            g.upload(&x).unwrap(),
            g.upload(&zfull).unwrap(),
            g.upload(&w).unwrap(),
        );
        let zo = g.ptr(&zd) + 4 * off as u64;
        let gated = |out: Out| {
            ops::rms_norm_gated(&g, g.ptr(&xd), zo, ldz, g.ptr(&wd), 1e-6, n, hv, dv, out).unwrap()
        };
        let ob = g.alloc::<u16>(n * hv * dv).unwrap();
        gated(Out::Bf16(g.ptr(&ob)));
        let of = g.alloc::<f32>(n * hv * dv).unwrap();
        gated(Out::F32(g.ptr(&of)));
        check(
            "rms_norm_gated f32",
            &g.download(&of, n * hv * dv).unwrap(),
            &want,
            F32_TOL,
        );
        check(
            &format!("rms_norm_gated bf16 (dv {dv}, z at {off})"),
            &from_bf16_bits(&g.download(&ob, n * hv * dv).unwrap()),
            &want,
            BF16_TOL,
        );
        let m = n * hv * dv;
        let os = g.alloc::<u16>(2 * m).unwrap();
        gated(Out::Split(g.ptr(&os), m));
        let planes = from_bf16_bits(&g.download(&os, 2 * m).unwrap());
        let (hi, lo) = planes.split_at(m);
        let sum: Vec<f32> = hi.iter().zip(lo).map(|(h, l)| h + l).collect();
        check(
            &format!("rms_norm_gated split hi+lo (dv {dv}, z at {off})"),
            &sum,
            &want,
            3e-5,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn swiglu_embed_readout_match_cpu() {
    let g = gpu();
    let n = 65;
    // SwiGLU: one value per thread (inter 77) and four (128: 16-byte loads), bf16 and split outputs.
    for inter in [77, 128] {
        let gu = rnd(n * 2 * inter, 10);
        let mut want = Vec::new();
        for row in gu.chunks_exact(2 * inter) {
            let mut a = row[..inter].to_vec();
            cpu::swiglu(&mut a, &row[inter..]);
            want.extend(a);
        }
        let gud = g.upload(&gu).unwrap();
        let ob = g.alloc::<u16>(n * inter).unwrap();
        ops::swiglu(&g, g.ptr(&gud), inter, n, Out::Bf16(g.ptr(&ob))).unwrap();
        check(
            &format!("swiglu bf16 inter {inter}"),
            &from_bf16_bits(&g.download(&ob, n * inter).unwrap()),
            &want,
            BF16_TOL,
        );
        let os = g.alloc::<u16>(2 * n * inter).unwrap();
        ops::swiglu(&g, g.ptr(&gud), inter, n, Out::Split(g.ptr(&os), n * inter)).unwrap();
        let planes = from_bf16_bits(&g.download(&os, 2 * n * inter).unwrap());
        let (hi, lo) = planes.split_at(n * inter);
        let sum: Vec<f32> = hi.iter().zip(lo).map(|(h, l)| h + l).collect();
        check(
            &format!("swiglu split hi+lo inter {inter}"),
            &sum,
            &want,
            3e-5,
        );
    }

    // Embedding gather and label-row readout against a bf16 table.
    let (v, hid) = (97, 70);
    let table = bf16_round(&rnd(v * hid, 13));
    let td = g.upload(&to_bf16_bits(&table)).unwrap();
    let ids: Vec<i32> = (0..n as i32).map(|i| (i * 37) % v as i32).collect();
    let idd = g.upload(&ids).unwrap();
    let xd = g.alloc::<f32>(n * hid).unwrap();
    ops::embed_gather(&g, W::Bf16(g.ptr(&td)), g.ptr(&idd), g.ptr(&xd), n, hid).unwrap();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * hid..(i as usize + 1) * hid].to_vec())
        .collect();
    check(
        "embed_gather",
        &g.download(&xd, n * hid).unwrap(),
        &want,
        0.0,
    );
    let hidden = rnd(n * hid, 14);
    let head = Tensor::from_f32("head", vec![v, hid], &table);
    let picks: Vec<(usize, u32)> = (0..40)
        .map(|i| ((i * 7) % n, ((i * 13) % v) as u32))
        .collect();
    let mut want = Vec::new();
    for &(r, id) in &picks {
        let mut o = [0.0f32];
        cpu::dot_rows(&hidden[r * hid..(r + 1) * hid], &head, &[id], &mut o);
        want.push(o[0]);
    }
    let pairs: Vec<i32> = picks
        .iter()
        .flat_map(|&(r, id)| [r as i32, id as i32])
        .collect();
    let (hd, pd) = (g.upload(&hidden).unwrap(), g.upload(&pairs).unwrap());
    let od = g.alloc::<f32>(picks.len()).unwrap();
    ops::rows_dot(
        &g,
        g.ptr(&hd),
        hid,
        g.ptr(&pd),
        picks.len(),
        W::Bf16(g.ptr(&td)),
        g.ptr(&od),
    )
    .unwrap();
    check(
        "rows_dot",
        &g.download(&od, picks.len()).unwrap(),
        &want,
        F32_TOL,
    );
}

/// Greedy decoding's pick on the GPU: the first index of the maximum, NaN skipped, 0 when nothing beats -inf; rows
/// of odd widths up to the Qwen3.5 vocabulary, with ties placed in different threads' strides.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn argmax_rows_picks_the_first_maximum() {
    let g = gpu();
    let want = |row: &[f32]| -> i32 {
        let top = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if top == f32::NEG_INFINITY {
            return 0;
        }
        row.iter().position(|&v| v == top).unwrap() as i32
    };
    for n in [1usize, 7, 1000, 1025, 248_320] {
        let mut rows: Vec<Vec<f32>> = (0..4).map(|r| rnd(n, 900 + r)).collect();
        // Row 1: the maximum twice, the later copy in another thread's stride; row 2: NaN before and at the
        // maximum's place; row 3: nothing above -inf.
        let m = n - 1;
        rows[1][m] = 50.0;
        rows[1][m / 3] = 50.0;
        rows[2][0] = f32::NAN;
        rows[2][m] = f32::NAN;
        rows[2][m / 2] = 40.0;
        rows[3] = vec![f32::NEG_INFINITY; n];
        let flat: Vec<f32> = rows.concat();
        let xd = g.upload(&flat).unwrap();
        let out = g.alloc::<i32>(rows.len()).unwrap();
        ops::argmax_rows(&g, g.ptr(&xd), rows.len(), n, g.ptr(&out)).unwrap();
        let got = g.download(&out, rows.len()).unwrap();
        let expect: Vec<i32> = rows.iter().map(|r| want(r)).collect();
        assert_eq!(got, expect, "argmax over rows of {n}");
    }
}

/// Decode's norm and input projection in one launch (`gemm::gemv_norm`) against the CPU: the row normed in f64, rounded
/// to one bf16 plane or split into hi and lo planes, times bf16 weights, on odd shapes. A wrong plane, gain or row
/// shows as O(1); the norm's reduction order alone moves a few bf16 roundings (far below the bound).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gemv_norm_matches_cpu() {
    let g = gpu();
    let eps = 1e-6f32;
    for &(k, n, planes) in &[
        (1024usize, 6176usize, 2usize),
        (136, 7, 1),
        (136, 7, 2),
        (1024, 1025, 1),
        (2048, 333, 2),
    ] {
        let x: Vec<f32> = rnd(k, 40 + k as u64).iter().map(|v| 3.0 * v).collect();
        let gain: Vec<f32> = rnd(k, 41).iter().map(|v| 1.0 + 0.5 * v).collect();
        // A weight row stride past K, as the split input projections' (stored twice).
        let ldw = k + 8;
        let w = bf16_round(&rnd(n * ldw, 42 + n as u64));
        let ms: f64 = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / k as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        let normed: Vec<f32> = (0..k)
            .map(|c| (x[c] as f64 * inv * gain[c] as f64) as f32)
            .collect();
        let hi = bf16_round(&normed);
        let lo: Vec<f32> = bf16_round(
            &normed
                .iter()
                .zip(&hi)
                .map(|(v, h)| v - h)
                .collect::<Vec<_>>(),
        );
        let want: Vec<f32> = (0..n)
            .map(|r| {
                (0..k)
                    .map(|c| {
                        let a = if planes == 2 {
                            hi[c] as f64 + lo[c] as f64
                        } else {
                            hi[c] as f64
                        };
                        a * w[r * ldw + c] as f64
                    })
                    .sum::<f64>() as f32
            })
            .collect();
        let (xd, gd) = (g.upload(&x).unwrap(), g.upload(&gain).unwrap());
        let wd = g.upload(&to_bf16_bits(&w)).unwrap();
        let y = g.alloc::<f32>(n).unwrap();
        let took = gemm::gemv_norm(
            &g,
            (g.ptr(&xd), g.ptr(&gd), eps),
            planes,
            k,
            (W::Bf16(g.ptr(&wd)), ldw),
            n,
            g.ptr(&y),
        )
        .unwrap();
        assert!(took, "the fused norm and GEMV declined k={k} n={n}");
        check(
            &format!("gemv_norm k={k} n={n} planes={planes}"),
            &g.download(&y, n).unwrap(),
            &want,
            1e-3,
        );
    }
}

/// The fused head and pick of greedy decoding against its two-launch twin (the head's bf16 GEMV, then `argmax_rows`):
/// the same pick on odd shapes up to the Qwen3.5 head, twice in a row (the launch leaves its block count at 0 for the
/// next), and on a tie between two identical weight rows placed in different blocks' strides the lower row, which is
/// also the CPU's pick (the f64 products of those rows are the largest by far).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn head_argmax_picks_what_the_head_and_argmax_pick() {
    let g = gpu();
    let parts = (
        g.alloc::<f32>(ops::HEAD_BLOCKS).unwrap(),
        g.alloc::<i32>(ops::HEAD_BLOCKS).unwrap(),
        g.upload(&[0u32]).unwrap(),
    );
    let pp = (g.ptr(&parts.0), g.ptr(&parts.1), g.ptr(&parts.2));
    for &(k, n) in &[
        (64usize, 1usize),
        (136, 7),
        (1024, 1025),
        (2048, 333),
        (1024, 248_320),
    ] {
        let h = rnd(k, 30 + k as u64);
        let mut w = bf16_round(&rnd(n * k, 31 + n as u64));
        let tie = if n > 2 { Some((n / 3, n - 1)) } else { None };
        if let Some((a, b)) = tie {
            for c in 0..k {
                let v = if h[c] >= 0.0 { 1.0 } else { -1.0 };
                w[a * k + c] = v;
                w[b * k + c] = v;
            }
        }
        let (hd, wd) = (g.upload(&h).unwrap(), g.upload(&to_bf16_bits(&w)).unwrap());
        // The two-launch twin.
        let hb = g.alloc::<u16>(k).unwrap();
        ops::to_bf16(&g, g.ptr(&hd), g.ptr(&hb), k).unwrap();
        let logits = g.alloc::<f32>(n).unwrap();
        g.gemm_bf16(g.ptr(&hb), 1, k, g.ptr(&wd), n, g.ptr(&logits), n, 0.0)
            .unwrap();
        let twin = g.alloc::<i32>(1).unwrap();
        ops::argmax_rows(&g, g.ptr(&logits), 1, n, g.ptr(&twin)).unwrap();
        let want = g.download(&twin, 1).unwrap()[0];
        for rep in 0..2 {
            let out = g.alloc::<i32>(1).unwrap();
            ops::head_argmax_bf16(&g, g.ptr(&hd), k, (g.ptr(&wd), k, n), pp, g.ptr(&out)).unwrap();
            let got = g.download(&out, 1).unwrap()[0];
            assert_eq!(got, want, "fused pick k={k} n={n}, launch {rep}");
        }
        if let Some((a, _)) = tie {
            assert_eq!(
                want, a as i32,
                "tie k={k} n={n}: the lower of two equal rows"
            );
        }
        let cpu_pick = (0..n)
            .map(|r| {
                let d: f64 = (0..k)
                    .map(|c| w[r * k + c] as f64 * bf16_round(&[h[c]])[0] as f64)
                    .sum();
                (r, d)
            })
            .fold(
                (0, f64::NEG_INFINITY),
                |b, (r, d)| if d > b.1 { (r, d) } else { b },
            )
            .0;
        if tie.is_some() || n == 1 {
            assert_eq!(want, cpu_pick as i32, "k={k} n={n}: the CPU's pick");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gemm_bf16_matches_cpu() {
    let g = gpu();
    for &(t, k, n) in &[(63, 100, 130), (1, 64, 33), (130, 257, 65)] {
        let x = bf16_round(&rnd(t * k, 20));
        let w = bf16_round(&rnd(n * k, 21));
        let wt = Tensor::from_f32("w", vec![n, k], &w);
        let mut want = vec![0.0; t * n];
        cpu::matmul_t_reference(&x, t, &wt, &mut want);
        // beta = 1 accumulates into y.
        let y0 = rnd(t * n, 22);
        let want_acc: Vec<f32> = want.iter().zip(&y0).map(|(a, b)| a + b).collect();
        let (xd, wd) = (
            g.upload(&to_bf16_bits(&x)).unwrap(),
            g.upload(&to_bf16_bits(&w)).unwrap(),
        );
        let yd = g.upload(&y0).unwrap();
        g.gemm_bf16(g.ptr(&xd), t, k, g.ptr(&wd), n, g.ptr(&yd), n, 1.0)
            .unwrap();
        check(
            &format!("gemm bf16 t={t} k={k} n={n} (+y)"),
            &g.download(&yd, t * n).unwrap(),
            &want_acc,
            1e-5,
        );
        g.gemm_bf16(g.ptr(&xd), t, k, g.ptr(&wd), n, g.ptr(&yd), n, 0.0)
            .unwrap();
        check(
            &format!("gemm bf16 t={t} k={k} n={n}"),
            &g.download(&yd, t * n).unwrap(),
            &want,
            1e-5,
        );
    }
}

/// Which GPU gated delta kernel [`delta_gpu`] runs.
#[derive(Clone, Copy, PartialEq)]
enum Delta {
    Step,
    Wy,
}

fn delta_gpu(g: &onepass_cuda::Gpu, c: &DeltaCase, kind: Delta) -> (Vec<f32>, Vec<Vec<f32>>) {
    let d = c.d;
    let (cd, n) = (cols(d), c.rows());
    let dev = DeltaDev::upload(g, c);
    let p = dev.ptrs(g);
    let od = g.alloc::<f32>(n * d.hv * d.dv).unwrap();
    if kind == Delta::Wy {
        let max_len = c.max_len();
        let scratch = g.alloc::<f32>(n * ops::gdn_wy_scratch(d)).unwrap();
        ops::gdn_chunked_wy(
            g,
            p.x,
            cd,
            p.g,
            p.beta,
            g.ptr(&od),
            p.segs,
            p.states,
            c.lens.len(),
            d,
            n,
            max_len,
            g.ptr(&scratch),
        )
        .unwrap();
    } else {
        ops::gdn_step(
            g,
            p.x,
            cd,
            p.g,
            p.beta,
            g.ptr(&od),
            p.segs,
            p.states,
            c.lens.len(),
            d,
        )
        .unwrap();
    }
    let out = g.download(&od, n * d.hv * d.dv).unwrap();
    (out, dev.download_states(g, d))
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gated_delta_wy_and_step_match_cpu() {
    let g = gpu();
    // Segments of 63, 65, 130 and 1 tokens; GVA (hv = 2 hk); dims not multiples of 32; and the
    // 0.8B shape (dk = dv = 128), whose chunk state needs the opt-in shared memory.
    for (d, lens) in [
        (dims(2, 4, 60, 24), vec![63, 65, 130, 1]),
        (dims(1, 3, 16, 40), vec![200]),
        (dims(2, 2, 128, 128), vec![130, 7]),
    ] {
        let c = delta_case(d, &lens, 50);
        let (want_o, want_s) = delta_cpu(&c);
        let (o, s) = delta_gpu(&g, &c, Delta::Wy);
        check(
            &format!("gdn_chunked_wy out {d:?} {lens:?}"),
            &o,
            &want_o,
            1e-4,
        );
        for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
            check(&format!("gdn_chunked_wy state {i} {d:?}"), a, b, 1e-4);
        }
    }
    // The one-token step: three segments of odd head dims (dv not a multiple of the kernel's 16 columns), and two
    // of the 0.8B shape's (dk = dv = 128, 8 value heads per key head).
    for (d, segs) in [(dims(2, 6, 60, 36), 3), (dims(2, 16, 128, 128), 2)] {
        let c = delta_case(d, &vec![1; segs], 60);
        let (want_o, want_s) = delta_cpu(&c);
        let (o, s) = delta_gpu(&g, &c, Delta::Step);
        check(&format!("gdn_step out {d:?}"), &o, &want_o, F32_TOL);
        for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
            check(&format!("gdn_step state {i} {d:?}"), a, b, F32_TOL);
        }
    }
}

/// The WY-form kernels (pre-pass over all chunks, then the state pass) against the CPU recurrence, outputs and
/// final states: T = 1, 63, 65, 130, 200 in one batch; HV != HK;
/// DK != DV (both ways, and not multiples of 32); the 0.8B head shape; strong decays (e^gam underflows).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gated_delta_wy_matches_cpu() {
    let g = gpu();
    for (d, lens, gscale) in wy_cases() {
        let c = delta_case(d, &lens, 70).decays_x(gscale);
        let (want_o, want_s) = delta_cpu(&c);
        let (o, s) = delta_gpu(&g, &c, Delta::Wy);
        let tag = format!("{d:?} {lens:?} g x{gscale}");
        check(&format!("gdn wy out vs cpu {tag}"), &o, &want_o, 1e-4);
        for (i, (a, b)) in s.iter().zip(&want_s).enumerate() {
            check(&format!("gdn wy state {i} vs cpu {tag}"), a, b, 1e-4);
        }
    }
}

/// The CPU reference of `ops::gdn_conv_prep`: per segment, causal conv1d + SiLU of channels 0..cd of x [N, ld]
/// continuing its conv state, the q and k heads L2-normalised (q times DK^-1/2), g = neg_a · softplus(a + dt_bias)
/// and beta = sigmoid(b) from columns off_a, off_b. → (out [N, cd], g [N, HV], beta [N, HV], advanced states)
fn conv_prep_cpu(
    x: &[f32],
    ld: usize,
    w: &[f32],
    k: usize,
    d: GdnDims,
    lens: &[usize],
    st0: &[Vec<f32>],
    (off_a, off_b, neg_a, dt): (usize, usize, &[f32], &[f32]),
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let n: usize = lens.iter().sum();
    let scale = 1.0 / (d.dk as f32).sqrt();
    let (mut out, mut states) = (Vec::with_capacity(n * cd), Vec::new());
    let mut start = 0;
    for (s, &len) in lens.iter().enumerate() {
        let mut st = st0[s].clone();
        let mut xs: Vec<f32> = (start..start + len)
            .flat_map(|r| x[r * ld..r * ld + cd].to_vec())
            .collect();
        cpu::causal_conv1d_silu(&mut xs, len, cd, w, k, &mut st);
        for row in xs.chunks_exact_mut(cd) {
            cpu::l2_normalize(&mut row[..2 * d.hk * d.dk], d.dk, 1e-6);
            row[..d.hk * d.dk].iter_mut().for_each(|v| *v *= scale);
        }
        out.extend(xs);
        states.push(st);
        start += len;
    }
    let (mut g, mut beta) = (vec![0.0; n * d.hv], vec![0.0; n * d.hv]);
    for i in 0..n {
        for h in 0..d.hv {
            g[i * d.hv + h] = neg_a[h] * cpu::softplus(x[i * ld + off_a + h] + dt[h]);
            beta[i * d.hv + h] = cpu::sigmoid(x[i * ld + off_b + h]);
        }
    }
    (out, g, beta, states)
}

/// The token-parallel conv + L2 norm + gates kernel against the CPU's causal conv1d + SiLU, L2 norm and gates:
/// outputs, gates and the advanced conv states, on segments of 1, 2, 63, 130 and 3 tokens (shorter and longer than
/// the conv window; runs of rows that span segments, start them or end them), K = 4 and 2, rows of x 16-byte aligned
/// (ld % 4 == 0: K = 4 takes the 16-byte path) or not (token by token), and with two child segments (their inputs
/// before them from their parent's last rows, one of them after its parent in the batch, one before), and conv
/// states 16-byte aligned or not (`skew`: the windows that read them token by token).
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gdn_conv_prep_matches_cpu() {
    let g = gpu();
    let d = GdnDims {
        hk: 2,
        hv: 6,
        dk: 40,
        dv: 20,
    };
    let cd = 2 * d.hk * d.dk + d.hv * d.dv;
    let lens = [1usize, 2, 63, 130, 3];
    let n: usize = lens.iter().sum();
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |a, &l| Some(std::mem::replace(a, *a + l)))
        .collect();
    for (k, pad, parents, skew) in [
        (4usize, 5, false, false),
        (4, 5, true, false),
        (4, 5, false, true),
        (4, 3, false, false),
        (4, 3, true, false),
        (2, 5, true, false),
        (2, 3, false, false),
    ] {
        // pad 5: ld % 4 == 0; pad 3: not
        let (off_a, off_b, ld) = (cd + 7, cd + 7 + d.hv, cd + 7 + 2 * d.hv + pad);
        let x = rnd(n * ld, 90 + k as u64);
        let w = rnd(cd * k, 91);
        let neg_a: Vec<f32> = rnd(d.hv, 92).iter().map(|v| -(v + 1.5)).collect();
        let dt = rnd(d.hv, 93);
        let par: Vec<i32> = if parents {
            vec![-1, 3, -1, -1, 2]
        } else {
            vec![-1; lens.len()]
        };
        let st0: Vec<Vec<f32>> = (0..lens.len())
            .map(|s| rnd((k - 1) * cd, 100 + s as u64))
            .collect();
        // The CPU's view: a child's conv state is its parent's last K-1 input rows (the GPU's own is ignored).
        let st0_cpu: Vec<Vec<f32>> = (0..lens.len())
            .map(|s| match usize::try_from(par[s]) {
                Ok(p) => (starts[p] + lens[p] + 1 - k..starts[p] + lens[p])
                    .flat_map(|r| x[r * ld..r * ld + cd].to_vec())
                    .collect(),
                Err(_) => st0[s].clone(),
            })
            .collect();
        // skew: each state one float past its allocation's start
        let got = conv_prep_gpu(
            &g,
            &ConvLaunch {
                d,
                k,
                x: &x,
                ld,
                w: &w,
                lens: &lens,
                par: parents.then_some(&par[..]),
                states: &st0,
                skew: usize::from(skew),
                gates: (off_a, off_b, &neg_a, &dt),
            },
        );
        let (o1, g1, b1, s1) = (got.out, got.g, got.beta, got.states);
        let (o0, g0, b0, s0) = conv_prep_cpu(
            &x,
            ld,
            &w,
            k,
            d,
            &lens,
            &st0_cpu,
            (off_a, off_b, &neg_a, &dt),
        );
        let tag = format!("K={k} ld={ld} parents={parents} skew={skew}");
        check(&format!("gdn_conv_prep out {tag}"), &o1, &o0, F32_TOL);
        check(&format!("gdn_conv_prep g {tag}"), &g1, &g0, F32_TOL);
        check(&format!("gdn_conv_prep beta {tag}"), &b1, &b0, F32_TOL);
        for (i, (a, b)) in s1.iter().zip(&s0).enumerate() {
            check(&format!("gdn_conv_prep state {i} {tag}"), a, b, 0.0);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn attention_prep_and_attention_match_cpu() {
    let g = gpu();
    // Odd head dims, then the Qwen3.5 attention shape (8 heads over 2 KV heads of 256, a quarter rotated).
    for a in [ATTN_ODD, ATTN_08B] {
        attention_case(&g, a);
    }
}

/// attn_prep and attention_tiled against the CPU on four segments: 63 new tokens
/// after 5 cached, 65 fresh, 1 after 130 (the first 100 read from a base cache), 130 after 2.
fn attention_case(g: &onepass_cuda::Gpu, a: AttnDims) {
    let (h, dd) = (a.heads, a.head_dim);
    let r = attn_prepped(g, a);
    let (ld, n) = (r.ld, r.n);
    let (pd, kvd, sgd, qd) = (&r.proj, &r.kv, &r.segs, &r.q);
    check(
        "attn_prep q (norm + rope)",
        &g.download(qd, n * h * dd).unwrap(),
        &r.want_q,
        F32_TOL,
    );
    let row = a.kv_heads * dd;
    for (s, [kd, ..]) in r.caches.iter().enumerate() {
        let b = BASES[s] * row;
        let m = r.want_k[s].len() - b;
        check(
            &format!("attn_prep k cache {s} (base {})", BASES[s]),
            &g.download(kd, m).unwrap(),
            &r.want_k[s][b..],
            F32_TOL,
        );
    }
    // The tiled kernel reads segments from the segment table.
    let attend = |out: Out| {
        ops::attention_tiled(
            g,
            g.ptr(qd),
            g.ptr(pd),
            ld,
            g.ptr(sgd),
            g.ptr(kvd),
            SEGS.len(),
            r.max_len,
            a,
            1.0 / (dd as f32).sqrt(),
            out,
        )
        .unwrap()
    };
    let of = g.alloc::<f32>(n * h * dd).unwrap();
    attend(Out::F32(g.ptr(&of)));
    check(
        &format!("attention_tiled * sigmoid(gate) (f32 out) D={dd}"),
        &g.download(&of, n * h * dd).unwrap(),
        &r.want_o,
        F32_TOL,
    );
    let od = g.alloc::<u16>(n * h * dd).unwrap();
    attend(Out::Bf16(g.ptr(&od)));
    check(
        "attention_tiled * sigmoid(gate) (bf16 out)",
        &from_bf16_bits(&g.download(&od, n * h * dd).unwrap()),
        &r.want_o,
        BF16_TOL,
    );
}

/// Not a check (ignored like the GPU tests): prints the time of the gated delta kernels
/// (the f32 WY pair) on the Qwen3.5-0.8B head shape for the System One segment shapes.
#[test]
#[ignore = "a timing table on a CUDA GPU, not a check (run with --include-ignored on a GPU machine)"]
fn gated_delta_timings() {
    let g = gpu();
    let d = HEADS_08B;
    for lens in bench_lens() {
        let c = delta_case(d, &lens, 80);
        let (cd, n) = (cols(d), c.rows());
        let dev = DeltaDev::upload(&g, &c);
        let od = g.alloc::<f32>(n * d.hv * d.dv).unwrap();
        let scratch = g.alloc::<f32>(n * ops::gdn_wy_scratch(d)).unwrap();
        let max_len = lens.iter().copied().max().unwrap();
        // ms per call.
        let time = |what: &dyn Fn()| per_call_us(&g, what) / 1e3;
        let p = dev.ptrs(&g);
        let (x, gp, bp, o, sp, pp, wy) = (
            p.x,
            p.g,
            p.beta,
            g.ptr(&od),
            p.segs,
            p.states,
            g.ptr(&scratch),
        );
        let ns = lens.len();
        let both = time(&|| {
            ops::gdn_chunked_wy(&g, x, cd, gp, bp, o, sp, pp, ns, d, n, max_len, wy).unwrap()
        });
        let prep =
            time(&|| ops::gdn_wy_prep(&g, x, cd, gp, bp, sp, ns, d, n, max_len, wy).unwrap());
        let state: Vec<String> = [8, 16, 32]
            .iter()
            .map(|&dvs| {
                let t =
                    time(&|| ops::gdn_wy_state(&g, x, cd, o, sp, pp, ns, d, n, wy, dvs).unwrap());
                format!("state(dvs {dvs}) {t:.3}")
            })
            .collect();
        println!(
            "gated delta 0.8B heads, segments {} tokens: WY {both:.3} ms (dvs {}) = prep {prep:.3} + {}",
            lens_label(&lens),
            ops::gdn_wy_slice(d, ns),
            state.join(", ")
        );
    }
}

/// The split-mode consumer of a residual GEMM run over both planes: `add2_rms_norm` (x += f[..R] + f[R..], then
/// RMSNorm, x updated in place), against the CPU on the summed inputs.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn split_halves_fold_into_norm() {
    let g = gpu();
    // 16-byte rows (dim 100), one value per lane (odd dim), rows past what a warp keeps in registers (2,048).
    for (rows, dim) in [(37, 100), (7, 37), (5, 2048)] {
        let x = rnd(rows * dim, 31);
        let f = rnd(2 * rows * dim, 32);
        let gain: Vec<f32> = rnd(dim, 33).iter().map(|v| 1.0 + 0.5 * v).collect();
        let summed: Vec<f32> = (0..rows * dim)
            .map(|i| x[i] + (f[i] + f[i + rows * dim]))
            .collect();
        let mut want = summed.clone();
        cpu::rms_norm(&mut want, &gain, 1e-6);
        let (xd, fd, gd) = (
            g.upload(&x).unwrap(),
            g.upload(&f).unwrap(),
            g.upload(&gain).unwrap(),
        );
        let of = g.alloc::<f32>(rows * dim).unwrap();
        ops::add2_rms_norm(
            &g,
            g.ptr(&xd),
            dim,
            g.ptr(&fd),
            rows * dim,
            g.ptr(&gd),
            1e-6,
            rows,
            dim,
            Out::F32(g.ptr(&of)),
            dim,
        )
        .unwrap();
        check(
            "add2_rms_norm residual",
            &g.download(&xd, rows * dim).unwrap(),
            &summed,
            F32_TOL,
        );
        check(
            "add2_rms_norm out",
            &g.download(&of, rows * dim).unwrap(),
            &want,
            F32_TOL,
        );
    }
}

/// max |got - want| / max |want|: relative to the outputs' own scale, not to 1 as [`rel_err`], since the weights
/// here are 0.003 to 300 times the inputs'.
fn err_of_scale(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length");
    // f32::max passes over NaN: a non-finite output must fail here, not vanish from the maximum.
    assert!(got.iter().all(|v| v.is_finite()), "non-finite GPU value");
    let scale = want.iter().fold(f32::MIN_POSITIVE, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// The half precision's projections: a producer (here a norm) writes f16 rows times a power of two 2^e
/// (`Out::F16(p, e)`, 2^-11 relative), which a GEMM multiplies by an f16 weight scaled by a power of two
/// (`W::Half`, its shift raised by e, alpha undoing both): cuBLAS for many rows, the few-row kernel for at most 8,
/// the batch-invariant algorithm; and for one row the norm formed inside the GEMV (`gemv_norm`, e = 0). Against the
/// CPU: the downloaded f16 rows over 2^e against the f32 norm, those rows times W (exact products, f32 sums), and the
/// f32 norm's output times W for the fused one. Weights at scales far from 1 (0.003 and 300) and e from -8 to 10
/// exercise both shifts both ways.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn half_rows_multiply_scaled_f16_weights() {
    let g = gpu();
    // (t, k, n, weight scale, e): the GEMM, then the few-row kernel's row counts.
    let shapes = [
        (63, 100, 130, 0.003f32, -4),
        (200, 1024, 3584, 1.0, 6),
        (5, 2048, 33, 300.0, -8),
        (1, 1024, 700, 0.003, 0),
        (3, 264, 130, 1.0, 10),
        (8, 1000, 4099, 300.0, 2),
        (9, 1024, 333, 1.0, 0),
    ];
    for &(t, k, n, scale, e) in &shapes {
        let x = rnd(t * k, 50);
        let gain: Vec<f32> = rnd(k, 51).iter().map(|v| 1.0 + 0.5 * v).collect();
        let mut normed = x.clone();
        cpu::rms_norm(&mut normed, &gain, 1e-6);
        let w: Vec<f32> = bf16_round(&rnd(n * k, 52).iter().map(|v| v * scale).collect::<Vec<_>>());
        let wt = Tensor::from_f32("w", vec![n, k], &w);
        let (bits, shift) = gemm::half_scaled(&w);
        let (xd, gd, wd) = (
            g.upload(&x).unwrap(),
            g.upload(&gain).unwrap(),
            g.upload(&bits).unwrap(),
        );
        let act = g.alloc::<u16>(t * k).unwrap();
        ops::rms_norm(
            &g,
            g.ptr(&xd),
            k,
            g.ptr(&gd),
            1e-6,
            t,
            k,
            Out::F16(g.ptr(&act), e),
            k,
        )
        .unwrap();
        let rows: Vec<f32> = g
            .download(&act, t * k)
            .unwrap()
            .iter()
            .map(|h| half::f16::from_bits(*h).to_f32() * 2f32.powi(-e))
            .collect();
        check(
            &format!("f16 rows {t} x {k} times 2^{e}"),
            &rows,
            &normed,
            5e-4,
        );
        let mut want = vec![0.0; t * n];
        cpu::matmul_t_reference(&rows, t, &wt, &mut want);
        let hw = W::Half {
            w: g.ptr(&wd),
            shift: shift + e,
        };
        for invariant in [false, true] {
            let y = g.alloc::<f32>(t * n).unwrap();
            gemm::gemm_ld_as(
                &g,
                invariant,
                g.ptr(&act),
                k,
                t,
                k,
                hw,
                k,
                n,
                g.ptr(&y),
                n,
                0.0,
            )
            .unwrap();
            // The GEMM's bound (f32 sums of exact products).
            let rel = err_of_scale(&g.download(&y, t * n).unwrap(), &want);
            let tag = format!(
                "half gemm t={t} k={k} n={n} scale {scale} (shift {shift}, e {e}) invariant {invariant}"
            );
            eprintln!("{tag}: {rel:.3e}");
            assert!(rel <= 1e-5, "{tag}: {rel:.3e}");
        }
        if t == 1 {
            let y = g.alloc::<f32>(n).unwrap();
            let x3 = (g.ptr(&xd), g.ptr(&gd), 1e-6);
            let hw = W::Half {
                w: g.ptr(&wd),
                shift,
            };
            assert!(
                gemm::gemv_norm(&g, x3, 1, k, (hw, k), n, g.ptr(&y)).unwrap(),
                "gemv_norm took no f16 weight"
            );
            let mut want = vec![0.0; n];
            cpu::matmul_t_reference(&normed, 1, &wt, &mut want);
            let rel = err_of_scale(&g.download(&y, n).unwrap(), &want);
            eprintln!(
                "norm + half gemv k={k} n={n} scale {scale}: {rel:.3e} (inputs rounded to f16)"
            );
            assert!(
                rel <= 2e-3,
                "norm + half gemv k={k} n={n} scale {scale}: {rel:.3e}"
            );
        }
    }
}

/// Split mode's input projections: a norm writes each row's hi and lo planes side by side (`Out::Split(p, K)`,
/// row stride 2K), and one GEMM over K = 2K against the weight stored twice per row (`[W | W]`, row stride 2K)
/// multiplies both planes; the same buffers with K alone multiply the hi plane; `gemm_split` multiplies both planes
/// too (for at most 4 rows by the few-row kernel reading W's first copy once). Against the CPU: the f32 norm's
/// output times W (both planes carry it to about 2^-16), and the downloaded hi plane times W.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn split_rows_multiply_both_planes_in_one_gemm() {
    let g = gpu();
    // (t, k, n): the GEMM, then decode's row counts (the few-row kernel, 1 to 4 warps per weight row).
    let shapes = [
        (63, 100, 130),
        (5, 2048, 33),
        (1, 1024, 700),
        (3, 264, 130),
        (4, 1000, 4099),
    ];
    for &(t, k, n) in &shapes {
        let x = rnd(t * k, 40);
        let gain: Vec<f32> = rnd(k, 41).iter().map(|v| 1.0 + 0.5 * v).collect();
        let mut normed = x.clone();
        cpu::rms_norm(&mut normed, &gain, 1e-6);
        let w = bf16_round(&rnd(n * k, 42));
        let wt = Tensor::from_f32("w", vec![n, k], &w);
        let twice: Vec<f32> = w
            .chunks(k)
            .flat_map(|r| r.iter().chain(r).copied())
            .collect();
        let (xd, gd, wd) = (
            g.upload(&x).unwrap(),
            g.upload(&gain).unwrap(),
            g.upload(&to_bf16_bits(&twice)).unwrap(),
        );
        let act = g.alloc::<u16>(2 * t * k).unwrap();
        ops::rms_norm(
            &g,
            g.ptr(&xd),
            k,
            g.ptr(&gd),
            1e-6,
            t,
            k,
            Out::Split(g.ptr(&act), k),
            2 * k,
        )
        .unwrap();
        let rows = from_bf16_bits(&g.download(&act, 2 * t * k).unwrap());
        let hi: Vec<f32> = rows.chunks(2 * k).flat_map(|r| r[..k].to_vec()).collect();
        let sum: Vec<f32> = rows
            .chunks(2 * k)
            .flat_map(|r| (0..k).map(|c| r[c] + r[k + c]).collect::<Vec<_>>())
            .collect();
        check(&format!("[hi | lo] rows {t} x {k}"), &sum, &normed, 3e-5);
        let y = g.alloc::<f32>(t * n).unwrap();
        let cases = [
            ("both planes, one gemm over 2K", 2 * k, &normed, 1e-4),
            ("hi plane alone, strided", k, &hi, 1e-5),
            ("both planes, gemm_split", 0, &normed, 1e-4),
        ];
        for (what, kk, input, tol) in cases {
            let mut want = vec![0.0; t * n];
            cpu::matmul_t_reference(input, t, &wt, &mut want);
            let w = W::Bf16(g.ptr(&wd));
            let (xs, ys) = ((g.ptr(&act), 2 * k), (g.ptr(&y), n));
            if kk == 0 {
                gemm::gemm_split(&g, xs, t, k, (w, 2 * k), n, ys, 0.0)
            } else {
                gemm::gemm_ld(&g, xs.0, xs.1, t, kk, w, 2 * k, n, ys.0, ys.1, 0.0)
            }
            .unwrap();
            check(
                &format!("{what}: t={t} k={k} n={n}"),
                &g.download(&y, t * n).unwrap(),
                &want,
                tol,
            );
        }
    }
}

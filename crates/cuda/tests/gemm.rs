//! The projection GEMM (`onepass_cuda::gemm`, cublasGemmEx) against a CPU f64-accumulated reference on odd
//! shapes, beta 0 and 1, ldy > N, unaligned pointers; the batch-invariant GEMM (`gemm_ld_as` with `invariant`,
//! `onepass_cuda::gemm_lt`'s pinned algorithm) against the same reference and, bit for bit, against itself for one
//! row stacked among 1 to 3,399 others. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::ops::W;
use onepass_cuda::{CudaError, Gpu};
use onepass_kernels as cpu;
use onepass_tensor::Tensor;

/// The bound of `gemm_bf16_matches_cpu` (tests/ops.rs): bf16 inputs exact in f32, f32 accumulation.
const TOL: f32 = 1e-5;
/// Written into y's columns N..ldy; the GEMM must leave them alone.
const PAD: f32 = 12345.0;

/// One problem: x [T, K] and w [N, K] (bf16-representable), y0 [T, ldy] (padding PAD), want = x · wᵀ [T, N].
struct Case {
    n: usize,
    ldy: usize,
    x: Vec<f32>,
    w: Vec<f32>,
    y0: Vec<f32>,
    want: Vec<f32>,
}

fn case(t: usize, k: usize, n: usize, ldy: usize, seed: u64) -> Case {
    let x = bf16_round(&rnd(t * k, seed));
    let w = bf16_round(&rnd(n * k, seed + 1));
    let mut want = vec![0.0; t * n];
    cpu::matmul_t_reference(&x, t, &Tensor::from_f32("w", vec![n, k], &w), &mut want);
    let r = rnd(t * n, seed + 2);
    let mut y0 = vec![PAD; t * ldy];
    for i in 0..t {
        y0[i * ldy..i * ldy + n].copy_from_slice(&r[i * n..(i + 1) * n]);
    }
    Case {
        n,
        ldy,
        x,
        w,
        y0,
        want,
    }
}

impl Case {
    /// x · wᵀ + beta · y0 over the first `t` rows, [t, N].
    fn expect(&self, t: usize, beta: f32) -> Vec<f32> {
        (0..t * self.n)
            .map(|i| self.want[i] + beta * self.y0[(i / self.n) * self.ldy + i % self.n])
            .collect()
    }
}

/// Device copies of a case; x and y start `off` elements into their buffers (alignment below 256 bytes).
struct Dev {
    x: cudarc::driver::CudaSlice<u16>,
    w: cudarc::driver::CudaSlice<u16>,
    off: usize,
}

fn upload(g: &Gpu, c: &Case, off: usize) -> Dev {
    let mut xb = vec![0u16; off];
    xb.extend(to_bf16_bits(&c.x));
    Dev {
        x: g.upload(&xb).unwrap(),
        w: g.upload(&to_bf16_bits(&c.w)).unwrap(),
        off,
    }
}

/// Runs `f(x, w, y)` on the first `t` rows with y = y0, checks y's [t, N] part against the reference and
/// its padding for exact equality; returns the [t, N] result.
fn run_check(
    g: &Gpu,
    c: &Case,
    d: &Dev,
    t: usize,
    beta: f32,
    name: &str,
    f: &dyn Fn(u64, u64, u64) -> Result<(), CudaError>,
) -> Vec<f32> {
    let mut yh = vec![0.0f32; d.off];
    yh.extend_from_slice(&c.y0[..t * c.ldy]);
    let yd = g.upload(&yh).unwrap();
    let (xp, wp, yp) = (
        g.ptr(&d.x) + 2 * d.off as u64,
        g.ptr(&d.w),
        g.ptr(&yd) + 4 * d.off as u64,
    );
    f(xp, wp, yp).unwrap_or_else(|e| panic!("{name}: {e}"));
    let all = g.download(&yd, d.off + t * c.ldy).unwrap();
    let got = &all[d.off..];
    let mut out = Vec::with_capacity(t * c.n);
    for i in 0..t {
        out.extend_from_slice(&got[i * c.ldy..i * c.ldy + c.n]);
        for j in c.n..c.ldy {
            assert_eq!(
                got[i * c.ldy + j],
                PAD,
                "{name}: padding at row {i} column {j}"
            );
        }
    }
    check(name, &out, &c.expect(t, beta), TOL);
    out
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gemm_matches_cpu_on_odd_shapes() {
    let g = gpu();
    // (t, k, n, extra columns in ldy, offset of x and y in elements)
    let shapes = [
        (63, 100, 130, 0, 0),
        (63, 100, 130, 7, 0),
        (1, 64, 33, 0, 0),
        (1, 64, 33, 3, 1),
        (130, 257, 65, 0, 0),
        (130, 257, 65, 5, 1),
        (200, 1024, 3584, 0, 0),
        (200, 3584, 1024, 0, 0),
        (200, 3584, 1024, 64, 0),
        (175, 1024, 8224, 0, 0),
        // Decode's few rows (the gemv_bf16 kernel where K and the strides allow 16-byte loads, 1 to 8 warps per
        // weight row; t = 9 and the unaligned offset go to cuBLAS).
        (1, 1024, 3584, 0, 0),
        (2, 1000, 130, 0, 0),
        (5, 264, 4099, 3, 0),
        (8, 3584, 1024, 5, 0),
        (8, 1024, 333, 0, 1),
        (9, 1024, 333, 0, 0),
        (2, 2048, 300, 0, 0),
    ];
    for (i, &(t, k, n, pad, off)) in shapes.iter().enumerate() {
        let c = case(t, k, n, n + pad, 100 + 10 * i as u64);
        let d = upload(&g, &c, off);
        let ldy = c.ldy;
        for beta in [1.0f32, 0.0] {
            let tag = format!("t={t} k={k} n={n} ldy={ldy} off={off} beta={beta}");
            run_check(
                &g,
                &c,
                &d,
                t,
                beta,
                &format!("Gpu::gemm {tag}"),
                &|x, w, y| g.gemm(x, t, k, W::Bf16(w), n, y, ldy, beta),
            );
        }
    }
}

/// The exact mode (f32 weights) multiplies with `CUBLAS_COMPUTE_32F_PEDANTIC`: it matches the f64 reference to f32
/// rounding, which TF32 (a 10-bit mantissa) would miss by orders of magnitude.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn f32_gemm_is_not_tf32() {
    let g = gpu();
    let (t, k, n) = (63, 1000, 130);
    let x = rnd(t * k, 400);
    let w = rnd(n * k, 401);
    let mut want = vec![0.0; t * n];
    cpu::matmul_t_reference(&x, t, &Tensor::from_f32("w", vec![n, k], &w), &mut want);
    let (xd, wd) = (g.upload(&x).unwrap(), g.upload(&w).unwrap());
    let y = g.zeros::<f32>(t * n).unwrap();
    g.gemm(g.ptr(&xd), t, k, W::F32(g.ptr(&wd)), n, g.ptr(&y), n, 0.0)
        .unwrap();
    check(
        "f32 gemm (pedantic)",
        &g.download(&y, t * n).unwrap(),
        &want,
        2e-6,
    );
}

/// The batch-invariant GEMM: a row's outputs are the same bits whatever rows are stacked with it (T from 2 to 3,400,
/// the row first or last), bf16 and f32, on the Qwen3.5-0.8B projection shapes (split mode's 2K inputs among them)
/// and odd ones, beta 0 and 1; within the GEMM's bound of the CPU reference; no GEMM fell back to GemmEx. Prints each
/// shape's pinned algorithm.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn invariant_gemm_rows_do_not_depend_on_the_rows_stacked() {
    use onepass_cuda::gemm::gemm_ld_as;
    let g = gpu();
    // (K, N, beta)
    let shapes = [
        (1024, 8224, 0.0f32),
        (2048, 8224, 0.0),
        (2048, 1024, 1.0),
        (1024, 6144, 0.0),
        (1024, 7168, 0.0),
        (3584, 1024, 1.0),
        (3584, 1024, 0.0),
        (264, 333, 1.0),
    ];
    let ts = [2usize, 3, 8, 9, 64, 175, 1000, 3400];
    for f32w in [false, true] {
        for &(k, n, beta) in &shapes {
            let tmax = *ts.iter().max().unwrap();
            let xs = bf16_round(&rnd(tmax * k, 700 + k as u64));
            let w = bf16_round(&rnd(n * k, 701 + n as u64));
            let row = bf16_round(&rnd(k, 702));
            let y0 = rnd(n, 703);
            let mut want = vec![0.0; n];
            cpu::matmul_t_reference(&row, 1, &Tensor::from_f32("w", vec![n, k], &w), &mut want);
            for (o, b) in want.iter_mut().zip(&y0) {
                *o += beta * b;
            }
            let wd = if f32w {
                (g.upload(&w).unwrap(), None)
            } else {
                (
                    g.zeros::<f32>(1).unwrap(),
                    Some(g.upload(&to_bf16_bits(&w)).unwrap()),
                )
            };
            let wp = match &wd.1 {
                Some(b) => W::Bf16(g.ptr(b)),
                None => W::F32(g.ptr(&wd.0)),
            };
            let mut first: Option<Vec<f32>> = None;
            for &t in &ts {
                for at in [0, t - 1] {
                    let mut x = xs[..t * k].to_vec();
                    x[at * k..(at + 1) * k].copy_from_slice(&row);
                    let mut yh = rnd(t * n, 704);
                    yh[at * n..(at + 1) * n].copy_from_slice(&y0);
                    let yd = g.upload(&yh).unwrap();
                    let (xd16, xd32);
                    let xp = if f32w {
                        xd32 = g.upload(&x).unwrap();
                        g.ptr(&xd32)
                    } else {
                        xd16 = g.upload(&to_bf16_bits(&x)).unwrap();
                        g.ptr(&xd16)
                    };
                    let tag = format!(
                        "{} K={k} N={n} beta={beta} row {at} of {t}",
                        if f32w { "f32" } else { "bf16" }
                    );
                    gemm_ld_as(&g, true, xp, k, t, k, wp, k, n, g.ptr(&yd), n, beta)
                        .unwrap_or_else(|e| panic!("{tag}: {e}"));
                    let got = g.download(&yd, t * n).unwrap()[at * n..(at + 1) * n].to_vec();
                    match &first {
                        None => {
                            check(&tag, &got, &want, if f32w { 2e-6 } else { TOL });
                            first = Some(got);
                        }
                        Some(f) => assert!(
                            got.iter().zip(f).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{tag}: differs from the row among 2"
                        ),
                    }
                }
            }
        }
    }
    for line in onepass_cuda::gemm_lt::pinned(&g) {
        println!("pinned {line}");
    }
    assert_eq!(
        onepass_cuda::gemm_lt::fallbacks(&g),
        0,
        "GEMMs fell back to GemmEx"
    );
}

/// Not a check (ignored like the GPU tests): µs per call and TFLOP/s of the Qwen3.5-0.8B projection shapes, GemmEx
/// and the batch-invariant pinned algorithm side by side.
#[test]
#[ignore = "a timing table on a CUDA GPU, not a check (run with --include-ignored on a GPU machine)"]
fn gemm_timings() {
    let g = gpu();
    // (name, N, K, beta)
    let shapes = [
        ("gdn in", 8224, 1024, 0.0f32),
        ("gdn out", 1024, 2048, 1.0),
        ("attn in", 6144, 1024, 0.0),
        ("mlp gate|up", 7168, 1024, 0.0),
        ("mlp down", 1024, 3584, 1.0),
    ];
    println!("{}", g.name);
    for t in [175usize, 231, 3400, 7392] {
        for &(name, n, k, beta) in &shapes {
            let x = g.upload(&to_bf16_bits(&rnd(t * k, 500))).unwrap();
            let w = g.upload(&to_bf16_bits(&rnd(n * k, 501))).unwrap();
            let y = g.zeros::<f32>(t * n).unwrap();
            let (xp, wp, yp) = (g.ptr(&x), g.ptr(&w), g.ptr(&y));
            let us = per_call_us(&g, &|| {
                g.gemm(xp, t, k, W::Bf16(wp), n, yp, n, beta).unwrap()
            });
            let inv = per_call_us(&g, &|| {
                onepass_cuda::gemm::gemm_ld_as(
                    &g,
                    true,
                    xp,
                    k,
                    t,
                    k,
                    W::Bf16(wp),
                    k,
                    n,
                    yp,
                    n,
                    beta,
                )
                .unwrap()
            });
            let tf = 2.0 * (t * n * k) as f64 / (us * 1e-6) / 1e12;
            println!(
                "T {t:5} {name:12} N {n:5} K {k:5} beta {beta}: {us:8.1} µs {tf:6.1} TFLOP/s; batch-invariant \
                 {inv:8.1} µs ({:.2}x)",
                inv / us
            );
        }
    }
}

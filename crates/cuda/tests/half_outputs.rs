//! The half precision's f16 gate|up output: the GEMM that stores it (`gemm::gemm_half_out`, f16 times 2^o) against
//! the CPU and the f32-output GEMM, gate and up written side by side into one [T, 2N] buffer as the model lays them
//! out; and SwiGLU reading it (`ops::swiglu_f16`) against the CPU on the values the f16 holds. GPU tests:
//! `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::gemm;
use onepass_cuda::ops::{self, Out, W};
use onepass_kernels as cpu;
use onepass_tensor::Tensor;

/// f16 bits of each value of `v` times 2^e, and the values those bits stand for (over 2^e).
fn f16_scaled(v: &[f32], e: i32) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = v
        .iter()
        .map(|x| half::f16::from_f32(x * 2f32.powi(e)).to_bits())
        .collect();
    let back = bits
        .iter()
        .map(|h| half::f16::from_bits(*h).to_f32() * 2f32.powi(-e))
        .collect();
    (bits, back)
}

/// Over more rows than the few-row GEMV takes: x [T, K] f16 (a norm's output), gate and up [N, K] each a
/// [`W::Half`] weight (bf16 values at scales far from 1), multiplied into the halves of y [T, 2N] (row stride 2N)
/// with an f16 output times 2^o: o putting the largest |y| in [2^14, 2^15) (as the model's bound does, from above)
/// and 9 below that. Each value within one f16 rounding (2^-11 relative) plus the f32 sums' error (1e-5 of the
/// largest) of the CPU's product of the same f16 rows, and of the f32-output GEMM's.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn half_gemm_stores_scaled_f16_outputs() {
    let g = gpu();
    for &(t, k, n, scale) in &[
        (9, 1024, 333, 1.0f32),
        (63, 100, 130, 0.003),
        (200, 1024, 3584, 300.0),
    ] {
        let x: Vec<f32> = rnd(t * k, 60).iter().map(|v| 3.0 * v).collect();
        let (xbits, xs) = f16_scaled(&x, 0);
        let xd = g.upload(&xbits).unwrap();
        let ld = 2 * n;
        // The CPU's [T, 2N]: gate's columns, then up's.
        let mut want = vec![0f32; t * ld];
        let mut parts = Vec::new();
        for (i, seed) in [61u64, 62].into_iter().enumerate() {
            let w = bf16_round(
                &rnd(n * k, seed)
                    .iter()
                    .map(|v| v * scale)
                    .collect::<Vec<_>>(),
            );
            let mut y = vec![0f32; t * n];
            cpu::matmul_t_reference(&xs, t, &Tensor::from_f32("w", vec![n, k], &w), &mut y);
            for r in 0..t {
                want[r * ld + i * n..r * ld + (i + 1) * n].copy_from_slice(&y[r * n..(r + 1) * n]);
            }
            let (bits, shift) = gemm::half_scaled(&w);
            parts.push((g.upload(&bits).unwrap(), shift));
        }
        let hw = |i: usize| W::Half {
            w: g.ptr(&parts[i].0),
            shift: parts[i].1,
        };
        // The f32-output GEMM over the same buffers.
        let yf = g.alloc::<f32>(t * ld).unwrap();
        for i in 0..2 {
            let y = g.ptr(&yf) + 4 * (i * n) as u64;
            gemm::gemm_ld_as(&g, false, g.ptr(&xd), k, t, k, hw(i), k, n, y, ld, 0.0).unwrap();
        }
        let f32_out = g.download(&yf, t * ld).unwrap();
        let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let o_top = 14 - top.log2().floor() as i32;
        for o in [o_top, o_top - 9] {
            let yh = g.alloc::<u16>(t * ld).unwrap();
            for i in 0..2 {
                let y = (g.ptr(&yh) + 2 * (i * n) as u64, ld);
                gemm::gemm_half_out(&g, (g.ptr(&xd), k), t, k, (hw(i), k), n, y, o).unwrap();
            }
            let got: Vec<f32> = g
                .download(&yh, t * ld)
                .unwrap()
                .iter()
                .map(|h| half::f16::from_bits(*h).to_f32() * 2f32.powi(-o))
                .collect();
            assert!(got.iter().all(|v| v.is_finite()), "non-finite f16 output");
            let tag = format!("f16 out t={t} k={k} n={n} scale {scale} times 2^{o}");
            for (what, reference) in [("CPU", &want), ("f32 GEMM", &f32_out)] {
                let worst = got.iter().zip(reference.iter()).fold(0f32, |m, (a, b)| {
                    m.max((a - b).abs() / (b.abs() * 2f32.powi(-11) + 1e-5 * top))
                });
                eprintln!("{tag} against the {what}: worst error {worst:.3} of its bound");
                assert!(
                    worst <= 1.0,
                    "{tag} against the {what}: {worst:.3} of the bound"
                );
            }
        }
    }
}

/// SwiGLU on gate|up as the half precision's f16 GEMM output times 2^e: one value per thread (inter 77, and an
/// unaligned buffer), four (inter 128, 8-byte loads); f32, bf16 and scaled f16 outputs (the down projection's input
/// form). Against the CPU on the values the f16 holds.
#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn swiglu_reads_scaled_f16_gate_up() {
    let g = gpu();
    let n = 65;
    for (inter, off) in [(77, 0), (128, 0), (128, 1)] {
        let gu: Vec<f32> = rnd(n * 2 * inter, 63).iter().map(|v| 5.0 * v).collect();
        for e in [-5, 8] {
            let (mut bits, back) = f16_scaled(&gu, e);
            let mut want = Vec::new();
            for row in back.chunks_exact(2 * inter) {
                let mut a = row[..inter].to_vec();
                cpu::swiglu(&mut a, &row[inter..]);
                want.extend(a);
            }
            bits.splice(0..0, std::iter::repeat_n(0u16, off));
            let gh = g.upload(&bits).unwrap();
            let gp = g.ptr(&gh) + 2 * off as u64;
            let tag = format!("swiglu f16 inputs times 2^{e}, inter {inter}, offset {off}");
            let of = g.alloc::<f32>(n * inter).unwrap();
            ops::swiglu_f16(&g, gp, e, inter, n, Out::F32(g.ptr(&of))).unwrap();
            check(
                &format!("{tag}, f32 out"),
                &g.download(&of, n * inter).unwrap(),
                &want,
                F32_TOL,
            );
            let ob = g.alloc::<u16>(n * inter).unwrap();
            ops::swiglu_f16(&g, gp, e, inter, n, Out::Bf16(g.ptr(&ob))).unwrap();
            let got = from_bf16_bits(&g.download(&ob, n * inter).unwrap());
            check(&format!("{tag}, bf16 out"), &got, &want, BF16_TOL);
            let oh = g.alloc::<u16>(n * inter).unwrap();
            ops::swiglu_f16(&g, gp, e, inter, n, Out::F16(g.ptr(&oh), 3)).unwrap();
            let got: Vec<f32> = from_f16_bits(&g.download(&oh, n * inter).unwrap())
                .iter()
                .map(|v| v / 8.0)
                .collect();
            check(&format!("{tag}, f16 out times 2^3"), &got, &want, F16_TOL);
        }
    }
    assert!(
        ops::swiglu_f16(&g, 0, 61, 4, 1, Out::F32(0)).is_err(),
        "an exponent past 2^60 is refused"
    );
}

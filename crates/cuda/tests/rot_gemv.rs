//! The one-row PQ2_0 GEMVs that form and rotate their own input ([`onepass_cuda::qgemm::gemv_pq2_rot`], a rotated
//! pack's decode sites) against the CPU: the input formed in f64 (RMSNorm, SwiGLU, the Gated DeltaNet's gated norm,
//! or as it is), rotated by the CPU's blockwise Hadamard reference, and multiplied by the CPU's PQ2_0 product, on
//! K of 1, 2, 5 and 17 blocks of 1024 (one warp each; 17: more warps than a block of the plain GEMV takes) and odd
//! N, beta 0 and 1; the normed row the first GEMV stores for the unrotated parts, in each layout. GPU tests:
//! `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use half::f16;
use onepass_cuda::ops::Out;
use onepass_cuda::qgemm::{gemv_pq2_rot, upload_blocks, RotKind, RotSrc};
use onepass_kernels::{hadamard_rotate_reference, matmul_t_reference};
use onepass_tensor::{DType, Tensor};

/// A random PQ2_0 matrix [n, k] as file blocks (every code 0..=3).
fn pq2_blocks(n: usize, k: usize, seed: u64) -> Vec<u8> {
    let nb = n * k / 128;
    let u = rnd(nb * 33, seed);
    let mut out = Vec::with_capacity(nb * 34);
    for b in 0..nb {
        let r = &u[b * 33..(b + 1) * 33];
        out.extend_from_slice(&f16::from_f32(0.02 + 0.05 * (r[0] + 1.0)).to_le_bytes());
        out.extend(
            r[1..]
                .iter()
                .map(|v| (((v + 1.0) * 128.0) as u32).min(255) as u8),
        );
    }
    out
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// The f64 input of `kind` for one row of K = `k` (before the rotation): x the source row ([gate | up] for SwiGLU),
/// z the gate row, w the gain (Norm: [k]; GatedNorm: [dv]).
fn formed(
    kind: RotKind,
    x: &[f32],
    z: &[f32],
    w: &[f32],
    eps: f32,
    dv: usize,
    k: usize,
) -> Vec<f32> {
    let f = |v: f32| f64::from(v);
    match kind {
        RotKind::Plain => x[..k].to_vec(),
        RotKind::Swiglu => (0..k)
            .map(|c| (silu(f(x[c])) * f(x[k + c])) as f32)
            .collect(),
        RotKind::Norm => {
            let ms = x[..k].iter().map(|v| f(*v).powi(2)).sum::<f64>() / k as f64;
            let inv = 1.0 / (ms + f(eps)).sqrt();
            (0..k).map(|c| (f(x[c]) * inv * f(w[c])) as f32).collect()
        }
        RotKind::GatedNorm => {
            let mut out = vec![0.0f32; k];
            for h in 0..k / dv {
                let row = &x[h * dv..(h + 1) * dv];
                let ms = row.iter().map(|v| f(*v).powi(2)).sum::<f64>() / dv as f64;
                let inv = 1.0 / (ms + f(eps)).sqrt();
                for c in 0..dv {
                    let i = h * dv + c;
                    out[i] = (f(row[c]) * inv * f(w[c]) * silu(f(z[i]))) as f32;
                }
            }
            out
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn fused_rotation_gemv_matches_cpu() {
    let g = gpu();
    let mut fails = Vec::new();
    let kinds = [
        RotKind::Norm,
        RotKind::Swiglu,
        RotKind::GatedNorm,
        RotKind::Plain,
    ];
    for (kb, n) in [(1usize, 37usize), (2, 300), (5, 1001), (17, 129)] {
        let k = 1024 * kb;
        let raw = pq2_blocks(n, k, (k + n) as u64);
        let tensor = Tensor::from_raw("w", DType::PQ2_0, vec![n, k], &raw).unwrap();
        let (_wbuf, w) = upload_blocks(&g, &[&raw], false).unwrap();
        let signs: Vec<f32> = rnd(k, 5)
            .iter()
            .map(|v| if *v < 0.0 { -1.0 } else { 1.0 })
            .collect();
        let sd = g.upload(&signs).unwrap();
        for (i, kind) in kinds.into_iter().enumerate() {
            // Values of a few units (SwiGLU's gate past its knee), one outlier per row.
            let mut x: Vec<f32> = rnd(2 * k, (31 * i + kb) as u64)
                .iter()
                .map(|v| 3.0 * v)
                .collect();
            x[k / 3] = 40.0;
            let z: Vec<f32> = rnd(k, 7).iter().map(|v| 2.0 * v).collect();
            // Heads of one lane, several lanes, and a whole warp.
            let dv = match (kind, kb) {
                (RotKind::GatedNorm, 1) => 1024,
                (RotKind::GatedNorm, 2) => 32,
                (RotKind::GatedNorm, 5) => 128,
                (RotKind::GatedNorm, _) => 256,
                _ => 0,
            };
            let gain: Vec<f32> = rnd(k, 8).iter().map(|v| 1.0 + 0.3 * v).collect();
            let eps = 1e-6f32;
            let mut rot = formed(kind, &x, &z, &gain, eps, dv.max(1), k);
            let normed = rot.clone();
            hadamard_rotate_reference(&mut rot, &signs);
            let mut want = vec![0.0f32; n];
            matmul_t_reference(&rot, 1, &tensor, &mut want);
            let (xd, zd, gd) = (
                g.upload(&x).unwrap(),
                g.upload(&z).unwrap(),
                g.upload(&gain).unwrap(),
            );
            let y0 = rnd(n, 99);
            let yd = g.upload(&y0).unwrap();
            let rawd = g.alloc::<f32>(2 * k).unwrap();
            for (beta, layout) in [(0.0f32, "f32"), (1.0, "bf16"), (0.0, "split")] {
                g.upload_into(&y0, &yd).unwrap();
                let out = match layout {
                    "f32" => Out::F32(g.ptr(&rawd)),
                    "bf16" => Out::Bf16(g.ptr(&rawd)),
                    _ => Out::Split(g.ptr(&rawd), k),
                };
                let (rp, raw_mode) = out.parts();
                let src = RotSrc {
                    x: g.ptr(&xd),
                    z: g.ptr(&zd),
                    w: g.ptr(&gd),
                    signs: g.ptr(&sd),
                    raw: if kind == RotKind::Norm { rp } else { 0 },
                    eps,
                    dv: dv as i32,
                    raw_mode,
                    pad: 0,
                };
                gemv_pq2_rot(&g, kind, src, k, w, n, g.ptr(&yd), beta).unwrap();
                let got = g.download(&yd, n).unwrap();
                let b: Vec<f32> = want.iter().zip(&y0).map(|(a, y)| a + beta * y).collect();
                // The integer products round each lane's 32 rotated values to int16 (about 2^-16 of their
                // largest): the one-row GEMV's bound, 1e-4.
                let e = rel_err(&got, &b);
                let name = format!("{kind:?} K {k} N {n} beta {beta} (dv {dv})");
                eprintln!("{name}: {e:.3e} (tolerance 1e-4)");
                if e > 1e-4 || e.is_nan() {
                    fails.push(format!("{name}: {e:.3e}"));
                }
                if kind == RotKind::Norm {
                    // The normed row as it is, in the layout asked for (split: hi then lo, k values apart).
                    let v = g.download(&rawd, 2 * k).unwrap();
                    let bits: Vec<u16> = v
                        .iter()
                        .flat_map(|f| {
                            let u = f.to_bits();
                            [u as u16, (u >> 16) as u16]
                        })
                        .collect();
                    let vals = from_bf16_bits(&bits);
                    let (got, tol): (Vec<f32>, f32) = match layout {
                        "f32" => (v[..k].to_vec(), F32_TOL),
                        "bf16" => (vals[..k].to_vec(), BF16_TOL),
                        _ => ((0..k).map(|c| vals[c] + vals[k + c]).collect(), 1e-4),
                    };
                    check(&format!("{name} normed row {layout}"), &got, &normed, tol);
                }
            }
        }
    }
    assert!(fails.is_empty(), "over tolerance: {fails:?}");
}

//! The one-block rotation of one token row at a rotated pack's decode sites ([`onepass_cuda::ops::rotate_row`])
//! against the CPU: the row formed in f64 (RMSNorm, SwiGLU, the Gated DeltaNet's gated norm, or as it is) and rotated
//! by the CPU's blockwise Hadamard reference, on K of 1, 2, 5 and 17 blocks of 1024 (one warp each), stored in each
//! activation layout (f32, bf16, split hi + lo), and the normed row stored beside it for the unrotated parts. GPU
//! tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::ops::{rotate_row, rotate_row_takes, Out, RotKind, RotSrc};
use onepass_kernels::hadamard_rotate_reference;

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

/// A device buffer of 2k f32 words read back in `layout` as k values (split: hi, then lo k values on).
fn read(v: &[f32], k: usize, layout: &str) -> Vec<f32> {
    if layout == "f32" {
        return v[..k].to_vec();
    }
    let bits: Vec<u16> = v
        .iter()
        .flat_map(|f| {
            let u = f.to_bits();
            [u as u16, (u >> 16) as u16]
        })
        .collect();
    let vals = from_bf16_bits(&bits);
    match layout {
        "bf16" => vals[..k].to_vec(),
        _ => (0..k).map(|c| vals[c] + vals[k + c]).collect(),
    }
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn rotate_row_matches_cpu() {
    let g = gpu();
    let kinds = [
        RotKind::Norm,
        RotKind::Swiglu,
        RotKind::GatedNorm,
        RotKind::Plain,
    ];
    for kb in [1usize, 2, 5, 17] {
        let k = 1024 * kb;
        let signs: Vec<f32> = rnd(k, 5)
            .iter()
            .map(|v| if *v < 0.0 { -1.0 } else { 1.0 })
            .collect();
        let sd = g.upload(&signs).unwrap();
        for (i, kind) in kinds.into_iter().enumerate() {
            // Values of a few units (SwiGLU's gate past its knee), one outlier.
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
            assert!(rotate_row_takes(kind, k, dv));
            let gain: Vec<f32> = rnd(k, 8).iter().map(|v| 1.0 + 0.3 * v).collect();
            let eps = 1e-6f32;
            let normed = formed(kind, &x, &z, &gain, eps, dv.max(1), k);
            let mut want = normed.clone();
            hadamard_rotate_reference(&mut want, &signs);
            let (xd, zd, gd) = (
                g.upload(&x).unwrap(),
                g.upload(&z).unwrap(),
                g.upload(&gain).unwrap(),
            );
            let (od, rawd) = (
                g.alloc::<f32>(2 * k).unwrap(),
                g.alloc::<f32>(2 * k).unwrap(),
            );
            for layout in ["f32", "bf16", "split"] {
                let at = |p: u64| match layout {
                    "f32" => Out::F32(p),
                    "bf16" => Out::Bf16(p),
                    _ => Out::Split(p, k),
                };
                let (rp, raw_mode) = at(g.ptr(&rawd)).parts();
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
                rotate_row(&g, kind, src, k, at(g.ptr(&od))).unwrap();
                let tol = match layout {
                    "f32" => F32_TOL,
                    "bf16" => BF16_TOL,
                    _ => 1e-4,
                };
                let name = format!("{kind:?} K {k} {layout} (dv {dv})");
                let got = read(&g.download(&od, 2 * k).unwrap(), k, layout);
                check(&name, &got, &want, tol);
                if kind == RotKind::Norm {
                    let got = read(&g.download(&rawd, 2 * k).unwrap(), k, layout);
                    check(&format!("{name} normed row"), &got, &normed, tol);
                }
            }
        }
    }
    assert!(
        !rotate_row_takes(RotKind::Plain, 25 * 1024, 0),
        "past one block"
    );
    assert!(
        !rotate_row_takes(RotKind::GatedNorm, 1024, 16),
        "heads within a lane"
    );
}

//! The one-block rotation of one token row at a rotated pack's norm sites ([`onepass_cuda::ops::rotate_row_norm`])
//! against the CPU: the row RMS-normed in f64 and rotated by the CPU's blockwise Hadamard reference, on K of 1, 2, 5
//! and 17 blocks of 1024 (one warp each), stored in each activation layout (f32, bf16, split hi + lo), and the normed
//! row stored beside it for the unrotated parts (GPU: `#[ignore]`d, run with `--include-ignored` on a GPU machine), and
//! on the host the activation readback those checks use.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use onepass_cuda::ops::{rotate_row_norm, rotate_row_takes, Out, RotSrc};
use onepass_kernels::hadamard_rotate_reference;

/// The f64 RMSNorm of one row of K = `k` (before the rotation), gain `w` [k].
fn normed(x: &[f32], w: &[f32], eps: f32, k: usize) -> Vec<f32> {
    let f = |v: f32| f64::from(v);
    let ms = x[..k].iter().map(|v| f(*v).powi(2)).sum::<f64>() / k as f64;
    let inv = 1.0 / (ms + f(eps)).sqrt();
    (0..k).map(|c| (f(x[c]) * inv * f(w[c])) as f32).collect()
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn rotate_row_norm_matches_cpu() {
    let g = gpu();
    for kb in [1usize, 2, 5, 17] {
        let k = 1024 * kb;
        let signs: Vec<f32> = rnd(k, 5)
            .iter()
            .map(|v| if *v < 0.0 { -1.0 } else { 1.0 })
            .collect();
        let sd = g.upload(&signs).unwrap();
        // Values of a few units, one outlier.
        let mut x: Vec<f32> = rnd(k, kb as u64).iter().map(|v| 3.0 * v).collect();
        x[k / 3] = 40.0;
        assert!(rotate_row_takes(k));
        let gain: Vec<f32> = rnd(k, 8).iter().map(|v| 1.0 + 0.3 * v).collect();
        let eps = 1e-6f32;
        let normed = normed(&x, &gain, eps, k);
        let mut want = normed.clone();
        hadamard_rotate_reference(&mut want, &signs);
        let (xd, gd) = (g.upload(&x).unwrap(), g.upload(&gain).unwrap());
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
            let (raw, raw_mode) = at(g.ptr(&rawd)).parts();
            let src = RotSrc {
                x: g.ptr(&xd),
                w: g.ptr(&gd),
                signs: g.ptr(&sd),
                raw,
                eps,
                raw_mode,
            };
            rotate_row_norm(&g, src, k, at(g.ptr(&od))).unwrap();
            let tol = match layout {
                "f32" => F32_TOL,
                "bf16" => BF16_TOL,
                _ => 1e-4,
            };
            let name = format!("K {k} {layout}");
            let got = read_act(&g.download(&od, 2 * k).unwrap(), 1, k, layout);
            check(&name, &got, &want, tol);
            let got = read_act(&g.download(&rawd, 2 * k).unwrap(), 1, k, layout);
            check(&format!("{name} normed row"), &got, &normed, tol);
        }
    }
    assert!(!rotate_row_takes(25 * 1024), "past one block");
    assert!(!rotate_row_takes(1536), "not whole 1024-blocks");
}

/// The readback the GPU tests above rely on, on the host: f32 words, bf16 pairs in each word, and split rows (each
/// row's hi plane, then its lo plane) give back the values written.
#[test]
fn read_act_reads_each_layout_back() {
    let (rows, k) = (2usize, 4usize);
    let want: Vec<f32> = (0..rows * k).map(|i| i as f32 * 0.75 - 2.0).collect();
    let words = |halves: &[u16]| -> Vec<f32> {
        halves
            .chunks(2)
            .map(|p| f32::from_bits(u32::from(p[0]) | (u32::from(p[1]) << 16)))
            .collect()
    };
    assert_eq!(read_act(&want, rows, k, "f32"), want);
    assert_eq!(
        read_act(&words(&to_bf16_bits(&want)), rows, k, "bf16"),
        want
    );
    // Split: hi = the value, lo = a small remainder each row's second plane holds.
    let lo: Vec<f32> = (0..rows * k).map(|i| i as f32 / 256.0).collect();
    let mut planes = Vec::new();
    for r in 0..rows {
        planes.extend_from_slice(&want[r * k..(r + 1) * k]);
        planes.extend_from_slice(&lo[r * k..(r + 1) * k]);
    }
    let sums: Vec<f32> = want.iter().zip(&lo).map(|(a, b)| a + b).collect();
    assert_eq!(
        read_act(&words(&to_bf16_bits(&planes)), rows, k, "split"),
        sums
    );
}

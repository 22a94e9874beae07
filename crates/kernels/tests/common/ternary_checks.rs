//! What the ternary kernel tests share: the matvec/GEMM paths this processor runs, the f32-rounding
//! comparison against a slow twin or an independent route, and the slow twin checked against a dense
//! matmul of the decoded weights.
#![allow(dead_code)]

use onepass_formats::quant::{dequantize, GgmlType};
use onepass_kernels::{matmul_t_reference, TernaryPath};
use onepass_tensor::Tensor;

use crate::xorshift::Rng;

/// The odd shapes (N outputs, K inputs in whole blocks of 128) the matvec/GEMM tests run.
pub const SHAPES: [(usize, usize); 7] = [
    (1, 128),
    (3, 256),
    (5, 1152),
    (7, 640),
    (13, 384),
    (67, 1024),
    (130, 256),
];

/// The weights `w` ([N, K] in `ty`) through the formats crate's block decoder: the values and the
/// dense f32 tensor of them.
pub fn decoded(ty: GgmlType, w: &[u8], n: usize, k: usize) -> (Vec<f32>, Tensor) {
    let mut wf = vec![0f32; n * k];
    dequantize(ty, w, &mut wf).expect("whole blocks");
    let wt = Tensor::from_f32("w", vec![n, k], &wf);
    (wf, wt)
}

/// The paths this processor can run.
pub fn paths() -> Vec<TernaryPath> {
    [
        TernaryPath::Avx512,
        TernaryPath::Avx2,
        TernaryPath::Portable,
    ]
    .into_iter()
    .filter(|p| p.available())
    .collect()
}

/// Compares `got` with `want` elementwise within 2e-6 of the sum of |w·x| (`scale`, from
/// [`abs_products`]; an f32 rounding bound for K up to a few thousand), which a wrong code, scale
/// or index breaks by orders of magnitude.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], scale: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = 2e-6 * s + 1e-7;
        assert!(
            (g - w).abs() <= tol,
            "{what}: output {i}: {g} vs {w} (|diff| {} > {tol})",
            (g - w).abs()
        );
    }
}

/// Σ_c |x[i, c] · w[r, c]| for every output (i, r): the scale of [`assert_close`]'s bound.
pub fn abs_products(x: &[f32], t: usize, wf: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; t * n];
    for i in 0..t {
        for r in 0..n {
            out[i * n + r] = (0..k).map(|c| (x[i * k + c] * wf[r * k + c]).abs()).sum();
        }
    }
    out
}

/// `t` random tokens for the weights `wf` ([N, K], as the dense tensor `wt`), and the slow twin's
/// output on them (`twin(x, out)`) checked against the dense matmul: → (x, the twin's output, the
/// bound's scale).
pub fn twin_checked_against_dense(
    rng: &mut Rng,
    t: usize,
    wf: &[f32],
    wt: &Tensor,
    twin: impl Fn(&[f32], &mut [f32]),
    what: &str,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (n, k) = (wt.shape()[0], wt.shape()[1]);
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    let scale = abs_products(&x, t, wf, n, k);
    let mut slow = vec![0f32; t * n];
    twin(&x, &mut slow);
    let mut dense = vec![0f32; t * n];
    matmul_t_reference(&x, t, wt, &mut dense);
    assert_close(what, &slow, &dense, &scale);
    (x, slow, scale)
}

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
        TernaryPath::Avx512Vnni,
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

/// `x[T, K]` rounded as the integer kernels round their activations (per 128-value block of a token,
/// `s = max|x| / 32767`, `q = round(x · 32767 / max|x|)`, value `q·s`): → (the rounded values, each value's step `s`).
pub fn act_rounded(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut out = Vec::with_capacity(x.len());
    let mut steps = Vec::with_capacity(x.len());
    for xs in x.chunks_exact(128) {
        let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (s, inv) = if max == 0.0 {
            (0.0, 0.0)
        } else {
            (max / 32767.0, 32767.0 / max)
        };
        out.extend(
            xs.iter()
                .map(|v| (v * inv).round().clamp(-32767.0, 32767.0) * s),
        );
        steps.extend(std::iter::repeat_n(s, 128));
    }
    (out, steps)
}

/// The largest error seen by [`assert_path_close`] on a path that rounds its activations, relative to the largest
/// |output| of the call, and relative to the output's Σ|w·x|.
pub static WORST_ROUNDED: std::sync::Mutex<(f64, f64)> = std::sync::Mutex::new((0.0, 0.0));

/// [`assert_close`] for `path`'s output `got` on `x[T, K]` against the slow twin's `want` (`scale` from
/// [`abs_products`], `wf` the decoded weights [N, K]). A path that rounds its activations (the integer kernels) is
/// held to the bound of that rounding on top, Σ|w|·s/2 per output, and its output is also compared at the f32
/// bound with `twin` (the slow twin) on the rounded activations, which checks its integer arithmetic exactly.
#[allow(clippy::too_many_arguments)]
pub fn assert_path_close(
    path: TernaryPath,
    what: &str,
    x: &[f32],
    t: usize,
    wf: &[f32],
    got: &[f32],
    want: &[f32],
    scale: &[f32],
    twin: impl Fn(&[f32], &mut [f32]),
) {
    if !path.rounds_activations() {
        return assert_close(what, got, want, scale);
    }
    let (n, k) = (want.len() / t, x.len() / t);
    let (xr, steps) = act_rounded(x);
    let mut on_rounded = vec![0f32; t * n];
    twin(&xr, &mut on_rounded);
    assert_close(
        &format!("{what} vs the twin on rounded activations"),
        got,
        &on_rounded,
        &abs_products(&xr, t, wf, n, k),
    );
    let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = WORST_ROUNDED.lock().expect("not poisoned");
    for i in 0..t {
        for r in 0..n {
            let bound: f32 = (0..k)
                .map(|c| wf[r * k + c].abs() * steps[i * k + c] * 0.5)
                .sum();
            let (g, w, s) = (got[i * n + r], want[i * n + r], scale[i * n + r]);
            let tol = 1.01 * bound + 2e-6 * s + 1e-7;
            assert!(
                (g - w).abs() <= tol,
                "{what}: output ({i}, {r}): {g} vs {w} (|diff| {} > {tol})",
                (g - w).abs()
            );
            let e = f64::from((g - w).abs());
            worst.0 = worst.0.max(e / f64::from(peak.max(f32::MIN_POSITIVE)));
            worst.1 = worst.1.max(e / f64::from(s.max(f32::MIN_POSITIVE)));
        }
    }
}

/// A ternary matmul on one path (`ternary_matmul_t_with`'s or `ptq1_0_matmul_t_with`'s signature).
pub type PathMatmul = fn(TernaryPath, &[f32], usize, &[u8], usize, usize, &mut [f32]);

/// Every token of `x` ([T, K]) gives the same output bits alone as stacked with the others, on every path (batch
/// invariance), for weights `w` ([N, K] in `matmul`'s format).
pub fn assert_tokens_alone_as_stacked(
    matmul: PathMatmul,
    x: &[f32],
    t: usize,
    w: &[u8],
    n: usize,
    k: usize,
) {
    for path in paths() {
        let mut all = vec![f32::NAN; t * n];
        matmul(path, x, t, w, n, k, &mut all);
        for i in 0..t {
            let mut one = vec![f32::NAN; n];
            matmul(path, &x[i * k..(i + 1) * k], 1, w, n, k, &mut one);
            let same = one
                .iter()
                .zip(&all[i * n..(i + 1) * n])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{path:?}: token {i} alone vs stacked");
        }
    }
}

//! The ternary matvec/GEMM and the Hadamard rotation: every fast path against its slow twin and
//! against an independent route (the formats crate's block decoder, then an f32 matmul), on odd
//! shapes; the rotation against float64 vectors from the numpy generator
//! (tests/fixtures/gguf/expected.json).

use std::path::PathBuf;

use half::f16;
use onepass_formats::gguf::Gguf;
use onepass_formats::quant::{dequantize, ptq1_0_to_pq2_0, GgmlType};
use onepass_formats::HadamardMeta;
use onepass_kernels::{
    hadamard_rotate, hadamard_rotate_reference, hadamard_unrotate, hadamard_unrotate_reference,
    matmul_t_reference, ternary_matmul_t, ternary_matmul_t_reference, ternary_matmul_t_with,
};
use onepass_tensor::Tensor;

#[path = "common/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

#[path = "common/ternary_checks.rs"]
mod ternary_checks;
use onepass_kernels::TernaryPath;
use ternary_checks::{
    abs_products, assert_close, assert_path_close, assert_tokens_alone_as_stacked, decoded, paths,
    twin_checked_against_dense, SHAPES, WORST_ROUNDED,
};

/// Random PQ2_0 rows: codes 0..=3 (code 3 rare, as a stress of the +2·d rule), scales in the
/// range real packs use.
fn random_pq2_0(rng: &mut Rng, n: usize, k: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(n * k / 128 * 34);
    for _ in 0..n * k / 128 {
        let d = 0.004 + 0.03 * rng.unit();
        w.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        for _ in 0..32 {
            let mut byte = 0u8;
            for j in 0..4 {
                let r = rng.next() % 64;
                let code = if r == 0 { 3 } else { (r % 3) as u8 };
                byte |= code << (2 * j);
            }
            w.push(byte);
        }
    }
    w
}

#[test]
fn fast_paths_match_the_slow_twin_and_dequantize_then_matmul_on_odd_shapes() {
    let mut rng = Rng(0x5eed_0018);
    let paths = paths();
    eprintln!("ternary paths on this processor: {paths:?}");
    for (n, k) in SHAPES {
        let w = random_pq2_0(&mut rng, n, k);
        let (wf, wt) = decoded(GgmlType::PQ2_0, &w, n, k);
        for &t in &[1usize, 2, 3, 7, 63] {
            let (x, slow, scale) = twin_checked_against_dense(
                &mut rng,
                t,
                &wf,
                &wt,
                |x, out| ternary_matmul_t_reference(x, t, &w, n, k, out),
                &format!("slow twin vs dense, N={n} K={k} T={t}"),
            );
            let twin = |x: &[f32], out: &mut [f32]| ternary_matmul_t_reference(x, t, &w, n, k, out);
            for &path in &paths {
                let mut y = vec![f32::NAN; t * n];
                ternary_matmul_t_with(path, &x, t, &w, n, k, &mut y);
                let what = format!("{path:?} N={n} K={k} T={t}");
                assert_path_close(path, &what, &x, t, &wf, &y, &slow, &scale, twin);
            }
            let mut y = vec![f32::NAN; t * n];
            ternary_matmul_t(&x, t, &w, n, k, &mut y);
            let what = format!("detected path N={n} K={k} T={t}");
            let path = TernaryPath::detect();
            assert_path_close(path, &what, &x, t, &wf, &y, &slow, &scale, twin);
        }
    }
    let (peak, sum) = *WORST_ROUNDED.lock().expect("not poisoned");
    eprintln!(
        "rounded activations: max |error| / max|y| {peak:.2e}, max |error| / Σ|w·x| {sum:.2e}"
    );
}

#[test]
fn a_token_reads_the_same_bits_alone_and_stacked_with_others() {
    let mut rng = Rng(0x5eed_0019);
    let (n, k) = (67, 640);
    let w = random_pq2_0(&mut rng, n, k);
    let t = 7;
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    assert_tokens_alone_as_stacked(ternary_matmul_t_with, &x, t, &w, n, k);
}

#[test]
fn code_three_reads_as_plus_two_d_on_every_path() {
    // One row, one block: all codes 3, scale 0.5, x all 1 − 2⁻¹⁵ (which the integer kernels' rounding keeps
    // exactly: 32767 steps of 2⁻¹⁵) → 128 · 2 · 0.5 · x.
    let mut w = f16::from_f32(0.5).to_le_bytes().to_vec();
    w.extend(std::iter::repeat_n(0xFFu8, 32));
    let v = 1.0 - 2f32.powi(-15);
    let x = vec![v; 128];
    for path in paths() {
        let mut y = [0f32];
        ternary_matmul_t_with(path, &x, 1, &w, 1, 128, &mut y);
        assert_eq!(y[0], 128.0 * v, "{path:?}");
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf")
        .join(name)
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("parses")
}

fn ints(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("integer") as f32)
        .collect()
}

#[test]
fn ptq1_0_runs_on_the_pq2_0_kernel_after_transcoding() {
    let file = Gguf::open(&fixture("ternary.gguf")).expect("fixture");
    let info = file.tensor("blk.0.ffn_down.weight").expect("tensor");
    let (n, k) = (info.shape()[0], info.shape()[1]);
    let src = file.tensor_data(info);
    let mut words = vec![0u8; src.len() / 28 * 34];
    ptq1_0_to_pq2_0(src, &mut words).expect("sizes");
    let mut wf = vec![0f32; n * k];
    dequantize(GgmlType::PTQ1_0, src, &mut wf).expect("sizes");
    let wt = Tensor::from_f32("w", vec![n, k], &wf);
    let mut rng = Rng(7);
    let t = 3;
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    let mut dense = vec![0f32; t * n];
    matmul_t_reference(&x, t, &wt, &mut dense);
    let mut y = vec![0f32; t * n];
    ternary_matmul_t(&x, t, &words, n, k, &mut y);
    assert_close(
        "PTQ1_0 via PQ2_0",
        &y,
        &dense,
        &abs_products(&x, t, &wf, n, k),
    );
}

#[test]
fn rotation_matches_the_float64_reference_vectors() {
    let file = Gguf::open(&fixture("ternary.gguf")).expect("fixture");
    let meta = HadamardMeta::from_gguf(&file)
        .expect("valid")
        .expect("present");
    let want = expected();
    let h = &want["hadamard"];

    type Transform = fn(&mut [f32], &[f32]);
    /// The input and expected-output vectors of the fixture (the output times 32), the width, and the fast and
    /// reference transforms.
    type Case = (
        &'static str,
        &'static str,
        usize,
        [(&'static str, Transform); 2],
    );
    let cases: [Case; 2] = [
        (
            "x2048",
            "rx2048_times_32",
            2048,
            [
                ("fast rotation", hadamard_rotate),
                ("reference rotation", hadamard_rotate_reference),
            ],
        ),
        (
            "z1024",
            "inverse1024_times_32",
            1024,
            [
                ("fast inverse", hadamard_unrotate),
                ("reference inverse", hadamard_unrotate_reference),
            ],
        ),
    ];
    for (input, output, width, transforms) in cases {
        let x = ints(&h[input]);
        let want: Vec<f32> = ints(&h[output]).iter().map(|v| v / 32.0).collect();
        let signs = meta
            .signs_for(width)
            .unwrap_or_else(|| panic!("width {width}"));
        for (what, transform) in transforms {
            let mut got = x.clone();
            transform(&mut got, signs);
            assert_eq!(got, want, "{what}");
        }
    }
}

#[test]
fn rotation_is_orthogonal_and_fast_matches_slow_on_several_rows() {
    let mut rng = Rng(99);
    let k = 3072;
    let signs: Vec<f32> = (0..k)
        .map(|_| if rng.next() & 1 == 0 { 1.0 } else { -1.0 })
        .collect();
    let t = 3;
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    let mut fast = x.clone();
    hadamard_rotate(&mut fast, &signs);
    let mut slow = x.clone();
    hadamard_rotate_reference(&mut slow, &signs);
    for (a, b) in fast.iter().zip(&slow) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    // Rᵀ·R = I.
    hadamard_unrotate(&mut fast, &signs);
    for (a, b) in fast.iter().zip(&x) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    // Norms are kept (the fold changes no magnitudes).
    let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
    assert!((norm(&slow[..k]) - norm(&x[..k])).abs() <= 1e-3 * norm(&x[..k]));
}

/// The identity a ternary pack relies on: with `W'` the folded weight, `W'·(R·x) = (W'·R)·x`.
#[test]
fn folded_matmul_equals_the_unfolded_float_product() {
    let mut rng = Rng(1234);
    let (n, k, t) = (9, 2048, 2);
    let w = random_pq2_0(&mut rng, n, k);
    let mut wf = vec![0f32; n * k];
    dequantize(GgmlType::PQ2_0, &w, &mut wf).expect("sizes");
    let signs: Vec<f32> = (0..k)
        .map(|_| if rng.next() & 1 == 0 { 1.0 } else { -1.0 })
        .collect();
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();

    let mut rx = x.clone();
    hadamard_rotate(&mut rx, &signs);
    let mut y = vec![0f32; t * n];
    ternary_matmul_t(&rx, t, &w, n, k, &mut y);

    // W = W'·R: row j of W is Rᵀ applied to row j of W' (R is applied on the right).
    let mut unfolded = wf.clone();
    hadamard_unrotate_reference(&mut unfolded, &signs);
    let wt = Tensor::from_f32("w", vec![n, k], &unfolded);
    let mut want = vec![0f32; t * n];
    matmul_t_reference(&x, t, &wt, &mut want);
    for (a, b) in y.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn weights_that_read_one_activation_answer_as_each_alone() {
    use onepass_kernels::matmul_t_many;
    use onepass_tensor::DType;
    let mut rng = Rng(0x5eed_0020);
    // Five blocks per row (the last pair short); row counts off the kernel's tasks and tiles.
    let k = 640;
    let ns = [67usize, 130, 9];
    let raw: Vec<Vec<u8>> = ns.iter().map(|&n| random_pq2_0(&mut rng, n, k)).collect();
    let pq: Vec<Tensor> = raw
        .iter()
        .zip(ns)
        .map(|(w, n)| Tensor::from_raw("w", DType::PQ2_0, vec![n, k], w).expect("sizes"))
        .collect();
    // PTQ1_0 blocks of random trit bytes (every byte value decodes) and scales.
    let ptq_raw: Vec<Vec<u8>> = ns
        .iter()
        .map(|&n| {
            let mut blocks = vec![0u8; n * k / 128 * 28];
            for b in blocks.chunks_exact_mut(28) {
                for v in &mut b[..26] {
                    *v = rng.next() as u8;
                }
                b[26..].copy_from_slice(&f16::from_f32(0.01 + 0.02 * rng.unit()).to_le_bytes());
            }
            blocks
        })
        .collect();
    let ptq: Vec<Tensor> = ptq_raw
        .iter()
        .zip(ns)
        .map(|(w, n)| Tensor::from_raw("w", DType::PTQ1_0, vec![n, k], w).expect("sizes"))
        .collect();
    let float = Tensor::from_f32("f", vec![5, k], &vec![0.25; 5 * k]);
    for t in [1usize, 3] {
        let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
        let groups: [Vec<&Tensor>; 3] = [
            pq.iter().collect(),
            ptq.iter().collect(),
            vec![&pq[0], &float, &ptq[1]],
        ];
        for ws in groups {
            let alone: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| {
                    let mut y = vec![f32::NAN; t * w.shape()[0]];
                    onepass_kernels::matmul_t(&x, t, w, &mut y);
                    y
                })
                .collect();
            let mut out: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| vec![f32::NAN; t * w.shape()[0]])
                .collect();
            let mut ys: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            matmul_t_many(&x, t, &ws, &mut ys);
            for (i, (a, b)) in alone.iter().zip(&out).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(a),
                    bits(b),
                    "weight {i} ({}) of {} at T={t}",
                    ws[i].dtype().name(),
                    ws.len()
                );
            }
        }
    }
}

#[test]
fn regrouped_pq2_0_matches_the_slow_twin_on_odd_shapes_and_reads_alike_alone_stacked_and_by_row() {
    use onepass_kernels::{dot_rows, matmul_t, matmul_t_many};
    use onepass_tensor::DType;
    if !TernaryPath::Avx512Vnni.available() {
        eprintln!("skipped: no AVX-512 VNNI and GFNI, so no model regroups its PQ2_0 matrices");
        return;
    }
    let mut rng = Rng(0x5eed_0021);
    // One group per row, two, three, five; row counts off the tiles (8) and the tasks (64).
    for (n, k) in [(1, 1024), (13, 2048), (67, 3072), (130, 5120)] {
        let w = random_pq2_0(&mut rng, n, k);
        let (wf, wt) = decoded(GgmlType::PQ2_0, &w, n, k);
        let g = Tensor::from_raw("w", DType::PQ2_0, vec![n, k], &w)
            .expect("sizes")
            .grouped()
            .expect("whole groups");
        assert_eq!(g.dtype(), DType::PQ2_0G);
        for t in [1usize, 2, 3, 9, 63] {
            let (x, slow, scale) = twin_checked_against_dense(
                &mut rng,
                t,
                &wf,
                &wt,
                |x, out| ternary_matmul_t_reference(x, t, &w, n, k, out),
                &format!("slow twin vs dense, N={n} K={k} T={t}"),
            );
            let twin = |x: &[f32], out: &mut [f32]| ternary_matmul_t_reference(x, t, &w, n, k, out);
            let mut y = vec![f32::NAN; t * n];
            matmul_t(&x, t, &g, &mut y);
            let what = format!("regrouped N={n} K={k} T={t}");
            assert_path_close(
                TernaryPath::Avx512Vnni,
                &what,
                &x,
                t,
                &wf,
                &y,
                &slow,
                &scale,
                twin,
            );
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for i in [0, t / 2, t - 1] {
                let xi = &x[i * k..(i + 1) * k];
                let mut one = vec![f32::NAN; n];
                matmul_t(xi, 1, &g, &mut one);
                assert_eq!(
                    bits(&one),
                    bits(&y[i * n..(i + 1) * n]),
                    "{what}: token {i} alone"
                );
                let rows = [n as u32 - 1, 0, (n / 2) as u32];
                let mut picked = vec![f32::NAN; rows.len()];
                dot_rows(xi, &g, &rows, &mut picked);
                let want: Vec<f32> = rows.iter().map(|&r| one[r as usize]).collect();
                assert_eq!(bits(&picked), bits(&want), "{what}: token {i}, rows picked");
            }
        }
    }
    // Regrouped weights that read one activation: each the bits it gives alone.
    let k = 2048;
    let gs: Vec<Tensor> = [9usize, 70, 1]
        .iter()
        .map(|&n| {
            let w = random_pq2_0(&mut rng, n, k);
            let t = Tensor::from_raw("w", DType::PQ2_0, vec![n, k], &w).expect("sizes");
            t.grouped().expect("whole groups")
        })
        .collect();
    let t = 3;
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    let ws: Vec<&Tensor> = gs.iter().collect();
    let mut out: Vec<Vec<f32>> = ws
        .iter()
        .map(|w| vec![f32::NAN; t * w.shape()[0]])
        .collect();
    let mut ys: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
    matmul_t_many(&x, t, &ws, &mut ys);
    for (w, got) in ws.iter().zip(&out) {
        let mut alone = vec![f32::NAN; t * w.shape()[0]];
        matmul_t(&x, t, w, &mut alone);
        assert!(alone
            .iter()
            .zip(got)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

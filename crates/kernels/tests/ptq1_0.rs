//! The PTQ1_0 matvec/GEMM read as stored: every path against its f64 slow twin, against an
//! independent route (the formats crate's block decoder, then an f64 dense matmul), and against the
//! PQ2_0 kernel on the same values (the formats crate's transcoder), on odd shapes; and through the
//! weight-type dispatch of `matmul_t` / `dot_rows`.

use half::f16;
use onepass_formats::quant::{ptq1_0_to_pq2_0, GgmlType};
use onepass_kernels::{
    dot_rows, matmul_t, ptq1_0_matmul_t, ptq1_0_matmul_t_reference, ptq1_0_matmul_t_with,
    ternary_matmul_t_with, TernaryPath,
};
use onepass_tensor::{DType, Tensor};

#[path = "common/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

#[path = "common/ternary_checks.rs"]
mod ternary_checks;
use ternary_checks::{
    abs_products, act_rounded, assert_close, assert_path_close, assert_tokens_alone_as_stacked,
    decoded, paths, twin_checked_against_dense, SHAPES,
};

/// Random PTQ1_0 rows: every trit byte uniform over 0..=255 (all of them decode, so every byte
/// value is exercised), scales in the range real packs use, last in the block.
fn random_ptq1_0(rng: &mut Rng, n: usize, k: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(n * k / 128 * 28);
    for _ in 0..n * k / 128 {
        for _ in 0..26 {
            w.push(rng.next() as u8);
        }
        let d = 0.004 + 0.03 * rng.unit();
        w.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    }
    w
}

#[test]
fn ptq1_0_paths_match_the_twin_the_decoder_and_the_pq2_0_kernel_on_odd_shapes() {
    let mut rng = Rng(0x5eed_7431);
    let paths = paths();
    eprintln!("PTQ1_0 paths on this processor: {paths:?}");
    for (n, k) in SHAPES {
        let w = random_ptq1_0(&mut rng, n, k);
        let (wf, wt) = decoded(GgmlType::PTQ1_0, &w, n, k);
        let mut words = vec![0u8; w.len() / 28 * 34];
        ptq1_0_to_pq2_0(&w, &mut words).expect("sizes");
        let packed = Tensor::from_raw("w", DType::PTQ1_0, vec![n, k], &w).expect("sizes");
        assert_eq!(packed.to_f32_vec(), wf, "Tensor::read_f32 vs the decoder");
        for &t in &[1usize, 2, 3, 5, 7, 63] {
            // Both accumulate in f64 over the same exact values: equal up to the final rounding.
            let (x, slow, scale) = twin_checked_against_dense(
                &mut rng,
                t,
                &wf,
                &wt,
                |x, out| ptq1_0_matmul_t_reference(x, t, &w, n, k, out),
                &format!("twin vs dense N={n} K={k} T={t}"),
            );
            let twin = |x: &[f32], out: &mut [f32]| ptq1_0_matmul_t_reference(x, t, &w, n, k, out);
            for &path in &paths {
                let mut y = vec![f32::NAN; t * n];
                ptq1_0_matmul_t_with(path, &x, t, &w, n, k, &mut y);
                let what = format!("{path:?} N={n} K={k} T={t}");
                assert_path_close(path, &what, &x, t, &wf, &y, &slow, &scale, twin);
                let mut via = vec![f32::NAN; t * n];
                ternary_matmul_t_with(path, &x, t, &words, n, k, &mut via);
                if path.rounds_activations() {
                    // The same integer sums per block, spread over the lanes differently: equal up to the f32
                    // rounding of the lanes.
                    let rounded = abs_products(&act_rounded(&x).0, t, &wf, n, k);
                    assert_close(&format!("{what}: PTQ1_0 vs PQ2_0"), &y, &via, &rounded);
                } else {
                    // Same values, same multiply-add order as the PQ2_0 kernel: the same bits.
                    let same = y.iter().zip(&via).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: PTQ1_0 vs PQ2_0 bits");
                }
            }
            let mut y = vec![f32::NAN; t * n];
            matmul_t(&x, t, &packed, &mut y);
            let what = format!("matmul_t N={n} K={k} T={t}");
            assert_path_close(
                TernaryPath::detect(),
                &what,
                &x,
                t,
                &wf,
                &y,
                &slow,
                &scale,
                twin,
            );
        }
        let x: Vec<f32> = (0..k).map(|_| rng.normal_ish()).collect();
        let rows: Vec<u32> = (0..n as u32).rev().step_by(2).collect();
        let mut got = vec![0f32; rows.len()];
        dot_rows(&x, &packed, &rows, &mut got);
        let mut all = vec![0f32; n];
        ptq1_0_matmul_t(&x, 1, &w, n, k, &mut all);
        for (g, &r) in got.iter().zip(&rows) {
            assert_eq!(g.to_bits(), all[r as usize].to_bits(), "dot_rows row {r}");
        }
    }
}

#[test]
fn ptq1_0_layout_rule_holds_value_by_value() {
    // One block whose trits are known: value j gets trit j % 3, packed by the encoder rule
    // ceil(256 · (81·t0 + 27·t1 + 9·t2 + 3·t3 + t4) / 243) over the staged order; x = e_j picks value j.
    let trit = |j: usize| (j % 3) as u32;
    let enc = |ts: [u32; 5]| {
        let v = ts.iter().fold(0u32, |a, &t| a * 3 + t);
        (256 * v).div_ceil(243) as u8
    };
    let mut block = vec![0u8; 28];
    for m in 0..16 {
        block[m] = enc([0, 1, 2, 3, 4].map(|n| trit(16 * n + m)));
    }
    for m in 0..8 {
        block[16 + m] = enc([0, 1, 2, 3, 4].map(|n| trit(80 + 8 * n + m)));
    }
    for h in 0..2 {
        let t4 = [0, 1, 2, 3].map(|n| trit(120 + 2 * n + h));
        block[24 + h] = enc([t4[0], t4[1], t4[2], t4[3], 0]);
    }
    block[26..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    // x = v·e_j with v = 1 − 2⁻¹⁵, which the integer kernels' rounding keeps exactly (32767 steps of 2⁻¹⁵).
    let v = 1.0 - 2f32.powi(-15);
    for path in paths() {
        for j in 0..128 {
            let mut x = vec![0f32; 128];
            x[j] = v;
            let mut y = [f32::NAN];
            ptq1_0_matmul_t_with(path, &x, 1, &block, 1, 128, &mut y);
            assert_eq!(y[0], (trit(j) as f32 - 1.0) * 0.5 * v, "{path:?} value {j}");
        }
    }
}

#[test]
fn a_token_reads_the_same_bits_alone_and_stacked_with_others() {
    let mut rng = Rng(0x5eed_7432);
    let (n, k) = (67, 640);
    let w = random_ptq1_0(&mut rng, n, k);
    let t = 7;
    let x: Vec<f32> = (0..t * k).map(|_| rng.normal_ish()).collect();
    assert_tokens_alone_as_stacked(ptq1_0_matmul_t_with, &x, t, &w, n, k);
}

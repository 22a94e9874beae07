//! Shared helpers of the GPU tests: the device, random data, tolerances, timing; the gated delta
//! inputs ([`delta`]), the attention setup ([`attn`]), the conv kernel's launch ([`conv`]) and the whole-forward
//! check ([`forward_check`]) several test files run.
#![allow(dead_code)]

pub mod attn;
pub mod conv;
pub mod delta;
pub mod forward_check;

use std::sync::Arc;

use onepass_cuda::Gpu;

/// The GPU. Every test that calls this is `#[ignore]`d, so that a machine without a GPU reports it as ignored
/// rather than passed; run them with `--include-ignored` where a CUDA GPU is (crates/cuda/gpu-run.sh does).
pub fn gpu() -> Arc<Gpu> {
    Gpu::new(0).expect("a GPU test was run (--include-ignored) but no usable CUDA GPU was found")
}

/// µs per call of `what`: one warm-up call, then 20 calls between two synchronizations, host timer.
pub fn per_call_us(g: &Gpu, what: &dyn Fn()) -> f64 {
    what();
    g.sync().unwrap();
    let reps = 20;
    let t0 = std::time::Instant::now();
    for _ in 0..reps {
        what();
    }
    g.sync().unwrap();
    t0.elapsed().as_secs_f64() * 1e6 / reps as f64
}

/// f32 tolerance of an op against its CPU twin (f32 on both sides, different summation orders; 3xTF32 products
/// on the tensor-core paths).
pub const F32_TOL: f32 = 2e-5;
/// Outputs rounded to bf16 (8 bits of mantissa).
pub const BF16_TOL: f32 = 8e-3;
/// Values rounded once to f16 (11 significant bits: 2^-11 relative at most), with room for the f32 sums before it.
pub const F16_TOL: f32 = 1e-3;
/// The 1xTF32 gated delta kernels (state pass, pre-pass) against the CPU and their SIMT twins (operands rounded to
/// 11 significant bits, f32 accumulation): about 10x the worst error measured on an H200, 3.8e-4 and 4.2e-4 of max
/// |reference| (docs/benchmarks/history/cuda-notes-2026-11-30.md).
pub const TF32_DELTA_TOL: f32 = 4e-3;
/// The 1xTF32 attention against the CPU: about 10x the worst measured, 5.4e-4 (f32 out).
pub const TF32_ATTN_TOL: f32 = 5e-3;
/// The bf16x3 attention against the CPU: operands carried to about 2^-17 (hi + lo bf16), three products, f32
/// accumulation; a priori about 2^-16 of the output's scale, this bound 5x that.
pub const BF16X3_ATTN_TOL: f32 = 1e-4;
/// The one-product bf16 attention against the CPU: operands rounded to 8 significant bits, four times coarser than
/// 1xTF32's 11, so four times TF32_ATTN_TOL.
pub const BF16_ATTN_TOL: f32 = 2e-2;

/// Deterministic uniform values in [-1, 1).
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    onepass_kernels::testdata::xorshift_unit(state, n)
}

pub fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|x| half::bf16::from_f32(*x).to_f32())
        .collect()
}

pub fn to_bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|x| half::bf16::from_f32(*x).to_bits())
        .collect()
}

pub fn from_bf16_bits(v: &[u16]) -> Vec<f32> {
    v.iter()
        .map(|x| half::bf16::from_bits(*x).to_f32())
        .collect()
}

/// Values rounded to nearest f16, as bits (an f16 KV cache's contents).
pub fn to_f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .collect()
}

pub fn from_f16_bits(v: &[u16]) -> Vec<f32> {
    v.iter()
        .map(|x| half::f16::from_bits(*x).to_f32())
        .collect()
}

/// `rows` activation rows of `k` values downloaded as f32 words (`words`, at least `rows · k`) read back in the
/// layout `mode` stores them ("f32"; "bf16"; "split": row r's hi plane [k] then its lo plane [k], summed).
pub fn read_act(words: &[f32], rows: usize, k: usize, mode: &str) -> Vec<f32> {
    if mode == "f32" {
        return words[..rows * k].to_vec();
    }
    let bits: Vec<u16> = words
        .iter()
        .flat_map(|f| {
            let u = f.to_bits();
            [u as u16, (u >> 16) as u16]
        })
        .collect();
    let vals = from_bf16_bits(&bits);
    if mode == "bf16" {
        return vals[..rows * k].to_vec();
    }
    (0..rows * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            vals[2 * r * k + c] + vals[2 * r * k + k + c]
        })
        .collect()
}

/// max |a - b| / max(1, max |b|); fails on NaN or a length mismatch.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length");
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert!(x.is_finite(), "non-finite GPU value {x}");
        worst = worst.max((x - y).abs());
    }
    worst / scale
}

#[track_caller]
pub fn check(name: &str, a: &[f32], b: &[f32], tol: f32) {
    let e = rel_err(a, b);
    eprintln!("{name}: max|diff|/max(1,max|ref|) = {e:.3e} (tolerance {tol:.0e})");
    assert!(e <= tol, "{name}: {e:.3e} > {tol:.0e}");
}

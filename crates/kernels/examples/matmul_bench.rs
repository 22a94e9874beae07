//! µs per `matmul_t` call on the Qwen3.5-0.8B MLP shape (N 3,584, K 1,024), bf16, f16 and f32 weights, 1 to 512 tokens:
//! how the batch-invariant float kernel compares with the kernels it replaced (run this example from two checkouts,
//! alternating; docs/benchmarks/cpu-matmul.md). `cargo run --release -p onepass-kernels --example matmul_bench [-- N K]`
//! (another shape: N rows of K inputs).
use onepass_tensor::Tensor;

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, k) = (arg(1, 3584), arg(2, 1024));
    let wv: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.37).sin()).collect();
    for (name, w) in [
        ("bf16", Tensor::from_f32_as_bf16("w", vec![n, k], &wv)),
        ("f16", f16_weight(n, k, &wv)),
        ("f32", Tensor::from_f32("w", vec![n, k], &wv)),
    ] {
        for t in [1usize, 2, 8, 64, 512] {
            let x: Vec<f32> = (0..t * k).map(|i| ((i as f32) * 0.11).cos()).collect();
            let mut y = vec![0.0f32; t * n];
            onepass_kernels::matmul_t(&x, t, &w, &mut y);
            let reps = (2000 / t).max(5);
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                onepass_kernels::matmul_t(&x, t, &w, &mut y);
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
            println!(
                "{name} t={t:4}: {us:9.1} us  {:6.1} GFLOP/s",
                2.0 * (t * n * k) as f64 / us / 1e3
            );
        }
    }
}

/// `wv` rounded to an f16 weight [n, k].
fn f16_weight(n: usize, k: usize, wv: &[f32]) -> Tensor {
    let raw: Vec<u8> = wv
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    Tensor::from_raw("w", onepass_tensor::DType::F16, vec![n, k], &raw).expect("f16 weight")
}

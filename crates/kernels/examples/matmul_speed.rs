//! Throughput of `matmul_t` on Qwen3.5-0.8B projection shapes:
//! `cargo run --release -p onepass-kernels --example matmul_speed [T]`.

use std::time::Instant;

use onepass_kernels::matmul_t;
use onepass_tensor::Tensor;

fn main() {
    let t: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    for &(n, k) in &[(6144, 1024), (3584, 1024), (1024, 3584), (1024, 2048)] {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
            .collect();
        let x: Vec<f32> = (0..t * k)
            .map(|i| ((i % 89) as f32 - 44.0) * 0.01)
            .collect();
        for (label, wt) in [
            ("f32", Tensor::from_f32("w", vec![n, k], &w)),
            ("bf16", Tensor::from_f32_as_bf16("w", vec![n, k], &w)),
        ] {
            let mut y = vec![0.0; t * n];
            matmul_t(&x, t, &wt, &mut y);
            let reps = 5;
            let t0 = Instant::now();
            for _ in 0..reps {
                matmul_t(&x, t, &wt, &mut y);
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            println!(
                "T={t} N={n} K={k} {label}: {:.1} GFLOP/s",
                2.0 * (t * n * k) as f64 / s / 1e9
            );
        }
    }
}

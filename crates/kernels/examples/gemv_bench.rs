//! The decode matvec (T tokens, default 1) on F16, BF16 and Q8_0 weights (as stored and, where the processor has
//! AVX-512 VNNI, regrouped as a model prepared for the CPU holds them: Q8_0G) next to this machine's memory read
//! bandwidth, measured in the same run: for each Qwen3.5-0.8B and 2B shape, copies of the matrix adding up to at
//! least MB megabytes (default 512) are rotated so every call reads memory, not cache.
//!
//!     cargo run --release -p onepass-kernels --example gemv_bench [-- MB [T]]
//!
//! Prints GB/s of weight bytes and the share of the read bandwidth; asserts nothing.

use std::time::Instant;

use half::{bf16, f16};
use onepass_kernels::matmul_t;
use onepass_tensor::{DType, Tensor};
use rayon::prelude::*;

fn main() {
    let total_mb: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let t: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let read_gbs = read_bandwidth(total_mb << 20);
    println!(
        "memory read {read_gbs:6.1} GB/s (parallel xor-reduce over {total_mb} MB), {} threads, {t} token(s)",
        rayon::current_num_threads()
    );
    // The 0.8B and 2B shapes' projections: FFN gate/up and down, the GDN qkv, the head.
    for (n, k) in [
        (3584, 1024),
        (1024, 3584),
        (6144, 1024),
        (248_320, 1024),
        (6144, 2048),
        (2048, 6144),
        (248_320, 2048),
    ] {
        for dtype in [DType::F16, DType::BF16, DType::Q8_0, DType::Q8_0G] {
            // Q8_0G: the Q8_0 matrix regrouped, as a model prepared for the CPU holds it (AVX-512 VNNI only).
            if dtype == DType::Q8_0G && !onepass_kernels::runs_grouped(DType::Q8_0) {
                continue;
            }
            let one = weights(dtype, n, k, 1);
            let bytes = one.len();
            let copies = (total_mb << 20).div_ceil(bytes).max(1);
            let mats: Vec<Tensor> = (0..copies)
                .map(|c| {
                    let raw = if c == 0 {
                        one.clone()
                    } else {
                        weights(dtype, n, k, c as u32 + 1)
                    };
                    let file = if dtype == DType::Q8_0G {
                        DType::Q8_0
                    } else {
                        dtype
                    };
                    let w = Tensor::from_raw("w", file, vec![n, k], &raw).expect("weights");
                    if dtype == DType::Q8_0G {
                        w.grouped().expect("whole groups")
                    } else {
                        w
                    }
                })
                .collect();
            let x: Vec<f32> = (0..t * k).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
            let mut y = vec![0f32; t * n];
            let reps = (2 * copies).max(4);
            let mut best = f64::INFINITY;
            for rep in 0..=reps {
                let t0 = Instant::now();
                matmul_t(&x, t, &mats[rep % copies], &mut y);
                if rep > 0 {
                    best = best.min(t0.elapsed().as_secs_f64());
                }
            }
            let gbs = bytes as f64 / best / 1e9;
            println!(
                "{dtype:?} N={n:<6} K={k:<5} {:8.3} ms {gbs:6.1} GB/s ({:5.1}% of read)",
                best * 1e3,
                100.0 * gbs / read_gbs
            );
        }
    }
}

/// Raw bytes of a random `[n, k]` matrix in `dtype` (F16, BF16; Q8_0 blocks otherwise).
fn weights(dtype: DType, n: usize, k: usize, seed: u32) -> Vec<u8> {
    let mut s = 0x9e37_79b9u32.wrapping_mul(seed) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    match dtype {
        DType::F16 => (0..n * k)
            .flat_map(|_| f16::from_f32((next() % 2001) as f32 * 1e-3 - 1.0).to_le_bytes())
            .collect(),
        DType::BF16 => (0..n * k)
            .flat_map(|_| bf16::from_f32((next() % 2001) as f32 * 1e-3 - 1.0).to_le_bytes())
            .collect(),
        _ => (0..n * k / 32)
            .flat_map(|_| {
                let mut b = f16::from_f32(0.01).to_le_bytes().to_vec();
                b.extend((0..32).map(|_| next() as u8));
                b
            })
            .collect(),
    }
}

/// Best of 5 parallel xor-reduces over `bytes` bytes, in GB/s.
fn read_bandwidth(bytes: usize) -> f64 {
    let src: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut best = f64::INFINITY;
    for rep in 0..6 {
        let t0 = Instant::now();
        let s: u64 = src
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a ^ b))
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(s);
        if rep > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    bytes as f64 / best / 1e9
}

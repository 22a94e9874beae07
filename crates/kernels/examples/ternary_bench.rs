//! The ternary matvec/GEMM next to this machine's own memory bandwidth, measured in the same run.
//!
//!     cargo run --release -p onepass-kernels --example ternary_bench [-- N K [MB]]
//!
//! Default shape: the 27B model's largest matrix (FFN gate/up, N = 17408 rows × K = 5120), packed
//! PQ2_0 (23.7 MB). Copies of the matrix adding up to MB megabytes (default 768, more than twice
//! the largest last-level caches) are rotated so each call reads from memory, not from cache. The bandwidth yardstick is a parallel read (sum) over a buffer of the
//! same total size, and a parallel copy for reference; the matvec figure is the packed bytes it
//! reads per second. Prints figures, asserts nothing.

use std::time::Instant;

use half::f16;
use onepass_kernels::{ternary_matmul_t_with, TernaryPath};
use rayon::prelude::*;

const DEFAULT_TOTAL_MB: usize = 768;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n, k, total_mb) = match args[..] {
        [n, k] => (n, k, DEFAULT_TOTAL_MB),
        [n, k, mb] => (n, k, mb),
        _ => (17408, 5120, DEFAULT_TOTAL_MB),
    };
    assert!(k % 128 == 0, "K must be a multiple of 128");
    let bytes = n * k / 128 * 34;
    let copies = (total_mb << 20).div_ceil(bytes).max(2);
    println!(
        "shape N={n} K={k}: {:.1} MB packed PQ2_0, {copies} copies rotated; {} threads",
        bytes as f64 / 1e6,
        rayon::current_num_threads()
    );

    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mats: Vec<Vec<u8>> = (0..copies)
        .map(|_| {
            let mut w = vec![0u8; bytes];
            for block in w.chunks_exact_mut(34) {
                block[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                for b in &mut block[2..] {
                    // Ternary codes only (0, 1, 2) in every 2-bit slot.
                    let r = next();
                    *b = (0..4).fold(0u8, |acc, j| acc | (((r >> (8 * j)) % 3) as u8) << (2 * j));
                }
            }
            w
        })
        .collect();

    // Memory yardsticks over the same number of bytes.
    let total = bytes * copies;
    let src: Vec<u64> = (0..total / 8).map(|i| i as u64).collect();
    let mut dst = vec![0u64; total / 8];
    let read = best_of(5, || {
        let s: u64 = src
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a ^ b))
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(s);
    });
    let copy = best_of(5, || {
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
    });
    let read_gbs = total as f64 / read / 1e9;
    println!(
        "memory read  {read_gbs:7.1} GB/s   (parallel xor-reduce over {:.0} MB)",
        total as f64 / 1e6
    );
    println!(
        "memory copy  {:7.1} GB/s   (bytes read + written)",
        2.0 * total as f64 / copy / 1e9
    );

    for path in [
        TernaryPath::Avx512,
        TernaryPath::Avx2,
        TernaryPath::Portable,
    ] {
        if !path.available() {
            continue;
        }
        for t in [1usize, 4, 16, 64] {
            let x: Vec<f32> = (0..t * k).map(|i| ((i % 17) as f32 - 8.0) * 0.1).collect();
            let mut y = vec![0f32; t * n];
            let mut which = 0;
            let reps = if t == 1 { 2 * copies } else { copies.min(4) };
            let secs = best_of(reps, || {
                ternary_matmul_t_with(path, &x, t, &mats[which % copies], n, k, &mut y);
                which += 1;
            });
            let gbs = bytes as f64 / secs / 1e9;
            let gflops = 2.0 * (n * k * t) as f64 / secs / 1e9;
            println!(
                "{:<8} T={t:<3} {:8.3} ms  {gbs:7.1} GB/s of weights ({:5.1}% of read)  {gflops:7.1} GFLOP/s  {:8.1} tokens/s",
                format!("{path:?}"),
                secs * 1e3,
                100.0 * gbs / read_gbs,
                t as f64 / secs
            );
        }
    }
}

/// Fastest of `reps` runs, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    best
}

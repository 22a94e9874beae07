//! The ternary matvec/GEMM next to this machine's own memory bandwidth, measured in the same run, for
//! both packed types: PQ2_0 and PTQ1_0 blocks holding the same values (the PQ2_0 copies are the
//! PTQ1_0 ones transcoded), each call alternating between the two on the same shape.
//!
//!     cargo run --release -p onepass-kernels --example ternary_bench [-- N K [MB]]
//!
//! Default shape: the 27B model's largest matrix (FFN gate/up, N = 17408 rows × K = 5120), packed
//! PQ2_0 (23.7 MB; 19.5 MB as PTQ1_0). Copies of the matrix adding up to MB megabytes (default 768, more than twice
//! the largest last-level caches) are rotated so each call reads from memory, not from cache. Where the integer
//! kernels run, the PQ2_0 copies regrouped as a model prepared for the CPU holds them (PQ2_0G) are timed too. The bandwidth yardstick is a parallel read (sum) over a buffer of the
//! same total size, and a parallel copy for reference; the matvec figure is the packed bytes it
//! reads per second. Prints figures, asserts nothing.

use std::time::Instant;

use half::f16;
use onepass_formats::quant::ptq1_0_to_pq2_0;
use onepass_kernels::{matmul_t, ptq1_0_matmul_t_with, ternary_matmul_t_with, TernaryPath};
use onepass_tensor::{DType, Tensor};
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
    // PTQ1_0 blocks of ternary trits (every byte value decodes), then the same values as PQ2_0.
    let ptq_bytes = n * k / 128 * 28;
    let ptq: Vec<Vec<u8>> = (0..copies)
        .map(|_| {
            let mut w = vec![0u8; ptq_bytes];
            for block in w.chunks_exact_mut(28) {
                for b in &mut block[..26] {
                    *b = next() as u8;
                }
                block[26..].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            }
            w
        })
        .collect();
    let mats: Vec<Vec<u8>> = ptq
        .iter()
        .map(|p| {
            let mut w = vec![0u8; bytes];
            ptq1_0_to_pq2_0(p, &mut w).expect("whole blocks");
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

    // The PQ2_0 copies regrouped, as a model prepared for the CPU holds them (where K is whole groups of 1024).
    let grouped: Vec<Tensor> = if TernaryPath::Avx512Vnni.available() {
        mats.iter()
            .filter_map(|m| {
                Tensor::from_raw("w", DType::PQ2_0, vec![n, k], m)
                    .expect("blocks")
                    .grouped()
            })
            .collect()
    } else {
        Vec::new()
    };

    for path in [
        TernaryPath::Avx512Vnni,
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
            let reps = if t == 1 { 2 * copies } else { copies.min(4) };
            // Interleaved: each rep times one PQ2_0 call and one PTQ1_0 call on the same values (and, on the
            // integer path, the regrouped PQ2_0 copy).
            let regrouped = path == TernaryPath::Avx512Vnni && !grouped.is_empty();
            let (mut best_pq, mut best_ptq, mut best_g) =
                (f64::INFINITY, f64::INFINITY, f64::INFINITY);
            for rep in 0..=reps {
                let m = rep % copies;
                let t0 = Instant::now();
                ternary_matmul_t_with(path, &x, t, &mats[m], n, k, &mut y);
                let pq = t0.elapsed().as_secs_f64();
                let t0 = Instant::now();
                ptq1_0_matmul_t_with(path, &x, t, &ptq[m], n, k, &mut y);
                let pt = t0.elapsed().as_secs_f64();
                let t0 = Instant::now();
                if regrouped {
                    matmul_t(&x, t, &grouped[m], &mut y);
                }
                let g = t0.elapsed().as_secs_f64();
                if rep > 0 {
                    best_pq = best_pq.min(pq);
                    best_ptq = best_ptq.min(pt);
                    best_g = best_g.min(g);
                }
            }
            let mut rows = vec![("PQ2_0", best_pq, bytes), ("PTQ1_0", best_ptq, ptq_bytes)];
            if regrouped {
                rows.push(("PQ2_0G", best_g, bytes));
            }
            for (name, secs, size) in rows {
                let gbs = size as f64 / secs / 1e9;
                let gflops = 2.0 * (n * k * t) as f64 / secs / 1e9;
                println!(
                    "{:<8} {name:<6} T={t:<3} {:8.3} ms  {gbs:7.1} GB/s of weights ({:5.1}% of read)  {gflops:7.1} GFLOP/s  {:8.1} tokens/s",
                    format!("{path:?}"),
                    secs * 1e3,
                    100.0 * gbs / read_gbs,
                    t as f64 / secs
                );
            }
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

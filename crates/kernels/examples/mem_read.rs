//! This machine's memory read bandwidth: a parallel xor-reduce over a buffer of MB megabytes (default
//! 1024, far larger than any cache), best of 5 after a warm-up, each task reading its 1 MiB chunk with
//! eight independent 64-byte accumulators (AVX-512 where present) so no core is bound by its own
//! loop. Prints one JSON object.
//!
//!     cargo run --release -p onepass-kernels --example mem_read [-- MB]

use std::time::Instant;

use rayon::prelude::*;

fn main() {
    let mb: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let bytes = mb << 20;
    let src: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut best = f64::INFINITY;
    for rep in 0..6 {
        let t0 = Instant::now();
        let s: u64 = src
            .par_chunks(1 << 17)
            .map(xor_chunk)
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(s);
        if rep > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    println!(
        "{{\"read_gbs\": {:.3}, \"bytes\": {bytes}, \"threads\": {}}}",
        bytes as f64 / best / 1e9,
        rayon::current_num_threads()
    );
}

/// The xor of a chunk's words, with the AVX-512 loop where the processor has it.
fn xor_chunk(c: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the processor supports AVX-512F (checked above).
            return unsafe { xor_avx512(c) };
        }
    }
    xor_lanes(c)
}

/// Eight independent lanes of eight words each, then the remainder.
#[inline(always)]
fn xor_lanes(c: &[u64]) -> u64 {
    let mut acc = [0u64; 64];
    let mut it = c.chunks_exact(64);
    for block in &mut it {
        for (a, b) in acc.iter_mut().zip(block) {
            *a ^= b;
        }
    }
    acc.iter().chain(it.remainder()).fold(0, |a, b| a ^ b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn xor_avx512(c: &[u64]) -> u64 {
    // The same loop, compiled with AVX-512 so it runs 64-byte loads into eight registers.
    xor_lanes(c)
}

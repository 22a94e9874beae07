//! The memory read yardstick the examples share: a parallel xor-reduce, each task reading its 1 MiB chunk with
//! eight independent 64-byte accumulators (AVX-512 where present) so no core is bound by its own loop.

use std::time::Instant;

use rayon::prelude::*;

/// The best of `reps` parallel xor-reduces over `src`, in GB/s.
pub fn read_gbs(src: &[u64], reps: usize) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        let s: u64 = src
            .par_chunks(1 << 17)
            .map(xor_chunk)
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(s);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (src.len() * 8) as f64 / best / 1e9
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

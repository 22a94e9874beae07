//! Deterministic inputs for op tests: this crate's fast-against-reference tests and the CUDA crate's GPU-against-CPU
//! tests draw from the same generator, so a failing case reads the same on every machine.

/// `n` values in [-1, 1) from the xorshift64 stream that starts at `state` (nonzero): each step's top 24 bits,
/// scaled.
pub fn xorshift_unit(mut state: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

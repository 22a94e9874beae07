//! Q8_0 weights (GGUF type 8): rows of 34-byte blocks, an f16 scale `d` and 32 signed bytes `q`, value
//! `q·d`. Matrix-vector products read the blocks as stored: each block's 32 codes are widened in registers,
//! multiplied by the activation, summed, and the sum scaled by `d` (one multiply per 32 weights), so decode
//! streams 8.5 bits per weight. Prefill decodes a task's block of rows into an f32 scratch (exact: an f16
//! times a small integer is an f32) and runs the packed GEMM on it (`matmul_t`); nothing is kept decoded.
//! The slow twin is `matmul_t_reference`, which decodes every value through the tensor.

use half::f16;

/// Values per block.
pub const Q8_0_BLOCK: usize = 32;
/// Bytes per block.
pub const Q8_0_BYTES: usize = 34;

/// `Σ row · x` for one Q8_0 row (`x.len() / 32` blocks).
pub fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(row.len(), x.len() / Q8_0_BLOCK * Q8_0_BYTES);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the processor supports AVX2 and FMA (checked above); the lengths agree.
            return unsafe { dot_q8_0_avx2(row, x) };
        }
    }
    dot_q8_0_portable(row, x)
}

fn scale(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[0], block[1]]).to_f32()
}

fn dot_q8_0_portable(row: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (block, xs) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_BLOCK)) {
        let mut acc = [0.0f32; 8];
        for (q, v) in block[2..].chunks_exact(8).zip(xs.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += f32::from(q[l] as i8) * v[l];
            }
        }
        total += scale(block) * acc.iter().sum::<f32>();
    }
    total
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0_avx2(row: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: every load reads inside one 34-byte block (codes at 2..34) or its 32 activations.
    unsafe {
        let mut total = _mm256_setzero_ps();
        for (block, xs) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_BLOCK)) {
            let q = block.as_ptr().add(2);
            let mut acc = _mm256_setzero_ps();
            for g in 0..4 {
                // 8 codes → 8 i32 → 8 f32.
                let codes = _mm_loadl_epi64(q.add(8 * g) as *const __m128i);
                let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(xs.as_ptr().add(8 * g)), acc);
            }
            total = _mm256_fmadd_ps(_mm256_set1_ps(scale(block)), acc, total);
        }
        let hi = _mm256_extractf128_ps(total, 1);
        let s = _mm_add_ps(_mm256_castps256_ps128(total), hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// Decodes whole rows of Q8_0 blocks into `out` (one f32 per value, exact).
pub fn decode_q8_0(rows: &[u8], out: &mut [f32]) {
    for (block, o) in rows
        .chunks_exact(Q8_0_BYTES)
        .zip(out.chunks_exact_mut(Q8_0_BLOCK))
    {
        let d = scale(block);
        for (o, &q) in o.iter_mut().zip(&block[2..]) {
            *o = f32::from(q as i8) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_portable_dots_agree() {
        let k = 96;
        let mut row = Vec::new();
        for b in 0..k / 32 {
            row.extend_from_slice(&f16::from_f32(0.01 * (b as f32 + 1.0)).to_le_bytes());
            row.extend((0..32).map(|i| ((i * 37 + b * 11) % 256) as u8));
        }
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut w = vec![0.0; k];
        decode_q8_0(&row, &mut w);
        let exact: f64 = w
            .iter()
            .zip(&x)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        for got in [dot_q8_0(&row, &x), dot_q8_0_portable(&row, &x)] {
            assert!((f64::from(got) - exact).abs() < 1e-4, "{got} vs {exact}");
        }
    }
}

//! Q8_0 weights (GGUF type 8): rows of 34-byte blocks, an f16 scale `d` and 32 signed bytes `q`, value
//! `q·d`. Matrix-vector products read the blocks as stored: each block's 32 codes are widened in registers,
//! multiplied by the activation, summed, and the sum scaled by `d` (one multiply per 32 weights), so decode
//! streams 8.5 bits per weight. Prefill runs the integer GEMM of `q8_0_vnni.rs` where the processor has AVX-512
//! VNNI (the bf16 tiles of `q8_0_amx.rs` for 64 tokens or more where it has the AMX tile unit), else decodes a task's block of rows into an f32 scratch (exact: an f16 times a small integer is an f32)
//! and runs the packed GEMM on it (`matmul_t`); nothing is kept decoded.
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
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the processor supports AVX-512F and F16C (checked above); the lengths agree.
            return unsafe { dot_q8_0_avx512::<1>(row, [x]) }[0];
        }
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

/// The AVX-512 dot of one row with `T` activation vectors (one or two tokens): per block, the codes widened once,
/// two 16-lane products per token summed, then scaled by `d` into one of four accumulators taken in turn, so
/// consecutive blocks never wait on each other's FMA (the AVX2 dot's single chain of dependent FMAs bounds decode
/// by latency, not by memory).
///
/// # Safety
/// AVX-512F and F16C; every `xs[i]` holds at least `32 · row.len() / 34` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
#[inline]
unsafe fn dot_q8_0_avx512<const T: usize>(row: &[u8], xs: [&[f32]; T]) -> [f32; T] {
    use std::arch::x86_64::*;
    let nb = row.len() / Q8_0_BYTES;
    let rp = row.as_ptr();
    let xp = xs.map(|x| x.as_ptr());
    // SAFETY: block b reads bytes 34b..34b+34 of the row and values 32b..32b+32 of each x, b < nb.
    unsafe {
        let block = |b: usize| {
            let p = rp.add(b * Q8_0_BYTES);
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                (p as *const u16).read_unaligned(),
            )));
            let w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(2) as *const __m128i
            )));
            let w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(18) as *const __m128i
            )));
            let s = xp.map(|x| {
                let x = x.add(b * Q8_0_BLOCK);
                _mm512_fmadd_ps(
                    w1,
                    _mm512_loadu_ps(x.add(16)),
                    _mm512_mul_ps(w0, _mm512_loadu_ps(x)),
                )
            });
            (_mm512_broadcastss_ps(d), s)
        };
        let mut acc = [[_mm512_setzero_ps(); 4]; T];
        let mut b = 0;
        while b + 4 <= nb {
            for j in 0..4 {
                let (d, s) = block(b + j);
                for (a, s) in acc.iter_mut().zip(s) {
                    a[j] = _mm512_fmadd_ps(d, s, a[j]);
                }
            }
            b += 4;
        }
        while b < nb {
            let (d, s) = block(b);
            for (a, s) in acc.iter_mut().zip(s) {
                a[0] = _mm512_fmadd_ps(d, s, a[0]);
            }
            b += 1;
        }
        acc.map(|a| {
            _mm512_reduce_add_ps(_mm512_add_ps(
                _mm512_add_ps(a[0], a[1]),
                _mm512_add_ps(a[2], a[3]),
            ))
        })
    }
}

/// `y[i, j] = x[i] · w[r0 + j]` for the tokens `i < t` of x: [t, k] and the rows `r0 <= r < r0 + rows` of the
/// Q8_0 weight `w`: [N, k]; y: [t, rows]. The matrix-vector path of one or two tokens: each row is read once, its
/// codes widened once for both tokens (AVX-512), with no dispatch per row.
pub fn rows_q8_0(x: &[f32], t: usize, k: usize, w: &[u8], r0: usize, y: &mut [f32]) {
    let rb = k / Q8_0_BLOCK * Q8_0_BYTES;
    let rows = y.len() / t.max(1);
    assert!(x.len() == t * k && w.len() >= (r0 + rows) * rb && y.len() == t * rows);
    #[cfg(target_arch = "x86_64")]
    {
        if t <= 2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the processor supports AVX-512F and F16C (checked above); the lengths were checked.
            return unsafe { rows_q8_0_avx512(x, t, k, &w[r0 * rb..(r0 + rows) * rb], y) };
        }
    }
    for j in 0..rows {
        let row = &w[(r0 + j) * rb..(r0 + j + 1) * rb];
        for i in 0..t {
            y[i * rows + j] = dot_q8_0(row, &x[i * k..(i + 1) * k]);
        }
    }
}

/// [`rows_q8_0`] for one or two tokens with the AVX-512 dot inlined; `w` holds exactly the rows.
///
/// # Safety
/// AVX-512F and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn rows_q8_0_avx512(x: &[f32], t: usize, k: usize, w: &[u8], y: &mut [f32]) {
    let rows = y.len() / t;
    for (j, row) in w.chunks_exact(k / Q8_0_BLOCK * Q8_0_BYTES).enumerate() {
        // SAFETY: the caller's features; every x row holds k values.
        unsafe {
            if t == 1 {
                y[j] = dot_q8_0_avx512::<1>(row, [x])[0];
            } else {
                let [a, b] = dot_q8_0_avx512::<2>(row, [&x[..k], &x[k..2 * k]]);
                y[j] = a;
                y[rows + j] = b;
            }
        }
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
        // 1, 3, 4, 5 and 9 blocks: the AVX-512 dot's groups of four and its remainder.
        for k in [32, 96, 128, 160, 288] {
            check_dots(k);
        }
    }

    fn check_dots(k: usize) {
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
        let magnitude: f64 = w.iter().zip(&x).map(|(a, b)| f64::from(a * b).abs()).sum();
        let mut got = vec![dot_q8_0(&row, &x), dot_q8_0_portable(&row, &x)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the processor supports AVX2 and FMA (checked above).
                got.push(unsafe { dot_q8_0_avx2(&row, &x) });
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                // SAFETY: the processor supports AVX-512F and F16C (checked above).
                got.push(unsafe { dot_q8_0_avx512::<1>(&row, [&x]) }[0]);
                // Two tokens at once: each its own dot, the other token's values not mixed in.
                let x2: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
                // SAFETY: as above; both vectors hold k values.
                let [a, b] = unsafe { dot_q8_0_avx512::<2>(&row, [&x, &x2]) };
                got.push(a);
                // SAFETY: as above.
                let alone = unsafe { dot_q8_0_avx512::<1>(&row, [&x2]) }[0];
                assert_eq!(
                    b.to_bits(),
                    alone.to_bits(),
                    "k={k}: the second token's dot"
                );
            }
        }
        for got in got {
            assert!(
                (f64::from(got) - exact).abs() < 1e-6 * (1.0 + magnitude),
                "k={k}: {got} vs {exact}"
            );
        }
    }
}

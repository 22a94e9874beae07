//! The blockwise Hadamard rotation of ternary packs: `R = H·S / 32` on each 1024-wide block of an
//! activation, `H` the natural-order (Sylvester) Walsh–Hadamard matrix, `S` a ±1 sign per input
//! position (the `prism.hadamard.*` metadata, see docs/formats.md).
//!
//! A folded linear computes `W'·(R·x)`: [`hadamard_rotate`] flips the signs of `x`, transforms
//! each 1024-block and divides by 32 (= √1024). The embedding table stores rows rotated by `R`;
//! [`hadamard_unrotate`] undoes it after the gather: transform, divide by 32, then the signs (`H`
//! and `S` are each their own inverse up to the scale). The fast transform is the in-place
//! butterfly (10 stages of `a + b, a − b`, exact on inputs whose sums are representable); the
//! slow twin [`hadamard_rotate_reference`] multiplies by `H` entry by entry in f64, with
//! `H[r][c] = (−1)^popcount(r & c)`.

use rayon::prelude::*;

/// The rotation's block length.
pub const HADAMARD_BLOCK: usize = 1024;
/// `1 / √1024`.
const SCALE: f32 = 1.0 / 32.0;

/// `x[T, K] ← R·x` per row: signs, FWHT per 1024-block, ÷32. `signs: [K]`, `K % 1024 == 0`.
pub fn hadamard_rotate(x: &mut [f32], signs: &[f32]) {
    let k = check(x, signs);
    x.par_chunks_mut(k).for_each(|row| {
        for (v, s) in row.iter_mut().zip(signs) {
            *v *= s;
        }
        for block in row.chunks_exact_mut(HADAMARD_BLOCK) {
            fwht_1024(block);
            for v in block.iter_mut() {
                *v *= SCALE;
            }
        }
    });
}

/// `x[T, K] ← Rᵀ·x` per row (the embedding inverse): FWHT per 1024-block, ÷32, then signs.
pub fn hadamard_unrotate(x: &mut [f32], signs: &[f32]) {
    let k = check(x, signs);
    x.par_chunks_mut(k).for_each(|row| {
        for block in row.chunks_exact_mut(HADAMARD_BLOCK) {
            fwht_1024(block);
        }
        for (v, s) in row.iter_mut().zip(signs) {
            *v *= SCALE * s;
        }
    });
}

/// Slow twin of [`hadamard_rotate`]: the dense `H` product in f64.
pub fn hadamard_rotate_reference(x: &mut [f32], signs: &[f32]) {
    let k = check(x, signs);
    for row in x.chunks_exact_mut(k) {
        let signed: Vec<f64> = row
            .iter()
            .zip(signs)
            .map(|(&v, &s)| f64::from(v) * f64::from(s))
            .collect();
        dense_blocks(&signed, row);
    }
}

/// Slow twin of [`hadamard_unrotate`].
pub fn hadamard_unrotate_reference(x: &mut [f32], signs: &[f32]) {
    let k = check(x, signs);
    for row in x.chunks_exact_mut(k) {
        let input: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        dense_blocks(&input, row);
        for (v, s) in row.iter_mut().zip(signs) {
            *v *= s;
        }
    }
}

fn dense_blocks(input: &[f64], out: &mut [f32]) {
    for (src, dst) in input
        .chunks_exact(HADAMARD_BLOCK)
        .zip(out.chunks_exact_mut(HADAMARD_BLOCK))
    {
        for (r, o) in dst.iter_mut().enumerate() {
            let mut acc = 0.0f64;
            for (c, &v) in src.iter().enumerate() {
                if (r & c).count_ones() % 2 == 0 {
                    acc += v;
                } else {
                    acc -= v;
                }
            }
            *o = (acc / 32.0) as f32;
        }
    }
}

fn check(x: &[f32], signs: &[f32]) -> usize {
    let k = signs.len();
    assert!(
        k > 0 && k.is_multiple_of(HADAMARD_BLOCK),
        "hadamard: width {k} is not a multiple of {HADAMARD_BLOCK}"
    );
    assert!(
        x.len().is_multiple_of(k),
        "hadamard: {} values are not rows of {k}",
        x.len()
    );
    k
}

/// The unnormalised natural-order Walsh–Hadamard transform of one 1024-block, in place.
fn fwht_1024(v: &mut [f32]) {
    debug_assert_eq!(v.len(), HADAMARD_BLOCK);
    let mut h = 1;
    while h < HADAMARD_BLOCK {
        for pair in v.chunks_exact_mut(2 * h) {
            let (a, b) = pair.split_at_mut(h);
            for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                let (s, d) = (*x + *y, *x - *y);
                *x = s;
                *y = d;
            }
        }
        h *= 2;
    }
}

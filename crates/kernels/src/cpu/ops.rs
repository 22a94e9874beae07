//! Element-wise and per-row ops: norms, activations, rotary embedding, the causal depthwise
//! convolution of Gated DeltaNet, softmax.
//!
//! Rows are independent, so large inputs are split across threads by whole rows: every row is
//! computed exactly as it would be alone, and results do not depend on the split.

use rayon::prelude::*;

use super::vexp::{exp_in_place, silu_in_place};

/// Values per parallel task (about 64 KiB of f32).
const PAR_CHUNK: usize = 16 * 1024;

/// Rows of `dim` values per parallel task.
fn rows_per_task(dim: usize) -> usize {
    (PAR_CHUNK / dim.max(1)).max(1)
}

/// RMSNorm of every `dim`-wide row of `x` in place: `x * rsqrt(mean(x²) + eps) * gain`.
/// `gain` is the effective multiplier (Qwen3.5 stores `w` and applies `1 + w`; the caller folds it).
pub fn rms_norm(x: &mut [f32], gain: &[f32], eps: f32) {
    let dim = gain.len();
    x.par_chunks_mut(dim * rows_per_task(dim)).for_each(|rows| {
        for row in rows.chunks_exact_mut(dim) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for (v, g) in row.iter_mut().zip(gain) {
                *v = *v * inv * g;
            }
        }
    });
}

/// RMSNorm into a separate output buffer.
pub fn rms_norm_into(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm(out, gain, eps);
}

/// Gated RMSNorm of Gated DeltaNet, per `dim`-wide row: `norm(x) * weight * silu(z)`.
/// x, z: [R, dim]
pub fn rms_norm_gated(x: &mut [f32], z: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    let n = dim * rows_per_task(dim);
    x.par_chunks_mut(n)
        .zip(z.par_chunks(n))
        .for_each(|(rows, zs)| {
            let mut gate = vec![0.0f32; dim];
            for (row, zr) in rows.chunks_exact_mut(dim).zip(zs.chunks_exact(dim)) {
                let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                let inv = 1.0 / (ms + eps).sqrt();
                gate.copy_from_slice(zr);
                silu_in_place(&mut gate);
                for ((v, w), g) in row.iter_mut().zip(weight).zip(&gate) {
                    *v = *v * inv * w * g;
                }
            }
        });
}

/// L2-normalises every `dim`-wide row: `x * rsqrt(sum(x²) + eps)`.
pub fn l2_normalize(x: &mut [f32], dim: usize, eps: f32) {
    x.par_chunks_mut(dim * rows_per_task(dim)).for_each(|rows| {
        for row in rows.chunks_exact_mut(dim) {
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
            row.iter_mut().for_each(|v| *v *= inv);
        }
    });
}

pub use super::vexp::{sigmoid, silu, silu_times, times_sigmoid};

/// softplus with PyTorch's threshold (linear above 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// SwiGLU in place: `gate = silu(gate) * up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    // Even shares for the threads (one token's 17,408 values were one chunk of 16,384 and a sliver).
    let per = gate
        .len()
        .div_ceil(2 * rayon::current_num_threads().max(1))
        .clamp(1024, PAR_CHUNK);
    gate.par_chunks_mut(per)
        .zip(up.par_chunks(per))
        .for_each(|(gs, us)| {
            silu_times(gs, us);
        });
}

/// `x += y`, element-wise.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(PAR_CHUNK)
        .zip(y.par_chunks(PAR_CHUNK))
        .for_each(|(xs, ys)| {
            for (a, b) in xs.iter_mut().zip(ys) {
                *a += b;
            }
        });
}

/// Rotary tables for positions `[pos0, pos0 + t)`: cos/sin `[t, rot/2]` with `inv_freq[rot/2]`.
pub fn rope_tables(pos0: usize, t: usize, inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0.0; t * half];
    let mut sin = vec![0.0; t * half];
    for i in 0..t {
        let p = (pos0 + i) as f32;
        for j in 0..half {
            let a = p * inv_freq[j];
            cos[i * half + j] = a.cos();
            sin[i * half + j] = a.sin();
        }
    }
    (cos, sin)
}

/// Applies rotary embedding in the "rotate half" layout to the first `2 * half` dims of every
/// head. x: [T, H, D]; cos/sin: [T, half]
pub fn apply_rope(x: &mut [f32], t: usize, heads: usize, d: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len() / t.max(1);
    for i in 0..t {
        let (c, s) = (
            &cos[i * half..(i + 1) * half],
            &sin[i * half..(i + 1) * half],
        );
        for h in 0..heads {
            let v = &mut x[(i * heads + h) * d..(i * heads + h + 1) * d];
            for j in 0..half {
                let (a, b) = (v[j], v[j + half]);
                v[j] = a * c[j] - b * s[j];
                v[j + half] = b * c[j] + a * s[j];
            }
        }
    }
}

/// Causal depthwise convolution with SiLU, continuing from `state`.
/// x: [T, C] (overwritten with the output); weight: [C, K]; state: [K-1, C], the previous K-1
/// inputs (oldest first), updated to the last K-1 inputs.
pub fn causal_conv1d_silu(
    x: &mut [f32],
    t: usize,
    channels: usize,
    weight: &[f32],
    kernel: usize,
    state: &mut [f32],
) {
    causal_conv1d_silu_taps(
        x,
        t,
        channels,
        &conv_taps(weight, channels, kernel),
        kernel,
        state,
    );
}

/// The conv weight [C, K] as taps channel-contiguous, [K, C]: what [`causal_conv1d_silu_taps`] reads.
pub fn conv_taps(weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    assert_eq!(weight.len(), channels * kernel);
    let mut taps = vec![0.0f32; kernel * channels];
    for c in 0..channels {
        for j in 0..kernel {
            taps[j * channels + c] = weight[c * kernel + j];
        }
    }
    taps
}

/// [`causal_conv1d_silu`] with the taps already channel-contiguous ([`conv_taps`]): the inner loop runs over
/// channels and vectorises; one token's channels are split between the threads, several tokens go one per task.
/// Every output sums its taps in order, whatever the split.
pub fn causal_conv1d_silu_taps(
    x: &mut [f32],
    t: usize,
    channels: usize,
    taps: &[f32],
    kernel: usize,
    state: &mut [f32],
) {
    let hist = kernel - 1;
    assert_eq!(state.len(), hist * channels);
    assert_eq!(taps.len(), kernel * channels);
    // Padded input: the history followed by the new tokens.
    let mut xx = Vec::with_capacity((hist + t) * channels);
    xx.extend_from_slice(state);
    xx.extend_from_slice(&x[..t * channels]);
    // Channels c0.. of token i's output.
    let one = |i: usize, c0: usize, out: &mut [f32]| {
        out.fill(0.0);
        let cs = c0..c0 + out.len();
        for j in 0..kernel {
            let tap = &taps[j * channels..][cs.clone()];
            let inp = &xx[(i + j) * channels..][cs.clone()];
            for ((o, w), v) in out.iter_mut().zip(tap).zip(inp) {
                *o += w * v;
            }
        }
        silu_in_place(out);
    };
    // Outputs read only the padded copy, so tokens and channels are independent.
    if t == 1 {
        let per = channels
            .div_ceil(2 * rayon::current_num_threads().max(1))
            .next_multiple_of(16);
        x[..channels]
            .par_chunks_mut(per)
            .enumerate()
            .for_each(|(b, out)| one(0, b * per, out));
    } else {
        x[..t * channels]
            .par_chunks_mut(channels)
            .enumerate()
            .for_each(|(i, out)| one(i, 0, out));
    }
    state.copy_from_slice(&xx[t * channels..]);
}

/// `max |a - b| / max(1, max |b|)`: the relative error that fast-against-reference comparisons
/// (and the logits tolerances of the model and engine) are stated in. `b` is the reference.
///
/// # Panics
/// If the lengths differ.
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

/// Numerically stable softmax of one row in place.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return;
    }
    x.iter_mut().for_each(|v| *v -= m);
    exp_in_place(x);
    let s: f32 = x.iter().sum();
    let inv = 1.0 / s;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_in_pieces_equals_conv_at_once() {
        let (t, c, k) = (9, 5, 4);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.3).sin()).collect();
        let x: Vec<f32> = (0..t * c).map(|i| (i as f32 * 0.7).cos()).collect();
        let mut whole = x.clone();
        let mut st = vec![0.0; (k - 1) * c];
        causal_conv1d_silu(&mut whole, t, c, &w, k, &mut st);
        let mut st2 = vec![0.0; (k - 1) * c];
        let mut parts = Vec::new();
        for (a, b) in [(0, 1), (1, 4), (4, 9)] {
            let mut p = x[a * c..b * c].to_vec();
            causal_conv1d_silu(&mut p, b - a, c, &w, k, &mut st2);
            parts.extend(p);
        }
        assert_eq!(whole, parts);
        assert_eq!(st, st2);
        // First output only sees the first input (zero history) through the last tap.
        let want = silu(w[k - 1] * x[0]);
        assert!((whole[0] - want).abs() < 1e-6);
    }

    #[test]
    fn conv_of_one_token_split_across_threads_equals_each_channel_summed_alone() {
        // Wide enough that one token's channels are split into several tasks.
        let (t, c, k) = (3, 1000, 4);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..t * c).map(|i| (i as f32 * 0.71).cos()).collect();
        let mut st = vec![0.0; (k - 1) * c];
        let mut got = Vec::new();
        for i in 0..t {
            let mut row = x[i * c..(i + 1) * c].to_vec();
            causal_conv1d_silu(&mut row, 1, c, &w, k, &mut st);
            got.extend(row);
        }
        // Each output alone: the taps in order over the zero history and the inputs.
        for i in 0..t {
            for ch in 0..c {
                let mut o = 0.0f32;
                for j in 0..k {
                    let pos = i + j;
                    let v = if pos < k - 1 {
                        0.0
                    } else {
                        x[(pos - (k - 1)) * c + ch]
                    };
                    o += w[ch * k + j] * v;
                }
                assert_eq!(
                    got[i * c + ch].to_bits(),
                    silu(o).to_bits(),
                    "token {i} channel {ch}"
                );
            }
        }
    }

    #[test]
    fn rope_rotates_pairs_half_apart() {
        let inv = [1.0f32, 0.5];
        let (c, s) = rope_tables(3, 1, &inv);
        let mut x = vec![1.0, 0.0, 0.0, 0.0, 7.0];
        apply_rope(&mut x, 1, 1, 5, &c, &s);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert_eq!(x[4], 7.0);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_masked_zero() {
        let mut x = vec![1.0, 2.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
    }
}

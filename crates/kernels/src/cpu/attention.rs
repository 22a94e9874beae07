//! Causal softmax attention with grouped key/value heads over a key/value cache.
//!
//! Queries are the `T` newest positions of a sequence whose keys/values (the cache, new tokens
//! included) number `S = past + T`; query `i` sees keys `0..=past + i`.

use rayon::prelude::*;

use super::ops::softmax;
use super::sgemm::{sgemm, Mat};

/// Queries per task.
const Q_BLOCK: usize = 64;

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub t: usize,
    pub past: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// q: [T, H, D]; k, v: [S, HKV, D] with S >= past + T; out: [T, H, D].
pub fn causal_attention(
    sh: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        t,
        past,
        heads,
        kv_heads,
        head_dim: d,
    } = sh;
    assert_eq!(q.len(), t * heads * d);
    assert!(k.len() >= (past + t) * kv_heads * d && v.len() == k.len());
    assert_eq!(out.len(), t * heads * d);
    assert!(heads % kv_heads == 0);
    let group = heads / kv_heads;
    let qblocks = t.div_ceil(Q_BLOCK);
    let tasks: Vec<(usize, usize)> = (0..heads)
        .flat_map(|h| (0..qblocks).map(move |b| (h, b)))
        .collect();
    let results: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(h, b)| {
            let kh = h / group;
            let i0 = b * Q_BLOCK;
            let i1 = (i0 + Q_BLOCK).min(t);
            let nq = i1 - i0;
            let keys = past + i1; // the last query of the block sees this many keys
            let qm = Mat {
                data: &q[(i0 * heads + h) * d..],
                rows: nq,
                cols: d,
                rs: heads * d,
                cs: 1,
            };
            let km = Mat {
                data: &k[kh * d..],
                rows: d,
                cols: keys,
                rs: 1,
                cs: kv_heads * d,
            };
            let mut scores = vec![0.0f32; nq * keys];
            sgemm(&mut scores, keys, qm, km, false);
            for r in 0..nq {
                let visible = past + i0 + r + 1;
                let row = &mut scores[r * keys..(r + 1) * keys];
                row[..visible].iter_mut().for_each(|x| *x *= scale);
                softmax(&mut row[..visible]);
                row[visible..].fill(0.0);
            }
            let vm = Mat {
                data: &v[kh * d..],
                rows: keys,
                cols: d,
                rs: kv_heads * d,
                cs: 1,
            };
            let mut o = vec![0.0f32; nq * d];
            sgemm(&mut o, d, Mat::rm(&scores, nq, keys), vm, false);
            (h, i0, o)
        })
        .collect();
    for (h, i0, o) in results {
        for (r, row) in o.chunks_exact(d).enumerate() {
            let i = i0 + r;
            out[(i * heads + h) * d..(i * heads + h + 1) * d].copy_from_slice(row);
        }
    }
}

/// Slow twin of [`causal_attention`] (f64 accumulation, one query at a time).
pub fn causal_attention_reference(
    sh: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        t,
        past,
        heads,
        kv_heads,
        head_dim: d,
    } = sh;
    let group = heads / kv_heads;
    for i in 0..t {
        for h in 0..heads {
            let kh = h / group;
            let qi = &q[(i * heads + h) * d..(i * heads + h + 1) * d];
            let n = past + i + 1;
            let mut w: Vec<f64> = (0..n)
                .map(|j| {
                    let kj = &k[(j * kv_heads + kh) * d..(j * kv_heads + kh + 1) * d];
                    qi.iter()
                        .zip(kj)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = w
                .iter_mut()
                .map(|x| {
                    *x = (*x - m).exp();
                    *x
                })
                .sum();
            let o = &mut out[(i * heads + h) * d..(i * heads + h + 1) * d];
            for c in 0..d {
                o[c] = ((0..n)
                    .map(|j| w[j] * v[(j * kv_heads + kh) * d + c] as f64)
                    .sum::<f64>()
                    / s) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_matches_reference_with_history_and_gqa() {
        for &(t, past, heads, kvh, d) in &[
            (1, 0, 2, 1, 8),
            (5, 3, 4, 2, 12),
            (70, 0, 3, 1, 16),
            (130, 17, 2, 2, 9),
        ] {
            let s = past + t;
            let q: Vec<f32> = (0..t * heads * d)
                .map(|i| (i as f32 * 0.13).sin())
                .collect();
            let k: Vec<f32> = (0..s * kvh * d).map(|i| (i as f32 * 0.07).cos()).collect();
            let v: Vec<f32> = (0..s * kvh * d).map(|i| (i as f32 * 0.29).sin()).collect();
            let sh = AttnShape {
                t,
                past,
                heads,
                kv_heads: kvh,
                head_dim: d,
            };
            let mut a = vec![0.0; t * heads * d];
            let mut b = vec![0.0; t * heads * d];
            causal_attention(sh, &q, &k, &v, 0.3, &mut a);
            causal_attention_reference(sh, &q, &k, &v, 0.3, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-5, "t={t} past={past}: {x} vs {y}");
            }
        }
    }
}

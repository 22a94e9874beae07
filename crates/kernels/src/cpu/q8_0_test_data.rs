//! Test inputs shared by the Q8_0 kernels' tests (`q8_0_vnni.rs`, `q8_0_amx.rs`): random-ish rows, their values,
//! their regrouped form, and the check that weights sharing one activation answer as each alone.

use half::f16;
use onepass_tensor::{group_q8_0_row, Q8_0G_BYTES, Q8_0G_VALUES};

use super::q8_0::Q8_0_BYTES;
use super::q8_0_vnni::Q8Weight;

/// Random-ish Q8_0 rows [n, k]: every code value, scales 0.001..0.0094; with `signed`, every 7th block's scale
/// negative.
pub fn q8_0(n: usize, k: usize, seed: usize, signed: bool) -> Vec<u8> {
    let mut raw = Vec::new();
    for b in 0..n * k / 32 {
        let sign = if signed && b % 7 == 3 { -1.0 } else { 1.0 };
        let d = (0.001 + 0.0007 * ((b + seed) % 13) as f32) * sign;
        raw.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        raw.extend((0..32).map(|i| ((i * 71 + b * 29 + seed) % 256) as u8));
    }
    raw
}

/// Every value of the rows (a code times its f16 scale: exact in f32).
pub fn decoded(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(Q8_0_BYTES)
        .flat_map(|b| {
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            b[2..].iter().map(move |&c| f32::from(c as i8) * d)
        })
        .collect()
}

/// The rows regrouped (whole groups of 512 values, padded).
pub fn grouped(raw: &[u8], n: usize, k: usize) -> Vec<u8> {
    let rb = k / 32 * Q8_0_BYTES;
    let gb = k.div_ceil(Q8_0G_VALUES) * Q8_0G_BYTES;
    let mut out = vec![0u8; n * gb];
    for (src, dst) in raw.chunks_exact(rb).zip(out.chunks_exact_mut(gb)) {
        group_q8_0_row(src, dst);
    }
    out
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// A Q8_0 kernel's entry for weights that read one activation (`q8_0_matmul_t_many`'s signature).
pub type Many = fn(&[f32], usize, &[(Q8Weight<'_>, usize)], usize, &mut [&mut [f32]]);

/// Three regrouped weights (70, 9 and 1 rows: off the tiles and the tasks) on one call of `many` over `x` ([t, k])
/// give, each, the bits of a call of its own.
pub fn weights_sharing_x_answer_as_each_alone(many: Many, x: &[f32], t: usize, k: usize) {
    let ws: Vec<(Vec<u8>, usize)> = [70usize, 9, 1]
        .iter()
        .enumerate()
        .map(|(s, &n)| (grouped(&q8_0(n, k, s + 20, false), n, k), n))
        .collect();
    let parts: Vec<(Q8Weight<'_>, usize)> =
        ws.iter().map(|(g, n)| (Q8Weight::Grouped(g), *n)).collect();
    let mut out: Vec<Vec<f32>> = parts.iter().map(|p| vec![f32::NAN; t * p.1]).collect();
    let mut ys: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
    many(x, t, &parts, k, &mut ys);
    for (&(w, n), got) in parts.iter().zip(&out) {
        let mut alone = vec![f32::NAN; t * n];
        many(x, t, &[(w, n)], k, &mut [&mut alone]);
        assert_eq!(bits(got), bits(&alone), "N = {n}");
    }
}

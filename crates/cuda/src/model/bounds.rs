//! Bounds on values the f16 forms must hold, known from the weights alone: the half precision's fit to a model
//! (`half_misfit`), its residual projections' input exponents (`half_residual_exps`) and the f16 KV caches'
//! bound (`kv_bound`), with the weight statistics they are built from (largest row 2-norm, largest |gain|).

use super::*;

/// The largest value a norm's output takes in the half precision is sqrt(K) times its largest gain; f16's largest
/// finite value is 65,504. The bound kept for every f16 GEMM input (a norm's output as it is, a residual
/// projection's input scaled by a power of two): half of that, 2^15.
pub(super) const HALF_NORM_BOUND: f64 = 32768.0;

/// The largest |silu(z)| over z ≤ 0 (at z ≈ -1.278, 0.27846...), rounded up.
const SILU_NEG_MAX: f64 = 0.2785;

/// The largest 2-norm of a float weight's rows (infinite where a row holds a non-finite value), rounded up: every
/// output of a product with it is at most this times its input row's 2-norm (Cauchy-Schwarz).
fn max_row_norm(t: &Tensor) -> Result<f64, CudaError> {
    if !t.dtype().is_float() {
        return Err(not_float(t));
    }
    let k = t.shape().last().copied().unwrap_or(0);
    if k == 0 {
        return Ok(0.0);
    }
    let rows = t.numel() / k;
    // The rows split over the host's threads (every float weight is read once more at upload for this).
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, rows.div_ceil(64).max(1));
    let per = rows.div_ceil(threads);
    let big = std::thread::scope(|s| {
        let parts: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || {
                    let mut row = vec![0f32; k];
                    let mut big = 0f64;
                    for r in i * per..((i + 1) * per).min(rows) {
                        t.read_f32(r * k, &mut row);
                        let ss: f64 = row
                            .chunks(64)
                            .map(|c| f64::from(c.iter().map(|x| x * x).sum::<f32>()))
                            .sum();
                        // NaN and infinity both make the bound infinite.
                        big = if ss.is_finite() {
                            big.max(ss)
                        } else {
                            f64::INFINITY
                        };
                    }
                    big
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or(f64::INFINITY))
            .fold(0f64, f64::max)
    });
    // The f32 partial sums round by well under 1e-3 of the total.
    Ok(big.sqrt() * 1.001)
}

/// The largest |value| of a gain or weight vector; infinite where one is NaN or infinite (no bound then).
fn largest_abs(v: &[f32]) -> f64 {
    v.iter().fold(0f64, |a, x| {
        if x.is_finite() {
            a.max(f64::from(x.abs()))
        } else {
            f64::INFINITY
        }
    })
}

/// The power of two e that puts `bound` times 2^e at most [`HALF_NORM_BOUND`] and as close to it as a power of two
/// goes, within [-60, 60] (an all-zero input takes the largest). `None` where no such e holds it.
fn half_exp(bound: f64) -> Option<i32> {
    if !bound.is_finite() {
        return None;
    }
    let e = if bound > 0.0 {
        ((HALF_NORM_BOUND / bound).log2().floor() as i32).clamp(-60, 60)
    } else {
        60
    };
    // log2's rounding: step down until the product fits.
    (e - 1..=e)
        .rev()
        .find(|e| *e >= -60 && bound * 2f64.powi(*e) <= HALF_NORM_BOUND)
}

/// Per layer, the powers of two the half precision stores its residual projections' inputs times (the mixer's
/// output projection's, the MLP's down projection's), each from a bound on that input known from the weights
/// alone. Each input projection's output is at most sqrt(K) times its norm's largest gain times its weight row's
/// 2-norm (the normed row's 2-norm is at most sqrt(K) times the gain). So: the gated norm's output (Gated
/// DeltaNet) is at most sqrt(DV) (a head's normed value) times the norm's largest weight times the bound of
/// silu(z); attention's output is a convex mix of V rows times a sigmoid gate, at most V's bound; SwiGLU's
/// output is at most the bound of silu(gate) times up's. (|silu(z)| ≤ max(|z|, 0.2785).) Loose (Cauchy-Schwarz is
/// tight only for a hidden row aligned with a weight row), which f16's range absorbs: with the bound scaled into
/// (2^14, 2^15], every value down to 2^-28 of it stays normal, 11 significant bits. `Err`: why a bound is out of
/// reach (a non-finite weight or gain).
pub(super) fn half_residual_exps(m: &Model) -> Result<Result<Vec<[i32; 2]>, String>, CudaError> {
    let c = m.text_config();
    let root_k = (c.hidden_size as f64).sqrt();
    let mut exps = Vec::with_capacity(c.layer_types.len());
    for (l, kind) in c.layer_types.iter().enumerate() {
        let h_in = root_k * largest_abs(m.param(l, Param::NormGain(NormSite::Input))?);
        let h_post = root_k * largest_abs(m.param(l, Param::NormGain(NormSite::Post))?);
        let mixer = match kind {
            LayerKind::GatedDeltaNet => {
                let z = h_in * max_row_norm(m.linear(l, Projection::GdnIn)?[1])?;
                let dv = c.linear_value_head_dim as f64;
                dv.sqrt() * largest_abs(m.param(l, Param::GatedNormWeight)?) * z.max(SILU_NEG_MAX)
            }
            LayerKind::Attention => attn_v_bound(m, l)?,
        };
        let gu = m.linear(l, Projection::MlpIn)?;
        let mlp = (h_post * max_row_norm(gu[0])?).max(SILU_NEG_MAX) * h_post * max_row_norm(gu[1])?;
        let (Some(a), Some(b)) = (half_exp(mixer), half_exp(mlp)) else {
            return Ok(Err(format!(
                "layer {l}'s residual projections' inputs have no bound inside f16's range"
            )));
        };
        exps.push([a, b]);
    }
    Ok(Ok(exps))
}

/// The largest |value| of attention layer `l`'s v rows, so of its output too (a convex mix of them times a sigmoid
/// gate): sqrt(hidden) times the input norm's largest gain times W_v's largest row 2-norm (Cauchy-Schwarz; a rotated
/// pack's rotation keeps 2-norms). W_v must be float.
fn attn_v_bound(m: &Model, l: usize) -> Result<f64, CudaError> {
    let root_k = (m.text_config().hidden_size as f64).sqrt();
    let gain = largest_abs(m.param(l, Param::NormGain(NormSite::Input))?);
    Ok(root_k * gain * max_row_norm(m.linear(l, Projection::AttnIn)?[2])?)
}

/// The largest |value| attention's q, k and v can take, from the weights alone (`None`: no bound, a block-format
/// or non-finite weight). q and k are RMS-normed per head, each value at most sqrt(D) times the norm's largest gain
/// (the rotary turns pairs of values, which keeps each pair's 2-norm); v at most [`attn_v_bound`].
pub(super) fn kv_bound(m: &Model) -> Result<Option<f64>, CudaError> {
    let c = m.text_config();
    let root_d = (c.head_dim as f64).sqrt();
    let mut big = 0f64;
    for (l, kind) in c.layer_types.iter().enumerate() {
        if *kind != LayerKind::Attention {
            continue;
        }
        let gain = |p: Param| -> Result<f64, CudaError> { Ok(largest_abs(m.param(l, p)?)) };
        if !m.linear(l, Projection::AttnIn)?[2].dtype().is_float() {
            return Ok(None);
        }
        let qk = root_d * gain(Param::QNormGain)?.max(gain(Param::KNormGain)?);
        let v = attn_v_bound(m, l)?;
        if !(qk.is_finite() && v.is_finite()) {
            return Ok(None);
        }
        big = big.max(qk).max(v);
    }
    Ok(Some(big))
}

/// Why the half precision does not fit `m` (it then runs in mixed), or `None`: no rotated site, every input
/// projection float, every float projection held by f16 (bf16 values, or an F16 file's), and every norm that feeds
/// one bounded inside f16's range. (The residual projections' inputs need their bounds too: `half_residual_exps`.)
pub(super) fn half_misfit(m: &Model) -> Result<Option<String>, CudaError> {
    let c = m.text_config();
    if m.embedding_signs().is_some() || m.head_signs().is_some() {
        return Ok(Some("a rotated pack".into()));
    }
    let root_k = (c.hidden_size as f64).sqrt();
    for (l, kind) in c.layer_types.iter().enumerate() {
        let (mixer_in, mixer_out) = match kind {
            LayerKind::GatedDeltaNet => (Projection::GdnIn, Projection::GdnOut),
            LayerKind::Attention => (Projection::AttnIn, Projection::AttnOut),
        };
        for p in [mixer_in, mixer_out, Projection::MlpIn, Projection::MlpOut] {
            // A rotated input is not the one the residual bounds hold (H·x reaches sqrt(K) times max |x|).
            if m.rotation(l, p)?.is_some() {
                return Ok(Some(format!(
                    "layer {l}'s {} reads a rotated input",
                    p.name()
                )));
            }
            for t in m.linear(l, p)? {
                // A block-format residual projection stays on both bf16 planes; an input projection has no such
                // form in half.
                if !t.dtype().is_float() {
                    if p.is_input() {
                        return Ok(Some(format!(
                            "{} is stored as {}",
                            t.name(),
                            t.dtype().name()
                        )));
                    }
                    continue;
                }
                // Only f32 values need a look (bf16's and f16's all fit); `form` reads them once.
                if t.dtype() == onepass_tensor::DType::F32
                    && form(t, Precision::Mixed) == Form::F32Rows
                {
                    return Ok(Some(format!(
                        "{} holds f32 values that f16 does not hold exactly",
                        t.name()
                    )));
                }
            }
        }
        for site in [NormSite::Input, NormSite::Post] {
            let big = largest_abs(m.param(l, Param::NormGain(site))?);
            if big * root_k >= HALF_NORM_BOUND || !big.is_finite() {
                return Ok(Some(format!(
                    "layer {l}'s norm gain reaches {big:.1}: its output could leave f16's range"
                )));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use onepass_model::synth;

    /// The tiny presets the bound tests run on.
    const TINY: [&str; 3] = ["tiny-gva", "tiny-attn-first", "tiny-bf16"];

    /// A preset's synthetic checkpoint, loaded (the folder kept alive beside it).
    fn tiny_model(preset: &str) -> (tempfile::TempDir, Model) {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = synth::preset(preset).expect("preset");
        synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).expect("synth");
        let m = Model::load(dir.path()).expect("load");
        (dir, m)
    }

    /// Deterministic uniform values in [-1, 1) (xorshift64).
    fn xorshift(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        }
    }

    fn silu(z: f64) -> f64 {
        z / (1.0 + (-z).exp())
    }

    /// `W · h` in f64 for a float weight [N, K].
    fn product(t: &Tensor, h: &[f64]) -> Vec<f64> {
        let w = t.to_f32_vec();
        w.chunks(h.len())
            .map(|r| r.iter().zip(h).map(|(a, b)| f64::from(*a) * b).sum())
            .collect()
    }

    /// rms_norm(x) · gain in f64, as the model's norm computes it.
    fn normed(x: &[f64], gain: &[f32], eps: f64) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        x.iter()
            .zip(gain)
            .map(|(v, g)| v * inv * f64::from(*g))
            .collect()
    }

    /// Rows of `t` (f64), the inputs that make an output reach its Cauchy-Schwarz bound.
    fn rows(t: &Tensor) -> Vec<Vec<f64>> {
        let k = t.shape()[1];
        t.to_f32_vec()
            .chunks(k)
            .map(|r| r.iter().map(|v| f64::from(*v)).collect())
            .collect()
    }

    /// The residual projections' inputs the half precision scales, computed directly (f64) over random hidden rows
    /// and over the rows that make one factor of a bound tight (each weight row itself as the hidden row): scaled by
    /// the upload's power of two, every one stays within 2^15, half of f16's range (the bound the exponents promise),
    /// and the largest comes within 2^16 of it (a bound loose past that would push small values into subnormals).
    #[test]
    fn half_residual_bounds_hold_the_values_the_model_takes() {
        for preset in TINY {
            let (_dir, m) = tiny_model(preset);
            let exps = half_residual_exps(&m).expect("weights").expect("bounds");
            let c = m.text_config();
            let (k, eps) = (c.hidden_size, f64::from(c.rms_norm_eps));
            let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
            for (l, kind) in c.layer_types.iter().enumerate() {
                let scale = |e: i32| 2f64.powi(e);
                let in_gain = m.param(l, Param::NormGain(NormSite::Input)).unwrap();
                let post_gain = m.param(l, Param::NormGain(NormSite::Post)).unwrap();
                let gdn = m.linear(l, Projection::GdnIn);
                let (mixer_w, gu) = (
                    match kind {
                        LayerKind::GatedDeltaNet => gdn.as_ref().unwrap()[1],
                        LayerKind::Attention => m.linear(l, Projection::AttnIn).unwrap()[2],
                    },
                    m.linear(l, Projection::MlpIn).unwrap(),
                );
                let mut hidden: Vec<Vec<f64>> = (0..16)
                    .map(|_| (0..k).map(|_| 4.0 * rnd()).collect())
                    .collect();
                hidden.extend(rows(mixer_w));
                hidden.extend(rows(gu[0]));
                hidden.extend(rows(gu[1]));
                let (mut mixer, mut mlp) = (0f64, 0f64);
                for x in &hidden {
                    let h = normed(x, in_gain, eps);
                    let v = product(mixer_w, &h);
                    mixer = mixer.max(match kind {
                        // A head's normed value reaches 1 / sqrt(1/DV + eps) where the core is one-hot.
                        LayerKind::GatedDeltaNet => {
                            let dv = c.linear_value_head_dim;
                            let w = m.param(l, Param::GatedNormWeight).unwrap();
                            let peak = 1.0 / (1.0 / dv as f64 + eps).sqrt();
                            v.iter()
                                .enumerate()
                                .map(|(i, z)| peak * f64::from(w[i % dv]).abs() * silu(*z).abs())
                                .fold(0.0, f64::max)
                        }
                        // A convex mix of V rows, times a gate below 1: at most the largest |V|.
                        LayerKind::Attention => v.iter().fold(0.0, |a, x| a.max(x.abs())),
                    });
                    let h = normed(x, post_gain, eps);
                    let (g, u) = (product(gu[0], &h), product(gu[1], &h));
                    mlp = g
                        .iter()
                        .zip(&u)
                        .fold(mlp, |a, (g, u)| a.max((silu(*g) * u).abs()));
                }
                for (what, top, e) in [
                    ("mixer output", mixer, exps[l][0]),
                    ("SwiGLU", mlp, exps[l][1]),
                ] {
                    let scaled = top * scale(e);
                    // The bound times 2^e lies in (2^14, 2^15]: it is between half this and this times the value.
                    eprintln!(
                        "{preset} layer {l} {what}: largest {top:.3e}, bound within {:.2}x of it (at most)",
                        HALF_NORM_BOUND / scaled
                    );
                    assert!(
                        (HALF_NORM_BOUND / 65536.0..=HALF_NORM_BOUND).contains(&scaled),
                        "{preset} layer {l} {what}: largest |value| {top:.4e} times 2^{e} = {scaled:.4e}"
                    );
                }
            }
        }
    }

    /// The f16 KV caches' bound: on every preset with attention it is finite and inside half of f16's range, and it
    /// holds the q and k values per head (RMS-normed; the rotary keeps each pair's norm, so the normed values are
    /// checked) and the v values of random hidden rows and of the hidden rows that make v's bound tight (W_v's rows).
    #[test]
    fn kv_bound_holds_q_k_and_v() {
        for preset in TINY {
            let (_dir, m) = tiny_model(preset);
            let bound = kv_bound(&m).expect("weights").expect("a bound");
            assert!(bound > 0.0 && bound <= HALF_NORM_BOUND, "{preset}: {bound}");
            let c = m.text_config();
            let (eps, d) = (f64::from(c.rms_norm_eps), c.head_dim);
            let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
            let mut top = 0f64;
            for (l, kind) in c.layer_types.iter().enumerate() {
                if *kind != LayerKind::Attention {
                    continue;
                }
                let w = m.linear(l, Projection::AttnIn).unwrap();
                let in_gain = m.param(l, Param::NormGain(NormSite::Input)).unwrap();
                let mut hidden: Vec<Vec<f64>> = (0..16)
                    .map(|_| (0..c.hidden_size).map(|_| 4.0 * rnd()).collect())
                    .collect();
                hidden.extend(rows(w[2]));
                for x in &hidden {
                    let h = normed(x, in_gain, eps);
                    // q: the first D of each head's 2D outputs of w[0] (the gate after it); k: w[1]'s heads.
                    let (q, k) = (product(w[0], &h), product(w[1], &h));
                    let heads = q.chunks(2 * d).map(|c| (&c[..d], Param::QNormGain));
                    for (head, gain) in heads.chain(k.chunks(d).map(|c| (c, Param::KNormGain))) {
                        let y = normed(head, m.param(l, gain).unwrap(), eps);
                        top = top.max(y.iter().fold(0.0, |a, v| a.max(v.abs())));
                    }
                    top = top.max(product(w[2], &h).iter().fold(0.0, |a, v| a.max(v.abs())));
                }
            }
            eprintln!("{preset}: largest q, k, v {top:.3e}, bound {bound:.3e}");
            assert!(top <= bound, "{preset}: {top} > {bound}");
        }
    }

    /// The largest row 2-norm, over rows split between threads: at least the exact one (f64 over every row) and within
    /// 2e-3 of it; infinite where a row holds a NaN or an infinity (no bound: the model falls back to mixed).
    #[test]
    fn max_row_norm_bounds_every_row() {
        for (rows, k) in [(1, 7), (3, 64), (1000, 96), (4099, 33)] {
            let v: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3 * (1 + i / k % 5) as f32)
                .collect();
            let exact = v
                .chunks(k)
                .map(|r| r.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt())
                .fold(0.0, f64::max);
            let t = Tensor::from_f32("w", vec![rows, k], &v);
            let got = max_row_norm(&t).unwrap();
            assert!(
                got >= exact && got <= exact * 1.002,
                "{rows} x {k}: {got} against {exact}"
            );
            for bad in [f32::NAN, f32::INFINITY] {
                let mut w = v.clone();
                w[(rows - 1) * k + k / 2] = bad;
                let t = Tensor::from_f32("w", vec![rows, k], &w);
                assert_eq!(
                    max_row_norm(&t).unwrap(),
                    f64::INFINITY,
                    "{rows} x {k} with {bad}"
                );
            }
        }
    }

    /// The exponent is the largest power of two that keeps the bound within 2^15, and none where nothing does.
    #[test]
    fn half_exp_puts_the_bound_just_inside_the_range() {
        for bound in [1e-30, 3.7e-4, 0.5, 1.0, 3.0, 32768.0, 32769.0, 1e9, 1e20] {
            let e = half_exp(bound).expect("a power of two");
            let scaled = bound * 2f64.powi(e);
            assert!(scaled <= HALF_NORM_BOUND, "{bound}: 2^{e}");
            assert!(
                e == 60 || scaled * 2.0 > HALF_NORM_BOUND,
                "{bound}: 2^{e} is not the largest"
            );
        }
        assert_eq!(half_exp(0.0), Some(60));
        assert_eq!(half_exp(2f64.powi(75)), Some(-60));
        assert_eq!(half_exp(2f64.powi(75) * 1.5), None);
        assert_eq!(largest_abs(&[0.5, -3.0, 2.0]), 3.0);
        assert_eq!(largest_abs(&[0.5, f32::NAN, 2.0]), f64::INFINITY);
        assert_eq!(half_exp(1e40), None);
        assert_eq!(half_exp(f64::INFINITY), None);
        assert_eq!(half_exp(f64::NAN), None);
    }
}

//! `exp` on f32 as one method with a scalar form and AVX-512 and AVX2 forms that give the same bits, and the
//! activations built on it (sigmoid, SiLU, the softmax's exponentials) over whole slices, 16 or 8 values at a time.
//!
//! A value's result does not depend on where it falls in a slice (the vector body or the tail), on the slice's
//! length, or on the processor's vector width: every form does the same f32 operations in the same order, each
//! multiply-add fused. The method:
//!
//! 1. `x` clamped to [−104, 89] (beyond, the result is 0 or +∞ either way; a NaN is returned as it is);
//! 2. `n = round(x·log₂e)`, ties to even; `r = x − n·ln 2` in two fused steps, ln 2 as a short high part (9 bits, so
//!    `n·high` is exact) and the rest (Cody and Waite), |r| ≤ ln 2 / 2 plus a rounding;
//! 3. `exp(r)` by its Taylor polynomial of degree 7 in Horner form (truncation below 6e-9 of the result);
//! 4. times `2ⁿ` as two powers of two, `2^⌊n/2⌋` and `2^(n − ⌊n/2⌋)`, both normal: results in the subnormal range
//!    round once, and `n = 128` overflows to +∞ as it should.
//!
//! Error: within 2 units in the last place of the correctly rounded result over the normal range (the tests sweep
//! it against f64).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

const LO: f32 = -104.0;
const HI: f32 = 89.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2's high part, 0.693359375 (355/512).
const LN2_HI: f32 = 355.0 / 512.0;
/// ln 2 − [`LN2_HI`].
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1/k! for k = 0..=7, the Taylor coefficients of exp.
const C: [f32; 8] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];

/// `e^x` (see the module's method). The slices' vector forms give the same bits.
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(LO, HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = C[7];
    for &c in C[..7].iter().rev() {
        p = p.mul_add(r, c);
    }
    let n = n as i32;
    let a = n >> 1;
    p * pow2(a) * pow2(n - a)
}

/// `2^e` for a normal exponent.
#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `1 / (1 + e^−x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// What a slice call does to each value `x` (and `y` of the second slice where there is one).
#[derive(Clone, Copy)]
enum Op {
    /// `e^x`
    Exp,
    /// `sigmoid(x)`
    Sigmoid,
    /// `silu(x)`
    Silu,
    /// `silu(x) · y`
    SiluTimes,
    /// `x · sigmoid(y)`
    TimesSigmoid,
}

impl Op {
    #[inline]
    fn scalar(self, x: f32, y: f32) -> f32 {
        match self {
            Op::Exp => exp(x),
            Op::Sigmoid => sigmoid(x),
            Op::Silu => silu(x),
            Op::SiluTimes => silu(x) * y,
            Op::TimesSigmoid => x * sigmoid(y),
        }
    }
}

/// `x = e^x` for every value.
pub fn exp_in_place(x: &mut [f32]) {
    map(x, &[], Op::Exp)
}

/// `x = sigmoid(x)` for every value.
pub fn sigmoid_in_place(x: &mut [f32]) {
    map(x, &[], Op::Sigmoid)
}

/// `x = silu(x)` for every value.
pub fn silu_in_place(x: &mut [f32]) {
    map(x, &[], Op::Silu)
}

/// `g = silu(g) · u`, value by value (SwiGLU).
pub fn silu_times(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "silu_times: lengths");
    map(g, u, Op::SiluTimes)
}

/// `x = x · sigmoid(g)`, value by value (a sigmoid gate).
pub fn times_sigmoid(x: &mut [f32], g: &[f32]) {
    assert_eq!(x.len(), g.len(), "times_sigmoid: lengths");
    map(x, g, Op::TimesSigmoid)
}

/// `x[i] = op(x[i], y[i])`; `y` is empty for the one-slice ops.
fn map(x: &mut [f32], y: &[f32], op: Op) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512 F is present; `y` is empty or as long as `x` (the callers).
            return unsafe { map16(x, y, op) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA are present; as above.
            return unsafe { map8(x, y, op) };
        }
    }
    map_scalar(x, y, op)
}

fn map_scalar(x: &mut [f32], y: &[f32], op: Op) {
    for (i, v) in x.iter_mut().enumerate() {
        *v = op.scalar(*v, y.get(i).copied().unwrap_or(0.0));
    }
}

/// [`exp`] of 16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LO)), _mm512_set1_ps(HI));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(C[7]);
    for &c in C[..7].iter().rev() {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let n = _mm512_cvtps_epi32(n);
    let a = _mm512_srai_epi32::<1>(n);
    let b = _mm512_sub_epi32(n, a);
    let bias = _mm512_set1_epi32(127);
    let pa = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(a, bias)));
    let pb = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(b, bias)));
    _mm512_mask_mov_ps(_mm512_mul_ps(_mm512_mul_ps(p, pa), pb), nan, x)
}

/// [`Op`] on 16 values (`y` unused by the one-slice ops).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn op16(op: Op, x: __m512, y: __m512) -> __m512 {
    let one = _mm512_set1_ps(1.0);
    let sigmoid = |v: __m512| {
        _mm512_div_ps(
            one,
            _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))),
        )
    };
    match op {
        Op::Exp => exp16(x),
        Op::Sigmoid => sigmoid(x),
        Op::Silu => _mm512_mul_ps(x, sigmoid(x)),
        Op::SiluTimes => _mm512_mul_ps(_mm512_mul_ps(x, sigmoid(x)), y),
        Op::TimesSigmoid => _mm512_mul_ps(x, sigmoid(y)),
    }
}

/// # Safety
/// AVX-512 F; `y` is empty or as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map16(x: &mut [f32], y: &[f32], op: Op) {
    let two = !y.is_empty();
    let n = x.len();
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 {
            0xFFFF
        } else {
            (1u16 << (n - i)) - 1
        };
        // SAFETY: the mask covers values i.. below n of `x` (and of `y`, as long).
        unsafe {
            let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let yv = if two {
                _mm512_maskz_loadu_ps(m, y.as_ptr().add(i))
            } else {
                _mm512_setzero_ps()
            };
            _mm512_mask_storeu_ps(x.as_mut_ptr().add(i), m, op16(op, xv, yv));
        }
        i += 16;
    }
}

/// [`exp`] of 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(C[7]);
    for &c in C[..7].iter().rev() {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let n = _mm256_cvtps_epi32(n);
    let a = _mm256_srai_epi32::<1>(n);
    let b = _mm256_sub_epi32(n, a);
    let bias = _mm256_set1_epi32(127);
    let pa = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(a, bias)));
    let pb = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(b, bias)));
    _mm256_blendv_ps(_mm256_mul_ps(_mm256_mul_ps(p, pa), pb), x, nan)
}

/// [`Op`] on 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn op8(op: Op, x: __m256, y: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let sigmoid = |v: __m256| {
        _mm256_div_ps(
            one,
            _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))),
        )
    };
    match op {
        Op::Exp => exp8(x),
        Op::Sigmoid => sigmoid(x),
        Op::Silu => _mm256_mul_ps(x, sigmoid(x)),
        Op::SiluTimes => _mm256_mul_ps(_mm256_mul_ps(x, sigmoid(x)), y),
        Op::TimesSigmoid => _mm256_mul_ps(x, sigmoid(y)),
    }
}

/// # Safety
/// AVX2 and FMA; `y` is empty or as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map8(x: &mut [f32], y: &[f32], op: Op) {
    let two = !y.is_empty();
    let body = x.len() / 8 * 8;
    for i in (0..body).step_by(8) {
        // SAFETY: values i..i + 8 of `x` (and of `y`, as long).
        unsafe {
            let xv = _mm256_loadu_ps(x.as_ptr().add(i));
            let yv = if two {
                _mm256_loadu_ps(y.as_ptr().add(i))
            } else {
                _mm256_setzero_ps()
            };
            _mm256_storeu_ps(x.as_mut_ptr().add(i), op8(op, xv, yv));
        }
    }
    map_scalar(&mut x[body..], if two { &y[body..] } else { &[] }, op);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `got` and the f64 `want` rounded to f32.
    fn ulps(got: f32, want: f64) -> u32 {
        let w = want as f32;
        if got == w {
            return 0;
        }
        (got.to_bits() as i64 - w.to_bits() as i64).unsigned_abs() as u32
    }

    /// Every value of a dense sweep over [−110, 95] (finer near 0), the extremes and specials, in a scattered order.
    fn sweep() -> Vec<f32> {
        let mut v: Vec<f32> = (0..400_000)
            .map(|i| -110.0 + 205.0 * i as f32 / 400_000.0)
            .collect();
        v.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 1e-4));
        v.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            88.72283,
            88.72284,
            88.7229,
            -87.33654,
            -103.27893,
            -103.972,
            -104.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        // A fixed shuffle so that neighbours land in different lanes and tails.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..v.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            v.swap(i, (s % (i as u64 + 1)) as usize);
        }
        v
    }

    #[test]
    fn exp_is_within_two_ulps_of_f64_and_right_at_the_edges() {
        let mut worst = 0;
        for x in sweep() {
            let got = exp(x);
            let want = (x as f64).exp();
            if x.is_nan() {
                assert!(got.is_nan());
            } else if want < f32::MIN_POSITIVE as f64 {
                // Subnormal results: within one subnormal step.
                assert!(
                    (got as f64 - want).abs() <= 2f64.powi(-149),
                    "exp({x}) = {got}, want {want}"
                );
            } else {
                let u = ulps(got, want);
                assert!(u <= 2, "exp({x}) = {got}, want {want} ({u} ulps)");
                worst = worst.max(u);
            }
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-200.0), 0.0);
        eprintln!("exp: worst {worst} ulps");
    }

    #[test]
    fn sigmoid_and_silu_follow_their_definitions() {
        for x in sweep() {
            let s = 1.0 / (1.0 + (-(x as f64)).exp());
            if x.is_nan() {
                assert!(sigmoid(x).is_nan() && silu(x).is_nan());
                continue;
            }
            // Below about −88.7, e^−x overflows and the sigmoid reads 0 (as with the C library's expf).
            assert!(
                (sigmoid(x) as f64 - s).abs() <= 3e-7 * s.max(1e-30),
                "sigmoid({x})"
            );
            let want = x as f64 * s;
            if x.is_finite() {
                assert!(
                    (silu(x) as f64 - want).abs() <= 3e-7 * want.abs() + 1e-35,
                    "silu({x}) = {}, want {want}",
                    silu(x)
                );
            }
        }
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(silu(-200.0), -0.0);
    }

    /// Each vector form of the slice ops against the scalar function value by value, bit for bit, on every length
    /// up to 40 and at every offset (so each value is met in the vector body and in a tail), on every vector form
    /// this processor has.
    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "the vector forms are x86-64 code"
    )]
    fn the_slice_forms_give_the_scalar_bits_at_any_length_and_offset() {
        let xs = sweep();
        let ys: Vec<f32> = xs.iter().rev().copied().collect();
        type Form = fn(&mut [f32], &[f32], Op);
        let mut forms: Vec<(&str, Form)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512 F is present; the test passes `y` as long as `x` or empty.
                forms.push(("avx512", |x, y, op| unsafe { map16(x, y, op) }));
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: AVX2 and FMA are present; as above.
                forms.push(("avx2", |x, y, op| unsafe { map8(x, y, op) }));
            }
        }
        if forms.is_empty() {
            eprintln!("skipped: this processor has neither AVX-512 F nor AVX2 with FMA");
            return;
        }
        eprintln!("forms: {:?}", forms.iter().map(|f| f.0).collect::<Vec<_>>());
        let ops = [
            (Op::Exp, false),
            (Op::Sigmoid, false),
            (Op::Silu, false),
            (Op::SiluTimes, true),
            (Op::TimesSigmoid, true),
        ];
        for (name, form) in &forms {
            for &(op, two) in &ops {
                // The whole sweep in one call.
                let mut got = xs.clone();
                form(&mut got, if two { &ys } else { &[] }, op);
                for (i, (&g, &x)) in got.iter().zip(&xs).enumerate() {
                    let want = op.scalar(x, ys[i]);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{name}: op on {x} (and {}) gave {g}, the scalar {want}",
                        ys[i]
                    );
                }
                // Short slices at every offset.
                for len in 0..40 {
                    for off in 0..17 {
                        let mut got = xs[off..off + len].to_vec();
                        form(&mut got, if two { &ys[off..off + len] } else { &[] }, op);
                        for (j, &g) in got.iter().enumerate() {
                            let want = op.scalar(xs[off + j], ys[off + j]);
                            assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_public_slice_calls_match_the_scalar_functions() {
        let xs: Vec<f32> = (0..101).map(|i| (i as f32 - 50.0) * 0.37).collect();
        let ys: Vec<f32> = xs.iter().map(|v| v * -0.5 + 0.25).collect();
        let run = |f: &dyn Fn(&mut [f32])| {
            let mut v = xs.clone();
            f(&mut v);
            v
        };
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let each = |f: &dyn Fn(usize) -> f32| bits((0..xs.len()).map(f).collect());
        assert_eq!(bits(run(&exp_in_place)), each(&|i| exp(xs[i])));
        assert_eq!(bits(run(&sigmoid_in_place)), each(&|i| sigmoid(xs[i])));
        assert_eq!(bits(run(&silu_in_place)), each(&|i| silu(xs[i])));
        assert_eq!(
            bits(run(&|v| silu_times(v, &ys))),
            each(&|i| silu(xs[i]) * ys[i])
        );
        assert_eq!(
            bits(run(&|v| times_sigmoid(v, &ys))),
            each(&|i| xs[i] * sigmoid(ys[i]))
        );
    }
}

//! The projection GEMMs: `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and
//! accumulation, `beta` 0 or 1 (1 accumulates into the residual), through `cublasGemmEx` with
//! `CUBLAS_GEMM_DEFAULT`: bf16 weights on tensor cores, and the f32 weights of `Precision::F32` with
//! `CUBLAS_COMPUTE_32F_PEDANTIC` (never TF32).
//!
//! The half precision's projections ([`W::Half`]): f16 weights scaled by a power of two and f16 inputs (a residual
//! projection's scaled by another), `CUBLAS_COMPUTE_32F` on tensor cores (f32 accumulation), alpha undoing both.
//!
//! A per-shape cuBLASLt autotuner was measured against this and removed (H200, 2026-11-30): at the System One token
//! counts no candidate beat GemmEx by more than 2% on any 0.8B projection, and tuning cost 5–50 ms per new shape on a
//! server's first requests (docs/benchmarks/history/cuda-notes-2026-11-30.md).
//!
//! A bf16 product of at most [`GEMV_ROWS`] rows (decode) runs the `gemv_bf16` kernel instead: every weight row
//! read once, 16 bytes per lane, at the memory bandwidth where cuBLAS's kernels for so few rows are not; the sums
//! are in another order, so results differ from the GEMM's by f32 rounding.
//!
//! Batch invariance (`CudaModel::set_batch_invariant`, `--gpu-batch-invariant`): the `*_as` functions with
//! `invariant` set run every product of more than one row through [`crate::gemm_lt`]'s pinned cuBLASLt algorithm
//! (one per shape for every T, split-K off) and never the GEMV, so a row's sums do not depend on the rows stacked
//! with it.
//!
//! Column-major view (cuBLAS's): `y_cm[N, T] (ld ldy) = op(w_cm)[N, K] · x_cm[K, T]`, where `w_cm` is
//! `[K, N]` (ld K) transposed and `x_cm` is `[K, T]` (ld K).

use cudarc::cublas::{result as blas_result, sys as blas_sys};

use crate::launch;
use crate::ops::W;
use crate::runtime::{cfg, Gpu};
use crate::CudaError;

/// The most x rows the `gemv_bf16` kernel takes (`GEMV_ROWS` in decode.cu).
pub const GEMV_ROWS: usize = 8;

/// Whether `gemv_bf16` takes x (row stride `ldx`) and w (row stride `ldw`) over K: 16-byte loads need K and both
/// strides multiples of 8 bf16 and both base addresses 16-byte aligned.
fn gemv_fits(x: u64, ldx: usize, k: usize, w: u64, ldw: usize) -> bool {
    k.is_multiple_of(8)
        && ldx.is_multiple_of(8)
        && ldw.is_multiple_of(8)
        && x.is_multiple_of(16)
        && w.is_multiple_of(16)
}

/// `gemv_bf16`: y[r, n] = Σ_{e < group} x[r·group + e] · w[n]ᵀ + beta · y[r, n] over `rows` x rows.
fn gemv(
    g: &Gpu,
    (x, ldx, rows, group): (u64, usize, usize, usize),
    k: usize,
    (w, ldw, n): (u64, usize, usize),
    (y, ldy): (u64, usize),
    beta: f32,
) -> Result<(), CudaError> {
    let wpr = gemv_wpr(n, k);
    let f = &g.k.gemv_bf16[usize::from(rows > 2)];
    crate::launch_pdl!(g, *f, cfg((n.div_ceil(8 / wpr) as u32, 1), 256, 0);
        x, ldx as i32, rows as i32, group as i32, k as i32, w, ldw as i32, n as i32, y, ldy as i32, beta,
        wpr as i32)
}

/// The few-row GEMV over f16 x and an f16 weight scaled by 2^`shift` ([`W::Half`]): y[r, n] = 2^-shift ·
/// x[r] · w[n]ᵀ + beta · y[r, n].
fn gemv_half(
    g: &Gpu,
    (x, ldx, rows): (u64, usize, usize),
    k: usize,
    (w, ldw, n, shift): (u64, usize, usize, i32),
    (y, ldy): (u64, usize),
    beta: f32,
) -> Result<(), CudaError> {
    let wpr = gemv_wpr(n, k);
    let f = &g.k.gemv_half[usize::from(rows > 2)];
    crate::launch_pdl!(g, *f, cfg((n.div_ceil(8 / wpr) as u32, 1), 256, 0);
        x, ldx as i32, rows as i32, k as i32, w, ldw as i32, n as i32, y, ldy as i32, beta, wpr as i32,
        half_alpha(shift))
}

/// A weight matrix's values as [`W::Half`] stores them: f16 bits of each value times 2^`shift` (round to nearest
/// even), `shift` putting the largest |value| in [2^14, 2^15) (0 for an all-zero or non-finite matrix). f16 then
/// holds every bf16 value within 2^31 of the largest exactly (bf16's 8 significant bits fit f16's 11, down into its
/// subnormals), and rounds the smaller ones by at most 2^-25 after scaling, 2^-39 of the largest. → (bits, shift)
pub fn half_scaled(v: &[f32]) -> (Vec<u16>, i32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let shift = if !(max.is_finite() && max > 0.0) {
        0
    } else if max >= f32::MIN_POSITIVE {
        // The exponent of a normal f32, exactly.
        14 - (((max.to_bits() >> 23) & 0xff) as i32 - 127)
    } else {
        // A matrix of subnormals: kept finite (2^120 · 2^-149 is about 2^-29) and its alpha normal.
        120
    };
    let s = 2f32.powi(shift);
    let bits = v
        .iter()
        .map(|x| half::f16::from_f32(x * s).to_bits())
        .collect();
    (bits, shift)
}

/// 2^-`shift`: what a product with a [`W::Half`] weight is multiplied by (exact).
pub fn half_alpha(shift: i32) -> f32 {
    2f32.powi(-shift)
}

/// Warps per weight row of the few-row GEMV: enough warps in all (about 4096) to keep every load slot busy where N is
/// small, each with at least one 256-value slice of K.
fn gemv_wpr(n: usize, k: usize) -> usize {
    let wpr = (4096 / n.max(1)).clamp(1, 8).min((k / 256).max(1));
    1usize << wpr.ilog2()
}

/// Decode's norm and input projection in one launch, for one token row: `y[n] = Σ plane(rms_norm(x) · gain) · w[n]ᵀ`
/// over `planes` bf16 planes of the normed row (1: it rounded to bf16; 2: its hi and lo planes, split precision).
/// `x` [K] f32, `w` [N, K] bf16 (row stride `ldw`), `y` [N]; or `w` a [`W::Half`] weight and the normed row
/// rounded to f16 (one plane). → false, with nothing launched, where the GEMV does not
/// take `w` (the caller then runs the norm and the projection apart).
pub fn gemv_norm(
    g: &Gpu,
    (x, gain, eps): (u64, u64, f32),
    planes: usize,
    k: usize,
    (w, ldw): (W, usize),
    n: usize,
    y: u64,
) -> Result<bool, CudaError> {
    if let W::Half { w: wp, shift } = w {
        let smem = 2 * k;
        if planes != 1 || !gemv_fits(0, k, k, wp, ldw) || smem > 48 * 1024 || n == 0 {
            return Ok(false);
        }
        let wpr = gemv_wpr(n, k);
        launch!(g, g.k.gemv_norm_half, cfg((n.div_ceil(8 / wpr) as u32, 1), 256, smem as u32);
            x, gain, eps, k as i32, wp, ldw as i32, n as i32, y, wpr as i32, half_alpha(shift))?;
        return Ok(true);
    }
    let W::Bf16(wp) = w else {
        return Ok(false);
    };
    let smem = 2 * planes * k;
    if !(1..=2).contains(&planes) || !gemv_fits(0, k, k, wp, ldw) || smem > 48 * 1024 || n == 0 {
        return Ok(false);
    }
    let wpr = gemv_wpr(n, k);
    launch!(g, g.k.gemv_norm_bf16, cfg((n.div_ceil(8 / wpr) as u32, 1), 256, smem as u32);
        x, gain, eps, k as i32, planes as i32, wp, ldw as i32, n as i32, y, wpr as i32)?;
    Ok(true)
}

/// One token row's two bf16 planes (consecutive rows of x, row stride K), their products summed into one output row:
/// `y = (x₀ + x₁) · wᵀ + beta · y` (decode's residual projection in split precision, accumulated into the residual
/// directly). → false, with nothing launched, where the GEMV does not take it.
pub fn gemv_planes(
    g: &Gpu,
    x: u64,
    k: usize,
    (w, ldw): (W, usize),
    n: usize,
    y: u64,
    beta: f32,
) -> Result<bool, CudaError> {
    let W::Bf16(wp) = w else {
        return Ok(false);
    };
    if !gemv_fits(x, k, k, wp, ldw) {
        return Ok(false);
    }
    gemv(g, (x, k, 2, 2), k, (wp, ldw, n), (y, n), beta)?;
    Ok(true)
}

/// [`gemm_ld`] for a split-precision input: row r of x holds its hi and lo bf16 planes side by side (`[hi | lo]`,
/// K values each, row stride `ldx`) and `w` [N, K] multiplies their sum: y = (hi + lo) · wᵀ + beta · y. A few rows
/// (decode) read w's first K columns once; otherwise one GEMM over 2K against the weight stored twice (`[W | W]`,
/// row stride `ldw` at least 2K).
pub fn gemm_split(
    g: &Gpu,
    x: (u64, usize),
    t: usize,
    k: usize,
    w: (W, usize),
    n: usize,
    y: (u64, usize),
    beta: f32,
) -> Result<(), CudaError> {
    gemm_split_as(g, false, x, t, k, w, n, y, beta)
}

/// [`gemm_split`], batch-invariant when `invariant` (module docs: no GEMV, the pinned algorithm).
pub fn gemm_split_as(
    g: &Gpu,
    invariant: bool,
    (x, ldx): (u64, usize),
    t: usize,
    k: usize,
    (w, ldw): (W, usize),
    n: usize,
    (y, ldy): (u64, usize),
    beta: f32,
) -> Result<(), CudaError> {
    if let W::Half { .. } = w {
        return Err(CudaError::Unsupported(
            "an f16 weight on split inputs (the half precision multiplies one f16 plane)".into(),
        ));
    }
    if let W::Bf16(wp) = w {
        if !invariant
            && t > 0
            && 2 * t <= GEMV_ROWS
            && ldx == 2 * k
            && ldy >= n
            && gemv_fits(x, k, k, wp, ldw)
        {
            return gemv(g, (x, k, 2 * t, 2), k, (wp, ldw, n), (y, ldy), beta);
        }
    }
    gemm_ld_as(g, invariant, x, ldx, t, 2 * k, w, ldw, n, y, ldy, beta)
}

/// The body of [`Gpu::gemm`]: `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, x in w's dtype.
pub fn gemm(
    g: &Gpu,
    x: u64,
    t: usize,
    k: usize,
    w: W,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    gemm_ld(g, x, k, t, k, w, k, n, y, ldy, beta)
}

/// [`gemm`] with row strides (elements) for x (`ldx`) and w (`ldw`), each at least K.
pub fn gemm_ld(
    g: &Gpu,
    x: u64,
    ldx: usize,
    t: usize,
    k: usize,
    w: W,
    ldw: usize,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    gemm_ld_as(g, false, x, ldx, t, k, w, ldw, n, y, ldy, beta)
}

/// [`gemm_ld`], batch-invariant when `invariant` (module docs: no GEMV, the pinned algorithm; GemmEx where
/// cuBLASLt has none).
pub fn gemm_ld_as(
    g: &Gpu,
    invariant: bool,
    x: u64,
    ldx: usize,
    t: usize,
    k: usize,
    w: W,
    ldw: usize,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    if t == 0 || n == 0 {
        return Ok(());
    }
    if ldx < k || ldw < k || ldy < n {
        return Err(CudaError::Unsupported(format!(
            "gemm strides: ldx {ldx}, ldw {ldw} below K {k}, or ldy {ldy} below N {n}"
        )));
    }
    if invariant {
        if crate::gemm_lt::gemm_pinned(g, (x, ldx), t, k, (w, ldw), n, (y, ldy), beta)? {
            return Ok(());
        }
    } else if let W::Bf16(wp) = w {
        if t <= GEMV_ROWS && gemv_fits(x, ldx, k, wp, ldw) {
            return gemv(g, (x, ldx, t, 1), k, (wp, ldw, n), (y, ldy), beta);
        }
    } else if let W::Half { w: wp, shift } = w {
        if t <= GEMV_ROWS && gemv_fits(x, ldx, k, wp, ldw) {
            return gemv_half(g, (x, ldx, t), k, (wp, ldw, n, shift), (y, ldy), beta);
        }
    }
    use blas_sys::cublasComputeType_t as C;
    let alpha = match w {
        W::Half { shift, .. } => half_alpha(shift),
        _ => 1.0f32,
    };
    let (w, dt, compute) = match w {
        W::Bf16(p) => (
            p,
            blas_sys::cudaDataType::CUDA_R_16BF,
            C::CUBLAS_COMPUTE_32F,
        ),
        // Pedantic: plain f32 FMAs even where TF32 is allowed by the environment.
        W::F32(p) => (
            p,
            blas_sys::cudaDataType::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F_PEDANTIC,
        ),
        W::Half { w, .. } => (w, blas_sys::cudaDataType::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
        W::Pq2 { .. } | W::Q8 { .. } | W::F16(_) | W::F32Rows(_) => {
            return Err(CudaError::Unsupported(
                "a block-format weight in a float GEMM (crate::qgemm multiplies those)".into(),
            ))
        }
    };
    // SAFETY: pointers are live device buffers of the stated shapes.
    unsafe {
        blas_result::gemm_ex(
            *g.blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            n as i32,
            t as i32,
            k as i32,
            &alpha as *const f32 as *const _,
            w as *const _,
            dt,
            ldw as i32,
            x as *const _,
            dt,
            ldx as i32,
            &beta as *const f32 as *const _,
            y as *mut _,
            blas_sys::cudaDataType::CUDA_R_32F,
            ldy as i32,
            compute,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|err| CudaError::Blas { op: "gemm", err })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bf16 value within 2^31 of the largest comes back exactly from its f16 form and the shift; the largest
    /// lands in [2^14, 2^15); smaller ones within 2^-39 of the largest.
    #[test]
    fn half_scaled_holds_bf16_weights() {
        for (max_exp, span) in [(0i32, 20i32), (-7, 30), (8, 31), (-30, 10), (20, 40)] {
            let mut v = Vec::new();
            let mut seed = 0x9e37_79b9u32.wrapping_mul((max_exp + 77) as u32);
            for i in 0..4096 {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                // A bf16 mantissa (8 significant bits) at an exponent up to `span` below the top.
                let m = 128 + (seed & 127);
                let e = max_exp - (seed >> 8) as i32 % (span + 1);
                let x = m as f32 / 128.0 * 2f32.powi(e);
                v.push(if i % 2 == 0 { x } else { -x });
            }
            v.push(0.0);
            let max = v.iter().fold(0f32, |a, x| a.max(x.abs()));
            let (bits, shift) = half_scaled(&v);
            let at = v.iter().position(|x| x.abs() == max).expect("the largest");
            let top = half::f16::from_bits(bits[at]).to_f32().abs();
            assert!(
                (16384.0..32768.0).contains(&top),
                "max_exp {max_exp}: largest stored as {top}"
            );
            for (x, b) in v.iter().zip(&bits) {
                let back = half::f16::from_bits(*b).to_f32() * half_alpha(shift);
                if x.abs() >= max * 2f32.powi(-31) {
                    assert_eq!(back, *x, "max_exp {max_exp}, shift {shift}");
                } else {
                    assert!(
                        (back - x).abs() <= max * 2f32.powi(-39),
                        "max_exp {max_exp}: {x} -> {back}"
                    );
                }
            }
        }
        assert_eq!(half_scaled(&[0.0, 0.0]), (vec![0, 0], 0));
    }
}

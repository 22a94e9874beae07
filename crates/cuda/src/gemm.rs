//! The projection GEMMs: `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and
//! accumulation, `beta` 0 or 1 (1 accumulates into the residual), through `cublasGemmEx` with
//! `CUBLAS_GEMM_DEFAULT`: bf16 weights on tensor cores, and the f32 weights of `Precision::F32` with
//! `CUBLAS_COMPUTE_32F_PEDANTIC` (never TF32).
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

/// Warps per weight row of the few-row GEMV: enough warps in all (about 4096) to keep every load slot busy where N is
/// small, each with at least one 256-value slice of K.
fn gemv_wpr(n: usize, k: usize) -> usize {
    let wpr = (4096 / n.max(1)).clamp(1, 8).min((k / 256).max(1));
    1usize << wpr.ilog2()
}

/// Decode's norm and input projection in one launch, for one token row: `y[n] = Σ plane(rms_norm(x) · gain) · w[n]ᵀ`
/// over `planes` bf16 planes of the normed row (1: it rounded to bf16; 2: its hi and lo planes, split precision).
/// `x` [K] f32, `w` [N, K] bf16 (row stride `ldw`), `y` [N]. → false, with nothing launched, where the GEMV does not
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
    }
    use blas_sys::cublasComputeType_t as C;
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
        W::Pq2 { .. } | W::Q8 { .. } | W::F16(_) | W::F32Rows(_) => {
            return Err(CudaError::Unsupported(
                "a block-format weight in a float GEMM (crate::qgemm multiplies those)".into(),
            ))
        }
    };
    let alpha = 1.0f32;
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

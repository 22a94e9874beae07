//! The projection GEMMs: `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and
//! accumulation, `beta` 0 or 1 (1 accumulates into the residual), through `cublasGemmEx` with
//! `CUBLAS_GEMM_DEFAULT`: bf16 weights on tensor cores, and the f32 weights of `Precision::F32` with
//! `CUBLAS_COMPUTE_32F_PEDANTIC` (never TF32).
//!
//! A per-shape cuBLASLt autotuner was measured against this and removed (H200, 2026-11-30): at the System One token
//! counts no candidate beat GemmEx by more than 2% on any 0.8B projection, and tuning cost 5–50 ms per new shape on a
//! server's first requests (docs/benchmarks/history/cuda-notes-2026-11-30.md).
//!
//! Column-major view (cuBLAS's): `y_cm[N, T] (ld ldy) = op(w_cm)[N, K] · x_cm[K, T]`, where `w_cm` is
//! `[K, N]` (ld K) transposed and `x_cm` is `[K, T]` (ld K).

use cudarc::cublas::{result as blas_result, sys as blas_sys};

use crate::ops::W;
use crate::runtime::Gpu;
use crate::CudaError;

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
    if t == 0 || n == 0 {
        return Ok(());
    }
    if ldx < k || ldw < k || ldy < n {
        return Err(CudaError::Unsupported(format!(
            "gemm strides: ldx {ldx}, ldw {ldw} below K {k}, or ldy {ldy} below N {n}"
        )));
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

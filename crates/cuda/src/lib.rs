//! The CUDA backend of onepass.
//!
//! Why this crate exists: decisions on a GPU. It holds the CUDA C kernels (compiled at run time by
//! NVRTC for the device's architecture and cached on disk, [`runtime`]), cuBLAS bf16 GEMMs with
//! f32 accumulation, and [`CudaModel`]: the model crate's op set as launches, over the weights it uploads by role
//! (`Model::linear`, `Model::param`), with a sequence state ([`CudaState`]: KV caches, conv and recurrent state) that
//! lives on the device and can be forked there.
//!
//! CUDA is loaded dynamically: this crate builds, and everything else in the workspace runs, on
//! machines with no CUDA at all; [`available`] says whether a usable GPU is present.
//!
//! Dtypes: weights bf16 on the device; GEMM inputs bf16, GEMM outputs and everything else
//! (residual stream, norms, conv, gated delta rule and its state, attention and its KV cache) f32.

pub mod attn_tc;
pub mod gdn_prep_tc;
pub mod gdn_tc;
pub mod gemm;
pub mod gemm_lt;
pub mod model;
pub mod nvrtc;
pub mod ops;
pub mod options;
pub mod pdl;
pub mod qgemm;
pub mod runtime;
pub mod sample;

pub use model::{
    CudaHidden, CudaModel, CudaState, Precision, Projection, SplitGemms, SplitGemmsError,
};
pub use options::{AttnKernels, CudaOptions, GdnKernels};
pub use runtime::{Arith, AttnArith, Gpu, TcArith, TcArithError};

/// Errors of the CUDA backend. Messages name the op, library or shape at fault.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("CUDA driver: {op}: {err}")]
    Driver {
        op: &'static str,
        err: cudarc::driver::DriverError,
    },
    #[error("cuBLAS: {op}: {err}")]
    Blas {
        op: &'static str,
        err: cudarc::cublas::result::CublasError,
    },
    #[error("NVRTC compiling the onepass kernels for {arch}: {msg}")]
    Compile { arch: String, msg: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("GPU memory budget: {what} needs {need} bytes, {live} of {budget} in use")]
    Budget {
        what: String,
        need: usize,
        live: usize,
        budget: usize,
    },
    #[error(transparent)]
    Model(#[from] onepass_model::ModelError),
}

pub(crate) trait DrvCtx<T> {
    fn op(self, op: &'static str) -> Result<T, CudaError>;
}

impl<T> DrvCtx<T> for Result<T, cudarc::driver::DriverError> {
    fn op(self, op: &'static str) -> Result<T, CudaError> {
        self.map_err(|err| CudaError::Driver { op, err })
    }
}

/// Whether the CUDA driver, NVRTC and cuBLAS libraries load and at least one GPU is present.
/// Never panics (the libraries are probed before any call into them).
pub fn available() -> bool {
    probe().is_ok()
}

/// Like [`available`], with the reason when not.
pub fn probe() -> Result<usize, CudaError> {
    // SAFETY: these only try to dlopen the libraries.
    let (drv, rtc, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !drv {
        return Err(CudaError::Unavailable(
            "libcuda (the NVIDIA driver) was not found".into(),
        ));
    }
    if !rtc {
        return Err(CudaError::Unavailable(
            "libnvrtc was not found (set LD_LIBRARY_PATH to CUDA's lib64)".into(),
        ));
    }
    if !blas {
        return Err(CudaError::Unavailable(
            "libcublas was not found (set LD_LIBRARY_PATH to CUDA's lib64)".into(),
        ));
    }
    let n = cudarc::driver::result::init()
        .and_then(|_| cudarc::driver::result::device::get_count())
        .map_err(|e| CudaError::Unavailable(format!("driver init: {e}")))?;
    if n <= 0 {
        return Err(CudaError::Unavailable("no CUDA device".into()));
    }
    Ok(n as usize)
}

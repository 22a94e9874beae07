//! Programmatic dependent launch (Hopper and later): a kernel launched with
//! `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` may start while the kernel before it in the stream is
//! finishing (captured into a graph as a programmatic edge), so that its launch, its block scheduling and what it
//! reads before it waits (a GEMV's first weight tile) overlap the tail of the one before. Such a kernel calls
//! `pdl_wait()` (kernels.cu: `griddepcontrol.wait`, which returns once the kernels it depends on have completed and
//! their writes are visible) before it reads what an earlier kernel wrote and before its first write, in every
//! block; a kernel that does not is launched with [`crate::launch!`]. [`crate::launch_pdl!`] launches the kernels
//! that wait, with the attribute where [`crate::Gpu::pdl`] is on, else as `launch!` does.

use std::ffi::c_void;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, LaunchConfig};

use crate::runtime::Gpu;
use crate::CudaError;

/// Launches `f` on the GPU's stream with the programmatic-serialization attribute.
///
/// # Safety
/// `args` holds one pointer per kernel parameter, each to a live value of the parameter's type, and the kernel
/// calls `pdl_wait()` before any dependent access in every block (this module's doc).
pub unsafe fn launch_ex(
    g: &Gpu,
    f: &CudaFunction,
    c: LaunchConfig,
    args: &mut [*mut c_void],
    op: &'static str,
) -> Result<(), CudaError> {
    let err = |err| CudaError::Driver { op, err };
    g.ctx.bind_to_thread().map_err(err)?;
    // SAFETY: a zeroed attribute is a valid value of the C struct; id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let lc = sys::CUlaunchConfig {
        gridDimX: c.grid_dim.0,
        gridDimY: c.grid_dim.1,
        gridDimZ: c.grid_dim.2,
        blockDimX: c.block_dim.0,
        blockDimY: c.block_dim.1,
        blockDimZ: c.block_dim.2,
        sharedMemBytes: c.shared_mem_bytes,
        hStream: g.stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the caller's contract (argument pointers live and typed as the kernel's parameters).
    unsafe {
        sys::cuLaunchKernelEx(
            &lc,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(err)
}

/// Launches a kernel that calls `pdl_wait()` first ([`crate::pdl`]): with programmatic serialization where
/// [`Gpu::pdl`] is on, else as [`crate::launch!`]. Arguments as `launch!`'s.
#[macro_export]
macro_rules! launch_pdl {
    ($gpu:expr, $func:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        let gpu: &$crate::runtime::Gpu = $gpu;
        if gpu.pdl() {
            let mut args: Vec<*mut std::ffi::c_void> = Vec::new();
            // Each value stays alive (shadowed, not dropped) until the launch below.
            $( let v = $arg; args.push((&v as *const _) as *mut std::ffi::c_void); )*
            let lc: $crate::runtime::LaunchConfig = $cfg;
            // SAFETY: the arguments match the kernel's parameter list in its .cu source, and the kernel waits
            // (pdl_wait) before its dependent accesses.
            unsafe { $crate::pdl::launch_ex(gpu, &$func, lc, &mut args, stringify!($func)) }
        } else {
            $crate::launch!(gpu, $func, $cfg; $($arg),*)
        }
    }};
}

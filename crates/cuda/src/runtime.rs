//! One GPU: context, stream, cuBLAS handle, and the onepass kernels.
//!
//! The kernels are compiled by NVRTC ([`crate::nvrtc`]: the source, its programs, the compile and the cache) and
//! loaded here, once when the GPU opens; the fallback kernels ([`Fallbacks`]) at their first use. Everything runs on
//! one stream; the context's per-buffer event tracking is switched off (one stream needs none), so buffers are passed
//! to kernels as raw device addresses.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
pub use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

pub use crate::nvrtc::{
    arch_suffix, compile_program, images_for, is_fallback, program_of, program_source, Image,
    KERNELS_CU, PROGRAMS,
};
use crate::{CudaError, DrvCtx};

/// The kernels, loaded once when the [`Gpu`] opens (a launch never looks a kernel up by name).
pub struct Kernels {
    pub embed_gather: CudaFunction,
    pub rms_norm: CudaFunction,
    /// `rms_norm` with fewer values a lane in registers (more blocks a multiprocessor; the same bits).
    pub rms_norm_lean: CudaFunction,
    pub rms_norm_gated: CudaFunction,
    pub gdn_conv_prep: CudaFunction,
    pub gdn_conv_state: CudaFunction,
    pub gdn_step: CudaFunction,
    /// `gemv_bf16_2`, `gemv_bf16_8`: at most 2 and at most 8 x rows.
    pub gemv_bf16: [CudaFunction; 2],
    pub argmax_rows: CudaFunction,
    pub head_argmax_bf16: CudaFunction,
    pub gemv_norm_bf16: CudaFunction,
    /// `gemv_half_2`, `gemv_half_8`: the few-row GEMV over f16 x and weights (the half precision's input
    /// projections).
    pub gemv_half: [CudaFunction; 2],
    pub gemv_norm_half: CudaFunction,
    /// `gemv_{pq2,q8,f16,f32r}_{bf16,f32,split}_{1,8}` (quant.cu): [format][activation layout][more than one row].
    pub gemv_q: [[[CudaFunction; 2]; 3]; 4],
    /// `gemv_{pq2,q8}_wide_{bf16,f32,split}` (quant.cu): the one-row GEMV with x in registers, [format][activation
    /// layout].
    pub gemv_q_wide: [[CudaFunction; 3]; 2],
    /// `rotate_row_norm` (quant.cu): a rotated pack's norm site for one row in one block.
    pub rotate_row_norm: CudaFunction,
    pub dequant_rows: CudaFunction,
    /// `qmma_quant` (qmma.cu): the activations of the int8 tensor-core GEMM, quantized to two byte planes.
    pub qmma_quant: CudaFunction,
    /// `qmma_pq2`, `qmma_pq2_16` (qmma.cu): PQ2_0's prefill GEMM on the int8 tensor cores in its two tile shapes
    /// (qgemm.rs's `QMMA_PQ2`, in that order).
    pub qmma_pq2: [CudaFunction; 2],
    /// `qwg_pq2` (qwgmma.cu): PQ2_0's prefill GEMM on Hopper's warpgroup mma; launched on compute capability 9.0
    /// only ([`Gpu::wgmma`]), where the kernels are compiled for sm_90a (elsewhere its body is a trap).
    pub qwg_pq2: CudaFunction,
    /// `qmma_q8` (qmma.cu): Q8_0's prefill GEMM on the int8 tensor cores.
    pub qmma_q8: CudaFunction,
    /// `qmma_split_sum` (qmma.cu): the partial sums of `qmma_q8` and `qwg_pq2` over runs of K, added up in a fixed
    /// order.
    pub qmma_split_sum: CudaFunction,
    pub hadamard_rows: CudaFunction,
    pub gated_norm_rotate: CudaFunction,
    pub attn_prep: CudaFunction,
    /// attn_prep writing f16 KV caches (for `attention_h`).
    pub attn_prep_h: CudaFunction,
    pub swiglu: CudaFunction,
    pub to_bf16: CudaFunction,
    pub rows_dot: CudaFunction,
    // fused.cu
    pub add2_rms_norm: CudaFunction,
    pub gdn_conv_prep_run: CudaFunction,
    pub spin_wait: CudaFunction,
    // The tensor-core files: one kernel per [`Arith`], indexed by `Arith as usize`.
    pub gdn_tc_prep: [CudaFunction; 2],
    /// `gdn_tc_prep8[_tf32]`: the pre-pass in blocks of 8 warps, two a multiprocessor.
    pub gdn_tc_prep8: [CudaFunction; 2],
    /// `gdn_tc_state_<BV>[_tf32]`, one per slice width of [`crate::gdn_tc::GDN_TC_SLICES`], in that order.
    pub gdn_tc_state: [[CudaFunction; 4]; 2],
    /// `gdn_tc_leaf_<BV>[_tf32]`, one per slice width of [`crate::gdn_tc::GDN_TC_LEAF_SLICES`], in that order.
    pub gdn_tc_leaf: [[CudaFunction; 3]; 2],
    /// `attention_tc`, `attention_tc_tf32`, `attention_bf`, `attention_bf1`, `attention_h` (f16 KV caches):
    /// indexed by `AttnArith as usize`.
    pub attention_tc: [CudaFunction; 5],
    pub attention_tc_combine: CudaFunction,
    /// sample.cu: sampled decoding's draw on the device.
    pub sample: crate::sample::SampleKernels,
}

/// The f32 SIMT kernels that only fallbacks and tests run (`GdnKernels::Simt`, `AttnKernels::Tiled`, attention
/// head dims the tensor-core kernels do not take): compiled and loaded on first use ([`Gpu::fallbacks`]), so that a first
/// load compiles only what the default path runs (they are the slowest to compile: [`PROGRAMS`]).
pub struct Fallbacks {
    pub gdn_wy_prep: CudaFunction,
    pub gdn_wy_state: CudaFunction,
    pub attention_tiled: CudaFunction,
}

/// How the gated-delta tensor-core kernels (`gdn_tc_prep`, `gdn_tc_state_*`) multiply; each has one kernel per
/// kind ([`Kernels`], indexed by `Arith as usize`). Attention has more kinds: [`AttnArith`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arith {
    /// 3xTF32: every f32 operand split into two TF32 halves and three products summed: f32 accuracy (the kernels
    /// match their f32 SIMT twins to rounding).
    #[default]
    X3 = 0,
    /// One TF32 product per step: operands rounded to 11 significant bits, f32 accumulation, a third of the
    /// products and none of the small halves' splits.
    Tf32 = 1,
}

/// How the tensor-core attention multiplies (`attention_tc*`, `attention_bf*`, `attention_h` in attn_tc.cu;
/// [`Kernels`], indexed by `AttnArith as usize`): the two TF32 forms of [`Arith`], or bf16 operands on the m16n8k16
/// bf16 mma, which does twice the work of a TF32 one per instruction, with each tile converted once per block; or
/// the KV cache itself in f16 and one f16 product ([`AttnArith::F16`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnArith {
    /// 3xTF32 ([`Arith::X3`]): f32 accuracy.
    #[default]
    X3 = 0,
    /// 1xTF32 ([`Arith::Tf32`]).
    Tf32 = 1,
    /// bf16x3: each operand split into two bf16 halves (hi + lo carries it to about 2^-17, as the split GEMMs
    /// carry their inputs), three products summed.
    Bf16x3 = 2,
    /// One bf16 product: operands rounded to 8 significant bits, f32 accumulation.
    Bf16 = 3,
    /// K and V cached in f16 (half the bytes of the f32 cache), one f16 product: operands rounded to 11 significant
    /// bits as 1xTF32 rounds them, f32 accumulation; the half precision's default (`attn=f16`). A property of the
    /// model's KV caches, so fixed at upload: a model whose caches are f16 runs attention this way whatever else is
    /// asked, one whose caches are f32 never ([`crate::CudaModel::set_tc_arith`]); the caches are f16 where this is
    /// the initial choice and the bounds of q, k and v known from the weights fit f16's range.
    F16 = 4,
}

impl AttnArith {
    /// The TF32 form of attention that matches `a`.
    const fn of(a: Arith) -> Self {
        match a {
            Arith::X3 => AttnArith::X3,
            Arith::Tf32 => AttnArith::Tf32,
        }
    }

    /// Its name in device descriptions.
    fn name(self) -> &'static str {
        match self {
            AttnArith::X3 => Arith::X3.name(),
            AttnArith::Tf32 => Arith::Tf32.name(),
            AttnArith::Bf16x3 => "bf16x3",
            AttnArith::Bf16 => "1xbf16",
            AttnArith::F16 => "1xf16 (f16 KV cache)",
        }
    }
}

/// How each tensor-core kernel multiplies: the WY pre-pass (`gdn_tc_prep`), the state pass (`gdn_tc_state_*`)
/// and attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcArith {
    pub prep: Arith,
    pub state: Arith,
    pub attn: AttnArith,
}

/// A kernel arithmetic spec [`TcArith::parse`] does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?}: expected 3xtf32, tf32, the kernels that run 1xTF32 (prep, state, attn, comma-separated), or \
     attn=3xtf32|tf32|bf16x3|bf16|f16"
)]
pub struct TcArithError(pub String);

impl TcArith {
    /// Every kernel the same way.
    pub const fn all(a: Arith) -> Self {
        TcArith {
            prep: a,
            state: a,
            attn: AttnArith::of(a),
        }
    }

    /// Reads `--gpu-kernels`, comma-separated items applied in order from every kernel in 3xTF32:
    /// `3xtf32` (or `none`) for every kernel in 3xTF32, `tf32` (or `all`) for every kernel in 1xTF32, a kernel that
    /// runs 1xTF32 (`prep`, `state`, `attn`), or attention's arithmetic by name (`attn=3xtf32`, `attn=tf32`,
    /// `attn=bf16x3`, `attn=bf16`, `attn=f16`).
    pub fn parse(spec: &str) -> Result<Self, TcArithError> {
        let mut t = TcArith::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "tf32" | "all" => t = TcArith::all(Arith::Tf32),
                "3xtf32" | "none" => t = TcArith::all(Arith::X3),
                "prep" => t.prep = Arith::Tf32,
                "state" => t.state = Arith::Tf32,
                "attn" | "attn=tf32" => t.attn = AttnArith::Tf32,
                "attn=3xtf32" => t.attn = AttnArith::X3,
                "attn=bf16x3" => t.attn = AttnArith::Bf16x3,
                "attn=bf16" => t.attn = AttnArith::Bf16,
                "attn=f16" => t.attn = AttnArith::F16,
                other => return Err(TcArithError(other.to_string())),
            }
        }
        Ok(t)
    }

    /// For a device description: "tensor-core kernels 3xTF32", "... 1xTF32", or each kernel's.
    pub fn describe(self) -> String {
        if self.prep == self.state && AttnArith::of(self.state) == self.attn {
            format!("tensor-core kernels {}", self.attn.name())
        } else {
            format!(
                "tensor-core kernels: pre-pass {}, state pass {}, attention {}",
                self.prep.name(),
                self.state.name(),
                self.attn.name()
            )
        }
    }
}

impl Arith {
    /// Its name in device descriptions.
    const fn name(self) -> &'static str {
        match self {
            Arith::X3 => "3xTF32",
            Arith::Tf32 => "1xTF32",
        }
    }

    /// Kernel name suffix.
    fn suffix(self) -> &'static str {
        match self {
            Arith::X3 => "",
            Arith::Tf32 => "_tf32",
        }
    }
}

/// Shared memory (bytes) the driver reserves for each resident block on compute capability 8.0 and later, beside its
/// dynamic shared memory: what [`Gpu::sm_smem`] must hold per block when several share a multiprocessor.
pub const BLOCK_RESERVED_SMEM: usize = 1024;

/// A device with the onepass kernels loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub k: Kernels,
    pub name: String,
    /// Largest dynamic shared memory one block may opt into (bytes).
    pub max_smem: usize,
    /// Shared memory of one multiprocessor (bytes), which the blocks resident on it share (each block also
    /// reserves [`BLOCK_RESERVED_SMEM`] of it).
    pub sm_smem: usize,
    /// Multiprocessors (grid sizing of the launchers).
    pub sms: usize,
    /// Rows one wave of the `rms_norm` kernel takes on the whole device ([`crate::ops::rms_norm`] runs
    /// `rms_norm_lean` past it).
    pub norm_wave_rows: usize,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// [`Gpu::fallbacks`], once loaded.
    fallbacks: std::sync::OnceLock<Fallbacks>,
    /// The batch-invariant GEMMs' cuBLASLt handle and pinned algorithms ([`crate::gemm_lt`]).
    pub(crate) pinned: crate::gemm_lt::Pinned,
    /// Programmatic dependent launch for the kernels that wait for it ([`crate::pdl`]); off until
    /// [`Gpu::set_pdl`] turns it on (compute capability 9.0 and later only).
    pdl: std::sync::atomic::AtomicBool,
    /// Off: PQ2_0's prefill GEMM keeps to the mma.sync kernels where the warpgroup one would run ([`Gpu::wgmma`]).
    wgmma_off: std::sync::atomic::AtomicBool,
}

/// Loads `programs` (indices into [`PROGRAMS`]) into `ctx`: → one slot per program, the loaded ones filled.
fn load_programs(
    ctx: &Arc<CudaContext>,
    (maj, min): (i32, i32),
    programs: &[usize],
    what: &str,
) -> Result<Vec<Option<Arc<CudaModule>>>, CudaError> {
    let mut out = vec![None; PROGRAMS.len()];
    for (&i, im) in programs.iter().zip(images_for(maj, min, programs, what)?) {
        let m = ctx
            .load_module(match im {
                Image::Cubin(b) => Ptx::from_binary(b),
                Image::Ptx(p) => Ptx::from_src(p),
            })
            .op("load module")?;
        out[i] = Some(m);
    }
    Ok(out)
}

/// Kernel `name` from the module of its program ([`program_of`]).
fn kernel(modules: &[Option<Arc<CudaModule>>], name: &str) -> Result<CudaFunction, CudaError> {
    program_of(name)
        .and_then(|i| modules[i].as_ref())
        .ok_or_else(|| CudaError::Unsupported(format!("kernel {name}: in no loaded program")))?
        .load_function(name)
        .op("load function")
}

/// A kernel whose dynamic shared memory may pass the 48 KB default: its limit raised to the device's opt-in
/// maximum `max_smem`, less the kernel's static shared memory (the opt-in maximum counts both).
fn big_smem(k: CudaFunction, max_smem: usize) -> Result<CudaFunction, CudaError> {
    let fixed = k
        .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        .op("static shared memory")?;
    k.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        (max_smem as i32 - fixed).max(0),
    )
    .op("shared memory limit")?;
    Ok(k)
}

/// [`big_smem`] for a kernel meant to run more than one block a multiprocessor: the whole carveout to shared
/// memory, so that the blocks' stages fit side by side.
fn big_smem_shared(k: CudaFunction, max_smem: usize) -> Result<CudaFunction, CudaError> {
    let k = big_smem(k, max_smem)?;
    k.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        100,
    )
    .op("shared memory carveout")?;
    Ok(k)
}

/// One kernel per slice width: `{name}_{bv}{suffix}` for each `bv` of `slices`, in that order, loaded by `load`.
fn per_slice<const N: usize>(
    slices: [usize; N],
    name: &str,
    suffix: &str,
    load: &dyn Fn(&str) -> Result<CudaFunction, CudaError>,
) -> Result<[CudaFunction; N], CudaError> {
    let v = slices
        .iter()
        .map(|bv| load(&format!("{name}_{bv}{suffix}")))
        .collect::<Result<Vec<_>, _>>()?;
    v.try_into()
        .map_err(|_| CudaError::Unsupported(format!("{name}: one kernel per slice")))
}

/// Keeps the device's default memory pool (where every `Gpu::alloc` comes from, stream-ordered) from handing freed
/// memory back to the driver at every synchronisation: its release threshold, 0 by default, raised to the maximum.
/// A request allocates its states and per-call buffers and frees them after its readout, which synchronises; with
/// the default threshold the next request maps that memory anew. The pool then holds up to the high-water mark of
/// what the process had allocated (as PyTorch's caching allocator does); `Gpu::open(_, false)` (`--gpu-release-memory`)
/// keeps the driver's default. Measured against `release` in one device session (run s12b, the first workload, one request at a time,
/// one process each): p50 4.88 ms kept against 4.53 released, inside the spread of that
/// session (4.53 to 4.98 ms across its runs); no gain was shown.
fn keep_pool(ctx: &Arc<CudaContext>) {
    if !ctx.has_async_alloc() {
        return;
    }
    let mut keep: u64 = u64::MAX;
    // SAFETY: the context's own device; CU_MEMPOOL_ATTR_RELEASE_THRESHOLD takes a cuuint64_t, which `keep` is.
    let r = unsafe {
        cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device()).and_then(|pool| {
            cudarc::driver::result::mem_pool::set_attribute(
                pool,
                cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        })
    };
    if let Err(e) = r {
        eprintln!(
            "onepass: the CUDA memory pool keeps releasing memory at every synchronisation ({e})"
        );
    }
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels; the memory pool keeps what it frees ([`Gpu::open`]).
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        Self::open(ordinal, true)
    }

    /// Opens device `ordinal` and loads the kernels. `keep_freed`: the device's memory pool keeps freed memory for
    /// the next allocation instead of handing it back to the driver at every synchronisation.
    pub fn open(ordinal: usize, keep_freed: bool) -> Result<Arc<Gpu>, CudaError> {
        let count = crate::probe()?;
        if ordinal >= count {
            return Err(CudaError::Unavailable(format!(
                "device {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).op("cuCtx create")?;
        // SAFETY: every buffer and kernel of this backend uses the one stream below.
        unsafe { ctx.disable_event_tracking() };
        if keep_freed {
            keep_pool(&ctx);
        }
        // A stream of our own: CUDA graphs cannot be captured on the legacy default stream.
        let stream = ctx.new_stream().op("create stream")?;
        let blas = CudaBlas::new(stream.clone()).map_err(|err| CudaError::Blas {
            op: "create handle",
            err,
        })?;
        let (maj, min) = ctx.compute_capability().op("compute capability")?;
        let eager: Vec<usize> = (0..PROGRAMS.len()).filter(|i| !is_fallback(*i)).collect();
        let modules = load_programs(&ctx, (maj, min), &eager, "CUDA kernels")?;
        let max_smem = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .op("shared memory limit")? as usize;
        let sm_smem = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
            .op("shared memory per multiprocessor")? as usize;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .op("multiprocessor count")?
            .max(1) as usize;
        let f = |name: &str| kernel(&modules, name);
        let big = |name: &str| big_smem(f(name)?, max_smem);
        let (x3, tf) = (Arith::X3.suffix(), Arith::Tf32.suffix());
        let (states, leaves) = (
            crate::gdn_tc::GDN_TC_SLICES,
            crate::gdn_tc::GDN_TC_LEAF_SLICES,
        );
        // The kernels loaded by their field's name, then the per-arithmetic and per-slice tables.
        macro_rules! by_name {
            ($($name:ident),* ; $($rest:tt)*) => {
                Kernels { $($name: f(stringify!($name))?,)* $($rest)* }
            };
        }
        let k = by_name! {
            embed_gather, rms_norm, rms_norm_lean, rms_norm_gated, gdn_conv_prep, gdn_conv_state, gdn_step, argmax_rows,
            head_argmax_bf16, gemv_norm_bf16, gemv_norm_half, attn_prep, attn_prep_h, swiglu, to_bf16, rows_dot,
            add2_rms_norm, gdn_conv_prep_run, spin_wait, dequant_rows, qmma_quant, hadamard_rows, gated_norm_rotate,
            qmma_split_sum;
            qmma_pq2: [big_smem_shared(f("qmma_pq2")?, max_smem)?, big("qmma_pq2_16")?],
            qmma_q8: big("qmma_q8")?,
            qwg_pq2: big_smem_shared(f("qwg_pq2")?, max_smem)?,
            gdn_tc_prep: [
                big(&format!("gdn_tc_prep{x3}"))?,
                big(&format!("gdn_tc_prep{tf}"))?,
            ],
            // Two blocks of about 100 KB a multiprocessor: the whole of shared memory carved out for them.
            gdn_tc_prep8: [
                big_smem_shared(f(&format!("gdn_tc_prep8{x3}"))?, max_smem)?,
                big_smem_shared(f(&format!("gdn_tc_prep8{tf}"))?, max_smem)?,
            ],
            gdn_tc_state: [
                per_slice(states, "gdn_tc_state", x3, &big)?,
                per_slice(states, "gdn_tc_state", tf, &big)?,
            ],
            gdn_tc_leaf: [
                per_slice(leaves, "gdn_tc_leaf", x3, &big)?,
                per_slice(leaves, "gdn_tc_leaf", tf, &big)?,
            ],
            attention_tc: [
                big(&format!("attention_tc{x3}"))?,
                big(&format!("attention_tc{tf}"))?,
                big("attention_bf")?,
                big("attention_bf1")?,
                big_smem_shared(f("attention_h")?, max_smem)?,
            ],
            attention_tc_combine: f("attention_tc_combine")?,
            sample: crate::sample::SampleKernels::load(&f)?,
            gemv_bf16: [f("gemv_bf16_2")?, f("gemv_bf16_8")?],
            gemv_half: [f("gemv_half_2")?, f("gemv_half_8")?],
            gemv_q: {
                let fmt = |q: &str| -> Result<[[CudaFunction; 2]; 3], CudaError> {
                    let rows = |x: &str| -> Result<[CudaFunction; 2], CudaError> {
                        Ok([f(&format!("gemv_{q}_{x}_1"))?, f(&format!("gemv_{q}_{x}_8"))?])
                    };
                    Ok([rows("bf16")?, rows("f32")?, rows("split")?])
                };
                [fmt("pq2")?, fmt("q8")?, fmt("f16")?, fmt("f32r")?]
            },
            gemv_q_wide: {
                let wide = |q: &str| -> Result<[CudaFunction; 3], CudaError> {
                    Ok([
                        f(&format!("gemv_{q}_wide_bf16"))?,
                        f(&format!("gemv_{q}_wide_f32"))?,
                        f(&format!("gemv_{q}_wide_split"))?,
                    ])
                };
                [wide("pq2")?, wide("q8")?]
            },
            rotate_row_norm: f("rotate_row_norm")?,
        };
        let name = ctx.name().op("device name")?;
        let norm_blocks = k
            .rms_norm
            .occupancy_max_active_blocks_per_multiprocessor(
                crate::ops::NORM_ROWS as u32 * 32,
                0,
                None,
            )
            .op("rms_norm occupancy")?;
        let norm_wave_rows = norm_blocks.max(1) as usize * sms * crate::ops::NORM_ROWS;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            blas,
            k,
            name,
            max_smem,
            sm_smem,
            sms,
            norm_wave_rows,
            cc: (maj, min),
            fallbacks: std::sync::OnceLock::new(),
            pinned: Default::default(),
            pdl: false.into(),
            wgmma_off: false.into(),
        }))
    }

    /// Whether the kernels that wait for it launch with programmatic serialization ([`crate::pdl`]).
    pub fn pdl(&self) -> bool {
        self.pdl.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch on (where the device has it) or off, for every later launch.
    pub fn set_pdl(&self, on: bool) {
        let on = on && self.cc.0 >= 9;
        self.pdl.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether PQ2_0's prefill GEMM may take the warpgroup-mma kernel (`qwg_pq2`): the kernels compiled for sm_90a
    /// (compute capability 9.0) and [`Gpu::set_wgmma`] not turned off.
    pub fn wgmma(&self) -> bool {
        arch_suffix(self.cc) == "a" && !self.wgmma_off.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lets PQ2_0's prefill GEMM take the warpgroup-mma kernel where the device has it (the default), or keeps it
    /// to the mma.sync kernels (the same bits, for comparing the two), for every later launch.
    pub fn set_wgmma(&self, on: bool) {
        self.wgmma_off
            .store(!on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The architecture the kernels were compiled for, as NVRTC names it: `compute_XY`, `compute_90a` on compute
    /// capability 9.0 ([`images_for`]).
    pub fn arch(&self) -> String {
        format!("compute_{}{}{}", self.cc.0, self.cc.1, arch_suffix(self.cc))
    }

    /// The fallback kernels, compiled (or read from the cache) and loaded at the first call. Not while a CUDA graph
    /// is being captured on this thread: a forward's first run of a shape is never captured.
    pub fn fallbacks(&self) -> Result<&Fallbacks, CudaError> {
        if let Some(f) = self.fallbacks.get() {
            return Ok(f);
        }
        let lazy: Vec<usize> = (0..PROGRAMS.len()).filter(|i| is_fallback(*i)).collect();
        let modules = load_programs(&self.ctx, self.cc, &lazy, "fallback CUDA kernels")?;
        let big = |name: &str| big_smem(kernel(&modules, name)?, self.max_smem);
        let f = Fallbacks {
            gdn_wy_prep: big("gdn_wy_prep")?,
            gdn_wy_state: big("gdn_wy_state")?,
            attention_tiled: big("attention_tiled")?,
        };
        // Two threads that both loaded them keep the first set.
        let _ = self.fallbacks.set(f);
        self.fallbacks
            .get()
            .ok_or_else(|| CudaError::Unsupported("fallback kernels".into()))
    }

    /// Uninitialised device memory for `n` values.
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        // SAFETY: callers write before they read (every kernel output is fully written).
        unsafe { self.stream.alloc::<T>(n.max(1)) }.op("alloc")
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream.alloc_zeros::<T>(n.max(1)).op("alloc_zeros")
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        if host.is_empty() {
            return self.alloc(1);
        }
        self.stream.clone_htod(host).op("upload")
    }

    /// Copies `host` into the start of an existing device buffer (stream-ordered).
    pub fn upload_into<T: DeviceRepr>(
        &self,
        host: &[T],
        dev: &CudaSlice<T>,
    ) -> Result<(), CudaError> {
        if host.is_empty() {
            return Ok(());
        }
        if host.len() > dev.len() {
            return Err(CudaError::Unsupported(format!(
                "upload of {} values into a buffer of {}",
                host.len(),
                dev.len()
            )));
        }
        let dst = self.ptr(dev);
        // SAFETY: `dst` is a live device buffer of at least `host.len()` values; the copy is ordered on our stream
        // (pageable host memory is staged before the call returns, so `host` may go away after it).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, host, self.stream.cu_stream()) }
            .op("upload")
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.stream
                .memcpy_dtoh(&dev.slice(..n), &mut out)
                .op("download")?;
        }
        Ok(out)
    }

    /// Copies `n` values between device buffers (at element offsets).
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        src_off: usize,
        dst: &mut CudaSlice<T>,
        dst_off: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let s = src.slice(src_off..src_off + n);
        let mut d = dst.slice_mut(dst_off..dst_off + n);
        self.stream.memcpy_dtod(&s, &mut d).op("copy")
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream.synchronize().op("synchronize")
    }

    /// The raw device address of a buffer (valid while the buffer lives).
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// `y[T, N] (row stride ldy) = x[T, K] (bf16, row-major) · w[N, K]ᵀ (bf16) + beta · y`, f32
    /// output, f32 accumulation (cuBLAS GemmEx).
    pub fn gemm_bf16(
        &self,
        x: u64,
        t: usize,
        k: usize,
        w: u64,
        n: usize,
        y: u64,
        ldy: usize,
        beta: f32,
    ) -> Result<(), CudaError> {
        self.gemm(x, t, k, crate::ops::W::Bf16(w), n, y, ldy, beta)
    }

    /// `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and accumulation; x has
    /// w's dtype. bf16: tensor cores through cublasGemmEx;
    /// f32: cublasGemmEx with `CUBLAS_COMPUTE_32F_PEDANTIC`, so no TF32 (the exact mode). See [`crate::gemm`].
    pub fn gemm(
        &self,
        x: u64,
        t: usize,
        k: usize,
        w: crate::ops::W,
        n: usize,
        y: u64,
        ldy: usize,
        beta: f32,
    ) -> Result<(), CudaError> {
        crate::gemm::gemm(self, x, t, k, w, n, y, ldy, beta)
    }
}

/// A launch configuration: `grid` blocks of `block` threads, `smem` bytes of dynamic shared memory.
pub fn cfg(grid: (u32, u32), block: u32, smem: u32) -> LaunchConfig {
    cfg3((grid.0, grid.1, 1), block, smem)
}

/// [`cfg`] with a third grid dimension (each at least 1).
pub fn cfg3(grid: (u32, u32, u32), block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0.max(1), grid.1.max(1), grid.2.max(1)),
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// Launches `func` with the listed arguments (each a `DeviceRepr` value: raw addresses as `u64`,
/// sizes as `i32`, scalars as `f32`).
#[macro_export]
macro_rules! launch {
    ($gpu:expr, $func:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        let gpu: &$crate::runtime::Gpu = $gpu;
        let mut b = gpu.stream.launch_builder(&$func);
        $( let v = $arg; $crate::runtime::PushKernelArg::arg(&mut b, &v); )*
        // SAFETY: the arguments match the kernel's parameter list in its .cu source.
        let lc: $crate::runtime::LaunchConfig = $cfg;
        unsafe { b.launch(lc) }.map(|_| ()).map_err(|err| $crate::CudaError::Driver { op: stringify!($func), err })
    }};
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Arith, AttnArith, TcArith, PROGRAMS};

    /// The slice kernels `Gpu::new` loads by name (`per_slice`: `{name}_{bv}{suffix}`) are each a group of
    /// [`PROGRAMS`], so each is compiled by its own program (a name not there would be looked up in the `simt`
    /// program, which does not compile it).
    #[test]
    fn slice_kernel_names_are_program_groups() {
        let sets: [(&str, &[usize]); 2] = [
            ("gdn_tc_state", &crate::gdn_tc::GDN_TC_SLICES),
            ("gdn_tc_leaf", &crate::gdn_tc::GDN_TC_LEAF_SLICES),
        ];
        for (name, slices) in sets {
            for suffix in [Arith::X3.suffix(), Arith::Tf32.suffix()] {
                for bv in slices {
                    let k = format!("{name}_{bv}{suffix}");
                    assert!(
                        PROGRAMS.iter().any(|p| p.contains(&k.as_str())),
                        "{k} is in no program's groups"
                    );
                }
            }
        }
    }

    /// `--gpu-kernels`: the two names for all kernels alike, the per-kernel list (spaces allowed), and
    /// a named error for anything else; the device line says which kernels run what.
    #[test]
    fn tc_arith_parses_the_kernel_specs() {
        let (x3, tf) = (TcArith::all(Arith::X3), TcArith::all(Arith::Tf32));
        for (spec, want) in [
            ("", x3),
            ("none", x3),
            ("3xtf32", x3),
            ("all", tf),
            ("tf32", tf),
        ] {
            assert_eq!(TcArith::parse(spec).unwrap(), want, "{spec:?}");
        }
        let t = TcArith::parse("state, attn").unwrap();
        assert_eq!(
            (t.prep, t.state, t.attn),
            (Arith::X3, Arith::Tf32, AttnArith::Tf32)
        );
        // Items apply in order: a later whole-spec name resets, attention takes its four names.
        let b = TcArith::parse("tf32, attn=bf16x3").unwrap();
        assert_eq!(
            (b.prep, b.state, b.attn),
            (Arith::Tf32, Arith::Tf32, AttnArith::Bf16x3)
        );
        assert_eq!(TcArith::parse("attn, 3xtf32").unwrap(), x3);
        assert_eq!(TcArith::parse("attn=bf16").unwrap().attn, AttnArith::Bf16);
        assert_eq!(TcArith::parse("attn=f16").unwrap().attn, AttnArith::F16);
        assert_eq!(TcArith::parse("attn=3xtf32").unwrap(), x3);
        assert_eq!(
            TcArith::parse("attn=bf8").unwrap_err().0,
            "attn=bf8",
            "an unknown attention arithmetic is named"
        );
        assert_eq!(
            b.describe(),
            "tensor-core kernels: pre-pass 1xTF32, state pass 1xTF32, attention bf16x3"
        );
        let e = TcArith::parse("state,gemm").unwrap_err();
        assert_eq!(e.0, "gemm");
        assert!(e.to_string().contains("expected 3xtf32, tf32"), "{e}");
        assert_eq!(tf.describe(), "tensor-core kernels 1xTF32");
        assert_eq!(
            t.describe(),
            "tensor-core kernels: pre-pass 3xTF32, state pass 1xTF32, attention 1xTF32"
        );
    }
}

//! The projection GEMMs: `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y`, f32 output and
//! accumulation, `beta` 0 or 1 (1 accumulates into the residual).
//!
//! Two paths, chosen by [`gemm`] (the body of [`Gpu::gemm`]):
//!
//! - **Lt** (`ONEPASS_GEMM=lt`): cuBLASLt with a 32 MiB workspace and per-shape autotuning. On the
//!   first call of a key (T rounded up to [`t_bucket`], N, K, ldy, beta ≠ 0, dtype, the alignments of
//!   the three pointers) the candidates ([`lt_candidates`]: up to 16 from `cublasLtMatmulAlgoGetHeuristic`,
//!   plus split-K variants of the best four when the output has fewer 128×128 tiles than the GPU has SMs)
//!   and GemmEx itself are timed on the real operands ([`time_us`]); the fastest is kept for the key.
//!   With beta ≠ 0 the timing writes into a zeroed scratch output, never into the caller's `y` (with
//!   beta = 0 it writes `y`, which the chosen algorithm then overwrites). Another T of the same bucket
//!   reuses the kept algorithm once `cublasLtMatmulAlgoCheck` accepts it for that T (workspace included),
//!   else that T is tuned on its own.
//! - **Ex** (the default): `cublasGemmEx` with `CUBLAS_GEMM_DEFAULT` ([`gemm_ex`]); always for the f32
//!   weights of `Precision::F32` (`CUBLAS_COMPUTE_32F_PEDANTIC`, so never TF32) and on a GPU machine without
//!   libcublasLt (opened at first use; a machine without CUDA never touches it).
//!
//! Why Ex is the default (H200, 2026-11-30, `gemm_timings` in tests/gemm.rs): at the System One token counts
//! (T = 175, 231) no Lt candidate beat GemmEx by more than 2% on any 0.8B projection, and reusing a bucket's choice
//! for another T lost up to 32% (gdn in at T = 231; runs E and K in docs/benchmarks/data); at T = 3,400 and 7,392
//! tuning changed each projection by −1% to +13%. Not worth a first-request tuning cost of 5–50 ms per key on a
//! server.
//!
//! Environment: `ONEPASS_GEMM=lt|ex` (default `ex`); `ONEPASS_GEMM_LOG=1` prints each key's choice and
//! the times of its candidates to stderr. The choice is made by timing, so two processes may pick
//! different algorithms for a key and differ at rounding level; within a process a key's choice is fixed.
//!
//! Column-major view (cuBLAS's): `y_cm[N, T] (ld ldy) = op(w_cm)[N, K] · x_cm[K, T]`, where `w_cm` is
//! `[K, N]` (ld K) transposed and `x_cm` is `[K, T]` (ld K).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::CudaSlice;

use crate::ops::W;
use crate::runtime::Gpu;
use crate::{CudaError, DrvCtx};

/// Lt workspace, allocated once per [`Gpu`] at the first Lt call (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;
/// Candidates asked of the heuristic per key.
const HEURISTIC_CANDIDATES: usize = 16;
/// Heuristic candidates that get split-K variants (when the output has few tiles).
const SPLIT_K_BASES: usize = 4;
const SPLIT_K: [u32; 4] = [2, 3, 4, 8];
/// Timing: the best of `TRIALS` runs of `REPS` back-to-back calls, each run behind a GPU-side delay
/// (`DELAY_MEMSETS` memsets of `DELAY_BYTES`, about 100 µs on an H200) so that the host, which needs a few
/// µs per call, enqueues all of them before the first starts: the events then time the GPU, not the host.
const REPS: usize = 8;
const TRIALS: usize = 2;
const DELAY_BYTES: usize = 64 << 20;
const DELAY_MEMSETS: usize = 6;

/// Which path bf16 GEMMs take (`ONEPASS_GEMM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// cuBLASLt, autotuned per shape.
    Lt,
    /// cublasGemmEx, `CUBLAS_GEMM_DEFAULT` (default).
    Ex,
}

impl Mode {
    /// `ONEPASS_GEMM`: `ex` (or unset) or `lt`; another value is reported on stderr and read as `ex`.
    pub fn from_env() -> Mode {
        match std::env::var("ONEPASS_GEMM").as_deref() {
            Ok("lt") => Mode::Lt,
            Ok("ex") | Ok("") | Err(_) => Mode::Ex,
            Ok(other) => {
                eprintln!("ONEPASS_GEMM={other}: expected lt or ex; using ex");
                Mode::Ex
            }
        }
    }
}

/// The GEMM state of one [`Gpu`]: the mode, the Lt handle and workspace (made at first use), the tuned
/// choices.
pub struct GemmState {
    mode: Mode,
    log: bool,
    lt: OnceLock<Result<LtCtx, String>>,
    cache: Mutex<HashMap<Key, Entry>>,
}

impl GemmState {
    /// Reads `ONEPASS_GEMM` and `ONEPASS_GEMM_LOG`; touches no library.
    pub fn from_env() -> GemmState {
        GemmState {
            mode: Mode::from_env(),
            log: std::env::var("ONEPASS_GEMM_LOG").as_deref() == Ok("1"),
            lt: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

/// The path this GPU's bf16 GEMMs take (`ONEPASS_GEMM`; Lt falls back to Ex when cuBLASLt is missing).
pub fn mode(g: &Gpu) -> Mode {
    g.gemm_state.mode
}

/// The cuBLASLt handle (thread-safe per NVIDIA; every call of this crate uses the one stream).
struct LtHandle(lt::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle may be used from any thread; it carries no per-thread state.
unsafe impl Send for LtHandle {}
unsafe impl Sync for LtHandle {}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate, destroyed once.
        let _ = unsafe { lt::cublasLtDestroy(self.0) };
    }
}

struct LtCtx {
    handle: LtHandle,
    workspace: CudaSlice<u8>,
}

impl LtCtx {
    fn new(g: &Gpu) -> Result<LtCtx, String> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { lt::is_culib_present() } {
            return Err("libcublasLt was not found (set LD_LIBRARY_PATH to CUDA's lib64)".into());
        }
        // cuBLASLt works in the thread's current context: ours.
        g.ctx
            .bind_to_thread()
            .map_err(|e| format!("bind context: {e}"))?;
        let mut h: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: h is an out-parameter.
        unsafe { lt::cublasLtCreate(&mut h) }
            .result()
            .map_err(|e| format!("cublasLtCreate: {e}"))?;
        let handle = LtHandle(h);
        let workspace = g
            .alloc::<u8>(WORKSPACE_BYTES)
            .map_err(|e| format!("cuBLASLt workspace: {e}"))?;
        Ok(LtCtx { handle, workspace })
    }
}

fn lt_ctx(g: &Gpu) -> Result<&LtCtx, CudaError> {
    let st = &g.gemm_state;
    st.lt
        .get_or_init(|| {
            let r = LtCtx::new(g);
            if let (true, Err(e)) = (st.log, &r) {
                eprintln!("onepass gemm: cuBLASLt unavailable ({e}); GemmEx for every GEMM");
            }
            r
        })
        .as_ref()
        .map_err(|e| CudaError::Unavailable(e.clone()))
}

/// Whether the Lt path can run on this GPU (loads libcublasLt and allocates the workspace on first call).
pub fn lt_available(g: &Gpu) -> Result<(), CudaError> {
    lt_ctx(g).map(|_| ())
}

/// The T of a tuning key: powers of two from 16 up to 512, then multiples of 512.
pub fn t_bucket(t: usize) -> usize {
    if t <= 512 {
        t.next_power_of_two().max(16)
    } else {
        t.div_ceil(512) * 512
    }
}

/// Alignment in bytes of a device address, capped at 256 (cuBLASLt's default assumption).
fn align_of(p: u64) -> u32 {
    1u32 << p.trailing_zeros().min(8)
}

/// A tuning key: the problem up to T's bucket, and what decides which algorithms are valid or fast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    n: usize,
    k: usize,
    bucket: usize,
    ldy: usize,
    accumulate: bool,
    /// Input dtype (`cudaDataType` as a number; only bf16 takes the Lt path today).
    dtype: u32,
    /// Alignment (bytes, ≤ 256) of w, x, y.
    align: [u32; 3],
}

/// A cuBLASLt algorithm with the workspace it needs.
#[derive(Clone, Copy, Debug)]
pub struct Algo {
    raw: lt::cublasLtMatmulAlgo_t,
    pub workspace: usize,
}

impl Algo {
    fn config(&self, attr: lt::cublasLtMatmulAlgoConfigAttributes_t, size: usize) -> Option<u64> {
        let mut v = 0u64;
        let mut written = 0usize;
        // SAFETY: v has room for `size` ≤ 8 bytes.
        unsafe {
            lt::cublasLtMatmulAlgoConfigGetAttribute(
                &self.raw,
                attr,
                &mut v as *mut u64 as *mut c_void,
                size,
                &mut written,
            )
        }
        .result()
        .ok()
        .map(|_| v)
    }

    fn set_config(&mut self, attr: lt::cublasLtMatmulAlgoConfigAttributes_t, v: u32) -> bool {
        // SAFETY: a u32 attribute (SPLITK_NUM, REDUCTION_SCHEME).
        unsafe {
            lt::cublasLtMatmulAlgoConfigSetAttribute(
                &mut self.raw,
                attr,
                &v as *const u32 as *const c_void,
                4,
            )
        }
        .result()
        .is_ok()
    }

    fn cap(&self, attr: lt::cublasLtMatmulAlgoCapAttributes_t) -> Option<u32> {
        let mut v = 0u32;
        let mut written = 0usize;
        // SAFETY: the capabilities read here are 32-bit.
        unsafe {
            lt::cublasLtMatmulAlgoCapGetAttribute(
                &self.raw,
                attr,
                &mut v as *mut u32 as *mut c_void,
                4,
                &mut written,
            )
        }
        .result()
        .ok()
        .map(|_| v)
    }

    /// `id`, tile, stages, split-K and reduction, swizzle, custom option, inner and cluster shape ids,
    /// workspace: enough to tell candidates apart in a log.
    pub fn describe(&self) -> String {
        use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
        let f = |attr, size| match self.config(attr, size) {
            Some(v) => v.to_string(),
            None => "?".into(),
        };
        format!(
            "lt id {} tile {} stages {} splitK {} red {} swz {} custom {} inner {} cluster {} ws {}",
            f(A::CUBLASLT_ALGO_CONFIG_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_STAGES_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
            f(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
            f(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4),
            f(A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4),
            f(A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2),
            f(A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2),
            self.workspace
        )
    }

    /// Whether the algorithm's minimum alignments admit these of w, x, y (bytes).
    fn admits(&self, align: [u32; 3]) -> bool {
        use lt::cublasLtMatmulAlgoCapAttributes_t as C;
        let need = |attr| self.cap(attr).unwrap_or(0);
        need(C::CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES) <= align[0]
            && need(C::CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES) <= align[1]
            && need(C::CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES) <= align[2]
            && need(C::CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES) <= align[2]
    }
}

/// What a key (or one T of it) runs.
#[derive(Clone, Copy, Debug)]
enum Choice {
    Ex,
    Lt(Algo),
}

impl Choice {
    fn describe(&self) -> String {
        match self {
            Choice::Ex => "ex (cublasGemmEx default)".into(),
            Choice::Lt(a) => a.describe(),
        }
    }
}

struct Entry {
    /// The choice tuned for the bucket, and the T it was timed at.
    tuned: Choice,
    tuned_t: usize,
    /// Its time there (µs) and a summary of the candidates' times.
    micros: f32,
    summary: String,
    /// Per T seen: the tuned choice once checked valid for that T, or the choice tuned for that T.
    by_t: HashMap<usize, Choice>,
}

fn lt_err(op: &'static str, s: lt::cublasStatus_t) -> CudaError {
    use blas_sys::cublasStatus_t as B;
    use lt::cublasStatus_t as L;
    let b = match s {
        L::CUBLAS_STATUS_SUCCESS => B::CUBLAS_STATUS_SUCCESS,
        L::CUBLAS_STATUS_NOT_INITIALIZED => B::CUBLAS_STATUS_NOT_INITIALIZED,
        L::CUBLAS_STATUS_ALLOC_FAILED => B::CUBLAS_STATUS_ALLOC_FAILED,
        L::CUBLAS_STATUS_INVALID_VALUE => B::CUBLAS_STATUS_INVALID_VALUE,
        L::CUBLAS_STATUS_ARCH_MISMATCH => B::CUBLAS_STATUS_ARCH_MISMATCH,
        L::CUBLAS_STATUS_MAPPING_ERROR => B::CUBLAS_STATUS_MAPPING_ERROR,
        L::CUBLAS_STATUS_EXECUTION_FAILED => B::CUBLAS_STATUS_EXECUTION_FAILED,
        L::CUBLAS_STATUS_INTERNAL_ERROR => B::CUBLAS_STATUS_INTERNAL_ERROR,
        L::CUBLAS_STATUS_NOT_SUPPORTED => B::CUBLAS_STATUS_NOT_SUPPORTED,
        L::CUBLAS_STATUS_LICENSE_ERROR => B::CUBLAS_STATUS_LICENSE_ERROR,
    };
    CudaError::Blas {
        op,
        err: blas_result::CublasError(b),
    }
}

fn ok(op: &'static str, s: lt::cublasStatus_t) -> Result<(), CudaError> {
    match s {
        lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        e => Err(lt_err(op, e)),
    }
}

/// The descriptors of one problem (created per call: a few host allocations, no device work).
struct Problem {
    desc: lt::cublasLtMatmulDesc_t,
    /// w_cm [K, N] (ld K), x_cm [K, T] (ld K), y_cm [N, T] (ld ldy): C and D.
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
}

impl Drop for Problem {
    fn drop(&mut self) {
        // SAFETY: each was created by this Problem (null when creation failed), destroyed once.
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    let _ = lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

impl Problem {
    /// bf16 inputs, f32 output, f32 accumulation.
    fn bf16(t: usize, n: usize, k: usize, ldy: usize) -> Result<Problem, CudaError> {
        let mut p = Problem {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
        };
        let dt = lt::cudaDataType::CUDA_R_16BF;
        let f32t = lt::cudaDataType::CUDA_R_32F;
        // SAFETY: out-parameters, and attribute buffers of the documented types (int32 for TRANSA).
        unsafe {
            ok(
                "cublasLtMatmulDescCreate",
                lt::cublasLtMatmulDescCreate(
                    &mut p.desc,
                    lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    f32t,
                ),
            )?;
            let trans_t: i32 = blas_sys::cublasOperation_t::CUBLAS_OP_T as i32;
            ok(
                "cublasLtMatmulDescSetAttribute(TRANSA)",
                lt::cublasLtMatmulDescSetAttribute(
                    p.desc,
                    lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    &trans_t as *const i32 as *const c_void,
                    4,
                ),
            )?;
            ok(
                "cublasLtMatrixLayoutCreate(w)",
                lt::cublasLtMatrixLayoutCreate(&mut p.a, dt, k as u64, n as u64, k as i64),
            )?;
            ok(
                "cublasLtMatrixLayoutCreate(x)",
                lt::cublasLtMatrixLayoutCreate(&mut p.b, dt, k as u64, t as u64, k as i64),
            )?;
            ok(
                "cublasLtMatrixLayoutCreate(y)",
                lt::cublasLtMatrixLayoutCreate(&mut p.c, f32t, n as u64, t as u64, ldy as i64),
            )?;
        }
        Ok(p)
    }

    /// The heuristic's candidates (up to `count`) for these alignments and our workspace.
    fn heuristics(
        &self,
        ctx: &LtCtx,
        align: [u32; 3],
        count: usize,
    ) -> Result<Vec<Algo>, CudaError> {
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
        // SAFETY: out-parameter; destroyed below.
        ok("cublasLtMatmulPreferenceCreate", unsafe {
            lt::cublasLtMatmulPreferenceCreate(&mut pref)
        })?;
        struct PrefGuard(lt::cublasLtMatmulPreference_t);
        impl Drop for PrefGuard {
            fn drop(&mut self) {
                // SAFETY: created above, destroyed once.
                let _ = unsafe { lt::cublasLtMatmulPreferenceDestroy(self.0) };
            }
        }
        let _guard = PrefGuard(pref);
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: attribute buffers of the documented types (uint64 workspace, uint32 alignments).
        unsafe {
            ok(
                "preference workspace",
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const u64 as *const c_void,
                    8,
                ),
            )?;
            for (attr, a) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]),
            ] {
                ok(
                    "preference alignment",
                    lt::cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        attr,
                        &a as *const u32 as *const c_void,
                        4,
                    ),
                )?;
            }
        }
        // SAFETY: the result type is plain data; all-zero is a valid value (state SUCCESS, empty algo).
        let mut res: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; count];
        let mut got = 0i32;
        // SAFETY: res has room for `count` results.
        let s = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                ctx.handle.0,
                self.desc,
                self.a,
                self.b,
                self.c,
                self.c,
                pref,
                count as i32,
                res.as_mut_ptr(),
                &mut got,
            )
        };
        // NOT_SUPPORTED: no algorithm for this problem (e.g. its alignments); GemmEx will do.
        if s == lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED {
            return Ok(Vec::new());
        }
        ok("cublasLtMatmulAlgoGetHeuristic", s)?;
        res.truncate(got.max(0) as usize);
        Ok(res
            .into_iter()
            .filter(|r| {
                r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= WORKSPACE_BYTES
            })
            .map(|r| Algo {
                raw: r.algo,
                workspace: r.workspaceSize,
            })
            .collect())
    }

    /// `cublasLtMatmulAlgoCheck`: the algorithm (its workspace updated) when valid for this problem.
    fn check(&self, ctx: &LtCtx, algo: &Algo) -> Option<Algo> {
        // SAFETY: plain data, written by the call.
        let mut r: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: descriptors live; r is an out-parameter.
        let s = unsafe {
            lt::cublasLtMatmulAlgoCheck(
                ctx.handle.0,
                self.desc,
                self.a,
                self.b,
                self.c,
                self.c,
                &algo.raw,
                &mut r,
            )
        };
        (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.workspaceSize <= WORKSPACE_BYTES)
            .then_some(Algo {
                raw: algo.raw,
                workspace: r.workspaceSize,
            })
    }

    /// `y = x · wᵀ + beta · y` with `algo` (in place: C = D = y).
    fn run(
        &self,
        g: &Gpu,
        ctx: &LtCtx,
        algo: &Algo,
        x: u64,
        w: u64,
        y: u64,
        beta: f32,
    ) -> Result<(), CudaError> {
        let alpha = 1.0f32;
        let ws = g.ptr(&ctx.workspace);
        // SAFETY: pointers are live device buffers of the shapes in the layouts; the workspace holds
        // WORKSPACE_BYTES ≥ algo.workspace.
        ok("cublasLtMatmul", unsafe {
            lt::cublasLtMatmul(
                ctx.handle.0,
                self.desc,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                self.a,
                x as *const c_void,
                self.b,
                &beta as *const f32 as *const c_void,
                y as *const c_void,
                self.c,
                y as *mut c_void,
                self.c,
                &algo.raw,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                g.stream.cu_stream() as lt::cudaStream_t,
            )
        })
    }
}

/// Split-K variants of `base` (when it supports split-K and has none), valid for `p`.
fn split_k_variants(ctx: &LtCtx, p: &Problem, base: &Algo, k: usize) -> Vec<Algo> {
    use lt::cublasLtMatmulAlgoCapAttributes_t as C;
    use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
    use lt::cublasLtReductionScheme_t as R;
    if base.cap(C::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT).unwrap_or(0) == 0
        || base
            .config(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4)
            .unwrap_or(1)
            > 1
    {
        return Vec::new();
    }
    let mask = base
        .cap(C::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK)
        .unwrap_or(0);
    let Some(scheme) = [
        R::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
        R::CUBLASLT_REDUCTION_SCHEME_INPLACE,
        R::CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE,
    ]
    .into_iter()
    .find(|s| mask & (*s as u32) != 0) else {
        return Vec::new();
    };
    SPLIT_K
        .iter()
        .filter(|&&s| k / s as usize >= 128)
        .filter_map(|&s| {
            let mut a = *base;
            (a.set_config(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, s)
                && a.set_config(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme as u32))
            .then(|| p.check(ctx, &a))
            .flatten()
        })
        .collect()
}

fn candidates_for(
    g: &Gpu,
    ctx: &LtCtx,
    p: &Problem,
    align: [u32; 3],
    t: usize,
    n: usize,
    k: usize,
) -> Result<Vec<Algo>, CudaError> {
    let mut out: Vec<Algo> = p
        .heuristics(ctx, align, HEURISTIC_CANDIDATES)?
        .into_iter()
        .filter(|a| a.admits(align))
        .collect();
    if n.div_ceil(128) * t.div_ceil(128) < g.sms {
        let bases: Vec<Algo> = out.iter().take(SPLIT_K_BASES).copied().collect();
        for b in &bases {
            for v in split_k_variants(ctx, p, b, k) {
                if v.admits(align) && !out.iter().any(|o| o.raw == v.raw) {
                    out.push(v);
                }
            }
        }
    }
    Ok(out)
}

/// The algorithms the tuner times for this problem (GemmEx aside): the heuristic's, in its order, then
/// split-K variants. Pointers matter only through their alignment.
pub fn lt_candidates(
    g: &Gpu,
    x: u64,
    t: usize,
    k: usize,
    w: u64,
    n: usize,
    y: u64,
    ldy: usize,
) -> Result<Vec<Algo>, CudaError> {
    let ctx = lt_ctx(g)?;
    let p = Problem::bf16(t, n, k, ldy)?;
    candidates_for(g, ctx, &p, [align_of(w), align_of(x), align_of(y)], t, n, k)
}

/// `y = x · wᵀ + beta · y` with one given Lt algorithm (bf16 x and w); fails when cuBLASLt rejects it.
pub fn gemm_lt_with(
    g: &Gpu,
    algo: &Algo,
    x: u64,
    t: usize,
    k: usize,
    w: u64,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    if t == 0 || n == 0 {
        return Ok(());
    }
    let ctx = lt_ctx(g)?;
    Problem::bf16(t, n, k, ldy)?.run(g, ctx, algo, x, w, y, beta)
}

/// `y[T, N] (row stride ldy) = x[T, K] · w[N, K]ᵀ + beta · y` through cublasGemmEx (`CUBLAS_GEMM_DEFAULT`);
/// x has w's dtype. bf16: tensor cores, f32 accumulation; f32: `CUBLAS_COMPUTE_32F_PEDANTIC` (no TF32).
pub fn gemm_ex(
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
    gemm_ex_ld(g, x, k, t, k, w, k, n, y, ldy, beta)
}

/// [`gemm_ex`] with row strides (elements) for x (`ldx`) and w (`ldw`), each at least K.
pub fn gemm_ex_ld(
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

/// The body of [`Gpu::gemm`]: bf16 through GemmEx, or through the autotuned Lt path with `ONEPASS_GEMM=lt` (GemmEx
/// when cuBLASLt is missing); f32 (the exact mode) and K = 0 always through GemmEx.
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

/// [`gemm`] with row strides (elements) for x (`ldx`) and w (`ldw`), each at least K: rows of x and w that are not
/// contiguous always take GemmEx ([`gemm_ex_ld`]; the Lt path's layouts are contiguous).
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
    if ldx != k || ldw != k {
        return gemm_ex_ld(g, x, ldx, t, k, w, ldw, n, y, ldy, beta);
    }
    match w {
        W::Bf16(wp) if k > 0 && g.gemm_state.mode == Mode::Lt => {
            // The handle and workspace are made outside stream capture (an allocation there would belong
            // to the graph); GemmEx until then.
            if g.gemm_state.lt.get().is_none() && capturing(g) {
                return gemm_ex(g, x, t, k, w, n, y, ldy, beta);
            }
            if lt_ctx(g).is_ok() {
                return gemm_lt(g, x, t, k, wp, n, y, ldy, beta);
            }
            gemm_ex(g, x, t, k, w, n, y, ldy, beta)
        }
        _ => gemm_ex(g, x, t, k, w, n, y, ldy, beta),
    }
}

/// Whether the stream is capturing a CUDA graph (then nothing may allocate, synchronise or time).
fn capturing(g: &Gpu) -> bool {
    !matches!(
        g.stream.capture_status(),
        Ok(cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    )
}

/// Under stream capture, an untuned problem runs the heuristic's first algorithm (host-side queries
/// only), cached for nothing: the next uncaptured call tunes it.
fn untimed(g: &Gpu, ctx: &LtCtx, p: &Problem, key: &Key, t: usize) -> Choice {
    match candidates_for(g, ctx, p, key.align, t, key.n, key.k) {
        Ok(c) if !c.is_empty() => Choice::Lt(c[0]),
        _ => Choice::Ex,
    }
}

/// `y = x · wᵀ + beta · y` (bf16 x and w) through the autotuned Lt path, whatever `ONEPASS_GEMM` says;
/// fails when cuBLASLt is unavailable. The first call of a key tunes it (see the module docs).
pub fn gemm_lt(
    g: &Gpu,
    x: u64,
    t: usize,
    k: usize,
    w: u64,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    if t == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        return gemm_ex(g, x, t, k, W::Bf16(w), n, y, ldy, beta);
    }
    let ctx = lt_ctx(g)?;
    let p = Problem::bf16(t, n, k, ldy)?;
    let key = Key {
        n,
        k,
        bucket: t_bucket(t),
        ldy,
        accumulate: beta != 0.0,
        dtype: lt::cudaDataType::CUDA_R_16BF as u32,
        align: [align_of(w), align_of(x), align_of(y)],
    };
    let st = &g.gemm_state;
    let choice = {
        let mut cache = st.cache.lock().unwrap_or_else(|e| e.into_inner());
        let known = cache.get(&key).map(|e| (e.tuned, e.by_t.get(&t).copied()));
        match known {
            // This T was seen.
            Some((_, Some(c))) => c,
            // Another T of the bucket: the bucket's choice when valid for this T, else one tuned for it.
            Some((tuned, None)) => {
                let checked = match tuned {
                    Choice::Ex => Some(Choice::Ex),
                    Choice::Lt(a) => p.check(ctx, &a).map(Choice::Lt),
                };
                let c = match checked {
                    Some(c) => c,
                    // Not cached: the next uncaptured call tunes this T.
                    None if capturing(g) => {
                        return run_choice(
                            g,
                            ctx,
                            &p,
                            untimed(g, ctx, &p, &key, t),
                            x,
                            t,
                            k,
                            w,
                            n,
                            y,
                            ldy,
                            beta,
                        )
                    }
                    None => {
                        let (c, us, summary) = tune(g, ctx, &p, &key, t, x, w, y)?;
                        if st.log {
                            eprintln!(
                                "onepass gemm: {key:?} t {t}: the bucket's choice does not fit; tuned for this t: {} ({us:.1} µs; {summary})",
                                c.describe()
                            );
                        }
                        c
                    }
                };
                if let Some(e) = cache.get_mut(&key) {
                    e.by_t.insert(t, c);
                }
                c
            }
            // Not cached: the next uncaptured call tunes this key.
            None if capturing(g) => untimed(g, ctx, &p, &key, t),
            None => {
                let (c, us, summary) = tune(g, ctx, &p, &key, t, x, w, y)?;
                if st.log {
                    eprintln!(
                        "onepass gemm: {key:?} tuned at t {t}: {} ({us:.1} µs; {summary})",
                        c.describe()
                    );
                }
                cache.insert(
                    key,
                    Entry {
                        tuned: c,
                        tuned_t: t,
                        micros: us,
                        summary,
                        by_t: HashMap::from([(t, c)]),
                    },
                );
                c
            }
        }
    };
    run_choice(g, ctx, &p, choice, x, t, k, w, n, y, ldy, beta)
}

fn run_choice(
    g: &Gpu,
    ctx: &LtCtx,
    p: &Problem,
    c: Choice,
    x: u64,
    t: usize,
    k: usize,
    w: u64,
    n: usize,
    y: u64,
    ldy: usize,
    beta: f32,
) -> Result<(), CudaError> {
    match c {
        Choice::Ex => gemm_ex(g, x, t, k, W::Bf16(w), n, y, ldy, beta),
        Choice::Lt(a) => p.run(g, ctx, &a, x, w, y, beta),
    }
}

/// The tuned keys of this GPU, one line each: the key, the T timed, the choice, its time, the others' times.
pub fn tuned(g: &Gpu) -> Vec<String> {
    let cache = g.gemm_state.cache.lock().unwrap_or_else(|e| e.into_inner());
    let mut keys: Vec<&Key> = cache.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let e = &cache[k];
            format!(
                "{k:?} at t {}: {} ({:.1} µs; {}); {} t seen",
                e.tuned_t,
                e.tuned.describe(),
                e.micros,
                e.summary,
                e.by_t.len()
            )
        })
        .collect()
}

/// GPU time of one call of `run` in µs: the best of `TRIALS` runs of `REPS` calls, after one warm-up
/// call (whose error is returned), each run behind a GPU-side delay so the host is never the bottleneck.
pub fn time_us(g: &Gpu, run: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f32, CudaError> {
    let delay = g.alloc::<u8>(DELAY_BYTES).ok();
    time_with(g, delay.as_ref(), run)
}

fn time_with(
    g: &Gpu,
    delay: Option<&CudaSlice<u8>>,
    run: &mut dyn FnMut() -> Result<(), CudaError>,
) -> Result<f32, CudaError> {
    run()?;
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = g.ctx.new_event(flags).op("event")?;
    let end = g.ctx.new_event(flags).op("event")?;
    let mut best = f32::INFINITY;
    for _ in 0..TRIALS {
        if let Some(d) = delay {
            let p = g.ptr(d);
            for _ in 0..DELAY_MEMSETS {
                // SAFETY: d holds DELAY_BYTES.
                unsafe {
                    cudarc::driver::result::memset_d8_async(p, 0, DELAY_BYTES, g.stream.cu_stream())
                }
                .op("timing delay")?;
            }
        }
        start.record(&g.stream).op("event record")?;
        for _ in 0..REPS {
            run()?;
        }
        end.record(&g.stream).op("event record")?;
        let ms = start.elapsed_ms(&end).op("event elapsed")?;
        best = best.min(ms * 1e3 / REPS as f32);
    }
    Ok(best)
}

/// Times GemmEx and every Lt candidate for this T on the real x and w (the output: `y` when beta = 0,
/// else a zeroed scratch of y's shape), returns the fastest, its time and a summary of all.
fn tune(
    g: &Gpu,
    ctx: &LtCtx,
    p: &Problem,
    key: &Key,
    t: usize,
    x: u64,
    w: u64,
    y: u64,
) -> Result<(Choice, f32, String), CudaError> {
    let (n, k, ldy) = (key.n, key.k, key.ldy);
    let beta = if key.accumulate { 1.0f32 } else { 0.0 };
    let cands = candidates_for(g, ctx, p, key.align, t, n, k).unwrap_or_default();
    if cands.is_empty() {
        return Ok((Choice::Ex, f32::NAN, "no Lt candidates".into()));
    }
    // Output for timing. The scratch has y's row stride, hence its layout, and is 256-byte aligned, so
    // every candidate for y's alignment runs on it.
    let scratch = if key.accumulate {
        // 64 more values to start at a 256-byte boundary.
        match g.zeros::<f32>((t - 1) * ldy + n + 64) {
            Ok(s) => Some(s),
            // No room to time without touching y: the heuristic's first.
            Err(_) => {
                return Ok((
                    Choice::Lt(cands[0]),
                    f32::NAN,
                    "untimed (no scratch)".into(),
                ))
            }
        }
    } else {
        None
    };
    let yt = scratch
        .as_ref()
        .map_or(y, |s| g.ptr(s).next_multiple_of(256));
    let delay = g.alloc::<u8>(DELAY_BYTES).ok();
    let mut best = (Choice::Ex, f32::INFINITY);
    let mut times = Vec::with_capacity(cands.len() + 1);
    match time_with(g, delay.as_ref(), &mut || {
        gemm_ex(g, x, t, k, W::Bf16(w), n, yt, ldy, beta)
    }) {
        Ok(us) => {
            best = (Choice::Ex, us);
            times.push(format!("ex {us:.1}"));
        }
        Err(_) => times.push("ex failed".into()),
    }
    for (i, a) in cands.iter().enumerate() {
        match time_with(g, delay.as_ref(), &mut || p.run(g, ctx, a, x, w, yt, beta)) {
            Ok(us) => {
                if us < best.1 {
                    best = (Choice::Lt(*a), us);
                }
                times.push(format!("#{i} {us:.1}"));
            }
            Err(_) => times.push(format!("#{i} failed")),
        }
    }
    // Frees the scratch and delay in stream order before y is written for real.
    drop(scratch);
    drop(delay);
    Ok((
        best.0,
        best.1,
        format!("µs: {} of {} candidates", times.join(", "), cands.len()),
    ))
}

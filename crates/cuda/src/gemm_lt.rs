//! Batch-invariant projection GEMMs: cuBLASLt with ONE algorithm per GEMM key (N, K, strides, accumulate, dtype,
//! pointer alignments) for every T, split-K off, so that an output row's sums never depend on how many rows are
//! stacked with it (`cublasGemmEx`'s heuristic picks tiles and split-K by T, so a row's result moves with its
//! batch). The algorithm is the first candidate of `cublasLtMatmulAlgoGetHeuristic` for the key at [`T_REF`] rows
//! that still runs with `SPLITK_NUM = 1` and no reduction (`cublasLtMatmulAlgoCheck`); each T it runs at is checked
//! once. Where cuBLASLt is missing, or rejects the key's algorithm for some T, that GEMM runs `cublasGemmEx` (one
//! line on stderr the first time: it is then not batch-invariant) and [`fallbacks`] counts it.
//!
//! bf16 and f16 inputs multiply on tensor cores with f32 accumulation (`CUBLAS_COMPUTE_32F`; f16 ones with alpha
//! undoing their weight's power-of-two scale, [`W::Half`]); f32 inputs with `CUBLAS_COMPUTE_32F_PEDANTIC` (plain
//! f32 FMAs, never TF32), as [`crate::gemm`]'s GemmEx path.
//!
//! History: a per-shape cuBLASLt autotuner (timing the heuristic's candidates per T bucket) was measured against
//! GemmEx and removed on 2026-11-30 (no candidate beat GemmEx by more than 2% at System One token counts; reusing a
//! bucket's choice for another T lost up to 32%: docs/benchmarks/history/cuda-notes-2026-11-30.md). This module
//! reuses its cuBLASLt plumbing for the pinned algorithms.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::CudaSlice;

use crate::ops::W;
use crate::runtime::Gpu;
use crate::CudaError;

/// Rows of the problem the heuristic is asked about: the middle of System One's forwards (a few hundred to a few
/// thousand rows). The algorithm it gives is then used at every T.
pub const T_REF: usize = 1024;
/// Workspace (allocated once per [`Gpu`]); split-K is off, so the pinned algorithms need little or none.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Candidates asked of the heuristic per key.
const CANDIDATES: usize = 16;
/// (key, T) problems kept (their descriptors, checked against the key's algorithm); past this many all are dropped.
const PROBLEMS_KEPT: usize = 8192;

/// The pinned-algorithm state of one [`Gpu`]: the cuBLASLt handle and workspace (made by [`prepare`], outside any
/// graph capture), each key's algorithm, and per (key, T) its problem's descriptors once checked against it (`None`:
/// the algorithm does not run at that T), so that a GEMM costs the host one `cublasLtMatmul` call.
#[derive(Default)]
pub struct Pinned {
    lt: OnceLock<Result<LtCtx, String>>,
    algos: Mutex<HashMap<Key, Option<Algo>>>,
    problems: Mutex<HashMap<(Key, usize), Option<Problem>>>,
    fallbacks: AtomicUsize,
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
            return Err("libcublasLt was not found".into());
        }
        // cuBLASLt works in the thread's current context: ours.
        g.ctx
            .bind_to_thread()
            .map_err(|e| format!("bind context: {e}"))?;
        let mut h: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: h is an out-parameter.
        let s = unsafe { lt::cublasLtCreate(&mut h) };
        if s != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasLtCreate: {s:?}"));
        }
        let handle = LtHandle(h);
        let workspace = g
            .alloc::<u8>(WORKSPACE_BYTES)
            .map_err(|e| format!("cuBLASLt workspace: {e}"))?;
        Ok(LtCtx { handle, workspace })
    }
}

/// Opens cuBLASLt for `g` (the handle, the workspace: a device allocation, so before any graph capture); `Err`
/// says why the batch-invariant GEMMs will fall back to GemmEx.
pub fn prepare(g: &Gpu) -> Result<(), CudaError> {
    ctx(g).map(|_| ())
}

fn ctx(g: &Gpu) -> Result<&LtCtx, CudaError> {
    g.pinned
        .lt
        .get_or_init(|| LtCtx::new(g))
        .as_ref()
        .map_err(|e| CudaError::Unavailable(e.clone()))
}

/// GEMMs that ran `cublasGemmEx` instead of their pinned algorithm (not batch-invariant), since `g` opened.
pub fn fallbacks(g: &Gpu) -> usize {
    g.pinned.fallbacks.load(Ordering::Relaxed)
}

/// Every key's pinned algorithm, for logs: `N x K (ldx, ldw, ldy, accumulate, dtype): algorithm`.
pub fn pinned(g: &Gpu) -> Vec<String> {
    let algos = g.pinned.algos.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<String> = algos
        .iter()
        .map(|(k, a)| {
            format!(
                "{} x {} (ldx {}, ldw {}, ldy {}, accumulate {}, {}): {}",
                k.n,
                k.k,
                k.ldx,
                k.ldw,
                k.ldy,
                k.accumulate,
                k.dtype.name(),
                a.as_ref().map_or("none: GemmEx".into(), Algo::describe)
            )
        })
        .collect();
    v.sort();
    v
}

/// Alignment in bytes of a device address, capped at 256 (cuBLASLt's default assumption).
fn align_of(p: u64) -> u32 {
    1u32 << p.trailing_zeros().min(8)
}

/// What decides a GEMM's algorithm, T aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    n: usize,
    k: usize,
    ldx: usize,
    ldw: usize,
    ldy: usize,
    accumulate: bool,
    dtype: Dtype,
    /// Alignment (bytes, ≤ 256) of w, x, y.
    align: [u32; 3],
}

/// The inputs' type of a [`Key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dtype {
    Bf16,
    F32,
    /// The half precision's projections ([`W::Half`]).
    F16,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
        }
    }
}

/// A cuBLASLt algorithm.
#[derive(Clone, Copy, Debug)]
struct Algo {
    raw: lt::cublasLtMatmulAlgo_t,
}

impl Algo {
    fn config(&self, attr: lt::cublasLtMatmulAlgoConfigAttributes_t, size: usize) -> Option<u64> {
        let mut v = 0u64;
        let mut written = 0usize;
        // SAFETY: v has room for `size` ≤ 8 bytes.
        let s = unsafe {
            lt::cublasLtMatmulAlgoConfigGetAttribute(
                &self.raw,
                attr,
                &mut v as *mut u64 as *mut c_void,
                size,
                &mut written,
            )
        };
        (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    }

    fn set_config(&mut self, attr: lt::cublasLtMatmulAlgoConfigAttributes_t, v: u32) -> bool {
        // SAFETY: a u32 attribute (SPLITK_NUM, REDUCTION_SCHEME).
        let s = unsafe {
            lt::cublasLtMatmulAlgoConfigSetAttribute(
                &mut self.raw,
                attr,
                &v as *const u32 as *const c_void,
                4,
            )
        };
        s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
    }

    fn cap(&self, attr: lt::cublasLtMatmulAlgoCapAttributes_t) -> Option<u32> {
        let mut v = 0u32;
        let mut written = 0usize;
        // SAFETY: the capabilities read here are 32-bit.
        let s = unsafe {
            lt::cublasLtMatmulAlgoCapGetAttribute(
                &self.raw,
                attr,
                &mut v as *mut u32 as *mut c_void,
                4,
                &mut written,
            )
        };
        (s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    }

    /// `id`, tile, stages, split-K and reduction, swizzle, custom option, inner and cluster shape ids.
    fn describe(&self) -> String {
        use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
        let f = |attr, size| match self.config(attr, size) {
            Some(v) => v.to_string(),
            None => "?".into(),
        };
        format!(
            "lt id {} tile {} stages {} splitK {} red {} swz {} custom {} inner {} cluster {}",
            f(A::CUBLASLT_ALGO_CONFIG_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_STAGES_ID, 4),
            f(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
            f(A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
            f(A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, 4),
            f(A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4),
            f(A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2),
            f(A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2),
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

    /// This algorithm with split-K off (one pass over K, no reduction), when cuBLASLt takes the setting.
    fn without_split_k(mut self) -> Option<Algo> {
        use lt::cublasLtMatmulAlgoConfigAttributes_t as A;
        (self.set_config(A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1)
            && self.set_config(
                A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                lt::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32,
            ))
        .then_some(self)
    }
}

fn ok(op: &'static str, s: lt::cublasStatus_t) -> Result<(), CudaError> {
    use blas_sys::cublasStatus_t as B;
    use lt::cublasStatus_t as L;
    let b = match s {
        L::CUBLAS_STATUS_SUCCESS => return Ok(()),
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
    Err(CudaError::Blas {
        op,
        err: blas_result::CublasError(b),
    })
}

/// The descriptors of one problem (created per call: a few host allocations, no device work).
struct Problem {
    desc: lt::cublasLtMatmulDesc_t,
    /// w_cm [K, N] (ld ldw, transposed), x_cm [K, T] (ld ldx), y_cm [N, T] (ld ldy): C and D.
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
}

// SAFETY: cuBLASLt descriptors are host objects owned by this value; after creation they are only read (by
// cublasLtMatmul and cublasLtMatmulAlgoCheck), under the `Pinned::problems` lock.
unsafe impl Send for Problem {}

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
    /// The key's problem at `t` rows: f32 output and accumulation.
    fn new(key: &Key, t: usize) -> Result<Problem, CudaError> {
        let mut p = Problem {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
        };
        let f32t = lt::cudaDataType::CUDA_R_32F;
        let (dt, compute) = match key.dtype {
            Dtype::F32 => (f32t, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC),
            Dtype::Bf16 => (
                lt::cudaDataType::CUDA_R_16BF,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            Dtype::F16 => (
                lt::cudaDataType::CUDA_R_16F,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
        };
        // SAFETY: out-parameters, and attribute buffers of the documented types (int32 for TRANSA).
        unsafe {
            ok(
                "cublasLtMatmulDescCreate",
                lt::cublasLtMatmulDescCreate(&mut p.desc, compute, f32t),
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
                lt::cublasLtMatrixLayoutCreate(
                    &mut p.a,
                    dt,
                    key.k as u64,
                    key.n as u64,
                    key.ldw as i64,
                ),
            )?;
            ok(
                "cublasLtMatrixLayoutCreate(x)",
                lt::cublasLtMatrixLayoutCreate(
                    &mut p.b,
                    dt,
                    key.k as u64,
                    t as u64,
                    key.ldx as i64,
                ),
            )?;
            ok(
                "cublasLtMatrixLayoutCreate(y)",
                lt::cublasLtMatrixLayoutCreate(
                    &mut p.c,
                    f32t,
                    key.n as u64,
                    t as u64,
                    key.ldy as i64,
                ),
            )?;
        }
        Ok(p)
    }

    /// The heuristic's candidates (up to [`CANDIDATES`]) for these alignments and the workspace.
    fn heuristics(&self, ctx: &LtCtx, align: [u32; 3]) -> Result<Vec<Algo>, CudaError> {
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
            vec![unsafe { std::mem::zeroed() }; CANDIDATES];
        let mut got = 0i32;
        // SAFETY: res has room for CANDIDATES results.
        let s = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                ctx.handle.0,
                self.desc,
                self.a,
                self.b,
                self.c,
                self.c,
                pref,
                CANDIDATES as i32,
                res.as_mut_ptr(),
                &mut got,
            )
        };
        // NOT_SUPPORTED: no algorithm for this problem (e.g. its alignments).
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
            .map(|r| Algo { raw: r.algo })
            .collect())
    }

    /// `cublasLtMatmulAlgoCheck`: whether `algo` runs this problem within the workspace.
    fn check(&self, ctx: &LtCtx, algo: &Algo) -> bool {
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
        s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.workspaceSize <= WORKSPACE_BYTES
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
        (alpha, beta): (f32, f32),
    ) -> Result<(), CudaError> {
        let ws = g.ptr(&ctx.workspace);
        // SAFETY: pointers are live device buffers of the shapes in the layouts; the workspace holds
        // WORKSPACE_BYTES, at least what the check found the algorithm needs.
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

/// The key's algorithm: the heuristic's first candidate at [`T_REF`] rows that admits the alignments and runs
/// without split-K. `None`: no such candidate.
fn choose(ctx: &LtCtx, key: &Key) -> Result<Option<Algo>, CudaError> {
    let p = Problem::new(key, T_REF)?;
    Ok(p.heuristics(ctx, key.align)?
        .into_iter()
        .filter_map(Algo::without_split_k)
        .find(|a| a.admits(key.align) && p.check(ctx, a)))
}

/// `y[T, N] (row stride ldy) = x[T, K] (row stride ldx) · w[N, K]ᵀ (row stride ldw) + beta · y` through the key's
/// pinned algorithm (module docs); `Ok(false)`: not run (no pinned algorithm for the key or this T, or cuBLASLt
/// missing), the caller runs GemmEx.
pub fn gemm_pinned(
    g: &Gpu,
    (x, ldx): (u64, usize),
    t: usize,
    k: usize,
    (w, ldw): (W, usize),
    n: usize,
    (y, ldy): (u64, usize),
    beta: f32,
) -> Result<bool, CudaError> {
    let (wp, dtype, alpha) = match w {
        W::Bf16(p) => (p, Dtype::Bf16, 1.0),
        W::F32(p) => (p, Dtype::F32, 1.0),
        W::Half { w, shift } => (w, Dtype::F16, crate::gemm::half_alpha(shift)),
        // Block formats run crate::qgemm; the caller's GemmEx path refuses them.
        W::Pq2 { .. } | W::Q8 { .. } | W::F16(_) | W::F32Rows(_) => return Ok(false),
    };
    let key = Key {
        n,
        k,
        ldx,
        ldw,
        ldy,
        accumulate: beta != 0.0,
        dtype,
        align: [align_of(wp), align_of(x), align_of(y)],
    };
    let Ok(ctx) = ctx(g) else {
        return Ok(fall_back(g, &key, t, "cuBLASLt is unavailable"));
    };
    let algo = {
        let mut algos = g.pinned.algos.lock().unwrap_or_else(|e| e.into_inner());
        match algos.get(&key) {
            Some(a) => *a,
            None => {
                let a = choose(ctx, &key)?;
                algos.insert(key, a);
                a
            }
        }
    };
    let Some(algo) = algo else {
        return Ok(fall_back(
            g,
            &key,
            t,
            "no cuBLASLt algorithm without split-K",
        ));
    };
    let mut problems = g.pinned.problems.lock().unwrap_or_else(|e| e.into_inner());
    if !problems.contains_key(&(key, t)) {
        if problems.len() >= PROBLEMS_KEPT {
            problems.clear();
        }
        let p = Problem::new(&key, t)?;
        let ok = p.check(ctx, &algo);
        problems.insert((key, t), ok.then_some(p));
    }
    let Some(Some(p)) = problems.get(&(key, t)) else {
        drop(problems);
        let why = "cuBLASLt rejects the key's algorithm at this T";
        return Ok(fall_back(g, &key, t, why));
    };
    p.run(g, ctx, &algo, x, wp, y, (alpha, beta))?;
    Ok(true)
}

/// Counts a GEMM that takes GemmEx, with a line on stderr the first time one does. → false.
fn fall_back(g: &Gpu, key: &Key, t: usize, why: &str) -> bool {
    if g.pinned.fallbacks.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!(
            "onepass: batch-invariant GEMM {} x {} at {t} rows: {why}; cublasGemmEx instead (results may depend on \
             the batch)",
            key.n, key.k
        );
    }
    false
}

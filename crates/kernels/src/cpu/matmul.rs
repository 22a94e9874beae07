//! `y = x · Wᵀ` for weights stored row-major as `[N, K]` (the Hugging Face `nn.Linear` layout) in
//! f32, bf16, f16, Q8_0, PQ2_0 or PTQ1_0: the weight's format picks the kernel (PQ2_0 runs the ternary
//! kernels of [`super::ternary`], PTQ1_0 those of [`super::ptq1_0`], Q8_0 the block dot products of
//! [`super::q8_0`]).
//!
//! f32, bf16 and f16 weights take one kernel for any number of tokens, so that an output's sum is the same
//! whatever else is stacked with its token (batch invariance: a System One request answers bit for bit alike alone
//! and batched, tests/batch_invariance.rs in onepass-decide). Every output `x[i] · w[j]` is summed in one order
//! that depends on K alone: 16 lanes (8 without AVX-512) over the first K rounded down to the lanes, lane `l`
//! summing the products at `l mod lanes` in order, the lanes reduced in a fixed tree, then the remaining products
//! added in order. The output features are split into blocks, one rayon task each (256 rows for one or two tokens,
//! where the weights are streamed once; else four blocks per thread); with AVX-512 a task runs one register tile
//! generic over the weight's widening (bf16 and f16 widened in registers): 1 or 2 tokens × 8 weight rows, the next
//! 8 rows prefetched, for decode; 8 tokens × 3 rows for more tokens, over groups of rows sized for L2 and K in
//! spans sized for L1, the sums carried between spans; elsewhere 2 × 4. Blocks, tiles and spans change which
//! products run together, never an output's order.
//!
//! Q8_0 weights regrouped for the CPU ([`DType::Q8_0G`](onepass_tensor::DType::Q8_0G), what a model prepared for
//! the CPU holds where the processor has AVX-512 VNNI) run the integer kernels of [`super::q8_0_vnni`] for any number
//! of tokens (activations rounded to 16 bits per 128-value block; each token's outputs computed alike whatever else is
//! stacked, decode and prefill alike). Q8_0 weights as stored: prefill (several tokens) runs the same integer GEMM,
//! regrouping the rows per call, where the processor has AVX-512 VNNI and K is a multiple of 128; elsewhere it
//! decodes each block of W to f32 once and runs the packed GEMM of the `gemm` crate on it, whose blocking depends on
//! the tokens stacked. Their decode (one or two tokens) streams each row once through the block dot products
//! ([`super::q8_0::rows_q8_0`]: a row's codes widened once for both tokens).

use half::{bf16, f16};
use onepass_tensor::{Tensor, View};
use rayon::prelude::*;

use super::ptq1_0::ptq1_0_matmul_t;
use super::q8_0::{decode_q8_0, dot_q8_0, rows_q8_0};
use super::q8_0_amx;
use super::q8_0_vnni::{self, q8_0_dot_rows_vnni, Q8Weight};
use super::sgemm::{sgemm_raw, Mat};
use super::ternary::ternary_matmul_t;
use super::ternary_grouped;
use super::tiled::{rows_tiled, Rows};

/// Output features handled per task in the GEMM path: at least this many...
const BLOCK_N_MIN: usize = 64;
/// ...and at most this many (the GEMM repacks the activations once per block, so blocks should
/// be large; rayon still needs several blocks per thread to balance).
const BLOCK_N_MAX: usize = 512;
/// Up to this many tokens Q8_0 weights take the matrix-vector path, and the float kernels stream each weight row
/// once per task (blocks of [`GEMV_ROWS`]).
const GEMV_MAX_T: usize = 2;
/// Output rows per task in the matrix-vector path.
const GEMV_ROWS: usize = 256;

/// Whether this processor runs the kernels of `dtype`'s regrouped form ([`Tensor::grouped`]: Q8_0 as
/// [`DType::Q8_0G`](onepass_tensor::DType::Q8_0G), PQ2_0 as [`DType::PQ2_0G`](onepass_tensor::DType::PQ2_0G)): a
/// model regroups its matrices for the CPU only where it does.
pub fn runs_grouped(dtype: onepass_tensor::DType) -> bool {
    match dtype {
        onepass_tensor::DType::Q8_0 => q8_0_vnni::available(),
        onepass_tensor::DType::PQ2_0 => ternary_grouped::available(),
        _ => false,
    }
}

/// `y[T, N] = x[T, K] · w[N, K]ᵀ`.
///
/// Panics if the buffers do not match the shapes (a programming error, never user input).
pub fn matmul_t(x: &[f32], t: usize, w: &Tensor, y: &mut [f32]) {
    let (n, k) = weight_dims(w);
    assert_eq!(
        x.len(),
        t * k,
        "matmul_t {}: x has {} values, want [{t}, {k}]",
        w.name(),
        x.len()
    );
    assert_eq!(
        y.len(),
        t * n,
        "matmul_t {}: y has {} values, want [{t}, {n}]",
        w.name(),
        y.len()
    );
    if t == 0 || n == 0 {
        return;
    }
    match w.view() {
        View::PQ2_0(raw) => return ternary_matmul_t(x, t, raw, n, k, y),
        View::PTQ1_0(raw) => return ptq1_0_matmul_t(x, t, raw, n, k, y),
        View::F32(v) => return rows_tiled(x, t, k, n, Rows::F32(v), y),
        View::BF16(v) => return rows_tiled(x, t, k, n, Rows::Bf16(v), y),
        View::F16(v) => return rows_tiled(x, t, k, n, Rows::F16(v), y),
        View::Q8_0G(g) => return q8_0_matmul(x, t, &[(Q8Weight::Grouped(g), n)], k, &mut [y]),
        View::PQ2_0G(g) => return ternary_grouped::matmul_t_many(x, t, &[(g, n)], k, &mut [y]),
        View::Q8_0(_) => {}
    }
    if t <= GEMV_MAX_T {
        gemv(x, t, k, n, w, y);
    } else if let (View::Q8_0(raw), true) =
        (w.view(), k.is_multiple_of(128) && q8_0_vnni::available())
    {
        q8_0_matmul(x, t, &[(Q8Weight::Blocks(raw), n)], k, &mut [y]);
    } else {
        gemm_blocks(x, t, k, n, w, y);
    }
}

/// `ys[i][T, N_i] = x[T, K] · ws[i][N_i, K]ᵀ` for weights that read one activation (gate and up, q, k and v): each
/// output the one [`matmul_t`] gives for its weight alone. Packed ternary weights of one format where the integer
/// kernels run, and regrouped weights of one form, share one rounding of x and one parallel loop over all their
/// rows; others run one by one.
///
/// Panics if the buffers do not match the shapes, as [`matmul_t`].
pub fn matmul_t_many(x: &[f32], t: usize, ws: &[&Tensor], ys: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), ys.len(), "matmul_t_many: one output per weight");
    // A packed ternary weight's format, blocks and shape.
    fn packed(w: &Tensor) -> Option<(super::ternary_vnni::Packed, &[u8], usize, usize)> {
        use super::ternary_vnni::Packed;
        let (n, k) = weight_dims(w);
        match w.view() {
            View::PQ2_0(raw) => Some((Packed::Pq2_0, raw, n, k)),
            View::PTQ1_0(raw) => Some((Packed::Ptq1_0, raw, n, k)),
            _ => None,
        }
    }
    // Regrouped weights of one form and K share one rounding of x too.
    let dims: Vec<(usize, usize)> = ws.iter().map(|w| weight_dims(w)).collect();
    let one_k = ws.len() > 1 && dims.iter().all(|d| d.1 == dims[0].1);
    // Every weight in one regrouped form, with its N; else None.
    let all_as = |form: fn(View<'_>) -> Option<&[u8]>| -> Option<Vec<(&[u8], usize)>> {
        ws.iter()
            .zip(&dims)
            .map(|(w, &(n, _))| form(w.view()).map(|g| (g, n)))
            .collect()
    };
    if let (Some(parts), true) = (
        all_as(|v| match v {
            View::PQ2_0G(g) => Some(g),
            _ => None,
        }),
        one_k,
    ) {
        return ternary_grouped::matmul_t_many(x, t, &parts, dims[0].1, ys);
    }
    if let (Some(parts), true) = (
        all_as(|v| match v {
            View::Q8_0G(g) => Some(g),
            _ => None,
        }),
        one_k,
    ) {
        let parts: Vec<(Q8Weight<'_>, usize)> = parts
            .into_iter()
            .map(|(g, n)| (Q8Weight::Grouped(g), n))
            .collect();
        return q8_0_matmul(x, t, &parts, dims[0].1, ys);
    }
    let parts: Option<Vec<_>> = ws.iter().map(|w| packed(w)).collect();
    if let Some(parts) = parts.filter(|p| {
        p.len() > 1
            && t > 0
            && super::ternary_vnni::available()
            && p.iter().all(|&(f, _, _, k)| (f, k) == (p[0].0, p[0].3))
    }) {
        let (format, k) = (parts[0].0, parts[0].3);
        for (&(_, raw, n, _), y) in parts.iter().zip(ys.iter()) {
            super::ternary::check_packed_shapes(
                "matmul_t_many",
                format.shape(),
                x,
                t,
                raw,
                n,
                k,
                y,
            );
        }
        let parts: Vec<(&[u8], usize)> = parts.iter().map(|&(_, raw, n, _)| (raw, n)).collect();
        // SAFETY: the shapes are checked above; the integer kernels are available.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            super::ternary_vnni::matmul_t_many(format, x, t, &parts, k, ys)
        };
        return;
    }
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        matmul_t(x, t, w, y);
    }
}

/// Q8_0 weights that read one activation `x[T, K]` (one or more; as stored or regrouped), each into its `ys[i]`:
/// on the AMX tile unit for calls of at least [`q8_0_amx::MIN_TOKENS`] tokens where the processor has it and K is
/// whole groups of 512, else on the VNNI byte dot products.
fn q8_0_matmul(
    x: &[f32],
    t: usize,
    parts: &[(Q8Weight<'_>, usize)],
    k: usize,
    ys: &mut [&mut [f32]],
) {
    if t >= q8_0_amx::MIN_TOKENS
        && k.is_multiple_of(onepass_tensor::Q8_0G_VALUES)
        && q8_0_amx::available()
    {
        q8_0_amx::matmul_t_many(x, t, parts, k, ys);
    } else {
        q8_0_vnni::q8_0_matmul_t_many(x, t, parts, k, ys);
    }
}

/// Slow twin of [`matmul_t`]: one f64-accumulated dot product per output.
pub fn matmul_t_reference(x: &[f32], t: usize, w: &Tensor, y: &mut [f32]) {
    let (n, k) = weight_dims(w);
    let wf = w.to_f32_vec();
    for i in 0..t {
        for j in 0..n {
            let mut acc = 0.0f64;
            for c in 0..k {
                acc += x[i * k + c] as f64 * wf[j * k + c] as f64;
            }
            y[i * n + j] = acc as f32;
        }
    }
}

/// `out[i] = x · w[rows[i]]` for one activation vector `x[K]` and selected weight rows.
pub fn dot_rows(x: &[f32], w: &Tensor, rows: &[u32], out: &mut [f32]) {
    let (n, k) = weight_dims(w);
    assert_eq!(x.len(), k);
    assert_eq!(out.len(), rows.len());
    let view = w.view();
    // A regrouped weight: the integer kernel's value for each row, as the whole matmul gives it.
    match view {
        View::Q8_0G(g) => return q8_0_dot_rows_vnni(x, Q8Weight::Grouped(g), n, k, rows, out),
        View::PQ2_0G(g) => return ternary_grouped::dot_rows(x, g, n, k, rows, out),
        _ => {}
    }
    for (o, &r) in out.iter_mut().zip(rows) {
        let r = r as usize;
        assert!(r < n, "dot_rows {}: row {r} of {n}", w.name());
        *o = dot_row(&view, r, k, x);
    }
}

fn weight_dims(w: &Tensor) -> (usize, usize) {
    match w.shape() {
        [n, k] => (*n, *k),
        s => panic!("matmul weight {} must be 2-D, is {s:?}", w.name()),
    }
}

/// The Q8_0 matrix-vector path of one or two tokens: each task owns GEMV_ROWS consecutive outputs of every token,
/// streams those weight rows exactly once ([`rows_q8_0`]) and writes the outputs straight into y.
fn gemv(x: &[f32], t: usize, k: usize, n: usize, w: &Tensor, y: &mut [f32]) {
    let View::Q8_0(raw) = w.view() else {
        unreachable!("only Q8_0 weights take the matrix-vector path")
    };
    let dst = SharedMut(y.as_mut_ptr());
    let dst = &dst;
    (0..n.div_ceil(GEMV_ROWS))
        .into_par_iter()
        .for_each_init(Vec::new, |out: &mut Vec<f32>, b| {
            let r0 = b * GEMV_ROWS;
            let rows = GEMV_ROWS.min(n - r0);
            out.resize(t * rows, 0.0);
            rows_q8_0(x, t, k, raw, r0, out);
            for i in 0..t {
                for (j, v) in out[i * rows..(i + 1) * rows].iter().enumerate() {
                    // SAFETY: y is [t, n] (checked by matmul_t); columns r0..r0 + rows belong to this task only.
                    unsafe { *dst.0.add(i * n + r0 + j) = *v };
                }
            }
        });
}

fn gemm_blocks(x: &[f32], t: usize, k: usize, n: usize, w: &Tensor, y: &mut [f32]) {
    let view = w.view();
    let view = &view;
    let per_thread = 4 * rayon::current_num_threads().max(1);
    let block_n = n
        .div_ceil(per_thread)
        .next_multiple_of(16)
        .clamp(BLOCK_N_MIN, BLOCK_N_MAX);
    let nblocks = n.div_ceil(block_n);
    // Every block writes a disjoint set of columns of y, straight into y.
    let dst = SharedMut(y.as_mut_ptr());
    let dst = &dst;
    (0..nblocks)
        .into_par_iter()
        .for_each_init(Vec::new, |scratch: &mut Vec<f32>, b| {
            let r0 = b * block_n;
            let r1 = (r0 + block_n).min(n);
            let rows = r1 - r0;
            let wb: &[f32] = match view {
                View::Q8_0(raw) => {
                    let rb = k / 32 * 34;
                    scratch.resize(rows * k, 0.0);
                    decode_q8_0(&raw[r0 * rb..r1 * rb], scratch);
                    scratch
                }
                View::F32(_)
                | View::BF16(_)
                | View::F16(_)
                | View::PQ2_0(_)
                | View::PTQ1_0(_)
                | View::Q8_0G(_)
                | View::PQ2_0G(_) => {
                    unreachable!("float, ternary and regrouped weights run their own kernels")
                }
            };
            // SAFETY: y is [t, n] (checked by matmul_t); this task writes only columns r0..r1 of each
            // row, which no other task writes, and y outlives the parallel loop.
            unsafe {
                sgemm_raw(
                    dst.0.add(r0),
                    n,
                    Mat::rm(x, t, k),
                    Mat::rm_t(wb, k, rows),
                    false,
                )
            };
        });
}

/// A destination pointer shared by tasks that write disjoint elements.
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: only used for disjoint writes, see gemv and gemm_blocks.
unsafe impl Sync for SharedMut {}

/// Widens bf16 to f32 (exact: bf16 is the top half of an f32).
pub fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the processor supports AVX2 (checked above).
            return unsafe { widen_bf16_avx2(src, dst) };
        }
    }
    widen_bf16_portable(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_bf16_avx2(src: &[bf16], dst: &mut [f32]) {
    // The same loop, compiled with AVX2 so it vectorises.
    widen_bf16_portable(src, dst)
}

#[inline(always)]
fn widen_bf16_portable(src: &[bf16], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(src) {
        *o = f32::from_bits((h.to_bits() as u32) << 16);
    }
}

fn dot_row(view: &View<'_>, r: usize, k: usize, x: &[f32]) -> f32 {
    match view {
        View::F32(v) => dot_f32(&v[r * k..(r + 1) * k], x),
        View::BF16(v) => dot_bf16(&v[r * k..(r + 1) * k], x),
        View::F16(v) => dot_f16(&v[r * k..(r + 1) * k], x),
        View::Q8_0(raw) => {
            let rb = k / 32 * 34;
            dot_q8_0(&raw[r * rb..(r + 1) * rb], x)
        }
        View::PQ2_0(raw) => {
            let rb = k / 128 * 34;
            let mut out = [0.0f32];
            ternary_matmul_t(x, 1, &raw[r * rb..(r + 1) * rb], 1, k, &mut out);
            out[0]
        }
        View::PTQ1_0(raw) => {
            let rb = k / 128 * 28;
            let mut out = [0.0f32];
            ptq1_0_matmul_t(x, 1, &raw[r * rb..(r + 1) * rb], 1, k, &mut out);
            out[0]
        }
        View::Q8_0G(_) | View::PQ2_0G(_) => {
            unreachable!("regrouped rows are read by dot_rows' integer kernels")
        }
    }
}

/// Dot product of two f32 vectors with 16 independent accumulators.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the processor supports AVX-512F (checked above).
            return unsafe { simd::dot_f32_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the processor supports AVX2 and FMA (checked above).
            return unsafe { simd::dot_f32_avx2(a, b) };
        }
    }
    dot_f32_portable(a, b)
}

fn dot_f32_portable(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<16, f32>(a, b, |x| x)
}

/// `a · b` with `L` independent accumulators (lane `l` sums the products at `l mod L`), summed
/// at the end, then the remainder added in order; `widen` must be exact.
#[inline(always)]
fn dot_lanes<const L: usize, T: Copy>(a: &[T], b: &[f32], widen: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0.0f32; L];
    let mut ca = a.chunks_exact(L);
    let mut cb = b.chunks_exact(L);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..L {
            acc[l] += widen(x[l]) * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += widen(*x) * y;
    }
    s
}

/// Dot product of a bf16 weight row with an f32 vector, widening in registers.
pub fn dot_bf16(a: &[bf16], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the processor supports AVX-512F (checked above).
            return unsafe {
                simd::dot_half_avx512::<false>(a.as_ptr() as *const u16, a.len().min(b.len()), b)
            };
        }
    }
    dot_lanes::<16, bf16>(a, b, |x| f32::from_bits((x.to_bits() as u32) << 16))
}

fn dot_f16(a: &[f16], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the processor supports AVX-512F (checked above), which has the 512-bit vcvtph2ps.
            return unsafe {
                simd::dot_half_avx512::<true>(a.as_ptr() as *const u16, a.len().min(b.len()), b)
            };
        }
    }
    dot_lanes::<8, f16>(a, b, f16::to_f32)
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use half::bf16;
    use std::arch::x86_64::*;

    /// `a · b` in two accumulators of `$lanes` lanes, reduced by `$hsum`, then the remainder in
    /// order: the same kernel at two vector widths.
    macro_rules! dot_f32_two_acc {
        ($name:ident, $features:literal, $lanes:literal, $zero:ident, $load:ident, $fmadd:ident, $add:ident, $hsum:ident) => {
            #[target_feature(enable = $features)]
            pub unsafe fn $name(a: &[f32], b: &[f32]) -> f32 {
                let n = a.len().min(b.len());
                let mut acc0 = $zero();
                let mut acc1 = $zero();
                let mut i = 0;
                while i + 2 * $lanes <= n {
                    // SAFETY: i + 2 * lanes <= n keeps both loads inside the slices.
                    unsafe {
                        acc0 = $fmadd($load(a.as_ptr().add(i)), $load(b.as_ptr().add(i)), acc0);
                        acc1 = $fmadd(
                            $load(a.as_ptr().add(i + $lanes)),
                            $load(b.as_ptr().add(i + $lanes)),
                            acc1,
                        );
                    }
                    i += 2 * $lanes;
                }
                // SAFETY: the processor has the features this function is compiled for.
                let mut s = unsafe { $hsum($add(acc0, acc1)) };
                while i < n {
                    s += a[i] * b[i];
                    i += 1;
                }
                s
            }
        };
    }

    dot_f32_two_acc!(
        dot_f32_avx512,
        "avx512f",
        16,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        hsum_avx512
    );
    dot_f32_two_acc!(
        dot_f32_avx2,
        "avx2,fma",
        8,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        hsum_avx2
    );

    /// The lanes' sum in the AVX-512 reduction's order.
    #[target_feature(enable = "avx512f")]
    unsafe fn hsum_avx512(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// The 8 lanes summed in order.
    #[target_feature(enable = "avx2")]
    unsafe fn hsum_avx2(v: __m256) -> f32 {
        let mut lanes = [0.0f32; 8];
        // SAFETY: lanes holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes.iter().sum()
    }

    /// `a · b` for 16-bit weights (`F16`: IEEE half, widened by `vcvtph2ps`; else bf16, the top half of an f32) in
    /// two 16-lane accumulators, then the remainder in order.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_half_avx512<const F16: bool>(pa: *const u16, n: usize, b: &[f32]) -> f32 {
        let widen = |h: __m256i| {
            if F16 {
                _mm512_cvtph_ps(h)
            } else {
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
        };
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: i + 32 <= n keeps the 2 x 16 weight and f32 loads inside the slices.
            unsafe {
                let w0 = widen(_mm256_loadu_si256(pa.add(i) as *const __m256i));
                let w1 = widen(_mm256_loadu_si256(pa.add(i + 16) as *const __m256i));
                acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(b.as_ptr().add(i)), acc0);
                acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(b.as_ptr().add(i + 16)), acc1);
            }
            i += 32;
        }
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        while i < n {
            // SAFETY: i < n.
            let h = unsafe { *pa.add(i) };
            let w = if F16 {
                half::f16::from_bits(h).to_f32()
            } else {
                bf16::from_bits(h).to_f32()
            };
            s += w * b[i];
            i += 1;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 + seed as f32 * 7.3) * 0.618).sin())
            .collect()
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-4 * (1.0 + b.abs())
    }

    /// Checks `matmul_t` against `matmul_t_reference` for `x` of `t` tokens; returns the
    /// reference.
    fn assert_fast_matches_reference(x: &[f32], t: usize, w: &Tensor, what: &str) -> Vec<f32> {
        let n = w.shape()[0];
        let mut fast = vec![0.0; t * n];
        let mut slow = vec![0.0; t * n];
        matmul_t(x, t, w, &mut fast);
        matmul_t_reference(x, t, w, &mut slow);
        for (a, b) in fast.iter().zip(&slow) {
            assert!(close(*a, *b), "{what}: {a} vs {b}");
        }
        slow
    }

    /// A Q8_0 tensor [n, k] with varied scales and every code value.
    fn q8_0(n: usize, k: usize) -> Tensor {
        let mut raw = Vec::new();
        for b in 0..n * k / 32 {
            let d = 0.001 + 0.0007 * (b % 13) as f32;
            raw.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            raw.extend((0..32).map(|i| ((i * 71 + b * 29) % 256) as u8));
        }
        Tensor::from_raw("w", onepass_tensor::DType::Q8_0, vec![n, k], &raw).expect("q8_0")
    }

    #[test]
    fn q8_0_fast_matches_reference_on_odd_shapes() {
        for (t, k, n) in [
            (1, 32, 1),
            (1, 96, 37),
            (2, 160, 5),
            (3, 96, 70),
            (17, 224, 131),
            (64, 64, 513),
        ] {
            let x = pseudo(t * k, 3);
            let w = q8_0(n, k);
            let slow = assert_fast_matches_reference(&x, t, &w, &format!("t={t} k={k} n={n}"));
            let rows: Vec<u32> = (0..n as u32).rev().step_by(3).collect();
            let mut picked = vec![0.0; rows.len()];
            dot_rows(&x[..k], &w, &rows, &mut picked);
            for (p, &r) in picked.iter().zip(&rows) {
                let b = slow[r as usize];
                assert!(close(*p, b), "row {r}: {p} vs {b}");
            }
        }
    }

    /// `wv` as an [N, K] weight in `dtype` (BF16, F16, else F32).
    fn weight_as(dtype: onepass_tensor::DType, n: usize, k: usize, wv: &[f32]) -> Tensor {
        use onepass_tensor::DType;
        match dtype {
            DType::BF16 => Tensor::from_f32_as_bf16("w", vec![n, k], wv),
            DType::F16 => {
                let raw: Vec<u8> = wv
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect();
                Tensor::from_raw("w", DType::F16, vec![n, k], &raw).expect("f16")
            }
            _ => Tensor::from_f32("w", vec![n, k], wv),
        }
    }

    /// The weights in `dtype` (F32, BF16 or F16), fast against the reference.
    fn check(t: usize, k: usize, n: usize, dtype: onepass_tensor::DType) {
        let x = pseudo(t * k, 1);
        let wv = pseudo(n * k, 2);
        let w = weight_as(dtype, n, k, &wv);
        assert_fast_matches_reference(&x, t, &w, &format!("t={t} k={k} n={n} {dtype:?}"));
    }

    #[test]
    fn fast_matches_reference_on_odd_shapes() {
        use onepass_tensor::DType;
        for &(t, k, n) in &[
            (1, 63, 5),
            (2, 130, 257),
            (3, 17, 65),
            (7, 100, 129),
            (64, 33, 300),
            (65, 257, 70),
            // K a multiple of 16: bf16 takes the AVX-512 register-blocked kernel where there is
            // one (partial 4 x 4 tiles; 300 tokens span two token tiles).
            (5, 48, 131),
            (300, 16, 9),
            // Decode over a long row: the 16-bit dots' SIMD loop and their remainder.
            (1, 1031, 33),
            // One and two tokens, K a multiple of 16: full 8-row stream tiles and a partial one.
            (1, 64, 21),
            (2, 64, 21),
        ] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                check(t, k, n, dtype);
            }
        }
    }

    /// Batch invariance: a token's outputs are bit-identical whatever is stacked with it (alone, beside one other
    /// token, in 3, 5, 64 or 300 tokens, first or last), for every float format and K with and without a remainder
    /// of the lanes. K = 2,100 runs the AVX-512 prefill tiles over three spans of K; on one thread its 520 rows
    /// are one block of several row groups (60 rows of f32, 123 of bf16 or f16), so it runs on the global pool and
    /// on a pool of one thread, whose blocks do not depend on the machine's core count.
    #[test]
    fn float_outputs_do_not_depend_on_the_tokens_stacked() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool");
        float_outputs_alone_and_stacked_agree();
        one.install(float_outputs_alone_and_stacked_agree);
    }

    fn float_outputs_alone_and_stacked_agree() {
        use onepass_tensor::DType;
        for (k, n) in [(64, 37), (100, 300), (17, 9), (1031, 5), (2100, 520)] {
            let wv = pseudo(n * k, 2);
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let w = weight_as(dtype, n, k, &wv);
                let token = pseudo(k, 9);
                let mut alone = vec![0.0; n];
                matmul_t(&token, 1, &w, &mut alone);
                for t in [2, 3, 5, 64, 300] {
                    for at in [0, t - 1] {
                        let mut x = pseudo(t * k, 5);
                        x[at * k..(at + 1) * k].copy_from_slice(&token);
                        let mut y = vec![0.0; t * n];
                        matmul_t(&x, t, &w, &mut y);
                        let got = &y[at * n..(at + 1) * n];
                        assert!(
                            got.iter()
                                .zip(&alone)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{dtype:?} k={k} n={n}: token {at} of {t} differs from alone"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dot_rows_reads_the_named_rows() {
        let k = 37;
        let wv = pseudo(10 * k, 3);
        let w = Tensor::from_f32_as_bf16("w", vec![10, k], &wv);
        let x = pseudo(k, 4);
        let mut out = [0.0; 3];
        dot_rows(&x, &w, &[9, 0, 4], &mut out);
        let mut all = vec![0.0; 10];
        matmul_t_reference(&x, 1, &w, &mut all);
        for (o, r) in out.iter().zip([9, 0, 4]) {
            assert!((o - all[r]).abs() < 1e-4);
        }
    }
}

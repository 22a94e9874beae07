//! `y = x · Wᵀ` with `W` stored packed as PQ2_0 blocks: the ternary matvec (decode, one token)
//! and GEMM (prefill, several tokens), reading the 2-bit codes directly (2.125 bits per weight in
//! memory; no float copy of the matrix is ever made).
//!
//! Layout (the GGUF PQ2_0 type, see docs/formats.md): row `r` of `W[N, K]` is `K / 128`
//! consecutive 34-byte blocks; a block is an f16 scale `d` and 32 code bytes, value `j` of the
//! block being `(code − 1)·d` with the code in bits `2·(j % 4)` of byte `j / 4`. Read as a
//! little-endian `u32`, code bytes `4g..4g+4` hold values `16g..16g+16` at bits `2·i`.
//!
//! The fast paths decode 16 values per instruction group: the code word is broadcast to every
//! lane, each lane shifts it right by `2·lane`, and an in-lane table lookup (`vpermilps`, which
//! reads the two low bits of each index) maps the code to `(code − 1)·d`, ignoring the codes
//! above it. The table `[−d, 0, d, 2d]` is built once per block and row, so the
//! scale costs one multiply per 128 weights. A tile of `R` weight rows × `TT` tokens shares each
//! decoded vector over `TT` tokens and each activation load over `R` rows; rayon splits the rows
//! across cores. AVX-512 tiles are 4 rows × up to 4 tokens, AVX2 tiles 2 rows × up to 2 tokens;
//! [`ternary_matmul_t_reference`] is the slow twin (f64 accumulation, one value at a time).
//!
//! Where the processor has AVX-512 VNNI and GFNI, [`TernaryPath::detect`] picks instead the integer kernel of
//! `super::ternary_vnni` (for PTQ1_0 too), which rounds the activations to 16 bits per 128-value block (relative
//! error ≤ 2⁻¹⁶ of the block's largest value) and is about twice as fast; the f32 paths stay for the processors
//! without it and as its comparison.

use half::f16;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::ternary_vnni::{matmul_t as vnni_matmul_t, Packed};

/// Values per PQ2_0 block.
pub const PQ2_0_BLOCK: usize = 128;
/// Bytes per PQ2_0 block.
pub const PQ2_0_BYTES: usize = 34;
/// Weight rows per rayon task.
pub(super) const ROWS_PER_TASK: usize = 64;

/// Which implementation [`ternary_matmul_t_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TernaryPath {
    /// Integer dot products on activations rounded to 16 bits per 128-value block (`super::ternary_vnni`).
    Avx512Vnni,
    Avx512,
    Avx2,
    /// Plain Rust, the same tiling (for processors without AVX2).
    Portable,
}

impl TernaryPath {
    /// The fastest path this processor supports.
    pub fn detect() -> TernaryPath {
        [
            TernaryPath::Avx512Vnni,
            TernaryPath::Avx512,
            TernaryPath::Avx2,
        ]
        .into_iter()
        .find(|p| p.available())
        .unwrap_or(TernaryPath::Portable)
    }

    /// Whether the path rounds the activations to 16 bits per 128-value block before its dot products (the
    /// integer kernels); the others multiply the f32 activations as given.
    pub fn rounds_activations(self) -> bool {
        self == TernaryPath::Avx512Vnni
    }

    /// Whether this processor can run the path.
    pub fn available(self) -> bool {
        match self {
            TernaryPath::Portable => true,
            TernaryPath::Avx512Vnni => super::ternary_vnni::available(),
            #[cfg(target_arch = "x86_64")]
            TernaryPath::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            TernaryPath::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// `y[T, N] = x[T, K] · W[N, K]ᵀ`, `w` the PQ2_0 blocks of `W` (`N · K / 128 · 34` bytes).
///
/// Panics if the buffers do not match the shapes or `K` is not a multiple of 128 (programming
/// errors: the loader checks the file's shapes).
pub fn ternary_matmul_t(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &mut [f32]) {
    ternary_matmul_t_with(TernaryPath::detect(), x, t, w, n, k, y)
}

/// [`ternary_matmul_t`] on a chosen path (tests and benchmarks compare them); panics if the
/// processor lacks it.
pub fn ternary_matmul_t_with(
    path: TernaryPath,
    x: &[f32],
    t: usize,
    w: &[u8],
    n: usize,
    k: usize,
    y: &mut [f32],
) {
    check_shapes(x, t, w, n, k, y);
    assert!(
        path.available(),
        "ternary matmul: {path:?} is not available on this processor"
    );
    if t == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path == TernaryPath::Avx512Vnni {
        // SAFETY: shapes checked above; the path is available (asserted above).
        unsafe { vnni_matmul_t(Packed::Pq2_0, x, t, w, n, k, y) };
        return;
    }
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of y, which no other task writes; the
    // path is available (asserted above).
    unsafe { for_row_tasks(n, y, |r0, r1, y| rows(path, x, t, w, k, r0, r1, y, n)) };
}

/// Slow twin: every weight decoded on its own, products summed in f64.
pub fn ternary_matmul_t_reference(
    x: &[f32],
    t: usize,
    w: &[u8],
    n: usize,
    k: usize,
    y: &mut [f32],
) {
    check_shapes(x, t, w, n, k, y);
    let row_bytes = k / PQ2_0_BLOCK * PQ2_0_BYTES;
    for r in 0..n {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for i in 0..t {
            let xi = &x[i * k..(i + 1) * k];
            let mut acc = 0.0f64;
            for (b, block) in row.chunks_exact(PQ2_0_BYTES).enumerate() {
                let d = f64::from(f16::from_le_bytes([block[0], block[1]]).to_f32());
                for j in 0..PQ2_0_BLOCK {
                    let code = (block[2 + j / 4] >> (2 * (j % 4))) & 3;
                    acc += (f64::from(code) - 1.0) * d * f64::from(xi[b * PQ2_0_BLOCK + j]);
                }
            }
            y[i * n + r] = acc as f32;
        }
    }
}

fn check_shapes(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &[f32]) {
    check_packed_shapes(
        "ternary matmul",
        (PQ2_0_BLOCK, PQ2_0_BYTES),
        x,
        t,
        w,
        n,
        k,
        y,
    );
}

/// The shape checks of a packed ternary matmul (`what` names it in the panic): `(block, bytes)` values and bytes
/// per block, `x` [t, k], `y` [t, n], `w` n rows of k / block blocks.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_packed_shapes(
    what: &str,
    (block, bytes): (usize, usize),
    x: &[f32],
    t: usize,
    w: &[u8],
    n: usize,
    k: usize,
    y: &[f32],
) {
    assert!(
        k.is_multiple_of(block),
        "{what}: K = {k} is not a multiple of {block}"
    );
    assert_eq!(
        x.len(),
        t * k,
        "{what}: x has {} values, want [{t}, {k}]",
        x.len()
    );
    assert_eq!(
        y.len(),
        t * n,
        "{what}: y has {} values, want [{t}, {n}]",
        y.len()
    );
    assert_eq!(
        w.len(),
        n * (k / block) * bytes,
        "{what}: w has {} bytes, want {n} rows of {} blocks",
        w.len(),
        k / block
    );
}

/// Output pointers shared by tasks that write disjoint elements.
struct SharedMut(Vec<*mut f32>);
// SAFETY: only used for disjoint writes (each task owns a range of one output's columns).
unsafe impl Sync for SharedMut {}

/// Calls `rows(r0, r1, y)` for the output columns `r0..r1` of `y` [t, n] in tasks of [`ROWS_PER_TASK`], in parallel.
///
/// # Safety
/// `rows` writes only columns `r0..r1` of each of y's `t` rows (row stride n) through the pointer it is given.
pub(super) unsafe fn for_row_tasks(
    n: usize,
    y: &mut [f32],
    rows: impl Fn(usize, usize, *mut f32) + Sync,
) {
    // SAFETY: the caller's contract, for one output.
    unsafe { for_row_tasks_many(&[n], &mut [y], |_, r0, r1, y| rows(r0, r1, y)) };
}

/// Calls `rows(i, r0, r1, y_i)` for the output columns `r0..r1` of each `ys[i]` ([t, ns[i]]) in tasks of
/// [`ROWS_PER_TASK`], every output's tasks in one parallel loop (weights that read one activation: one hand-off to
/// the thread pool, not one each).
///
/// # Safety
/// `rows` writes only columns `r0..r1` of each of `ys[i]`'s `t` rows (row stride `ns[i]`) through the pointer it
/// is given.
pub(super) unsafe fn for_row_tasks_many(
    ns: &[usize],
    ys: &mut [&mut [f32]],
    rows: impl Fn(usize, usize, usize, *mut f32) + Sync,
) {
    let dst = SharedMut(ys.iter_mut().map(|y| y.as_mut_ptr()).collect());
    let dst = &dst;
    let tasks: Vec<(usize, usize)> = ns
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| (0..n).step_by(ROWS_PER_TASK).map(move |r0| (i, r0)))
        .collect();
    tasks.into_par_iter().for_each(|(i, r0)| {
        rows(i, r0, (r0 + ROWS_PER_TASK).min(ns[i]), dst.0[i]);
    });
}

/// Rows `r0..r1` of the output for every token.
///
/// # Safety
/// `y` is `[t, n]`, the shapes are checked, `path` is available.
#[allow(clippy::too_many_arguments)]
unsafe fn rows(
    path: TernaryPath,
    x: &[f32],
    t: usize,
    w: &[u8],
    k: usize,
    r0: usize,
    r1: usize,
    y: *mut f32,
    n: usize,
) {
    // AVX2 has 16 vector registers: 2 rows × 2 tokens keeps accumulators, activations, tables
    // and shifts in registers; AVX-512's 32 fit 4 × 4.
    let (row_tile, token_tile) = match path {
        TernaryPath::Avx512 => (4, 4),
        _ => (2, 2),
    };
    let mut r = r0;
    while r < r1 {
        let rt = row_tile.min(r1 - r);
        let mut t0 = 0;
        while t0 < t {
            let tt = token_tile.min(t - t0);
            // SAFETY: forwarded from the caller.
            unsafe { tile(path, rt, tt, x, k, t0, w, r, y, n) };
            t0 += tt;
        }
        r += rt;
    }
}

/// Calls `$f::<RT, TT>$args` for a tile of `$rt` rows by `$tt` tokens (each 1 to 4): the PQ2_0 and PTQ1_0 tile
/// kernels are generic over the tile so that their accumulators live in registers.
macro_rules! dispatch_tile {
    ($f:ident, $rt:expr, $tt:expr, $args:tt) => {
        match ($rt, $tt) {
            (1, 1) => $f::<1, 1> $args,
            (1, 2) => $f::<1, 2> $args,
            (1, 3) => $f::<1, 3> $args,
            (1, 4) => $f::<1, 4> $args,
            (2, 1) => $f::<2, 1> $args,
            (2, 2) => $f::<2, 2> $args,
            (2, 3) => $f::<2, 3> $args,
            (2, 4) => $f::<2, 4> $args,
            (3, 1) => $f::<3, 1> $args,
            (3, 2) => $f::<3, 2> $args,
            (3, 3) => $f::<3, 3> $args,
            (3, 4) => $f::<3, 4> $args,
            (4, 1) => $f::<4, 1> $args,
            (4, 2) => $f::<4, 2> $args,
            (4, 3) => $f::<4, 3> $args,
            (4, 4) => $f::<4, 4> $args,
            other => unreachable!("tile {other:?}"),
        }
    };
}
pub(super) use dispatch_tile;

/// One tile: rows `r..r + rt`, tokens `t0..t0 + tt`.
///
/// # Safety
/// As [`rows`].
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    path: TernaryPath,
    rt: usize,
    tt: usize,
    x: &[f32],
    k: usize,
    t0: usize,
    w: &[u8],
    r: usize,
    y: *mut f32,
    n: usize,
) {
    let row_bytes = k / PQ2_0_BLOCK * PQ2_0_BYTES;
    let w = &w[r * row_bytes..(r + rt) * row_bytes];
    let x = &x[t0 * k..(t0 + tt) * k];
    let y = y.wrapping_add(t0 * n + r);
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and F16C available (caller); slices bounded above.
        TernaryPath::Avx512 => unsafe {
            dispatch_tile!(tile_avx512, rt, tt, (x, k, w, row_bytes, y, n))
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C available (caller); slices bounded above.
        TernaryPath::Avx2 => unsafe {
            dispatch_tile!(tile_avx2, rt, tt, (x, k, w, row_bytes, y, n))
        },
        // SAFETY: y + i·n + j for i < tt, j < rt lies in the caller's [t, n] buffer.
        _ => unsafe { dispatch_tile!(tile_portable, rt, tt, (x, k, w, row_bytes, y, n)) },
    }
}

/// Scale of a block.
#[inline(always)]
fn block_scale(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[0], block[1]]).to_f32()
}

/// # Safety
/// `y + i·n + j` is writable for `i < TT`, `j < R`.
unsafe fn tile_portable<const R: usize, const TT: usize>(
    x: &[f32],
    k: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    let mut acc = [[0f32; TT]; R];
    for b in 0..k / PQ2_0_BLOCK {
        for (rr, acc_r) in acc.iter_mut().enumerate() {
            let block = &w[rr * row_bytes + b * PQ2_0_BYTES..][..PQ2_0_BYTES];
            let d = block_scale(block);
            let table = [-d, 0.0, d, 2.0 * d];
            let mut part = [0f32; TT];
            for j in 0..PQ2_0_BLOCK {
                let v = table[((block[2 + j / 4] >> (2 * (j % 4))) & 3) as usize];
                for (i, p) in part.iter_mut().enumerate() {
                    *p += v * x[i * k + b * PQ2_0_BLOCK + j];
                }
            }
            for (a, p) in acc_r.iter_mut().zip(part) {
                *a += p;
            }
        }
    }
    for (rr, acc_r) in acc.iter().enumerate() {
        for (i, &a) in acc_r.iter().enumerate() {
            // SAFETY: see the function's contract.
            unsafe { *y.add(i * n + rr) = a };
        }
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A block's f16 scale through the F16C instruction (inlined, unlike a runtime-dispatched call).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "f16c")]
fn scale_f16c(block: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([block[0], block[1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// # Safety
/// AVX-512F and F16C present; `y + i·n + j` writable for `i < TT`, `j < R`; `x` is `[TT, k]` and `w` holds
/// `R` rows of `row_bytes`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn tile_avx512<const R: usize, const TT: usize>(
    x: &[f32],
    k: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    assert!(x.len() >= TT * k && w.len() >= R * row_bytes);
    let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    // The lookup [−1, 0, 1, 2] in every 128-bit lane, indexed by the code in the two low bits.
    let base = _mm512_setr_ps(
        -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0,
    );
    let mut acc = [[_mm512_setzero_ps(); TT]; R];
    let xp = x.as_ptr();
    let wp = w.as_ptr();
    for b in 0..k / PQ2_0_BLOCK {
        let mut tables = [base; R];
        for (rr, table) in tables.iter_mut().enumerate() {
            let block = &w[rr * row_bytes + b * PQ2_0_BYTES..][..2];
            *table = _mm512_mul_ps(base, _mm512_set1_ps(scale_f16c(block)));
        }
        for g in 0..PQ2_0_BLOCK / 16 {
            let col = b * PQ2_0_BLOCK + g * 16;
            let mut xs = [_mm512_setzero_ps(); TT];
            for (i, xv) in xs.iter_mut().enumerate() {
                // SAFETY: col + 16 <= k and i < TT, inside x (asserted above).
                *xv = unsafe { _mm512_loadu_ps(xp.add(i * k + col)) };
            }
            for rr in 0..R {
                // SAFETY: code word g of block b of row rr, inside w (asserted above).
                let word = unsafe {
                    (wp.add(rr * row_bytes + b * PQ2_0_BYTES + 2 + 4 * g) as *const i32)
                        .read_unaligned()
                };
                let idx = _mm512_srlv_epi32(_mm512_set1_epi32(word), shifts);
                let wv = _mm512_permutevar_ps(tables[rr], idx);
                for i in 0..TT {
                    acc[rr][i] = _mm512_fmadd_ps(wv, xs[i], acc[rr][i]);
                }
            }
        }
    }
    for rr in 0..R {
        for i in 0..TT {
            // SAFETY: see the function's contract.
            unsafe { *y.add(i * n + rr) = _mm512_reduce_add_ps(acc[rr][i]) };
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C present; otherwise as [`tile_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const R: usize, const TT: usize>(
    x: &[f32],
    k: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    assert!(x.len() >= TT * k && w.len() >= R * row_bytes);
    let shifts_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    let shifts_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    // The lookup [−1, 0, 1, 2] in each 128-bit lane; vpermilps reads the two low index bits.
    let base = _mm256_setr_ps(-1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0);
    let mut acc = [[_mm256_setzero_ps(); TT]; R];
    let xp = x.as_ptr();
    let wp = w.as_ptr();
    for b in 0..k / PQ2_0_BLOCK {
        let mut tables = [base; R];
        for (rr, table) in tables.iter_mut().enumerate() {
            let block = &w[rr * row_bytes + b * PQ2_0_BYTES..][..2];
            *table = _mm256_mul_ps(base, _mm256_set1_ps(scale_f16c(block)));
        }
        for g in 0..PQ2_0_BLOCK / 16 {
            let col = b * PQ2_0_BLOCK + g * 16;
            let mut xlo = [_mm256_setzero_ps(); TT];
            let mut xhi = [_mm256_setzero_ps(); TT];
            for i in 0..TT {
                // SAFETY: col + 16 <= k and i < TT, inside x (asserted above).
                unsafe {
                    xlo[i] = _mm256_loadu_ps(xp.add(i * k + col));
                    xhi[i] = _mm256_loadu_ps(xp.add(i * k + col + 8));
                }
            }
            for rr in 0..R {
                // SAFETY: code word g of block b of row rr, inside w (asserted above).
                let word = unsafe {
                    (wp.add(rr * row_bytes + b * PQ2_0_BYTES + 2 + 4 * g) as *const i32)
                        .read_unaligned()
                };
                let wb = _mm256_set1_epi32(word);
                let lo = _mm256_permutevar_ps(tables[rr], _mm256_srlv_epi32(wb, shifts_lo));
                let hi = _mm256_permutevar_ps(tables[rr], _mm256_srlv_epi32(wb, shifts_hi));
                for i in 0..TT {
                    acc[rr][i] = _mm256_fmadd_ps(lo, xlo[i], acc[rr][i]);
                    acc[rr][i] = _mm256_fmadd_ps(hi, xhi[i], acc[rr][i]);
                }
            }
        }
    }
    for rr in 0..R {
        for i in 0..TT {
            let v = acc[rr][i];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            // SAFETY: see the function's contract.
            unsafe { *y.add(i * n + rr) = _mm_cvtss_f32(s) };
        }
    }
}

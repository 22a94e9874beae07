//! `y = x · Wᵀ` with `W` stored packed as PTQ1_0 blocks (1.75 bits per weight), read as stored: the
//! matvec (decode) and GEMM (prefill) twins of [`super::ternary`] for PrismML's base-3 layout. No
//! copy of the matrix is made, neither in floats nor transcoded to PQ2_0.
//!
//! Layout (the GGUF PTQ1_0 type, see docs/formats.md): row `r` of `W[N, K]` is `K / 128`
//! consecutive 28-byte blocks; a block is 24 bytes of five base-3 digits ("trits"), 2 bytes of
//! four, then the f16 scale `d`; value `(trit − 1)·d`. A byte `q` holds its trit `n` as
//! `((q · 3ⁿ) mod 256) · 3 / 256`; writing `u₀ = q`, `yₙ = 3·uₙ`, trit `n` is `yₙ >> 8` and
//! `uₙ₊₁ = yₙ mod 256`, two adds, a shift and a mask per trit. The order is staged: trit `n` of
//! byte `m < 16` is value `16n + m`, so five passes over bytes 0..16 give values 0..80 sixteen at a
//! time, already in order; trit `n` of byte `16 + m` (`m < 8`) is value `80 + 8n + m`, so values
//! 80..120 are eight-value runs of bytes 16..24; and trit `n` of byte `24 + h` is value
//! `120 + 2n + h`.
//!
//! A tile of `R` weight rows × `TT` tokens decodes each block of a row once into the eight 16-value
//! vectors of `(trit − 1)·d` (the same table lookup the PQ2_0 kernels use, so the values and the
//! order of the multiply-adds are those of the PQ2_0 kernel on the transcoded blocks: the results are
//! the same bits), then runs them over the `TT` tokens. [`ptq1_0_matmul_t_reference`] is the slow
//! twin (f64 accumulation, each value decoded on its own from the layout rule). On the AVX-512 VNNI path the
//! integer kernel of `super::ternary_vnni` runs instead (rounded activations; equal to the PQ2_0 one up to f32
//! rounding, not bit for bit).

use half::f16;

use super::ternary::{check_packed_shapes, for_row_tasks, TernaryPath};
#[cfg(target_arch = "x86_64")]
use super::ternary_vnni::{matmul_t as vnni_matmul_t, Packed};

/// Values per PTQ1_0 block.
pub const PTQ1_0_BLOCK: usize = 128;
/// Bytes per PTQ1_0 block.
pub const PTQ1_0_BYTES: usize = 28;

/// `y[T, N] = x[T, K] · W[N, K]ᵀ`, `w` the PTQ1_0 blocks of `W` (`N · K / 128 · 28` bytes).
///
/// Panics if the buffers do not match the shapes or `K` is not a multiple of 128 (programming
/// errors: the loader checks the file's shapes).
pub fn ptq1_0_matmul_t(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &mut [f32]) {
    ptq1_0_matmul_t_with(TernaryPath::detect(), x, t, w, n, k, y)
}

/// [`ptq1_0_matmul_t`] on a chosen path; panics if the processor lacks it.
pub fn ptq1_0_matmul_t_with(
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
        "PTQ1_0 matmul: {path:?} is not available on this processor"
    );
    if t == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path == TernaryPath::Avx512Vnni {
        // SAFETY: shapes checked above; the path is available (asserted above).
        unsafe { vnni_matmul_t(Packed::Ptq1_0, x, t, w, n, k, y) };
        return;
    }
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of y, which no other task writes; the
    // path is available (asserted above).
    unsafe { for_row_tasks(n, y, |r0, r1, y| rows(path, x, t, w, k, r0, r1, y, n)) };
}

/// The byte and trit holding value `j` (0..128) of a PTQ1_0 block, from the layout rule.
pub const fn ptq1_0_position(j: usize) -> (usize, u32) {
    match j {
        0..80 => (j % 16, (j / 16) as u32),
        80..120 => (16 + (j - 80) % 8, ((j - 80) / 8) as u32),
        _ => (24 + (j - 120) % 2, ((j - 120) / 2) as u32),
    }
}

/// Slow twin: every weight decoded on its own, products summed in f64.
pub fn ptq1_0_matmul_t_reference(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &mut [f32]) {
    check_shapes(x, t, w, n, k, y);
    let row_bytes = k / PTQ1_0_BLOCK * PTQ1_0_BYTES;
    for r in 0..n {
        let row = &w[r * row_bytes..(r + 1) * row_bytes];
        for i in 0..t {
            let xi = &x[i * k..(i + 1) * k];
            let mut acc = 0.0f64;
            for (b, block) in row.chunks_exact(PTQ1_0_BYTES).enumerate() {
                let d = f64::from(f16::from_le_bytes([block[26], block[27]]).to_f32());
                for j in 0..PTQ1_0_BLOCK {
                    let (byte, n) = ptq1_0_position(j);
                    let scaled = u32::from(block[byte]) * 3u32.pow(n) % 256;
                    let trit = scaled * 3 / 256;
                    acc += (f64::from(trit) - 1.0) * d * f64::from(xi[b * PTQ1_0_BLOCK + j]);
                }
            }
            y[i * n + r] = acc as f32;
        }
    }
}

fn check_shapes(x: &[f32], t: usize, w: &[u8], n: usize, k: usize, y: &[f32]) {
    check_packed_shapes(
        "PTQ1_0 matmul",
        (PTQ1_0_BLOCK, PTQ1_0_BYTES),
        x,
        t,
        w,
        n,
        k,
        y,
    );
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
    let (row_tile, token_tile) = match path {
        TernaryPath::Avx512 => (4, 4),
        _ => (2, 2),
    };
    let row_bytes = k / PTQ1_0_BLOCK * PTQ1_0_BYTES;
    let mut r = r0;
    while r < r1 {
        let rt = row_tile.min(r1 - r);
        let mut t0 = 0;
        while t0 < t {
            let tt = token_tile.min(t - t0);
            let w = &w[r * row_bytes..(r + rt) * row_bytes];
            let x = &x[t0 * k..(t0 + tt) * k];
            let y = y.wrapping_add(t0 * n + r);
            // SAFETY: forwarded from the caller; y + i·n + j for i < tt, j < rt lies in [t, n].
            unsafe { tile(path, rt, tt, x, k, w, row_bytes, y, n) };
            t0 += tt;
        }
        r += rt;
    }
}

use super::ternary::dispatch_tile;

/// One tile: `w` holds `rt` rows, `x` `tt` tokens, `y` points at the tile's first output.
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
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and F16C available (caller); slices bounded by the caller.
        TernaryPath::Avx512 => unsafe {
            dispatch_tile!(tile_avx512, rt, tt, (x, k, w, row_bytes, y, n))
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C available (caller).
        TernaryPath::Avx2 => unsafe {
            dispatch_tile!(tile_avx2, rt, tt, (x, k, w, row_bytes, y, n))
        },
        // SAFETY: see the caller.
        _ => unsafe { dispatch_tile!(tile_portable, rt, tt, (x, k, w, row_bytes, y, n)) },
    }
}

/// The trits of one block in value order (the portable decoder).
#[inline(always)]
fn block_trits(block: &[u8]) -> [u8; PTQ1_0_BLOCK] {
    let mut t = [0u8; PTQ1_0_BLOCK];
    let mut stage =
        |bytes: std::ops::Range<usize>, trits: u32, place: &dyn Fn(usize, usize) -> usize| {
            for m in bytes.clone() {
                let mut u = u16::from(block[m]);
                for n in 0..trits as usize {
                    let y = 3 * u;
                    t[place(n, m - bytes.start)] = (y >> 8) as u8;
                    u = y & 0xFF;
                }
            }
        };
    stage(0..16, 5, &|n, m| 16 * n + m);
    stage(16..24, 5, &|n, m| 80 + 8 * n + m);
    stage(24..26, 4, &|n, h| 120 + 2 * n + h);
    t
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
    for b in 0..k / PTQ1_0_BLOCK {
        for (rr, acc_r) in acc.iter_mut().enumerate() {
            let block = &w[rr * row_bytes + b * PTQ1_0_BYTES..][..PTQ1_0_BYTES];
            let d = f16::from_le_bytes([block[26], block[27]]).to_f32();
            let table = [-d, 0.0, d, 2.0 * d];
            let trits = block_trits(block);
            let mut part = [0f32; TT];
            for (j, &tr) in trits.iter().enumerate() {
                let v = table[tr as usize];
                for (i, p) in part.iter_mut().enumerate() {
                    *p += v * x[i * k + b * PTQ1_0_BLOCK + j];
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

/// A block's f16 scale (bytes 26, 27) through F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "f16c")]
fn scale_f16c(block: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([block[26], block[27]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Trits 0..5 of eight bytes (u32 lanes below 256), each as a lane index: `out[n]` is trit `n`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn trits8(mut u: __m256i, out: &mut [__m256i; 5]) {
    let low = _mm256_set1_epi32(0xFF);
    for o in out.iter_mut() {
        let y = _mm256_add_epi32(u, _mm256_slli_epi32::<1>(u));
        *o = _mm256_srli_epi32::<8>(y);
        u = _mm256_and_si256(y, low);
    }
}

/// Values 120..128 of a block (trit `n` of byte `24 + h` is value `120 + 2n + h`) as lane indices.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn tail_trits(block: &[u8]) -> __m256i {
    let qh = i32::from(u16::from_le_bytes([block[24], block[25]]));
    let low = _mm256_set1_epi32(0xFF);
    // Lane l holds byte 24 + l % 2 times 3^(l / 2), mod 256.
    let bytes = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(qh),
            _mm256_setr_epi32(0, 8, 0, 8, 0, 8, 0, 8),
        ),
        low,
    );
    let u = _mm256_and_si256(
        _mm256_mullo_epi32(bytes, _mm256_setr_epi32(1, 1, 3, 3, 9, 9, 27, 27)),
        low,
    );
    _mm256_srli_epi32::<8>(_mm256_add_epi32(u, _mm256_slli_epi32::<1>(u)))
}

/// Trit indices of one block as 16 eight-lane vectors in value order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn block_indices_avx2(block: &[u8]) -> [__m256i; 16] {
    assert!(block.len() >= PTQ1_0_BYTES);
    let p = block.as_ptr() as *const __m128i;
    // SAFETY: bytes 0..16 and 16..24 of the block (asserted above).
    let (lo, mid) = unsafe { (_mm_loadu_si128(p), _mm_loadl_epi64(p.add(1))) };
    let mut out = [_mm256_setzero_si256(); 16];
    let mut t = [_mm256_setzero_si256(); 5];
    // Values 0..80: trit n of bytes 0..8 and 8..16 are values 16n..16n+8 and 16n+8..16n+16.
    trits8(_mm256_cvtepu8_epi32(lo), &mut t);
    for n in 0..5 {
        out[2 * n] = t[n];
    }
    trits8(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(lo)), &mut t);
    for n in 0..5 {
        out[2 * n + 1] = t[n];
    }
    // Values 80..120: trit n of bytes 16..24 are values 80 + 8n .. 88 + 8n.
    trits8(_mm256_cvtepu8_epi32(mid), &mut t);
    out[10..15].copy_from_slice(&t);
    out[15] = tail_trits(block);
    out
}

/// # Safety
/// AVX-512F and F16C present; `y + i·n + j` writable for `i < TT`, `j < R`; `x` is `[TT, k]` and
/// `w` holds `R` rows of `row_bytes`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn tile_avx512<const R: usize, const TT: usize>(
    x: &[f32],
    k: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
    n: usize,
) {
    assert!(x.len() >= TT * k && w.len() >= R * row_bytes);
    let base = _mm512_setr_ps(
        -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0,
    );
    let low = _mm512_set1_epi32(0xFF);
    let mut acc = [[_mm512_setzero_ps(); TT]; R];
    let xp = x.as_ptr();
    for b in 0..k / PTQ1_0_BLOCK {
        for rr in 0..R {
            let block = &w[rr * row_bytes + b * PTQ1_0_BYTES..][..PTQ1_0_BYTES];
            let table = _mm512_mul_ps(base, _mm512_set1_ps(scale_f16c(block)));
            let mut v = [_mm512_setzero_ps(); 8];
            // Values 0..80: five passes over bytes 0..16, sixteen values each.
            // SAFETY: bytes 0..16 of the block.
            let mut u =
                _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(block.as_ptr() as *const __m128i) });
            for vn in v.iter_mut().take(5) {
                let y3 = _mm512_add_epi32(u, _mm512_slli_epi32::<1>(u));
                *vn = _mm512_permutevar_ps(table, _mm512_srli_epi32::<8>(y3));
                u = _mm512_and_si512(y3, low);
            }
            // Values 80..128: eight-value runs of bytes 16..24, then the two four-trit bytes.
            let mut t = [_mm256_setzero_si256(); 5];
            // SAFETY: bytes 16..24 of the block.
            let mid = unsafe { _mm_loadl_epi64(block.as_ptr().add(16) as *const __m128i) };
            trits8(_mm256_cvtepu8_epi32(mid), &mut t);
            let pairs = [(t[0], t[1]), (t[2], t[3]), (t[4], tail_trits(block))];
            for (vn, (a, c)) in v[5..].iter_mut().zip(pairs) {
                let idx = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c);
                *vn = _mm512_permutevar_ps(table, idx);
            }
            for (g, vg) in v.iter().enumerate() {
                let col = b * PTQ1_0_BLOCK + g * 16;
                for i in 0..TT {
                    // SAFETY: col + 16 <= k and i < TT, inside x (asserted above).
                    let xv = unsafe { _mm512_loadu_ps(xp.add(i * k + col)) };
                    acc[rr][i] = _mm512_fmadd_ps(*vg, xv, acc[rr][i]);
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
    let base = _mm256_setr_ps(-1.0, 0.0, 1.0, 2.0, -1.0, 0.0, 1.0, 2.0);
    let mut acc = [[_mm256_setzero_ps(); TT]; R];
    let xp = x.as_ptr();
    for b in 0..k / PTQ1_0_BLOCK {
        for rr in 0..R {
            let block = &w[rr * row_bytes + b * PTQ1_0_BYTES..][..PTQ1_0_BYTES];
            let table = _mm256_mul_ps(base, _mm256_set1_ps(scale_f16c(block)));
            let idx = block_indices_avx2(block);
            // Pairs of eight-value halves in value order, multiply-added lo then hi as the PQ2_0
            // kernel does.
            for g in 0..8 {
                let lo = _mm256_permutevar_ps(table, idx[2 * g]);
                let hi = _mm256_permutevar_ps(table, idx[2 * g + 1]);
                let col = b * PTQ1_0_BLOCK + g * 16;
                for i in 0..TT {
                    // SAFETY: col + 16 <= k and i < TT, inside x (asserted above).
                    let (xlo, xhi) = unsafe {
                        (
                            _mm256_loadu_ps(xp.add(i * k + col)),
                            _mm256_loadu_ps(xp.add(i * k + col + 8)),
                        )
                    };
                    acc[rr][i] = _mm256_fmadd_ps(lo, xlo, acc[rr][i]);
                    acc[rr][i] = _mm256_fmadd_ps(hi, xhi, acc[rr][i]);
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

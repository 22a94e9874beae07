//! Q8_0 prefill on the AMX tile unit (Intel Xeon of the 4th generation and later: `amx_tile`, `amx_bf16`): the
//! products of [`super::q8_0_vnni`] for calls of at least [`MIN_TOKENS`] tokens, on `tdpbf16ps` (a 16 × 16 tile
//! of f32 sums gains 32 bf16 products per output per instruction) instead of byte dot products.
//!
//! The arithmetic: a weight `w = c·d` (an 8-bit code times its block's f16 scale: at most 18 significant bits,
//! exact in f32) and an activation `x` are each split into two bf16 parts, `v = v_hi + v_lo` with
//! `v_hi = bf16(v)` and `v_lo = bf16(v − v_hi)` (round to nearest even, 8 significant bits each: the parts miss
//! `v` by at most 2⁻¹⁶·|v|), and each output sums `w_hi·x_hi + w_hi·x_lo + w_lo·x_hi` over K in f32 (a product
//! of two bf16 is exact in f32; the dropped `w_lo·x_lo` is at most 2⁻¹⁶·|w·x|): each product within 3·2⁻¹⁶ of
//! its value, errors of random sign (seen 1.5e-6 of Σ|w·x| on the tests' data, about the VNNI kernel's 16-bit
//! activations), with no scale per activation block. The three
//! products are one GEMM over a K three times as long: the weights `[w_hi | w_hi | w_lo]` against the activations
//! `[x_hi; x_lo; x_hi]`, in that order.
//!
//! The tiles: the weights are the A operand, 16 rows × 32 values a tile, decoded per task from the regrouped
//! form (a matrix as stored is regrouped per task first) into a panel of 32 rows (both parts: `128·K` bytes, in
//! L2); a tile step takes half of one of a group's code registers, so its 32 values come from 8 blocks (K in the
//! order of the regrouped bytes, which the activations follow). The activations are the B operand, 16 tokens a
//! tile in pairs of values (the instruction's layout), split once per call. Four tiles of 16 rows × 16 tokens (two row
//! tiles × two token tiles) accumulate while the other four registers take two weight and two activation tiles
//! per step. Every output sums its products in one order fixed by K, from its row and token alone: a token's
//! outputs do not depend on the tokens stacked with it among calls that take this path. Calls of fewer tokens
//! (decode, short suffixes) and the row readout of [`super::q8_0_vnni::q8_0_dot_rows_vnni`] take the VNNI kernel,
//! whose rounding differs: on a processor with the tile unit a token's Q8_0 outputs are bit-identical among calls
//! of at least [`MIN_TOKENS`] tokens and among calls of fewer, not from one to the other.
//!
//! Linux gives a process the tile registers' state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), made once
//! by [`available`]; each task loads the tile configuration and releases the tiles when it is done.

use std::sync::OnceLock;

use onepass_tensor::{group_q8_0_row, Q8_0G_BYTES, Q8_0G_VALUES};
use rayon::prelude::*;

use super::q8_0::{Q8_0_BLOCK, Q8_0_BYTES};
use super::q8_0_vnni::Q8Weight;
use super::ternary::for_row_tasks_many;

/// Calls of at least this many tokens take the tile unit (below, decoding each weight for the tile costs more than
/// the byte dot products it saves).
pub const MIN_TOKENS: usize = 64;

/// Rows (and tokens) per tile.
const TILE: usize = 16;
/// Weight rows decoded per panel: two row tiles.
const PANEL_ROWS: usize = 2 * TILE;

/// Whether the processor has the tile unit with bf16 products and the operating system lets this process use it
/// (asked once), besides the AVX-512 (F, BW, BF16) the decoding takes.
pub fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16"))
    {
        return false;
    }
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: asks the kernel for this process's permission to use the tile data state; no memory of ours is
    // read or written.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// A 64-byte line (the unit of the tile buffers, so that every tile starts on a cache line).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; 16]);

const ZERO_LINE: Line = Line([0; 16]);

/// `x[T, K]` split into its bf16 parts as the B operand: `[token tile][part (hi, lo)][K / 32][16 pairs][16
/// tokens]` 32-bit words, each the bf16 of values `2p` and `2p + 1` of its 32 (the first in the low half); the
/// tokens past T are zero, and the tiles are padded to an even count.
struct Activations {
    /// Steps of 32 values (K / 32).
    steps: usize,
    /// Token tiles (even).
    tiles: usize,
    lines: Vec<Line>,
}

impl Activations {
    fn split(x: &[f32], t: usize, k: usize) -> Activations {
        let steps = k / Q8_0_BLOCK;
        let tiles = 2 * t.div_ceil(2 * TILE);
        let per_tile = 2 * steps * TILE;
        let mut lines = vec![ZERO_LINE; tiles * per_tile];
        lines
            .par_chunks_mut(per_tile)
            .enumerate()
            .for_each(|(u, out)| {
                let tokens = TILE.min(t.saturating_sub(u * TILE));
                if tokens > 0 {
                    // SAFETY: `available` (the caller's) covers AVX-512 F, BW and BF16; `out` holds this tile's two
                    // parts of `steps` tiles and the tile's tokens have K values each.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        split_tile(
                            &x[u * TILE * k..(u * TILE + tokens) * k],
                            tokens,
                            steps,
                            out,
                        )
                    };
                }
            });
        Activations {
            steps,
            tiles,
            lines,
        }
    }

    /// Tile `u`'s part (0 hi, 1 lo) at step `s`.
    fn tile(&self, u: usize, part: usize, s: usize) -> *const u8 {
        self.lines[((u * 2 + part) * self.steps + s) * TILE..].as_ptr() as *const u8
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// 32 f32 (`v0` values 0-15, `v1` 16-31) as their two bf16 parts, `hi = bf16(v)` and `lo = bf16(v − hi)` (round
/// to nearest even; an input below the smallest normal reads as zero), each 32 bf16 in order. A NaN stays NaN; an
/// infinity has the low part NaN, so the outputs it reaches are NaN as with float arithmetic.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn split32(v0: __m512, v1: __m512) -> (__m512i, __m512i) {
    // SAFETY (both transmutes): 32 bf16 as the same 64 bytes of integers.
    let hi = unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(v1, v0)) };
    // The high parts back as f32: each bf16 the upper half of its word.
    let h0 = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)));
    let h1 = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(hi)));
    let lo = _mm512_cvtne2ps_pbh(
        _mm512_sub_ps(v1, _mm512_castsi512_ps(h1)),
        _mm512_sub_ps(v0, _mm512_castsi512_ps(h0)),
    );
    (hi, unsafe { std::mem::transmute::<__m512bh, __m512i>(lo) })
}

/// The lane numbers 0..16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lanes() -> __m512i {
    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}

/// Word offsets of one column of a tile: word `j` of each of its 16 lines is `16·line + j`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tile_column() -> __m512i {
    _mm512_mullo_epi32(lanes(), _mm512_set1_epi32(TILE as i32))
}

/// The 16 × 16 words of `r` transposed: word `j` of output `p` is word `p` of `r[j]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(r: &[__m512i; TILE]) -> [__m512i; TILE] {
    // Pairs of rows interleaved by words, then by pairs of words: `q[4g + e]` holds, in 128-bit lane L, word
    // 4L + e of rows 4g..4g + 4.
    let t: [__m512i; TILE] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let q: [__m512i; TILE] = std::array::from_fn(|i| {
        let (g, e) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + e / 2], t[4 * g + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Then the 4 × 4 transpose of 128-bit lanes among q[e], q[4 + e], q[8 + e], q[12 + e]: output 4L + e takes
    // lane L of each.
    let mut out = [_mm512_setzero_si512(); TILE];
    for e in 0..4 {
        let (a, b, c, d) = (q[e], q[4 + e], q[8 + e], q[12 + e]);
        let ab_lo = _mm512_shuffle_i32x4::<0x44>(a, b);
        let ab_hi = _mm512_shuffle_i32x4::<0xEE>(a, b);
        let cd_lo = _mm512_shuffle_i32x4::<0x44>(c, d);
        let cd_hi = _mm512_shuffle_i32x4::<0xEE>(c, d);
        out[e] = _mm512_shuffle_i32x4::<0x88>(ab_lo, cd_lo);
        out[4 + e] = _mm512_shuffle_i32x4::<0xDD>(ab_lo, cd_lo);
        out[8 + e] = _mm512_shuffle_i32x4::<0x88>(ab_hi, cd_hi);
        out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(ab_hi, cd_hi);
    }
    out
}

/// The `tokens` (≤ 16) tokens of a tile split, each step's 16 pairs per part in the tile's 16 lines, token `j` in
/// word `j` (the rest zero). Step `16g + 2r + h` holds, in its 32 slots `4jj + b`, value `32·(8h + jj) + 4r + b` of
/// the token's group `g` of 512 (the order of the regrouped weights, see [`decode_panel`]).
///
/// # Safety
/// AVX-512 F, BW and BF16; `x` holds `tokens` rows of `32·steps` values, a multiple of 512; `out` holds `2·steps`
/// tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split_tile(x: &[f32], tokens: usize, steps: usize, out: &mut [Line]) {
    let k = steps * Q8_0_BLOCK;
    debug_assert!(tokens <= TILE && x.len() == tokens * k && out.len() == 2 * steps * TILE);
    // Values 32·jj + b (jj, b < 4) from `p`: four runs of four.
    let sixteen = |p: *const f32| {
        // SAFETY: the caller's `p` has values up to 100 past it.
        unsafe {
            let v = _mm512_castps128_ps512(_mm_loadu_ps(p));
            let v = _mm512_insertf32x4::<1>(v, _mm_loadu_ps(p.add(32)));
            let v = _mm512_insertf32x4::<2>(v, _mm_loadu_ps(p.add(64)));
            _mm512_insertf32x4::<3>(v, _mm_loadu_ps(p.add(96)))
        }
    };
    let base = out.as_mut_ptr() as *mut __m512i;
    for s in 0..steps {
        let (g, r, h) = (s / 16, (s % 16) / 2, s % 2);
        let first = g * Q8_0G_VALUES + 256 * h + 4 * r;
        let mut hi = [_mm512_setzero_si512(); TILE];
        let mut lo = [_mm512_setzero_si512(); TILE];
        for j in 0..tokens {
            // SAFETY: values first.. first + 228 of token j, inside its group g (the contract).
            let p = unsafe { x.as_ptr().add(j * k + first) };
            (hi[j], lo[j]) = split32(sixteen(p), sixteen(unsafe { p.add(128) }));
        }
        let (hi, lo) = (transpose16(&hi), transpose16(&lo));
        for line in 0..TILE {
            // SAFETY: line `line` of tiles s and steps + s of `out` (the contract).
            unsafe {
                _mm512_storeu_si512(base.add(s * TILE + line), hi[line]);
                _mm512_storeu_si512(base.add((steps + s) * TILE + line), lo[line]);
            }
        }
    }
}

/// Rows `p0..p0 + 32` of the regrouped `w` (those below `n`; the others zero) as the A operand: `[part (hi,
/// lo)][K / 32][row tile][16 rows][32 bf16]`, one tile per part, step and row tile. A group's code register `r`
/// (lane `j`: values `4r..4r + 4` of block `j`) gives two steps, `2r` (lanes 0-7) and `2r + 1` (lanes 8-15), each
/// value times its block's scale; [`split_tile`] puts the activations in the same order.
///
/// # Safety
/// AVX-512 F, BW and BF16; `w` holds `n` rows of `k` values, regrouped; `panel` holds `4·(k / 32)` tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn decode_panel(w: &[u8], k: usize, n: usize, p0: usize, panel: &mut [Line]) {
    let steps = k / Q8_0_BLOCK;
    let per_row = k / Q8_0G_VALUES;
    debug_assert!(panel.len() == 4 * steps * TILE && w.len() == n * per_row * Q8_0G_BYTES);
    // Scale lanes of quarter q of a code register: blocks 4q..4q + 4, each four times.
    let quarter: [__m512i; 4] = std::array::from_fn(|q| {
        _mm512_add_epi32(
            _mm512_srli_epi32::<2>(lanes()),
            _mm512_set1_epi32(4 * q as i32),
        )
    });
    for r in 0..PANEL_ROWS {
        let row = p0 + r;
        let line = |part: usize, s: usize| ((part * steps + s) * 2 + r / TILE) * TILE + r % TILE;
        if row >= n {
            for s in 0..steps {
                panel[line(0, s)] = ZERO_LINE;
                panel[line(1, s)] = ZERO_LINE;
            }
            continue;
        }
        for g in 0..per_row {
            // SAFETY: group g of row `row` lies inside `w` (the contract).
            let gp = unsafe { w.as_ptr().add((row * per_row + g) * Q8_0G_BYTES) };
            // SAFETY: the group's 16 f16 scales, after its 512 code bytes.
            let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(gp.add(512) as *const __m256i) });
            let scales: [__m512; 4] = std::array::from_fn(|q| _mm512_permutexvar_ps(quarter[q], d));
            // The codes are stored plus 128: `(u − 128)·d` as `u·d − 128·d` in one fused step, the same rounding.
            let offsets: [__m512; 4] =
                std::array::from_fn(|q| _mm512_mul_ps(scales[q], _mm512_set1_ps(-128.0)));
            for cr in 0..8 {
                for h in 0..2 {
                    let v: [__m512; 2] = std::array::from_fn(|e| {
                        let q = 2 * h + e;
                        // SAFETY: quarter q of code register cr of the group (16 bytes).
                        let bytes =
                            unsafe { _mm_loadu_si128(gp.add(64 * cr + 16 * q) as *const __m128i) };
                        _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)),
                            scales[q],
                            offsets[q],
                        )
                    });
                    let (hi, lo) = split32(v[0], v[1]);
                    let s = g * 16 + 2 * cr + h;
                    // SAFETY: one line of `panel` each (the contract).
                    unsafe {
                        _mm512_storeu_si512(panel.as_mut_ptr().add(line(0, s)) as *mut __m512i, hi);
                        _mm512_storeu_si512(panel.as_mut_ptr().add(line(1, s)) as *mut __m512i, lo);
                    }
                }
            }
        }
    }
}

/// The tile configuration: palette 1, registers 0-7 each 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// The 2 × 2 products of one step: weight tiles tmm4, tmm5 by activation tiles tmm6, tmm7 into sums tmm0-tmm3.
#[cfg(target_arch = "x86_64")]
macro_rules! four_products {
    () => {
        concat!(
            "tdpbf16ps tmm0, tmm4, tmm6\n",
            "tdpbf16ps tmm1, tmm4, tmm7\n",
            "tdpbf16ps tmm2, tmm5, tmm6\n",
            "tdpbf16ps tmm3, tmm5, tmm7",
        )
    };
}

/// The four 16 × 16 sums of a panel's two row tiles × token tiles `u` and `u + 1`, written to `c` as
/// `[row tile][token tile][16 rows][16 tokens]` f32: over K step by step, each step's parts (hi, hi), (lo, hi), (hi, lo).
///
/// # Safety
/// The tile configuration is loaded; `panel` holds `4·steps` tiles, `a` token tiles `u` and `u + 1`.
#[cfg(target_arch = "x86_64")]
unsafe fn sums(panel: &[Line], a: &Activations, u: usize, c: &mut [Line; 4 * TILE]) {
    let steps = a.steps;
    debug_assert!(panel.len() == 4 * steps * TILE && u + 1 < a.tiles);
    // SAFETY: tile registers only.
    unsafe {
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem, preserves_flags)
        )
    };
    // Step by step, the three products in the order (hi, hi), (lo, hi), (hi, lo): ten tile loads per twelve
    // products, the (hi) weight tiles read a second time from L1 instead of sweeping the panel three times.
    let part = |wp: usize, s: usize| panel[(wp * steps + s) * 2 * TILE..].as_ptr();
    for s in 0..steps {
        let (wh, wl) = (part(0, s), part(1, s));
        // SAFETY: whole tiles of `panel` and `a` (the contract; 16 rows 64 bytes apart).
        unsafe {
            std::arch::asm!(
                "tileloadd tmm4, [{wh0} + {stride}]",
                "tileloadd tmm5, [{wh1} + {stride}]",
                "tileloadd tmm6, [{xh0} + {stride}]",
                "tileloadd tmm7, [{xh1} + {stride}]",
                four_products!(),
                "tileloadd tmm4, [{wl0} + {stride}]",
                "tileloadd tmm5, [{wl1} + {stride}]",
                four_products!(),
                "tileloadd tmm4, [{wh0} + {stride}]",
                "tileloadd tmm5, [{wh1} + {stride}]",
                "tileloadd tmm6, [{xl0} + {stride}]",
                "tileloadd tmm7, [{xl1} + {stride}]",
                four_products!(),
                wh0 = in(reg) wh,
                wh1 = in(reg) wh.add(TILE),
                wl0 = in(reg) wl,
                wl1 = in(reg) wl.add(TILE),
                xh0 = in(reg) a.tile(u, 0, s),
                xh1 = in(reg) a.tile(u + 1, 0, s),
                xl0 = in(reg) a.tile(u, 1, s),
                xl1 = in(reg) a.tile(u + 1, 1, s),
                stride = in(reg) 64usize,
                options(nostack, readonly, preserves_flags)
            )
        };
    }
    let p = c.as_mut_ptr();
    // SAFETY: four tiles of `c`.
    unsafe {
        std::arch::asm!(
            "tilestored [{c0} + {stride}], tmm0",
            "tilestored [{c1} + {stride}], tmm1",
            "tilestored [{c2} + {stride}], tmm2",
            "tilestored [{c3} + {stride}], tmm3",
            c0 = in(reg) p,
            c1 = in(reg) p.add(TILE),
            c2 = in(reg) p.add(2 * TILE),
            c3 = in(reg) p.add(3 * TILE),
            stride = in(reg) 64usize,
            options(nostack, preserves_flags)
        )
    };
}

/// `ys[i] = x · w_iᵀ` for every weight of `parts` (Q8_0 as stored or regrouped, `n_i` rows of `k` values), x
/// split once. Panics unless [`available`] and the shapes agree (K a multiple of 512).
pub(super) fn matmul_t_many(
    x: &[f32],
    t: usize,
    parts: &[(Q8Weight<'_>, usize)],
    k: usize,
    ys: &mut [&mut [f32]],
) {
    assert!(available(), "Q8_0 tiles: not available on this processor");
    assert!(k.is_multiple_of(Q8_0G_VALUES), "Q8_0 tiles: K = {k}");
    assert_eq!(x.len(), t * k, "Q8_0 tiles: x");
    assert_eq!(parts.len(), ys.len(), "Q8_0 tiles: one output per weight");
    for (&(w, n), y) in parts.iter().zip(ys.iter()) {
        match w {
            Q8Weight::Blocks(b) => {
                assert_eq!(b.len(), n * k / Q8_0_BLOCK * Q8_0_BYTES, "Q8_0 tiles: w")
            }
            Q8Weight::Grouped(g) => {
                assert_eq!(g.len(), n * k / Q8_0G_VALUES * Q8_0G_BYTES, "Q8_0 tiles: w")
            }
        }
        assert_eq!(y.len(), t * n, "Q8_0 tiles: y");
    }
    if t == 0 {
        return;
    }
    let a = Activations::split(x, t, k);
    let ns: Vec<usize> = parts.iter().map(|&(_, n)| n).collect();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of output i; the unit is available.
    unsafe {
        for_row_tasks_many(&ns, ys, |i, r0, r1, y| {
            rows(&a, t, parts[i].0, k, ns[i], r0, r1, y)
        })
    };
}

/// The four tiles of [`sums`] into `y` ([t, n]): rows `p0..` below `r1`, tokens of tiles `u` and `u + 1` below `t`,
/// each token's rows of a tile gathered from the tile's column and stored contiguously.
///
/// # Safety
/// AVX-512 F; the rows and tokens written are outputs this call may write.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn write_tiles(
    c: &[Line; 4 * TILE],
    p0: usize,
    r1: usize,
    u: usize,
    t: usize,
    y: *mut f32,
    n: usize,
) {
    // Column j of a tile: word j of each of its 16 lines.
    let column = tile_column();
    for (q, (rt, ut)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
        let row0 = p0 + rt * TILE;
        let count = TILE.min(r1.saturating_sub(row0));
        if count == 0 {
            continue;
        }
        let mask: __mmask16 = if count == TILE {
            0xFFFF
        } else {
            (1u16 << count) - 1
        };
        for j in 0..TILE.min(t.saturating_sub((u + ut) * TILE)) {
            let i = (u + ut) * TILE + j;
            // SAFETY: column j of tile q of `c`; `count` outputs of token i from row0 (the contract).
            unsafe {
                let v = _mm512_i32gather_ps::<4>(
                    column,
                    (c.as_ptr().add(q * TILE) as *const f32).add(j),
                );
                _mm512_mask_storeu_ps(y.add(i * n + row0), mask, v);
            }
        }
    }
}

thread_local! {
    /// Each thread's panel (grown to the largest K it has seen).
    static PANEL: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output columns `r0..r1` of `y` ([t, n]) for every token of `a`.
///
/// # Safety
/// [`available`]; `w` holds `n` rows of `k` values; this call alone writes columns `r0..r1` of `y`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows(
    a: &Activations,
    t: usize,
    w: Q8Weight<'_>,
    k: usize,
    n: usize,
    r0: usize,
    r1: usize,
    y: *mut f32,
) {
    let scratch;
    let (w, rows) = match w {
        Q8Weight::Grouped(g) => (g, 0..n),
        Q8Weight::Blocks(b) => {
            let (rb, gb) = (k / Q8_0_BLOCK * Q8_0_BYTES, k / Q8_0G_VALUES * Q8_0G_BYTES);
            let mut s = vec![0u8; (r1 - r0) * gb];
            for (src, dst) in b[r0 * rb..r1 * rb]
                .chunks_exact(rb)
                .zip(s.chunks_exact_mut(gb))
            {
                group_q8_0_row(src, dst);
            }
            scratch = s;
            (&scratch[..], r0..r1)
        }
    };
    PANEL.with_borrow_mut(|panel| {
        panel.resize(4 * a.steps * TILE, ZERO_LINE);
        let panel = &mut panel[..4 * a.steps * TILE];
        let mut c = [ZERO_LINE; 4 * TILE];
        // SAFETY: the configuration is a valid palette-1 layout; the tiles are released before the thread moves on.
        unsafe {
            std::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CONFIG, options(nostack, readonly, preserves_flags))
        };
        for p0 in (r0..r1).step_by(PANEL_ROWS) {
            // SAFETY: the contract (`w` holds rows `rows` of the weight, regrouped); `panel` is sized for K.
            unsafe { decode_panel(w, k, rows.len(), p0 - rows.start, panel) };
            for u in (0..a.tiles).step_by(2) {
                // SAFETY: configured above; tiles u and u + 1 exist (an even count).
                unsafe { sums(panel, a, u, &mut c) };
                // SAFETY: `c` holds the four tiles; the rows and tokens written are this task's outputs.
                unsafe { write_tiles(&c, p0, r1, u, t, y, n) };
            }
        }
        // SAFETY: tile registers only.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    });
}

#[cfg(test)]
mod tests {
    use super::super::q8_0_test_data::{
        self, bits, decoded, grouped, weights_sharing_x_answer_as_each_alone,
    };
    use super::*;

    /// The slow twin of the kernels' rounding: `v` to bf16 (to nearest, ties to even), as the f32 it stands for.
    fn bf16_round(v: f32) -> f32 {
        let b = v.to_bits();
        f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000)
    }

    /// `v` as its two bf16 parts `(hi, lo)`.
    fn split(v: f32) -> (f32, f32) {
        let hi = bf16_round(v);
        (hi, bf16_round(v - hi))
    }

    /// Whether the tests can run: the build script found the tile unit on the building processor
    /// (`onepass_amx_host`, which un-ignores them); a build moved to a processor without it says so and skips.
    fn here() -> bool {
        if !available() {
            eprintln!(
                "built on a processor with the AMX tile unit, running on one without: skipped"
            );
        }
        available()
    }

    /// Random-ish Q8_0 rows [n, k], a few scales negative.
    fn q8_0(n: usize, k: usize, seed: usize) -> Vec<u8> {
        q8_0_test_data::q8_0(n, k, seed, true)
    }

    fn activations(t: usize, k: usize, seed: usize) -> Vec<f32> {
        (0..t * k)
            .map(|i| {
                let v = ((i * 7919 + seed * 31) % 2003) as f32 / 500.0 - 2.0;
                // Values over six decades, so that the low parts matter.
                v * [1.0, 0.37, 1e-3, 12.5, 3e-6][(i + seed) % 5]
            })
            .collect()
    }

    fn one(x: &[f32], t: usize, w: Q8Weight<'_>, n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; t * n];
        matmul_t_many(x, t, &[(w, n)], k, &mut [&mut y]);
        y
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(onepass_amx_host), ignore = "this processor has no AMX tile unit")]
    fn transpose16_moves_word_p_of_row_j_to_word_j_of_row_p() {
        if !here() {
            return;
        }
        let words: Vec<i32> = (0..256).map(|i| i * 7 + 3).collect();
        // SAFETY: AVX-512 F (the tile unit's processors have it); 16 rows of 16 words.
        let out = unsafe {
            let rows: [__m512i; TILE] = std::array::from_fn(|j| {
                _mm512_loadu_si512(words[16 * j..].as_ptr() as *const __m512i)
            });
            transpose16(&rows)
        };
        for (p, row) in out.iter().enumerate() {
            let mut got = [0i32; 16];
            // SAFETY: 16 words.
            unsafe { _mm512_storeu_si512(got.as_mut_ptr() as *mut __m512i, *row) };
            let want: Vec<i32> = (0..16).map(|j| words[16 * j + p]).collect();
            assert_eq!(got.to_vec(), want, "row {p}");
        }
    }

    #[test]
    fn the_split_recovers_a_value_within_two_to_the_minus_16() {
        for i in 0..20_000u32 {
            let v = f32::from_bits(0x3000_0000 + i.wrapping_mul(2_654_435_761) % 0x2000_0000);
            let v = if i % 2 == 0 { v } else { -v };
            let (hi, lo) = split(v);
            assert_eq!(hi.to_bits() & 0xFFFF, 0);
            assert_eq!(lo.to_bits() & 0xFFFF, 0);
            let err = (f64::from(v) - f64::from(hi) - f64::from(lo)).abs();
            assert!(
                err <= f64::from(v.abs()) * 2f64.powi(-16),
                "{v}: {hi} + {lo}"
            );
        }
        assert!(split(f32::NAN).1.is_nan());
        assert!(split(f32::INFINITY).1.is_nan());
        assert_eq!(split(0.0), (0.0, 0.0));
        // Ties go to even: 1 + 2⁻⁸ (halfway between 1 and 1 + 2⁻⁷) rounds to 1, 1 + 3·2⁻⁸ up to 1 + 2⁻⁶.
        assert_eq!(bf16_round(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(bf16_round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
    }

    #[test]
    #[cfg_attr(not(onepass_amx_host), ignore = "this processor has no AMX tile unit")]
    fn the_tiles_match_the_split_products_and_the_float_product_on_odd_shapes() {
        if !here() {
            return;
        }
        let mut worst = (0f64, 0f64);
        // T: one token tile pair, a tail of one token, odd counts; N: a panel short of rows, tails of the 64-row
        // tasks; K: one to four groups (both forms).
        for (t, k, n, seed) in [
            (32, 512, 1, 1),
            (33, 512, 7, 2),
            (47, 512, 45, 3),
            (64, 1024, 67, 4),
            (100, 1536, 33, 5),
            (35, 2048, 130, 6),
        ] {
            let raw = q8_0(n, k, seed);
            let wf = decoded(&raw);
            let x = activations(t, k, seed);
            let y = one(&x, t, Q8Weight::Blocks(&raw), n, k);
            let g = grouped(&raw, n, k);
            let yg = one(&x, t, Q8Weight::Grouped(&g), n, k);
            assert_eq!(bits(&yg), bits(&y), "t={t} k={k} n={n}: regrouped");
            for i in 0..t {
                let xi = &x[i * k..(i + 1) * k];
                for r in 0..n {
                    let row = &wf[r * k..(r + 1) * k];
                    let (mut exact, mut twin, mut mag) = (0f64, 0f64, 0f64);
                    for (&w, &v) in row.iter().zip(xi) {
                        let ((wh, wl), (xh, xl)) = (split(w), split(v));
                        exact += f64::from(w) * f64::from(v);
                        twin += f64::from(wh) * f64::from(xh)
                            + f64::from(wh) * f64::from(xl)
                            + f64::from(wl) * f64::from(xh);
                        mag += (f64::from(w) * f64::from(v)).abs();
                    }
                    let got = f64::from(y[i * n + r]);
                    let what = format!("t={t} k={k} n={n} ({i}, {r})");
                    // f32 sums over 3K/32 steps of 32 products; each product within 3·2⁻¹⁶ of w·x.
                    assert!(
                        (got - twin).abs() <= 2e-6 * mag + 1e-12,
                        "{what}: {got} vs {twin}"
                    );
                    assert!(
                        (got - exact).abs() <= 5e-5 * mag + 1e-12,
                        "{what}: {got} vs {exact}"
                    );
                    worst.0 = worst.0.max((got - twin).abs() / mag.max(1e-30));
                    worst.1 = worst.1.max((got - exact).abs() / mag.max(1e-30));
                }
            }
        }
        eprintln!(
            "Q8_0 tiles: max |error| / Σ|w·x| vs the split products {:.2e}, vs the float product {:.2e}",
            worst.0, worst.1
        );
    }

    #[test]
    #[cfg_attr(not(onepass_amx_host), ignore = "this processor has no AMX tile unit")]
    fn a_token_reads_the_same_bits_in_calls_of_any_size_and_weights_sharing_it_as_each_alone() {
        if !here() {
            return;
        }
        let (t, k, n) = (70, 1024, 50);
        let raw = q8_0(n, k, 9);
        let g = grouped(&raw, n, k);
        let x = activations(t, k, 9);
        let all = one(&x, t, Q8Weight::Grouped(&g), n, k);
        // The tokens of `order`, stacked.
        let stacked = |order: &[usize]| -> Vec<f32> {
            order
                .iter()
                .flat_map(|&j| x[j * k..(j + 1) * k].to_vec())
                .collect()
        };
        // Token i first among 31 others (the rest of the call in reverse), then last of 37.
        for i in [0, 1, 17, 40, 69] {
            let mut order: Vec<usize> = (0..t).rev().filter(|&j| j != i).take(31).collect();
            order.insert(0, i);
            let some = one(&stacked(&order), 32, Q8Weight::Grouped(&g), n, k);
            assert_eq!(
                bits(&some[..n]),
                bits(&all[i * n..(i + 1) * n]),
                "token {i} first of 32"
            );
            let mut order: Vec<usize> = (0..t).filter(|&j| j != i).take(36).collect();
            order.push(i);
            let some = one(&stacked(&order), 37, Q8Weight::Grouped(&g), n, k);
            assert_eq!(
                bits(&some[36 * n..]),
                bits(&all[i * n..(i + 1) * n]),
                "token {i} last of 37"
            );
        }
        // Three weights on one split of x, each as alone.
        weights_sharing_x_answer_as_each_alone(matmul_t_many, &x, t, k);
    }

    #[test]
    #[cfg_attr(not(onepass_amx_host), ignore = "this processor has no AMX tile unit")]
    fn a_token_that_is_not_finite_gives_nan_and_leaves_the_others_alone() {
        if !here() {
            return;
        }
        let (t, k, n) = (40, 512, 20);
        let raw = q8_0(n, k, 3);
        let x = activations(t, k, 3);
        let clean = one(&x, t, Q8Weight::Blocks(&raw), n, k);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut xb = x.clone();
            xb[5 * k + 300] = bad;
            let y = one(&xb, t, Q8Weight::Blocks(&raw), n, k);
            for i in 0..t {
                let (got, want) = (&y[i * n..(i + 1) * n], &clean[i * n..(i + 1) * n]);
                if i == 5 {
                    assert!(got.iter().all(|v| v.is_nan()), "{bad}: token 5 {got:?}");
                } else {
                    assert_eq!(bits(got), bits(want), "{bad}: token {i}");
                }
            }
        }
    }
}

//! The PQ2_0 and PTQ1_0 matvec/GEMM on integer dot products (AVX-512 VNNI): the activations rounded once per call
//! to the two-level 16-bit form of [`super::act_q`], each pair of weight blocks decoded to one byte per code `c`
//! (value `c − 1`, `c` in 0..=3) and dotted with the activation bytes: `Σ (c − 1)·q = 256·Σ c·h + Σ c·l − Σ q`
//! (`vpdpbusd` with `c` as the unsigned operand against `h`, and `l` as the unsigned operand against `c`, which as a
//! byte is also a valid signed one; the `−Σ q` term is the accumulator the second dot starts from). Per pair of
//! blocks and token the 16 lanes of the exact integer sum (below 2²⁴ in magnitude, so exact in f32) are converted
//! once and added with the factor `d·s` (each lane its block's) into 16 f32 lanes, reduced at the end of the row in
//! a fixed tree: an output's arithmetic depends on its token and row alone, not on how many tokens the call stacks
//! (batch invariance).
//!
//! Decoding, two blocks into each 64-byte register:
//! - PQ2_0: the 32 code bytes of block `b` (low half) and `b + 1` (high half); register `c` takes bits `2c, 2c + 1`
//!   of every byte (one `vgf2p8affineqb`), so value `4i + c` of a block sits at byte `i` of its half.
//! - PTQ1_0: the two blocks' 56 bytes as stored (one masked load; scale bytes and the rest read 0); register `n`
//!   takes trit `n` of every byte, at the byte's own offset (two `vpmaddubsw`, a shift and a merge, see
//!   [`unpack_ptq1_0`]), so block 0 owns lanes 0..7 and block 1 lanes 7..14.
//!
//! The activations are quantized in the matching [`Layout`] ([`PQ2_0_LAYOUT`], [`PTQ1_0_LAYOUT`]). The two formats'
//! outputs are not bit-identical (their lanes split a block's sum differently), only equal up to f32 rounding.
//! Tiles of 8 rows × one token share each activation load (the rows stay in L1 for the next token, so decoding
//! again per token costs less than holding decoded pairs for several tokens in registers), and each block read is
//! prefetched into L2 four tiles ahead and into L1 for the next tile (decode streams the weights once: without
//! prefetching the loads wait on memory and the call takes 1.7x as long; one tile ahead beat 96 blocks ahead within
//! the row by 1.4x at K = 17408, and adding the far L2 prefetch cut another 8-14%). The rounding of the activations
//! (at most `s / 2` per value, `s` the block's max|x| / 32767) is the only difference from the f32 kernels:
//! docs/ARCHITECTURE.md's tolerance table says what it costs.

use super::act_q::{ActQ, Layout, ACT_BLOCK, LANES, MAX_GROUP};
use super::ptq1_0::{ptq1_0_position, PTQ1_0_BYTES};
use super::ternary::{for_row_tasks_many, PQ2_0_BYTES};

/// Where the unpacked PQ2_0 codes put each value: value `4i + c` of block `j` of a pair at byte `i` of half `j` of
/// register `c`.
pub const PQ2_0_LAYOUT: Layout = {
    let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
    let mut v = 0;
    while v < ACT_BLOCK {
        slot[0][v] = (64 * (v % 4) + v / 4) as u16;
        slot[1][v] = (64 * (v % 4) + 32 + v / 4) as u16;
        v += 1;
    }
    Layout {
        blocks: 2,
        regs: 4,
        slot,
        balanced: false,
    }
};

/// Where the decoded PTQ1_0 trits put each value: trit `n` of byte `m` of block `j` of a pair at byte `28j + m` of
/// register `n` (the blocks' 28-byte strides, so block 0 owns lanes 0..7 and block 1 lanes 7..14).
pub const PTQ1_0_LAYOUT: Layout = {
    let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
    let mut v = 0;
    while v < ACT_BLOCK {
        let (m, n) = ptq1_0_position(v);
        slot[0][v] = (64 * n as usize + m) as u16;
        slot[1][v] = (64 * n as usize + PTQ1_0_BYTES + m) as u16;
        v += 1;
    }
    Layout {
        blocks: 2,
        regs: 5,
        slot,
        balanced: false,
    }
};

/// Whether the processor has what [`rows`] needs.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::act_q::avx512_vnni()
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("gfni")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The packed ternary formats the integer kernel reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Packed {
    Pq2_0,
    Ptq1_0,
}

impl Packed {
    /// The activation layout its unpacking produces.
    pub fn layout(self) -> &'static Layout {
        match self {
            Packed::Pq2_0 => &PQ2_0_LAYOUT,
            Packed::Ptq1_0 => &PTQ1_0_LAYOUT,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            Packed::Pq2_0 => PQ2_0_BYTES,
            Packed::Ptq1_0 => PTQ1_0_BYTES,
        }
    }

    /// Values and bytes per block.
    pub(super) fn shape(self) -> (usize, usize) {
        (ACT_BLOCK, self.block_bytes())
    }
}

/// `y[t, n] = x[t, k] · wᵀ` for `w` of `format`: [`matmul_t_many`] of one weight.
///
/// # Safety
/// [`available`]; the shapes checked by the caller (`y` is `[t, n]`, `w` holds `n` rows of `k / 128` blocks).
#[cfg(target_arch = "x86_64")]
pub unsafe fn matmul_t(
    format: Packed,
    x: &[f32],
    t: usize,
    w: &[u8],
    n: usize,
    k: usize,
    y: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe { matmul_t_many(format, x, t, &[(w, n)], k, &mut [y]) };
}

/// `ys[i] = x · w_iᵀ` for weights of `format` that read one activation: `parts[i]` = (the blocks, N_i) of weight
/// i, written to `ys[i]`; x quantized once in the format's layout, then [`rows`] over all the weights' row tasks
/// (64 rows each) in one parallel loop.
///
/// # Safety
/// [`available`]; the shapes checked by the caller (`ys[i]` is `[t, N_i]`, each weight `N_i` rows of `k / 128`
/// blocks).
#[cfg(target_arch = "x86_64")]
pub unsafe fn matmul_t_many(
    format: Packed,
    x: &[f32],
    t: usize,
    parts: &[(&[u8], usize)],
    k: usize,
    ys: &mut [&mut [f32]],
) {
    let a = super::act_q::quantize(x, t, k, format.layout());
    let ns: Vec<usize> = parts.iter().map(|&(_, n)| n).collect();
    // SAFETY: each task writes only columns r0..r1 of output i; the caller's contract.
    unsafe {
        for_row_tasks_many(&ns, ys, |i, r0, r1, y| {
            rows(format, &a, t, parts[i].0, r0, r1, y, ns[i])
        })
    };
}

/// Rows `r0..r1` of the output for every token of `a` (quantized in `format`'s layout).
///
/// # Safety
/// [`available`]; `y` is `[t, n]` and this call alone writes its columns `r0..r1`; `w` holds `n` rows of
/// `a.k / 128` blocks of `format`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(
    format: Packed,
    a: &ActQ,
    t: usize,
    w: &[u8],
    r0: usize,
    r1: usize,
    y: *mut f32,
    n: usize,
) {
    let row_bytes = a.k / ACT_BLOCK * format.block_bytes();
    let mut r = r0;
    while r < r1 {
        let rt = ROW_TILE.min(r1 - r);
        let w = &w[r * row_bytes..(r + rt) * row_bytes];
        for i in 0..t {
            let y = y.wrapping_add(i * n + r);
            macro_rules! go {
                ($($rt:literal)*) => {
                    match (rt, format) {
                        $(
                            ($rt, Packed::Pq2_0) => tile::<$rt, false>(a, i, w, row_bytes, y),
                            ($rt, Packed::Ptq1_0) => tile::<$rt, true>(a, i, w, row_bytes, y),
                        )*
                        other => unreachable!("tile {other:?}"),
                    }
                };
            }
            // SAFETY: forwarded from the caller; the tile's outputs are columns r..r + rt of row i.
            unsafe { go!(1 2 3 4 5 6 7 8) };
        }
        r += rt;
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Weight rows per tile: each activation load serves them all.
const ROW_TILE: usize = 8;

/// How many tiles ahead the weights are prefetched into L2 (and the next tile's into L1): in-process A/B on the
/// 27B shape's gate/up matrix (17408 × 5120, decode), 4 to 12 tiles ahead all cut the call's median by 8-14%
/// against the next tile into L1 alone; 2 by less.
const FAR_TILES: usize = 4;

/// Registers per pair, at most (PTQ1_0's five trits; PQ2_0 uses four).
const MAX_REGS: usize = 5;

/// One pair of blocks of one row, unpacked: the code registers and the 16 lanes of the blocks' scales `d`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Codes {
    c: [__m512i; MAX_REGS],
    d: __m512,
}

/// Unpacks PQ2_0 blocks `b` and `b + 1` (`two`: whether `b + 1` exists) of the row starting at `row`: register
/// `c` holds bits `2c..2c + 2` of each code byte of block `b` (low half) and `b + 1` (high half).
///
/// # Safety
/// [`available`]; block `b` (and `b + 1` if `two`) lies inside the row.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,gfni,f16c")]
unsafe fn unpack_pq2_0(row: *const u8, b: usize, two: bool) -> Codes {
    // SAFETY: per the contract: 34 bytes at block b (and b + 1).
    unsafe {
        let p = row.add(b * PQ2_0_BYTES);
        let lo = _mm256_loadu_si256(p.add(2) as *const __m256i);
        // The scales as 8 halves each (block b's below block b + 1's), widened to the 16 lanes at once.
        let d0 = _mm_set1_epi16((p as *const i16).read_unaligned());
        let (codes, d) = if two {
            let q = p.add(PQ2_0_BYTES);
            let hi = _mm256_loadu_si256(q.add(2) as *const __m256i);
            let d1 = _mm_set1_epi16((q as *const i16).read_unaligned());
            (
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi),
                _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(d0), d1),
            )
        } else {
            (_mm512_zextsi256_si512(lo), _mm256_zextsi128_si256(d0))
        };
        // Bits 2c and 2c + 1 of every byte to bits 0 and 1: an 8×8 bit-matrix product per byte (matrix byte
        // 7 − i selects the input bits whose parity is output bit i).
        let plane = |c: i64| {
            _mm512_gf2p8affine_epi64_epi8::<0>(
                codes,
                _mm512_set1_epi64(((1i64 << (2 * c)) << 56) | ((1i64 << (2 * c + 1)) << 48)),
            )
        };
        Codes {
            c: [
                plane(0),
                plane(1),
                plane(2),
                plane(3),
                _mm512_setzero_si512(),
            ],
            d: _mm512_cvtph_ps(d),
        }
    }
}

/// Decodes PTQ1_0 blocks `b` and `b + 1` (`two`: whether `b + 1` exists) of the row starting at `row`: register
/// `n` holds trit `n` of each byte, at the byte's offset from block `b`'s start (the scales' bytes and the bytes past
/// the blocks read 0).
///
/// A byte `u` gives trit `(3u) >> 8` and passes on `(3u) mod 256`: `vpmaddubsw` against (3, 0) multiplies the
/// even bytes by 3 into 16-bit words (against (0, 3) the odd ones), whose high byte is the trit and low byte the
/// next `u`; the even bytes' trits are shifted down and merged with the odd ones'.
///
/// # Safety
/// [`available`]; block `b` (and `b + 1` if `two`) lies inside the row.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn unpack_ptq1_0(row: *const u8, b: usize, two: bool) -> Codes {
    // Trit bytes 0..26 of each block; 26..28 hold the scale.
    const TRITS: u64 = (1 << 26) - 1;
    let mask = if two { TRITS | (TRITS << 28) } else { TRITS };
    // SAFETY: the masked load reads only bytes of block b (and b + 1), per the contract.
    let (u, d0, d1) = unsafe {
        let p = row.add(b * PTQ1_0_BYTES);
        let u = _mm512_maskz_loadu_epi8(mask, p as *const i8);
        let d0 = (p.add(26) as *const i16).read_unaligned();
        let d1 = if two {
            (p.add(PTQ1_0_BYTES + 26) as *const i16).read_unaligned()
        } else {
            0
        };
        (u, d0, d1)
    };
    let even3 = _mm512_set1_epi16(3);
    let odd3 = _mm512_set1_epi16(3 << 8);
    let high = _mm512_set1_epi16(-256);
    let mut e = u;
    let mut o = u;
    let mut c = [_mm512_setzero_si512(); MAX_REGS];
    for (n, c) in c.iter_mut().enumerate() {
        e = _mm512_maddubs_epi16(e, even3);
        o = _mm512_maddubs_epi16(o, if n == 0 { odd3 } else { even3 });
        // (e >> 8) | (o & 0xFF00)
        *c = _mm512_ternarylogic_epi32::<0xF8>(_mm512_srli_epi16::<8>(e), o, high);
    }
    // Block 0's 28 bytes are lanes 0..7, block 1's lanes 7..14; lanes 14 and 15 read no block: the two scales as
    // halves in those lanes (zero in the last two), widened at once.
    let halves = _mm256_mask_mov_epi16(
        _mm256_maskz_mov_epi16(0x007F, _mm256_set1_epi16(d0)),
        0x3F80,
        _mm256_set1_epi16(d1),
    );
    Codes {
        c,
        d: _mm512_cvtph_ps(halves),
    }
}

/// One token's pair of blocks: the h and l registers, the lane sums and the lane scales.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Acts {
    h: [__m512i; MAX_REGS],
    l: [__m512i; MAX_REGS],
    neg_sums: __m512i,
    s: __m512,
}

/// # Safety
/// [`available`]; `pair` < the tokens × pairs of `a`, whose layout has `regs` registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn acts(a: &ActQ, pair: usize, regs: usize) -> Acts {
    // SAFETY: pair `pair` of a's arrays (the contract).
    unsafe {
        let hp = a.hi.as_ptr().add(pair * a.pair_bytes) as *const __m512i;
        let lp = a.lo.as_ptr().add(pair * a.pair_bytes) as *const __m512i;
        let mut x = Acts {
            h: [_mm512_setzero_si512(); MAX_REGS],
            l: [_mm512_setzero_si512(); MAX_REGS],
            neg_sums: _mm512_loadu_si512(
                a.neg_lane_sums.as_ptr().add(pair * LANES) as *const __m512i
            ),
            s: _mm512_loadu_ps(a.scale_lanes.as_ptr().add(pair * LANES)),
        };
        for c in 0..regs {
            x.h[c] = _mm512_loadu_si512(hp.add(c));
            x.l[c] = _mm512_loadu_si512(lp.add(c));
        }
        x
    }
}

/// `acc + d·s·Σ (c − 1)·q` over one pair of blocks (`regs` registers), lane by lane: the same operations whatever
/// the tile.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn dot_pair(w: &Codes, x: &Acts, regs: usize, acc: __m512) -> __m512 {
    let mut hs = _mm512_setzero_si512();
    let mut ls = x.neg_sums;
    for c in 0..regs {
        hs = _mm512_dpbusd_epi32(hs, w.c[c], x.h[c]);
        ls = _mm512_dpbusd_epi32(ls, x.l[c], w.c[c]);
    }
    let exact = _mm512_add_epi32(_mm512_slli_epi32::<8>(hs), ls);
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(w.d, x.s), acc)
}

/// One tile: `R` rows of `w` (from its start) × token `i` of `a`; PQ2_0 blocks, or PTQ1_0 if `PTQ`. Each row's
/// pair of blocks is decoded right before its dot, while the token's registers stay loaded across the rows.
///
/// # Safety
/// [`available`]; `y + j` writable for `j < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,gfni,f16c")]
unsafe fn tile<const R: usize, const PTQ: bool>(
    a: &ActQ,
    i: usize,
    w: &[u8],
    row_bytes: usize,
    y: *mut f32,
) {
    let nb = a.k / ACT_BLOCK;
    let (regs, block_bytes) = if PTQ {
        (5, PTQ1_0_BYTES)
    } else {
        (4, PQ2_0_BYTES)
    };
    assert!(w.len() >= R * row_bytes && a.hi.len() >= (i + 1) * a.pairs * a.pair_bytes);
    assert_eq!(a.pair_bytes, 64 * regs);
    let mut acc = [_mm512_setzero_ps(); R];
    let wp = w.as_ptr();
    for pb in 0..a.pairs {
        let (b, two) = (2 * pb, 2 * pb + 1 < nb);
        // SAFETY: pair pb of token i of a, and blocks b (b + 1) of rows rr < R of w (asserted above).
        let x = unsafe { acts(a, i * a.pairs + pb, regs) };
        for (rr, acc) in acc.iter_mut().enumerate() {
            let row = wp.wrapping_add(rr * row_bytes);
            // The same blocks of row rr of the tile FAR_TILES ahead into L2 and of the next tile into L1 (past the
            // task's rows they read the next task's, or nothing: a prefetch never faults).
            let ahead = row.wrapping_add(b * block_bytes);
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(FAR_TILES * R * row_bytes) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(R * row_bytes) as *const i8);
            // SAFETY: as above.
            let c = unsafe {
                if PTQ {
                    unpack_ptq1_0(row, b, two)
                } else {
                    unpack_pq2_0(row, b, two)
                }
            };
            *acc = dot_pair(&c, &x, regs, *acc);
        }
    }
    for (rr, &v) in acc.iter().enumerate() {
        // SAFETY: see the function's contract.
        unsafe { *y.add(rr) = _mm512_reduce_add_ps(v) };
    }
}

//! PQ2_0 regrouped for the CPU ([`DType::PQ2_0G`](onepass_tensor::DType::PQ2_0G)) on VNNI integer dot products,
//! for any number of tokens: the arithmetic of `super::ternary_vnni` (activations rounded once per call to the
//! two-level 16-bit form of [`super::act_q`], `Σ (c − 1)·q = 256·Σ c·h + Σ c·l − Σ q`, the codes unpacked to bytes
//! by `vgf2p8affineqb`), with the scale epilogue paid once per 8 blocks instead of once per 2.
//!
//! In the file's layout a 64-byte register of codes holds two blocks, so every pair of blocks ends in its own
//! conversion, two scale loads, a multiply and an FMA, about as many instructions as the pair's dot products. A
//! regrouped row holds 8 blocks (1024 values) per 272-byte group: four code registers in which each 32-bit lane
//! belongs to one block (lane `L`: block `L mod 8`, its code bytes `16·(L / 8) + 4q + b` in register `q`), then the
//! 8 scales. The 32 dot products of a group accumulate in the lanes of eight registers (four chains of four per
//! byte half, one lane per block half; a single chain of 16 waited on each dot product's latency), summed at the
//! group's end, and one conversion and one FMA with the lanes of `d·s` finish 1024 weights. The activations come in the matching
//! layout, [`PQ2_0G_LAYOUT`]: value `4i + c` of block `j` (code byte `i`) at byte `4L + i mod 4` of register
//! `4·((i mod 16) / 4) + c`, `L = j + 8·(i / 16)`.
//!
//! Tiles of 8 rows × one token: each row's four code registers are unpacked right before their dot products with
//! the token's sixteen activation registers of the group (read from L1), the row's sums staying in registers for
//! the group; the first token of a chunk prefetches the rows ahead into L2 (decode streams them once). Every
//! output's arithmetic depends on its row and token alone (batch invariance), and the lane sums are exact integers
//! (below 2²⁴), so a row's output is the file's-layout kernel's up to the order the blocks' f32 terms are added.

use onepass_tensor::{PQ2_0G_BYTES, PQ2_0G_VALUES};

use super::act_q::{quantize, ActQ, Layout, ACT_BLOCK, LANES, MAX_GROUP};
use super::grouped;
use super::ternary::for_row_tasks_many;

/// Blocks per group.
const GROUP_BLOCKS: usize = 8;

/// How many tiles ahead the first token of a chunk prefetches its rows into L2.
const FAR_TILES: usize = 4;

/// Where the unpacked regrouped codes put each value: value `4i + c` of block `j` at byte `4L + i mod 4` of
/// register `4·((i mod 16) / 4) + c`, with `L = j + 8·(i / 16)`.
pub const PQ2_0G_LAYOUT: Layout = {
    let mut slot = [[0u16; ACT_BLOCK]; MAX_GROUP];
    let mut j = 0;
    while j < GROUP_BLOCKS {
        let mut v = 0;
        while v < ACT_BLOCK {
            let (i, c) = (v / 4, v % 4);
            let lane = j + 8 * (i / 16);
            let reg = 4 * ((i % 16) / 4) + c;
            slot[j][v] = (64 * reg + 4 * lane + i % 4) as u16;
            v += 1;
        }
        j += 1;
    }
    Layout {
        blocks: GROUP_BLOCKS,
        regs: 16,
        slot,
        balanced: false,
    }
};

/// Whether the processor has what the kernels here need (those of `super::ternary_vnni`).
pub fn available() -> bool {
    super::ternary_vnni::available()
}

/// `ys[i] = x · w_iᵀ` for regrouped weights that read one activation: `parts[i]` = (the groups, N_i) of weight i,
/// written to `ys[i]` ([t, N_i]); x quantized once, then all the weights' row tasks in one parallel loop. Panics if
/// the processor lacks the instructions ([`available`]), if K is not a multiple of 1024 or the buffers do not match
/// the shapes (programming errors).
pub fn matmul_t_many(
    x: &[f32],
    t: usize,
    parts: &[(&[u8], usize)],
    k: usize,
    ys: &mut [&mut [f32]],
) {
    check(x, t, k);
    assert_eq!(
        parts.len(),
        ys.len(),
        "PQ2_0 grouped: one output per weight"
    );
    for (&(w, n), y) in parts.iter().zip(ys.iter()) {
        check_weight(w, n, k);
        assert_eq!(y.len(), t * n, "PQ2_0 grouped: y");
    }
    if t == 0 {
        return;
    }
    let a = quantize(x, t, k, &PQ2_0G_LAYOUT);
    let ns: Vec<usize> = parts.iter().map(|&(_, n)| n).collect();
    // SAFETY: shapes checked above; each task writes only columns r0..r1 of output i; the instructions are
    // available.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        for_row_tasks_many(&ns, ys, |i, r0, r1, y| {
            rows(&a, t, parts[i].0, r0, r1, y, ns[i])
        })
    };
}

/// `out[i] = x · W[rows[i]]` for one activation vector `x[K]`: each the value [`matmul_t_many`] gives for that
/// row, to the bit. Panics as [`matmul_t_many`], or if a row is out of range.
pub fn dot_rows(x: &[f32], w: &[u8], n: usize, k: usize, rows: &[u32], out: &mut [f32]) {
    check(x, 1, k);
    check_weight(w, n, k);
    assert_eq!(out.len(), rows.len(), "PQ2_0 grouped rows: out");
    let a = quantize(x, 1, k, &PQ2_0G_LAYOUT);
    let row_bytes = k / PQ2_0G_VALUES * PQ2_0G_BYTES;
    for (o, &r) in out.iter_mut().zip(rows) {
        let r = r as usize;
        assert!(r < n, "PQ2_0 grouped rows: row {r} of {n}");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the instructions are available (checked); row r holds the call's groups; o is one output.
        unsafe {
            tile::<1, false>(&a, 0, w[r * row_bytes..].as_ptr(), row_bytes, o)
        };
    }
}

/// Panics unless the instructions are available and x is `[t, k]` with K whole groups.
fn check(x: &[f32], t: usize, k: usize) {
    assert!(
        available(),
        "PQ2_0 grouped: the integer kernels are not available on this processor"
    );
    assert!(k.is_multiple_of(PQ2_0G_VALUES), "PQ2_0 grouped: K = {k}");
    assert_eq!(x.len(), t * k, "PQ2_0 grouped: x");
}

/// Panics unless `w` holds `n` regrouped rows of `k` values.
fn check_weight(w: &[u8], n: usize, k: usize) {
    assert_eq!(
        w.len(),
        n * k / PQ2_0G_VALUES * PQ2_0G_BYTES,
        "PQ2_0 grouped: w"
    );
}

/// Rows `r0..r1` of the output for every token of `a`.
///
/// # Safety
/// [`available`]; `y` is `[t, n]` and this call alone writes its columns `r0..r1`; `w` holds `n` regrouped rows
/// of `a.k` values.
#[cfg(target_arch = "x86_64")]
unsafe fn rows(a: &ActQ, t: usize, w: &[u8], r0: usize, r1: usize, y: *mut f32, n: usize) {
    let row_bytes = a.pairs * PQ2_0G_BYTES;
    // SAFETY: forwarded from the caller; `w` holds rows r0..r1.
    unsafe {
        grouped::run(
            a,
            t,
            &w[r0 * row_bytes..r1 * row_bytes],
            row_bytes,
            r0,
            y,
            n,
            &grouped::tiles!(tile),
        )
    };
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One tile: the `R` regrouped rows from `rows` (`row_bytes` apart) × token `i` of `a`; with `PREFETCH`, the same
/// bytes [`FAR_TILES`] tiles ahead are prefetched into L2 (past the task's rows: the next task's or nothing; a
/// prefetch never faults).
///
/// # Safety
/// [`available`]; `rows` holds `R` rows of `a.pairs` groups, `row_bytes` apart; `y + j` writable for `j < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,gfni,f16c")]
unsafe fn tile<const R: usize, const PREFETCH: bool>(
    a: &ActQ,
    i: usize,
    rows: *const u8,
    row_bytes: usize,
    y: *mut f32,
) {
    let groups = a.pairs;
    assert!(a.pair_bytes == 1024 && a.hi.len() >= (i + 1) * groups * 1024);
    // Bits 2c and 2c + 1 of every byte to bits 0 and 1 (as `super::ternary_vnni` unpacks).
    let plane: [__m512i; 4] = std::array::from_fn(|c| {
        _mm512_set1_epi64(((1i64 << (2 * c)) << 56) | ((1i64 << (2 * c + 1)) << 48))
    });
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        let at = i * groups + g;
        // SAFETY: group g of token i of a (asserted above), and group g of rows rr < R (the contract).
        unsafe {
            let hp = a.hi.as_ptr().add(at * 1024) as *const __m512i;
            let lp = a.lo.as_ptr().add(at * 1024) as *const __m512i;
            let s = _mm512_loadu_ps(a.scale_lanes.as_ptr().add(at * LANES));
            let neg =
                _mm512_loadu_si512(a.neg_lane_sums.as_ptr().add(at * LANES) as *const __m512i);
            for (rr, acc) in acc.iter_mut().enumerate() {
                let p = rows.add(rr * row_bytes + g * PQ2_0G_BYTES);
                if PREFETCH {
                    let ahead = p.wrapping_add(FAR_TILES * R * row_bytes);
                    for line in 0..PQ2_0G_BYTES.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * line) as *const i8);
                    }
                }
                // Four sums per half (one per code register), so that no chain of dependent dot products is
                // longer than 4.
                let mut hs = [_mm512_setzero_si512(); 4];
                let mut ls = [
                    neg,
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                ];
                for q in 0..4 {
                    let codes = _mm512_loadu_si512(p.add(64 * q) as *const __m512i);
                    for (c, m) in plane.iter().enumerate() {
                        let w = _mm512_gf2p8affine_epi64_epi8::<0>(codes, *m);
                        let h = _mm512_loadu_si512(hp.add(4 * q + c));
                        let l = _mm512_loadu_si512(lp.add(4 * q + c));
                        hs[q] = _mm512_dpbusd_epi32(hs[q], w, h);
                        ls[q] = _mm512_dpbusd_epi32(ls[q], l, w);
                    }
                }
                let sum = |v: [__m512i; 4]| {
                    _mm512_add_epi32(_mm512_add_epi32(v[0], v[1]), _mm512_add_epi32(v[2], v[3]))
                };
                let exact = _mm512_add_epi32(_mm512_slli_epi32::<8>(sum(hs)), sum(ls));
                // The 8 scales in both halves: lane L takes block L mod 8's.
                let d = _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                    p.add(256) as *const __m128i
                )));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d, s), *acc);
            }
        }
    }
    for (rr, &v) in acc.iter().enumerate() {
        // SAFETY: see the function's contract.
        unsafe { *y.add(rr) = _mm512_reduce_add_ps(v) };
    }
}

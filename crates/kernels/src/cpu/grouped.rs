//! The loop both regrouped kernels (`super::q8_0_vnni` on Q8_0 groups, `super::ternary_grouped` on PQ2_0 groups)
//! run over a task's rows: tiles of up to [`ROW_TILE`] rows × one token, over chunks of tokens whose activations
//! (2 bytes per value) fit in about 128 KB next to the rows, so that a tile's rows stay in cache from one token to
//! the next; the first token of a chunk is the one that streams them (and prefetches the rows ahead).

use super::act_q::ActQ;

/// Weight rows per tile.
pub(super) const ROW_TILE: usize = 8;

/// One tile: `R` regrouped rows (`row_bytes` apart) × token `i` of the activations, written to `y + j` for
/// `j < R`; `tiles[R - 1][first]`, `first` when the tile's rows come from memory (the chunk's first token).
///
/// # Safety
/// The kernel's instructions are available; the rows hold the activations' groups; `y + j` is writable.
pub(super) type Tile = unsafe fn(&ActQ, usize, *const u8, usize, *mut f32);

/// Every tile of the regrouped `rows` (`row_bytes` apart; they are output columns `c0..` of `y`, `[t, n]`) for
/// every token of `a`.
///
/// # Safety
/// As [`Tile`] for each tile; this call alone writes the columns of `y` its rows give.
pub(super) unsafe fn run(
    a: &ActQ,
    t: usize,
    rows: &[u8],
    row_bytes: usize,
    c0: usize,
    y: *mut f32,
    n: usize,
    tiles: &[[Tile; 2]; ROW_TILE],
) {
    let count = rows.len() / row_bytes;
    let chunk = ((128 << 10) / (2 * a.k)).max(4);
    for t0 in (0..t).step_by(chunk) {
        let mut r = 0;
        while r < count {
            let rt = ROW_TILE.min(count - r);
            let p = rows[r * row_bytes..].as_ptr();
            for i in t0..(t0 + chunk).min(t) {
                let y = y.wrapping_add(i * n + c0 + r);
                // SAFETY: forwarded from the caller; the tile's rows are inside `rows` and its outputs are
                // columns c0 + r .. c0 + r + rt of token i.
                unsafe { tiles[rt - 1][usize::from(i == t0)](a, i, p, row_bytes, y) };
            }
            r += rt;
        }
    }
}

/// The table of a kernel's tiles for [`run`]: `tiles!(tile)` for `unsafe fn tile<const R: usize, const FIRST:
/// bool>`.
macro_rules! tiles {
    ($tile:ident) => {
        [
            [$tile::<1, false>, $tile::<1, true>],
            [$tile::<2, false>, $tile::<2, true>],
            [$tile::<3, false>, $tile::<3, true>],
            [$tile::<4, false>, $tile::<4, true>],
            [$tile::<5, false>, $tile::<5, true>],
            [$tile::<6, false>, $tile::<6, true>],
            [$tile::<7, false>, $tile::<7, true>],
            [$tile::<8, false>, $tile::<8, true>],
        ]
    };
}
pub(super) use tiles;

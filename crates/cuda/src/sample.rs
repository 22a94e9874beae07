//! Sampled decoding's next token drawn on the GPU, where the logits are: temperature, top-k and top-p with a
//! seeded SplitMix64 whose state lives on the device, so a decode step sends back only its token.
//!
//! The reference is the host's `onepass_model::sample::sample`; a draw here follows it step by step. Candidates are
//! ordered by logit (IEEE total order, as `total_cmp`) descending, then id ascending; weights are
//! `exp((l - max) / t)` in f64 (0 for NaN); one `next_f64` per draw. The kernels (`sample.cu`), per draw:
//!
//! 1. `smp_max`: the argmax (the host's: lowest id among equal maxima, NaN never wins) over blocks of 2,048 logits,
//!    the last block to finish combining them; with a cut, the first radix-select pass's histogram.
//! 2. `smp_total`: every weight, each block's sum, the total (the blocks' sums in block order); the second pass.
//! 3. With a cut (`top_k` or `top_p` < 1): radix select of the `cut` best keys (`cut` = min(k, 2,048), the host's
//!    first cut), four more 11-bit passes that stop once the threshold is exact (a 64-bit key: logit bits, then the
//!    id, so every key is distinct and ties go to the lower id); `smp_gather` takes the keys at or above it, and
//!    `smp_pick` sorts them in one block (bitonic) and walks them on one thread as the host does: the top-p count,
//!    the mass, the draw, in the host's order and roundings.
//! 4. Wide path, when the top-p set may reach past the first cut (its mass stays below `top_p · total` and `k` is
//!    larger), or `k` > 2,048 without top-p: the whole vocabulary sorted (a bitonic sort of the next power of two:
//!    tiles of 4,096 keys in shared memory, the wider stages three per launch), the weights in sorted order, and
//!    the same walk over them on one thread (`smp_wide_pick`, eight additions at a time where no stop falls). Its
//!    launches are in the graph only where the settings can need it; they return at once when not.
//! 5. No top-k and top-p 1: the whole distribution in id order (`smp_pick_full`), the host's walk: the block where
//!    `u · total` falls from the blocks' sums, then the id in it from a scan.
//!
//! Exactness: the weights are the host's to the last bit where CUDA's `exp` rounds as the host's libm does (both are
//! within an ulp; they differ now and then by one), and the walks over sorted candidates add them in the host's
//! order. What is summed in another order is `total` (block sums, then the blocks), which the top-p threshold and
//! the whole-distribution draw read, and that draw's running sum (block sums and a scan instead of one id after
//! another). Such sums differ from the host's in the last bits (about 1e-16 relative per addition), which changes a
//! token only when the draw or the top-p threshold falls within about 1e-15 · total of a boundary between two
//! candidates: the GPU tests count those draws apart (with their margin) and fail on any other difference.
//!
//! Cost at 248,320 logits (H200; `crates/cuda/tests/sample.rs` prints it): see docs/cuda.md.

use cudarc::driver::{CudaFunction, CudaSlice};
use onepass_model::sample::Sampling;

use crate::launch;
use crate::runtime::{cfg, Gpu};
use crate::CudaError;

/// Logits per block of the passes over the vocabulary (`SMP_CHUNK` in sample.cu).
const CHUNK: usize = 2048;
/// Candidates the one-block sort takes: the first cut (`SMP_CUT`; the host's `FIRST_CUT`).
pub const CUT: usize = 2048;
/// Keys per block of the wide path's sort (`tile` in sample.cu): 32 KB of shared memory. Larger tiles (16,384 in
/// 128 KB) take fewer launches but sort slower: 16 blocks for 248,320 ids instead of 64 (a top-k 5,000 draw 250 ->
/// 488 µs on an H200).
const TILE: usize = 4096;
/// u64 words of the device state (`SmpState` in sample.cu).
const STATE_WORDS: usize = 16;

/// The sampler's kernels (sample.cu), loaded with the others when the GPU opens.
pub struct SampleKernels {
    max: CudaFunction,
    total: CudaFunction,
    select: CudaFunction,
    gather: CudaFunction,
    pick: CudaFunction,
    pick_full: CudaFunction,
    wide_tile: CudaFunction,
    wide_steps: CudaFunction,
    wide_merge: CudaFunction,
    wide_weights: CudaFunction,
    wide_pick: CudaFunction,
}

impl SampleKernels {
    pub(crate) fn load(
        f: &dyn Fn(&str) -> Result<CudaFunction, CudaError>,
    ) -> Result<Self, CudaError> {
        Ok(SampleKernels {
            max: f("smp_max")?,
            total: f("smp_total")?,
            select: f("smp_select")?,
            gather: f("smp_gather")?,
            pick: f("smp_pick")?,
            pick_full: f("smp_pick_full")?,
            wide_tile: f("smp_wide_tile")?,
            wide_steps: f("smp_wide_steps")?,
            wide_merge: f("smp_wide_merge")?,
            wide_weights: f("smp_wide_weights")?,
            wide_pick: f("smp_wide_pick")?,
        })
    }
}

/// Which launches a draw takes (what a decode graph's shape holds; the settings themselves are in device memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleMode {
    /// No top-k, top-p 1: the whole distribution in id order.
    Full,
    /// top-k at most [`CUT`]: the first cut always holds the kept set.
    Cut,
    /// top-p < 1 with a larger (or no) top-k: the first cut, and the wide path when the top-p set reaches past it.
    Wide,
    /// top-k larger than [`CUT`], top-p 1: the wide path only.
    WideOnly,
}

/// A draw's settings as the device reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplePlan {
    pub mode: SampleMode,
    temp: f32,
    top_p: f32,
    /// top-k, at most the vocabulary (the vocabulary: none).
    k: usize,
    cut: usize,
}

impl SamplePlan {
    /// The plan for `s` over `vocab` logits, or `None` where the host takes the argmax without drawing (greedy
    /// settings, or a vocabulary of one).
    pub fn new(s: &Sampling, vocab: usize) -> Option<SamplePlan> {
        if s.is_greedy() || vocab <= 1 {
            return None;
        }
        let top_p = s.top_p.clamp(0.0, 1.0);
        let k = if s.top_k == 0 {
            vocab
        } else {
            s.top_k.min(vocab)
        };
        // As the host compares it (a NaN top-p is below 1).
        let all_p = top_p as f64 >= 1.0;
        let mode = if k == vocab && all_p {
            SampleMode::Full
        } else if k <= CUT {
            SampleMode::Cut
        } else if all_p {
            SampleMode::WideOnly
        } else {
            SampleMode::Wide
        };
        Some(SamplePlan {
            mode,
            temp: s.temperature,
            top_p,
            k,
            cut: k.min(CUT),
        })
    }
}

/// The sampler's device buffers for one vocabulary size (its state, the blocks' partial results, the candidates,
/// the wide path's keys). One draw at a time: the decode that holds it.
pub struct Sampler {
    vocab: usize,
    /// `SmpState`: [`STATE_WORDS`] u64, zeroed at allocation.
    state: CudaSlice<u64>,
    part_v: CudaSlice<f32>,
    part_i: CudaSlice<i32>,
    bsum: CudaSlice<f64>,
    first: CudaSlice<i32>,
    last: CudaSlice<i32>,
    /// The radix select's histogram (2,048 bins), zero between passes.
    hist: CudaSlice<u32>,
    cand: CudaSlice<u64>,
    /// The wide path's keys, [`Sampler::wide_len`], and the weights of the sorted ones [V].
    keys: CudaSlice<u64>,
    wsorted: CudaSlice<f64>,
}

impl Sampler {
    /// Bytes [`Sampler::new`] allocates for `vocab` logits.
    pub fn bytes(vocab: usize) -> usize {
        let blocks = vocab.div_ceil(CHUNK);
        let wide = 8 * Self::wide_len(vocab) + 8 * vocab;
        8 * STATE_WORDS + 24 * blocks + 4 * 2048 + 8 * CUT + wide
    }

    /// Keys the wide path sorts: the vocabulary padded to a power of two, at least one tile.
    fn wide_len(vocab: usize) -> usize {
        vocab.next_power_of_two().max(TILE)
    }

    pub fn new(g: &Gpu, vocab: usize) -> Result<Sampler, CudaError> {
        if vocab > i32::MAX as usize / 2 {
            return Err(CudaError::Unsupported(format!(
                "sampling over {vocab} logits"
            )));
        }
        let blocks = vocab.div_ceil(CHUNK);
        Ok(Sampler {
            vocab,
            state: g.zeros(STATE_WORDS)?,
            part_v: g.alloc(blocks)?,
            part_i: g.alloc(blocks)?,
            bsum: g.alloc(blocks)?,
            first: g.alloc(blocks)?,
            last: g.alloc(blocks)?,
            hist: g.zeros(2048)?,
            cand: g.alloc(CUT)?,
            keys: g.alloc(Self::wide_len(vocab))?,
            wsorted: g.alloc(vocab)?,
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Sets the settings and the generator state (`Rng::state`) the next draws use (stream-ordered).
    pub fn set(&self, g: &Gpu, plan: &SamplePlan, rng: u64) -> Result<(), CudaError> {
        let pair = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
        let words = [
            rng,
            pair(plan.temp.to_bits(), plan.top_p.to_bits()),
            pair(plan.k as u32, plan.cut as u32),
        ];
        g.upload_into(&words, &self.state)
    }

    /// The generator state on the device after the draws queued so far (synchronises).
    pub fn rng_state(&self, g: &Gpu) -> Result<u64, CudaError> {
        Ok(g.download(&self.state, 1)?[0])
    }

    /// Queues one draw from the logits at `logits` ([V] f32) under the plan last [`Sampler::set`] (`mode` its
    /// mode) into `out` (one i32), the generator advanced one step. Capturable in a graph: every address and size
    /// is fixed, the settings are read on the device.
    pub fn queue(&self, g: &Gpu, mode: SampleMode, logits: u64, out: u64) -> Result<(), CudaError> {
        let k = &g.k.sample;
        let n = self.vocab as i32;
        let blocks = (self.vocab.div_ceil(CHUNK) as u32, 1);
        let scan = cfg(blocks, 256, 0);
        let one = cfg((1, 1), 1024, 0);
        let st = g.ptr(&self.state);
        let hist = g.ptr(&self.hist);
        let sel = matches!(mode, SampleMode::Cut | SampleMode::Wide) as i32;
        let wide_only = (mode == SampleMode::WideOnly) as i32;
        launch!(g, k.max, scan; logits, n, st, g.ptr(&self.part_v), g.ptr(&self.part_i), hist, sel, wide_only)?;
        let (bsum, first, last) = (g.ptr(&self.bsum), g.ptr(&self.first), g.ptr(&self.last));
        launch!(g, k.total, scan; logits, n, st, bsum, first, last, hist, sel)?;
        if sel != 0 {
            for p in 2..6i32 {
                launch!(g, k.select, scan; logits, n, st, hist, p)?;
            }
            let cand = g.ptr(&self.cand);
            launch!(g, k.gather, scan; logits, n, st, cand)?;
            launch!(g, k.pick, one; st, cand, out)?;
        }
        if mode == SampleMode::Full {
            launch!(g, k.pick_full, one; logits, n, st, bsum, first, last, out)?;
        }
        if matches!(mode, SampleMode::Wide | SampleMode::WideOnly) {
            let tile = TILE;
            let len = Self::wide_len(self.vocab);
            let keys = g.ptr(&self.keys);
            let tiles = cfg(((len / tile) as u32, 1), 1024, 8 * tile as u32);
            launch!(g, k.wide_tile, tiles; logits, n, st, keys, tile as i32)?;
            let mut kk = 2 * tile;
            while kk <= len {
                // Stages j = kk / 2 .. tile, up to three per launch.
                let mut j = kk / 2;
                while j >= tile {
                    let mut s: i32 = 1;
                    while s < 3 && j >> s >= tile {
                        s += 1;
                    }
                    let c = cfg((((len >> s) / 256) as u32, 1), 256, 0);
                    launch!(g, k.wide_steps, c; keys, kk as u32, j as u32, s, st)?;
                    j >>= s;
                }
                launch!(g, k.wide_merge, tiles; keys, kk as u32, st, tile as i32)?;
                kk *= 2;
            }
            let ws = g.ptr(&self.wsorted);
            launch!(g, k.wide_weights, scan; st, keys, ws)?;
            launch!(g, k.wide_pick, cfg((1, 1), 32, 0); st, keys, ws, out)?;
        }
        Ok(())
    }

    /// One draw from host logits (tests): the token `sample(logits, s, &mut Rng::new(rng))` gives, and the
    /// generator state after it (`rng` unchanged where the host draws nothing: greedy settings, one logit).
    pub fn draw(
        &self,
        g: &Gpu,
        logits: &[f32],
        s: &Sampling,
        rng: u64,
    ) -> Result<(u32, u64), CudaError> {
        if logits.len() != self.vocab {
            return Err(CudaError::Unsupported(format!(
                "{} logits for a sampler of {}",
                logits.len(),
                self.vocab
            )));
        }
        let x = g.upload(logits)?;
        self.draw_at(g, g.ptr(&x), s, rng)
    }

    /// [`Sampler::draw`] from logits already on the device ([V] f32 at `logits`). The token is written into the
    /// state's last word (unused by the draw), so that one download brings back both.
    pub fn draw_at(
        &self,
        g: &Gpu,
        logits: u64,
        s: &Sampling,
        rng: u64,
    ) -> Result<(u32, u64), CudaError> {
        let out = g.ptr(&self.state) + 8 * (STATE_WORDS as u64 - 1);
        match SamplePlan::new(s, self.vocab) {
            Some(plan) => {
                self.set(g, &plan, rng)?;
                self.queue(g, plan.mode, logits, out)?;
                let st = g.download(&self.state, STATE_WORDS)?;
                Ok((st[STATE_WORDS - 1] as u32, st[0]))
            }
            None => {
                crate::ops::argmax_rows(g, logits, 1, self.vocab, out)?;
                let st = g.download(&self.state, STATE_WORDS)?;
                Ok((st[STATE_WORDS - 1] as u32, rng))
            }
        }
    }
}

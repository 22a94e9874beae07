//! Batch invariance of System One: a request's probabilities scored alone against the same request in `score` calls
//! with 1, 7 and 31 other requests of mixed sizes (shared by tests/batch_invariance.rs on the CPU and
//! tests/cuda_batch_invariance.rs on the GPU).

use onepass_decide::engine::Backend;
use onepass_decide::{Engine, Plan};

/// Other requests batched with each one: 1, 7 and 31 (issue 17's sizes).
pub const OTHERS: [usize; 3] = [1, 7, 31];

/// The `score` calls of `others + 1` plans each that put every plan of `n` (indices) beside `others` others: windows
/// of the plans taken cyclically from offsets that differ per batch size, so a plan sits at different positions and
/// beside different neighbours in each size (a call larger than `n` repeats plans).
pub fn batches(n: usize, others: usize) -> Vec<Vec<usize>> {
    let size = others + 1;
    let shift = others * 3 % n.max(1);
    (0..n.div_ceil(size))
        .map(|b| (0..size).map(|j| (shift + b * size + j) % n).collect())
        .collect()
}

/// What differs between a plan alone and the same plan in a batch, bit for bit.
#[derive(Debug, Default)]
pub struct Mismatches {
    /// Slots compared, and those whose probabilities differ in any bit.
    pub slots: usize,
    pub differ: Vec<String>,
    /// Largest |Δp| among them.
    pub max: f32,
}

/// Scores every plan alone, then in the calls of [`batches`] for every size of [`OTHERS`], on `e`, and compares the
/// probabilities bit for bit. `tag` names the engine in the messages.
pub fn check<B: Backend>(tag: &str, e: &Engine<B>, plans: &[Plan]) -> Mismatches {
    let alone: Vec<Vec<Vec<f32>>> = plans
        .iter()
        .map(|p| e.score(&[p]).unwrap().remove(0))
        .collect();
    let mut m = Mismatches::default();
    for others in OTHERS {
        for batch in batches(plans.len(), others) {
            let refs: Vec<&Plan> = batch.iter().map(|&i| &plans[i]).collect();
            let got = e.score(&refs).unwrap();
            assert_eq!(got.len(), batch.len());
            for (pos, (&i, g)) in batch.iter().zip(&got).enumerate() {
                assert_eq!(g.len(), alone[i].len(), "{tag}: plan {i} slots");
                for (s, (gs, ws)) in g.iter().zip(&alone[i]).enumerate() {
                    m.slots += 1;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    if bits(gs) != bits(ws) {
                        let d = gs
                            .iter()
                            .zip(ws)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0f32, f32::max);
                        m.max = m.max.max(d);
                        m.differ.push(format!(
                            "{tag}: plan {i} slot {s} at {pos} of {} (with {others} others): max|dp| {d:e}",
                            batch.len()
                        ));
                    }
                }
            }
        }
    }
    m
}

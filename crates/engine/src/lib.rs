//! The sequence API every onepass route runs on: a model on its device and opaque sequence states.
//!
//! ```text
//!   model (CPU ops) ─┐
//!                    ├─▶ engine: Backend (this crate) ─▶ decide (System One, sessions, generation) ─▶ server, cli
//!   cuda (GPU ops) ──┘
//! ```
//!
//! A [`Backend`] is a loaded model on one device. Its states (`Backend::State`) are opaque: a caller makes one
//! ([`Backend::new_state`]), copies it ([`Backend::fork`], [`Backend::snapshot`]), puts a copy back
//! ([`Backend::restore`]), and continues it with ids: [`Backend::forward_batch`] for several states in one forward
//! (the hidden rows stay on the device), or [`Backend::extend`] for one state, in chunks, with the logits read at
//! chosen positions. Logits are read from hidden rows either over the whole vocabulary ([`Backend::logits`]) or at
//! selected ids only ([`Backend::label_logits`], what a decision reads: a few rows of the head, never all of it).
//!
//! Three implementations: the CPU [`Model`] (below), [`CudaBackend`] (the GPU model of `onepass-cuda`), and
//! [`AnyBackend`], one of the two chosen at run time, which is what the CLI and the server hold: one engine value
//! whatever the device. Nothing above this crate names a device.
//!
//! Exactness: a fork, snapshot or restore continued with the same ids and chunking is bit-identical to the original
//! (`tests/sequence.rs`); [`Backend::extend`] in chunks matches the one-token walk within
//! [`CHUNK_TOLERANCE`] (same test).

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod any;
mod cuda;

pub use any::{AnyBackend, AnyError, AnyHidden, AnyState};
pub use cuda::{CudaBackend, CudaOptions};

use std::fmt::Display;

pub use onepass_model::sample::{argmax, sample, Rng, Sampling};
use onepass_model::{Model, ModelError, SequenceState};

/// The logits of a prompt prefilled in chunks against the same prompt walked one token at a time, CPU f32: at every
/// read position, max |Δlogit| ≤ `CHUNK_TOLERANCE · max(1, max |logit|)` (the chunked gated delta rule and batched
/// GEMMs reorder f32 sums; measured ≤ 1.3e-5 on the tiny synthetic checkpoints, `tests/sequence.rs`).
pub const CHUNK_TOLERANCE: f32 = 1e-4;

/// Which logits a readout returns for one hidden row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<'a> {
    /// The whole vocabulary, `[vocab_size]`.
    Full,
    /// Only these vocabulary ids, in this order.
    Ids(&'a [u32]),
}

/// A model on its device, with sequence states that fork and continue. `Send + Sync`: share it in an `Arc`; every
/// method takes `&self` (a GPU backend serialises its own device work).
pub trait Backend: Send + Sync {
    /// One sequence's state (KV caches, conv and recurrent state, position). Opaque: only this backend reads it.
    type State: Send;
    /// The final-normed hidden rows of one forward, `[ΣT, H]`, wherever they live.
    type Hidden;
    type Error: Display;
    /// Where it runs, for logs and `/health` (`cpu`, `cuda (NVIDIA H200, …)`).
    fn device(&self) -> String;
    fn vocab_size(&self) -> usize;
    /// Longest sequence a state may hold (the model's `max_position_embeddings`). Default: no limit.
    fn max_positions(&self) -> usize {
        usize::MAX
    }
    /// State bytes added per token (KV caches), for fork budgets.
    fn state_bytes_per_token(&self) -> usize;
    fn new_state(&self) -> Result<Self::State, Self::Error>;
    /// Bytes `st` holds.
    fn state_bytes(&self, st: &Self::State) -> usize;
    /// Tokens `st` has seen (the position its next id takes).
    fn position(&self, st: &Self::State) -> usize;
    /// An independent continuation of `st`.
    fn fork(&self, st: &Self::State) -> Result<Self::State, Self::Error>;
    /// A copy of `st` to [`Backend::restore`] later (the same as a fork; named for what the caller means).
    fn snapshot(&self, st: &Self::State) -> Result<Self::State, Self::Error> {
        self.fork(st)
    }
    /// Makes `st` what `snap` is (which stays as it was): continuing `st` then is continuing `snap`.
    fn restore(&self, st: &mut Self::State, snap: &Self::State) -> Result<(), Self::Error> {
        *st = self.fork(snap)?;
        Ok(())
    }
    /// Runs every `(state, ids)` pair, continuing each state. → hidden rows of all pairs stacked, in order.
    fn forward_batch(
        &self,
        items: &mut [(&mut Self::State, &[u32])],
    ) -> Result<Self::Hidden, Self::Error>;
    /// Whether [`Backend::forward_tree`] may run trees at all; when false callers never ask.
    fn runs_trees(&self) -> bool {
        false
    }
    /// One forward over `roots` (each continuing its state, as in [`Backend::forward_batch`]) and `children`:
    /// `(root, ids)` pairs, each continuing a fork of `roots[root]`'s state taken after the root's ids. → the hidden
    /// rows of every root's ids then of every child's ids, stacked in that order. The children's states are not kept
    /// (a readout drops them; a backend may skip writing them). `Ok(None)`: this backend does not run this tree in one
    /// pass; nothing ran and no state changed (the caller runs the roots, forks and runs the children).
    fn forward_tree(
        &self,
        roots: &mut [(&mut Self::State, &[u32])],
        children: &[(usize, &[u32])],
    ) -> Result<Option<Self::Hidden>, Self::Error> {
        let _ = (roots, children);
        Ok(None)
    }
    /// Fewest ids a root with children may have in [`Backend::forward_tree`]. Default 1.
    fn min_tree_root(&self) -> usize {
        1
    }
    /// Bytes a child of [`Backend::forward_tree`] holds besides its KV rows, for fork budgets. `None` (the default):
    /// as much as a fresh state.
    fn tree_child_bytes(&self) -> Option<usize> {
        None
    }
    /// `out[i]` = the logits of hidden row `picks[i].0` at the vocabulary ids `picks[i].1` only. All readouts of one
    /// forward come in one call.
    fn label_logits(
        &self,
        h: &Self::Hidden,
        picks: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f32>>, Self::Error>;
    /// `out[i]` = the whole-vocabulary logits of hidden row `rows[i]`.
    fn logits(&self, h: &Self::Hidden, rows: &[usize]) -> Result<Vec<Vec<f32>>, Self::Error>;
    /// `out[i]` = [`argmax`] of the whole-vocabulary logits of hidden row `rows[i]`: greedy decoding's next token.
    /// A device backend picks it where the logits are, so that only the ids come back. Default: [`Backend::logits`]
    /// then [`argmax`] on the host.
    fn argmax(&self, h: &Self::Hidden, rows: &[usize]) -> Result<Vec<u32>, Self::Error> {
        Ok(self.logits(h, rows)?.iter().map(|l| argmax(l)).collect())
    }
    /// One decode step: feeds `tok` to `st`. → the whole vocabulary's logits after it (a sampled generation's step).
    /// Default: [`step_logits_by_extend`].
    fn step_logits(&self, st: &mut Self::State, tok: u32) -> Result<Vec<f32>, Self::Error> {
        step_logits_by_extend(self, st, tok)
    }
    /// Greedy decoding of `st` from `first`: feeds it, then each next token (the [`argmax`] of the logits after it),
    /// handing every token to `on_token` until it answers false or `max_steps` forwards ran. A device backend may
    /// queue a step before `on_token` has answered for the token before it (the GPU does, so that the host's work on
    /// a token overlaps the device's next step): the state then holds one token more than `on_token` accepted.
    /// → forwards run (tokens `st` gained). Default: [`greedy_by_steps`].
    fn greedy_steps(
        &self,
        st: &mut Self::State,
        first: u32,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, Self::Error> {
        greedy_by_steps(self, st, first, max_steps, on_token)
    }
    /// Sampled decoding of `st` from `first` under `s`: feeds it, then each next token ([`sample`] of the logits
    /// after it, drawing from `rng`), handing every token to `on_token` until it answers false or `max_steps`
    /// forwards ran. Each forward draws one number of `rng` (none when `s` is greedy: [`Backend::greedy_steps`]
    /// runs), a forward queued ahead included, so `rng` continues as the host's loop would leave it. A device backend
    /// may queue a step before `on_token` has answered, as in [`Backend::greedy_steps`]. → forwards run (tokens `st`
    /// gained). Default: [`sample_by_steps`].
    fn sample_steps(
        &self,
        st: &mut Self::State,
        first: u32,
        max_steps: usize,
        s: &Sampling,
        rng: &mut Rng,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, Self::Error> {
        sample_by_steps(self, st, first, max_steps, s, rng, on_token)
    }
    /// Continues `st` with `ids` in forwards of at most `chunk` ids (0: one forward), and reads the logits at the
    /// positions `read` (indices into `ids`, ascending) as `pick` says. → one logits vector per entry of `read`.
    /// Chunked and whole agree within [`CHUNK_TOLERANCE`]; the same chunking is bit-identical.
    fn extend(
        &self,
        st: &mut Self::State,
        ids: &[u32],
        chunk: usize,
        read: &[usize],
        pick: Pick<'_>,
    ) -> Result<Vec<Vec<f32>>, Self::Error> {
        let chunk = if chunk == 0 { ids.len().max(1) } else { chunk };
        let mut out = Vec::with_capacity(read.len());
        let mut next = 0; // the next entry of `read`
        for (k, piece) in ids.chunks(chunk).enumerate() {
            let start = k * chunk;
            let h = self.forward_batch(&mut [(&mut *st, piece)])?;
            let mut rows = Vec::new();
            while next < read.len() && read[next] < start + piece.len() {
                rows.push(read[next].saturating_sub(start));
                next += 1;
            }
            if rows.is_empty() {
                continue;
            }
            match pick {
                Pick::Full => out.extend(self.logits(&h, &rows)?),
                Pick::Ids(ids) => {
                    let picks: Vec<(usize, &[u32])> = rows.iter().map(|&r| (r, ids)).collect();
                    out.extend(self.label_logits(&h, &picks)?);
                }
            }
        }
        Ok(out)
    }
}

/// [`Backend::step_logits`] as [`Backend::extend`] of the one id with the whole vocabulary read.
pub fn step_logits_by_extend<B: Backend + ?Sized>(
    b: &B,
    st: &mut B::State,
    tok: u32,
) -> Result<Vec<f32>, B::Error> {
    Ok(b.extend(st, &[tok], 0, &[0], Pick::Full)?
        .pop()
        .unwrap_or_default())
}

/// [`Backend::sample_steps`] on the host: [`Backend::greedy_steps`] when `s` is greedy, else one
/// [`Backend::step_logits`] and one [`sample`] of its logits at a time (the state holds exactly the tokens `on_token`
/// was handed before the last, and `first`).
pub fn sample_by_steps<B: Backend + ?Sized>(
    b: &B,
    st: &mut B::State,
    first: u32,
    max_steps: usize,
    s: &Sampling,
    rng: &mut Rng,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<usize, B::Error> {
    if s.is_greedy() {
        return b.greedy_steps(st, first, max_steps, on_token);
    }
    let mut tok = first;
    let mut fed = 0;
    while fed < max_steps {
        let logits = b.step_logits(st, tok)?;
        fed += 1;
        tok = sample(&logits, s, rng);
        if !on_token(tok) {
            break;
        }
    }
    Ok(fed)
}

/// [`Backend::greedy_steps`] one forward and one [`Backend::argmax`] at a time: the state holds exactly the tokens
/// `on_token` was handed before the last, and `first`.
pub fn greedy_by_steps<B: Backend + ?Sized>(
    b: &B,
    st: &mut B::State,
    first: u32,
    max_steps: usize,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<usize, B::Error> {
    let mut tok = first;
    let mut fed = 0;
    while fed < max_steps {
        let h = b.forward_batch(&mut [(&mut *st, &[tok][..])])?;
        fed += 1;
        // A backend that picks no token for a row gives the lowest id, as an argmax over nothing does.
        tok = b.argmax(&h, &[0])?.first().copied().unwrap_or(0);
        if !on_token(tok) {
            break;
        }
    }
    Ok(fed)
}

impl Backend for Model {
    type State = SequenceState;
    /// hidden: [ΣT, H] f32
    type Hidden = Vec<f32>;
    type Error = ModelError;
    fn device(&self) -> String {
        "cpu".into()
    }
    fn vocab_size(&self) -> usize {
        Model::vocab_size(self)
    }
    fn max_positions(&self) -> usize {
        self.config().text.max_position_embeddings
    }
    fn state_bytes_per_token(&self) -> usize {
        self.info().state_bytes_per_token
    }
    fn new_state(&self) -> Result<SequenceState, ModelError> {
        Ok(Model::new_state(self))
    }
    fn state_bytes(&self, st: &SequenceState) -> usize {
        st.bytes()
    }
    fn position(&self, st: &SequenceState) -> usize {
        st.position()
    }
    fn fork(&self, st: &SequenceState) -> Result<SequenceState, ModelError> {
        Ok(st.clone())
    }
    fn restore(&self, st: &mut SequenceState, snap: &SequenceState) -> Result<(), ModelError> {
        st.restore(snap);
        Ok(())
    }
    fn forward_batch(
        &self,
        items: &mut [(&mut SequenceState, &[u32])],
    ) -> Result<Vec<f32>, ModelError> {
        Model::forward_batch(self, items)
    }
    fn label_logits(
        &self,
        h: &Vec<f32>,
        picks: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        picks
            .iter()
            .map(|&(r, ids)| self.logits_rows(cpu_row(self, h, r)?, ids))
            .collect()
    }
    fn logits(&self, h: &Vec<f32>, rows: &[usize]) -> Result<Vec<Vec<f32>>, ModelError> {
        rows.iter()
            .map(|&r| Ok(Model::logits(self, cpu_row(self, h, r)?)))
            .collect()
    }
}

/// Hidden row `r` of `h`, or an error naming it.
fn cpu_row<'h>(m: &Model, h: &'h [f32], r: usize) -> Result<&'h [f32], ModelError> {
    let d = m.hidden_size();
    h.get(r * d..(r + 1) * d).ok_or_else(|| {
        ModelError::Input(format!(
            "readout of row {r} of {} hidden rows",
            h.len() / d.max(1)
        ))
    })
}

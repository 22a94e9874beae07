//! Choose, do not generate: a decision over a fixed list of choices, read from the next-token distribution after one
//! prefill. Nothing is decoded.
//!
//! ```text
//! DecideRequest ──choice_ids──▶ first ids (refusals) ──DecidePrompt::split──▶ ids, prefix_len (refusal: too long)
//!   ──▶ restore the longest kept prefix state, prefill the rest of the prefix, keep it, prefill the suffix
//!   ──▶ logits at the last id ──log_softmax_at──▶ choice_logp, best
//! ```
//!
//! This module is policy over ids and one logit row: the model is any [`DecideModel`] (new state, copy, prefill,
//! the full logit row after a prefill), the kept states any [`PrefixStore`] (a session's [`KeptPrefix`], the
//! server's [`PrefixLru`]). Every refusal happens before any model work and leaves the store as it was.

pub mod prefix;
pub mod prompt;
pub mod request;
pub mod score;

use std::fmt::Display;
use std::time::Instant;

use onepass_engine::{Backend, Pick};
use onepass_tokenizer::Tokenizer;
use serde_json::{json, Value};

pub use prefix::{KeptPrefix, PrefixCacheStats, PrefixLru, PrefixStore};
pub use prompt::{DecidePrompt, SplitPrompt};
pub use request::DecideRequest;

/// What a decision needs from a model: sequence states that can be copied, a prefill, and the whole logit row at the
/// last id of a prefill.
pub trait DecideModel {
    type State;
    type Error: Display;
    fn vocab_size(&self) -> usize;
    /// Most ids a sequence may hold.
    fn max_positions(&self) -> usize;
    fn new_state(&self) -> Result<Self::State, Self::Error>;
    /// An independent copy of `st` (a restore starts from one; the kept state is one).
    fn copy_state(&self, st: &Self::State) -> Result<Self::State, Self::Error>;
    fn state_bytes(&self, st: &Self::State) -> usize;
    /// Continues `st` with `ids`.
    fn prefill(&self, st: &mut Self::State, ids: &[u32]) -> Result<(), Self::Error>;
    /// Continues `st` with `ids` (at least one) and returns the logits at the last of them. → [vocab]
    fn prefill_logits(&self, st: &mut Self::State, ids: &[u32]) -> Result<Vec<f32>, Self::Error>;
}

/// Every model of the sequence API: a prefill is one [`Backend::extend`] (one forward, so a decision prefilled whole is
/// the teacher-forced forward of its ids), the row at its last id over the whole vocabulary.
impl<B: Backend> DecideModel for B {
    type State = B::State;
    type Error = B::Error;
    fn vocab_size(&self) -> usize {
        Backend::vocab_size(self)
    }
    fn max_positions(&self) -> usize {
        Backend::max_positions(self)
    }
    fn new_state(&self) -> Result<B::State, B::Error> {
        Backend::new_state(self)
    }
    fn copy_state(&self, st: &B::State) -> Result<B::State, B::Error> {
        self.snapshot(st)
    }
    fn state_bytes(&self, st: &B::State) -> usize {
        Backend::state_bytes(self, st)
    }
    fn prefill(&self, st: &mut B::State, ids: &[u32]) -> Result<(), B::Error> {
        self.extend(st, ids, 0, &[], Pick::Full).map(|_| ())
    }
    fn prefill_logits(&self, st: &mut B::State, ids: &[u32]) -> Result<Vec<f32>, B::Error> {
        let last = ids.len().saturating_sub(1);
        let mut rows = self.extend(st, ids, 0, &[last], Pick::Full)?;
        Ok(rows.pop().unwrap_or_default())
    }
}

/// Whether a session keeps the prefix state between decisions (`--decide-prefix-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefixCacheMode {
    /// Keep it where prefilling a prompt in two pieces costs about what it costs whole: on every device onepass runs
    /// (see docs/decide.md for the measurement).
    #[default]
    Auto,
    On,
    Off,
}

impl PrefixCacheMode {
    pub fn parse(s: &str) -> Option<PrefixCacheMode> {
        match s {
            "auto" => Some(PrefixCacheMode::Auto),
            "on" => Some(PrefixCacheMode::On),
            "off" => Some(PrefixCacheMode::Off),
            _ => None,
        }
    }

    /// Whether a state is kept. The CPU prefill's cost grows with the ids it reads, and so does the GPU's past the
    /// few ids a decision adds to a kept prefix, so `auto` keeps it on both.
    pub fn keeps(self) -> bool {
        !matches!(self, PrefixCacheMode::Off)
    }
}

/// Why a decision was refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or cannot be answered (nothing ran).
    InvalidRequest,
    /// The model failed while running it.
    Server,
    /// This session or server does not answer decisions.
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DecideError {
    /// The request's `id`, echoed.
    pub id: Value,
    pub kind: ErrorKind,
    pub message: String,
}

impl DecideError {
    pub fn invalid(id: Value, message: String) -> DecideError {
        DecideError {
            id,
            kind: ErrorKind::InvalidRequest,
            message,
        }
    }

    pub fn unsupported(id: Value, message: String) -> DecideError {
        DecideError {
            id,
            kind: ErrorKind::Unsupported,
            message,
        }
    }

    pub fn server(id: Value, message: String) -> DecideError {
        DecideError {
            id,
            kind: ErrorKind::Server,
            message,
        }
    }

    /// The `"type"` of the wire error.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Server => "model",
            ErrorKind::Unsupported => "unsupported",
        }
    }

    /// `{"id", "error": {"type", "message"}}`.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "error": {"type": self.type_name(), "message": self.message}})
    }
}

/// The answer to one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideAnswer {
    pub id: Value,
    /// Index of the highest `choice_logp` (the first on ties).
    pub best: usize,
    /// `log p` of each choice's first token, normalised over the whole vocabulary.
    pub choice_logp: Vec<f64>,
    /// Ids of the prompt.
    pub n_tokens: usize,
    /// Ids restored from a kept state instead of prefilled.
    pub n_reused: usize,
    /// Time restoring and prefilling the prompt, ms.
    pub prefill_ms: f64,
    /// Time copying the state after the prefix to keep it, ms (not part of `prefill_ms`).
    pub store_ms: f64,
    /// Memory of the prefix state this decision restored or kept, MiB (0 when none is kept).
    pub prefix_state_mib: f64,
}

impl DecideAnswer {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "best": self.best,
            "choice_logp": self.choice_logp,
            "n_tokens": self.n_tokens,
            "n_reused": self.n_reused,
            "prefill_ms": round3(self.prefill_ms),
            "store_ms": round3(self.store_ms),
            "prefix_state_mib": round3(self.prefix_state_mib),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

const MIB: f64 = (1u64 << 20) as f64;

/// Checks a decision and its prompt before any model work: the choices' first ids and the prompt's ids.
pub fn prepare(
    vocab: usize,
    max_positions: usize,
    tok: &Tokenizer,
    prompt: &DecidePrompt,
    req: &DecideRequest,
) -> Result<(Vec<u32>, SplitPrompt), DecideError> {
    let firsts = score::choice_ids(tok, &req.choices, vocab, &req.id)?;
    let split = prompt
        .split(tok, &req.prefix, &req.suffix)
        .map_err(|e| DecideError::invalid(req.id.clone(), format!("rendering the prompt: {e}")))?;
    let n = split.ids.len();
    if n == 0 {
        return Err(DecideError::invalid(
            req.id.clone(),
            "the prompt is empty: give a prefix or a suffix".into(),
        ));
    }
    if n > max_positions {
        return Err(DecideError::invalid(
            req.id.clone(),
            format!("the prompt is {n} tokens, longer than the {max_positions} positions the model holds"),
        ));
    }
    Ok((firsts, split))
}

/// One decision, start to finish. `store`: where prefix states are found and kept (`None`: none are, every prompt is
/// prefilled whole). A request with `reuse_prefix: false` is prefilled whole and leaves the store as it was.
pub fn decide<M: DecideModel, P: PrefixStore<M::State>>(
    model: &M,
    tok: &Tokenizer,
    prompt: &DecidePrompt,
    store: Option<&mut P>,
    req: &DecideRequest,
) -> Result<DecideAnswer, DecideError> {
    let (firsts, split) = prepare(model.vocab_size(), model.max_positions(), tok, prompt, req)?;
    let fail = |e: M::Error| DecideError::server(req.id.clone(), format!("model: {e}"));
    let ids = &split.ids;
    let p = split.prefix_len;
    let t0 = Instant::now();
    let mut store_ms = 0.0;
    let mut n_reused = 0;
    let mut state_bytes = 0;
    let logits = match store {
        Some(store) if req.reuse_prefix && p > 0 => {
            let mut st = match store.longest(&ids[..p]) {
                Some((k, kept)) => {
                    n_reused = k;
                    state_bytes = model.state_bytes(kept);
                    model.copy_state(kept).map_err(fail)?
                }
                None => model.new_state().map_err(fail)?,
            };
            if p > n_reused {
                model.prefill(&mut st, &ids[n_reused..p]).map_err(fail)?;
                let t = Instant::now();
                let kept = model.copy_state(&st).map_err(fail)?;
                state_bytes = model.state_bytes(&kept);
                store.insert(&ids[..p], kept, state_bytes);
                store_ms = ms(t);
            }
            model.prefill_logits(&mut st, &ids[p..]).map_err(fail)?
        }
        _ => {
            let mut st = model.new_state().map_err(fail)?;
            model.prefill_logits(&mut st, ids).map_err(fail)?
        }
    };
    let prefill_ms = ms(t0) - store_ms;
    let choice_logp = score::log_softmax_at(&logits, &firsts);
    Ok(DecideAnswer {
        id: req.id.clone(),
        best: score::best(&choice_logp),
        choice_logp,
        n_tokens: ids.len(),
        n_reused,
        prefill_ms,
        store_ms,
        prefix_state_mib: state_bytes as f64 / MIB,
    })
}

/// A session's decisions: the prompt rule of its model and, with the prefix cache on, the one kept prefix state.
#[derive(Debug)]
pub struct DecideSession<S> {
    prompt: DecidePrompt,
    /// `None`: the prefix cache is off and nothing is ever kept.
    kept: Option<KeptPrefix<S>>,
}

impl<S> DecideSession<S> {
    pub fn new(prompt: DecidePrompt, mode: PrefixCacheMode) -> DecideSession<S> {
        DecideSession {
            prompt,
            kept: mode.keeps().then(KeptPrefix::default),
        }
    }

    /// One decision; a refused one leaves the kept state as it was.
    pub fn decide<M: DecideModel<State = S>>(
        &mut self,
        model: &M,
        tok: &Tokenizer,
        req: &DecideRequest,
    ) -> Result<DecideAnswer, DecideError> {
        decide(model, tok, &self.prompt, self.kept.as_mut(), req)
    }

    /// Drops the kept state (a generation does; the next decision builds a fresh one).
    pub fn drop_kept(&mut self) {
        if let Some(k) = &mut self.kept {
            k.clear();
        }
    }

    /// The ids of the kept prefix state, if one is kept.
    pub fn kept_ids(&self) -> Option<&[u32]> {
        self.kept.as_ref().and_then(|k| k.ids())
    }

    /// Bytes of the kept state (0 when none).
    pub fn kept_bytes(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| k.bytes())
    }

    pub fn prompt(&self) -> &DecidePrompt {
        &self.prompt
    }
}

//! Text generation over the sequence API: a prompt (raw text, or chat messages rendered with the model's chat
//! template and its generation prompt) is prefilled in chunks of [`PREFILL_CHUNK`] ids, then one token at a time is
//! chosen ([`sample`]: the first from the prefill's logits, the rest on the backend,
//! [`onepass_engine::Backend::sample_steps`]) and fed back, until an end-of-sequence id, a stop string, `max_tokens` or
//! the model's context.
//!
//! - End of sequence: the ids of `eos_token_id` in `config.json` (or its `text_config`) and `generation_config.json`
//!   (a number or a list), and the tokenizer's `eos_token`. The id that ends a generation is in `tokens`, not in
//!   `text`.
//! - Stop strings end the text before them (`finish_reason` `stop`); the text never holds them, and a stream never
//!   hands out a piece of one ([`text`]).
//! - Seeded sampling reproduces: the same request with the same seed gives the same tokens ([`sample::Rng`]).
//! - A prompt that leaves no room in the model's context is a [`GenerateError`] (`context_length`); a generation that
//!   reaches the end of the context stops there with `finish_reason` `length`.
//! - Prefill in chunks: the logits at the last prompt position equal those of the one-token walk within
//!   [`onepass_engine::CHUNK_TOLERANCE`] (`tests/generate.rs`).

pub mod request;
pub mod sample;
pub mod text;

pub use request::{parse_generate, GenerateRequest, Input};
pub use sample::{Rng, Sampling};

use std::path::Path;
use std::time::Instant;

use onepass_engine::{Backend, Pick};
use onepass_tokenizer::Tokenizer;
use serde_json::Value as J;

use crate::prompt::chat::{self, SpecialTokens};
use text::TextStream;

/// Prompt ids per forward while prefilling (bounds the activation memory of one forward).
pub const PREFILL_CHUNK: usize = 512;

/// Why a generation was refused or failed. `kind` is one of `invalid_request` (the request itself), `context_length`
/// (the prompt does not fit the model), `unsupported` (this engine or session cannot do it), `model` (the model
/// failed: not the client's fault).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct GenerateError {
    pub kind: &'static str,
    pub message: String,
}

impl GenerateError {
    pub fn invalid(message: impl Into<String>) -> GenerateError {
        GenerateError {
            kind: "invalid_request",
            message: message.into(),
        }
    }
    pub fn model(message: impl std::fmt::Display) -> GenerateError {
        GenerateError {
            kind: "model",
            message: message.to_string(),
        }
    }
    pub fn unsupported(message: impl Into<String>) -> GenerateError {
        GenerateError {
            kind: "unsupported",
            message: message.into(),
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence id or a stop string.
    Stop,
    /// `max_tokens`, or the end of the model's context.
    Length,
    /// The caller's `on_delta` asked to stop (a client that went away).
    Cancelled,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// One finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated text (no end-of-sequence token, cut before a stop string).
    pub text: String,
    /// Every generated id, the one that ended it included.
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub n_prompt: usize,
    pub prefill_ms: f64,
    /// Forwards after the prefill per second of their wall time (0 when there was none).
    pub decode_tok_s: f64,
}

impl Generation {
    /// The session answer: `{"id", "text", "tokens", "finish_reason", "n_prompt", "n_generated", "prefill_ms",
    /// "decode_tok_s"}`.
    pub fn to_json(&self, id: &J) -> J {
        serde_json::json!({
            "id": id,
            "text": self.text,
            "tokens": self.tokens,
            "finish_reason": self.finish.as_str(),
            "n_prompt": self.n_prompt,
            "n_generated": self.tokens.len(),
            "prefill_ms": round3(self.prefill_ms),
            "decode_tok_s": round3(self.decode_tok_s),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// What generating needs from a model folder besides the weights: its tokenizer as written (not System One's
/// transformers view), its chat template and named special tokens, its end-of-sequence ids and sampling defaults.
#[derive(Debug)]
pub struct Generator {
    pub tokenizer: Tokenizer,
    template: Option<String>,
    special: SpecialTokens,
    /// Sorted, deduplicated.
    pub eos: Vec<u32>,
    /// `generation_config.json`'s temperature / top_k / top_p, else 1 / 0 / 1.
    pub defaults: Sampling,
}

/// `v` as a list of ids: a number or an array of numbers; anything else is none.
fn ids_of(v: Option<&J>) -> Vec<u32> {
    match v {
        Some(J::Number(n)) => n.as_u64().map(|x| x as u32).into_iter().collect(),
        Some(J::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn read_json(path: &Path) -> Result<Option<J>, GenerateError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| GenerateError::model(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| GenerateError::model(format!("{}: {e}", path.display())))
}

impl Generator {
    /// Loads `dir`'s tokenizer (`model_type` is config.json's), chat template, `config.json` and
    /// `generation_config.json`.
    pub fn load(dir: &Path, model_type: Option<&str>) -> Result<Generator, GenerateError> {
        let tokenizer = Tokenizer::from_model(dir, model_type).map_err(GenerateError::model)?;
        // A GGUF file's folder holds the JSON files beside it.
        let dir = match dir.parent() {
            Some(p) if dir.is_file() && !p.as_os_str().is_empty() => p,
            _ if dir.is_file() => Path::new("."),
            _ => dir,
        };
        let special = if dir.join("tokenizer_config.json").is_file() {
            SpecialTokens::from_dir(dir)
        } else {
            SpecialTokens::from_tokenizer(&tokenizer)
        };
        let config = read_json(&dir.join("config.json"))?;
        let gen = read_json(&dir.join("generation_config.json"))?;
        let mut eos = Vec::new();
        if let Some(c) = &config {
            eos.extend(ids_of(c.get("eos_token_id")));
            eos.extend(ids_of(
                c.get("text_config").and_then(|t| t.get("eos_token_id")),
            ));
        }
        if let Some(g) = &gen {
            eos.extend(ids_of(g.get("eos_token_id")));
        }
        eos.extend(tokenizer.eos_id());
        eos.sort_unstable();
        eos.dedup();
        let num = |k: &str| gen.as_ref().and_then(|g| g.get(k)).and_then(J::as_f64);
        let defaults = Sampling {
            temperature: num("temperature").unwrap_or(1.0) as f32,
            top_k: num("top_k").unwrap_or(0.0).max(0.0) as usize,
            top_p: num("top_p").unwrap_or(1.0) as f32,
        };
        Ok(Generator {
            template: tokenizer.chat_template().map(str::to_string),
            tokenizer,
            special,
            eos,
            defaults,
        })
    }

    /// The prompt's ids: raw text tokenized as it is, or messages rendered with the chat template and its generation
    /// prompt.
    pub fn prompt_ids(&self, input: &Input) -> Result<Vec<u32>, GenerateError> {
        let text = match input {
            Input::Prompt(p) => p.clone(),
            Input::Messages(m) => self.render(m)?,
        };
        self.tokenizer
            .encode(&text)
            .map_err(|e| GenerateError::invalid(e.to_string()))
    }

    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`.
    pub fn render(&self, messages: &[(String, String)]) -> Result<String, GenerateError> {
        let Some(t) = self.template.as_deref().filter(|t| !t.is_empty()) else {
            return Err(GenerateError::unsupported(
                "this model has no chat template: send \"prompt\" (raw text) instead of \"messages\"",
            ));
        };
        chat::render_messages(t, messages, &self.special, true, None)
            .map_err(|e| GenerateError::invalid(e.to_string()))
    }

    /// How this model's decisions over choices are prompted: its chat template with its special tokens, else plain
    /// text (the same template and tokenizer a chat turn uses, so a decision and a first chat turn over the same text
    /// see the same prompt).
    pub fn decide_prompt(&self) -> crate::choice::DecidePrompt {
        match self.template.as_deref().filter(|t| !t.trim().is_empty()) {
            Some(t) => crate::choice::DecidePrompt::with_template(t, self.special.clone()),
            None => crate::choice::DecidePrompt::plain(),
        }
    }

    /// Whether the model has a chat template.
    pub fn has_template(&self) -> bool {
        self.template.as_deref().is_some_and(|t| !t.is_empty())
    }
}

/// Generates for `req` on `model`; `on_delta` gets each new piece of text as soon as it is stable (they add up to
/// the returned text) and answers whether to go on (false: the generation ends, [`Finish::Cancelled`]). No state
/// is kept: every call starts from a fresh sequence.
pub fn generate<B: Backend>(
    model: &B,
    gen: &Generator,
    req: &GenerateRequest,
    on_delta: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation, GenerateError> {
    let ids = gen.prompt_ids(&req.input)?;
    if ids.is_empty() {
        return Err(GenerateError::invalid("the prompt is empty"));
    }
    let max_pos = model.max_positions();
    if ids.len() >= max_pos {
        return Err(GenerateError {
            kind: "context_length",
            message: format!(
                "the prompt is {} tokens and the model's context is {max_pos}: there is no room for a new token",
                ids.len()
            ),
        });
    }
    let sampling = Sampling {
        temperature: req.temperature.unwrap_or(gen.defaults.temperature),
        top_k: req.top_k.unwrap_or(gen.defaults.top_k),
        top_p: req.top_p.unwrap_or(gen.defaults.top_p),
    };
    let mut rng = Rng::new(req.seed.unwrap_or_else(random_seed));
    let t0 = Instant::now();
    let mut st = model.new_state().map_err(GenerateError::model)?;
    let logits = model
        .extend(&mut st, &ids, PREFILL_CHUNK, &[ids.len() - 1], Pick::Full)
        .map_err(GenerateError::model)?
        .pop()
        .unwrap_or_default();
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let mut stream = TextStream::new(&gen.tokenizer, &req.stop);
    let mut tokens = Vec::new();
    let mut steps = 0usize;
    // One token taken: its text streamed, and whether the generation ends with it.
    let mut take = |tok: u32| -> Result<Option<Finish>, GenerateError> {
        tokens.push(tok);
        if gen.eos.binary_search(&tok).is_ok() {
            return Ok(Some(Finish::Stop));
        }
        let stopped = stream
            .push(tok)
            .map_err(|e| GenerateError::model(e.to_string()))?;
        let d = stream.delta();
        if !d.is_empty() && !on_delta(&d) {
            return Ok(Some(Finish::Cancelled));
        }
        if stopped {
            return Ok(Some(Finish::Stop));
        }
        if tokens.len() >= req.max_tokens || ids.len() + tokens.len() >= max_pos {
            return Ok(Some(Finish::Length));
        }
        Ok(None)
    };
    let vocab = model.vocab_size();
    if logits.len() != vocab {
        return Err(GenerateError::model(format!(
            "the model returned {} logits for a vocabulary of {vocab}",
            logits.len()
        )));
    }
    // The first token from the prefill's logits on the host; the rest on the backend, continuing `rng` (a GPU
    // chooses each token where the logits are, a step ahead of this loop). The forwards a generation may need at
    // most bound the steps: one per token after the first, within the context.
    let first = sample::sample(&logits, &sampling, &mut rng);
    let finish = match take(first)? {
        Some(f) => f,
        None => {
            let max_steps = req
                .max_tokens
                .saturating_sub(1)
                .min(max_pos.saturating_sub(ids.len() + 1));
            let mut end: Result<Option<Finish>, GenerateError> = Ok(None);
            model
                .sample_steps(&mut st, first, max_steps, &sampling, &mut rng, &mut |t| {
                    steps += 1;
                    end = take(t);
                    matches!(end, Ok(None))
                })
                .map_err(GenerateError::model)?;
            // Out of steps without an end: the length bound, which the last step's token met.
            end?.unwrap_or(Finish::Length)
        }
    };
    let rest = stream
        .finish()
        .map_err(|e| GenerateError::model(e.to_string()))?;
    if !rest.is_empty() && finish != Finish::Cancelled {
        on_delta(&rest);
    }
    let secs = t1.elapsed().as_secs_f64();
    Ok(Generation {
        text: stream.text().to_string(),
        tokens,
        finish,
        n_prompt: ids.len(),
        prefill_ms,
        decode_tok_s: if steps > 0 && secs > 0.0 {
            steps as f64 / secs
        } else {
            0.0
        },
    })
}

/// A seed for a request that gave none.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

//! One request pipeline for every caller — the server's routes, `onepass systemone` and [`crate::Engine`]:
//!
//! ```text
//! body ──prepare──▶ Prepared { form, plan } ──(the caller scores plan's rows)──▶ probs per slot ──answer──▶ body
//! ```
//!
//! [`Pipeline::prepare`] parses the body of either route (`/v1/systemone`: [`crate::request`]; `/decide`:
//! [`crate::decide_form`]), plans its rows ([`crate::prompt`]) and checks every request limit in one place
//! ([`check_size`], then [`check_positions`]), all before any model work. Scoring is the caller's: the library calls
//! [`crate::Engine::score`] directly, the server queues the plan for its batching worker. [`Pipeline::answer`] turns
//! the probabilities into the route's response body.

use crate::assemble::assemble;
use crate::config::DecideConfig;
use crate::decide_form::{self, DecideQuestion};
use crate::error::{ApiError, LimitError};
use crate::prompt::tokens::{plan, Plan};
use crate::pyjson::Value;
use crate::request::parse_request;
use onepass_tokenizer::Tokenizer;
use std::sync::Arc;

/// The two scoring routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/systemone` (decider-contract §5.1).
    SystemOne,
    /// `POST /decide`, the plain form (decider-contract §5.2).
    Decide,
}

/// What a request asks, beyond its rows: how its answer is written.
#[derive(Debug, Clone, PartialEq)]
pub enum Form {
    /// `/v1/systemone`: the plan's rendered questions say it all.
    SystemOne,
    /// `/decide`: the schema's fields, in order.
    Decide(Vec<DecideQuestion>),
}

/// A request parsed, planned and within every limit: score `plan` (its rows may be none), then [`Pipeline::answer`].
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub form: Form,
    /// Shared, so a server can queue it for scoring and keep it for the answer.
    pub plan: Arc<Plan>,
}

impl Prepared {
    /// Questions the request asks (the `decisions` a server counts).
    pub fn decisions(&self) -> usize {
        match &self.form {
            Form::SystemOne => self.plan.rqs.len(),
            Form::Decide(qs) => qs.len(),
        }
    }
}

/// The pipeline of one model: its tokenizer and config, the request limits, and its positions.
#[derive(Debug, Clone, Copy)]
pub struct Pipeline<'a> {
    pub tokenizer: &'a Tokenizer,
    pub config: &'a DecideConfig,
    pub limits: &'a Limits,
    /// The model's `max_position_embeddings` ([`check_positions`]).
    pub max_positions: usize,
}

impl Pipeline<'_> {
    /// Parse → plan → limits: the reference's 400/422 for a bad body, 413 for one past a limit. onepass is text-only,
    /// so a `/v1/systemone` request with image assets is the reference's 422 for a server started without images.
    pub fn prepare(&self, route: Route, body: &[u8]) -> Result<Prepared, ApiError> {
        let prepared = match route {
            Route::SystemOne => {
                let req = parse_request(body)?;
                if req.assets.as_ref().is_some_and(|a| !a.is_empty()) {
                    return Err(ApiError::detail(
                        422,
                        "this server was started without image support (DECIDER_IMAGES=1)",
                    ));
                }
                Prepared {
                    form: Form::SystemOne,
                    plan: Arc::new(plan(&req, self.tokenizer, self.config)?),
                }
            }
            Route::Decide => {
                let (questions, plan) = decide_form::prepare(body, self.tokenizer, self.config)?;
                Prepared {
                    form: Form::Decide(questions),
                    plan: Arc::new(plan),
                }
            }
        };
        check_size(&prepared.plan, self.limits)?;
        check_positions(&prepared.plan, self.max_positions)?;
        Ok(prepared)
    }

    /// The response body for `probs` (per slot in row order, as [`crate::Engine::score`] gives them for the plan).
    pub fn answer(
        &self,
        prepared: &Prepared,
        probs: &[Vec<f32>],
        model_name: &str,
    ) -> Result<Value, ApiError> {
        match &prepared.form {
            Form::SystemOne => assemble(&prepared.plan, probs, model_name)
                .map_err(|e| ApiError::detail(500, e.to_string())),
            Form::Decide(qs) => Ok(decide_form::format(qs, probs)),
        }
    }
}

/// Request size limits (serve.py; `DECIDER_MAX_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_rows: usize,
    pub max_row_tokens: usize,
    pub max_request_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_rows: 1024,
            max_row_tokens: crate::config::DEFAULT_MAX_STATE_TOKENS + 4096,
            max_request_tokens: 1 << 20,
        }
    }
}

/// serve.py `check_size`: rows, then the longest row, then the total (413).
// decider-contract R1.9.1
pub fn check_size(plan: &Plan, limits: &Limits) -> Result<(), LimitError> {
    let n = plan.rows.len();
    let total: usize = plan.rows.iter().map(|r| r.ids.len()).sum();
    let longest = plan.rows.iter().map(|r| r.ids.len()).max().unwrap_or(0);
    if n > limits.max_rows {
        Err(LimitError::Rows {
            rows: n,
            max_rows: limits.max_rows,
        })
    } else if longest > limits.max_row_tokens {
        Err(LimitError::RowTokens {
            longest,
            max_row_tokens: limits.max_row_tokens,
        })
    } else if total > limits.max_request_tokens {
        Err(LimitError::RequestTokens {
            total,
            rows: n,
            max_request_tokens: limits.max_request_tokens,
        })
    } else {
        Ok(())
    }
}

/// onepass-only, after [`check_size`]: every row fits the model's `max_positions` (413 naming them). The reference
/// has no such check (transformers runs any position), but a row past a model's positions is outside what it was
/// made for, and onepass's engines refuse it at the forward; here it is a client error before any model work, not a
/// failed forward (docs/systemone.md, "Divergences").
pub fn check_positions(plan: &Plan, max_positions: usize) -> Result<(), LimitError> {
    let longest = plan.rows.iter().map(|r| r.ids.len()).max().unwrap_or(0);
    if longest > max_positions {
        Err(LimitError::Positions {
            longest,
            max_positions,
        })
    } else {
        Ok(())
    }
}

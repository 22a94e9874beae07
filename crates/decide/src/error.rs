//! One error type for everything a `/v1/systemone` request can fail on before the model runs, mapped to the
//! reference's HTTP status and body in one place ([`ApiError`]).

use crate::pyjson::{dumps_compact, obj, FloatParseError, Value};

/// A question failed `render_question`. Display is the reference's `ValueError` text (→ 422 `{"detail": msg}`).
// decider-contract R1.9
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error("question without instructions")]
    NoInstructions,
    #[error("noul question without instructions: criteria must describe true or false")]
    NoulWithoutDescription,
    #[error("choice criteria: a map of 2..255 options")]
    ChoiceCriteria,
    #[error("score criteria: an ordered list of 2..10 level descriptions")]
    ScoreCriteria,
    #[error(transparent)]
    LegendKey(#[from] FloatParseError),
    #[error("noul criteria: a map of optional true/false descriptions")]
    NoulCriteria,
    /// `repr` is Python's `repr()` of the `type` value.
    #[error("unknown question type {repr}")]
    UnknownType { repr: String },
    /// onepass-only: the reference answers a non-object spec with HTTP 500 (an AttributeError); onepass gives a 422
    /// that names the question (docs/systemone.md, "Divergences").
    #[error("question {id_repr}: a question must be a JSON object, got {got}")]
    SpecNotObject { id_repr: String, got: &'static str },
}

/// A request limit was exceeded (413) — decider-contract R1.9, serve.py check_size.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("too many questions: the request expands to {rows} scoring rows, the limit is {max_rows} (DECIDER_MAX_ROWS)")]
    Rows { rows: usize, max_rows: usize },
    #[error("too many tokens: one row has {longest} tokens, the limit is {max_row_tokens} per row (DECIDER_MAX_ROW_TOKENS)")]
    RowTokens {
        longest: usize,
        max_row_tokens: usize,
    },
    #[error("too many tokens: the request has {total} tokens over {rows} rows, the limit is {max_request_tokens} (DECIDER_MAX_REQUEST_TOKENS)")]
    RequestTokens {
        total: usize,
        rows: usize,
        max_request_tokens: usize,
    },
    /// onepass-only: a row longer than the model's positions ([`crate::check_positions`]). The reference runs it
    /// (transformers checks no position), which only a model with fewer positions than DECIDER_MAX_ROW_TOKENS allows.
    #[error("too many tokens: one row has {longest} tokens, the model has {max_positions} positions (max_position_embeddings in config.json)")]
    Positions {
        longest: usize,
        max_positions: usize,
    },
}

/// An HTTP error answer: status and body exactly as decider's FastAPI app sends them.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    /// The JSON body (`{"detail": ...}`); [`ApiError::http_body`] writes it.
    pub body: Value,
}

impl ApiError {
    /// `HTTPException(status, msg)` → `{"detail": msg}`.
    pub fn detail(status: u16, msg: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: obj([("detail", Value::Str(msg.into()))]),
        }
    }

    /// FastAPI's `RequestValidationError` → 422 `{"detail": [error, ...]}`.
    pub fn validation(errors: Vec<Value>) -> ApiError {
        ApiError {
            status: 422,
            body: obj([("detail", Value::Array(errors))]),
        }
    }

    /// The message of a `{"detail": "<msg>"}` body.
    pub fn message(&self) -> Option<&str> {
        self.body.as_object()?.get("detail")?.as_str()
    }

    /// (status, content type, body bytes) as Starlette writes them: compact JSON; a NaN or infinity inside (an echoed
    /// pydantic `input`) makes Starlette's writer raise, which the reference answers with a plain-text 500.
    pub fn http_body(&self) -> (u16, &'static str, String) {
        match dumps_compact(&self.body) {
            Ok(s) => (self.status, "application/json", s),
            Err(_) => (
                500,
                "text/plain; charset=utf-8",
                "Internal Server Error".into(),
            ),
        }
    }

    /// What onepass sends: [`ApiError::http_body`], except that a body echoing a NaN or infinity (from `NaN`,
    /// `Infinity` or `1e400` in the request) keeps the client error's status and writes each such number as a string,
    /// Python's `repr` of it (`"nan"`, `"inf"`, `"-inf"`), instead of the reference's plain-text 500 — so clients that
    /// retry every 5xx do not retry a bad request (docs/server.md, "Divergences").
    pub fn served_body(&self) -> (u16, &'static str, String) {
        match dumps_compact(&self.body) {
            Ok(s) => (self.status, "application/json", s),
            Err(_) => match dumps_compact(&finite(&self.body)) {
                Ok(s) => (self.status, "application/json", s),
                Err(_) => self.http_body(),
            },
        }
    }
}

/// `v` with every non-finite float replaced by the string of its Python repr.
fn finite(v: &Value) -> Value {
    match v {
        Value::Float(f) if !f.is_finite() => Value::Str(crate::pyjson::float_repr(*f)),
        Value::Array(a) => Value::Array(a.iter().map(finite).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), finite(x))).collect()),
        other => other.clone(),
    }
}

impl From<RenderError> for ApiError {
    fn from(e: RenderError) -> Self {
        ApiError::detail(422, e.to_string())
    }
}

impl From<LimitError> for ApiError {
    fn from(e: LimitError) -> Self {
        ApiError::detail(413, e.to_string())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}: {}", self.status, self.http_body().2)
    }
}

impl std::error::Error for ApiError {}

//! System One without the model: everything decider-ai 1.10.0 does on the CPU around the forward pass.
//!
//! A request goes through one [`pipeline`]: body → [`request::parse_request`] (Python `json.loads` + pydantic
//! `S1Req`; `/decide` bodies: [`decide_form`]) → [`prompt`] (the state and questions as text, then as token rows,
//! the state cut at its cap while it is built; plain or chat layout) → the limits (413) → the model reads the label
//! logits at every slot ([`engine`]) → [`assemble`] (softmax at the slot's temperature, `format_answer`, Python
//! `round` and float repr on the wire). Every rule cites `decider-contract Rx.y`
//! (docs/decider-contract.md); docs/systemone.md walks the flow and lists deliberate divergences.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod assemble;
pub mod choice;
pub mod config;
pub mod decide_form;
pub mod engine;
pub mod error;
pub mod generate;
pub mod pipeline;
pub mod prompt;
pub mod pyjson;
pub mod request;
pub mod session;

/// The prompt modules under the names they had before [`prompt`] gathered them.
pub use prompt::{chat, text as render, tokens as rows};

pub use assemble::{assemble, softmax};
pub use config::{ConfigError, DecideConfig, Layout, Order, DEFAULT_MAX_STATE_TOKENS};
pub use engine::{Engine, EngineError, EngineOptions};
pub use error::{ApiError, LimitError, RenderError};
pub use generate::{GenerateError, GenerateRequest, Generation};
pub use pipeline::{check_positions, check_size, Form, Limits, Pipeline, Prepared, Route};
pub use prompt::chat::{ChatError, ChatTemplate};
pub use prompt::tokens::{plan, Plan, Row};
pub use request::{parse_request, Request};
pub use session::{Session, SessionOptions};

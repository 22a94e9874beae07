//! System One without the model: everything decider-ai 1.10.0 does on the CPU around the forward pass.
//!
//! A `/v1/systemone` request goes body → [`request::parse_request`] (Python `json.loads` + pydantic `S1Req`)
//! → [`render`] (render_state / render_question, the 422 catalogue) → [`rows`] (plan rows, tokenize, slots, usage)
//! → the model reads the label logits at every slot → [`assemble`] (softmax at the slot's temperature,
//! `format_answer`, Python `round` and float repr on the wire). Every rule cites `decider-contract Rx.y`
//! (/work/shared/reference/decider-contract.md); docs/systemone.md walks the flow and lists deliberate divergences.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod error;
pub mod pyjson;
pub mod render;
pub mod request;

pub use error::{ApiError, LimitError, RenderError};
pub use request::{parse_request, Request};
pub mod assemble;
pub mod chat;
pub mod config;
pub mod engine;
pub mod rows;

pub use assemble::{assemble, softmax};
pub use chat::{ChatError, ChatTemplate};
pub use config::{ConfigError, DecideConfig, Layout, Order, DEFAULT_MAX_STATE_TOKENS};
pub use engine::{Engine, EngineError, EngineOptions};
pub use rows::{check_positions, check_size, plan, Limits, Plan, Row};

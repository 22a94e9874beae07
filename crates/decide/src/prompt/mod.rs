//! The prompt, in three steps a reader can take one at a time:
//!
//! - [`text`]: the request as text — the state (`render_state`), each question (`render_question`, the 422
//!   catalogue), isolated Score levels and which questions share a row (`plan_rows`);
//! - [`tokens`]: that text as token ids — state-first and schema-first rows, slots, temperatures, usage
//!   (`plan`), with the state cut at its token cap while it is built;
//! - [`chat`]: the chat layout's template, rendered once per model.

pub mod chat;
pub mod text;
pub mod tokens;

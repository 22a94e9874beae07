//! The blocks of a Qwen3.5 decoder layer. Each is loaded by HF name through a [`Binder`] and runs
//! over a batch of segments: the rows of all segments are stacked for the projections, and the
//! token mixers walk each segment with its own state.
//!
//! [`Binder`]: crate::weights::Binder

pub mod attention;
pub mod gated_deltanet;
pub mod mlp;
pub mod norm;

/// Rows `[start, start + len)` of a stacked batch belong to one sequence whose first new token
/// sits at position `pos`.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    pub start: usize,
    pub len: usize,
    pub pos: usize,
}

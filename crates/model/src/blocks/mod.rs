//! The blocks of a Qwen3.5 decoder layer. Each is loaded by HF name through a [`Binder`] and runs
//! over a batch of segments: the rows of all segments are stacked for the projections, and the
//! token mixers walk each segment with its own state.
//!
//! [`Binder`]: crate::weights::Binder

use onepass_kernels::matmul_t;
use onepass_tensor::Tensor;

pub mod attention;
pub mod gated_deltanet;
pub mod mlp;
pub mod norm;

/// A projection of the rows x: [N, K] by a linear weight w: [M, K], `x · wᵀ`, the one way every block applies a
/// weight. → [N, M]
pub fn linear(x: &[f32], n: usize, w: &Tensor) -> Vec<f32> {
    let mut out = vec![0.0; n * w.shape()[0]];
    matmul_t(x, n, w, &mut out);
    out
}

/// Rows `[start, start + len)` of a stacked batch belong to one sequence whose first new token
/// sits at position `pos`.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    pub start: usize,
    pub len: usize,
    pub pos: usize,
}

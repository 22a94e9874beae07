//! The blocks of a Qwen3.5 decoder layer. Each is loaded by HF name through a [`Binder`] and runs
//! over a batch of segments: the rows of all segments are stacked for the projections, and the
//! token mixers walk each segment with its own state.
//!
//! [`Binder`]: crate::weights::Binder

use std::borrow::Cow;
use std::sync::Arc;

use onepass_kernels::{matmul_t, matmul_t_many};
use onepass_tensor::Tensor;

use crate::weights::Binder;
use crate::ModelError;

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

/// The projections of the rows x: [N, K] by several weights that read it (gate and up; q, k and v), each the
/// [`linear`] of its weight: packed ternary weights share one rounding of x and one parallel loop. → [N, M_i] each
pub fn linears<const W: usize>(x: &[f32], n: usize, ws: [&Tensor; W]) -> [Vec<f32>; W] {
    let mut out: [Vec<f32>; W] = std::array::from_fn(|i| vec![0.0; n * ws[i].shape()[0]]);
    let mut ys: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
    matmul_t_many(x, n, &ws, &mut ys);
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

/// The sign vector of a Hadamard site: the linears `names` read one activation, and in a rotated pack they are
/// folded together (`W' = W·Rᵀ`), so the activation is rotated once for all of them. `None` when none is folded;
/// an error when only some are (the site could not share one rotation).
pub(crate) fn site(vb: &Binder, names: &[&str]) -> Result<Option<Arc<[f32]>>, ModelError> {
    let signs: Vec<Option<Arc<[f32]>>> = names.iter().map(|n| vb.folded_signs(n)).collect();
    if signs.iter().all(Option::is_none) {
        return Ok(None);
    }
    if let Some(i) = signs.iter().position(Option::is_none) {
        return Err(ModelError::Weights(format!(
            "{} is not folded with the rotation but {} reads the same activation and is",
            vb.name_of(names[i]),
            vb.name_of(names[signs.iter().position(Option::is_some).unwrap_or(0)])
        )));
    }
    Ok(signs.into_iter().next().flatten())
}

/// Refuses a folded `name` where the graph feeds it the unrotated activation.
pub(crate) fn unrotated(vb: &Binder, name: &str) -> Result<(), ModelError> {
    match vb.folded_signs(name) {
        None => Ok(()),
        Some(_) => Err(ModelError::Weights(format!(
            "{} is folded with the rotation, but it reads the unrotated activation",
            vb.name_of(name)
        ))),
    }
}

/// `x` rotated by the site's `R` (signs, FWHT per 1024-block, ÷32) per row, or `x` itself when the site has no
/// rotation. x: [N, K]
pub(crate) fn rotated<'a>(x: &'a [f32], signs: &Option<Arc<[f32]>>) -> Cow<'a, [f32]> {
    match signs {
        None => Cow::Borrowed(x),
        Some(s) => {
            let mut v = x.to_vec();
            onepass_kernels::hadamard_rotate(&mut v, s);
            Cow::Owned(v)
        }
    }
}

//! SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.

use onepass_kernels::swiglu;
use onepass_tensor::Tensor;

use std::sync::Arc;

use super::{linear, linears, rotated, site};
use crate::weights::Binder;
use crate::ModelError;

pub struct Mlp {
    /// gate, up: [I, H]; down: [H, I]
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    pub(crate) down: Tensor,
    /// Hadamard sites of a rotated pack: the normed input (gate, up) and the SwiGLU output (down).
    pub(crate) rot_in: Option<Arc<[f32]>>,
    pub(crate) rot_down: Option<Arc<[f32]>>,
}

impl Mlp {
    pub fn load(vb: &Binder, hidden: usize, inter: usize) -> Result<Self, ModelError> {
        Ok(Mlp {
            rot_in: site(vb, &["gate_proj.weight", "up_proj.weight"])?,
            rot_down: site(vb, &["down_proj.weight"])?,
            gate: vb.get("gate_proj.weight", &[inter, hidden])?,
            up: vb.get("up_proj.weight", &[inter, hidden])?,
            down: vb.get("down_proj.weight", &[hidden, inter])?,
        })
    }

    /// `gate(x)` and `up(x)` of the normed rows x: [N, H]. → ([N, I], [N, I])
    pub fn gate_up(&self, x: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
        let x = rotated(x, &self.rot_in);
        let [g, u] = linears(&x, n, [&self.gate, &self.up]);
        (g, u)
    }

    /// `g = silu(g) · u`, the input of [`Mlp::down`].
    pub fn activate(&self, g: &mut [f32], u: &[f32]) {
        swiglu(g, u);
    }

    /// `down_proj` of the SwiGLU output g: [N, I]. → [N, H]
    pub fn down(&self, g: &[f32], n: usize) -> Vec<f32> {
        linear(&rotated(g, &self.rot_down), n, &self.down)
    }

    pub fn tensors(&self) -> [&Tensor; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

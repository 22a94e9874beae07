//! SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.

use onepass_kernels::{matmul_t, swiglu};
use onepass_tensor::Tensor;

use crate::weights::Binder;
use crate::ModelError;

pub struct Mlp {
    /// gate, up: [I, H]; down: [H, I]
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    pub(crate) down: Tensor,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
}

impl Mlp {
    pub fn load(vb: &Binder, hidden: usize, inter: usize) -> Result<Self, ModelError> {
        Ok(Mlp {
            gate: vb.get("gate_proj.weight", &[inter, hidden])?,
            up: vb.get("up_proj.weight", &[inter, hidden])?,
            down: vb.get("down_proj.weight", &[hidden, inter])?,
            hidden,
            inter,
        })
    }

    /// x: [N, H] → [N, H]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut g = vec![0.0; n * self.inter];
        let mut u = vec![0.0; n * self.inter];
        matmul_t(x, n, &self.gate, &mut g);
        matmul_t(x, n, &self.up, &mut u);
        swiglu(&mut g, &u);
        let mut out = vec![0.0; n * self.hidden];
        matmul_t(&g, n, &self.down, &mut out);
        out
    }

    pub fn tensors(&self) -> [&Tensor; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

//! RMSNorm with Qwen3.5's zero-centred gains: the checkpoint stores `w` and the layer multiplies
//! by `1 + w` (folded once at load time).

use onepass_kernels::rms_norm_into;

use crate::weights::Binder;
use crate::ModelError;

pub struct RmsNorm {
    /// gain: [dim] = 1 + stored weight
    pub(crate) gain: Vec<f32>,
    pub(crate) eps: f32,
}

impl RmsNorm {
    pub fn load(vb: &Binder, dim: usize, eps: f32) -> Result<Self, ModelError> {
        let w = vb.get_f32("weight", &[dim])?;
        Ok(RmsNorm {
            gain: w.iter().map(|x| 1.0 + x).collect(),
            eps,
        })
    }

    /// x: [R, dim] → [R, dim]
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        rms_norm_into(x, &self.gain, self.eps, &mut out);
        out
    }

    /// In place, on rows of `dim` values.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        onepass_kernels::rms_norm(x, &self.gain, self.eps);
    }
}

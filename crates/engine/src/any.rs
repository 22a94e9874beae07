//! [`AnyBackend`]: the CPU model or the GPU one, chosen at run time; one engine value whatever the device.

use onepass_cuda::{CudaError, CudaHidden, CudaState};
use onepass_model::{Model, ModelError, SequenceState};

use crate::{Backend, CudaBackend, CudaOptions, Rng, Sampling};

/// The model on the CPU or on a GPU. Every method forwards to the device's backend, unchanged.
// One long-lived value per process: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyBackend {
    Cpu(Model),
    Cuda(CudaBackend),
}

/// A sequence state of either device (a state of one device given to the other is an error, never a crash).
pub enum AnyState {
    Cpu(SequenceState),
    Cuda(CudaState),
}

/// Hidden rows of either device.
pub enum AnyHidden {
    Cpu(Vec<f32>),
    Cuda(CudaHidden),
}

#[derive(Debug, thiserror::Error)]
pub enum AnyError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("a sequence state or hidden rows of one device were given to the model on the other")]
    Mismatch,
}

impl AnyBackend {
    /// The model on the CPU, its weights in the forms the CPU reads fastest ([`Model::prepare_for_cpu`]).
    pub fn cpu(mut m: Model) -> AnyBackend {
        m.prepare_for_cpu();
        AnyBackend::Cpu(m)
    }

    /// Uploads `m` to the GPU `o` names (the CPU model may be dropped afterwards).
    pub fn cuda(m: &Model, o: &CudaOptions) -> Result<AnyBackend, CudaError> {
        Ok(AnyBackend::Cuda(CudaBackend::new(m, o)?))
    }

    /// The GPU backend, when the model runs there (for GPU profiling).
    pub fn as_cuda(&self) -> Option<&CudaBackend> {
        match self {
            AnyBackend::Cuda(c) => Some(c),
            AnyBackend::Cpu(_) => None,
        }
    }

    /// The CPU model, when the model runs there.
    pub fn as_cpu(&self) -> Option<&Model> {
        match self {
            AnyBackend::Cpu(m) => Some(m),
            AnyBackend::Cuda(_) => None,
        }
    }
}

/// The halves of `items` that `half` picks (one device's states: [`AnyState::cpu_mut`] or [`AnyState::cuda_mut`]), or
/// [`AnyError::Mismatch`] if one is on the other device.
fn items_on<'a, S>(
    items: &'a mut [(&mut AnyState, &[u32])],
    half: impl Fn(&'a mut AnyState) -> Option<&'a mut S>,
) -> Result<Vec<(&'a mut S, &'a [u32])>, AnyError> {
    items
        .iter_mut()
        .map(|(st, ids)| half(st).map(|s| (s, *ids)).ok_or(AnyError::Mismatch))
        .collect()
}

impl AnyState {
    fn cpu_mut(&mut self) -> Option<&mut SequenceState> {
        match self {
            AnyState::Cpu(s) => Some(s),
            AnyState::Cuda(_) => None,
        }
    }

    fn cuda_mut(&mut self) -> Option<&mut CudaState> {
        match self {
            AnyState::Cuda(s) => Some(s),
            AnyState::Cpu(_) => None,
        }
    }
}

impl Backend for AnyBackend {
    type State = AnyState;
    type Hidden = AnyHidden;
    type Error = AnyError;

    fn device(&self) -> String {
        match self {
            AnyBackend::Cpu(m) => m.device(),
            AnyBackend::Cuda(c) => c.device(),
        }
    }
    fn vocab_size(&self) -> usize {
        match self {
            AnyBackend::Cpu(m) => Backend::vocab_size(m),
            AnyBackend::Cuda(c) => c.vocab_size(),
        }
    }
    fn max_positions(&self) -> usize {
        match self {
            AnyBackend::Cpu(m) => Backend::max_positions(m),
            AnyBackend::Cuda(c) => c.max_positions(),
        }
    }
    fn state_bytes_per_token(&self) -> usize {
        match self {
            AnyBackend::Cpu(m) => m.state_bytes_per_token(),
            AnyBackend::Cuda(c) => c.state_bytes_per_token(),
        }
    }
    fn new_state(&self) -> Result<AnyState, AnyError> {
        Ok(match self {
            AnyBackend::Cpu(m) => AnyState::Cpu(Backend::new_state(m)?),
            AnyBackend::Cuda(c) => AnyState::Cuda(c.new_state()?),
        })
    }
    fn state_bytes(&self, st: &AnyState) -> usize {
        match st {
            AnyState::Cpu(s) => s.bytes(),
            AnyState::Cuda(s) => s.bytes(),
        }
    }
    fn position(&self, st: &AnyState) -> usize {
        match st {
            AnyState::Cpu(s) => s.position(),
            AnyState::Cuda(s) => s.position(),
        }
    }
    fn fork(&self, st: &AnyState) -> Result<AnyState, AnyError> {
        Ok(match (self, st) {
            (AnyBackend::Cpu(m), AnyState::Cpu(s)) => AnyState::Cpu(m.fork(s)?),
            (AnyBackend::Cuda(c), AnyState::Cuda(s)) => AnyState::Cuda(c.fork(s)?),
            _ => return Err(AnyError::Mismatch),
        })
    }
    fn restore(&self, st: &mut AnyState, snap: &AnyState) -> Result<(), AnyError> {
        match (self, st, snap) {
            (AnyBackend::Cpu(m), AnyState::Cpu(s), AnyState::Cpu(p)) => Ok(m.restore(s, p)?),
            (AnyBackend::Cuda(c), AnyState::Cuda(s), AnyState::Cuda(p)) => Ok(c.restore(s, p)?),
            _ => Err(AnyError::Mismatch),
        }
    }
    fn forward_batch(&self, items: &mut [(&mut AnyState, &[u32])]) -> Result<AnyHidden, AnyError> {
        Ok(match self {
            AnyBackend::Cpu(m) => {
                AnyHidden::Cpu(m.forward_batch(&mut items_on(items, AnyState::cpu_mut)?)?)
            }
            AnyBackend::Cuda(c) => {
                AnyHidden::Cuda(c.forward_batch(&mut items_on(items, AnyState::cuda_mut)?)?)
            }
        })
    }
    fn runs_trees(&self) -> bool {
        match self {
            AnyBackend::Cpu(m) => m.runs_trees(),
            AnyBackend::Cuda(c) => c.runs_trees(),
        }
    }
    fn forward_tree(
        &self,
        roots: &mut [(&mut AnyState, &[u32])],
        children: &[(usize, &[u32])],
    ) -> Result<Option<AnyHidden>, AnyError> {
        Ok(match self {
            AnyBackend::Cpu(m) => m
                .forward_tree(&mut items_on(roots, AnyState::cpu_mut)?, children)?
                .map(AnyHidden::Cpu),
            AnyBackend::Cuda(c) => c
                .forward_tree(&mut items_on(roots, AnyState::cuda_mut)?, children)?
                .map(AnyHidden::Cuda),
        })
    }
    fn min_tree_root(&self) -> usize {
        match self {
            AnyBackend::Cpu(m) => m.min_tree_root(),
            AnyBackend::Cuda(c) => c.min_tree_root(),
        }
    }
    fn tree_child_bytes(&self) -> Option<usize> {
        match self {
            AnyBackend::Cpu(m) => m.tree_child_bytes(),
            AnyBackend::Cuda(c) => c.tree_child_bytes(),
        }
    }
    fn label_logits(
        &self,
        h: &AnyHidden,
        picks: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f32>>, AnyError> {
        match (self, h) {
            (AnyBackend::Cpu(m), AnyHidden::Cpu(h)) => Ok(m.label_logits(h, picks)?),
            (AnyBackend::Cuda(c), AnyHidden::Cuda(h)) => Ok(c.label_logits(h, picks)?),
            _ => Err(AnyError::Mismatch),
        }
    }
    fn logits(&self, h: &AnyHidden, rows: &[usize]) -> Result<Vec<Vec<f32>>, AnyError> {
        match (self, h) {
            (AnyBackend::Cpu(m), AnyHidden::Cpu(h)) => Ok(Backend::logits(m, h, rows)?),
            (AnyBackend::Cuda(c), AnyHidden::Cuda(h)) => Ok(Backend::logits(c, h, rows)?),
            _ => Err(AnyError::Mismatch),
        }
    }
    fn step_logits(&self, st: &mut AnyState, tok: u32) -> Result<Vec<f32>, AnyError> {
        match (self, st) {
            (AnyBackend::Cpu(m), AnyState::Cpu(s)) => Ok(Backend::step_logits(m, s, tok)?),
            (AnyBackend::Cuda(c), AnyState::Cuda(s)) => Ok(c.step_logits(s, tok)?),
            _ => Err(AnyError::Mismatch),
        }
    }
    fn greedy_steps(
        &self,
        st: &mut AnyState,
        first: u32,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, AnyError> {
        match (self, st) {
            (AnyBackend::Cpu(m), AnyState::Cpu(s)) => {
                Ok(Backend::greedy_steps(m, s, first, max_steps, on_token)?)
            }
            (AnyBackend::Cuda(c), AnyState::Cuda(s)) => {
                Ok(c.greedy_steps(s, first, max_steps, on_token)?)
            }
            _ => Err(AnyError::Mismatch),
        }
    }
    fn sample_steps(
        &self,
        st: &mut AnyState,
        first: u32,
        max_steps: usize,
        s: &Sampling,
        rng: &mut Rng,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, AnyError> {
        match (self, st) {
            (AnyBackend::Cpu(m), AnyState::Cpu(st)) => Ok(Backend::sample_steps(
                m, st, first, max_steps, s, rng, on_token,
            )?),
            (AnyBackend::Cuda(c), AnyState::Cuda(st)) => {
                Ok(c.sample_steps(st, first, max_steps, s, rng, on_token)?)
            }
            _ => Err(AnyError::Mismatch),
        }
    }
    fn argmax(&self, h: &AnyHidden, rows: &[usize]) -> Result<Vec<u32>, AnyError> {
        match (self, h) {
            (AnyBackend::Cpu(m), AnyHidden::Cpu(h)) => Ok(Backend::argmax(m, h, rows)?),
            (AnyBackend::Cuda(c), AnyHidden::Cuda(h)) => Ok(Backend::argmax(c, h, rows)?),
            _ => Err(AnyError::Mismatch),
        }
    }
}

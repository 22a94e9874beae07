//! The GPU model of `onepass-cuda` as a [`Backend`](crate::Backend).
//!
//! Device state per sequence (KV caches, conv and recurrent state on the GPU); the hidden rows of a forward stay on
//! the device and only the logits asked for come back. When a System One call fits one forward, prefixes and
//! suffixes run in that one forward (`CudaModel::forward_tree`: each layer's mixers continue the prefix's state for
//! the suffixes inside the layer, so the weights are read once); otherwise the prefixes run first and their device
//! state is forked per row (recurrent state copied, KV caches shared) for one batched forward of the suffixes.
//!
//! GPU memory for sequence state and forward scratch is bounded by [`CudaOptions::memory_budget_bytes`]: passing it
//! fails that call with an error (the server answers that request 500), it never aborts the process.

use std::sync::Mutex;

pub use onepass_cuda::CudaOptions;
use onepass_cuda::{CudaError, CudaHidden, CudaModel, CudaState, Precision, SplitGemms};
use onepass_model::Model;

use crate::{Backend, Rng, Sampling};

/// A [`CudaModel`] as a [`Backend`].
pub struct CudaBackend {
    model: CudaModel,
    /// One caller at a time on the stream's cuBLAS handle.
    lock: Mutex<()>,
}

impl CudaBackend {
    /// Uploads a loaded CPU model (which may be dropped afterwards).
    pub fn new(m: &Model, o: &CudaOptions) -> Result<Self, CudaError> {
        let model = CudaModel::load(m, o)?;
        Ok(CudaBackend {
            model,
            lock: Mutex::new(()),
        })
    }

    pub fn model(&self) -> &CudaModel {
        &self.model
    }

    fn guard(&self) -> Result<std::sync::MutexGuard<'_, ()>, CudaError> {
        let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.model
            .gpu()
            .ctx
            .bind_to_thread()
            .map_err(|err| CudaError::Driver {
                op: "bind context",
                err,
            })?;
        Ok(g)
    }
}

impl Backend for CudaBackend {
    type State = CudaState;
    type Hidden = CudaHidden;
    type Error = CudaError;

    fn device(&self) -> String {
        let g = self.model.gpu();
        let split = |p: Precision, what: &str| match self.model.split_gemms() {
            SplitGemms::ALL => format!("{}: {what}", p.name()),
            s => format!("{}: {what} ({}; the others bf16)", p.name(), s.describe()),
        };
        let prec = match self.model.precision() {
            p @ (Precision::Bf16Split | Precision::Mixed) => {
                split(p, "bf16 weights, split bf16 GEMM inputs")
            }
            p @ Precision::Half => match self.model.half_planes() {
                SplitGemms::NONE => format!("{}: f16 GEMM inputs and weights", p.name()),
                k => format!(
                    "{}: f16 GEMM inputs and weights ({} on split bf16 inputs)",
                    p.name(),
                    k.describe()
                ),
            },
            Precision::Bf16 => "bf16".into(),
            Precision::F32 => "f32".into(),
        };
        format!(
            "cuda ({}, {prec}, {}; weights {:.2} GB)",
            g.name,
            self.model.tc_arith().describe(),
            self.model.weight_bytes() as f64 / 1e9
        )
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn state_bytes_per_token(&self) -> usize {
        self.model.kv_bytes_per_token()
    }

    fn new_state(&self) -> Result<CudaState, CudaError> {
        let _g = self.guard()?;
        self.model.new_state()
    }

    fn state_bytes(&self, st: &CudaState) -> usize {
        st.bytes()
    }

    fn position(&self, st: &CudaState) -> usize {
        st.position()
    }

    fn fork(&self, st: &CudaState) -> Result<CudaState, CudaError> {
        let _g = self.guard()?;
        self.model.copy_state(st)
    }

    fn forward_batch(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
    ) -> Result<CudaHidden, CudaError> {
        let _g = self.guard()?;
        self.model.forward_batch(items)
    }

    fn runs_trees(&self) -> bool {
        self.model.runs_trees()
    }

    /// Shorter shared prefixes the engine runs whole, so the GPU never declines a group for one.
    fn min_tree_root(&self) -> usize {
        self.model.tree_min_root().unwrap_or(1)
    }

    /// The engine drops the children's states, and the GPU gives them none of their own.
    fn tree_child_bytes(&self) -> Option<usize> {
        Some(self.model.tree_child_bytes())
    }

    /// Prefixes and suffixes in one forward ([`CudaModel::forward_tree`]): every weight read once per request.
    fn forward_tree(
        &self,
        roots: &mut [(&mut CudaState, &[u32])],
        children: &[(usize, &[u32])],
    ) -> Result<Option<CudaHidden>, CudaError> {
        let _g = self.guard()?;
        // The children's states are dropped after the readout: the state pass skips writing them.
        Ok(self
            .model
            .forward_tree(roots, children, false)?
            .map(|(h, _)| h))
    }

    fn label_logits(
        &self,
        h: &CudaHidden,
        picks: &[(usize, &[u32])],
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        let _g = self.guard()?;
        let flat: Vec<(usize, u32)> = picks
            .iter()
            .flat_map(|&(r, ids)| ids.iter().map(move |&id| (r, id)))
            .collect();
        let all = self.model.logits_rows(h, &flat)?;
        let mut out = Vec::with_capacity(picks.len());
        let mut at = 0;
        for &(_, ids) in picks {
            out.push(all[at..at + ids.len()].to_vec());
            at += ids.len();
        }
        Ok(out)
    }

    /// One CUDA graph for the step, the head in it ([`CudaModel::logits_step`]); a plain forward and readout while a
    /// decode holds the GPU's decode buffers.
    fn step_logits(&self, st: &mut CudaState, tok: u32) -> Result<Vec<f32>, CudaError> {
        let r = {
            let _g = self.guard()?;
            self.model.logits_step(st, tok)?
        };
        match r {
            Some(l) => Ok(l),
            None => crate::step_logits_by_extend(self, st, tok),
        }
    }

    /// Each step one CUDA graph, queued before the host reads the step before's token
    /// ([`CudaModel::greedy_steps`]); step by step while another decode holds the GPU's decode buffers.
    fn greedy_steps(
        &self,
        st: &mut CudaState,
        first: u32,
        max_steps: usize,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, CudaError> {
        // The context bound to this thread for the whole decode; the lock itself is taken per step inside.
        drop(self.guard()?);
        match self
            .model
            .greedy_steps(st, first, max_steps, &self.lock, on_token)?
        {
            Some(fed) => Ok(fed),
            None => crate::greedy_by_steps(self, st, first, max_steps, on_token),
        }
    }

    /// Each step one CUDA graph ending in the draw on the GPU ([`CudaModel::sample_steps`]: the generator's state on
    /// the device, only the token comes back), queued before the host reads the step before's token; `rng` then
    /// skips the numbers the device drew. Step by step on the host while another decode holds the decode buffers.
    fn sample_steps(
        &self,
        st: &mut CudaState,
        first: u32,
        max_steps: usize,
        s: &Sampling,
        rng: &mut Rng,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, CudaError> {
        drop(self.guard()?);
        match self
            .model
            .sample_steps(st, first, max_steps, s, rng.state(), &self.lock, on_token)?
        {
            Some(fed) => {
                // One number per forward, as the host draws (none where it takes the argmax).
                if !s.is_greedy() && self.model.vocab_size() > 1 {
                    rng.skip(fed as u64);
                }
                Ok(fed)
            }
            None => crate::sample_by_steps(self, st, first, max_steps, s, rng, on_token),
        }
    }

    /// Picked on the GPU: the logits stay there and only the ids come back.
    fn argmax(&self, h: &CudaHidden, rows: &[usize]) -> Result<Vec<u32>, CudaError> {
        let _g = self.guard()?;
        self.model.argmax_at(h, rows)
    }

    fn logits(&self, h: &CudaHidden, rows: &[usize]) -> Result<Vec<Vec<f32>>, CudaError> {
        let _g = self.guard()?;
        let v = self.model.vocab_size();
        // The head on the rows asked for only ([rows.len(), V]).
        let all = self.model.logits_at(h, rows)?;
        Ok((0..rows.len())
            .map(|i| all[i * v..(i + 1) * v].to_vec())
            .collect())
    }
}

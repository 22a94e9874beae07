//! The whole state of one sequence: everything needed to continue it token by token.
//!
//! Per layer, either the attention key/value cache or the Gated DeltaNet conv history and recurrent
//! matrix, plus the position. A state can be snapshotted and restored (it is a plain value: `clone`
//! is a deep copy) and forked into independent copies; continuing a fork with the same tokens and
//! chunking gives bit-identical results to continuing the original.

/// Attention key/value cache of one layer.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// k, v: [S, HKV, D]
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Gated DeltaNet state of one layer.
#[derive(Clone, Debug)]
pub struct RecurrentState {
    /// conv: [K-1, conv_dim], the last K-1 inputs to the causal convolution (oldest first).
    pub conv: Vec<f32>,
    /// ssm: [HV, DK, DV], the delta-rule memory.
    pub ssm: Vec<f32>,
}

/// One layer's state, by layer kind.
#[derive(Clone, Debug)]
pub enum LayerState {
    Attention(KvCache),
    Recurrent(RecurrentState),
}

/// State of one sequence.
#[derive(Clone, Debug)]
pub struct SequenceState {
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerState>,
}

impl SequenceState {
    pub(crate) fn new(layers: Vec<LayerState>) -> Self {
        SequenceState { pos: 0, layers }
    }

    /// Tokens consumed so far (the position of the next token).
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Bytes held: the KV caches grow with the sequence, the recurrent state does not.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => (kv.k.len() + kv.v.len()) * 4,
                LayerState::Recurrent(r) => (r.conv.len() + r.ssm.len()) * 4,
            })
            .sum()
    }

    /// A deep copy to restore later.
    pub fn snapshot(&self) -> SequenceState {
        self.clone()
    }

    /// Replaces this state with a snapshot.
    pub fn restore(&mut self, snapshot: &SequenceState) {
        self.clone_from(snapshot);
    }

    /// `n` independent copies.
    pub fn fork(&self, n: usize) -> Vec<SequenceState> {
        (0..n).map(|_| self.clone()).collect()
    }
}

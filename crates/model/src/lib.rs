//! Qwen3.5-family hybrid language models on the CPU.
//!
//! Why this crate exists: the architecture written once, readably, as the reference every other path is held to
//! (the GPU forward in `onepass-cuda` is tested against it, and System One in `onepass-decide` runs on it). This
//! crate turns a checkpoint folder into a runnable model: it reads `config.json`
//! ([`config`]), binds every weight by its Hugging Face name with a declared shape
//! ([`weights`]), and runs the forward pass ([`qwen3_5`]: the layer sequence of [`layer_ops`] over the CPU's ops) over a [`SequenceState`] that holds
//! everything a sequence needs to continue (attention KV, GDN conv and recurrent state, position).
//! The blocks (Gated DeltaNet, gated attention, SwiGLU MLP, norms) live in [`blocks`] and call the
//! op set in `onepass-kernels`; nothing here loops over weights directly.

pub mod blocks;
pub mod config;
pub mod convert;
pub mod gguf;
pub mod layer_ops;
pub mod mlx;
pub mod qwen3_5;
pub mod sample;
pub mod state;
pub mod synth;
pub mod weights;

pub use config::{LayerKind, ModelConfig, ModelForm, TextConfig};
pub use qwen3_5::{Model, ModelInfo};
pub use state::{LayerState, SequenceState};

/// Errors loading or running a model. Messages name the file, tensor, shape or id at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Format(#[from] onepass_formats::FormatError),
    #[error(transparent)]
    Gguf(onepass_formats::GgufError),
    #[error("weights: {0}")]
    Weights(String),
    #[error("input: {0}")]
    Input(String),
    #[error("{0}")]
    Io(String),
}

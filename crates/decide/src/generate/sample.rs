//! Choosing the next token from the logits: the sampler of `onepass-model` ([`onepass_model::sample`]), which the
//! backends' decode steps run ([`onepass_engine::Backend::sample_steps`]: on a GPU, where the logits are).

pub use onepass_engine::{argmax, sample, Rng, Sampling};

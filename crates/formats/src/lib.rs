//! Checkpoint file formats.
//!
//! onepass reads weights from files it does not control, so this crate is where untrusted bytes
//! become [`Tensor`](onepass_tensor::Tensor)s: it parses safetensors headers (single files and
//! sharded folders with `model.safetensors.index.json`), checks every tensor's dtype, shape and
//! byte range against the file before handing out a memory-mapped view, and resolves a model
//! argument (a local folder or a Hub repo id) to a folder on disk without touching the network.

pub mod hub;
pub mod safetensors;

pub use hub::{resolve_model_dir, ResolveError};
pub use safetensors::{safetensors_header, write_safetensors, Checkpoint, FormatError};

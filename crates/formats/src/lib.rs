//! Checkpoint file formats.
//!
//! onepass reads weights from files it does not control, so this crate is where untrusted bytes
//! become [`Tensor`](onepass_tensor::Tensor)s: it parses safetensors headers (single files and
//! sharded folders with `model.safetensors.index.json`), checks every tensor's dtype, shape and
//! byte range against the file before handing out a memory-mapped view, and resolves a model
//! argument (a local folder or a Hub repo id) to a folder on disk without touching the network.
//!
//! GGUF files (llama.cpp's container, also PrismML's ternary packs) are read by [`gguf`]: the
//! header and metadata checked against the file, tensors memory-mapped; [`quant`] holds the block
//! layouts (Q8_0, PQ2_0, PTQ1_0) and their reference decoders; [`hadamard`] the validated
//! `prism.hadamard.*` rotation metadata; [`mlx`] MLX's affine 2-bit safetensors of the same packs.

pub mod gguf;
pub mod hadamard;
pub mod hub;
pub mod mlx;
pub mod quant;
pub mod safetensors;

pub use gguf::{
    write_gguf, Gguf, GgufArray, GgufError, GgufStreamWriter, GgufTensorInfo, GgufTensorPlan,
    GgufValue, GgufWriteTensor,
};
pub use hadamard::HadamardMeta;
pub use hub::{resolve_model, ModelFiles, ResolveError};
pub use mlx::{open_mlx_dir, MlxQuantization};
pub use quant::{dequantize, ptq1_0_to_pq2_0, quantize, GgmlType};
pub use safetensors::{safetensors_header, write_safetensors, Checkpoint, FormatError};

/// The message of the error `r` must be (tests).
#[cfg(test)]
pub(crate) fn error_text<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

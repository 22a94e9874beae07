//! Binding checkpoint tensors by name with declared shapes.
//!
//! The model asks for each tensor by its Hugging Face name relative to a prefix
//! (`vb.pp("layers.3").pp("linear_attn").get("in_proj_qkv.weight", &[n, k])`). Asking for a missing
//! tensor or one with another shape is an error naming it; after the model is built,
//! [`Binder::finish`] reports any tensor in the checkpoint that nobody asked for.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use onepass_formats::Checkpoint;
use onepass_tensor::Tensor;

use crate::gguf::{gguf_name, Rotations};
use crate::ModelError;

/// A view of a checkpoint under a name prefix.
#[derive(Clone)]
pub struct Binder {
    ck: Arc<Checkpoint>,
    prefix: String,
    used: Arc<Mutex<HashSet<String>>>,
    /// The checkpoint was read from a GGUF file (messages then give the file's names too).
    gguf: bool,
    rotations: Option<Arc<Rotations>>,
}

impl Binder {
    pub fn new(ck: Arc<Checkpoint>) -> Self {
        Binder {
            ck,
            prefix: String::new(),
            used: Arc::new(Mutex::new(HashSet::new())),
            gguf: false,
            rotations: None,
        }
    }

    /// A checkpoint read from a GGUF file, with its rotation metadata when it has some.
    pub fn from_gguf(ck: Arc<Checkpoint>, rotations: Option<Rotations>) -> Self {
        Binder {
            gguf: true,
            rotations: rotations.map(Arc::new),
            ..Self::new(ck)
        }
    }

    /// A checkpoint (already under the names the model binds) with its rotation, if any: an MLX folder.
    pub fn with_rotations(ck: Arc<Checkpoint>, rotations: Option<Rotations>) -> Self {
        Binder {
            rotations: rotations.map(Arc::new),
            ..Self::new(ck)
        }
    }

    /// Whether the checkpoint declares a Hadamard rotation.
    pub fn rotated(&self) -> bool {
        self.rotations.is_some()
    }

    /// The sign vector of the rotation folded into linear `name` (its input is rotated), if it is folded.
    pub fn folded_signs(&self, name: &str) -> Option<Arc<[f32]>> {
        let full = self.full(name);
        self.rotations.as_ref()?.folded.get(&full).cloned()
    }

    /// The sign vector of tensor `name` when it is stored rotated per row (the embedding).
    pub fn inverse_signs(&self, name: &str) -> Option<Arc<[f32]>> {
        let full = self.full(name);
        self.rotations.as_ref()?.inverse.get(&full).cloned()
    }

    /// `name` under this prefix as messages give it.
    pub fn name_of(&self, name: &str) -> String {
        self.shown(&self.full(name))
    }

    /// `full`, and for a GGUF checkpoint the file's name of it.
    fn shown(&self, full: &str) -> String {
        match gguf_name(full).filter(|_| self.gguf) {
            Some(g) => format!("{g} ({full})"),
            None => full.to_string(),
        }
    }

    /// The same checkpoint under `prefix.`.
    pub fn pp(&self, prefix: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() {
            prefix.to_string()
        } else {
            format!("{}.{prefix}", self.prefix)
        };
        Binder {
            prefix,
            ..self.clone()
        }
    }

    fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The tensor `name` with exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let full = self.full(name);
        let t = self.ck.get(&full).ok_or_else(|| {
            ModelError::Weights(format!(
                "missing tensor {} (expected shape {shape:?})",
                self.shown(&full)
            ))
        })?;
        if t.shape() != shape {
            return Err(ModelError::Weights(format!(
                "tensor {} has shape {:?}, expected {shape:?}",
                self.shown(&full),
                t.shape()
            )));
        }
        if let Ok(mut u) = self.used.lock() {
            u.insert(full);
        }
        Ok(t.clone())
    }

    /// The tensor `name` with exactly `shape`, widened to f32 (for small vectors).
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        Ok(self.get(name, shape)?.to_f32_vec())
    }

    /// Errors if the checkpoint holds a tensor that was never bound and is not under one of the
    /// `ignored` prefixes.
    pub fn finish(&self, ignored: &[&str]) -> Result<(), ModelError> {
        let used = self
            .used
            .lock()
            .map_err(|_| ModelError::Weights("binder lock poisoned".into()))?;
        let mut extra: Vec<&str> = self
            .ck
            .names()
            .filter(|n| !used.contains(*n) && !ignored.iter().any(|p| n.starts_with(p)))
            .collect();
        extra.sort();
        if let Some(first) = extra.first() {
            return Err(ModelError::Weights(format!(
                "unexpected tensor {}{} in the checkpoint (not part of this architecture)",
                self.shown(first),
                if extra.len() > 1 {
                    format!(" and {} more", extra.len() - 1)
                } else {
                    String::new()
                }
            )));
        }
        Ok(())
    }
}

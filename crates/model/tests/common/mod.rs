//! Shared helpers for the model integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub mod to_gguf;

use onepass_model::synth;
use onepass_model::Model;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes a preset's checkpoint into a fresh temp folder.
pub fn synth_dir(preset: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = synth::preset(preset).expect("preset");
    synth::write_checkpoint(&spec, dir.path(), &mut |_, _| {}).expect("synth");
    dir
}

pub fn load(preset: &str) -> (tempfile::TempDir, Model) {
    let dir = synth_dir(preset);
    let m = Model::load(dir.path()).expect("load");
    (dir, m)
}

/// max |a - b| / max(1, max |b|) over one row.
pub use onepass_kernels::max_rel_diff as rel_diff;

/// The worst [`rel_diff`] over the rows of `v` logits.
pub fn worst(a: &[f32], b: &[f32], v: usize) -> f32 {
    a.chunks(v)
        .zip(b.chunks(v))
        .map(|(x, y)| rel_diff(x, y))
        .fold(0.0, f32::max)
}

/// Logits [T, V] of `ids` run in pieces split at `cuts` (prefill, continuations, single steps).
pub fn logits_split(m: &Model, ids: &[u32], cuts: &[usize]) -> Vec<f32> {
    let mut st = m.new_state();
    let mut hidden = Vec::new();
    let mut start = 0;
    for end in cuts.iter().copied().chain([ids.len()]) {
        hidden.extend(m.forward(&mut st, &ids[start..end]).expect("forward"));
        start = end;
    }
    m.logits(&hidden)
}

/// Runs `ids` in chunks of `chunk` and returns full logits [T, V].
pub fn logits_chunked(m: &Model, ids: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state();
    let mut hidden = Vec::new();
    for piece in ids.chunks(chunk) {
        hidden.extend(m.forward(&mut st, piece).expect("forward"));
    }
    m.logits(&hidden)
}

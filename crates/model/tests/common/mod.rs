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
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
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

pub fn pseudo_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

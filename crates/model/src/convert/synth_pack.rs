//! Synthetic checkpoints written straight to GGUF (`onepass synth --format …`), one tensor at a
//! time: nothing but the rows being encoded is ever in memory, so the 27B shape's 7 GB pack is
//! written without its 54 GB float model.
//!
//! Float tensors are the same values `write_checkpoint` stores (drawn per element from (seed,
//! name, index), rounded to the preset's dtype), so a float GGUF from `synth` equals `convert` of
//! the synthetic folder. Ternary tensors are drawn as packed blocks: codes uniform over −d, 0, +d
//! per block and a scale per block of `σ·√1.5·U(0.75, 1.25)`, where σ is the float tensor's
//! standard deviation (1/√fan_in for projections, 0.3 for the embedding) — the same spread of
//! weights, so every block still moves the logits. The stored ternary matrix is the folded one;
//! the model it stands for is `W = W'·R`, as for any pack.

use std::collections::HashMap;

use onepass_formats::quant::{pack_pq2_0_block, pack_ptq1_0_block, TERNARY_BLOCK};
use onepass_formats::GgmlType;
use onepass_tensor::DType;
use rayon::prelude::*;

use super::{TensorJob, TensorSource};
use crate::synth::{draw, mix, name_hash, tensor_specs, Init, Spec, SynthSpec};

/// A synthetic checkpoint as a [`TensorSource`].
pub struct SynthSource {
    specs: HashMap<String, Spec>,
    seed: u64,
}

impl SynthSource {
    pub fn new(spec: &SynthSpec) -> SynthSource {
        SynthSource {
            specs: tensor_specs(spec)
                .into_iter()
                .map(|s| (s.name.clone(), s))
                .collect(),
            seed: spec.seed,
        }
    }

    fn key(&self, name: &str) -> u64 {
        mix(self.seed ^ name_hash(name))
    }
}

fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        // Synthetic tensors are drawn in a float type; a block type has no rounding of its own here.
        DType::Q8_0 | DType::PQ2_0 | DType::PTQ1_0 | DType::Q8_0G | DType::PQ2_0G => v,
    }
}

impl TensorSource for SynthSource {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.specs.get(name).map(|s| (s.dtype, s.shape.clone()))
    }

    fn read(&self, name: &str, start: usize, out: &mut [f32]) {
        let Some(s) = self.specs.get(name) else {
            return;
        };
        let key = self.key(name);
        for (j, o) in out.iter_mut().enumerate() {
            *o = round_to(s.dtype, draw(s.init, key, (start + j) as u64));
        }
    }

    fn packed_rows(&self, job: &TensorJob, r0: usize, r1: usize, out: &mut [u8]) -> Option<()> {
        let ty = job.plan.ggml_type;
        let spec = self.specs.get(&job.source)?;
        let sigma = match spec.init {
            Init::Normal(s) => s,
            _ => return None,
        };
        let key = self.key(&job.source) ^ 0x0074_6572_6e61_7279;
        let blocks_per_row = job.cols / TERNARY_BLOCK;
        let bb = ty.block_bytes();
        out.par_chunks_mut(bb).enumerate().for_each(|(k, block)| {
            let b = (r0 * blocks_per_row + k) as u64;
            let mut trits = [0u8; TERNARY_BLOCK];
            for (w, chunk) in trits.chunks_mut(32).enumerate() {
                let mut x = mix(key ^ mix(b * 5 + w as u64));
                for t in chunk.iter_mut() {
                    *t = (x % 3) as u8;
                    x /= 3;
                }
            }
            let u = (mix(key ^ mix(b * 5 + 4)) >> 11) as f64 / (1u64 << 53) as f64;
            let d = half::f16::from_f32(sigma * 1.5f32.sqrt() * (0.75 + 0.5 * u as f32));
            match ty {
                GgmlType::PQ2_0 => pack_pq2_0_block(&trits, d, block),
                _ => pack_ptq1_0_block(&trits, d, block),
            }
        });
        debug_assert_eq!(out.len(), (r1 - r0) * blocks_per_row * bb);
        Some(())
    }
}

//! Batch invariance on the GPU: with `CudaOptions::batch_invariant`, every answer-fixture request's probabilities
//! scored alone are bit-identical to the same request's in `score` calls with 1, 7 and 31 other requests of mixed
//! sizes (tests/common/invariance.rs), in mixed, split and bf16 precision, on both synthetic checkpoints of
//! tests/fixtures/systemone/answers and their bf16 twins (one forward per call: the requests' prefixes and suffixes
//! in one tree). Without it (the default), the same comparison is printed, not asserted: how far batching moves an
//! answer there. With shape buckets on (every forward padded to its bucket of rows), the invariant runs are held to
//! the same bits. GPU tests: `#[ignore]`d, run with `--include-ignored` on a GPU machine.
//!
//! The prefix-state LRU is off: a context kept by the request's alone run would send its batched run down the
//! two-pass route (from the kept state), another route rather than another batch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{answer_checkpoint_in, answer_fixtures, invariance};
use onepass_cuda::Precision;
use onepass_decide::{parse_request, Engine, EngineOptions, Plan};
use onepass_engine::{CudaBackend, CudaOptions};
use onepass_model::Model;
use onepass_tensor::DType;
use serde_json::Value as J;

const PRESETS: [&str; 2] = ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"];

fn plans(e: &Engine<CudaBackend>, preset: &str) -> Vec<Plan> {
    common::jsonl(&answer_fixtures().join(format!("{preset}.jsonl")))
        .iter()
        .map(|v: &J| {
            let body = v["body"].as_str().unwrap();
            e.plan(&parse_request(body.as_bytes()).unwrap()).unwrap()
        })
        .collect()
}

fn gpu_engine(
    dir: &std::path::Path,
    precision: Precision,
    invariant: bool,
    shape_buckets: bool,
) -> Engine<CudaBackend> {
    let m = Model::load(dir).unwrap();
    let model_type = m.config().model_type.clone();
    let cuda = CudaOptions {
        precision,
        memory_budget_bytes: 4 << 30,
        batch_invariant: invariant,
        shape_buckets,
        ..CudaOptions::default()
    };
    let backend = CudaBackend::new(&m, &cuda).expect("GPU engine");
    drop(m);
    let opts = EngineOptions {
        prefix_cache_bytes: 0,
        ..EngineOptions::default()
    };
    Engine::from_dir_with(dir, &model_type, backend, opts).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU (run with --include-ignored on a GPU machine)"]
fn gpu_alone_equals_batched() {
    let mut fails = Vec::new();
    for preset in PRESETS {
        for dtype in [None, Some(DType::BF16)] {
            let dir = answer_checkpoint_in(preset, dtype);
            for precision in [
                Precision::Mixed,
                Precision::Bf16Split,
                Precision::Half,
                Precision::Bf16,
            ] {
                // Shape buckets on: each forward padded to its bucket of rows, alone and batched alike.
                for (invariant, buckets) in [(true, false), (true, true), (false, false)] {
                    let e = gpu_engine(dir, precision, invariant, buckets);
                    let m = e.model().model();
                    let ps = plans(&e, preset);
                    let trees = m.tree_forwards();
                    let tag = format!(
                        "{preset} {} {precision:?} batch_invariant={invariant} shape_buckets={buckets}",
                        if dtype.is_some() { "bf16 twin" } else { "f32" }
                    );
                    let r = invariance::check(&tag, &e, &ps);
                    let gemm_fallbacks = onepass_cuda::gemm_lt::fallbacks(m.gpu());
                    eprintln!(
                        "{tag}: {} slots compared, {} differ (max|dp| {:e}); {} trees; GEMMs that fell back to \
                         GemmEx: {gemm_fallbacks}",
                        r.slots,
                        r.differ.len(),
                        r.max,
                        m.tree_forwards() - trees
                    );
                    if m.tree_forwards() == trees {
                        fails.push(format!("{tag}: no request took the one-forward tree"));
                    }
                    if invariant {
                        if gemm_fallbacks > 0 {
                            fails
                                .push(format!("{tag}: {gemm_fallbacks} GEMMs fell back to GemmEx"));
                        }
                        fails.extend(r.differ.into_iter().take(10));
                    }
                }
            }
        }
    }
    assert!(fails.is_empty(), "{} failures: {fails:#?}", fails.len());
}

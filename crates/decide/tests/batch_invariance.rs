//! Batch invariance on the CPU: every answer-fixture request's probabilities scored alone are bit-identical to the
//! same request's in `score` calls with 1, 7 and 31 other requests of mixed sizes (tests/common/invariance.rs), on
//! both synthetic checkpoints of tests/fixtures/systemone/answers, with their f32 weights and with their bf16 twins,
//! with the prefix-state LRU on (a batched request's context restored from the state its alone run kept) and off,
//! and with whole rows (no shared prefix). Bit-identical because every CPU kernel's arithmetic for a row depends on
//! that row alone: the matmul sums each output in one fixed order whatever the number of tokens stacked
//! (crates/kernels/src/cpu/matmul.rs), and the token mixers walk each row with its own state.
//!
//! Needs testdata/qwen3_5-tokenizer (tools/setup-testdata.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{answer_checkpoint_in, answer_fixtures, invariance};
use onepass_decide::{parse_request, Engine, EngineOptions, Plan};
use onepass_tensor::DType;
use serde_json::Value as J;

const PRESETS: [&str; 2] = ["tiny-qwen-vocab", "tiny-qwen-vocab-composite"];

fn plans(e: &Engine, preset: &str) -> Vec<Plan> {
    common::jsonl(&answer_fixtures().join(format!("{preset}.jsonl")))
        .iter()
        .map(|v: &J| {
            let body = v["body"].as_str().unwrap();
            e.plan(&parse_request(body.as_bytes()).unwrap()).unwrap()
        })
        .collect()
}

fn check(dtype: Option<DType>) {
    let mut fails = Vec::new();
    for preset in PRESETS {
        let dir = answer_checkpoint_in(preset, dtype);
        for (what, opts) in [
            ("prefix-state LRU on", EngineOptions::default()),
            (
                "LRU off",
                EngineOptions {
                    prefix_cache_bytes: 0,
                    ..EngineOptions::default()
                },
            ),
            (
                "whole rows",
                EngineOptions {
                    shared_prefix: false,
                    prefix_cache_bytes: 0,
                    ..EngineOptions::default()
                },
            ),
        ] {
            let e = Engine::load(dir, opts).unwrap();
            let ps = plans(&e, preset);
            assert!(ps.len() >= 20, "{preset}: {} requests", ps.len());
            let tag = format!("{preset} {dtype:?} {what}");
            let m = invariance::check(&tag, &e, &ps);
            eprintln!(
                "{tag}: {} slots compared, {} differ (max|dp| {:e})",
                m.slots,
                m.differ.len(),
                m.max
            );
            fails.extend(m.differ);
        }
    }
    assert!(
        fails.is_empty(),
        "{} slots differ: {:#?}",
        fails.len(),
        &fails[..fails.len().min(20)]
    );
}

#[test]
fn f32_weights_alone_equals_batched() {
    check(None);
}

#[test]
fn bf16_weights_alone_equals_batched() {
    check(Some(DType::BF16));
}

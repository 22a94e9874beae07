//! Logits against transformers float32 on the committed fixtures (tools/oracle/model_fixtures.py).
//!
//! Each preset's checkpoint is regenerated here and must hash to what the oracle saw; then every
//! position of every fixture sequence must be within 1e-3 relative (max |diff| / max(1, max |logit|)).

mod common;

use onepass_formats::Checkpoint;
use sha2::{Digest, Sha256};

const TOLERANCE: f32 = 1e-3;

fn manifest() -> serde_json::Value {
    let path = common::repo_root().join("tests/fixtures/logits/manifest.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("manifest")).expect("manifest json")
}

fn check_preset(preset: &str) {
    let man = manifest();
    let entry = &man["presets"][preset];
    let (dir, model) = common::load(preset);
    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("read weights");
    let digest = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(
        digest,
        entry["model_safetensors_sha256"].as_str().expect("sha"),
        "{preset}: the synthetic checkpoint no longer matches the one the fixtures were made from; rerun tools/oracle/model_fixtures.py"
    );
    let fx = Checkpoint::open_file(
        &common::repo_root().join(format!("tests/fixtures/logits/{preset}.safetensors")),
    )
    .expect("fixture");
    let v = model.vocab_size();
    let mut checked = 0;
    let mut worst = 0.0f32;
    for len in man["lengths"].as_array().expect("lengths") {
        let len = len.as_u64().expect("len") as usize;
        let ids: Vec<u32> = fx
            .get(&format!("ids.{len}"))
            .expect("ids")
            .to_f32_vec()
            .iter()
            .map(|x| *x as u32)
            .collect();
        let want = fx
            .get(&format!("logits.{len}"))
            .expect("logits")
            .to_f32_vec();
        let got = common::logits_chunked(&model, &ids, len);
        for p in 0..len {
            let d = common::rel_diff(&got[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
            assert!(
                d <= TOLERANCE,
                "{preset} length {len} position {p}: relative diff {d:e} > {TOLERANCE:e}"
            );
            worst = worst.max(d);
            checked += 1;
        }
    }
    eprintln!("{preset}: {checked} positions, worst relative diff {worst:e}");
    assert!(checked > 900, "{preset}: only {checked} positions checked");
}

#[test]
fn tiny_gva_matches_transformers() {
    check_preset("tiny-gva");
}

#[test]
fn tiny_attn_first_matches_transformers() {
    check_preset("tiny-attn-first");
}

#[test]
fn tiny_composite_matches_transformers() {
    check_preset("tiny-composite");
}

#[test]
fn tiny_bf16_matches_transformers() {
    check_preset("tiny-bf16");
}

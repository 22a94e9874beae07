//! Helpers shared by the fixture tests of onepass-decide.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use onepass_decide::Plan;
use onepass_tokenizer::Tokenizer;
use serde_json::Value as J;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One JSON value per line of a fixture file.
pub fn jsonl(path: &Path) -> Vec<J> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect()
}

/// The Qwen3.5 tokenizer as the reference sees it through transformers (decider-contract R2.1.2),
/// which is what System One uses.
pub fn tok() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        Tokenizer::from_dir(&root().join("testdata/qwen3_5-tokenizer"), None)
            .expect("run tools/setup-testdata.sh to build testdata/qwen3_5-tokenizer")
            .transformers_compatible()
    })
}

pub fn u32s(v: &J) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn usizes(v: &J) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// A plan's rows (ids, slots, nopts, types) and usage equal a fixture case's `rows` and
/// `input_tokens`.
pub fn check_rows(name: &str, plan: &Plan, case: &J) {
    let want = case["rows"].as_array().unwrap();
    assert_eq!(plan.rows.len(), want.len(), "{name}: row count");
    for (k, (r, w)) in plan.rows.iter().zip(want).enumerate() {
        assert_eq!(r.ids, u32s(&w["ids"]), "{name}: row {k} ids");
        assert_eq!(r.slots, usizes(&w["slots"]), "{name}: row {k} slots");
        assert_eq!(r.nopts, usizes(&w["nopts"]), "{name}: row {k} nopts");
        let types: Vec<&str> = r.types.iter().map(|t| t.as_str()).collect();
        let wt: Vec<&str> = w["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(types, wt, "{name}: row {k} types");
    }
    assert_eq!(
        plan.input_tokens,
        case["input_tokens"].as_u64().unwrap() as usize,
        "{name}: usage"
    );
}

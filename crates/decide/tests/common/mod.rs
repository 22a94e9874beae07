//! Helpers shared by the fixture tests of onepass-decide.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use onepass_decide::Plan;
use onepass_model::synth;
use onepass_tokenizer::Tokenizer;
use serde_json::Value as J;
use sha2::{Digest, Sha256};

// Shared with crates/server/tests/common (and, through this file, crates/decide/tests/cuda_answers.rs).
#[path = "process_dir.rs"]
mod process_dir;

/// Batch invariance: a request alone against the same request batched with others.
pub mod invariance;
/// Random request bodies from a seed.
pub mod random_requests;
pub use process_dir::process_dir;

/// The repository root: the working directory when it holds the fixtures (a test binary carried to another machine
/// and run from a copy of the repository, as crates/cuda/gpu-run.sh does), else the source tree.
pub fn root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("tests/fixtures/systemone").is_dir() {
        return cwd;
    }
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

/// A JSON array's elements, each through `f`.
pub fn array<'a, T>(v: &'a J, f: impl Fn(&'a J) -> T) -> Vec<T> {
    v.as_array().unwrap().iter().map(f).collect()
}

/// Copies the Qwen3.5 test tokenizer (testdata/qwen3_5-tokenizer) into the checkpoint folder `dir`.
pub fn copy_tokenizer(dir: &Path) {
    let tok = root().join("testdata/qwen3_5-tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f))
            .expect("run tools/setup-testdata.sh to build testdata/qwen3_5-tokenizer");
    }
}

pub fn u32s(v: &J) -> Vec<u32> {
    array(v, |x| x.as_u64().unwrap() as u32)
}

pub fn usizes(v: &J) -> Vec<usize> {
    array(v, |x| x.as_u64().unwrap() as usize)
}

pub fn f64s(v: &J) -> Vec<f64> {
    array(v, |x| x.as_f64().unwrap())
}

pub fn strs(v: &J) -> Vec<&str> {
    array(v, |x| x.as_str().unwrap())
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
        assert_eq!(types, strs(&w["types"]), "{name}: row {k} types");
    }
    assert_eq!(
        plan.input_tokens,
        case["input_tokens"].as_u64().unwrap() as usize,
        "{name}: usage"
    );
}

/// The folder of the System One answer fixtures (tests/fixtures/systemone/answers, tools/oracle/decider_answers.py).
pub fn answer_fixtures() -> PathBuf {
    match std::env::var_os("ONEPASS_ANSWER_FIXTURES") {
        // Another set in the same format: `decider_answers.py --fuzz SEED COUNT --out DIR` (random requests).
        Some(dir) => PathBuf::from(dir),
        None => root().join("tests/fixtures/systemone/answers"),
    }
}

/// Their manifest (per preset: the checkpoint's digest and decider_config.json).
pub fn answer_manifest() -> &'static J {
    static M: OnceLock<J> = OnceLock::new();
    M.get_or_init(|| {
        serde_json::from_str(
            &std::fs::read_to_string(answer_fixtures().join("manifest.json")).expect("manifest"),
        )
        .expect("manifest json")
    })
}

/// The checkpoint folder of an answer-fixture preset: weights (hashed against the manifest, so they are the ones the
/// oracle saw), the real tokenizer, the fixture's decider_config.json. Written once per test binary.
pub fn answer_checkpoint(preset: &'static str) -> &'static Path {
    answer_checkpoint_in(preset, None)
}

/// [`answer_checkpoint`], or with `dtype` its weights written in that dtype instead (a twin: the bf16 weights a bf16
/// engine runs; no fixture was made from it, so it is not hashed). Written once per test binary and dtype.
pub fn answer_checkpoint_in(
    preset: &'static str,
    dtype: Option<onepass_tensor::DType>,
) -> &'static Path {
    type Dirs = Vec<(&'static str, Option<onepass_tensor::DType>, &'static Path)>;
    static DIRS: OnceLock<std::sync::Mutex<Dirs>> = OnceLock::new();
    let dirs = DIRS.get_or_init(Default::default);
    let mut dirs = dirs.lock().unwrap();
    if let Some((_, _, d)) = dirs.iter().find(|(p, t, _)| *p == preset && *t == dtype) {
        return d;
    }
    let entry = &answer_manifest()["presets"][preset];
    let name = match dtype {
        None => preset.to_string(),
        Some(d) => format!("{preset}-{d:?}"),
    };
    let dir: &'static Path = Box::leak(process_dir().join(name).into_boxed_path());
    std::fs::create_dir_all(dir).expect("checkpoint dir");
    let mut spec = synth::preset(preset).expect("preset");
    if let Some(d) = dtype {
        spec.dtype = d;
    }
    synth::write_checkpoint(&spec, dir, &mut |_, _| {}).expect("synth");
    if dtype.is_none() {
        let digest = format!(
            "{:x}",
            Sha256::digest(std::fs::read(dir.join("model.safetensors")).expect("weights"))
        );
        assert_eq!(
            digest,
            entry["model_safetensors_sha256"].as_str().unwrap(),
            "{preset}: the synthetic checkpoint no longer matches the one the answers were made from; rerun tools/oracle/decider_answers.py"
        );
    }
    copy_tokenizer(dir);
    std::fs::write(
        dir.join("decider_config.json"),
        entry["decider_config"].as_str().unwrap(),
    )
    .unwrap();
    dirs.push((preset, dtype, dir));
    dir
}

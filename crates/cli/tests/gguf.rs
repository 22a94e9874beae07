//! `--model` with a GGUF file: the same logits as the folder it was converted from, the tokenizer.json beside
//! the file, a folder holding one GGUF file, and a file without a tokenizer said so.

use std::path::Path;

mod common;
#[path = "../../model/tests/common/to_gguf.rs"]
mod to_gguf;

use common::{onepass, tokenize};

fn run(args: &[&str], model: &Path) -> std::process::Output {
    onepass()
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .expect("run")
}

fn json(args: &[&str], model: &Path) -> serde_json::Value {
    let out = run(args, model);
    assert!(
        out.status.success(),
        "{args:?} {}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON value")
}

fn logits(model: &Path) -> Vec<f64> {
    let v = json(
        &["logits", "--device", "cpu", "--ids", "1,2,3,4", "--last"],
        model,
    );
    v["logits"][0]
        .as_array()
        .expect("row")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

#[test]
fn a_gguf_file_runs_like_the_folder_it_came_from() {
    let hf = tempfile::tempdir().expect("tempdir");
    let out = onepass()
        .args(["synth", "--preset", "tiny-gva", "--out"])
        .arg(hf.path())
        .output()
        .expect("synth");
    assert!(out.status.success());
    let g = tempfile::tempdir().expect("tempdir");
    let file = g.path().join("tiny.gguf");
    to_gguf::convert(
        hf.path(),
        &file,
        &to_gguf::Opts::new(onepass_formats::GgmlType::F32),
    );

    // No tokenizer beside it, and none in the file: the tokenizer commands say what is missing.
    let out = run(&["tokenize"], &file);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer.ggml.model"), "{err}");

    // The model alone runs from the file, the folder holding it, and matches the safetensors folder.
    let want = logits(hf.path());
    for model in [file.as_path(), g.path()] {
        let got = logits(model);
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let d = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(d / scale <= 1e-5, "{}: {d}", model.display());
    }
    let info = json(&["info"], &file);
    assert_eq!(info["architecture"]["layers"], 4, "{info}");

    // A tokenizer.json beside the file is used.
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(hf.path().join(f), g.path().join(f)).expect("copy");
    }
    let out = tokenize(&file, b"\"hello\"\n");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with('['));
}

//! The CLI contract scripts depend on: output shapes of `tokenize`, `logits`, `info`, and clear
//! errors with a non-zero exit for bad input.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn onepass() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onepass"))
}

fn synth(preset: &str) -> tempfile::TempDir {
    synth_with(preset, &[])
}

/// `onepass synth --preset PRESET --out DIR` with `more` arguments (e.g. `--tokenizer`).
fn synth_with(preset: &str, more: &[&std::ffi::OsStr]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = onepass()
        .args(["synth", "--preset", preset, "--out"])
        .arg(dir.path())
        .args(more)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "synth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn run_ok(args: &[&str], model: &Path) -> serde_json::Value {
    let out = onepass()
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

/// `onepass tokenize --model MODEL` with `input` on stdin.
fn tokenize(model: &Path, input: &[u8]) -> std::process::Output {
    let mut child = onepass()
        .args(["tokenize", "--model"])
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    child.wait_with_output().expect("wait")
}

fn run_err(args: &[&str]) -> String {
    let out = onepass().args(args).output().expect("run");
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        out.stdout.is_empty(),
        "{args:?} printed to stdout on failure"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A JSON array of numbers.
fn f64s(row: &serde_json::Value) -> Vec<f64> {
    row.as_array()
        .expect("row")
        .iter()
        .map(|x| x.as_f64().expect("f"))
        .collect()
}

#[test]
fn logits_prints_one_row_per_position_or_the_last() {
    let d = synth("tiny-gva");
    let all = run_ok(&["logits", "--ids", "1,2,3"], d.path());
    let rows = all["logits"].as_array().expect("logits array");
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.as_array().expect("row").len() == 320));
    let last = run_ok(&["logits", "--ids", "1,2,3", "--last"], d.path());
    let last = last["logits"].as_array().expect("logits");
    assert_eq!(last.len(), 1);
    // The last row equals the last row of the full output (up to the GEMM vs GEMV summation order).
    let (a, b) = (f64s(&rows[2]), f64s(&last[0]));
    let scale = b.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-5 * scale));
    // Chunked input continues the same sequence.
    let chunked = run_ok(
        &["logits", "--ids", "1,2,3", "--last", "--chunk", "1"],
        d.path(),
    );
    let c = f64s(&chunked["logits"][0]);
    assert!(a.iter().zip(&c).all(|(x, y)| (x - y).abs() <= 1e-4 * scale));
}

#[test]
fn tokenize_reads_json_lines_and_writes_id_arrays() {
    let d = synth("tiny-gva");
    let out = tokenize(d.path(), b"\"ab\"\n\"<|im_start|>\\n\"\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<u32>> = String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("array"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0], vec![b'a' as u32, b'b' as u32]);
    // `<|im_start|>` is the synthetic tokenizer's second special token (vocab 320 → id 316).
    assert_eq!(lines[1], vec![316, b'\n' as u32]);
}

#[test]
fn info_reports_sizes_and_state_costs() {
    let d = synth("tiny-bf16");
    let v = run_ok(&["info"], d.path());
    assert_eq!(v["model_type"], "qwen3_5_text");
    assert_eq!(v["architecture"]["layers"], 6);
    assert_eq!(v["architecture"]["attention_layers"], 2);
    assert_eq!(v["weight_dtype"], "BF16");
    // 2 attention layers x (K + V) x 2 KV heads x 16 dims x 4 bytes.
    assert_eq!(v["state_bytes_per_token"], 2 * 2 * 2 * 16 * 4);
    assert!(v["parameters"].as_u64().expect("n") > 100_000);
    assert!(v["weight_bytes"].as_u64().expect("b") <= v["file_bytes"].as_u64().expect("f"));
}

#[test]
fn bad_input_is_a_message_and_a_non_zero_exit() {
    let d = synth("tiny-gva");
    let m = d.path().to_str().expect("path");
    assert!(run_err(&["logits", "--model", m, "--ids", "1,x"]).contains("\"x\" is not a token id"));
    assert!(run_err(&["logits", "--model", m, "--ids", ""]).contains("--ids is empty"));
    assert!(run_err(&["logits", "--model", m, "--ids", "1,999"]).contains("token id 999"));
    assert!(run_err(&["info", "--model", "/nonexistent/folder"]).contains("neither a local folder"));
    assert!(
        run_err(&["info", "--model", "nobody/nothing"]).contains("not in the Hugging Face cache")
    );
    assert!(run_err(&["synth", "--preset", "nope", "--out", "/tmp/x"]).contains("unknown preset"));
    let out = tokenize(d.path(), b"not json\n");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

/// `bench-systemone` on the CPU, a synthetic checkpoint with the real Qwen3.5 tokenizer (tools/setup-testdata.sh):
/// only the workloads asked for are timed (the first: 7 rows, the unique token count closest to 406 the state sizes
/// reach), `--batch 0` runs no saturating load, and a workload or profiled workload out of 1..3 is an error before
/// anything loads.
#[test]
fn bench_systemone_times_the_workloads_asked_for() {
    let tok = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen3_5-tokenizer");
    assert!(
        tok.join("tokenizer.json").is_file(),
        "{} is missing: run tools/setup-testdata.sh to build the Qwen3.5 test tokenizer",
        tok.display()
    );
    let d = synth_with(
        "tiny-qwen-vocab",
        &["--tokenizer".as_ref(), tok.as_os_str()],
    );
    std::fs::write(
        d.path().join("decider_config.json"),
        r#"{"isolated_levels": true, "neutralize_none": false, "version": "bench"}"#,
    )
    .expect("write");
    let args = [
        "bench-systemone",
        "--device",
        "cpu",
        "--reps",
        "1",
        "--batch",
        "0",
        "--workloads",
        "1",
        "--profile-workload",
        "0",
    ];
    let v = run_ok(&args, d.path());
    let w = v["workloads"].as_array().expect("workloads");
    assert_eq!(w.len(), 1, "{v}");
    assert_eq!(w[0]["rows"], 7, "{v}");
    let unique = w[0]["unique_tokens"].as_u64().expect("unique_tokens");
    assert!(unique.abs_diff(406) <= 20, "{unique} unique tokens");
    assert!(w[0]["p50_ms"].as_f64().expect("p50") > 0.0);
    assert_eq!(w[0]["saturating"], serde_json::json!([]), "{v}");
    let m = d.path().to_str().expect("path");
    for (flag, value, want) in [
        ("--workloads", "4", "the workloads are 1 to 3"),
        ("--workloads", "2,0", "the workloads are 1 to 3"),
        ("--profile-workload", "5", "there are 3 workloads"),
    ] {
        let err = run_err(&[
            "bench-systemone",
            "--device",
            "cpu",
            "--model",
            m,
            flag,
            value,
        ]);
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
}

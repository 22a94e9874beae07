//! The CLI contract scripts depend on: output shapes of `tokenize`, `logits`, `info`, and clear
//! errors with a non-zero exit for bad input.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{onepass, tokenize};

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
    succeeded(&out, "synth");
    dir
}

fn run_ok(args: &[&str], model: &Path) -> serde_json::Value {
    let out = onepass()
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .expect("run");
    succeeded(&out, &format!("{args:?}"));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

/// Asserts that `what` succeeded (its stderr is the failure message).
fn succeeded(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that `what` failed and printed nothing to stdout. → its stderr
fn failed(out: &std::process::Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} should fail");
    assert!(out.stdout.is_empty(), "{what} printed to stdout on failure");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run_err(args: &[&str]) -> String {
    let out = onepass().args(args).output().expect("run");
    failed(&out, &format!("{args:?}"))
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
    succeeded(&out, "tokenize");
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
    assert!(run_err(&["info", "--model", "/nonexistent/folder"]).contains("no such folder"));
    assert!(run_err(&["synth", "--preset", "nope", "--out", "/tmp/x"]).contains("unknown preset"));
    let file = d.path().join("config.json");
    let f = file.to_str().expect("path");
    assert_eq!(
        run_err(&["synth", "--preset", "tiny-gva", "--out", f]),
        format!("error: --out {f}: this is a file; give the path of a folder to write the checkpoint into\n")
    );
    let out = tokenize(d.path(), b"not json\n");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

/// `bench-systemone` on the CPU, a synthetic checkpoint with the real Qwen3.5 tokenizer (tools/setup-testdata.sh):
/// only the workloads asked for are timed (the first: 7 rows, the unique token count closest to 406 the state sizes
/// reach), `--batch 0` runs no saturating load, `--unseen 3` times three requests of distinct lengths, and a workload
/// or profiled workload out of 1..3 is an error before anything loads.
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
        "--unseen",
        "3",
    ];
    let v = run_ok(&args, d.path());
    let w = v["workloads"].as_array().expect("workloads");
    assert_eq!(w.len(), 1, "{v}");
    assert_eq!(w[0]["rows"], 7, "{v}");
    let unique = w[0]["unique_tokens"].as_u64().expect("unique_tokens");
    assert!(unique.abs_diff(406) <= 20, "{unique} unique tokens");
    assert!(w[0]["p50_ms"].as_f64().expect("p50") > 0.0);
    assert_eq!(w[0]["saturating"], serde_json::json!([]), "{v}");
    let unseen = &w[0]["unseen"];
    assert_eq!(unseen["requests"], 3, "{v}");
    assert_eq!(unseen["distinct_row_lengths"], 3, "{v}");
    assert_eq!(
        unseen["graph_launches"], 0,
        "the CPU launches no CUDA graph: {v}"
    );
    assert!(unseen["p50_ms"].as_f64().expect("unseen p50") > 0.0, "{v}");
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

/// `args` fails with exactly one line on stderr, `error: <msg>`. → msg
fn one_error_line(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect("run");
    let err = failed(&out, &format!("{cmd:?}"));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{cmd:?}: {err}");
    lines[0]
        .strip_prefix("error: ")
        .unwrap_or_else(|| panic!("{cmd:?}: {err}"))
        .to_string()
}

/// What `--model` can be told apart: a file, a missing path, a repo id not in the cache, a revision that would climb
/// out of the cache. Each says what it is and what to pass instead.
#[test]
fn model_arguments_that_are_not_model_folders_say_what_they_are() {
    let d = tempfile::tempdir().expect("tempdir");
    let file = d.path().join("ticket.json");
    std::fs::write(&file, "{}").expect("write");
    let hint =
        "pass the folder that holds config.json, the *.safetensors weights and tokenizer.json, or a .gguf file";
    let cache = tempfile::tempdir().expect("cache");
    let model = |arg: &std::ffi::OsStr| {
        let mut c = onepass();
        c.args(["info", "--model"])
            .arg(arg)
            .env("HF_HUB_CACHE", cache.path());
        one_error_line(&mut c)
    };
    assert_eq!(
        model(file.as_os_str()),
        format!(
            "model {}: this is a file, not a model folder or a .gguf file; {hint}",
            file.display()
        )
    );
    for missing in ["./no-such-model", "models/a/b", "/no/such/model"] {
        assert_eq!(
            model(missing.as_ref()),
            format!("model {missing}: no such folder; {hint}, or a Hub repo id ORG/NAME")
        );
    }
    let e = model("nobody/nothing".as_ref());
    assert!(
        e.starts_with("model nobody/nothing: no folder of that name here, and not in the Hugging Face cache at "),
        "{e}"
    );
    // A folder that holds no model file at all.
    assert_eq!(
        model(d.path().as_os_str()),
        format!(
            "model {}: this folder holds neither config.json, tokenizer.json nor a .gguf file, so it is not a model folder; {hint}",
            d.path().display()
        )
    );
    assert!(e.contains("`hf download nobody/nothing`"), "{e}");
    // The revision is checked before the cache is looked at, so it does not matter that the repo is not there.
    for rev in ["../../../../../../etc/passwd", "/etc", "../.."] {
        assert_eq!(
            model(format!("org/name@{rev}").as_ref()),
            format!("model org/name@{rev}: {rev:?} is not a revision name (a branch, tag or commit: letters, digits, '.', '_', '-' and '/', without '..' or a leading '/')")
        );
    }
}

/// Every command's typical failure (a model folder missing its files) names its cause once: one line, the missing
/// file once, the operating system's reason once.
#[test]
fn a_failure_names_its_cause_once() {
    // A folder with a tokenizer.json (so it passes as a model folder) but no config.json, and one the other way round.
    let no_config = synth("tiny-gva");
    std::fs::remove_file(no_config.path().join("config.json")).expect("rm");
    let no_tok = synth("tiny-gva");
    std::fs::remove_file(no_tok.path().join("tokenizer.json")).expect("rm");
    let (m, t) = (
        no_config.path().to_str().expect("path"),
        no_tok.path().to_str().expect("path"),
    );
    let req = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/ticket.json");
    let req = req.to_str().expect("path");
    let cases: [(&[&str], &str); 8] = [
        (&["info", "--model", m], "config.json"),
        (
            &["logits", "--device", "cpu", "--ids", "1", "--model", m],
            "config.json",
        ),
        (&["bench", "--device", "cpu", "--model", m], "config.json"),
        (&["tokenize", "--model", t], "tokenizer.json"),
        (&["render", "--model", t, req], "tokenizer.json"),
        (
            &["systemone", "--device", "cpu", "--model", m, req],
            "config.json",
        ),
        (
            &["serve", "--device", "cpu", "--port", "0", "--model", m],
            "config.json",
        ),
        (
            &["bench-systemone", "--device", "cpu", "--model", m],
            "config.json",
        ),
    ];
    for (args, file) in cases {
        let e = one_error_line(onepass().args(args));
        assert_eq!(e.matches(file).count(), 1, "{args:?}: {e}");
        assert_eq!(
            e.matches("No such file or directory").count(),
            1,
            "{args:?}: {e}"
        );
    }
}

/// A request file that is not a request is named, with what is wrong in plain words, before any model loads.
#[test]
fn a_request_file_that_is_not_a_request_is_named() {
    let d = tempfile::tempdir().expect("tempdir");
    let form =
        r#"a request is one JSON object {"state": ..., "questions": {...}} (see docs/api.md)"#;
    let cases = [
        (
            "notes.md",
            "# Title\n\nsome text\n",
            "is not JSON: Expecting value at line 1 column 1",
        ),
        (
            "broken.json",
            "{\"state\": 1,\n  \"questions\": {,}}",
            "is not JSON: Expecting property name enclosed in double quotes at line 2 column 17",
        ),
        (
            "list.json",
            "[1, 2]",
            "is not a System One request (the body: must be a JSON object)",
        ),
        (
            "noq.json",
            "{\"state\": 1}",
            "is not a System One request (`questions`: Field required)",
        ),
        (
            "qlist.json",
            "{\"state\": 1, \"questions\": []}",
            "is not a System One request (`questions`: must be a JSON object)",
        ),
    ];
    // The model folder holds only an empty config.json: the request is refused before the model is read.
    let no_model = d.path().join("model");
    std::fs::create_dir(&no_model).expect("mkdir");
    std::fs::write(no_model.join("config.json"), "{}").expect("write");
    for (name, body, what) in cases {
        let f = d.path().join(name);
        std::fs::write(&f, body).expect("write");
        for cmd in ["systemone", "render"] {
            let e = one_error_line(onepass().args([cmd, "--model"]).arg(&no_model).arg(&f));
            assert_eq!(e, format!("{} {what}; {form}", f.display()), "{cmd} {name}");
        }
    }
}

/// `onepass --help` and every subcommand's `--help` speak to users: no issue numbers, run names, internal
/// environment switches or reference-document citations, and `--model` is described wherever it is taken.
#[test]
fn help_text_is_in_user_words() {
    let help = |args: &[&str]| {
        let out = onepass().args(args).output().expect("run");
        succeeded(&out, &format!("{args:?}"));
        String::from_utf8(out.stdout).expect("utf8")
    };
    let top = help(&["--help"]);
    assert!(!top.to_lowercase().contains("generation"), "{top}");
    // Every subcommand the top-level help lists (so a new one is checked too).
    let cmds: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(cmds.len() >= 9, "{cmds:?}");
    let mut texts = vec![("onepass".to_string(), top.clone())];
    for c in &cmds {
        texts.push((c.clone(), help(&[c, "--help"])));
    }
    let run_name = |t: &str| {
        let b = t.as_bytes();
        (0..b.len().saturating_sub(6))
            .any(|i| &b[i..i + 5] == b" run " && b[i + 5] == b's' && b[i + 6].is_ascii_digit())
    };
    for (cmd, text) in &texts {
        let lower = text.to_lowercase();
        for bad in ["issue #", "issue ", "ship bar", "decider-contract", "§"] {
            assert!(
                !lower.contains(bad),
                "{cmd} --help mentions {bad:?}:\n{text}"
            );
        }
        assert!(!run_name(text), "{cmd} --help names a run:\n{text}");
        // ONEPASS_API_KEY is a user setting (the key from the environment, out of `ps`); any other ONEPASS_ name is
        // an internal switch.
        let others = text.replace("ONEPASS_API_KEY", "");
        assert!(
            !others.contains("ONEPASS_"),
            "{cmd} --help names an internal variable:\n{text}"
        );
        // `--model`'s description: on its line or the next.
        let lines: Vec<&str> = text.lines().collect();
        if let Some(i) = lines
            .iter()
            .position(|l| l.trim_start().starts_with("--model <MODEL>"))
        {
            let same = lines[i]
                .trim_start()
                .trim_start_matches("--model <MODEL>")
                .trim();
            let next = lines.get(i + 1).map_or("", |l| l.trim());
            let desc = if same.is_empty() { next } else { same };
            assert!(
                !desc.is_empty() && !desc.starts_with('-'),
                "{cmd} --help: --model has no description:\n{text}"
            );
        }
    }
    // The example of how to make a model for bench-systemone is a complete command.
    let bench = &texts
        .iter()
        .find(|(c, _)| c == "bench-systemone")
        .expect("bench-systemone")
        .1;
    for line in bench.lines().filter(|l| l.contains("onepass synth")) {
        assert!(line.contains("--out"), "{line}");
    }
}

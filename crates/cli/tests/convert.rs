//! `onepass convert`, `onepass info FILE.gguf` and `onepass synth --format`: the float files are
//! byte-identical to what llama.cpp's own writer (PyPI `gguf`) makes from the same checkpoint
//! with the converter's conventions applied in numpy (tests/fixtures/gguf/qwen35, written by
//! tools/oracle/gguf_model_fixtures.py); the ternary packs decode to the quantised, rotated
//! weights, checked against a dense Hadamard product in f64 written here.

use std::path::{Path, PathBuf};
use std::process::Command;

use onepass_formats::hadamard::HadamardMeta;
use onepass_formats::{dequantize, Checkpoint, GgmlType, Gguf};

fn onepass() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onepass"))
}

fn run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    onepass().args(args).output().expect("run onepass")
}

fn ok(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf/qwen35")
}

/// `onepass synth --preset PRESET` into `root/PRESET` (the folder name is the model's name).
fn synth(root: &Path, preset: &str) -> PathBuf {
    let dir = root.join(preset);
    ok(&[
        os("synth"),
        os("--preset"),
        os(preset),
        os("--out"),
        dir.as_os_str(),
    ]);
    dir
}

fn convert(dir: &Path, out: &Path, ty: &str, more: &[&str]) {
    let mut args = vec![
        os("convert"),
        os("--model"),
        dir.as_os_str(),
        os("--out"),
        out.as_os_str(),
        os("--type"),
        os(ty),
    ];
    args.extend(more.iter().map(os));
    ok(&args);
}

#[test]
fn float_conversions_are_byte_identical_to_gguf_py() {
    let tmp = tempfile::tempdir().expect("test step");
    let dir = synth(tmp.path(), "tiny-gva");
    for ty in ["f16", "bf16", "q8_0"] {
        let out = tmp.path().join(format!("tiny-gva.{ty}.gguf"));
        convert(&dir, &out, ty, &[]);
        let ours = std::fs::read(&out).expect("test step");
        let theirs =
            std::fs::read(fixtures().join(format!("tiny-gva.{ty}.gguf"))).expect("test step");
        // If `onepass synth`'s checkpoint or tokenizer changed on purpose, regenerate the fixtures
        // (tests/fixtures/gguf/qwen35/README.md says how).
        assert_eq!(ours.len(), theirs.len(), "{ty}: file sizes differ");
        if let Some(at) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            panic!("{ty}: first differing byte at offset {at}");
        }
    }
}

#[test]
fn synth_writes_the_file_convert_writes_from_the_synthetic_folder() {
    let tmp = tempfile::tempdir().expect("test step");
    let dir = synth(tmp.path(), "tiny-gva");
    let a = tmp.path().join("a.gguf");
    let b = tmp.path().join("b.gguf");
    convert(&dir, &a, "q8_0", &[]);
    ok(&[
        os("synth"),
        os("--preset"),
        os("tiny-gva"),
        os("--format"),
        os("q8_0"),
        os("--out"),
        b.as_os_str(),
    ]);
    assert!(std::fs::read(&a).expect("test step") == std::fs::read(&b).expect("test step"));
}

/// `R·x` for one row: signs, then the dense Sylvester Hadamard product per 1024-block, / 32.
fn rotate_dense(x: &[f32], signs: &[f32]) -> Vec<f64> {
    let mut out = vec![0f64; x.len()];
    for (b, blk) in out.chunks_mut(1024).enumerate() {
        for (r, o) in blk.iter_mut().enumerate() {
            let mut acc = 0f64;
            for c in 0..1024 {
                let v = f64::from(x[b * 1024 + c]) * f64::from(signs[b * 1024 + c]);
                acc += if (r & c).count_ones() % 2 == 0 { v } else { -v };
            }
            *o = acc / 32.0;
        }
    }
    out
}

/// Checks one decoded ternary row against the ternary quantisation of `R·w` (per 128 values:
/// the scale is max|v| rounded to f16, each value the nearest of −d, 0, +d in units of it).
fn check_ternary_row(name: &str, decoded: &[f32], want: &[f64]) {
    for (b, (ys, vs)) in decoded.chunks(128).zip(want.chunks(128)).enumerate() {
        let amax = vs.iter().fold(0f64, |m, v| m.max(v.abs()));
        let d = ys.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            (f64::from(d) - amax).abs() <= amax * 1e-3,
            "{name} block {b}: scale {d} for max |R·w| {amax}"
        );
        for (j, (&y, &v)) in ys.iter().zip(vs).enumerate() {
            let t = v / amax;
            if (t.abs() - 0.5).abs() < 1e-4 {
                continue; // a tie a float rounding may put either way
            }
            assert_eq!(y, t.round() as f32 * d, "{name} block {b} value {j}");
        }
    }
}

fn decode_row(file: &Gguf, name: &str, row: usize) -> Vec<f32> {
    let t = file
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    let cols = t.ne[0] as usize;
    let rb = cols / t.ggml_type.block_len() * t.ggml_type.block_bytes();
    let bytes = &file.tensor_data(t)[row * rb..(row + 1) * rb];
    let mut out = vec![0f32; cols];
    dequantize(t.ggml_type, bytes, &mut out).expect("test step");
    out
}

fn source_row(ckpt: &Checkpoint, name: &str, row: usize) -> Vec<f32> {
    let t = ckpt.get(name).expect("test step");
    let cols = t.shape()[1];
    let mut out = vec![0f32; cols];
    t.read_f32(row * cols, &mut out);
    out
}

#[test]
fn ternary_packs_hold_the_rotated_quantised_weights() {
    let tmp = tempfile::tempdir().expect("test step");
    let dir = synth(tmp.path(), "tiny-ternary");
    let ckpt = Checkpoint::open_dir(&dir).expect("test step");
    let pq = tmp.path().join("t.pq2_0.gguf");
    let pt = tmp.path().join("t.ptq1_0.gguf");
    convert(&dir, &pq, "pq2_0", &["--seed", "5"]);
    convert(&dir, &pt, "ptq1_0", &["--seed", "5"]);
    let file = Gguf::open(&pq).expect("test step");
    let meta = HadamardMeta::from_gguf(&file)
        .expect("test step")
        .expect("rotation metadata");
    assert_eq!(meta.signs.keys().copied().collect::<Vec<_>>(), vec![1024]);
    assert!(meta.gdn_v_grouped);
    assert_eq!(
        meta.inverse_weight_names.iter().collect::<Vec<_>>(),
        vec!["token_embd.weight"]
    );
    let signs = meta.signs_for(1024).expect("test step");
    let negative = signs.iter().filter(|&&s| s < 0.0).count();
    assert!((400..624).contains(&negative), "{negative} negative signs");
    for t in file.tensors() {
        let ternary = t.ggml_type == GgmlType::PQ2_0;
        assert_eq!(
            ternary,
            meta.weight_names.contains(&t.name) || t.name == "token_embd.weight",
            "{}: every ternary tensor is rotated and nothing else",
            t.name
        );
        let want = if ternary {
            GgmlType::PQ2_0
        } else if t.name.ends_with("ssm_alpha.weight") || t.name.ends_with("ssm_beta.weight") {
            GgmlType::BF16
        } else {
            GgmlType::F32
        };
        assert_eq!(t.ggml_type, want, "{}", t.name);
    }
    // 2 key heads, 4 value heads of 256: tiled position j·2 + k holds grouped head k·2 + j, so
    // output value head 1 (j 0, k 1) is source head 2. attn_qkv's V rows start after 2·2·128.
    let base = "model.layers.0.linear_attn.";
    for (gguf_name, src, out_row, src_row) in [
        (
            "token_embd.weight",
            "model.embed_tokens.weight".to_string(),
            17,
            17,
        ),
        ("output.weight", "lm_head.weight".to_string(), 300, 300),
        (
            "blk.0.attn_qkv.weight",
            format!("{base}in_proj_qkv.weight"),
            3,
            3,
        ),
        (
            "blk.0.attn_qkv.weight",
            format!("{base}in_proj_qkv.weight"),
            512 + 256 + 7,
            512 + 512 + 7,
        ),
        (
            "blk.0.attn_gate.weight",
            format!("{base}in_proj_z.weight"),
            256 + 1,
            512 + 1,
        ),
        // ssm_out's columns stay grouped: row r is the source row, columns in source order.
        (
            "blk.0.ssm_out.weight",
            format!("{base}out_proj.weight"),
            5,
            5,
        ),
        (
            "blk.3.attn_output.weight",
            "model.layers.3.self_attn.o_proj.weight".into(),
            9,
            9,
        ),
        (
            "blk.1.ffn_down.weight",
            "model.layers.1.mlp.down_proj.weight".into(),
            1000,
            1000,
        ),
    ] {
        let want = rotate_dense(&source_row(&ckpt, &src, src_row), signs);
        check_ternary_row(gguf_name, &decode_row(&file, gguf_name, out_row), &want);
    }
    // The value-head order of the small tensors: ssm_alpha row 1 is source row 2, ssm_a[1] is
    // -exp(A_log[2]).
    let alpha = decode_row(&file, "blk.0.ssm_alpha.weight", 1);
    let src = source_row(&ckpt, &format!("{base}in_proj_a.weight"), 2);
    for (a, s) in alpha.iter().zip(&src) {
        assert!((a - s).abs() <= s.abs() / 128.0, "ssm_alpha: {a} vs {s}");
    }
    let a = decode_row(&file, "blk.0.ssm_a", 0);
    let a_log = ckpt
        .get(&format!("{base}A_log"))
        .expect("test step")
        .to_f32_vec();
    let tiled = [0, 2, 1, 3];
    for (i, &s) in tiled.iter().enumerate() {
        assert_eq!(a[i], (-f64::from(a_log[s]).exp()) as f32, "ssm_a[{i}]");
    }
    // Norm gains are stored as w + 1; linear_attn.norm as is.
    let g = decode_row(&file, "blk.0.attn_norm.weight", 0);
    let w = ckpt
        .get("model.layers.0.input_layernorm.weight")
        .expect("test step")
        .to_f32_vec();
    assert_eq!(g, w.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    let n = decode_row(&file, "blk.0.ssm_norm.weight", 0);
    assert_eq!(
        n,
        ckpt.get(&format!("{base}norm.weight"))
            .expect("test step")
            .to_f32_vec()
    );

    // PTQ1_0 holds the same values, and the same signs for the same seed.
    let file_t = Gguf::open(&pt).expect("test step");
    assert_eq!(
        HadamardMeta::from_gguf(&file_t)
            .expect("test step")
            .expect("test step"),
        meta
    );
    for t in file.tensors() {
        let u = file_t.tensor(&t.name).expect("test step");
        if t.ggml_type == GgmlType::PQ2_0 {
            assert_eq!(u.ggml_type, GgmlType::PTQ1_0);
            for row in [0, t.ne[1] as usize - 1] {
                assert_eq!(
                    decode_row(&file, &t.name, row),
                    decode_row(&file_t, &t.name, row)
                );
            }
        }
    }
    // Another seed, other signs.
    let other = tmp.path().join("s6.gguf");
    convert(&dir, &other, "pq2_0", &["--seed", "6"]);
    let m6 = HadamardMeta::from_gguf(&Gguf::open(&other).expect("test step"))
        .expect("test step")
        .expect("test step");
    assert_ne!(m6.signs, meta.signs);
}

#[test]
fn info_describes_a_gguf_file() {
    let tmp = tempfile::tempdir().expect("test step");
    let pack = tmp.path().join("p.gguf");
    ok(&[
        os("synth"),
        os("--preset"),
        os("tiny-ternary"),
        os("--format"),
        os("pq2_0"),
        os("--out"),
        pack.as_os_str(),
    ]);
    let text = String::from_utf8(ok(&[os("info"), pack.as_os_str()]).stdout).expect("test step");
    for want in [
        "architecture  qwen35",
        "block_count",
        "PQ2_0",
        "2.125",
        "rotation  blockwise Hadamard",
        "signs for width 1024",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
    let j: serde_json::Value =
        serde_json::from_slice(&ok(&[os("info"), pack.as_os_str(), os("--json")]).stdout)
            .expect("test step");
    assert_eq!(j["architecture"], "qwen35");
    assert_eq!(j["types"]["PQ2_0"]["bits_per_weight"], 2.125);
    assert_eq!(j["hparams"]["qwen35.embedding_length"], 1024.0);
    assert_eq!(j["rotation"]["sign_widths"], serde_json::json!([1024]));
    assert_eq!(j["rotation"]["gdn_v_grouped"], true);
    let tensors = j["tensors"].as_u64().expect("test step");
    let by_type: u64 = j["types"]
        .as_object()
        .expect("test step")
        .values()
        .map(|t| t["tensors"].as_u64().expect("test step"))
        .sum();
    assert_eq!(tensors, by_type);

    // The synthetic pack's blocks hold codes 0..2 only and finite, nonzero scales.
    let file = Gguf::open(&pack).expect("test step");
    let t = file.tensor("blk.0.ffn_up.weight").expect("test step");
    for block in file.tensor_data(t).chunks(34).take(200) {
        assert!(block[2..]
            .iter()
            .all(|b| (0..4).all(|i| (b >> (2 * i)) & 3 != 3)));
        let mut d = [0f32; 128];
        dequantize(GgmlType::PQ2_0, block, &mut d).expect("test step");
        assert!(d.iter().any(|v| *v != 0.0));
    }
}

#[test]
fn bad_conversions_are_refused_clearly() {
    let tmp = tempfile::tempdir().expect("test step");
    let gva = synth(tmp.path(), "tiny-gva");
    let out = tmp.path().join("x.gguf");
    let err = |args: &[&std::ffi::OsStr]| {
        let o = run(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = err(&[
        os("convert"),
        os("--model"),
        gva.as_os_str(),
        os("--out"),
        out.as_os_str(),
        os("--type"),
        os("pq2_0"),
    ]);
    assert!(e.contains("multiples of 1024"), "{e}");
    assert!(!out.exists() && !tmp.path().join("x.gguf.part").exists());
    let e = err(&[
        os("convert"),
        os("--model"),
        gva.as_os_str(),
        os("--out"),
        out.as_os_str(),
        os("--type"),
        os("q4"),
    ]);
    assert!(e.contains("f16, bf16, q8_0, pq2_0 or ptq1_0"), "{e}");
    let e = err(&[
        os("convert"),
        os("--model"),
        gva.as_os_str(),
        os("--out"),
        tmp.path().as_os_str(),
        os("--type"),
        os("f16"),
    ]);
    assert!(e.contains("is a folder"), "{e}");
    let first = synth(tmp.path(), "tiny-attn-first");
    let e = err(&[
        os("convert"),
        os("--model"),
        first.as_os_str(),
        os("--out"),
        out.as_os_str(),
        os("--type"),
        os("f16"),
    ]);
    assert!(e.contains("every N-th layer"), "{e}");
    let e = err(&[os("info"), gva.join("config.json").as_os_str()]);
    assert!(e.contains("config.json"), "{e}");
}

//! Bad input is an error with a message, never a panic.

mod common;

use onepass_model::Model;

fn err(dir: &std::path::Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &std::path::Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(&p, v.to_string()).expect("write");
}

#[test]
fn token_ids_beyond_vocab_empty_input_and_long_sequences() {
    let (_d, m) = common::load("tiny-gva");
    let mut st = m.new_state();
    let e = m.forward(&mut st, &[1, 320]).expect_err("id").to_string();
    assert!(e.contains("token id 320") && e.contains("0..320"), "{e}");
    let e = m.forward(&mut st, &[]).expect_err("empty").to_string();
    assert!(e.contains("empty"), "{e}");
    let long = vec![1u32; 4097];
    let e = m.forward(&mut st, &long).expect_err("long").to_string();
    assert!(e.contains("max_position_embeddings 4096"), "{e}");
    // The failed calls left the state untouched.
    assert_eq!(st.position(), 0);
    let e = m
        .logits_rows(&vec![0.0; m.hidden_size()], &[400])
        .expect_err("row")
        .to_string();
    assert!(e.contains("row 400"), "{e}");
}

#[test]
fn missing_config_and_bad_json() {
    let d = common::synth_dir("tiny-gva");
    std::fs::write(d.path().join("config.json"), "{not json").expect("write");
    assert!(err(d.path()).contains("invalid JSON"));
    std::fs::remove_file(d.path().join("config.json")).expect("rm");
    assert!(err(d.path()).contains("config.json"));
}

/// A config its weights do not match: the error names the model type, or the tensor at fault.
#[test]
fn a_config_the_weights_do_not_match_is_named() {
    let cases: [(&str, &str, serde_json::Value, &[&str]); 4] = [
        ("tiny-gva", "model_type", "mamba".into(), &["\"mamba\""]),
        (
            "tiny-gva",
            "intermediate_size",
            100.into(),
            &["model.layers.0.mlp.gate_proj.weight", "[160, 64]"],
        ),
        // A tied checkpoint has no lm_head; declaring it untied must name the missing tensor.
        (
            "tiny-attn-first",
            "tie_word_embeddings",
            false.into(),
            &["missing tensor lm_head.weight"],
        ),
        // Declaring an untied checkpoint tied leaves its lm_head.weight unbound.
        (
            "tiny-gva",
            "tie_word_embeddings",
            true.into(),
            &["unexpected tensor lm_head.weight"],
        ),
    ];
    for (preset, key, value, says) in cases {
        let d = common::synth_dir(preset);
        edit_config(d.path(), |v| v[key] = value);
        let e = err(d.path());
        for want in says {
            assert!(
                e.contains(want),
                "{preset}, {key}: {e:?} does not say {want:?}"
            );
        }
    }
}

#[test]
fn truncated_weights_are_an_error() {
    let d = common::synth_dir("tiny-gva");
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).expect("read");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).expect("truncate");
    let e = err(d.path());
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn unreadable_folder_is_an_error() {
    let e = err(std::path::Path::new("/nonexistent/onepass-model"));
    assert!(e.contains("config.json"), "{e}");
}

//! Bad input gives typed errors, never panics.

mod common;

use onepass_tokenizer::{
    synthetic_tokenizer_config_json, synthetic_tokenizer_json, Tokenizer, TokenizerError,
};

fn folder(name: &str, tokenizer_json: Option<&str>, config: Option<&str>) -> std::path::PathBuf {
    let dir = common::scratch_dir(name);
    if let Some(t) = tokenizer_json {
        std::fs::write(dir.join("tokenizer.json"), t).expect("write");
    }
    if let Some(c) = config {
        std::fs::write(dir.join("tokenizer_config.json"), c).expect("write");
    }
    dir
}

#[test]
fn missing_tokenizer_json() {
    let dir = folder("missing", None, None);
    let err = Tokenizer::from_dir(&dir, None).err();
    match err {
        Some(e @ TokenizerError::Read { .. }) => {
            assert!(e.to_string().contains("tokenizer.json"), "{e}")
        }
        other => panic!("expected Read, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn garbled_tokenizer_json() {
    for (name, text) in [
        ("garbled-1", "{not json"),
        ("garbled-2", "{\"model\": 3}"),
        ("garbled-3", ""),
        ("garbled-4", "[]"),
    ] {
        let dir = folder(name, Some(text), None);
        let err = Tokenizer::from_dir(&dir, Some("qwen3_5")).err();
        assert!(
            matches!(err, Some(TokenizerError::Load { .. })),
            "{name}: {err:?}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    let cut = synthetic_tokenizer_json(600).expect("json");
    let err = Tokenizer::from_json_str(&cut[..cut.len() / 2], None).err();
    assert!(matches!(err, Some(TokenizerError::Load { .. })), "{err:?}");
}

#[test]
fn bad_tokenizer_config() {
    let json = synthetic_tokenizer_json(600).expect("json");
    let dir = folder("bad-config-1", Some(&json), Some("{oops"));
    assert!(matches!(
        Tokenizer::from_dir(&dir, None).err(),
        Some(TokenizerError::Config { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();

    for (name, config, key) in [
        ("bad-config-2", r#"{"eos_token": "<|nope|>"}"#, "eos_token"),
        ("bad-config-3", r#"{"pad_token": 7}"#, "pad_token"),
        (
            "bad-config-4",
            r#"{"chat_template": {"a": 1}}"#,
            "chat_template",
        ),
        ("bad-config-5", r#"[1, 2]"#, "<root>"),
    ] {
        let dir = folder(name, Some(&json), Some(config));
        match Tokenizer::from_dir(&dir, None).err() {
            Some(TokenizerError::ConfigValue { key: k, .. }) => assert_eq!(k, key, "{name}"),
            other => panic!("{name}: expected ConfigValue, got {other:?}"),
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn config_variants() {
    let json = synthetic_tokenizer_json(600).expect("json");
    // AddedToken-object form of eos_token, list-of-named-templates chat_template.
    let config = r#"{"eos_token": {"content": "<|im_end|>"}, "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#;
    let tok = Tokenizer::from_json_strs(&json, config, None).expect("load");
    assert_eq!(tok.eos_id(), Some(597));
    assert_eq!(tok.pad_id(), None);
    assert_eq!(tok.chat_template(), Some("D"));

    // chat_template.jinja next to the config wins over the key.
    let dir = folder(
        "jinja",
        Some(&json),
        Some(&synthetic_tokenizer_config_json()),
    );
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").expect("write");
    let tok = Tokenizer::from_dir(&dir, None).expect("load");
    assert_eq!(tok.chat_template(), Some("{{ messages }}"));
    std::fs::remove_dir_all(&dir).ok();

    // No config at all: no eos/pad/template.
    let tok = Tokenizer::from_json_str(&json, None).expect("load");
    assert_eq!(
        (tok.eos_id(), tok.pad_id(), tok.chat_template()),
        (None, None, None)
    );
}

#[test]
fn decode_unknown_id() {
    let tok = Tokenizer::from_json_str(&synthetic_tokenizer_json(600).expect("json"), None)
        .expect("load");
    let err = tok.decode(&[1, 2, 600]).err();
    assert!(
        matches!(
            err,
            Some(TokenizerError::UnknownId {
                id: 600,
                index: 2,
                vocab_size: 600
            })
        ),
        "{err:?}"
    );
}

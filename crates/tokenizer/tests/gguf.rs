//! The tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata against the tokenizer.json
//! the vocabulary came from: same ids on the 7,205 golden strings, same special ids and template.
//!
//! The GGUF is made here, in memory, from testdata/qwen3_5-tokenizer the way llama.cpp's converter
//! writes a byte-level BPE vocabulary (the 14 MB file is not committed). It is byte-identical to
//! what `tools/oracle/gguf_fixtures.py --tokenizer` writes with llama.cpp's own writer (PyPI
//! `gguf` 0.19.0): the test checks the sha256 recorded from that script.

mod common;

use std::sync::OnceLock;

use onepass_formats::gguf::{write_gguf, Gguf, GgufArray, GgufValue};
use onepass_tokenizer::{Tokenizer, TokenizerError};
use serde_json::Value;
use sha2::{Digest, Sha256};

use common::{qwen3_5, qwen3_5_dir, repo_root};

/// sha256 of `gguf_fixtures.py --tokenizer testdata/qwen3_5-tokenizer/tokenizer.json --config
/// testdata/qwen3_5-tokenizer/tokenizer_config.json --vocab-size 248320 OUT` (gguf 0.19.0).
const GGUF_PY_SHA256: &str = "e789819da079bf11efd39f387eb854d9e2c4cf5b8c8b803a8f9481ad5855f687";
/// The model's embedding rows (ids beyond the tokenizer's 248,077 are `[PAD<id>]`, unused).
const VOCAB_ROWS: usize = 248_320;

/// The converter's metadata for a tokenizer.json (+ tokenizer_config.json): ids with no token
/// become `[PAD<id>]` of type 5 (unused), added tokens type 3 (control) when special else 4
/// (user-defined), the rest type 1 (normal); merges as "left right".
fn converter_metadata(json: &Value, config: &Value, rows: usize) -> Vec<(String, GgufValue)> {
    let mut by_id: Vec<Option<(String, i32)>> = vec![None; rows];
    for (token, id) in json["model"]["vocab"].as_object().expect("vocab") {
        by_id[id.as_u64().expect("id") as usize] = Some((token.clone(), 1));
    }
    for a in json["added_tokens"].as_array().expect("added") {
        let ty = if a["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        by_id[a["id"].as_u64().expect("id") as usize] =
            Some((a["content"].as_str().expect("content").to_string(), ty));
    }
    let (tokens, types): (Vec<String>, Vec<i32>) = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), 5)))
        .unzip();
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().expect("left"),
                pair[1].as_str().expect("right")
            ),
            other => panic!("merge {other}"),
        })
        .collect();
    let id_of = |key: &str| -> Option<u32> {
        let content = config.get(key)?.as_str()?;
        tokens.iter().position(|t| t == content).map(|i| i as u32)
    };
    let s = |v: &str| GgufValue::String(v.to_string());
    let mut meta = vec![
        ("general.architecture".to_string(), s("qwen35")),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("qwen35")),
    ];
    let bos = id_of("bos_token");
    let eos = id_of("eos_token");
    let pad = id_of("pad_token");
    meta.push((
        "tokenizer.ggml.tokens".into(),
        GgufValue::Array(GgufArray::String(tokens)),
    ));
    meta.push((
        "tokenizer.ggml.token_type".into(),
        GgufValue::Array(GgufArray::I32(types)),
    ));
    meta.push((
        "tokenizer.ggml.merges".into(),
        GgufValue::Array(GgufArray::String(merges)),
    ));
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", bos),
        ("tokenizer.ggml.eos_token_id", eos),
        ("tokenizer.ggml.padding_token_id", pad),
    ] {
        if let Some(id) = id {
            meta.push((key.into(), GgufValue::U32(id)));
        }
    }
    if let Some(t) = config.get("chat_template").and_then(Value::as_str) {
        meta.push(("tokenizer.chat_template".into(), s(t)));
    }
    meta
}

fn read_json(name: &str) -> Value {
    let path = qwen3_5_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

fn gguf_bytes(meta: &[(String, GgufValue)]) -> Vec<u8> {
    let mut out = Vec::new();
    write_gguf(&mut out, meta, &[]).expect("write");
    out
}

/// The Qwen3.5 tokenizer's GGUF (bytes) and the tokenizer built from it, once per test binary.
fn qwen3_5_gguf() -> &'static (Vec<u8>, Tokenizer) {
    static TOK: OnceLock<(Vec<u8>, Tokenizer)> = OnceLock::new();
    TOK.get_or_init(|| {
        let meta = converter_metadata(
            &read_json("tokenizer.json"),
            &read_json("tokenizer_config.json"),
            VOCAB_ROWS,
        );
        let bytes = gguf_bytes(&meta);
        let file = Gguf::from_bytes("qwen3_5-tokenizer.gguf", bytes.clone()).expect("parse");
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("from_gguf: {e}"));
        (bytes, tok)
    })
}

#[test]
fn the_test_gguf_is_the_one_llama_cpp_writer_makes() {
    let digest = Sha256::digest(&qwen3_5_gguf().0);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, GGUF_PY_SHA256);
}

#[test]
fn same_ids_as_tokenizer_json_on_every_golden_string() {
    let from_gguf = &qwen3_5_gguf().1;
    let from_json = qwen3_5();
    assert!(
        from_gguf.has_fast_path(),
        "the GGUF pipeline is the exact Qwen3.5 one"
    );
    assert!(!from_gguf.regex_corrected());
    let text =
        std::fs::read_to_string(repo_root().join("tests/fixtures/tokenizer/tiktoken_ids.jsonl"))
            .expect("golden ids");
    let mut n = 0;
    let compat_gguf = from_gguf.transformers_compatible();
    let compat_json = from_json.transformers_compatible();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("jsonl");
        let s = v["text"].as_str().expect("text");
        let want: Vec<u32> = v["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|i| i.as_u64().expect("id") as u32)
            .collect();
        let got = from_gguf.encode(s).expect("encode");
        assert_eq!(got, want, "{s:?}");
        assert_eq!(got, from_json.encode(s).expect("encode"), "{s:?}");
        assert_eq!(
            from_gguf.encode_generic(s).expect("encode"),
            want,
            "generic {s:?}"
        );
        assert_eq!(
            compat_gguf.encode(s).expect("encode"),
            compat_json.encode(s).expect("encode"),
            "transformers view {s:?}"
        );
        assert_eq!(
            from_gguf.decode(&want).expect("decode"),
            from_json.decode(&want).expect("decode"),
            "decode {s:?}"
        );
        n += 1;
    }
    assert_eq!(n, 7205);
}

#[test]
fn same_vocabulary_special_ids_and_template() {
    let from_gguf = &qwen3_5_gguf().1;
    let from_json = qwen3_5();
    assert_eq!(from_gguf.vocab_size(), from_json.vocab_size());
    assert_eq!(from_gguf.vocab_size(), 248_077);
    assert_eq!(from_gguf.eos_id(), from_json.eos_id());
    assert_eq!(from_gguf.eos_id(), Some(248_044));
    assert_eq!(from_gguf.pad_id(), from_json.pad_id());
    assert_eq!(from_gguf.chat_template(), from_json.chat_template());
    for token in ["Ġthe", "<|im_start|>", "<think>", "<|audio_pad|>", "ĠĠ"] {
        assert_eq!(
            from_gguf.token_to_id(token),
            from_json.token_to_id(token),
            "{token}"
        );
    }
    // The padding rows of the embedding are not tokens.
    assert_eq!(from_gguf.token_to_id("[PAD248100]"), None);
    assert!(matches!(
        from_gguf.decode(&[248_100]),
        Err(TokenizerError::UnknownId { id: 248_100, .. })
    ));
    assert_eq!(
        from_gguf.label_table().expect("labels"),
        from_json.label_table().expect("labels")
    );
}

/// A tiny byte-level vocabulary: the 256 byte tokens, one merge, two control tokens, a pad row.
fn tiny() -> Vec<(String, GgufValue)> {
    let bytes = onepass_tokenizer::byte_to_unicode();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| bytes[b as usize].to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.push("ab".into());
    types.push(1);
    tokens.push("<|im_end|>".into());
    types.push(3);
    tokens.push("<tool>".into());
    types.push(4);
    tokens.push("[PAD259]".into());
    types.push(5);
    let s = |v: &str| GgufValue::String(v.to_string());
    vec![
        ("general.architecture".into(), s("qwen35")),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("qwen35")),
        (
            "tokenizer.ggml.tokens".into(),
            GgufValue::Array(GgufArray::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            GgufValue::Array(GgufArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            GgufValue::Array(GgufArray::String(vec!["a b".into()])),
        ),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(257)),
        (
            "tokenizer.ggml.padding_token_id".into(),
            GgufValue::U32(256),
        ),
        ("tokenizer.chat_template".into(), s("{{ messages }}")),
    ]
}

fn build(meta: &[(String, GgufValue)]) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_gguf(&Gguf::from_bytes("tiny.gguf", gguf_bytes(meta)).expect("parse"))
}

#[test]
fn a_tiny_vocabulary_builds_with_its_added_tokens() {
    let tok = build(&tiny()).expect("builds");
    assert_eq!(
        tok.encode("ab<|im_end|>a<tool>").expect("encode"),
        [256, 257, 97, 258]
    );
    assert_eq!(tok.eos_id(), Some(257));
    assert_eq!(tok.pad_id(), Some(256));
    assert_eq!(tok.chat_template(), Some("{{ messages }}"));
    assert_eq!(tok.vocab_size(), 259);
}

#[test]
fn refusals_name_the_key() {
    fn set(m: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
        m.iter_mut().find(|(k, _)| k == key).expect("key").1 = v;
    }
    type Edit = Box<dyn Fn(&mut Vec<(String, GgufValue)>)>;
    let cases: Vec<(&str, &str, Edit)> = vec![
        (
            "tokenizer.ggml.model",
            "\"llama\" is not supported",
            Box::new(|m| set(m, "tokenizer.ggml.model", GgufValue::String("llama".into()))),
        ),
        (
            "tokenizer.ggml.model",
            "is missing",
            Box::new(|m| m.retain(|(k, _)| k != "tokenizer.ggml.model")),
        ),
        (
            "tokenizer.ggml.pre",
            "\"llama-bpe\"",
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.pre",
                    GgufValue::String("llama-bpe".into()),
                )
            }),
        ),
        (
            "tokenizer.ggml.tokens",
            "expected a string array",
            Box::new(|m| set(m, "tokenizer.ggml.tokens", GgufValue::U32(1))),
        ),
        (
            "tokenizer.ggml.token_type",
            "entries for 260 tokens",
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.token_type",
                    GgufValue::Array(GgufArray::I32(vec![1; 3])),
                )
            }),
        ),
        (
            "tokenizer.ggml.token_type",
            "token type 9",
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.token_type",
                    GgufValue::Array(GgufArray::I32(vec![9; 260])),
                )
            }),
        ),
        (
            "tokenizer.ggml.merges",
            "merge 0",
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.merges",
                    GgufValue::Array(GgufArray::String(vec!["ab".into()])),
                )
            }),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            "id 259",
            Box::new(|m| set(m, "tokenizer.ggml.eos_token_id", GgufValue::U32(259))),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            "id 5000",
            Box::new(|m| set(m, "tokenizer.ggml.eos_token_id", GgufValue::U32(5000))),
        ),
        (
            "tokenizer.ggml.eos_token_id",
            "expected an integer",
            Box::new(|m| set(m, "tokenizer.ggml.eos_token_id", GgufValue::F32(1.0))),
        ),
        (
            "tokenizer.ggml.bos_token_id",
            "id -1",
            Box::new(|m| m.push(("tokenizer.ggml.bos_token_id".into(), GgufValue::I32(-1)))),
        ),
        (
            "tokenizer.chat_template",
            "expected a string",
            Box::new(|m| set(m, "tokenizer.chat_template", GgufValue::Bool(true))),
        ),
        (
            "tokenizer.ggml.padding_token_id",
            "id 4294967295",
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.padding_token_id",
                    GgufValue::U32(u32::MAX),
                )
            }),
        ),
    ];
    for (key, why, edit) in cases {
        let mut meta = tiny();
        edit(&mut meta);
        let err = build(&meta).expect_err(key);
        let msg = err.to_string();
        assert!(
            matches!(&err, TokenizerError::GgufValue { key: k, .. } if k == key),
            "{key}: {msg}"
        );
        assert!(msg.contains(why), "{key}: {msg:?} does not say {why:?}");
    }
}

/// The converted model fixture (tests/fixtures/gguf/qwen35, written by llama.cpp's own writer
/// from the synthetic tokenizer): its tokenizer gives the synthetic tokenizer.json's ids.
#[test]
fn the_converted_model_fixture_tokenizes_as_its_tokenizer_json() {
    let path = repo_root().join("tests/fixtures/gguf/qwen35/tiny-gva.q8_0.gguf");
    let from_gguf = Tokenizer::from_gguf(&Gguf::open(&path).expect("open")).expect("builds");
    let json = onepass_tokenizer::synthetic_tokenizer_json(320).expect("json");
    let config = onepass_tokenizer::synthetic_tokenizer_config_json();
    let from_json =
        Tokenizer::from_json_strs(&json, &config, Some("qwen3_5_text")).expect("builds");
    for text in [
        "hello world",
        "<|im_start|>user\nthe cat sat<|im_end|>",
        "ünïcode ✓ 123 and\ttabs  ",
        "",
    ] {
        assert_eq!(
            from_gguf.encode(text).expect("encode"),
            from_json.encode(text).expect("encode"),
            "{text:?}"
        );
    }
    assert_eq!(from_gguf.eos_id(), from_json.eos_id());
    assert_eq!(from_gguf.pad_id(), from_json.pad_id());
    assert_eq!(from_gguf.chat_template(), from_json.chat_template());
}

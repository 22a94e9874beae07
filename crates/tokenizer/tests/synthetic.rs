//! The synthetic tokenizer for tiny test checkpoints: loads, round-trips, has a label table.

mod common;

use onepass_tokenizer::{
    synthetic_tokenizer_config_json, synthetic_tokenizer_json, Tokenizer, TokenizerError,
    MAX_OPTIONS, QWEN3_CHAT_TEMPLATE,
};

fn synthetic(vocab_size: usize) -> Tokenizer {
    let json = synthetic_tokenizer_json(vocab_size).expect("synthetic json");
    Tokenizer::from_json_strs(&json, &synthetic_tokenizer_config_json(), None)
        .expect("load synthetic")
}

#[test]
fn loads_with_specials_in_the_last_ids() {
    let tok = synthetic(1024);
    assert_eq!(tok.vocab_size(), 1024);
    assert!(!tok.regex_corrected());
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(1019));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1020));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(1021));
    assert_eq!(tok.token_to_id("<think>"), Some(1022));
    assert_eq!(tok.token_to_id("</think>"), Some(1023));
    assert_eq!((tok.eos_id(), tok.pad_id()), (Some(1019), Some(1019)));
    assert_eq!(tok.chat_template(), Some(QWEN3_CHAT_TEMPLATE));
    // Bytes are ids 0..256 (id = byte value); merges follow.
    assert_eq!(tok.encode("A\n(").expect("encode"), [65, 10, 40]);
    assert_eq!(tok.encode("AA").expect("encode"), [256]);
    assert_eq!(
        tok.encode("a<|im_start|>b<think>c").expect("encode"),
        [97, 1020, 98, 1022, 99]
    );
}

#[test]
fn round_trips_text() {
    let tok = synthetic(1024);
    for text in [
        "The cat sat on the mat, and then it ran.\n\n",
        "<|im_start|>user\nWhich option?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "नमस्ते दुनिया 👩🏽‍💻 ÀÉÎ 12345 \t\r\n",
        "",
    ] {
        let ids = tok.encode(text).expect("encode");
        assert!(ids.iter().all(|&id| (id as usize) < 1024));
        assert_eq!(tok.decode(&ids).expect("decode"), text);
    }
    // Merges are used: English words are fewer ids than bytes.
    assert!(tok.encode(" the thing").expect("encode").len() < " the thing".len());
}

#[test]
fn label_table_has_255_entries() {
    for vocab_size in [490, 1024, 4096, 19_000] {
        let tok = synthetic(vocab_size);
        let table = tok.label_table().expect("label table");
        assert_eq!(table.ids.len(), MAX_OPTIONS, "vocab {vocab_size}");
        assert_eq!(table.open_ids, [10, 40]);
        assert_eq!(&table.ids[..26], (65..91).collect::<Vec<u32>>().as_slice());
        assert_eq!(table.label(26), Some("AA"));
        assert_eq!(table.label(254), Some("IU"));
    }
    let small = synthetic(489);
    let err = small.label_table().err();
    assert!(
        matches!(
            err,
            Some(TokenizerError::TooFewLabels {
                found: 254,
                needed: 255
            })
        ),
        "{err:?}"
    );
}

#[test]
fn deterministic_and_bounded() {
    assert_eq!(
        synthetic_tokenizer_json(777).ok(),
        synthetic_tokenizer_json(777).ok()
    );
    assert!(matches!(
        synthetic_tokenizer_json(100),
        Err(TokenizerError::SyntheticVocabSize {
            vocab_size: 100,
            ..
        })
    ));
}

#[test]
fn loads_from_a_folder() {
    let dir = common::scratch_dir("synthetic");
    std::fs::write(
        dir.join("tokenizer.json"),
        synthetic_tokenizer_json(600).expect("json"),
    )
    .expect("write");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        synthetic_tokenizer_config_json(),
    )
    .expect("write");
    let tok = Tokenizer::from_dir(&dir, Some("qwen3_5_text")).expect("load");
    assert!(!tok.regex_corrected());
    assert_eq!(tok.vocab_size(), 600);
    assert_eq!(tok.eos_id(), Some(595));
    std::fs::remove_dir_all(&dir).ok();
}

/// transformers' Qwen3_5Tokenizer rebuilds the BPE model without `ignore_merges`; the synthetic
/// vocabulary is built so that this changes nothing (every entry is reachable by merges), keeping
/// tiny-checkpoint parity with the Python oracle.
#[test]
fn independent_of_ignore_merges() {
    let json = synthetic_tokenizer_json(4096).expect("json");
    let mut doc: serde_json::Value = serde_json::from_str(&json).expect("parse");
    doc["model"]["ignore_merges"] = serde_json::Value::Bool(false);
    let plain = Tokenizer::from_json_str(&doc.to_string(), None).expect("load");
    let tok = Tokenizer::from_json_str(&json, None).expect("load");
    let vocab = doc["model"]["vocab"].as_object().expect("vocab");
    let b2u = onepass_tokenizer::byte_to_unicode();
    for entry in vocab.keys() {
        // Back from the byte-level strings to text.
        let bytes: Vec<u8> = entry
            .chars()
            .map(|c| b2u.iter().position(|&x| x == c).expect("byte char") as u8)
            .collect();
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        assert_eq!(
            tok.encode(&text).expect("encode"),
            plain.encode(&text).expect("encode"),
            "{text:?}"
        );
    }
    let text = "The theme of the thing: AB, CD and (ZZ) — I'll see it's there.\n\nanswer";
    assert_eq!(
        tok.encode(text).expect("encode"),
        plain.encode(text).expect("encode")
    );
}

//! The `tokenizer.json` that onepass builds itself (from a GGUF file's `tokenizer.ggml.*` metadata, and for
//! synthetic checkpoints): a byte-level BPE with NFC, no post-processor and merges ignored for whole-vocabulary words,
//! as Qwen3.5's own files are.

use serde_json::{json, Map, Value};

/// One `added_tokens` entry: matched whole, never normalised.
pub(crate) fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": special,
    })
}

/// The whole document (keys in the order of the Hub files).
pub(crate) fn byte_level_bpe(
    added: Vec<Value>,
    pre_tokenizer: Value,
    vocab: Map<String, Value>,
    merges: Vec<Value>,
) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": true,
            "vocab": vocab,
            "merges": merges,
        },
    })
}

//! The tokenizer of a GGUF file, from its `tokenizer.ggml.*` metadata.
//!
//! llama.cpp's converter stores a byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) as:
//! `tokens` (every id's string, ids without a token filled with `[PAD<id>]`), `token_type` per id
//! (1 normal, 3 control, 4 user-defined, 5 unused, ...), `merges` as `"left right"` strings in rank
//! order, `pre` naming the pre-tokenizer (`qwen35` for Qwen3.5, `qwen2` for Qwen2), the special
//! ids (`bos_token_id`, `eos_token_id`, `padding_token_id`) and `tokenizer.chat_template`.
//!
//! [`Tokenizer::from_gguf`] turns that back into the `tokenizer.json` pipeline the Qwen3.5 file
//! carries (NFC, the split regex named by `pre`, byte-level, BPE with `ignore_merges`; normal
//! tokens are the BPE vocabulary, control and user-defined tokens are added tokens matched in raw
//! text, unused ids are left out) and builds it with the same constructor as a folder's
//! `tokenizer.json`, so both give the same ids. The GGUF does not record `ignore_merges`; the
//! Qwen3.5 tokenizer.json sets it, and so does this reconstruction for both `qwen35` and `qwen2`.
//! BOS is checked but not used: onepass never adds BOS to encoded text.

use onepass_formats::gguf::{Gguf, GgufArray, GgufValue};
use serde_json::{json, Map, Value};

use crate::json_doc::{added_token, byte_level_bpe};
use crate::pretokenizer::{qwen3_5_pre_tokenizer_json, QWEN2_SPLIT_REGEX};
use crate::{Tokenizer, TokenizerError};

/// `token_type` values (llama.cpp's `llama_token_type`).
const NORMAL: i128 = 1;
const UNKNOWN: i128 = 2;
const CONTROL: i128 = 3;
const USER_DEFINED: i128 = 4;
const UNUSED: i128 = 5;
const BYTE: i128 = 6;

fn bad(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::GgufValue {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn strings<'a>(file: &'a Gguf, key: &str) -> Result<&'a [String], TokenizerError> {
    match file.get(key) {
        None => Err(bad(key, "is missing")),
        Some(GgufValue::Array(GgufArray::String(v))) => Ok(v),
        Some(v) => Err(bad(
            key,
            format!("expected a string array, found {}", v.type_name()),
        )),
    }
}

fn string<'a>(file: &'a Gguf, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(GgufValue::String(s)) => Ok(Some(s)),
        Some(v) => Err(bad(
            key,
            format!("expected a string, found {}", v.type_name()),
        )),
    }
}

impl Tokenizer {
    /// The tokenizer described by `file`'s `tokenizer.ggml.*` keys (see the module docs): the same
    /// ids as the `tokenizer.json` the vocabulary came from. Refuses, naming the key, a model other
    /// than `gpt2`, a pre-tokenizer other than `qwen35` / `qwen2`, token and type lists of different
    /// lengths, a malformed merge and a special id that is not a token.
    pub fn from_gguf(file: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = string(file, "tokenizer.ggml.model")?.ok_or_else(|| {
            bad(
                "tokenizer.ggml.model",
                "is missing; the file has no tokenizer",
            )
        })?;
        if model != "gpt2" {
            return Err(bad(
                "tokenizer.ggml.model",
                format!("{model:?} is not supported (onepass reads byte-level BPE, \"gpt2\"); put the model's tokenizer.json beside the file"),
            ));
        }
        let pre = string(file, "tokenizer.ggml.pre")?.unwrap_or("default");
        let pre_tokenizer = match pre {
            "qwen35" => qwen3_5_pre_tokenizer_json(),
            "qwen2" => {
                let mut p = qwen3_5_pre_tokenizer_json();
                p["pretokenizers"][0]["pattern"]["Regex"] = json!(QWEN2_SPLIT_REGEX);
                p
            }
            other => {
                return Err(bad(
                    "tokenizer.ggml.pre",
                    format!("pre-tokenizer {other:?} is not supported (onepass reads \"qwen35\" and \"qwen2\"); put the model's tokenizer.json beside the file"),
                ))
            }
        };

        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let types_key = "tokenizer.ggml.token_type";
        let types = match file.get(types_key) {
            None => vec![NORMAL; tokens.len()],
            Some(GgufValue::Array(a)) => a.to_i128_vec().ok_or_else(|| {
                bad(
                    types_key,
                    format!(
                        "expected an integer array, found array[{}]",
                        a.element_type_name()
                    ),
                )
            })?,
            Some(v) => {
                return Err(bad(
                    types_key,
                    format!("expected an integer array, found {}", v.type_name()),
                ))
            }
        };
        if types.len() != tokens.len() {
            return Err(bad(
                types_key,
                format!("has {} entries for {} tokens", types.len(), tokens.len()),
            ));
        }

        let mut vocab = Map::new();
        let mut added = Vec::new();
        let mut usable = vec![false; tokens.len()];
        for (id, (token, &ty)) in tokens.iter().zip(&types).enumerate() {
            match ty {
                NORMAL | UNKNOWN | BYTE => {
                    if vocab.insert(token.clone(), json!(id)).is_some() {
                        return Err(bad(
                            "tokenizer.ggml.tokens",
                            format!("token {token:?} appears twice (again at id {id})"),
                        ));
                    }
                }
                CONTROL | USER_DEFINED => added.push(added_token(id, token, ty == CONTROL)),
                UNUSED => continue,
                other => {
                    return Err(bad(
                        types_key,
                        format!("id {id} has token type {other} (llama.cpp defines 1 to 6)"),
                    ))
                }
            }
            usable[id] = true;
        }

        let merges_key = "tokenizer.ggml.merges";
        let mut merges = Vec::new();
        for (rank, merge) in strings(file, merges_key)?.iter().enumerate() {
            let Some((left, right)) = merge.split_once(' ') else {
                return Err(bad(
                    merges_key,
                    format!("merge {rank} ({merge:?}) is not two tokens separated by a space"),
                ));
            };
            merges.push(json!([left, right]));
        }

        let special = |key: &str| -> Result<Option<String>, TokenizerError> {
            let Some(v) = file.get(key) else {
                return Ok(None);
            };
            let id = v
                .as_i128()
                .ok_or_else(|| bad(key, format!("expected an integer, found {}", v.type_name())))?;
            match usize::try_from(id) {
                Ok(i) if i < tokens.len() && usable[i] => Ok(Some(tokens[i].clone())),
                _ => Err(bad(
                    key,
                    format!(
                        "id {id} is not a token of the vocabulary ({} ids)",
                        tokens.len()
                    ),
                )),
            }
        };
        let _bos = special("tokenizer.ggml.bos_token_id")?;
        let mut config = Map::new();
        if let Some(eos) = special("tokenizer.ggml.eos_token_id")? {
            config.insert("eos_token".into(), json!(eos));
        }
        if let Some(pad) = special("tokenizer.ggml.padding_token_id")? {
            config.insert("pad_token".into(), json!(pad));
        }
        if let Some(template) = string(file, "tokenizer.chat_template")? {
            config.insert("chat_template".into(), json!(template));
        }

        let tokenizer_json = byte_level_bpe(added, pre_tokenizer, vocab, merges);
        let model_type = match string(file, "general.architecture")? {
            Some("qwen35") => Some("qwen3_5"),
            Some("qwen35moe") => Some("qwen3_5_moe"),
            _ => None,
        };
        let origin = format!("{} (tokenizer.ggml.*)", file.path().display());
        Tokenizer::build(
            &tokenizer_json.to_string(),
            &origin,
            Some(&Value::Object(config)),
            None,
            model_type,
        )
    }
}

//! `tokenizer.ggml.*` metadata from a folder's `tokenizer.json` and `tokenizer_config.json`, the
//! way llama.cpp's converter writes a byte-level BPE vocabulary: every id up to the model's vocab
//! size gets a token (ids the tokenizer does not name become `[PAD<id>]`, type unused), added
//! tokens are control tokens when marked special or shaped like `<|…|>`, else user-defined, the
//! merges are `"left right"` strings in rank order, and the special ids come from
//! `tokenizer_config.json` (`bos_token`, `eos_token`, `pad_token`, as strings or `{content}`),
//! falling back to `config.json`'s `*_token_id`.

use std::collections::HashMap;

use onepass_formats::{GgufArray, GgufValue};
use serde_json::Value;

use crate::ModelError;

/// `token_type` values (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The tokenizer files of a model folder, already parsed.
#[derive(Clone, Debug)]
pub struct TokenizerFiles {
    pub tokenizer_json: Value,
    /// `tokenizer_config.json` (an empty object when the folder has none).
    pub tokenizer_config: Value,
    /// `chat_template.jinja`, used when `tokenizer_config.json` has no `chat_template`.
    pub chat_template_file: Option<String>,
}

impl TokenizerFiles {
    /// Reads `tokenizer.json` (required), `tokenizer_config.json` and `chat_template.jinja`.
    pub fn from_dir(dir: &std::path::Path) -> Result<TokenizerFiles, ModelError> {
        let read_json = |name: &str, required: bool| -> Result<Value, ModelError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text).map_err(|e| {
                    ModelError::Input(format!("{}: invalid JSON: {e}", path.display()))
                }),
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                    Ok(Value::Object(Default::default()))
                }
                Err(e) => Err(ModelError::Input(format!(
                    "cannot read {}: {e} (a GGUF file carries the tokenizer, so the folder needs one)",
                    path.display()
                ))),
            }
        };
        Ok(TokenizerFiles {
            tokenizer_json: read_json("tokenizer.json", true)?,
            tokenizer_config: read_json("tokenizer_config.json", false)?,
            chat_template_file: std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
        })
    }
}

fn looks_special(token: &str) -> bool {
    matches!(token, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (token.starts_with("<|") && token.ends_with("|>"))
        || (token.starts_with("<｜") && token.ends_with("｜>"))
        || (token.starts_with("<unused") && token.ends_with('>'))
}

/// The `tokenizer.*` metadata for a model of `vocab_size` ids; `config` is the model's
/// `config.json` (for special ids the tokenizer config does not name).
pub fn tokenizer_metadata(
    files: &TokenizerFiles,
    config: &Value,
    vocab_size: usize,
) -> Result<Vec<(String, GgufValue)>, ModelError> {
    let bad = |why: String| ModelError::Input(format!("tokenizer.json: {why}"));
    let tok = &files.tokenizer_json;
    let model = tok
        .get("model")
        .ok_or_else(|| bad("has no \"model\"".into()))?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "BPE" {
        return Err(bad(format!(
            "model type {kind:?}: only byte-level BPE vocabularies (Qwen3.5's) can be written to GGUF"
        )));
    }
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    let mut by_id: HashMap<usize, String> = HashMap::new();
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("vocab entry {t:?} has no integer id")))?;
        by_id.insert(id as usize, t.clone());
    }
    let mut added: HashMap<usize, bool> = HashMap::new();
    for a in tok
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let (Some(id), Some(content)) = (
            a.get("id").and_then(Value::as_u64),
            a.get("content").and_then(Value::as_str),
        ) else {
            return Err(bad("an added token has no id or content".into()));
        };
        by_id.insert(id as usize, content.to_string());
        added.insert(
            id as usize,
            a.get("special").and_then(Value::as_bool).unwrap_or(false),
        );
    }
    if let Some(max) = by_id.keys().max() {
        if *max >= vocab_size {
            return Err(bad(format!(
                "token id {max} is outside the model's vocabulary of {vocab_size}"
            )));
        }
    }
    let mut tokens = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for i in 0..vocab_size {
        match (by_id.get(&i), added.get(&i)) {
            (None, _) => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            (Some(t), Some(&special)) => {
                types.push(if special || looks_special(t) {
                    CONTROL
                } else {
                    USER_DEFINED
                });
                tokens.push(t.clone());
            }
            (Some(t), None) => {
                tokens.push(t.clone());
                types.push(NORMAL);
            }
        }
    }
    let mut merges = Vec::new();
    for m in model
        .get("merges")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        match m {
            Value::String(s) => merges.push(s.clone()),
            Value::Array(pair) if pair.len() == 2 => match (pair[0].as_str(), pair[1].as_str()) {
                (Some(l), Some(r)) => merges.push(format!("{l} {r}")),
                _ => return Err(bad("a merge is not two strings".into())),
            },
            _ => return Err(bad("a merge is neither a string nor a pair".into())),
        }
    }

    let s = |v: &str| GgufValue::String(v.to_string());
    let mut meta = vec![
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("qwen35")),
        (
            "tokenizer.ggml.tokens".to_string(),
            GgufValue::Array(GgufArray::String(tokens.clone())),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            GgufValue::Array(GgufArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            GgufValue::Array(GgufArray::String(merges)),
        ),
    ];
    let cfg = &files.tokenizer_config;
    let text_config = config.get("text_config");
    for (typ, key) in [
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
    ] {
        let content = match cfg.get(format!("{typ}_token")) {
            Some(Value::String(c)) => Some(c.as_str()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
            _ => None,
        };
        let id = match content {
            Some(c) => tokens.iter().position(|t| t == c),
            None => None,
        }
        .or_else(|| {
            let k = format!("{typ}_token_id");
            config
                .get(&k)
                .or_else(|| text_config.and_then(|t| t.get(&k)))
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .filter(|&v| v < vocab_size)
        });
        if let Some(id) = id {
            meta.push((key.to_string(), GgufValue::U32(id as u32)));
        }
    }
    for typ in ["bos", "eos"] {
        if let Some(b) = cfg.get(format!("add_{typ}_token")).and_then(Value::as_bool) {
            meta.push((
                format!("tokenizer.ggml.add_{typ}_token"),
                GgufValue::Bool(b),
            ));
        }
    }
    let template = cfg
        .get("chat_template")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| files.chat_template_file.clone());
    if let Some(t) = template {
        meta.push(("tokenizer.chat_template".to_string(), GgufValue::String(t)));
    }
    Ok(meta)
}

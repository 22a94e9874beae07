//! Text to token ids and back, exactly as the decider reference does it.
//!
//! This crate exists because every id onepass feeds a model must equal the id the Python
//! reference (decider-ai 1.10.0 over transformers + `tokenizers`) would feed it: a single
//! different id changes a prompt, a slot and an answer. It wraps the Hugging Face `tokenizers`
//! crate (which reproduces the reference on a `tokenizer.json` carrying the Qwen3.5 pipeline,
//! decider-contract R2.1.3) and adds what the reference adds on top:
//!
//! - encode never adds BOS/EOS; added-token strings inside text become their ids (R2.1.1);
//! - for Qwen3.5 models the split regex is checked and, if it is the older Qwen2 one, corrected
//!   (R2.1.2, see [`pretokenizer`]);
//! - `eos`/`pad` ids and the chat template come from `tokenizer_config.json`;
//! - the 255-entry label table the readout depends on (§2.2, see [`LabelTable`]);
//! - a synthetic tokenizer for tiny test checkpoints ([`synthetic_tokenizer_json`]);
//! - the tokenizer of a GGUF file, from its `tokenizer.ggml.*` metadata ([`Tokenizer::from_gguf`]).
//!
//! `encode` on the Qwen3.5 pipeline does not run the `tokenizers` pre-tokenizer: `src/fast.rs` cuts
//! pre-tokens with an exact scanner for the split regex and hands them to the same BPE model,
//! ~10-35x faster with the same ids (`encode_generic` is the pipeline itself, for comparison).
//!
//! Test data: `tools/setup-testdata.sh` builds the real Qwen3.5 `tokenizer.json`; the golden ids
//! are in `tests/fixtures/tokenizer/` (see docs/tokenizer.md).

mod error;
mod fast;
mod gguf;
mod json_doc;
mod labels;
pub mod pretokenizer;
mod synthetic;

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

pub use error::TokenizerError;
pub use labels::{label_candidates, LabelTable, MAX_OPTIONS};
pub use pretokenizer::{QWEN2_SPLIT_REGEX, QWEN3_5_SPLIT_REGEX};
pub use synthetic::{
    byte_to_unicode, synthetic_max_vocab, synthetic_tokenizer_config_json,
    synthetic_tokenizer_json, QWEN3_CHAT_TEMPLATE, SYNTHETIC_CHAT_TEMPLATE, SYNTHETIC_MIN_VOCAB,
    SYNTHETIC_SPECIAL_TOKENS,
};

use error::excerpt;

/// A loaded tokenizer: `tokenizer.json` plus what `tokenizer_config.json` says about it.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    eos_id: Option<u32>,
    pad_id: Option<u32>,
    chat_template: Option<String>,
    regex_corrected: bool,
    /// transformers would build its `Qwen3_5Tokenizer` class for this folder.
    transformers_class: bool,
    /// The exact fast encode, present when the pipeline is the Qwen3.5 one (see [`fast`]).
    fast: Option<fast::QwenFast>,
    label_table: OnceLock<LabelTable>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("eos_id", &self.eos_id)
            .field("pad_id", &self.pad_id)
            .field(
                "chat_template",
                &self.chat_template.as_ref().map(|t| t.len()),
            )
            .field("regex_corrected", &self.regex_corrected)
            .field("fast_path", &self.fast.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// The tokenizer of a model path (a folder or a `.gguf` file, as `onepass_formats::ModelFiles::locate`
    /// reads it): a `tokenizer.json` in the folder wins (with its `tokenizer_config.json`); otherwise the GGUF
    /// file's `tokenizer.ggml.*` metadata ([`Tokenizer::from_gguf`]).
    pub fn from_model(path: &Path, model_type: Option<&str>) -> Result<Tokenizer, TokenizerError> {
        let files = onepass_formats::ModelFiles::locate(path)
            .map_err(|e| TokenizerError::Model(e.to_string()))?;
        match &files.gguf {
            Some(g) if !files.dir.join("tokenizer.json").is_file() => {
                let file = onepass_formats::Gguf::open(g)
                    .map_err(|e| TokenizerError::Model(e.to_string()))?;
                Self::from_gguf(&file).map_err(|e| match e {
                    TokenizerError::GgufValue { key, reason } => TokenizerError::GgufValue {
                        key: format!("{key}` of `{}", g.display()),
                        reason,
                    },
                    other => other,
                })
            }
            _ => Self::from_dir(&files.dir, model_type),
        }
    }

    /// Load `dir/tokenizer.json`, and `dir/tokenizer_config.json` and `dir/chat_template.jinja`
    /// when present. `model_type` is `config.json`'s `model_type` (it decides whether the Qwen3.5
    /// regex rule applies; so does a `tokenizer_class` of `Qwen3_5Tokenizer`).
    pub fn from_dir(dir: &Path, model_type: Option<&str>) -> Result<Tokenizer, TokenizerError> {
        let json_path = dir.join("tokenizer.json");
        let json = read(&json_path)?;
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            let text = read(&config_path)?;
            let value: Value =
                serde_json::from_str(&text).map_err(|cause| TokenizerError::Config {
                    path: config_path.clone(),
                    cause,
                })?;
            if !value.is_object() {
                return Err(TokenizerError::ConfigValue {
                    key: "<root>".into(),
                    reason: format!("{} is not a JSON object", config_path.display()),
                });
            }
            Some(value)
        } else {
            None
        };
        // transformers prefers a `chat_template.jinja` file over the config key.
        let jinja_path = dir.join("chat_template.jinja");
        let jinja = if jinja_path.is_file() {
            Some(read(&jinja_path)?)
        } else {
            None
        };
        Self::build(
            &json,
            &json_path.display().to_string(),
            config.as_ref(),
            jinja,
            model_type,
        )
    }

    /// Load from the text of a `tokenizer.json`, with no `tokenizer_config.json`: no eos/pad ids,
    /// no chat template. The Qwen3.5 regex rule applies when `model_type` names a Qwen3.5 model.
    pub fn from_json_str(
        json: &str,
        model_type: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        Self::build(json, "<json string>", None, None, model_type)
    }

    /// Load from the text of a `tokenizer.json` and of a `tokenizer_config.json`.
    pub fn from_json_strs(
        json: &str,
        config_json: &str,
        model_type: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        let config: Value =
            serde_json::from_str(config_json).map_err(|cause| TokenizerError::Config {
                path: "<tokenizer_config string>".into(),
                cause,
            })?;
        Self::build(json, "<json string>", Some(&config), None, model_type)
    }

    fn build(
        json: &str,
        origin: &str,
        config: Option<&Value>,
        jinja: Option<String>,
        model_type: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        let load_err = |cause| TokenizerError::Load {
            origin: origin.to_string(),
            cause,
        };
        let mut inner: tokenizers::Tokenizer = json.parse().map_err(load_err)?;
        // Ids must not depend on padding/truncation settings stored in the file.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(load_err)?;

        let tokenizer_class = config
            .and_then(|c| c.get("tokenizer_class"))
            .and_then(Value::as_str);
        let mut regex_corrected = false;
        if pretokenizer::is_qwen3_5(model_type, tokenizer_class) {
            let model = model_type.or(tokenizer_class).unwrap_or("qwen3_5");
            let (normalizer, pre) = pretokenizer::pipeline_json(&inner);
            if let pretokenizer::Verdict::Correct(fixed) =
                pretokenizer::check(model, normalizer, pre)?
            {
                inner.with_pre_tokenizer(Some(fixed));
                regex_corrected = true;
            }
        }

        let vocab_size = inner.get_vocab_size(true);
        let fast = fast::QwenFast::new(&inner);
        let mut tok = Tokenizer {
            inner,
            vocab_size,
            eos_id: None,
            pad_id: None,
            chat_template: jinja,
            regex_corrected,
            transformers_class: pretokenizer::transformers_builds_qwen3_5_class(
                model_type,
                tokenizer_class,
            ),
            fast,
            label_table: OnceLock::new(),
        };
        if let Some(config) = config {
            tok.eos_id = tok.config_token_id(config, "eos_token")?;
            tok.pad_id = tok.config_token_id(config, "pad_token")?;
            if tok.chat_template.is_none() {
                tok.chat_template = config_chat_template(config)?;
            }
        }
        Ok(tok)
    }

    /// The id of the token a `tokenizer_config.json` key names (a string, or an AddedToken object
    /// with `content`); `None` if the key is absent or null.
    fn config_token_id(&self, config: &Value, key: &str) -> Result<Option<u32>, TokenizerError> {
        let content = match config.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.as_str(),
            Some(Value::Object(o)) => match o.get("content").and_then(Value::as_str) {
                Some(s) => s,
                None => {
                    return Err(TokenizerError::ConfigValue {
                        key: key.into(),
                        reason: "an object without a string `content`".into(),
                    })
                }
            },
            Some(other) => {
                return Err(TokenizerError::ConfigValue {
                    key: key.into(),
                    reason: format!("expected a token string, found {other}"),
                })
            }
        };
        match self.token_to_id(content) {
            Some(id) => Ok(Some(id)),
            None => Err(TokenizerError::ConfigValue {
                key: key.into(),
                reason: format!("{content:?} is not a token of tokenizer.json"),
            }),
        }
    }

    /// Token ids of `text`: no BOS/EOS, added-token strings become their ids, NFC elsewhere.
    ///
    /// For the Qwen3.5 pipeline this runs the exact fast path of `src/fast.rs` (several times
    /// faster, same ids as [`Tokenizer::encode_generic`]); otherwise the `tokenizers` pipeline.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if let Some(fast) = &self.fast {
            let ids = fast
                .encode(&self.inner, text)
                .map_err(|cause| TokenizerError::Encode {
                    text: excerpt(text, 40),
                    cause,
                })?;
            if let Some(ids) = ids {
                return Ok(ids);
            }
        }
        self.encode_generic(text)
    }

    /// Token ids of `text` through the `tokenizers` pipeline, never the fast path: the slow twin
    /// that tests and benchmarks compare [`Tokenizer::encode`] with.
    pub fn encode_generic(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding =
            self.inner
                .encode_fast(text, false)
                .map_err(|cause| TokenizerError::Encode {
                    text: excerpt(text, 40),
                    cause,
                })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some((index, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| self.inner.id_to_token(id).is_none())
        {
            return Err(TokenizerError::UnknownId {
                id,
                index,
                vocab_size: self.vocab_size,
            });
        }
        self.inner
            .decode(ids, false)
            .map_err(|cause| TokenizerError::Decode {
                n: ids.len(),
                cause,
            })
    }

    /// The id of a vocabulary entry or added token, given in its stored form (byte-level
    /// strings, e.g. `"Ġthe"`, or `"<|im_start|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of distinct tokens, added tokens included (248,077 for Qwen3.5).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// `tokenizer_config.json`'s `eos_token` as an id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// `tokenizer_config.json`'s `pad_token` as an id.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// The Jinja chat template: `chat_template.jinja` if present, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or the `default` entry of a list of named templates).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Whether the Qwen2 split regex in `tokenizer.json` was replaced by the Qwen3.5 one (R2.1.2).
    /// The tokenizer as decider-ai 1.10.0 sees it through transformers 5.24.
    ///
    /// For folders where transformers builds its `Qwen3_5Tokenizer` class (a `tokenizer_class` of
    /// `Qwen3_5Tokenizer`, or `model_type` `qwen3_5` / `qwen3_5_moe*`, decider-contract R2.1.2),
    /// that class rebuilds the BPE model from the vocabulary and merges without `ignore_merges`;
    /// 201 whole vocabulary entries (CJK words such as 加拿大 alone as a pre-token) then tokenize
    /// into several ids instead of one (tests/fixtures/tokenizer/transformers_diff.jsonl). System
    /// One reproduces the reference, so it uses this view; `onepass tokenize` and generation use
    /// the tokenizer.json as written (tiktoken parity). Other folders are returned unchanged.
    pub fn transformers_compatible(&self) -> Tokenizer {
        let mut inner = self.inner.clone();
        if self.transformers_class {
            if let tokenizers::ModelWrapper::BPE(bpe) = inner.get_model() {
                if bpe.ignore_merges {
                    let mut bpe = bpe.clone();
                    bpe.ignore_merges = false;
                    inner.with_model(bpe);
                }
            }
        }
        Tokenizer {
            vocab_size: self.vocab_size,
            eos_id: self.eos_id,
            pad_id: self.pad_id,
            chat_template: self.chat_template.clone(),
            regex_corrected: self.regex_corrected,
            transformers_class: self.transformers_class,
            // `ignore_merges` is all that changed, and the fast path hands it to the BPE model.
            fast: self.fast.clone(),
            inner,
            label_table: OnceLock::new(),
        }
    }

    pub fn regex_corrected(&self) -> bool {
        self.regex_corrected
    }

    /// Whether [`Tokenizer::encode`] uses the fast Qwen3.5 path (the pipeline is exactly NFC +
    /// Split(Qwen3.5 regex) + ByteLevel + BPE with raw-text added tokens).
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// The 255-entry label table (decider-contract §2.2), built on first use and cached.
    pub fn label_table(&self) -> Result<&LabelTable, TokenizerError> {
        if let Some(table) = self.label_table.get() {
            return Ok(table);
        }
        let table = LabelTable::build(|s| self.encode(s))?;
        Ok(self.label_table.get_or_init(|| table))
    }

    /// The wrapped `tokenizers` tokenizer, for what this API does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|cause| TokenizerError::Read {
        path: path.to_path_buf(),
        cause,
    })
}

fn config_chat_template(config: &Value) -> Result<Option<String>, TokenizerError> {
    let bad = |reason: String| TokenizerError::ConfigValue {
        key: "chat_template".into(),
        reason,
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let default = named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .ok_or_else(|| bad("a list of named templates without a `default` entry".into()))?;
            match default.get("template").and_then(Value::as_str) {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(bad("the `default` entry has no string `template`".into())),
            }
        }
        Some(other) => Err(bad(format!(
            "expected a string, found {}",
            excerpt(&other.to_string(), 80)
        ))),
    }
}

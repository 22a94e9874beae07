//! The one error type of this crate. Every variant says what was being done and with which
//! input, so that a user can act on the message without reading the code. An underlying error is
//! part of the message (`cause`) and not returned as `source()`, so that a chain printer (anyhow's
//! `{:#}`) names it once.

use std::path::PathBuf;

/// Boxed error from the `tokenizers` crate.
pub type TokenizersError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("reading {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },

    /// `tokenizer.json` is not a tokenizer the `tokenizers` crate can load.
    #[error("loading tokenizer from {origin}: {cause}")]
    Load {
        /// A path, or `"<json string>"`.
        origin: String,
        cause: TokenizersError,
    },

    /// `tokenizer_config.json` is not a JSON object.
    #[error("parsing {path}: {cause}")]
    Config {
        path: PathBuf,
        cause: serde_json::Error,
    },

    /// A `tokenizer_config.json` key has a shape or a value we cannot use.
    #[error("tokenizer_config.json key `{key}`: {reason}")]
    ConfigValue { key: String, reason: String },

    /// decider-contract R2.1.2: a Qwen3.5 model whose `tokenizer.json` pre-tokenizer is neither
    /// the Qwen3.5 pipeline nor the known Qwen2-regex variant we correct.
    #[error(
        "model type {model}: unrecognised pre-tokenizer in tokenizer.json (expected Sequence[Split(Qwen3.5 or Qwen2 \
         regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]), found {found}"
    )]
    UnrecognisedPreTokenizer { model: String, found: String },

    /// decider-contract R2.1.1: a Qwen3.5 model must normalize with NFC.
    #[error("model type {model}: tokenizer.json normalizer must be NFC, found {found}")]
    UnrecognisedNormalizer { model: String, found: String },

    #[error("encoding {text:?}: {cause}")]
    Encode {
        /// The first characters of the input.
        text: String,
        cause: TokenizersError,
    },

    #[error("decoding {n} ids: {cause}")]
    Decode { n: usize, cause: TokenizersError },

    #[error(
        "token id {id} at position {index} is not in the vocabulary (vocab_size {vocab_size})"
    )]
    UnknownId {
        id: u32,
        index: usize,
        vocab_size: usize,
    },

    /// decider-contract R2.2.1: the vocabulary has fewer than 255 single-id labels.
    #[error(
        "label table: only {found} of the candidates A..Z, AA..ZZ encode to a single id, {needed} are needed \
         (is this a Qwen3.5 tokenizer, or a synthetic one with too small a vocab?)"
    )]
    TooFewLabels { found: usize, needed: usize },

    /// decider-contract R2.2.1: two labels share an id.
    #[error("label table: labels {first:?} and {second:?} both encode to id {id}")]
    DuplicateLabel {
        first: String,
        second: String,
        id: u32,
    },

    /// decider-contract R2.2.1: the first ten labels must be the single letters A..J.
    #[error("label table: label {index} is {found:?}, expected {expected:?} (a single letter must be one id)")]
    SingleLetterLabel {
        index: usize,
        found: String,
        expected: String,
    },

    /// The model path does not lead to a tokenizer (not a model folder, an unreadable GGUF file).
    #[error("{0}")]
    Model(String),

    /// A GGUF file's `tokenizer.ggml.*` key has a shape or a value we cannot use.
    #[error("GGUF metadata key `{key}`: {reason}")]
    GgufValue { key: String, reason: String },

    #[error("synthetic tokenizer: vocab_size {vocab_size} is out of range {min}..={max}")]
    SyntheticVocabSize {
        vocab_size: usize,
        min: usize,
        max: usize,
    },
}

/// Cut `text` to at most `n` characters for an error message.
pub(crate) fn excerpt(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

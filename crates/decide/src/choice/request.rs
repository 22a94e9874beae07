//! A decide request as it arrives (a session line without its `"cmd"`, or a `POST /v1/decide` body), read and
//! checked for shape. Nothing here knows the tokenizer; the checks that need ids are in [`super::score`].

use serde_json::Value;

use super::DecideError;

/// `{"prefix": S, "suffix": S, "choices": [S, ...], "reuse_prefix": bool, "id": any}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideRequest {
    /// Echoed in the answer as given (`null` when absent).
    pub id: Value,
    /// The part of the prompt worth remembering between requests (instructions, task, history).
    pub prefix: String,
    /// The rest of the prompt (this step's screen, options and question).
    pub suffix: String,
    /// The answers to score; each is read by its first token.
    pub choices: Vec<String>,
    /// Restore and keep a prefix state (default true); false prefills the whole prompt and leaves any kept state.
    pub reuse_prefix: bool,
}

/// The keys a request may have besides `cmd` (which only a session line carries).
const KEYS: [&str; 5] = ["id", "prefix", "suffix", "choices", "reuse_prefix"];

impl DecideRequest {
    /// Reads a JSON object. `extra` names keys the caller handles itself (a session's `"cmd"`); any other unknown
    /// key is refused, so a misspelt field is never silently ignored.
    pub fn from_json(v: &Value, extra: &[&str]) -> Result<DecideRequest, DecideError> {
        let id = v.get("id").cloned().unwrap_or(Value::Null);
        let bad = |msg: String| DecideError::invalid(id.clone(), msg);
        let Some(obj) = v.as_object() else {
            return Err(bad(format!(
                "a decide request is a JSON object, not {}",
                kind(v)
            )));
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !KEYS.contains(&k.as_str()) && !extra.contains(&k.as_str()))
        {
            return Err(bad(format!(
                "unknown field {k:?} (a decide request has prefix, suffix, choices, reuse_prefix and id)"
            )));
        }
        let text = |key: &str| -> Result<String, DecideError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(bad(format!("{key} must be a string, not {}", kind(other)))),
            }
        };
        let prefix = text("prefix")?;
        let suffix = text("suffix")?;
        let choices = match obj.get("choices") {
            None | Some(Value::Null) => {
                return Err(bad(
                    "choices is missing: give the list of answers to score".into()
                ))
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, c)| match c {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(bad(format!(
                        "choices[{i}] must be a string, not {}",
                        kind(other)
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(bad(format!(
                    "choices must be a list of strings, not {}",
                    kind(other)
                )))
            }
        };
        let reuse_prefix = match obj.get("reuse_prefix") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(bad(format!(
                    "reuse_prefix must be true or false, not {}",
                    kind(other)
                )))
            }
        };
        Ok(DecideRequest {
            id,
            prefix,
            suffix,
            choices,
            reuse_prefix,
        })
    }
}

/// A JSON value's kind, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_defaults_and_refuses_bad_shapes() {
        let r =
            DecideRequest::from_json(&json!({"choices": ["A", "B"], "prefix": "p"}), &[]).unwrap();
        assert_eq!(r.id, Value::Null);
        assert_eq!((r.prefix.as_str(), r.suffix.as_str()), ("p", ""));
        assert!(r.reuse_prefix);
        let r = DecideRequest::from_json(
            &json!({"cmd": "decide", "id": {"k": 1}, "choices": [], "reuse_prefix": false}),
            &["cmd"],
        )
        .unwrap();
        assert_eq!(r.id, json!({"k": 1}));
        assert!(!r.reuse_prefix && r.choices.is_empty());
        for (body, want) in [
            (json!([1]), "JSON object"),
            (json!({"prefix": "x"}), "choices is missing"),
            (json!({"choices": "A"}), "choices must be a list"),
            (json!({"choices": ["A", 2]}), "choices[1] must be a string"),
            (
                json!({"choices": ["A"], "suffix": 3}),
                "suffix must be a string",
            ),
            (
                json!({"choices": ["A"], "reuse_prefix": 1}),
                "reuse_prefix must be",
            ),
            (
                json!({"choices": ["A"], "choice": ["B"]}),
                "unknown field \"choice\"",
            ),
            (
                json!({"cmd": "decide", "choices": ["A"]}),
                "unknown field \"cmd\"",
            ),
        ] {
            let e = DecideRequest::from_json(&body, &[]).unwrap_err();
            assert!(e.message.contains(want), "{body}: {}", e.message);
            assert_eq!(e.kind, super::super::ErrorKind::InvalidRequest);
        }
        let e = DecideRequest::from_json(&json!({"id": 7, "choices": 1}), &[]).unwrap_err();
        assert_eq!(e.id, json!(7));
    }
}

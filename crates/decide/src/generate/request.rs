//! A generation request from JSON: the session's `{"cmd": "generate", ...}` line and the OpenAI-shaped HTTP bodies
//! read the same fields.

use serde_json::Value as J;

use super::GenerateError;

/// Most stop strings a request may give.
pub const MAX_STOPS: usize = 16;
/// `max_tokens` when the request gives none.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// What to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Raw text, tokenized as it is (no template).
    Prompt(String),
    /// `(role, content)` turns, rendered with the chat template and its generation prompt.
    Messages(Vec<(String, String)>),
}

/// One generation request. `None` settings take the model's `generation_config.json` defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub input: Input,
    /// At least 1 (default [`DEFAULT_MAX_TOKENS`]).
    pub max_tokens: usize,
    /// 0: greedy.
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
}

impl GenerateRequest {
    /// A greedy request for raw text.
    pub fn greedy(prompt: &str, max_tokens: usize) -> GenerateRequest {
        GenerateRequest {
            input: Input::Prompt(prompt.to_string()),
            max_tokens,
            temperature: Some(0.0),
            top_k: None,
            top_p: None,
            seed: None,
            stop: Vec::new(),
            stream: false,
        }
    }
}

fn number(v: &J, key: &str) -> Result<Option<f64>, GenerateError> {
    match v.get(key) {
        None | Some(J::Null) => Ok(None),
        Some(J::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(GenerateError::invalid(format!(
            "\"{key}\" must be a number, got {other}"
        ))),
    }
}

fn integer(v: &J, key: &str, min: i64) -> Result<Option<i64>, GenerateError> {
    match v.get(key) {
        None | Some(J::Null) => Ok(None),
        Some(J::Number(n)) => match n.as_i64() {
            Some(i) if i >= min => Ok(Some(i)),
            _ => Err(GenerateError::invalid(format!(
                "\"{key}\" must be an integer of at least {min}, got {n}"
            ))),
        },
        Some(other) => Err(GenerateError::invalid(format!(
            "\"{key}\" must be an integer, got {other}"
        ))),
    }
}

/// Reads a generation request from a JSON object: `prompt` (a string) or `messages` (`[{"role", "content"}]`, content
/// a string or a list of `{"type": "text", "text"}` parts), `max_tokens` (or `max_completion_tokens`), `temperature`
/// (0 to 2), `top_k`, `top_p` (0 to 1), `seed`, `stop` (a string or a list), `stream`. Other keys are ignored.
pub fn parse_generate(v: &J) -> Result<GenerateRequest, GenerateError> {
    if !v.is_object() {
        return Err(GenerateError::invalid("the request must be a JSON object"));
    }
    let input = match (v.get("prompt"), v.get("messages")) {
        (Some(_), Some(_)) => {
            return Err(GenerateError::invalid(
                "give \"prompt\" or \"messages\", not both",
            ))
        }
        (Some(J::String(p)), None) => Input::Prompt(p.clone()),
        (Some(_), None) => return Err(GenerateError::invalid("\"prompt\" must be a string")),
        (None, Some(J::Array(ms))) => {
            let mut out = Vec::with_capacity(ms.len());
            for (i, m) in ms.iter().enumerate() {
                let role = m.get("role").and_then(J::as_str).ok_or_else(|| {
                    GenerateError::invalid(format!("messages[{i}] needs a string \"role\""))
                })?;
                let content = match m.get("content") {
                    Some(J::String(s)) => s.clone(),
                    Some(J::Array(parts)) => {
                        let mut s = String::new();
                        for p in parts {
                            match (p.get("type").and_then(J::as_str), p.get("text")) {
                                (Some("text"), Some(J::String(t))) => s.push_str(t),
                                _ => {
                                    return Err(GenerateError::invalid(format!(
                                        "messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported"
                                    )))
                                }
                            }
                        }
                        s
                    }
                    _ => {
                        return Err(GenerateError::invalid(format!(
                            "messages[{i}] needs a string \"content\""
                        )))
                    }
                };
                out.push((role.to_string(), content));
            }
            if out.is_empty() {
                return Err(GenerateError::invalid("\"messages\" is empty"));
            }
            Input::Messages(out)
        }
        (None, Some(_)) => {
            return Err(GenerateError::invalid(
                "\"messages\" must be a list of {\"role\", \"content\"} objects",
            ))
        }
        (None, None) => {
            return Err(GenerateError::invalid(
                "a generation needs \"prompt\" (text) or \"messages\" (chat turns)",
            ))
        }
    };
    let max_tokens = match integer(v, "max_tokens", 1)? {
        Some(n) => Some(n),
        None => integer(v, "max_completion_tokens", 1)?,
    }
    .map_or(DEFAULT_MAX_TOKENS, |n| n as usize);
    let temperature = number(v, "temperature")?;
    if let Some(t) = temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(GenerateError::invalid(format!(
                "\"temperature\" must be between 0 and 2, got {t}"
            )));
        }
    }
    let top_p = number(v, "top_p")?;
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(GenerateError::invalid(format!(
                "\"top_p\" must be above 0 and at most 1, got {p}"
            )));
        }
    }
    // OpenAI-style clients send -1 for "no top-k".
    let top_k = integer(v, "top_k", -1)?.map(|k| k.max(0) as usize);
    let seed = match v.get("seed") {
        None | Some(J::Null) => None,
        Some(J::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Some(u),
            (None, Some(i)) => Some(i as u64),
            _ => {
                return Err(GenerateError::invalid(format!(
                    "\"seed\" must be an integer, got {n}"
                )))
            }
        },
        Some(other) => {
            return Err(GenerateError::invalid(format!(
                "\"seed\" must be an integer, got {other}"
            )))
        }
    };
    let stop = match v.get("stop") {
        None | Some(J::Null) => Vec::new(),
        Some(J::String(s)) => vec![s.clone()],
        Some(J::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    GenerateError::invalid("\"stop\" must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(GenerateError::invalid(
                "\"stop\" must be a string or a list of strings",
            ))
        }
    };
    if stop.len() > MAX_STOPS {
        return Err(GenerateError::invalid(format!(
            "at most {MAX_STOPS} stop strings, got {}",
            stop.len()
        )));
    }
    let stream = match v.get("stream") {
        None | Some(J::Null) => false,
        Some(J::Bool(b)) => *b,
        Some(_) => return Err(GenerateError::invalid("\"stream\" must be true or false")),
    };
    Ok(GenerateRequest {
        input,
        max_tokens,
        temperature: temperature.map(|t| t as f32),
        top_k,
        top_p: top_p.map(|p| p as f32),
        seed,
        stop,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_fields_and_refuses_bad_ones() {
        let r = parse_generate(
            &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 5, "temperature": 0, "seed": -3, "stop": "x", "stream": true}),
        )
        .unwrap();
        assert_eq!(r.input, Input::Messages(vec![("user".into(), "hi".into())]));
        assert_eq!(
            (r.max_tokens, r.temperature, r.seed),
            (5, Some(0.0), Some(-3i64 as u64))
        );
        assert_eq!((r.stop, r.stream), (vec!["x".to_string()], true));
        let d = parse_generate(&json!({"prompt": "a"})).unwrap();
        assert_eq!(
            (d.max_tokens, d.temperature, d.stream),
            (DEFAULT_MAX_TOKENS, None, false)
        );
        for (bad, says) in [
            (json!({}), "needs \"prompt\""),
            (json!({"prompt": "a", "messages": []}), "not both"),
            (json!({"prompt": 3}), "must be a string"),
            (json!({"messages": []}), "is empty"),
            (json!({"prompt": "a", "max_tokens": 0}), "at least 1"),
            (json!({"prompt": "a", "temperature": 3}), "between 0 and 2"),
            (json!({"prompt": "a", "top_p": 0}), "above 0"),
            (json!({"prompt": "a", "stop": [1]}), "list of strings"),
            (json!({"prompt": "a", "stream": "yes"}), "true or false"),
            (json!([1]), "JSON object"),
        ] {
            let e = parse_generate(&bad).unwrap_err();
            assert!(e.message.contains(says), "{bad}: {}", e.message);
            assert_eq!(e.kind, "invalid_request");
        }
    }
}

//! `POST /decide`: the plain form (decider-contract R2.6.2, §5.2; serve.py `decide`, `_prepare_decide`,
//! `_format_decide`; infer.py `_check_schema`, `_schema_to_questions`, `neutralize_options`).
//!
//! Body `{"context": str, "schema": {question: field}}` → one packed state-first row (context capped at 1536 ids,
//! question text raw, options neutralised when `neutralize_none`) → answers keyed by question in schema order.

use crate::assemble::argmax;
use crate::config::DecideConfig;
use crate::error::ApiError;
use crate::prompt::text::QType;
use crate::prompt::tokens::{
    state_first_rows, unique_tokens, Plan, Question, Row, StateText, MAX_OPTIONS,
};
use crate::pyjson::{
    dumps_compact, is_py_space, obj, py_float, py_repr, py_round, py_str, repr_str, Object, Value,
};
use crate::request::validation_error;
use onepass_tokenizer::Tokenizer;

/// `DECIDE_MAX_CTX_TOKENS` (serve.py; not configurable).
pub const DECIDE_MAX_CTX_TOKENS: usize = 1536;
/// `Decider.SCHEMA_FORM`.
pub const SCHEMA_FORM: &str = "schema: a map {question: field}, each field one of {\"type\": \"choice\", \"options\": [option strings]}, {\"type\": \"bool\"} or {\"type\": \"scale\", \"legend\": [descriptions] or {level number: description}}";
/// infer.py `NEUTRAL_NONE`.
pub const NEUTRAL_NONE: &str = "not listed here";

/// One schema field as `_schema_to_questions` turns it into a question.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideQuestion {
    pub text: String,
    pub kind: FieldKind,
    /// Option texts fed to the model (after neutralisation).
    pub options: Vec<String>,
    /// Names reported in the answer (neutralised options mapped back).
    pub names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FieldKind {
    Bool,
    Choice,
    /// `keys`: the scale value of each level as reported (`str(key)`) and as a number (`float(key)`);
    /// `legend`: echoed as given.
    Scale {
        keys: Vec<(String, f64)>,
        legend: Value,
    },
}

/// Body → questions → one packed row (no rows for an empty schema). Errors are the reference's 422 bodies.
pub fn prepare(
    body: &[u8],
    tok: &Tokenizer,
    cfg: &DecideConfig,
) -> Result<(Vec<DecideQuestion>, Plan), ApiError> {
    let (context, schema) = validate_body(body)?;
    let questions =
        schema_to_questions(&schema, neutralize_none(cfg)).map_err(|m| ApiError::detail(422, m))?;
    if questions.is_empty() {
        let plan = Plan {
            rqs: vec![],
            index: vec![],
            rows: vec![],
            ctx_len: 0,
            input_tokens: 0,
        };
        return Ok((questions, plan));
    }
    let plan = build_plan(&context, &questions, tok, cfg)
        .map_err(|e| ApiError::detail(500, format!("tokenizer: {e}")))?;
    Ok((questions, plan))
}

/// `bool(cfg.get("neutralize_none", True))`.
fn neutralize_none(cfg: &DecideConfig) -> bool {
    cfg.raw.get("neutralize_none").is_none_or(Value::truthy)
}

/// FastAPI + pydantic `Req`: `context: str` required; `schema` (renamed to `schema_` by `Req.__init__`) any value.
fn validate_body(body: &[u8]) -> Result<(String, Value), ApiError> {
    let v = crate::request::fastapi_json_body(body)?;
    let Value::Object(mut kw) = v else {
        return Err(ApiError::validation(vec![validation_error(
            "model_attributes_type",
            &[],
            "Input should be a valid dictionary or object to extract fields from",
            v,
            None,
        )]));
    };
    // `if "schema" in kw: kw["schema_"] = kw.pop("schema")` — an existing `schema_` keeps its position.
    if let Some(s) = kw.shift_remove("schema") {
        kw.insert("schema_".into(), s);
    }
    let context = match kw.get("context") {
        Some(Value::Str(s)) => s.clone(),
        Some(other) => {
            return Err(ApiError::validation(vec![validation_error(
                "string_type",
                &["context"],
                "Input should be a valid string",
                other.clone(),
                None,
            )]))
        }
        None => {
            return Err(ApiError::validation(vec![validation_error(
                "missing",
                &["context"],
                "Field required",
                Value::Object(kw.clone()),
                None,
            )]))
        }
    };
    let schema = kw.get("schema_").cloned().unwrap_or(Value::Null);
    Ok((context, schema))
}

/// `_check_schema` then `_schema_to_questions`, with `neutralize_options` when `neutralize`. `Err` is the 422 message.
pub fn schema_to_questions(
    schema: &Value,
    neutralize: bool,
) -> Result<Vec<DecideQuestion>, String> {
    let form = SCHEMA_FORM;
    let schema = match schema {
        Value::Null => return Err(format!("schema is required; {form}")),
        Value::Object(o) => o,
        other => return Err(format!("schema is a {}; {form}", other.py_type_name())),
    };
    let mut out = Vec::with_capacity(schema.len());
    for (qtext, spec) in schema {
        let place = format!("schema[{}]", repr_str(qtext));
        let Value::Object(spec) = spec else {
            return Err(format!(
                "{place} is a {}, not a field object; {form}",
                spec.py_type_name()
            ));
        };
        let t = spec
            .get("type")
            .cloned()
            .unwrap_or_else(|| Value::str("choice"));
        let (kind, options) = match t.as_str() {
            Some("choice") => {
                let opts: Vec<String> = match spec.get("options") {
                    Some(Value::Array(a)) if !a.is_empty() => {
                        let strs: Option<Vec<String>> =
                            a.iter().map(|o| o.as_str().map(str::to_string)).collect();
                        // Duplicates are kept, as decider-ai keeps them: the model sees every copy, and the
                        // answer's `probabilities` map holds one entry per distinct name (the last copy's), while
                        // `choice` and `confidence` come from the likeliest copy (docs/server.md, "Duplicate
                        // options"; the reference fixtures hold such bodies).
                        strs.ok_or_else(|| {
                            format!(
                                "{place}: \"options\" must be a non-empty list of strings; {form}"
                            )
                        })?
                    }
                    Some(Value::Object(m)) if !m.is_empty() => m.keys().cloned().collect(),
                    _ => {
                        return Err(format!(
                            "{place}: \"options\" must be a non-empty list of strings; {form}"
                        ))
                    }
                };
                (FieldKind::Choice, opts)
            }
            Some("scale") => {
                let leg = spec.get("legend");
                let ok_shape = match leg {
                    Some(Value::Array(a)) => !a.is_empty(),
                    Some(Value::Object(m)) => !m.is_empty(),
                    _ => false,
                };
                let Some(leg) = leg.filter(|_| ok_shape) else {
                    return Err(format!(
                        "{place}: \"legend\" must be a non-empty list or {{level number: description}} map; {form}"
                    ));
                };
                if dumps_compact(leg).is_err() {
                    return Err(format!(
                        "{place}: the \"legend\" contains a value that is not finite JSON (NaN or Infinity); {form}"
                    ));
                }
                let (keys, labels) = match leg {
                    Value::Object(m) => {
                        let mut keyed = Vec::with_capacity(m.len());
                        for (k, v) in m {
                            match py_float(k) {
                                Ok(x) if x.is_finite() => keyed.push((k.clone(), x, v)),
                                _ => {
                                    return Err(format!(
                                        "{place}: the keys of a \"legend\" map must be finite numbers, e.g. {{\"0\": \"none\", \"1\": \"low\"}}; {form}"
                                    ))
                                }
                            }
                        }
                        // `sorted(leg, key=float)`: stable; every key is finite here.
                        keyed.sort_by(|a, b| {
                            a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal)
                        });
                        let labels = keyed
                            .iter()
                            .map(|(k, _, v)| format!("{k}: {}", py_str(v)))
                            .collect();
                        (keyed.into_iter().map(|(k, x, _)| (k, x)).collect(), labels)
                    }
                    Value::Array(a) => (
                        (0..a.len()).map(|i| (i.to_string(), i as f64)).collect(),
                        a.iter()
                            .enumerate()
                            .map(|(i, v)| format!("{i}: {}", py_str(v)))
                            .collect(),
                    ),
                    _ => unreachable!("checked above"),
                };
                (
                    FieldKind::Scale {
                        keys,
                        legend: leg.clone(),
                    },
                    labels,
                )
            }
            Some("bool") => (FieldKind::Bool, vec!["no".to_string(), "yes".to_string()]),
            _ => {
                return Err(format!(
                    "{place}: unknown field type {}; {form}",
                    py_repr(&t)
                ));
            }
        };
        if options.len() > MAX_OPTIONS {
            // onepass-only (docs/server.md): the reference samples 255 of them and reports the wrong names.
            return Err(format!(
                "{place}: at most {MAX_OPTIONS} options or levels, got {}; {form}",
                options.len()
            ));
        }
        let (model_opts, names) = if neutralize {
            neutralize_options(&options)
        } else {
            (options.clone(), options)
        };
        out.push(DecideQuestion {
            text: qtext.clone(),
            kind,
            options: model_opts,
            names,
        });
    }
    Ok(out)
}

/// `neutralize_options(options)` → (texts for the model, names to report): "none"-like options become
/// "not listed here" and map back to the last original that did (the `back` dict).
pub fn neutralize_options(options: &[String]) -> (Vec<String>, Vec<String>) {
    let mut back: Option<&String> = None;
    let out: Vec<String> = options
        .iter()
        .map(|o| {
            let key = o.trim_matches(is_py_space).to_lowercase(); // `o.strip().lower()`
            if key.starts_with("none of the above")
                || matches!(key.as_str(), "none" | "n/a" | "none of these")
            {
                back = Some(o);
                NEUTRAL_NONE.to_string()
            } else {
                o.clone()
            }
        })
        .collect();
    let names = out
        .iter()
        .map(|o| match (o.as_str(), back) {
            (NEUTRAL_NONE, Some(b)) => b.clone(),
            _ => o.clone(),
        })
        .collect();
    (out, names)
}

/// `build(Example(context, qs), max_ctx_tokens=1536)`: one packed state-first row, one slot per question.
// decider-contract R2.6.1, R2.6.2
pub fn build_plan(
    context: &str,
    qs: &[DecideQuestion],
    tok: &Tokenizer,
    cfg: &DecideConfig,
) -> Result<Plan, onepass_tokenizer::TokenizerError> {
    // Plain or chat layout (the engine's config carries the chat template), decider-contract R2.6.1.
    let group: Vec<Question<'_>> = qs
        .iter()
        .map(|q| (q.text.as_str(), q.options.as_slice()))
        .collect();
    let (mut rows, ctx_len) = state_first_rows(
        tok,
        cfg.chat.as_ref(),
        StateText::Verbatim(context),
        &[group],
        DECIDE_MAX_CTX_TOKENS,
    )?;
    let (ids, slots) = rows.pop().unwrap_or_default();
    let mut row = Row {
        ids,
        slots,
        nopts: vec![],
        types: vec![],
        temperatures: vec![],
    };
    for q in qs {
        let t = match q.kind {
            FieldKind::Bool => QType::Noul,
            FieldKind::Choice => QType::Choice,
            FieldKind::Scale { .. } => QType::Score,
        };
        row.nopts.push(q.options.len());
        row.types.push(t);
        row.temperatures
            .push(cfg.temperature.for_slot(t, q.options.len()));
    }
    let input_tokens = unique_tokens(&[row.ids.as_slice()]);
    Ok(Plan {
        rqs: vec![],
        index: vec![],
        rows: vec![row],
        ctx_len,
        input_tokens,
    })
}

/// `_format_decide(schema, qs, probs)`: `probs[k]` are question `k`'s option probabilities (not renormalised).
pub fn format(qs: &[DecideQuestion], probs: &[Vec<f32>]) -> Value {
    let mut o = Object::new();
    for (q, p) in qs.iter().zip(probs) {
        let p: Vec<f64> = p[..q.options.len().min(p.len())]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let r4 = |x: f64| Value::Float(py_round(x, 4));
        let j = argmax(&p);
        let ans = match &q.kind {
            FieldKind::Bool => obj([
                ("noul", r4(p.get(1).copied().unwrap_or(0.0))),
                ("type", Value::str("noul")),
            ]),
            FieldKind::Choice => {
                let mut probs = Object::new();
                for (n, &x) in q.names.iter().zip(&p) {
                    probs.insert(n.clone(), r4(x));
                }
                obj([
                    ("choice", Value::str(q.names[j].clone())),
                    ("confidence", r4(p[j])),
                    ("type", Value::str("choice")),
                    ("probabilities", Value::Object(probs)),
                ])
            }
            FieldKind::Scale { keys, legend } => {
                // Python `sum(float(k) * pi ...)`: starts at int 0, left to right.
                let score = keys
                    .iter()
                    .zip(&p)
                    .fold(0.0f64, |a, ((_, k), &x)| a + k * x);
                let mut probs = Object::new();
                for ((k, _), &x) in keys.iter().zip(&p) {
                    probs.insert(k.clone(), r4(x));
                }
                obj([
                    ("score", Value::Float(py_round(score, 2))),
                    ("confidence", r4(p[j])),
                    ("type", Value::str("scale")),
                    ("legend", legend.clone()),
                    ("probabilities", Value::Object(probs)),
                ])
            }
        };
        o.insert(q.text.clone(), ans);
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pyjson::loads;

    /// `["a", "a"]`: both copies are scored; the answer is the reference's, one `probabilities` entry holding the
    /// last copy's probability and `choice` / `confidence` from the likeliest copy (docs/server.md).
    #[test]
    fn duplicate_options_answer_as_the_reference_does() {
        let schema = loads(r#"{"q": {"type": "choice", "options": ["a", "a"]}}"#).unwrap();
        let qs = schema_to_questions(&schema, true).unwrap();
        assert_eq!(qs[0].options, ["a", "a"]);
        let v = format(&qs, &[vec![0.9666, 0.0334]]);
        assert_eq!(
            dumps_compact(&v).unwrap(),
            r#"{"q":{"choice":"a","confidence":0.9666,"type":"choice","probabilities":{"a":0.0334}}}"#
        );
    }
}

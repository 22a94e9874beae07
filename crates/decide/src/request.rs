//! The `/v1/systemone` body: Python `json.loads` (Starlette) then pydantic `S1Req` validation (FastAPI), with the
//! reference's 400/422 bodies.

use crate::error::ApiError;
use crate::pyjson::{decode_body, obj, BodyError, Object, Value};

/// A validated `/v1/systemone` request (`S1Req`, serve.py). Extra keys are ignored.
// decider-contract R1.1.2
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Any JSON value, `null` included.
    pub state: Value,
    /// Question id → spec, in request order (a duplicated id keeps its first position, last spec).
    pub questions: Object,
    /// Ignored by the server.
    pub model: Option<String>,
    pub independent: bool,
    /// Only consulted by the schema cache.
    pub layout: Option<String>,
    /// Image assets; onepass is text-only (see docs/systemone.md).
    pub assets: Option<Object>,
}

/// Body bytes → [`Request`], or the reference's error answer.
pub fn parse_request(body: &[u8]) -> Result<Request, ApiError> {
    validate(fastapi_json_body(body)?)
}

/// What FastAPI does with a JSON body before pydantic sees it: an empty body is a missing field
/// (422), invalid JSON is the `json_invalid` 422 with Python's message and char offset, anything
/// else unreadable is a 400. Shared by `/v1/systemone` and `/decide`.
pub fn fastapi_json_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::validation(vec![validation_error(
            "missing",
            &[],
            "Field required",
            Value::Null,
            None,
        )]));
    }
    match decode_body(body) {
        Ok(v) => Ok(v),
        Err(BodyError::Decode(e)) => {
            // decider-contract R1.1.1: FastAPI's json_invalid error with Python's message and char offset.
            let mut ctx = Object::new();
            ctx.insert("error".into(), Value::Str(e.msg.clone()));
            Err(ApiError::validation(vec![obj([
                ("type", Value::str("json_invalid")),
                (
                    "loc",
                    Value::Array(vec![Value::str("body"), Value::from(e.pos)]),
                ),
                ("msg", Value::str("JSON decode error")),
                ("input", Value::Object(Object::new())),
                ("ctx", Value::Object(ctx)),
            ])]))
        }
        Err(e @ BodyError::TooManyValues) => Err(ApiError::detail(
            413,
            format!(
                "request too large: {e}; send a smaller state (cut it, or summarise long arrays)"
            ),
        )),
        Err(BodyError::Other(_)) => {
            Err(ApiError::detail(400, "There was an error parsing the body"))
        }
    }
}

/// pydantic `S1Req.model_validate` of a parsed body.
pub fn validate(v: Value) -> Result<Request, ApiError> {
    let Value::Object(body) = v else {
        let mut ctx = Object::new();
        ctx.insert("class_name".into(), Value::str("S1Req"));
        return Err(ApiError::validation(vec![validation_error(
            "model_type",
            &[],
            "Input should be a valid dictionary or instance of S1Req",
            v,
            Some(ctx),
        )]));
    };
    let mut errors = Vec::new();
    let state = match body.get("state") {
        Some(s) => s.clone(),
        None => {
            errors.push(validation_error(
                "missing",
                &["state"],
                "Field required",
                Value::Object(body.clone()),
                None,
            ));
            Value::Null
        }
    };
    let questions = match body.get("questions") {
        Some(Value::Object(q)) => q.clone(),
        Some(other) => {
            errors.push(validation_error(
                "dict_type",
                &["questions"],
                "Input should be a valid dictionary",
                other.clone(),
                None,
            ));
            Object::new()
        }
        None => {
            errors.push(validation_error(
                "missing",
                &["questions"],
                "Field required",
                Value::Object(body.clone()),
                None,
            ));
            Object::new()
        }
    };
    let model = opt_str(&body, "model", &mut errors);
    let independent = match body.get("independent") {
        None => true,
        Some(x) => match lax_bool(x) {
            Ok(b) => b,
            Err((kind, msg)) => {
                errors.push(validation_error(
                    kind,
                    &["independent"],
                    msg,
                    x.clone(),
                    None,
                ));
                true
            }
        },
    };
    let layout = opt_str(&body, "layout", &mut errors);
    let assets = match body.get("assets") {
        None | Some(Value::Null) => None,
        Some(Value::Object(a)) => Some(a.clone()),
        Some(other) => {
            errors.push(validation_error(
                "dict_type",
                &["assets"],
                "Input should be a valid dictionary",
                other.clone(),
                None,
            ));
            None
        }
    };
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    Ok(Request {
        state,
        questions,
        model,
        independent,
        layout,
        assets,
    })
}

fn opt_str(body: &Object, key: &str, errors: &mut Vec<Value>) -> Option<String> {
    match body.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Str(s)) => Some(s.clone()),
        Some(other) => {
            errors.push(validation_error(
                "string_type",
                &[key],
                "Input should be a valid string",
                other.clone(),
                None,
            ));
            None
        }
    }
}

/// pydantic's lax (python-mode) bool: bools; ints 0/1; floats 0.0/1.0; the strings
/// `0 off f false n no 1 on t true y yes` in any case.
// decider-contract R1.1.2
fn lax_bool(v: &Value) -> Result<bool, (&'static str, &'static str)> {
    const TYPE: (&str, &str) = ("bool_type", "Input should be a valid boolean");
    const PARSE: (&str, &str) = (
        "bool_parsing",
        "Input should be a valid boolean, unable to interpret input",
    );
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Int(d) => match d.parse::<i64>() {
            Ok(0) => Ok(false),
            Ok(1) => Ok(true),
            Ok(_) => Err(PARSE),
            Err(_) => Err(TYPE),
        },
        Value::Float(f) if *f == 0.0 => Ok(false),
        Value::Float(f) if *f == 1.0 => Ok(true),
        Value::Str(s) => match s.to_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(PARSE),
        },
        _ => Err(TYPE),
    }
}

/// One pydantic error of a FastAPI 422 body: `{"type", "loc": ["body", ...loc], "msg", "input"[, "ctx"]}`.
pub fn validation_error(
    kind: &str,
    loc: &[&str],
    msg: &str,
    input: Value,
    ctx: Option<Object>,
) -> Value {
    let mut l = vec![Value::str("body")];
    l.extend(loc.iter().copied().map(Value::str));
    let mut o = Object::new();
    o.insert("type".into(), Value::str(kind));
    o.insert("loc".into(), Value::Array(l));
    o.insert("msg".into(), Value::str(msg));
    o.insert("input".into(), input);
    if let Some(c) = ctx {
        o.insert("ctx".into(), Value::Object(c));
    }
    Value::Object(o)
}

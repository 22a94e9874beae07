//! A JSON value that keeps what Python's `json.loads` keeps, and writes what `json.dumps` writes.
//!
//! decider-ai renders prompts with `json.dumps(..., ensure_ascii=False)` and answers with Starlette's compact
//! `json.dumps`, so byte parity needs Python's data model: object order with duplicate keys collapsing to the last value
//! at the first position, arbitrary-precision integers, `NaN`/`Infinity` literals, and Python's float repr.
//! serde_json cannot keep all of that, hence this small parser and writer.

mod number;
mod parse;
mod unicode;

pub use number::{float_repr, is_py_space, py_decimal, py_float, py_round, FloatParseError};
pub use parse::{decode_body, loads, BodyError, JsonDecodeError, MAX_VALUES};

use indexmap::IndexMap;
use std::fmt::Write;

/// A Python dict as `json.loads` builds it: insertion order, re-inserting a key updates it in place.
pub type Object = IndexMap<String, Value>;

/// One JSON value with Python `json` semantics.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// Arbitrary-precision integer as canonical decimal text: optional `-`, no leading zeros, never `-0`.
    Int(String),
    /// Any number with `.`, `e` or `E`, and the `NaN`/`Infinity`/`-Infinity` literals.
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Object(Object),
}

impl Value {
    pub fn int(i: i64) -> Value {
        Value::Int(i.to_string())
    }

    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// `x in (None, "")`: the emptiness test decider uses for descriptions and instructions.
    pub fn is_none_or_empty_str(&self) -> bool {
        matches!(self, Value::Null) || matches!(self, Value::Str(s) if s.is_empty())
    }

    /// Python truthiness (`bool(x)`).
    pub fn truthy(&self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(d) => d != "0",
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
        }
    }

    /// Python's `type(x).__name__` of the value as `json.loads` returns it.
    pub fn py_type_name(&self) -> &'static str {
        match self {
            Value::Null => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Array(_) => "list",
            Value::Object(_) => "dict",
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::int(i)
    }
}
impl From<usize> for Value {
    fn from(i: usize) -> Self {
        Value::Int(i.to_string())
    }
}
impl From<Object> for Value {
    fn from(o: Object) -> Self {
        Value::Object(o)
    }
}
impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Self {
        Value::Array(a)
    }
}

/// A float that `allow_nan=False` refuses (Starlette's response writer raises → HTTP 500).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("Out of range float values are not JSON compliant")]
pub struct NonFiniteFloat;

/// `json.dumps(v, ensure_ascii=False)`: separators `", "` and `": "`, NaN/Infinity allowed.
// decider-contract R1.3.2
pub fn dumps(v: &Value) -> String {
    let mut out = String::new();
    // allow_nan=true cannot fail
    let _ = write_json(&mut out, v, ", ", ": ", true);
    out
}

/// `json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(",", ":"))`: the HTTP response body.
// decider-contract R4.3.2
pub fn dumps_compact(v: &Value) -> Result<String, NonFiniteFloat> {
    let mut out = String::new();
    write_json(&mut out, v, ",", ":", false)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    v: &Value,
    item: &str,
    kv: &str,
    allow_nan: bool,
) -> Result<(), NonFiniteFloat> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Int(d) => out.push_str(d),
        Value::Float(f) => {
            if !f.is_finite() && !allow_nan {
                return Err(NonFiniteFloat);
            }
            out.push_str(&json_float(*f));
        }
        Value::Str(s) => write_json_str(out, s),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                write_json(out, x, item, kv, allow_nan)?;
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                write_json_str(out, k);
                out.push_str(kv);
                write_json(out, x, item, kv, allow_nan)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// The output of [`dumps_capped`] reached its byte cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capped;

/// `json.dumps(annotate_indices(v) if annotate else v, ensure_ascii=False)` written into `out` until it holds more than
/// `cap` bytes: `Err(Capped)` then, with `out` a prefix of the full text (cut anywhere, at a char boundary) and the
/// rest never built. `annotate` applies decider's `annotate_indices` on the fly (arrays of at least
/// [`ANNOTATE_MIN`] elements get `{"_index": i, ...}` elements, decider-contract R1.2.2), so a long array costs no
/// copy of itself. Below the cap the text is byte-identical to [`dumps`] of the annotated value.
pub fn dumps_capped(out: &mut String, v: &Value, annotate: bool, cap: usize) -> Result<(), Capped> {
    Capper { out, cap, annotate }.value(v)
}

/// Arrays at least this long get `_index` annotations (decider-contract R1.2.2).
pub const ANNOTATE_MIN: usize = 8;

struct Capper<'a> {
    out: &'a mut String,
    cap: usize,
    annotate: bool,
}

impl Capper<'_> {
    fn push(&mut self, s: &str) -> Result<(), Capped> {
        let room = self.cap.saturating_sub(self.out.len());
        if s.len() <= room {
            self.out.push_str(s);
            return Ok(());
        }
        let mut end = room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(&s[..end]);
        Err(Capped)
    }

    fn string(&mut self, s: &str) -> Result<(), Capped> {
        // Escape in bounded pieces so a huge string is cut without being copied whole.
        let mut piece = String::new();
        let mut rest = s;
        while !rest.is_empty() {
            let mut end = rest.len().min(4096);
            while !rest.is_char_boundary(end) {
                end += 1;
            }
            piece.clear();
            write_json_str_body(&mut piece, &rest[..end]);
            self.push(&piece)?;
            rest = &rest[end..];
        }
        Ok(())
    }

    fn key_str(&mut self, s: &str) -> Result<(), Capped> {
        self.push("\"")?;
        self.string(s)?;
        self.push("\"")
    }

    fn value(&mut self, v: &Value) -> Result<(), Capped> {
        match v {
            Value::Null => self.push("null"),
            Value::Bool(true) => self.push("true"),
            Value::Bool(false) => self.push("false"),
            Value::Int(d) => self.push(d),
            Value::Float(f) => self.push(&json_float(*f)),
            Value::Str(s) => self.key_str(s),
            Value::Array(a) if self.annotate && a.len() >= ANNOTATE_MIN => {
                self.push("[")?;
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        self.push(", ")?;
                    }
                    self.annotated(i, x)?;
                }
                self.push("]")
            }
            Value::Array(a) => {
                self.push("[")?;
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        self.push(", ")?;
                    }
                    self.value(x)?;
                }
                self.push("]")
            }
            Value::Object(o) => {
                self.push("{")?;
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        self.push(", ")?;
                    }
                    self.key_str(k)?;
                    self.push(": ")?;
                    self.value(x)?;
                }
                self.push("}")
            }
        }
    }

    /// Element `i` of an annotated array: `{"_index": i, **d}` for an object `d` (an `"_index"` of `d` replaces the
    /// value but stays first), else `{"_index": i, "value": x}`.
    fn annotated(&mut self, i: usize, x: &Value) -> Result<(), Capped> {
        self.push("{\"_index\": ")?;
        match x {
            Value::Object(d) => {
                match d.get("_index") {
                    Some(own) => self.value(own)?,
                    None => self.push(&i.to_string())?,
                }
                for (k, v) in d.iter().filter(|(k, _)| k.as_str() != "_index") {
                    self.push(", ")?;
                    self.key_str(k)?;
                    self.push(": ")?;
                    self.value(v)?;
                }
            }
            other => {
                self.push(&i.to_string())?;
                self.push(", \"value\": ")?;
                self.value(other)?;
            }
        }
        self.push("}")
    }
}

/// A float as `json.dumps` writes it: `float.__repr__`, with `NaN`, `Infinity`, `-Infinity`.
pub fn json_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(f)
    }
}

/// A JSON string literal with `ensure_ascii=False` escapes (`\u00xx` lowercase for other controls).
pub fn write_json_str(out: &mut String, s: &str) {
    out.push('"');
    write_json_str_body(out, s);
    out.push('"');
}

/// The escaped characters of a JSON string literal, without its quotes.
fn write_json_str_body(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Python `repr()` of a `str`.
// decider-contract R1.4.3
pub fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        let cp = c as u32;
        match c {
            _ if c == quote || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ if cp < 0x20 || cp == 0x7f => {
                let _ = write!(out, "\\x{cp:02x}");
            }
            _ if cp < 0x7f => out.push(c),
            _ if !number::in_ranges(unicode::NOT_PRINTABLE, cp) => out.push(c),
            _ if cp <= 0xff => {
                let _ = write!(out, "\\x{cp:02x}");
            }
            _ if cp <= 0xffff => {
                let _ = write!(out, "\\u{cp:04x}");
            }
            _ => {
                let _ = write!(out, "\\U{cp:08x}");
            }
        }
    }
    out.push(quote);
    out
}

/// Python `repr()` of a value as `json.loads` returns it (`None`, `True`, `'a'`, `{'k': [1, 2.0]}`).
pub fn py_repr(v: &Value) -> String {
    match v {
        Value::Str(s) => repr_str(s),
        other => py_str(other),
    }
}

/// Python `str()` of a value: a string is itself, everything else its repr.
// decider-contract R1.5.1
pub fn py_str(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(d) => d.clone(),
        Value::Float(f) => float_repr(*f),
        Value::Str(s) => s.clone(),
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(py_repr).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(o) => {
            let parts: Vec<String> = o
                .iter()
                .map(|(k, x)| format!("{}: {}", repr_str(k), py_repr(x)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// Build an [`Object`] from pairs (later duplicates update in place, as a Python dict literal does).
pub fn obj<I, K>(pairs: I) -> Value
where
    I: IntoIterator<Item = (K, Value)>,
    K: Into<String>,
{
    let mut o = Object::new();
    for (k, v) in pairs {
        o.insert(k.into(), v);
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_matches_python() {
        let v = loads(r#"{"a": 1, "b": [true, null, 1.0, 1e16, 12345678901234567890, -0, -0.0, "x\u0001\"\\/\n\u2028é\u007f"], "c": {}, "d": []}"#)
            .expect("valid");
        assert_eq!(
            dumps(&v),
            "{\"a\": 1, \"b\": [true, null, 1.0, 1e+16, 12345678901234567890, 0, -0.0, \"x\\u0001\\\"\\\\/\\n\u{2028}é\u{7f}\"], \"c\": {}, \"d\": []}"
        );
        assert_eq!(
            dumps(&loads("[NaN, Infinity, -Infinity, 1E400]").expect("valid")),
            "[NaN, Infinity, -Infinity, Infinity]"
        );
        assert_eq!(
            dumps_compact(&loads(r#"{"a": [1, 2]}"#).expect("valid")).expect("finite"),
            r#"{"a":[1,2]}"#
        );
        assert!(dumps_compact(&Value::Float(f64::NAN)).is_err());
        assert_eq!(
            dumps(&Value::str("\u{8}\u{c}\u{1f}\r\t")),
            r#""\b\f\u001f\r\t""#
        );
    }

    #[test]
    fn duplicate_keys_keep_first_position() {
        let v = loads(r#"{"a":1,"b":2,"a":3}"#).expect("valid");
        assert_eq!(dumps(&v), r#"{"a": 3, "b": 2}"#);
    }

    #[test]
    fn repr_and_str() {
        let v = loads(r#"[null, true, false, 1, 1.0, 1e16, "a'b", "a'b\"", {"k": null, "l": [1, "x"]}, "\u0000\u00a0é\u200b"]"#)
            .expect("valid");
        let Value::Array(items) = &v else { panic!() };
        let strs: Vec<String> = items.iter().map(py_str).collect();
        assert_eq!(
            strs,
            [
                "None",
                "True",
                "False",
                "1",
                "1.0",
                "1e+16",
                "a'b",
                "a'b\"",
                "{'k': None, 'l': [1, 'x']}",
                "\u{0}\u{a0}é\u{200b}"
            ]
        );
        assert_eq!(py_repr(&items[6]), "\"a'b\"");
        assert_eq!(py_repr(&items[7]), "'a\\'b\"'");
        assert_eq!(py_repr(&items[9]), "'\\x00\\xa0é\\u200b'");
        assert_eq!(
            repr_str("\u{1F600}\u{E0001}\\"),
            "'\u{1F600}\\U000e0001\\\\'"
        );
    }
}

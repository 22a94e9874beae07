//! `json.loads` as CPython 3.11's C scanner runs it, including its error messages and character offsets.

use super::{Object, Value};

/// Python's `json.JSONDecodeError`: `msg` and the character offset `pos` (FastAPI reports both in a 422).
// decider-contract R1.1.1
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{msg}: char {pos}")]
pub struct JsonDecodeError {
    pub msg: String,
    pub pos: usize,
}

/// Why a request body could not be read as JSON.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BodyError {
    /// `json.JSONDecodeError` → FastAPI 422 `json_invalid`.
    #[error(transparent)]
    Decode(#[from] JsonDecodeError),
    /// Anything else `json.loads` raises (bad UTF-8, an integer over 4300 digits, nesting too deep) → FastAPI 400
    /// `There was an error parsing the body`.
    #[error("There was an error parsing the body: {0}")]
    Other(String),
    /// onepass-only: more than [`MAX_VALUES`] values (→ 413). The reference parses any number; onepass stops, so a
    /// small compressed body cannot make the server build gigabytes of values (docs/systemone.md, "Divergences").
    #[error("the body holds more than {MAX_VALUES} JSON values")]
    TooManyValues,
}

/// Most values (numbers, strings, arrays, objects, literals, keys excluded) one body may hold: about 200 MB of parsed
/// values at most, and twice a million-element state.
pub const MAX_VALUES: usize = 2_000_000;

/// Python's default `sys.int_max_str_digits`.
const INT_MAX_STR_DIGITS: usize = 4300;
/// Nesting limit (Python's is its recursion limit, about 1000 frames; onepass stops earlier, with the same 400).
const MAX_DEPTH: usize = 512;

/// `json.loads(body)` for the bytes of a request body: the encoding is detected as `json.detect_encoding` does
/// (UTF-8, UTF-8 with BOM, UTF-16/32 with or without BOM).
pub fn decode_body(body: &[u8]) -> Result<Value, BodyError> {
    let text = decode_text(body)?;
    parse(&text.chars().collect::<Vec<char>>())
}

/// `json.loads(text)` for a `str`.
pub fn loads(text: &str) -> Result<Value, BodyError> {
    let chars: Vec<char> = text.chars().collect();
    if chars.first() == Some(&'\u{feff}') {
        return Err(JsonDecodeError {
            msg: "Unexpected UTF-8 BOM (decode using utf-8-sig)".into(),
            pos: 0,
        }
        .into());
    }
    parse(&chars)
}

/// The whole document `s` as one JSON value.
fn parse(s: &[char]) -> Result<Value, BodyError> {
    Parser {
        s,
        depth: 0,
        values: 0,
        lone_surrogate: None,
    }
    .document()
}

fn decode_text(b: &[u8]) -> Result<String, BodyError> {
    let bad = |what: &str| BodyError::Other(format!("body is not valid {what}"));
    let utf16 = |b: &[u8], be: bool| -> Result<String, BodyError> {
        if b.len() & 1 != 0 {
            return Err(bad("UTF-16"));
        }
        let units = b.chunks(2).map(|c| {
            if be {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        });
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map_err(|_| bad("UTF-16"))
    };
    let utf32 = |b: &[u8], be: bool| -> Result<String, BodyError> {
        if b.len() & 3 != 0 {
            return Err(bad("UTF-32"));
        }
        b.chunks(4)
            .map(|c| {
                let u = if be {
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                } else {
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]])
                };
                char::from_u32(u).ok_or_else(|| bad("UTF-32"))
            })
            .collect()
    };
    if b.starts_with(&[0, 0, 0xfe, 0xff]) {
        return utf32(&b[4..], true);
    }
    if b.starts_with(&[0xff, 0xfe, 0, 0]) {
        return utf32(&b[4..], false);
    }
    if b.starts_with(&[0xfe, 0xff]) {
        return utf16(&b[2..], true);
    }
    if b.starts_with(&[0xff, 0xfe]) {
        return utf16(&b[2..], false);
    }
    if b.starts_with(&[0xef, 0xbb, 0xbf]) {
        return std::str::from_utf8(&b[3..])
            .map(str::to_string)
            .map_err(|_| bad("UTF-8"));
    }
    if b.len() >= 4 {
        if b[0] == 0 {
            return if b[1] != 0 {
                utf16(b, true)
            } else {
                utf32(b, true)
            };
        }
        if b[1] == 0 {
            return if b[2] != 0 || b[3] != 0 {
                utf16(b, false)
            } else {
                utf32(b, false)
            };
        }
    } else if b.len() == 2 {
        if b[0] == 0 {
            return utf16(b, true);
        }
        if b[1] == 0 {
            return utf16(b, false);
        }
    }
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| bad("UTF-8"))
}

struct Parser<'a> {
    s: &'a [char],
    depth: usize,
    /// Values scanned so far ([`MAX_VALUES`]).
    values: usize,
    /// A `\\uD800`-style lone surrogate was decoded. Python keeps it in the str; a Rust String cannot, so the
    /// document is refused once it has otherwise parsed (later syntax errors still win, as in Python).
    lone_surrogate: Option<u32>,
}

/// `scan_once` found no value at this offset (Python's StopIteration → "Expecting value").
enum Fail {
    NoValue(usize),
    Err(BodyError),
}

impl From<JsonDecodeError> for Fail {
    fn from(e: JsonDecodeError) -> Self {
        Fail::Err(e.into())
    }
}

fn err(msg: &str, pos: usize) -> Fail {
    Fail::Err(
        JsonDecodeError {
            msg: msg.into(),
            pos,
        }
        .into(),
    )
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

impl Parser<'_> {
    fn document(&mut self) -> Result<Value, BodyError> {
        let start = self.skip_ws(0);
        let (v, end) = match self.scan(start) {
            Ok(x) => x,
            Err(Fail::NoValue(pos)) => {
                return Err(JsonDecodeError {
                    msg: "Expecting value".into(),
                    pos,
                }
                .into())
            }
            Err(Fail::Err(e)) => return Err(e),
        };
        let end = self.skip_ws(end);
        if end != self.s.len() {
            return Err(JsonDecodeError {
                msg: "Extra data".into(),
                pos: end,
            }
            .into());
        }
        if let Some(u) = self.lone_surrogate {
            return Err(BodyError::Other(format!(
                "lone surrogate \\u{u:04x} in a string"
            )));
        }
        Ok(v)
    }

    fn skip_ws(&self, mut i: usize) -> usize {
        while i < self.s.len() && is_ws(self.s[i]) {
            i += 1;
        }
        i
    }

    fn starts(&self, i: usize, word: &str) -> bool {
        let w: Vec<char> = word.chars().collect();
        self.s.len() >= i + w.len() && self.s[i..i + w.len()] == w[..]
    }

    /// scan_once_unicode: one value at `i` → (value, end offset).
    fn scan(&mut self, i: usize) -> Result<(Value, usize), Fail> {
        let Some(&c) = self.s.get(i) else {
            return Err(Fail::NoValue(i));
        };
        self.values += 1;
        if self.values > MAX_VALUES {
            return Err(Fail::Err(BodyError::TooManyValues));
        }
        match c {
            '"' => {
                let (s, end) = self.string(i + 1)?;
                Ok((Value::Str(s), end))
            }
            '{' | '[' => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(Fail::Err(BodyError::Other("JSON nested too deeply".into())));
                }
                let r = if c == '{' {
                    self.object(i + 1)
                } else {
                    self.array(i + 1)
                };
                self.depth -= 1;
                r
            }
            'n' if self.starts(i, "null") => Ok((Value::Null, i + 4)),
            't' if self.starts(i, "true") => Ok((Value::Bool(true), i + 4)),
            'f' if self.starts(i, "false") => Ok((Value::Bool(false), i + 5)),
            'N' if self.starts(i, "NaN") => Ok((Value::Float(f64::NAN), i + 3)),
            'I' if self.starts(i, "Infinity") => Ok((Value::Float(f64::INFINITY), i + 8)),
            '-' if self.starts(i, "-Infinity") => Ok((Value::Float(f64::NEG_INFINITY), i + 9)),
            _ => self.number(i),
        }
    }

    /// _match_number_unicode: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, ASCII digits only.
    fn number(&self, start: usize) -> Result<(Value, usize), Fail> {
        let s = self.s;
        let n = s.len();
        let digit = |i: usize| i < n && s[i].is_ascii_digit();
        let mut i = start;
        if i < n && s[i] == '-' {
            i += 1;
        }
        if i < n && ('1'..='9').contains(&s[i]) {
            while digit(i) {
                i += 1;
            }
        } else if i < n && s[i] == '0' {
            i += 1;
        } else {
            return Err(Fail::NoValue(start));
        }
        let mut is_float = false;
        if i + 1 < n && s[i] == '.' && s[i + 1].is_ascii_digit() {
            i += 2;
            while digit(i) {
                i += 1;
            }
            is_float = true;
        }
        if i < n && (s[i] == 'e' || s[i] == 'E') {
            let save = i;
            i += 1;
            if i < n && (s[i] == '-' || s[i] == '+') {
                i += 1;
            }
            let d = i;
            while digit(i) {
                i += 1;
            }
            if i == d {
                i = save;
            } else {
                is_float = true;
            }
        }
        let text: String = s[start..i].iter().collect();
        if is_float {
            let f: f64 = text
                .parse()
                .map_err(|_| Fail::Err(BodyError::Other(format!("bad float {text}"))))?;
            return Ok((Value::Float(f), i));
        }
        let neg = text.starts_with('-');
        let digits = text.trim_start_matches('-');
        if digits.len() > INT_MAX_STR_DIGITS {
            return Err(Fail::Err(BodyError::Other(format!(
                "Exceeds the limit ({INT_MAX_STR_DIGITS} digits) for integer string conversion: value has {} digits",
                digits.len()
            ))));
        }
        let canon = if neg && digits != "0" {
            format!("-{digits}")
        } else {
            digits.to_string()
        };
        Ok((Value::Int(canon), i))
    }

    /// scanstring_unicode: `i` is just after the opening quote.
    fn string(&mut self, mut end: usize) -> Result<(String, usize), Fail> {
        let s = self.s;
        let len = s.len();
        let begin = end - 1;
        let mut out = String::new();
        loop {
            let mut next = end;
            let mut c = '\0';
            while next < len {
                c = s[next];
                if c == '"' || c == '\\' {
                    break;
                } else if (c as u32) <= 0x1f {
                    return Err(err("Invalid control character at", next));
                }
                next += 1;
            }
            if next >= len || !(c == '"' || c == '\\') {
                return Err(err("Unterminated string starting at", begin));
            }
            out.extend(&s[end..next]);
            next += 1;
            if c == '"' {
                end = next;
                break;
            }
            if next == len {
                return Err(err("Unterminated string starting at", begin));
            }
            let c = s[next];
            if c != 'u' {
                end = next + 1;
                let r = match c {
                    '"' => '"',
                    '\\' => '\\',
                    '/' => '/',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    _ => return Err(err("Invalid \\escape", end - 2)),
                };
                out.push(r);
            } else {
                next += 1;
                end = next + 4;
                if end >= len {
                    return Err(err("Invalid \\uXXXX escape", next - 1));
                }
                let mut u = self
                    .hex4(next)
                    .ok_or_else(|| err("Invalid \\uXXXX escape", end - 5))?;
                next = end;
                if (0xd800..0xdc00).contains(&u)
                    && end + 6 < len
                    && s[next] == '\\'
                    && s[next + 1] == 'u'
                {
                    let u2 = self
                        .hex4(next + 2)
                        .ok_or_else(|| err("Invalid \\uXXXX escape", end + 1))?;
                    if (0xdc00..0xe000).contains(&u2) {
                        u = 0x10000 + ((u - 0xd800) << 10) + (u2 - 0xdc00);
                        end += 6;
                    }
                }
                match char::from_u32(u) {
                    Some(ch) => out.push(ch),
                    // Python keeps a lone surrogate in the str; a Rust String cannot (docs/systemone.md).
                    None => {
                        self.lone_surrogate.get_or_insert(u);
                        out.push('\u{fffd}');
                    }
                }
            }
        }
        Ok((out, end))
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let mut u = 0u32;
        for k in 0..4 {
            u = (u << 4) | self.s.get(i + k)?.to_digit(16)?;
        }
        Some(u)
    }

    fn object(&mut self, start: usize) -> Result<(Value, usize), Fail> {
        let mut o = Object::new();
        let end = self.items(start, '}', |p, i| {
            let s = p.s;
            if i >= s.len() || s[i] != '"' {
                return Err(err("Expecting property name enclosed in double quotes", i));
            }
            let (key, end) = p.string(i + 1)?;
            let i = p.skip_ws(end);
            if i >= s.len() || s[i] != ':' {
                return Err(err("Expecting ':' delimiter", i));
            }
            let (v, end) = p.scan(p.skip_ws(i + 1))?;
            // decider-contract R1.1.1: last value wins, first position kept (IndexMap::insert).
            o.insert(key, v);
            Ok(end)
        })?;
        Ok((Value::Object(o), end))
    }

    fn array(&mut self, start: usize) -> Result<(Value, usize), Fail> {
        let mut a = Vec::new();
        let end = self.items(start, ']', |p, i| {
            let (v, end) = p.scan(i)?;
            a.push(v);
            Ok(end)
        })?;
        Ok((Value::Array(a), end))
    }

    /// The comma-separated items of an object or array from just after its opening bracket to `close`: `item` reads
    /// one from its first non-space character → where it ends. → the position after `close`
    fn items(
        &mut self,
        start: usize,
        close: char,
        mut item: impl FnMut(&mut Self, usize) -> Result<usize, Fail>,
    ) -> Result<usize, Fail> {
        let s = self.s;
        let n = s.len();
        let mut i = self.skip_ws(start);
        if i < n && s[i] == close {
            return Ok(i + 1);
        }
        loop {
            let end = item(self, i)?;
            i = self.skip_ws(end);
            if i < n && s[i] == close {
                return Ok(i + 1);
            }
            if i >= n || s[i] != ',' {
                return Err(err("Expecting ',' delimiter", i));
            }
            i = self.skip_ws(i + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(text: &str) -> (String, usize) {
        match loads(text) {
            Err(BodyError::Decode(JsonDecodeError { msg, pos })) => (msg, pos),
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn errors_match_python() {
        for (text, msg, pos) in [
            ("", "Expecting value", 0),
            ("{", "Expecting property name enclosed in double quotes", 1),
            ("{\"a\" 1}", "Expecting ':' delimiter", 5),
            ("{\"a\":1 \"b\"}", "Expecting ',' delimiter", 7),
            ("{\"a\":}", "Expecting value", 5),
            ("[1,]", "Expecting value", 3),
            (
                "{\"a\":1,}",
                "Expecting property name enclosed in double quotes",
                7,
            ),
            ("1 2", "Extra data", 2),
            ("\"abc", "Unterminated string starting at", 0),
            ("\"a\u{1}\"", "Invalid control character at", 2),
            ("\"\\x\"", "Invalid \\escape", 1),
            ("\"\\u12\"", "Invalid \\uXXXX escape", 2),
            ("\"\\ud800\\u12x\"", "Invalid \\uXXXX escape", 8),
            ("é x", "Expecting value", 0),
            ("[é]", "Expecting value", 1),
            ("01", "Extra data", 1),
            ("-", "Expecting value", 0),
        ] {
            assert_eq!(e(text), (msg.to_string(), pos), "{text:?}");
        }
    }

    #[test]
    fn value_count_is_capped() {
        let body = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        // the array itself is one value
        assert!(loads(&body(MAX_VALUES - 1)).is_ok());
        assert_eq!(loads(&body(MAX_VALUES)), Err(BodyError::TooManyValues));
        // keys are not values
        let keys: Vec<String> = (0..MAX_VALUES / 2).map(|i| format!("\"k{i}\":0")).collect();
        assert!(loads(&format!("{{{}}}", keys.join(","))).is_ok());
    }

    #[test]
    fn values() {
        assert_eq!(loads("-0").ok(), Some(Value::Int("0".into())));
        assert_eq!(loads("1e2").ok(), Some(Value::Float(100.0)));
        assert_eq!(
            loads("\"\\ud83d\\ude00\"").ok(),
            Some(Value::str("\u{1F600}"))
        );
        assert!(matches!(loads("\"\\ud800\""), Err(BodyError::Other(_))));
        let big = "9".repeat(4301);
        assert!(matches!(loads(&big), Err(BodyError::Other(_))));
        assert_eq!(
            loads(&"9".repeat(4300)).ok(),
            Some(Value::Int("9".repeat(4300)))
        );
        assert_eq!(
            decode_body(b"\xef\xbb\xbf[1]").ok(),
            Some(Value::Array(vec![Value::int(1)]))
        );
    }
}

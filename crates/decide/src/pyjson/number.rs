//! Python's float text forms: `float.__repr__`, `round(x, n)` and `float(str)`.

use super::repr_str;
use super::unicode::{DIGIT_ZEROS, SPACE};

/// Python `repr(x)` / `str(x)` of a float: the shortest digits that round-trip, positional when
/// `1e-4 <= |x| < 1e16`, scientific (`1e+16`, `1e-05`) otherwise; `inf`, `-inf`, `nan`.
// decider-contract R1.3.2
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` prints the shortest round-trip digits (same digit string as David Gay's mode 0).
    let sci = format!("{:e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1; // value = 0.DIGITS * 10^decpt
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if -4 < decpt && decpt <= 16 {
        let n = digits.len() as i32;
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else if decpt >= n {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

/// Python `round(x, nd)` for a float and `0 <= nd <= 17`: the exact binary value rounded to `nd` decimal places,
/// ties to even, then read back as the nearest double (CPython `double_round`: dtoa mode 3, then strtod).
// decider-contract R4.3.1
pub fn py_round(x: f64, nd: u32) -> f64 {
    assert!(nd <= 17, "py_round supports 0..=17 decimal places");
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let bits = x.to_bits();
    let exp_bits = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    let (m, e) = if exp_bits == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp_bits - 1075)
    };
    if e >= 0 {
        return x; // an integer already
    }
    let k = (-e) as u32;
    let n = (m as u128) * 10u128.pow(nd); // < 2^53 * 10^17 < 2^110
    let q = if k >= 120 {
        0 // n < 2^110 <= 2^(k-1): below half a unit
    } else {
        let q = n >> k;
        let rem = n & ((1u128 << k) - 1);
        let half = 1u128 << (k - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    let text = format!("{}{}e-{}", if x < 0.0 { "-" } else { "" }, q, nd);
    text.parse().unwrap_or(x)
}

/// `str.isspace()` (also `re`'s Unicode `\s`).
pub fn is_py_space(c: char) -> bool {
    in_ranges(SPACE, c as u32)
}

/// The value of a Unicode decimal digit (`str.isdecimal()`, `re`'s Unicode `\d`), else `None`.
pub fn py_decimal(c: char) -> Option<u32> {
    let cp = c as u32;
    let i = DIGIT_ZEROS.partition_point(|&z| z <= cp);
    if i == 0 {
        return None;
    }
    let z = DIGIT_ZEROS[i - 1];
    (cp - z < 10).then_some(cp - z)
}

pub(crate) fn in_ranges(table: &[(u32, u32)], cp: u32) -> bool {
    let i = table.partition_point(|&(lo, _)| lo <= cp);
    i > 0 && cp <= table[i - 1].1
}

/// `float(s)` failed: Display is Python's `ValueError` message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("could not convert string to float: {repr}")]
pub struct FloatParseError {
    /// Python `repr` of the rejected string.
    pub repr: String,
}

/// Python `float(s)` for a `str`: surrounding Unicode whitespace, non-ASCII decimal digits, `+`/`-`, `.5`, `5.`,
/// exponents, single underscores between digits, and `inf`/`infinity`/`nan` in any case.
// decider-contract R1.6.1
pub fn py_float(s: &str) -> Result<f64, FloatParseError> {
    let err = || FloatParseError { repr: repr_str(s) };
    // _PyUnicode_TransformDecimalAndSpaceToASCII
    let t: String = s
        .chars()
        .map(|c| {
            if (c as u32) < 127 {
                c // ASCII stays as is: \x1c..\x1f are str.isspace() but not C isspace, so they stay and fail
            } else if is_py_space(c) {
                ' '
            } else if let Some(d) = py_decimal(c) {
                char::from(b'0' + d as u8)
            } else {
                '?'
            }
        })
        .collect();
    // _Py_string_to_number_with_underscores
    let t = if t.contains('_') {
        let mut out = String::with_capacity(t.len());
        let mut prev = '\0';
        for c in t.chars() {
            if c == '_' {
                if !prev.is_ascii_digit() {
                    return Err(err());
                }
            } else {
                if prev == '_' && !c.is_ascii_digit() {
                    return Err(err());
                }
                out.push(c);
            }
            prev = c;
        }
        if prev == '_' {
            return Err(err());
        }
        out
    } else {
        t
    };
    let body = t.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
    if body.is_empty() || body.contains('\0') {
        return Err(err());
    }
    let (neg, unsigned) = match body.as_bytes()[0] {
        b'-' => (true, &body[1..]),
        b'+' => (false, &body[1..]),
        _ => (false, body),
    };
    let lower = unsigned.to_ascii_lowercase();
    let v = if lower == "inf" || lower == "infinity" {
        f64::INFINITY
    } else if lower == "nan" {
        f64::NAN
    } else if is_decimal_literal(unsigned) {
        unsigned.parse::<f64>().map_err(|_| err())?
    } else {
        return Err(err());
    };
    Ok(if neg { -v } else { v })
}

/// `digits [. digits?] | . digits`, then an optional `[eE][+-]?digits` (ASCII only).
fn is_decimal_literal(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    let mut frac_digits = 0;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let f = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - f;
    }
    if int_digits + frac_digits == 0 {
        return false;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let e = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == e {
            return false;
        }
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_matches_python() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (0.0001, "0.0001"),
            (1e-05, "1e-05"),
            (1.5e-07, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234567e19, "1.2345678901234567e+19"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (0.1 + 0.2, "0.30000000000000004"),
            (123.456, "123.456"),
            (-2.5e-5, "-2.5e-05"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "nan"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.00012, "0.00012"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(*x), *want, "{x:e}");
        }
    }

    #[test]
    fn round_matches_python() {
        assert_eq!(py_round(0.125, 2), 0.12);
        assert_eq!(py_round(0.375, 2), 0.38);
        assert_eq!(py_round(2.675, 2), 2.67);
        assert_eq!(py_round(0.12345, 4), 0.1235); // 0.12345 is above the tie in binary
        assert_eq!(py_round(0.00005, 4), 0.0001); // 5.0000000000000002396e-05
        assert_eq!(py_round(0.5, 0), 0.0);
        assert_eq!(py_round(1.5, 0), 2.0);
        assert_eq!(float_repr(py_round(-0.00001, 4)), "-0.0");
        assert_eq!(py_round(1.0, 4), 1.0);
        assert_eq!(py_round(5e-324, 4), 0.0);
        assert_eq!(py_round(0.99995, 4), 1.0); // 0.99995000000000000551
        assert_eq!(py_round(1.23456789e10, 2), 1.23456789e10);
    }

    #[test]
    fn float_parse_matches_python() {
        let ok: &[(&str, f64)] = &[
            ("1", 1.0),
            (" 2.5 ", 2.5),
            ("\u{3000}3\u{a0}", 3.0),
            ("+4", 4.0),
            (".5", 0.5),
            ("5.", 5.0),
            ("1e2", 100.0),
            ("1E-2", 0.01),
            ("1_0", 10.0),
            ("1_000.000_1", 1000.0001),
            ("\u{663}", 3.0),
            ("-inf", f64::NEG_INFINITY),
            ("InFiNiTy", f64::INFINITY),
            ("1e400", f64::INFINITY),
            ("-0", -0.0),
        ];
        for (s, want) in ok {
            let v = py_float(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            assert_eq!(v.to_bits(), want.to_bits(), "{s:?}");
        }
        assert!(py_float("NaN").is_ok_and(f64::is_nan));
        for bad in [
            "", " ", "abc", "1__0", "_1", "1_", "1_.5", "1e", "e1", ".", "0x10", "1 2", "in_f",
            "infinit", "١x",
        ] {
            assert!(py_float(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            py_float("abc").unwrap_err().to_string(),
            "could not convert string to float: 'abc'"
        );
        assert_eq!(
            py_float("it's").unwrap_err().to_string(),
            "could not convert string to float: \"it's\""
        );
    }

    #[test]
    fn unicode_classes() {
        assert!(is_py_space('\u{1c}'));
        assert!(is_py_space('\u{3000}'));
        assert!(!is_py_space('\u{200b}'));
        assert_eq!(py_decimal('\u{663}'), Some(3));
        assert_eq!(py_decimal('7'), Some(7));
        assert_eq!(py_decimal('x'), None);
        assert_eq!(py_decimal('\u{b2}'), None); // superscript two is a digit, not a decimal
    }
}

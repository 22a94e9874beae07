//! The prompt as text (decider/systemone.py without the model): the state text, each question's text and options,
//! isolated Score levels, and which questions share a row ([`plan_rows`], the rows as text). Their token ids are
//! [`super::tokens`]'s.

use crate::error::RenderError;
use crate::pyjson::{dumps, is_py_space, py_decimal, py_float, py_str, repr_str, Object, Value};

pub const MAX_CHOICE: usize = 255;
pub const MAX_LEVELS: usize = 10;
pub use crate::pyjson::ANNOTATE_MIN;
/// The question text of a noul question without instructions (decider-contract R1.7.3).
pub const NOUL_WITHOUT_INSTRUCTIONS: &str = "Which answer fits the context?";

/// The answer type of a question (`bool` is reported as `noul`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    Choice,
    Noul,
    Score,
}

impl QType {
    pub fn as_str(self) -> &'static str {
        match self {
            QType::Choice => "choice",
            QType::Noul => "noul",
            QType::Score => "score",
        }
    }
}

/// `render_question` output (decider-contract R1.4.4).
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedQuestion {
    /// Instructions text as shown to the model.
    pub question: String,
    /// Option lines in label order.
    pub options: Vec<String>,
    pub qtype: QType,
    /// What the answer reports per option: Choice names; Score `"0".."n-1"`; Noul `"False"`, `"True"`.
    pub names: Vec<String>,
    /// Score only: `_txt` of each level.
    pub legend: Option<Vec<String>>,
    /// `bool(spec.get("isolated", True))`.
    pub isolated: bool,
}

/// `_txt(v)`: a string as is, anything else `json.dumps(v, ensure_ascii=False)`.
// decider-contract R1.3.1
pub fn txt(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        other => dumps(other),
    }
}

/// `annotate_indices(x)`: long arrays get `{"_index": i, ...}` elements.
// decider-contract R1.2.2
pub fn annotate_indices(x: &Value) -> Value {
    match x {
        Value::Array(a) if a.len() >= ANNOTATE_MIN => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, v)| {
                    let mut o = Object::new();
                    o.insert("_index".into(), Value::from(i));
                    match annotate_indices(v) {
                        // {"_index": i, **d}: an existing "_index" overwrites the value but stays first.
                        Value::Object(d) => {
                            for (k, x) in d {
                                o.insert(k, x);
                            }
                        }
                        other => {
                            o.insert("value".into(), other);
                        }
                    }
                    Value::Object(o)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(annotate_indices).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), annotate_indices(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `render_state(state)`: a string verbatim, else `json.dumps(annotate_indices(state))`.
// decider-contract R1.2.1
pub fn render_state(state: &Value) -> String {
    match state {
        Value::Str(s) => s.clone(),
        other => dumps(&annotate_indices(other)),
    }
}

/// Python `spec.get(a, spec.get(b))` for JSON: the fallback only when `a` is absent.
fn get2<'a>(spec: &'a Object, a: &str, b: &str) -> Option<&'a Value> {
    spec.get(a).or_else(|| spec.get(b))
}

/// `render_question(spec)` with the reference's checks in the reference's order.
// decider-contract R1.4-R1.7
pub fn render_question(spec: &Object) -> Result<RenderedQuestion, RenderError> {
    // R1.4.1: absent type → "choice"; present-but-null stays null (→ unknown type).
    let t = spec
        .get("type")
        .cloned()
        .unwrap_or_else(|| Value::str("choice"));
    let ts = t.as_str();
    let crit = get2(spec, "criteria", "options")
        .cloned()
        .unwrap_or(Value::Null);
    let raw = spec
        .get("instructions")
        .or_else(|| spec.get("question"))
        .cloned()
        .unwrap_or_else(|| Value::str(""));
    let is_noul = matches!(ts, Some("noul") | Some("bool"));
    // R1.4.2 / R1.7.3
    let ins = if is_noul && raw.is_none_or_empty_str() {
        let described = match &crit {
            Value::Object(c) => [c.get("true"), c.get("false")]
                .into_iter()
                .flatten()
                .any(|d| !d.is_none_or_empty_str()),
            _ => false,
        };
        if !described && matches!(crit, Value::Null | Value::Object(_)) {
            return Err(RenderError::NoulWithoutDescription);
        }
        NOUL_WITHOUT_INSTRUCTIONS.to_string()
    } else {
        txt(&raw)
    };
    if ins.is_empty() {
        return Err(RenderError::NoInstructions);
    }
    let isolated = spec.get("isolated").is_none_or(Value::truthy); // R1.4.4
    match ts {
        Some("choice") => {
            // R1.5.1: list form → {str(c): None}; duplicates collapse at their first position.
            let crit = match crit {
                Value::Array(a) => {
                    Value::Object(a.iter().map(|c| (py_str(c), Value::Null)).collect())
                }
                other => other,
            };
            let Value::Object(c) = crit else {
                return Err(RenderError::ChoiceCriteria);
            };
            if !(2..=MAX_CHOICE).contains(&c.len()) {
                return Err(RenderError::ChoiceCriteria); // R1.5.3
            }
            // R1.5.4: only null and "" give a bare name.
            let options = c
                .iter()
                .map(|(n, d)| {
                    if d.is_none_or_empty_str() {
                        n.clone()
                    } else {
                        format!("{n}: {}", txt(d))
                    }
                })
                .collect();
            Ok(RenderedQuestion {
                question: ins,
                options,
                qtype: QType::Choice,
                names: c.keys().cloned().collect(),
                legend: None,
                isolated,
            })
        }
        Some("score") => {
            let levels = match crit {
                Value::Object(c) => legend_levels(&c)?, // R1.6.1
                Value::Array(a) => a,
                _ => return Err(RenderError::ScoreCriteria),
            };
            if !(2..=MAX_LEVELS).contains(&levels.len()) {
                return Err(RenderError::ScoreCriteria); // R1.6.2
            }
            // R1.6.3: no bare-name rule for levels.
            let options = levels
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{i}: {}", txt(c)))
                .collect();
            Ok(RenderedQuestion {
                question: ins,
                options,
                qtype: QType::Score,
                names: (0..levels.len()).map(|i| i.to_string()).collect(),
                legend: Some(levels.iter().map(txt).collect()),
                isolated,
            })
        }
        Some("noul") | Some("bool") => {
            // R1.7.2
            let empty = Object::new();
            let c = match &crit {
                Value::Null => &empty,
                Value::Object(c) => c,
                _ => return Err(RenderError::NoulCriteria),
            };
            let line = |word: &str, d: Option<&Value>| match d {
                Some(d) if !d.is_none_or_empty_str() => format!("{word}: {}", txt(d)),
                _ => word.to_string(),
            };
            Ok(RenderedQuestion {
                question: ins,
                options: vec![line("no", c.get("false")), line("yes", c.get("true"))],
                qtype: QType::Noul,
                names: vec!["False".into(), "True".into()],
                legend: None,
                isolated,
            })
        }
        _ => Err(RenderError::UnknownType {
            repr: crate::pyjson::py_repr(&t),
        }), // R1.4.3
    }
}

/// `[crit[k] for k in sorted(crit, key=float)]`: keys converted in order (the first bad key raises), then CPython's
/// list.sort — for the at most ten levels that can pass the size check that is its exact binary insertion sort, so
/// even NaN keys land where the reference puts them.
// decider-contract R1.6.1
fn legend_levels(c: &Object) -> Result<Vec<Value>, RenderError> {
    let mut keyed: Vec<(f64, Value)> = Vec::with_capacity(c.len());
    for (k, v) in c {
        keyed.push((py_float(k)?, v.clone()));
    }
    if keyed.len() > MAX_LEVELS {
        return Ok(keyed.into_iter().map(|(_, v)| v).collect()); // order is irrelevant: the size check fails
    }
    cpython_small_sort(&mut keyed);
    Ok(keyed.into_iter().map(|(_, v)| v).collect())
}

/// CPython listsort for n < 64 (one run: count_run, reverse if strictly descending, binarysort), comparing with `<`.
fn cpython_small_sort(a: &mut [(f64, Value)]) {
    let n = a.len();
    if n < 2 {
        return;
    }
    let lt = |x: &(f64, Value), y: &(f64, Value)| x.0 < y.0;
    // count_run
    let mut run = 2;
    if lt(&a[1], &a[0]) {
        while run < n && lt(&a[run], &a[run - 1]) {
            run += 1;
        }
        a[..run].reverse();
    } else {
        while run < n && !lt(&a[run], &a[run - 1]) {
            run += 1;
        }
    }
    // binarysort(lo=0, hi=n, start=run)
    for start in run..n {
        let (mut l, mut r) = (0, start);
        while l < r {
            let p = l + ((r - l) >> 1);
            if lt(&a[start], &a[p]) {
                r = p;
            } else {
                l = p + 1;
            }
        }
        a[l..=start].rotate_right(1);
    }
}

/// `re.sub(r"^\s*-?\d+\s*:\s*", "", text)` with Unicode `\s` and `\d`.
// decider-contract R1.8.1
pub fn strip_level_number(text: &str) -> &str {
    let mut it = text.char_indices().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices>| {
        while it.next_if(|&(_, c)| is_py_space(c)).is_some() {}
    };
    skip_ws(&mut it);
    it.next_if(|&(_, c)| c == '-');
    let mut digits = 0;
    while it.next_if(|&(_, c)| py_decimal(c).is_some()).is_some() {
        digits += 1;
    }
    if digits == 0 {
        return text;
    }
    skip_ws(&mut it);
    if it.next_if(|&(_, c)| c == ':').is_none() {
        return text;
    }
    skip_ws(&mut it);
    match it.peek() {
        Some(&(i, _)) => &text[i..],
        None => "",
    }
}

/// One scoring question of a row: its text and option lines.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRow {
    pub question: String,
    pub options: Vec<String>,
}

/// How a question's answer is read from the planned rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// One row, one slot (`"list"`).
    List,
    /// Isolated Score: one yes/no row per level (`"iso"`).
    Iso,
}

/// `plan_rows` index entry: `(id, kind, first row, n rows)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEntry {
    pub id: String,
    pub kind: RowKind,
    pub first: usize,
    pub n: usize,
}

/// `isolated_rows(q, levels)`.
// decider-contract R1.8.2
pub fn isolated_rows(question: &str, legend: &[String]) -> Vec<PlanRow> {
    legend
        .iter()
        .map(|l| PlanRow {
            question: format!(
                "{question}\nProposed answer: {}\nDoes the proposed answer fit?",
                strip_level_number(l)
            ),
            options: vec!["no".into(), "yes".into()],
        })
        .collect()
}

/// `plan_rows(rqs, isolated)`.
// decider-contract R1.8.3
pub fn plan_rows(
    rqs: &[(String, RenderedQuestion)],
    isolated: bool,
) -> (Vec<PlanRow>, Vec<PlanEntry>) {
    let mut rows = Vec::new();
    let mut index = Vec::new();
    for (id, r) in rqs {
        if isolated && r.qtype == QType::Score && r.isolated {
            let rws = isolated_rows(&r.question, r.legend.as_deref().unwrap_or_default());
            index.push(PlanEntry {
                id: id.clone(),
                kind: RowKind::Iso,
                first: rows.len(),
                n: rws.len(),
            });
            rows.extend(rws);
        } else {
            index.push(PlanEntry {
                id: id.clone(),
                kind: RowKind::List,
                first: rows.len(),
                n: 1,
            });
            rows.push(PlanRow {
                question: r.question.clone(),
                options: r.options.clone(),
            });
        }
    }
    (rows, index)
}

/// `row_types(rqs, index)`: the answer type of every planned row (isolated levels carry `score`).
// decider-contract R1.8.5
pub fn row_types(rqs: &[(String, RenderedQuestion)], index: &[PlanEntry]) -> Vec<QType> {
    let mut out = Vec::new();
    for (e, (_, r)) in index.iter().zip(rqs) {
        out.extend(std::iter::repeat_n(r.qtype, e.n));
    }
    out
}

/// Render every question in request order; the first failing one decides the error (R1.9.1).
/// A spec that is not an object is a 422 here (the reference 500s; docs/systemone.md).
pub fn render_questions(
    questions: &Object,
) -> Result<Vec<(String, RenderedQuestion)>, RenderError> {
    questions
        .iter()
        .map(|(id, spec)| match spec {
            Value::Object(o) => render_question(o).map(|r| (id.clone(), r)),
            other => Err(RenderError::SpecNotObject {
                id_repr: repr_str(id),
                got: json_type_name(other),
            }),
        })
        .collect()
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Int(_) | Value::Float(_) => "a number",
        Value::Str(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pyjson::loads;

    #[test]
    fn strip_level_number_unicode() {
        assert_eq!(strip_level_number("2: somewhat"), "somewhat");
        assert_eq!(strip_level_number("\u{a0}2 :\u{3000}x"), "x");
        assert_eq!(strip_level_number("\u{663}: a"), "a");
        assert_eq!(strip_level_number("-12:"), "");
        assert_eq!(strip_level_number("x 2: y"), "x 2: y");
        assert_eq!(strip_level_number("2 x"), "2 x");
        assert_eq!(strip_level_number("-: y"), "-: y");
    }

    #[test]
    fn annotate_moves_existing_index_first() {
        let v = loads(r#"[0,1,2,3,4,5,6,7,8,{"a":1,"_index":"x"}, [1]]"#).expect("valid");
        let s = render_state(&v);
        assert!(
            s.contains(r#"{"_index": 9, "a": 1}"#) || s.contains(r#"{"_index": "x", "a": 1}"#),
            "{s}"
        );
        assert!(s.contains(r#"{"_index": "x", "a": 1}"#));
        assert!(s.starts_with(r#"[{"_index": 0, "value": 0}, "#));
        assert!(s.ends_with(r#"{"_index": 10, "value": [1]}]"#));
    }

    /// The capped writer is `json.dumps(annotate_indices(x))` below its cap, and a prefix of it at any cap.
    #[test]
    fn capped_render_is_a_prefix_of_the_full_render() {
        let v = loads(
            r#"{"a":[0,1,2,3,4,5,6,7,{"_index":"own","b":[1,2]},{"c":null}],"s":"é\n\"x\u0001","n":[1.5,1e400,NaN,-0.0,123456789012345678901234567890],"short":[[1,2],{"k":[9,8,7,6,5,4,3,2,1]}],"e":{},"f":[]}"#,
        )
        .expect("valid");
        let full = dumps(&annotate_indices(&v));
        let mut s = String::new();
        assert_eq!(
            crate::pyjson::dumps_capped(&mut s, &v, true, usize::MAX),
            Ok(())
        );
        assert_eq!(s, full);
        for cap in 0..full.len() {
            let mut s = String::new();
            let r = crate::pyjson::dumps_capped(&mut s, &v, true, cap);
            assert_eq!(r, Err(crate::pyjson::Capped), "cap {cap}");
            assert!(
                full.starts_with(&s) && s.len() <= cap && s.len() + 4 > cap,
                "cap {cap}: {s}"
            );
        }
        let mut s = String::new();
        assert_eq!(
            crate::pyjson::dumps_capped(&mut s, &v, false, usize::MAX),
            Ok(())
        );
        assert_eq!(s, dumps(&v));
    }

    #[test]
    fn nan_keys_sort_like_cpython() {
        // sorted(["nan", "2", "1"], key=float) == ['nan', '1', '2'] in CPython 3.11
        let o = loads(r#"{"nan": "a", "2": "b", "1": "c"}"#).expect("valid");
        let Value::Object(o) = o else { panic!() };
        let lv = legend_levels(&o).expect("floats");
        assert_eq!(lv, vec![Value::str("a"), Value::str("c"), Value::str("b")]);
    }
}

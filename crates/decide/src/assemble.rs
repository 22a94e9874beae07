//! Probabilities → answers (decider/systemone.py `assemble`, `format_answer`): f32 softmax per slot, then f64
//! assembly with Python 3.11 left-to-right `sum`, Python `round`, and the reference's key order.

use crate::prompt::text::{QType, RenderedQuestion, RowKind};
use crate::prompt::tokens::Plan;
use crate::pyjson::{obj, py_round, Object, Value};

/// `softmax(logits[..nopts] / T)` in f32, max-subtracted; the masked tail (`j >= nopts`) is left out.
// decider-contract R3.1.1, R3.3
pub fn softmax(logits: &[f32], nopts: usize, temperature: f64) -> Vec<f32> {
    let t = temperature as f32;
    let x: Vec<f32> = logits[..nopts.min(logits.len())]
        .iter()
        .map(|&l| l / t)
        .collect();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|&v| v / s).collect()
}

/// The number of probability vectors did not match the plan's slots.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssembleError {
    #[error("assemble: {got} probability vectors for {want} slots")]
    SlotCount { got: usize, want: usize },
    #[error("assemble: slot {slot} has {got} probabilities, {want} needed")]
    Short {
        slot: usize,
        got: usize,
        want: usize,
    },
}

/// CPython 3.11 `sum()` of floats: naive left to right (3.12 compensates; decider-contract R4.3.3).
fn py_sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut it = xs.into_iter();
    let Some(first) = it.next() else { return 0.0 };
    it.fold(first, |a, x| a + x)
}

/// Index of the first maximum (`max(range(n), key=p.__getitem__)`); 0 for an empty slice.
pub fn argmax<T: PartialOrd>(p: &[T]) -> usize {
    let mut j = 0;
    for (i, x) in p.iter().enumerate() {
        if *x > p[j] {
            j = i;
        }
    }
    j
}

/// `min(1.0, max(0.0, x))` with Python's argument-order tie rules.
fn clip01(x: f64) -> f64 {
    let y = if x > 0.0 { x } else { 0.0 };
    if y < 1.0 {
        y
    } else {
        1.0
    }
}

/// `_normalised(p)`: divide by the sum, or uniform when it is 0.
fn normalised(p: &[f64]) -> Vec<f64> {
    let tot = py_sum(p.iter().copied());
    if tot == 0.0 {
        vec![1.0 / p.len() as f64; p.len()]
    } else {
        p.iter().map(|x| x / tot).collect()
    }
}

/// `certainty(p)`: 1 − H/ln n.
// decider-contract R4.1.7
pub fn certainty(p: &[f64]) -> f64 {
    if p.len() <= 1 {
        return 1.0;
    }
    let h = -py_sum(p.iter().filter(|&&x| x > 0.0).map(|&x| x * x.ln()));
    let v = 1.0 - h / (p.len() as f64).ln();
    if v > 0.0 {
        v
    } else {
        0.0
    }
}

/// `choice_confidence(p)`: (n·p_max − 1)/(n − 1), clipped.
// decider-contract R4.1.5
pub fn choice_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let q = normalised(p);
    let m = q
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, |a, x| if x > a { x } else { a });
    clip01((n as f64 * m - 1.0) / (n - 1) as f64)
}

/// `score_confidence(p)`: 1 − expected distance from the mode / mean distance from the middle, clipped.
// decider-contract R4.1.6
pub fn score_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    let q = normalised(p);
    if n <= 1 {
        return 1.0;
    }
    let k = argmax(&q) as i64;
    let spread = py_sum(
        q.iter()
            .enumerate()
            .map(|(i, &x)| x * (i as i64 - k).abs() as f64),
    );
    let mid = (n - 1) as f64 / 2.0;
    let uniform = py_sum((0..n).map(|i| (i as f64 - mid).abs())) / n as f64;
    clip01(1.0 - spread / uniform)
}

/// `format_answer(rq, p)`: renormalise, then the typed answer object (keys in the reference's order).
// decider-contract R4.1
pub fn format_answer(rq: &RenderedQuestion, p: &[f64]) -> Value {
    let p = &p[..rq.options.len().min(p.len())];
    let mut s = py_sum(p.iter().copied());
    if s == 0.0 {
        s = 1.0; // `sum(p) or 1.0`
    }
    let p: Vec<f64> = p.iter().map(|x| x / s).collect();
    let j = argmax(&p);
    let r4 = |x: f64| Value::Float(py_round(x, 4));
    match rq.qtype {
        QType::Noul => obj([("type", Value::str("noul")), ("noul", r4(p[1]))]),
        QType::Choice => obj([
            ("type", Value::str("choice")),
            ("choice", Value::str(rq.names[j].clone())),
            ("confidence", r4(choice_confidence(&p))),
            ("x_p_max", r4(p[j])),
            ("certainty", r4(certainty(&p))),
            (
                "probabilities",
                Value::Object(
                    rq.names
                        .iter()
                        .zip(&p)
                        .map(|(n, &x)| (n.clone(), r4(x)))
                        .collect(),
                ),
            ),
        ]),
        QType::Score => {
            let score = py_sum(p.iter().enumerate().map(|(i, &x)| i as f64 * x));
            let legend: Object = rq
                .legend
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, d)| (i.to_string(), Value::str(d.clone())))
                .collect();
            obj([
                ("type", Value::str("score")),
                ("score", Value::Float(py_round(score, 2))),
                ("confidence", r4(score_confidence(&p))),
                ("x_p_max", r4(p[j])),
                ("certainty", r4(certainty(&p))),
                ("legend", Value::Object(legend)),
                (
                    "probabilities",
                    Value::Object(
                        p.iter()
                            .enumerate()
                            .map(|(i, &x)| (i.to_string(), r4(x)))
                            .collect(),
                    ),
                ),
            ])
        }
    }
}

/// `assemble(rqs, index, probs)` → the `answers` object. `probs`: one vector per slot in row order (at least `nopts`
/// long; extra entries are ignored), as f32 softmax outputs.
// decider-contract R4.1, R4.2
pub fn assemble_answers(plan: &Plan, probs: &[Vec<f32>]) -> Result<Value, AssembleError> {
    let want = plan.slot_count();
    if probs.len() != want {
        return Err(AssembleError::SlotCount {
            got: probs.len(),
            want,
        });
    }
    let nopts: Vec<usize> = plan
        .rows
        .iter()
        .flat_map(|r| r.nopts.iter().copied())
        .collect();
    for (slot, (p, &n)) in probs.iter().zip(&nopts).enumerate() {
        if p.len() < n {
            return Err(AssembleError::Short {
                slot,
                got: p.len(),
                want: n,
            });
        }
    }
    let mut out = Object::new();
    for (e, (_, rq)) in plan.index.iter().zip(&plan.rqs) {
        let a = match e.kind {
            RowKind::Iso => {
                // R4.2.1: P(yes) per level, divided by the raw sum (or 1e-9), then format_answer divides again.
                let fit: Vec<f64> = (0..e.n).map(|j| probs[e.first + j][1] as f64).collect();
                let mut tot = py_sum(fit.iter().copied());
                if tot == 0.0 {
                    tot = 1e-9;
                }
                let p: Vec<f64> = fit.iter().map(|x| x / tot).collect();
                let mut a = format_answer(rq, &p);
                if let Value::Object(o) = &mut a {
                    o.insert(
                        "level_fit".into(),
                        Value::Object(
                            fit.iter()
                                .enumerate()
                                .map(|(j, &x)| (j.to_string(), Value::Float(py_round(x, 4))))
                                .collect(),
                        ),
                    );
                    o.insert("fit_mass".into(), Value::Float(py_round(tot, 4)));
                }
                a
            }
            RowKind::List => {
                let p: Vec<f64> = probs[e.first].iter().map(|&x| x as f64).collect();
                format_answer(rq, &p)
            }
        };
        out.insert(e.id.clone(), a);
    }
    Ok(Value::Object(out))
}

/// The `/v1/systemone` response: `{"model", "answers", "usage": {"input_tokens", "output_tokens": 0}}`.
// decider-contract R4.4
pub fn assemble(plan: &Plan, probs: &[Vec<f32>], model_name: &str) -> Result<Value, AssembleError> {
    Ok(obj([
        ("model", Value::str(model_name)),
        ("answers", assemble_answers(plan, probs)?),
        (
            "usage",
            obj([
                ("input_tokens", Value::from(plan.input_tokens)),
                ("output_tokens", Value::int(0)),
            ]),
        ),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pyjson::dumps_compact;

    fn rq(qtype: QType, n: usize) -> RenderedQuestion {
        RenderedQuestion {
            question: "q".into(),
            options: (0..n).map(|i| format!("o{i}")).collect(),
            qtype,
            names: (0..n).map(|i| format!("n{i}")).collect(),
            legend: (qtype == QType::Score).then(|| (0..n).map(|i| format!("l{i}")).collect()),
            isolated: true,
        }
    }

    #[test]
    fn verified_spot_values() {
        // decider-contract R4.2.4
        let a = format_answer(&rq(QType::Choice, 3), &[0.4, 0.4, 0.2]);
        assert_eq!(
            dumps_compact(&a).expect("finite"),
            r#"{"type":"choice","choice":"n0","confidence":0.1,"x_p_max":0.4,"certainty":0.0398,"probabilities":{"n0":0.4,"n1":0.4,"n2":0.2}}"#
        );
        let a = format_answer(&rq(QType::Score, 3), &[0.2, 0.5, 0.3]);
        let s = dumps_compact(&a).expect("finite");
        assert!(
            s.starts_with(
                r#"{"type":"score","score":1.1,"confidence":0.25,"x_p_max":0.5,"certainty":0.0628,"#
            ),
            "{s}"
        );
    }

    #[test]
    fn softmax_masks_tail() {
        let p = softmax(&[1.0, 1.0, 50.0], 2, 1.0);
        assert_eq!(p, vec![0.5, 0.5]);
    }
}

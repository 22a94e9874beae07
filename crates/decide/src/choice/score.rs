//! The choices of a decision: the checks made before any model work, and the scoring of one logit row.

use onepass_tokenizer::Tokenizer;
use serde_json::Value;

use super::DecideError;

/// The first id of each choice, tokenized alone (no template, no added space), after the up-front checks: a
/// non-empty list, no empty choice, every id inside the model's vocabulary, and no two choices that begin with the
/// same id (they could not be told apart).
pub fn choice_ids(
    tok: &Tokenizer,
    choices: &[String],
    vocab: usize,
    id: &Value,
) -> Result<Vec<u32>, DecideError> {
    let bad = |msg: String| DecideError::invalid(id.clone(), msg);
    if choices.is_empty() {
        return Err(bad(
            "choices is empty: give at least one answer to score".into()
        ));
    }
    let mut firsts: Vec<u32> = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        if c.is_empty() {
            return Err(bad(format!("choices[{i}] is empty")));
        }
        let ids = tok
            .encode(c)
            .map_err(|e| bad(format!("choices[{i}]: {e}")))?;
        let Some(&first) = ids.first() else {
            return Err(bad(format!("choices[{i}] {c:?} has no tokens")));
        };
        if first as usize >= vocab {
            return Err(bad(format!(
                "choices[{i}] {c:?} begins with token {first}, outside the model's vocabulary (0..{vocab})"
            )));
        }
        if let Some(j) = firsts.iter().position(|&f| f == first) {
            let piece = tok.decode(&[first]).unwrap_or_default();
            return Err(bad(format!(
                "choices[{j}] {:?} and choices[{i}] {c:?} both begin with token {first} ({piece:?}), so they cannot be \
                 told apart: a choice is scored by its first token",
                choices[j]
            )));
        }
        firsts.push(first);
    }
    Ok(firsts)
}

/// `log_softmax(logits)[id]` for every id: normalised over the whole row (the vocabulary), not over the choices, so
/// the mass outside the choices shows how unsure the model is. Max-subtracted, the sum in f64.
pub fn log_softmax_at(logits: &[f32], ids: &[u32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    ids.iter()
        .map(|&i| {
            logits
                .get(i as usize)
                .map_or(f64::NEG_INFINITY, |&x| x as f64 - log_z)
        })
        .collect()
}

/// The index of the highest value, the first on ties.
pub fn best(logp: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in logp.iter().enumerate() {
        if v > logp[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_is_normalised_over_the_row() {
        let logits = [1.0f32, 2.0, 3.0, 0.5];
        let all = log_softmax_at(&logits, &[0, 1, 2, 3]);
        let total: f64 = all.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        // Against the definition, written out.
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((all[2] - (3.0 - z)).abs() < 1e-12);
        // Large logits do not overflow.
        let big = log_softmax_at(&[1000.0, 1000.0], &[1]);
        assert!((big[0] + std::f64::consts::LN_2).abs() < 1e-12);
    }

    #[test]
    fn best_takes_the_first_of_a_tie() {
        assert_eq!(best(&[-2.0, -1.0, -1.0]), 1);
        assert_eq!(best(&[-0.5]), 0);
        assert_eq!(best(&[-3.0, -3.0]), 0);
    }
}

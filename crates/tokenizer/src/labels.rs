//! The decider label table (decider-contract §2.2).
//!
//! Option `j` of a question is shown to the model as label `j` and read back as the logit of that
//! label's single token id. Labels are `A`..`Z`, then `AA`, `AB`, …, `ZZ`, keeping only those the
//! vocabulary encodes as one id, until 255 are kept. The table is data-derived: for Qwen3.5 the
//! two-letter part has gaps (`BQ`, `BZ`, …) and ends at `JT`.

use crate::TokenizerError;

/// Most options a question may have; also the number of labels in the table (R2.2.1).
pub const MAX_OPTIONS: usize = 255;

/// The label ids and the ids that open a label in the wide (more than 10 options) layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelTable {
    /// Token id of label `j`, `j` in `0..MAX_OPTIONS`. Distinct.
    pub ids: Vec<u32>,
    /// `encode("\n(")`: what precedes each label in a wide option block (`[198, 7]` for Qwen3.5).
    pub open_ids: Vec<u32>,
    /// The label strings, `labels[j]` is encoded as `ids[j]`.
    pub labels: Vec<String>,
}

impl LabelTable {
    /// The label string for option index `j` (`None` if `j >= MAX_OPTIONS`).
    pub fn label(&self, j: usize) -> Option<&str> {
        self.labels.get(j).map(String::as_str)
    }

    /// Build the table with `encode` as the tokenizer (R2.2.1).
    pub(crate) fn build(
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, TokenizerError>,
    ) -> Result<LabelTable, TokenizerError> {
        let mut labels: Vec<String> = Vec::with_capacity(MAX_OPTIONS);
        let mut ids: Vec<u32> = Vec::with_capacity(MAX_OPTIONS);
        for candidate in label_candidates() {
            if ids.len() == MAX_OPTIONS {
                break;
            }
            if let [id] = encode(&candidate)?[..] {
                if let Some(k) = ids.iter().position(|&x| x == id) {
                    return Err(TokenizerError::DuplicateLabel {
                        first: labels[k].clone(),
                        second: candidate,
                        id,
                    });
                }
                labels.push(candidate);
                ids.push(id);
            }
        }
        if ids.len() < MAX_OPTIONS {
            return Err(TokenizerError::TooFewLabels {
                found: ids.len(),
                needed: MAX_OPTIONS,
            });
        }
        // decider's `letter_ids` asserts the first ten labels are encode("A")..encode("J").
        for (index, found) in labels.iter().take(10).enumerate() {
            let expected = char::from(b'A' + index as u8).to_string();
            if *found != expected {
                return Err(TokenizerError::SingleLetterLabel {
                    index,
                    found: found.clone(),
                    expected,
                });
            }
        }
        let open_ids = encode("\n(")?;
        Ok(LabelTable {
            ids,
            open_ids,
            labels,
        })
    }
}

/// All label candidates in order: `A`..`Z`, then `AA`..`ZZ` with the first letter as the outer
/// loop (702 strings).
pub fn label_candidates() -> impl Iterator<Item = String> {
    let letters = || (b'A'..=b'Z').map(char::from);
    let singles = letters().map(String::from);
    let pairs = letters().flat_map(move |a| letters().map(move |b| format!("{a}{b}")));
    singles.chain(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_in_contract_order() {
        let c: Vec<String> = label_candidates().collect();
        assert_eq!(c.len(), 26 + 26 * 26);
        assert_eq!((c[0].as_str(), c[25].as_str()), ("A", "Z"));
        assert_eq!(
            (c[26].as_str(), c[27].as_str(), c[52].as_str()),
            ("AA", "AB", "BA")
        );
        assert_eq!(c.last().map(String::as_str), Some("ZZ"));
    }

    #[test]
    fn every_candidate_single_gives_a_to_iu() {
        // A fake vocabulary in which every candidate is one id: labels are the first 255 candidates.
        let t = LabelTable::build(|s| {
            Ok(match s {
                "\n(" => vec![1000, 1001],
                _ => vec![label_candidates().position(|c| c == s).unwrap_or(999) as u32],
            })
        })
        .expect("table");
        assert_eq!(t.ids.len(), MAX_OPTIONS);
        assert_eq!(t.label(26), Some("AA"));
        assert_eq!(t.label(254), Some("IU"));
        assert_eq!(t.label(255), None);
        assert_eq!(t.open_ids, vec![1000, 1001]);
    }

    #[test]
    fn too_few_and_duplicates_are_errors() {
        let few = LabelTable::build(|s| Ok(s.bytes().map(u32::from).collect()));
        assert!(
            matches!(
                few,
                Err(TokenizerError::TooFewLabels {
                    found: 26,
                    needed: 255
                })
            ),
            "{few:?}"
        );
        // "C" gets the id of "A".
        let dup = LabelTable::build(|s| {
            let k = label_candidates().position(|c| c == s).unwrap_or(999);
            Ok(vec![if s == "C" { 0 } else { k as u32 }])
        });
        assert!(
            matches!(&dup, Err(TokenizerError::DuplicateLabel { first, second, .. }) if first == "A" && second == "C"),
            "{dup:?}"
        );
    }
}

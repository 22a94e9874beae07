//! Random System One request bodies from a seed: states of every JSON kind from a few words to about 1,500 tokens,
//! one to five questions of every type (choice as a list, a map with descriptions or `options`; score as levels or
//! a legend; noul and its `bool` alias), packed rows (`independent: false`) and Unicode. Requests the fixtures did
//! not fix, for the GPU modes' answers against the CPU engine (tests/cuda_answers.rs).

use serde_json::{json, Map, Value as J};

// The kernel tests' generator (xorshift64*): the same bodies from the same seed on every machine.
#[path = "../../../kernels/tests/common/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

impl Rng {
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.range(1, 100) <= percent
    }
}

const WORDS: &[&str] = &[
    "the",
    "order",
    "customer",
    "arrived",
    "late",
    "refund",
    "invoice",
    "login",
    "password",
    "shipping",
    "Porto",
    "Berlin",
    "support",
    "ticket",
    "update",
    "crash",
    "server",
    "latency",
    "payment",
    "card",
    "transfer",
    "warehouse",
    "delivery",
    "damaged",
    "box",
    "happy",
    "angry",
    "again",
    "never",
    "quickly",
    "slowly",
    "report",
    "review",
    "menu",
    "service",
    "price",
    "discount",
    "subscription",
    "cancel",
    "renew",
    "account",
    "error",
    "timeout",
    "network",
    "battery",
    "screen",
    "weather",
    "rain",
    "sunny",
    "meeting",
    "Monday",
    "deadline",
    "budget",
    "team",
    "manager",
    "contract",
    "signed",
    "pending",
    "approved",
    "rejected",
    "42",
    "3.5",
    "2026-09-01",
    "#88",
    "v3.2",
    "Grüße",
    "Köln",
    "天气",
    "спасибо",
    "🌧️",
    "👍🏽",
    "naïve",
    "café",
    "—",
    "and",
    "but",
    "because",
    "with",
    "without",
    "after",
    "before",
    "during",
    "is",
    "was",
    "will",
    "not",
    "very",
    "quite",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
];

const OPTIONS: &[&str] = &[
    "red",
    "green",
    "blue",
    "yellow",
    "black",
    "white",
    "orange",
    "purple",
    "pink",
    "brown",
    "grey",
    "cyan",
    "billing",
    "access",
    "shipping",
    "other",
    "refund",
    "upgrade",
    "downgrade",
    "cancel",
    "email",
    "phone",
    "chat",
    "letter",
    "none",
    "minor",
    "major",
    "critical",
    "low",
    "mid",
    "high",
    "urgent",
    "Deutsch",
    "English",
    "中文",
    "Русский",
    "yes",
    "no",
    "maybe",
    "n/a",
    "None of the above",
    "positive",
    "negative",
    "neutral",
    "mixed",
];

fn sentence(r: &mut Rng, lo: usize, hi: usize) -> String {
    let n = r.range(lo, hi);
    (0..n).map(|_| r.pick(WORDS)).collect::<Vec<_>>().join(" ")
}

fn state(r: &mut Rng) -> J {
    // Mostly short and mid-sized states, one in eight long (about 1,000-1,500 tokens).
    let long = r.chance(12);
    let (lo, hi) = if long { (600, 1000) } else { (3, 120) };
    match r.range(0, 9) {
        0 => J::Null,
        1 => json!(r.range(0, 100_000) as f64 / 8.0),
        2 => J::Array(
            (0..r.range(1, 12))
                .map(|k| json!({"k": k, "v": r.pick(OPTIONS)}))
                .collect(),
        ),
        3..=5 => {
            let mut m = Map::new();
            for _ in 0..r.range(1, 5) {
                let key = format!("{}_{}", r.pick(WORDS), r.range(0, 99));
                let v = if r.chance(30) {
                    json!(r.range(0, 5000))
                } else {
                    J::String(sentence(r, lo / 3 + 1, hi / 3 + 1))
                };
                m.insert(key, v);
            }
            J::Object(m)
        }
        _ => J::String(sentence(r, lo, hi)),
    }
}

/// `n` distinct option names (a numbered name where the list runs out).
fn names(r: &mut Rng, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    while out.len() < n {
        let name = if r.chance(80) {
            r.pick(OPTIONS).to_string()
        } else {
            format!("{} {}", r.pick(OPTIONS), r.range(0, 99))
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

fn question(r: &mut Rng) -> J {
    let instructions = format!("{}?", sentence(r, 2, 12));
    match r.range(0, 5) {
        0 | 1 => {
            let n = if r.chance(20) {
                r.range(11, 40)
            } else {
                r.range(2, 10)
            };
            let opts = names(r, n);
            match r.range(0, 2) {
                0 => json!({"type": "choice", "instructions": instructions, "criteria": opts}),
                1 => {
                    let m: Map<String, J> = opts
                        .into_iter()
                        .map(|o| {
                            let d = if r.chance(30) {
                                J::Null
                            } else {
                                J::String(sentence(r, 1, 6))
                            };
                            (o, d)
                        })
                        .collect();
                    json!({"instructions": instructions, "criteria": m})
                }
                _ => json!({"type": "choice", "question": instructions, "options": opts}),
            }
        }
        2 | 3 => {
            let n = r.range(2, 10);
            if r.chance(70) {
                let levels = names(r, n);
                let mut q =
                    json!({"type": "score", "instructions": instructions, "criteria": levels});
                if r.chance(25) {
                    q["isolated"] = J::Bool(false);
                }
                q
            } else {
                let m: Map<String, J> = (0..n)
                    .map(|i| (format!("{}", i * 2 + 1), J::String(sentence(r, 1, 3))))
                    .collect();
                json!({"type": "score", "instructions": instructions, "criteria": m})
            }
        }
        4 => json!({"type": "noul", "instructions": instructions}),
        _ => json!({"type": "bool", "instructions": instructions}),
    }
}

/// `n` request bodies (JSON text) from `seed`.
pub fn bodies(seed: u64, n: usize) -> Vec<String> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..n)
        .map(|_| {
            let mut qs = Map::new();
            for i in 0..r.range(1, 5) {
                qs.insert(format!("q{i}"), question(&mut r));
            }
            let mut body = json!({"state": state(&mut r), "questions": qs});
            if r.chance(25) {
                body["independent"] = J::Bool(false);
            }
            body.to_string()
        })
        .collect()
}

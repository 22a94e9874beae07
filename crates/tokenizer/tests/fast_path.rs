//! The fast Qwen3.5 encode (src/fast.rs) against the `tokenizers` pipeline it replaces: identical
//! ids on generated text, in both views (the tokenizer.json as written and
//! `transformers_compatible()`), and only for the verified Qwen3.5 pipeline.

mod common;

use common::{qwen3_5, qwen3_5_dir, repo_root};
use onepass_tokenizer::{synthetic_tokenizer_json, Tokenizer};

/// splitmix64: a fixed seed gives the same strings on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "the",
    "The",
    "THE",
    "hello",
    "World",
    "decider",
    "onepass",
    "tokenizer",
    "a",
    "I",
    "x",
    "don",
    "Don",
    "DON",
    "camelCase",
    "snake_case",
    "über",
    "café",
    "naïve",
    "Straße",
    "ǅ",
    "ﬁ",
    "ſ",
    "K",
    "İstanbul",
];
const SPACES: &[&str] = &[
    " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", " \r\n ", "\t\t",
    "\u{3000}", "\u{a0}", "\u{85}", "\u{2028}", "\u{2029}", "\u{b}", "\u{c}", "\u{1680}",
    "\u{2009}", "\u{200b}", "\u{180e}", "\u{feff}",
];
const CONTRACTIONS: &[&str] = &[
    "'s",
    "'S",
    "'t",
    "'T",
    "'re",
    "'RE",
    "'Re",
    "'rE",
    "'ve",
    "'VE",
    "'m",
    "'M",
    "'ll",
    "'LL",
    "'lL",
    "'d",
    "'D",
    "'\u{17f}",
    "'",
    "''",
    "'r",
    "'v",
    "'l",
    "\u{2019}s",
    "'x",
    "'1",
    "' s",
];
const NUMBERS: &[&str] = &[
    "0", "7", "42", "2026", "3.14", "1,000", "-5", "٣", "१२", "½", "²", "Ⅻ", "〇", "𝟘", "①",
];
const SCRIPTS: &[&str] = &[
    "你好",
    "世界",
    "加拿大",
    "新加坡",
    "俱乐部",
    "日本語",
    "ひらがな",
    "カタカナ",
    "한국어",
    "\u{1100}\u{1161}\u{11a8}",
    "नमस्ते",
    "दुनिया",
    "क्षि",
    "ภาษาไทย",
    "العربية",
    "עברית",
    "Ελληνικά",
    "русский",
    "ქართული",
    "e\u{301}",
    "a\u{308}\u{301}",
    "\u{301}",
    "\u{338}",
    "\u{94d}",
    "o\u{302}\u{323}",
    "\u{1e0b}\u{323}",
    "A\u{30a}",
    "\u{212b}",
    "\u{2126}",
    "\u{f900}",
    "\u{fb1d}",
    "\u{1d15e}",
    "\u{2adc}",
    "\u{0958}",
    "\u{0344}",
    "\u{0f73}",
];
const SYMBOLS: &[&str] = &[
    "👩🏽\u{200d}💻",
    "🇺🇸",
    "1\u{fe0f}\u{20e3}",
    "❤\u{fe0f}",
    "\u{200d}",
    "\u{fe0f}",
    "😀",
    "🤖",
    "...",
    "!!",
    "?!",
    "---",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "\"",
    ":",
    ",",
    ";",
    "->",
    "=>",
    "/*",
    "*/",
    "#",
    "@",
    "$",
    "%",
    "&&",
    "||",
    "<",
    ">",
    "</",
    "/>",
    "`",
    "~",
    "^",
    "\\",
    "|",
    "\u{0}",
    "\u{1b}",
    "\u{7f}",
    "\u{ad}",
    "\u{2014}",
    "«",
    "»",
    "¿",
    "€",
    "©",
    "™",
    "\u{e000}",
];
const SPECIAL: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|endoftext|>",
    "<tool_call>",
    "<|im_start",
    "<think",
    "<|im_end|",
    "<<think>>",
    "<|im_start|><|im_end|>",
    "<thinking>",
    "<|audio_pad|>",
    "<tts_text_bos_single>",
    "<tts_text_bos>",
];
const CHUNKS: &[&str] = &[
    r#"{"customer": {"name": "Ana Sousa", "tier": "gold"}, "events": [{"_index": 0, "amount": 7.25}]}"#,
    "fn main() {\n    println!(\"hi {}\", x);\n}\n",
    "def f(x):\n\tif x != None:  \n\t\treturn x ** 2\n",
    "<|im_start|>user\nWhich option? (A) yes (B) no<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "https://example.com/a/b?c=d&e=f#g",
    "   leading and trailing   ",
    "line one\r\nline two\r\n\r\n",
];

/// One random code point: anywhere, or from the busy ranges below U+3000.
fn random_char(rng: &mut Rng) -> char {
    loop {
        let cp = match rng.below(4) {
            0 => rng.below(0x80) as u32,
            1 => rng.below(0x3000) as u32,
            2 => 0x300 + rng.below(0x70) as u32,
            _ => rng.below(0x11_0000) as u32,
        };
        if let Some(c) = char::from_u32(cp) {
            return c;
        }
    }
}

fn random_piece(rng: &mut Rng) -> String {
    match rng.below(12) {
        0 | 1 => rng.pick(WORDS).to_string(),
        2 | 3 => rng.pick(SPACES).to_string(),
        4 => rng.pick(CONTRACTIONS).to_string(),
        5 => rng.pick(NUMBERS).to_string(),
        6 => rng.pick(SCRIPTS).to_string(),
        7 => rng.pick(SYMBOLS).to_string(),
        8 => rng.pick(SPECIAL).to_string(),
        9 => rng.pick(CHUNKS).to_string(),
        10 => (0..1 + rng.below(4)).map(|_| random_char(rng)).collect(),
        // A run of one thing: spaces, newlines, letters, digits, punctuation, marks.
        _ => {
            let unit = rng.pick(&[" ", "\n", "\t", "a", "1", ".", "\u{301}", "字", " \n"]);
            unit.repeat(1 + rng.below(40))
        }
    }
}

/// `n` strings: mostly a few pieces, some long documents.
fn generated(n: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| {
            let pieces = if i % 100 == 0 { 200 } else { 1 + rng.below(12) };
            (0..pieces).map(|_| random_piece(&mut rng)).collect()
        })
        .collect()
}

fn assert_same(tok: &Tokenizer, view: &str, texts: &[String]) {
    let mut failures = Vec::new();
    for text in texts {
        let fast = tok.encode(text).expect("fast encode");
        let generic = tok.encode_generic(text).expect("generic encode");
        if fast != generic {
            failures.push(format!(
                "{text:?}\n  fast    {fast:?}\n  generic {generic:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{view}: {} of {} strings differ:\n{}",
        failures.len(),
        texts.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}

#[test]
fn fast_path_is_on_for_qwen3_5_only() {
    let tok = qwen3_5();
    assert!(tok.has_fast_path());
    assert!(tok.transformers_compatible().has_fast_path());

    // Another split regex (here under a non-Qwen3.5 model type): the generic path.
    let json = std::fs::read_to_string(qwen3_5_dir().join("tokenizer.json")).expect("read");
    let mut doc: serde_json::Value = serde_json::from_str(&json).expect("parse");
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
        serde_json::Value::from(onepass_tokenizer::QWEN2_SPLIT_REGEX);
    let qwen2 = Tokenizer::from_json_str(&doc.to_string(), Some("qwen2")).expect("load");
    assert!(!qwen2.has_fast_path());
    // ... and the same file corrected to the Qwen3.5 regex: fast again.
    let corrected = Tokenizer::from_json_str(&doc.to_string(), Some("qwen3_5")).expect("load");
    assert!(corrected.regex_corrected() && corrected.has_fast_path());

    // An added token that is normalized (matched after NFC): the generic path.
    let mut doc: serde_json::Value = serde_json::from_str(&json).expect("parse");
    doc["added_tokens"][3]["normalized"] = serde_json::Value::from(true);
    let normalized = Tokenizer::from_json_str(&doc.to_string(), None).expect("load");
    assert!(!normalized.has_fast_path());

    // The synthetic tokenizer carries the Qwen3.5 pipeline.
    let synthetic = synthetic_tokenizer_json(1024).expect("synthetic");
    let synthetic = Tokenizer::from_json_str(&synthetic, None).expect("load");
    assert!(synthetic.has_fast_path());
    assert_same(&synthetic, "synthetic", &generated(2_000, 7));
}

#[test]
fn fast_path_matches_tokenizers_on_generated_text() {
    let tok = qwen3_5();
    let compat = tok.transformers_compatible();
    let texts = generated(20_000, 20_260_530);
    assert_same(tok, "tokenizer.json", &texts);
    assert_same(&compat, "transformers_compatible", &texts);
}

#[test]
fn fast_path_matches_tokenizers_on_documents() {
    let tok = qwen3_5();
    let compat = tok.transformers_compatible();
    // The whole tiktoken fixture as one text and as 50-line documents, and every line of the
    // transformers-diff fixture after a space, a newline and inside JSON.
    let fixture =
        std::fs::read_to_string(repo_root().join("tests/fixtures/tokenizer/tiktoken_ids.jsonl"))
            .expect("read fixture");
    let lines: Vec<&str> = fixture.lines().collect();
    let mut texts: Vec<String> = lines.chunks(50).map(|c| c.join("\n")).collect();
    texts.push(fixture.clone());
    let diff = std::fs::read_to_string(
        repo_root().join("tests/fixtures/tokenizer/transformers_diff.jsonl"),
    )
    .expect("read diff fixture");
    for line in diff.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("json");
        let word = row["text"].as_str().expect("text");
        texts.push(format!(" {word}\n{word}\n{{\"k\": \"{word}\"}} {word}'s"));
    }
    assert_same(tok, "tokenizer.json", &texts);
    assert_same(&compat, "transformers_compatible", &texts);
}

/// Runs near the length where fancy-regex gives up are still split like it does; longer ones go
/// to the generic path (fancy-regex fails at about 1,000,000 characters, after which `tokenizers`
/// keeps the rest of the text as one pre-token).
#[test]
fn long_runs() {
    let tok = qwen3_5();
    let texts: Vec<String> = [" ", "\n ", "a", ".", "\u{301}", "字", " \r\n"]
        .iter()
        .map(|unit| format!("x{}y", unit.repeat(150_000 / unit.len())))
        .collect();
    assert_same(tok, "long runs", &texts);
}

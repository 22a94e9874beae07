//! A small deterministic tokenizer for tiny test checkpoints.
//!
//! Tiny random Qwen3.5 checkpoints used in tests have vocabularies of a few hundred or thousand
//! entries, far below the real 248,077. This module writes a `tokenizer.json` with the same
//! pipeline as Qwen3.5 (NFC, Split(Qwen3.5 regex, Isolated), ByteLevel, `ignore_merges`) over a
//! vocabulary that fits: ids 0..256 are the bytes (GPT-2 byte-to-unicode strings, id = byte
//! value), then merges in a fixed order, then the five special tokens in the last five ids.
//!
//! Merge order: first the 229 uppercase pairs `AA`..`IU` (so a 255-entry label table exists as
//! soon as `vocab_size >= 490`), then common English pieces, then the other uppercase pairs,
//! lowercase pairs, space + letter, capitalised pairs, and lowercase trigrams.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::json_doc::{added_token, byte_level_bpe};
use crate::labels::{label_candidates, MAX_OPTIONS};
use crate::pretokenizer::qwen3_5_pre_tokenizer_json;
use crate::TokenizerError;

/// The added tokens of a synthetic tokenizer, in id order; they take the last ids below vocab_size.
pub const SYNTHETIC_SPECIAL_TOKENS: [&str; 5] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
];

/// Common English pieces (a piece the merges so far cannot reduce to two tokens is skipped).
const ENGLISH: &[&str] = &[
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
    "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le", "ve", "co",
    "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", " t", " a", " s", " w", " o", " i",
    " c", " b", " f", " p", " m", " h", " d", " th", " the", " an", " and", " in", " of", " to",
    " is", " it", "ing", "the", "ion", "tio", "tion", "\n\n", "  ", "   ", "    ", ".\n", " (",
    "):",
];

/// The GPT-2 byte-to-unicode table: printable Latin-1 bytes map to themselves, the others to
/// U+0100 onwards in byte order.
pub fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut table = ['\0'; 256];
    let mut shift = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shift += 1;
            255 + shift
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// All merges the synthetic vocabulary can hold, in id order, as (left, right) raw text. Planned
/// once per process (about 19,000 merges).
fn merge_plan() -> &'static [(String, String)] {
    static PLAN: OnceLock<Vec<(String, String)>> = OnceLock::new();
    PLAN.get_or_init(plan_merges)
}

fn plan_merges() -> Vec<(String, String)> {
    let n_label_pairs = MAX_OPTIONS - 26;
    let upper_pairs: Vec<String> = label_candidates().skip(26).collect();
    let lower = || (b'a'..=b'z').map(char::from);
    let upper = || (b'A'..=b'Z').map(char::from);

    let mut wanted: Vec<String> = Vec::new();
    wanted.extend(upper_pairs[..n_label_pairs].iter().cloned());
    wanted.extend(ENGLISH.iter().map(|s| s.to_string()));
    wanted.extend(upper_pairs[n_label_pairs..].iter().cloned());
    wanted.extend(lower().flat_map(|a| lower().map(move |b| format!("{a}{b}"))));
    wanted.extend(upper().chain(lower()).map(|a| format!(" {a}")));
    wanted.extend(upper().flat_map(|a| lower().map(move |b| format!("{a}{b}"))));
    wanted.extend(
        lower().flat_map(|a| lower().flat_map(move |b| lower().map(move |c| format!("{a}{b}{c}")))),
    );

    // A token is added only if plain BPE over the merges so far reduces it to two pieces; the
    // new merge joins them. So every vocabulary entry is reachable by merges, and `ignore_merges`
    // true (tiktoken, our tokenizer.json) and false (transformers' rebuilt Qwen3_5Tokenizer) give
    // the same ids on every text.
    let mut ranks: HashMap<(String, String), usize> = HashMap::new();
    let mut have: HashSet<String> = HashSet::new();
    let mut plan = Vec::new();
    for s in wanted {
        if have.contains(&s) {
            continue;
        }
        if let [left, right] = &bpe(&s, &ranks)[..] {
            ranks.insert((left.clone(), right.clone()), plan.len());
            plan.push((left.clone(), right.clone()));
            have.insert(s);
        }
    }
    plan
}

/// Plain BPE (no whole-word lookup) of ASCII `text` over `ranks`: repeatedly join the adjacent
/// pair with the lowest rank, leftmost first.
fn bpe(text: &str, ranks: &HashMap<(String, String), usize>) -> Vec<String> {
    let mut pieces: Vec<String> = text.chars().map(String::from).collect();
    loop {
        let best = (0..pieces.len().saturating_sub(1))
            .filter_map(|i| {
                ranks
                    .get(&(pieces[i].clone(), pieces[i + 1].clone()))
                    .map(|&r| (r, i))
            })
            .min();
        let Some((_, i)) = best else { return pieces };
        let right = pieces.remove(i + 1);
        pieces[i].push_str(&right);
    }
}

/// Smallest `vocab_size` [`synthetic_tokenizer_json`] accepts: the 256 bytes and 5 special tokens.
pub const SYNTHETIC_MIN_VOCAB: usize = 256 + SYNTHETIC_SPECIAL_TOKENS.len();

/// Largest `vocab_size` [`synthetic_tokenizer_json`] accepts (every planned merge used).
pub fn synthetic_max_vocab() -> usize {
    SYNTHETIC_MIN_VOCAB + merge_plan().len()
}

/// A deterministic byte-level BPE `tokenizer.json` with exactly `vocab_size` ids and the Qwen3.5
/// pipeline. `vocab_size` must be in `SYNTHETIC_MIN_VOCAB..=synthetic_max_vocab()` (about 19,000);
/// from 490 up its label table has all 255 entries.
pub fn synthetic_tokenizer_json(vocab_size: usize) -> Result<String, TokenizerError> {
    let plan = merge_plan();
    let max = SYNTHETIC_MIN_VOCAB + plan.len();
    if !(SYNTHETIC_MIN_VOCAB..=max).contains(&vocab_size) {
        return Err(TokenizerError::SyntheticVocabSize {
            vocab_size,
            min: SYNTHETIC_MIN_VOCAB,
            max,
        });
    }
    let b2u = byte_to_unicode();
    let mapped = |s: &str| s.bytes().map(|b| b2u[b as usize]).collect::<String>();

    let mut vocab = Map::new();
    for (b, c) in b2u.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    let n_merges = vocab_size - SYNTHETIC_MIN_VOCAB;
    let mut merges = Vec::with_capacity(n_merges);
    for (k, (left, right)) in plan.iter().take(n_merges).enumerate() {
        let (l, r) = (mapped(left), mapped(right));
        vocab.insert(format!("{l}{r}"), json!(256 + k));
        merges.push(json!([l, r]));
    }
    let first_special = vocab_size - SYNTHETIC_SPECIAL_TOKENS.len();
    let added: Vec<Value> = SYNTHETIC_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(k, content)| added_token(first_special + k, content, true))
        .collect();
    let doc = byte_level_bpe(added, qwen3_5_pre_tokenizer_json(), vocab, merges);
    Ok(doc.to_string())
}

/// A minimal Qwen-style chat template (ChatML; a `<think>\n\n</think>\n\n` block when
/// `enable_thinking` is false), small enough to read in a test: the `synthetic` template of the
/// System One chat-layout fixtures.
pub const SYNTHETIC_CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/// The chat template synthetic checkpoints carry: ChatML with the thinking handling of Qwen3-style templates (a
/// system turn, tool turns folded into user turns, an assistant turn's `<think>…</think>` reasoning kept only after
/// the last user query, and `<think>\n\n</think>\n\n` after the generation prompt when `enable_thinking` is false).
/// It is the `qwen3_style` template that transformers rendered for the chat-layout fixtures
/// (tests/fixtures/systemone/layouts/templates/qwen3_style.jinja, checked equal by a test), and it renders one user
/// turn as [`SYNTHETIC_CHAT_TEMPLATE`] does.
pub const QWEN3_CHAT_TEMPLATE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {%- continue %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"##;

/// The `tokenizer_config.json` that goes with [`synthetic_tokenizer_json`] (its chat template:
/// [`QWEN3_CHAT_TEMPLATE`]).
pub fn synthetic_tokenizer_config_json() -> String {
    json!({
        "tokenizer_class": "Qwen3_5Tokenizer",
        "bos_token": null,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": false,
        "split_special_tokens": false,
        "chat_template": QWEN3_CHAT_TEMPLATE
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_to_unicode();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        assert_eq!(t.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn every_planned_english_piece_is_used() {
        let plan: HashSet<String> = merge_plan()
            .iter()
            .map(|(l, r)| format!("{l}{r}"))
            .collect();
        let skipped: Vec<&str> = ENGLISH
            .iter()
            .copied()
            .filter(|s| !plan.contains(*s))
            .collect();
        assert!(skipped.is_empty(), "no merge for {skipped:?}");
        assert_eq!(merge_plan()[0], ("A".to_string(), "A".to_string()));
    }

    #[test]
    fn every_entry_is_reachable_by_merges() {
        let mut ranks = HashMap::new();
        for (k, (l, r)) in merge_plan().iter().enumerate() {
            let whole = format!("{l}{r}");
            ranks.insert((l.clone(), r.clone()), k);
            assert_eq!(
                bpe(&whole, &ranks),
                std::slice::from_ref(&whole),
                "merge {k}"
            );
        }
    }

    #[test]
    fn vocab_size_bounds() {
        assert!(synthetic_tokenizer_json(SYNTHETIC_MIN_VOCAB - 1).is_err());
        assert!(synthetic_tokenizer_json(synthetic_max_vocab() + 1).is_err());
        assert!(synthetic_tokenizer_json(SYNTHETIC_MIN_VOCAB).is_ok());
        assert!(synthetic_max_vocab() > 19_000);
    }
}

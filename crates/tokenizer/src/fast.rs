//! A fast encode for the Qwen3.5 pipeline, giving exactly the ids the `tokenizers` pipeline gives.
//!
//! Why: `tokenizers` spends ~2 µs per token on a rendered System One state, almost all of it in the
//! pre-tokenizer: fancy-regex runs the split regex in its backtracking VM (the `\s+(?!\S)`
//! lookahead makes the whole pattern "hard"), and every split and the ByteLevel step rebuild a
//! `NormalizedString` with per-byte alignments that `encode` then throws away. This module does
//! the same work without either:
//!
//! 1. added tokens are cut out of the raw text with the same leftmost-longest Aho-Corasick match
//!    `tokenizers` uses (only when every added token is `normalized: false` with no
//!    strip/single-word flags, as in Qwen3.5);
//! 2. NFC runs on each piece between them, skipped when the piece is already NFC by the quick
//!    check of the normalization crate `tokenizers` itself uses; otherwise the tokenizer's own
//!    normalizer runs;
//! 3. [`SplitScanner`] cuts pre-tokens as `QWEN3_5_SPLIT_REGEX` does under fancy-regex
//!    (leftmost-first alternation, greedy with backtracking), with the character classes taken
//!    from `regex-syntax`, the crate that defines `\s`, `\p{L}`, `\p{M}`, `\p{N}` for the regex
//!    engine;
//! 4. each pre-token is mapped byte by byte to the GPT-2 byte-level alphabet and handed to the
//!    tokenizer's own BPE model (its vocabulary, merges, `ignore_merges` and word cache).
//!
//! [`QwenFast::new`] only returns a fast path when the live pipeline is exactly the Qwen3.5 one;
//! every other tokenizer keeps the generic path. The generic path stays available as
//! `Tokenizer::encode_generic`, and `tests/fast_path.rs` compares the two on generated text.

use std::borrow::Cow;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex_syntax::hir::{Class, HirKind};
use tokenizers::{
    Model, ModelWrapper, NormalizedString, Normalizer, OffsetReferential, OffsetType,
    PreTokenizedString, PreTokenizer,
};
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

use crate::pretokenizer::{self, Verdict};

/// A pre-token (or the whitespace run before it) this many bytes long or longer sends the whole
/// text to the generic path: fancy-regex gives up on runs of about 1,000,000 characters (its
/// backtracking stack and step limit), after which `tokenizers` keeps the rest of the text as one
/// pre-token. Below this bound it never does, so the scanner agrees with it.
pub(crate) const MAX_RUN_BYTES: usize = 200_000;

/// The fast path of one tokenizer: its added-token matcher and byte alphabet. Cheap to build.
#[derive(Clone, Debug)]
pub(crate) struct QwenFast {
    added: AhoCorasick,
    /// Token id of each `added` pattern.
    added_ids: Vec<u32>,
    byte_chars: &'static [char; 256],
}

impl QwenFast {
    /// The fast path for `inner`, or `None` unless its pipeline is exactly the Qwen3.5 one: NFC,
    /// Split(`QWEN3_5_SPLIT_REGEX`, Isolated) + ByteLevel(no prefix space, no regex), a plain BPE
    /// model, added tokens matched on raw text only, no post-processing that could add ids, no
    /// truncation or padding.
    pub(crate) fn new(inner: &tokenizers::Tokenizer) -> Option<QwenFast> {
        let (normalizer, pre) = pretokenizer::pipeline_json(inner);
        if normalizer != Some(serde_json::json!({"type": "NFC"})) {
            return None;
        }
        if !matches!(pretokenizer::check("", normalizer, pre), Ok(Verdict::Ok)) {
            return None;
        }
        match inner.get_model() {
            ModelWrapper::BPE(bpe)
                if bpe.dropout.is_none()
                    && bpe.continuing_subword_prefix.is_none()
                    && bpe.end_of_word_suffix.is_none()
                    && !bpe.byte_fallback => {}
            _ => return None,
        }
        match inner.get_post_processor() {
            None | Some(tokenizers::PostProcessorWrapper::ByteLevel(_)) => {}
            Some(_) => return None,
        }
        if inner.get_truncation().is_some()
            || inner.get_padding().is_some()
            || inner.get_encode_special_tokens()
        {
            return None;
        }
        let mut added: Vec<(u32, String)> = Vec::new();
        for (id, token) in inner.get_added_tokens_decoder() {
            if token.normalized
                || token.single_word
                || token.lstrip
                || token.rstrip
                || token.content.is_empty()
            {
                return None;
            }
            // The id `tokenizers` matches the content to (the added vocabulary wins over the model).
            if inner.token_to_id(&token.content) != Some(id) {
                return None;
            }
            added.push((id, token.content));
        }
        added.sort();
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(added.iter().map(|(_, content)| content))
            .ok()?;
        let byte_chars = byte_chars()?;
        SplitScanner::get()?;
        Some(QwenFast {
            added: matcher,
            added_ids: added.iter().map(|(id, _)| *id).collect(),
            byte_chars,
        })
    }

    /// The ids of `text`, or `Ok(None)` when a run is too long for the scanner to be sure of
    /// fancy-regex's answer (see [`MAX_RUN_BYTES`]); then the caller uses the generic path.
    pub(crate) fn encode(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
    ) -> tokenizers::Result<Option<Vec<u32>>> {
        let Some(scanner) = SplitScanner::get() else {
            return Ok(None);
        };
        let ModelWrapper::BPE(bpe) = inner.get_model() else {
            return Ok(None);
        };
        let mut out = Encoder {
            bpe,
            normalizer: inner.get_normalizer(),
            scanner,
            byte_chars: self.byte_chars,
            ids: Vec::with_capacity(text.len() / 2 + 1),
            word: String::new(),
        };
        let mut start = 0;
        for m in self.added.find_iter(text) {
            if m.start() > start && !out.segment(&text[start..m.start()])? {
                return Ok(None);
            }
            out.ids.push(self.added_ids[m.pattern().as_usize()]);
            start = m.end();
        }
        if start < text.len() && !out.segment(&text[start..])? {
            return Ok(None);
        }
        Ok(Some(out.ids))
    }
}

struct Encoder<'a> {
    bpe: &'a tokenizers::models::bpe::BPE,
    normalizer: Option<&'a tokenizers::NormalizerWrapper>,
    scanner: &'a SplitScanner,
    byte_chars: &'a [char; 256],
    ids: Vec<u32>,
    /// The current pre-token in the byte-level alphabet.
    word: String,
}

impl Encoder<'_> {
    /// Appends the ids of `text`, a piece between added tokens; false if a run was too long.
    fn segment(&mut self, text: &str) -> tokenizers::Result<bool> {
        let text = self.nfc(text)?;
        let mut start = 0;
        while start < text.len() {
            let Some(end) = self.scanner.next_end(&text, start) else {
                return Ok(false);
            };
            self.word.clear();
            for &b in text[start..end].as_bytes() {
                self.word.push(self.byte_chars[usize::from(b)]);
            }
            // What `BPE::tokenize` does first under `ignore_merges`, without building `Token`s.
            let whole = if self.bpe.ignore_merges {
                self.bpe.token_to_id(&self.word)
            } else {
                None
            };
            match whole {
                Some(id) => self.ids.push(id),
                None => self
                    .ids
                    .extend(self.bpe.tokenize(&self.word)?.into_iter().map(|t| t.id)),
            }
            start = end;
        }
        Ok(true)
    }

    /// `text` after the tokenizer's NFC normalizer, which is skipped when `text` is NFC already.
    fn nfc<'t>(&self, text: &'t str) -> tokenizers::Result<Cow<'t, str>> {
        if is_nfc_fast(text) {
            return Ok(Cow::Borrowed(text));
        }
        let mut normalized = NormalizedString::from(text);
        if let Some(n) = self.normalizer {
            n.normalize(&mut normalized)?;
        }
        Ok(Cow::Owned(normalized.get().to_owned()))
    }
}

/// Whether NFC leaves `text` unchanged, by the quick check of `unicode-normalization-alignments`
/// (the crate behind `tokenizers`' NFC, so the same Unicode tables). Text below U+0300 (every
/// UTF-8 byte below 0xCC) is always NFC: no character there decomposes or combines.
pub(crate) fn is_nfc_fast(text: &str) -> bool {
    text.bytes().all(|b| b < 0xCC) || is_nfc_quick(text.chars()) == IsNormalized::Yes
}

/// The GPT-2 byte alphabet, once it is checked to be the one `tokenizers`' ByteLevel uses (checked
/// on first use; `None` if it is not).
fn byte_chars() -> Option<&'static [char; 256]> {
    static CHARS: OnceLock<Option<[char; 256]>> = OnceLock::new();
    CHARS
        .get_or_init(|| {
            let chars = crate::byte_to_unicode();
            byte_level_agrees(&chars).then_some(chars)
        })
        .as_ref()
}

/// Whether `byte_chars` is the alphabet `tokenizers`' ByteLevel pre-tokenizer maps bytes to, on
/// every byte valid UTF-8 can hold.
fn byte_level_agrees(byte_chars: &[char; 256]) -> bool {
    let probe: String = (0u32..0x80)
        .chain(0x80..0x800)
        .chain([0x800, 0xFFFD, 0x1000, 0x10000, 0x40000, 0x10FFFF])
        .chain((0x80..0xC0).map(|b| 0x1000 | (b & 0x3F)))
        .filter_map(char::from_u32)
        .collect();
    let ours: String = probe.bytes().map(|b| byte_chars[usize::from(b)]).collect();
    let level = tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false);
    let mut pre = PreTokenizedString::from(probe.as_str());
    if level.pre_tokenize(&mut pre).is_err() {
        return false;
    }
    let theirs: String = pre
        .get_splits(OffsetReferential::Normalized, OffsetType::Byte)
        .into_iter()
        .map(|(s, _, _)| s)
        .collect();
    ours == theirs
}

const L: u8 = 1;
const M: u8 = 2;
const N: u8 = 4;
const WS: u8 = 8;

/// Cuts text into the pre-tokens of `QWEN3_5_SPLIT_REGEX`
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// exactly as fancy-regex's `find_iter` does: at each position the first alternative that matches
/// wins, quantifiers are greedy and give back what a later part needs. Some alternative matches at
/// every position and none matches empty, so the pre-tokens cover the text.
pub(crate) struct SplitScanner {
    /// Class bits (`L`, `M`, `N`, `WS`) of each code point: `blocks[index[cp >> 8]][cp & 255]`.
    index: Vec<u16>,
    blocks: Vec<[u8; 256]>,
    /// The characters `(?i:x)` matches, for each x of [`CONTRACTION_LETTERS`].
    casei: [Vec<char>; 8],
}

/// The letters of the contractions `'s 't 're 've 'm 'll 'd`.
const CONTRACTION_LETTERS: [char; 8] = ['s', 't', 'r', 'e', 'v', 'm', 'l', 'd'];

impl SplitScanner {
    /// The shared scanner, built on first use; `None` if `regex-syntax` would not give the classes.
    pub(crate) fn get() -> Option<&'static SplitScanner> {
        static SCANNER: OnceLock<Option<SplitScanner>> = OnceLock::new();
        SCANNER.get_or_init(SplitScanner::build).as_ref()
    }

    fn build() -> Option<SplitScanner> {
        let mut flat = vec![0u8; 0x11_0000];
        for (pattern, bit) in [(r"\p{L}", L), (r"\p{M}", M), (r"\p{N}", N), (r"\s", WS)] {
            for (lo, hi) in class_ranges(pattern)? {
                for cp in lo..=hi {
                    flat[cp as usize] |= bit;
                }
            }
        }
        let mut index = Vec::with_capacity(flat.len() / 256);
        let mut blocks: Vec<[u8; 256]> = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for chunk in flat.chunks_exact(256) {
            let mut block = [0u8; 256];
            block.copy_from_slice(chunk);
            let next = u16::try_from(blocks.len()).ok()?;
            let at = *seen.entry(block).or_insert_with(|| {
                blocks.push(block);
                next
            });
            index.push(at);
        }
        let casei = |c: char| -> Option<Vec<char>> {
            let mut chars = Vec::new();
            for (lo, hi) in class_ranges(&format!("(?i:{c})"))? {
                chars.extend((lo..=hi).filter_map(char::from_u32));
            }
            Some(chars)
        };
        let casei: Vec<Vec<char>> = CONTRACTION_LETTERS
            .into_iter()
            .map(casei)
            .collect::<Option<_>>()?;
        Some(SplitScanner {
            index,
            blocks,
            casei: casei.try_into().ok()?,
        })
    }

    #[inline]
    fn class(&self, c: char) -> u8 {
        let cp = c as usize;
        self.blocks[usize::from(self.index[cp >> 8])][cp & 255]
    }

    /// The character at byte `i` of `s` (a char boundary, `i < s.len()`), its class and its end.
    #[inline]
    fn at(&self, s: &str, i: usize) -> Option<(char, u8, usize)> {
        let c = s.get(i..)?.chars().next()?;
        Some((c, self.class(c), i + c.len_utf8()))
    }

    /// End of the longest run from `i` of characters whose class has a bit of `any` (or none of
    /// `any` when `negate`).
    #[inline]
    fn run(&self, s: &str, mut i: usize, any: u8, negate: bool) -> usize {
        while let Some((_, class, next)) = self.at(s, i) {
            if (class & any != 0) == negate {
                break;
            }
            i = next;
        }
        i
    }

    /// The end of `c` if it is `letter` (one of [`CONTRACTION_LETTERS`]) in any case.
    fn is_casei(&self, c: Option<(char, u8, usize)>, letter: char) -> Option<usize> {
        let (c, _, next) = c?;
        let k = CONTRACTION_LETTERS.iter().position(|&l| l == letter)?;
        self.casei[k].contains(&c).then_some(next)
    }

    /// End of the contraction starting with the apostrophe that ends at `i`, if one does.
    fn contraction(&self, s: &str, i: usize) -> Option<usize> {
        let c1 = self.at(s, i);
        let then = |first: char, second: char| {
            let after = self.is_casei(c1, first)?;
            self.is_casei(self.at(s, after), second)
        };
        self.is_casei(c1, 's')
            .or_else(|| self.is_casei(c1, 't'))
            .or_else(|| then('r', 'e'))
            .or_else(|| then('v', 'e'))
            .or_else(|| self.is_casei(c1, 'm'))
            .or_else(|| then('l', 'l'))
            .or_else(|| self.is_casei(c1, 'd'))
    }

    /// The end of the pre-token that starts at byte `i < s.len()`, or `None` when it (or the
    /// whitespace run it starts) reaches [`MAX_RUN_BYTES`].
    pub(crate) fn next_end(&self, s: &str, i: usize) -> Option<usize> {
        let (end, scanned) = self.match_at(s, i)?;
        (scanned - i < MAX_RUN_BYTES).then_some(end)
    }

    /// (end of the match at `i`, how far the match looked).
    fn match_at(&self, s: &str, i: usize) -> Option<(usize, usize)> {
        let (c, class, i1) = self.at(s, i)?;
        let newline = |c: char| c == '\r' || c == '\n';
        let other = |class: u8| class & (WS | L | M | N) == 0;
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' {
            if let Some(end) = self.contraction(s, i1) {
                return Some((end, end));
            }
        }
        // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
        if !newline(c) && class & (L | N) == 0 {
            if let Some((_, c1, i2)) = self.at(s, i1) {
                if c1 & (L | M) != 0 {
                    let end = self.run(s, i2, L | M, false);
                    return Some((end, end));
                }
            }
        }
        if class & (L | M) != 0 {
            let end = self.run(s, i1, L | M, false);
            return Some((end, end));
        }
        // \p{N}
        if class & N != 0 {
            return Some((i1, i1));
        }
        // ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`
        let mut from = None;
        if c == ' ' {
            if let Some((_, c1, i2)) = self.at(s, i1) {
                if other(c1) {
                    from = Some(i2);
                }
            }
        }
        if from.is_none() && other(class) {
            from = Some(i1);
        }
        if let Some(from) = from {
            let run_end = self.run(s, from, WS | L | M | N, true);
            let end = run_end
                + s[run_end..]
                    .bytes()
                    .take_while(|&b| b == b'\r' || b == b'\n')
                    .count();
            return Some((end, end));
        }
        // Only whitespace is left. `\s*[\r\n]+`: up to the last \r or \n of the run;
        // `\s+(?!\S)`: the run, less its last character unless the text ends there; `\s+`.
        let mut last_newline = newline(c).then_some(i);
        let mut last_start = i;
        let mut j = i1;
        while let Some((c2, class2, next)) = self.at(s, j) {
            if class2 & WS == 0 {
                break;
            }
            if newline(c2) {
                last_newline = Some(j);
            }
            last_start = j;
            j = next;
        }
        let end = match last_newline {
            Some(p) => p + 1,
            None if j == s.len() => j,
            None if last_start > i => last_start,
            None => j,
        };
        Some((end, j))
    }
}

/// The inclusive code point ranges of a one-class pattern as `regex-syntax` (the regex engine's
/// parser and Unicode tables) reads it.
fn class_ranges(pattern: &str) -> Option<Vec<(u32, u32)>> {
    let hir = regex_syntax::parse(pattern).ok()?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => Some(
            class
                .ranges()
                .iter()
                .map(|r| (u32::from(r.start()), u32::from(r.end())))
                .collect(),
        ),
        HirKind::Literal(lit) => {
            let c = std::str::from_utf8(&lit.0).ok()?.chars().next()?;
            Some(vec![(u32::from(c), u32::from(c))])
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let scanner = SplitScanner::get().expect("scanner");
        let mut out = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let end = scanner.next_end(s, i).expect("short runs");
            assert!(end > i, "empty pre-token at {i} of {s:?}");
            out.push(&s[i..end]);
            i = end;
        }
        out
    }

    #[test]
    fn splits_like_the_regex() {
        assert_eq!(
            pieces("Hello world's  end\n\n  x 12 ;;\r\n"),
            ["Hello", " world", "'s", " ", " end", "\n\n", " ", " x", " ", "1", "2", " ;;\r\n"]
        );
        assert_eq!(pieces("  "), ["  "]);
        assert_eq!(pieces("a \t"), ["a", " \t"]);
        assert_eq!(pieces("'LL'Re'sx"), ["'LL", "'Re", "'s", "x"]);
        assert_eq!(pieces("'\u{17f}x"), ["'\u{17f}", "x"]);
        assert_eq!(pieces("नमस्ते दुनिया"), ["नमस्ते", " दुनिया"]);
    }

    /// Every code point, in contexts that exercise each alternative, split by the scanner and by
    /// `tokenizers`' Split pre-tokenizer (fancy-regex) over the Qwen3.5 regex: same pre-tokens.
    #[test]
    fn every_code_point_splits_like_fancy_regex() {
        let split = tokenizers::pre_tokenizers::split::Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(
                crate::QWEN3_5_SPLIT_REGEX.into(),
            ),
            tokenizers::SplitDelimiterBehavior::Isolated,
            false,
        )
        .expect("split regex");
        let chars: Vec<char> = (0..0x11_0000u32).filter_map(char::from_u32).collect();
        for chunk in chars.chunks(4096) {
            let text: String = chunk
                .iter()
                .map(|c| format!("a{c}{c} {c}\n {c}'{c}1{c}"))
                .collect();
            let mut pre = PreTokenizedString::from(text.as_str());
            split.pre_tokenize(&mut pre).expect("split");
            let want: Vec<&str> = pre
                .get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(_, (start, end), _)| &text[start..end])
                .collect();
            let got = pieces(&text);
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b);
                panic!(
                    "chunk from {:?}: first difference at piece {at:?}",
                    chunk[0]
                );
            }
        }
    }

    /// Wherever the NFC skip says "already NFC", `tokenizers`' NFC normalizer indeed changes
    /// nothing: every code point alone, after a letter, and before a combining mark.
    #[test]
    fn nfc_skip_only_skips_nfc_text() {
        let nfc = tokenizers::normalizers::unicode::NFC;
        let mut skipped = 0;
        for c in (0..0x11_0000u32).filter_map(char::from_u32) {
            for text in [format!("{c}"), format!("a{c}"), format!("{c}\u{301}")] {
                if is_nfc_fast(&text) {
                    let mut normalized = NormalizedString::from(text.as_str());
                    nfc.normalize(&mut normalized).expect("nfc");
                    assert_eq!(normalized.get(), text, "U+{:04X}", u32::from(c));
                    skipped += 1;
                }
            }
        }
        assert!(skipped > 2_000_000, "{skipped}");
        assert!(!is_nfc_fast("e\u{301}") && is_nfc_fast("caf\u{e9} \u{4f60}"));
    }

    #[test]
    fn classes_come_from_regex_syntax() {
        let s = SplitScanner::get().expect("scanner");
        assert_eq!(s.class('a'), L);
        assert_eq!(s.class('\u{301}'), M);
        assert_eq!(s.class('٣'), N);
        assert_eq!(s.class('\u{3000}'), WS);
        assert_eq!(s.class('\u{85}'), WS);
        assert_eq!(s.class('\u{200b}'), 0);
        // `(?i:s)` also matches the long s.
        assert_eq!(s.casei[0], ['S', 's', '\u{17f}']);
    }
}

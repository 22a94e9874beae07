//! Generated ids → text, incrementally: deltas that never split a UTF-8 character, and stop strings.
//!
//! A byte-level tokenizer's token may hold part of a character; decoding it alone gives U+FFFD. So the text is
//! decoded over a window of ids (the ids since the last stable point), and only a decoding that does not end in
//! U+FFFD moves the stable point (the incremental detokenizer of vLLM and transformers' `TextStreamer`). A delta also
//! holds back any tail that could still become one of the stop strings, so a stop string never reaches a stream.
//!
//! An id the tokenizer has no token for adds no text. The model may generate any id below its vocabulary, which can
//! be wider than its tokenizer's (Qwen3.5's head pads 248,077 tokens to 248,320 rows; a synthetic checkpoint with the
//! small synthetic tokenizer knows 19,934 of them): transformers' `decode` skips such ids, and so does this stream.

use onepass_tokenizer::{Tokenizer, TokenizerError};

pub struct TextStream<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    /// Ids before `prefix` are folded into `text`; `prefix..read` is the window that gives `text`'s last piece.
    prefix: usize,
    read: usize,
    /// The text of every stable id.
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    stops: Vec<String>,
    /// A stop string matched: `text` ends before it, nothing more is added.
    stopped: bool,
}

impl<'t> TextStream<'t> {
    pub fn new(tok: &'t Tokenizer, stops: &[String]) -> TextStream<'t> {
        TextStream {
            tok,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            stopped: false,
        }
    }

    /// Adds one generated id. → true when the text now holds a stop string (the text is cut before it).
    pub fn push(&mut self, id: u32) -> Result<bool, TokenizerError> {
        if self.stopped {
            return Ok(true);
        }
        if self.tok.inner().id_to_token(id).is_none() {
            return Ok(false); // no text, as transformers' decode skips it
        }
        self.ids.push(id);
        let before = self.tok.decode(&self.ids[self.prefix..self.read])?;
        let now = self.tok.decode(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            match now.strip_prefix(before.as_str()) {
                Some(new) => self.text.push_str(new),
                // A decoder that rewrote the window's start: take the window's text again from the stable point.
                None => {
                    let stable = self.tok.decode(&self.ids[..self.prefix])?;
                    self.text = stable + &now;
                    self.sent = self.sent.min(self.text.len());
                    while !self.text.is_char_boundary(self.sent) {
                        self.sent -= 1;
                    }
                }
            }
            self.prefix = self.read;
            self.read = self.ids.len();
        }
        Ok(self.check_stops())
    }

    /// Cuts `text` at the earliest stop string that starts in the part not yet handed out (or overlapping it).
    fn check_stops(&mut self) -> bool {
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|p| from + p))
            .min();
        if let Some(at) = hit {
            self.text.truncate(at.max(self.sent));
            self.stopped = true;
        }
        self.stopped
    }

    /// The stable text not handed out yet, less a tail that may still turn into a stop string.
    pub fn delta(&mut self) -> String {
        let mut end = self.text.len();
        if !self.stopped {
            // The longest suffix of the text that is a proper prefix of some stop string.
            for (i, _) in self.text[self.sent..].char_indices() {
                let at = self.sent + i;
                let tail = &self.text[at..];
                if self
                    .stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
                {
                    end = at;
                    break;
                }
            }
        }
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        out
    }

    /// The end: what was held back (a window still ending in part of a character, as U+FFFD; a tail that did not
    /// become a stop string) and not handed out yet.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        if !self.stopped && self.read < self.ids.len() {
            let before = self.tok.decode(&self.ids[self.prefix..self.read])?;
            let now = self.tok.decode(&self.ids[self.prefix..])?;
            match now.strip_prefix(before.as_str()) {
                Some(rest) => self.text.push_str(rest),
                None => self.text = self.tok.decode(&self.ids)?,
            }
            self.read = self.ids.len();
            self.check_stops();
        }
        let out = self.text.get(self.sent..).unwrap_or_default().to_string();
        self.sent = self.text.len();
        Ok(out)
    }

    /// All the text so far (what the deltas add up to once [`TextStream::finish`] ran).
    pub fn text(&self) -> &str {
        &self.text
    }
}

//! The prompt of a decision and where its prefix ends, on ids.
//!
//! The prompt is the model's chat template rendered over `prefix + suffix` as one user message, with the generation
//! prompt and thinking off (`enable_thinking=false` where the template reads it: a decision reads the first token of
//! the answer, which with thinking on would be the thinking opener). A model without a chat template reads
//! `prefix + suffix` as plain text. Where the prefix ends is found on ids, never on text: the prefix is also rendered
//! alone, the two id sequences agree up to the join, and one agreeing id is given back, because a tokenizer merge
//! across the join can make the last id that looks shared a different id in context.

use std::path::Path;

use onepass_tokenizer::Tokenizer;

use crate::prompt::chat::{render, SpecialTokens};

/// How a model's decide prompts are rendered: its chat template (with the named special tokens it is given), or
/// plain text.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidePrompt {
    template: Option<(String, SpecialTokens)>,
}

/// The ids of one decision's prompt and how many of them are the prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPrompt {
    /// The whole prompt's ids.
    pub ids: Vec<u32>,
    /// `ids[..prefix_len]` is the prefix: the ids a later request whose prefix extends this one's shares. Always
    /// below `ids.len()`, so at least one id is prefilled after it and read.
    pub prefix_len: usize,
}

impl DecidePrompt {
    /// The tokenizer's chat template (special tokens from `dir/tokenizer_config.json` when given, as transformers
    /// passes them), or plain text when it has none.
    pub fn for_tokenizer(tok: &Tokenizer, dir: Option<&Path>) -> DecidePrompt {
        let template = tok
            .chat_template()
            .filter(|t| !t.trim().is_empty())
            .map(|t| {
                let special = match dir {
                    Some(d) if d.join("tokenizer_config.json").is_file() => {
                        SpecialTokens::from_dir(d)
                    }
                    _ => SpecialTokens::from_tokenizer(tok),
                };
                (t.to_string(), special)
            });
        DecidePrompt { template }
    }

    /// Plain text: the prompt is `prefix + suffix` as it is.
    pub fn plain() -> DecidePrompt {
        DecidePrompt { template: None }
    }

    /// A given template.
    pub fn with_template(template: &str, special: SpecialTokens) -> DecidePrompt {
        DecidePrompt {
            template: Some((template.to_string(), special)),
        }
    }

    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The text the model reads for a user message `content`.
    pub fn render(&self, content: &str) -> Result<String, String> {
        match &self.template {
            None => Ok(content.to_string()),
            Some((t, special)) => render(t, content, special).map_err(|e| e.to_string()),
        }
    }

    /// The prompt of `prefix + suffix`, tokenized, and where its prefix ends.
    pub fn split(
        &self,
        tok: &Tokenizer,
        prefix: &str,
        suffix: &str,
    ) -> Result<SplitPrompt, String> {
        let whole = format!("{prefix}{suffix}");
        let ids = tok
            .encode(&self.render(&whole)?)
            .map_err(|e| e.to_string())?;
        let alone = tok
            .encode(&self.render(prefix)?)
            .map_err(|e| e.to_string())?;
        let prefix_len = prefix_len(&ids, &alone);
        Ok(SplitPrompt { ids, prefix_len })
    }
}

/// Where the prefix ends in `whole`, given the ids of the prefix rendered alone: the ids both agree on, less one
/// given back, and never the whole prompt.
pub fn prefix_len(whole: &[u32], alone: &[u32]) -> usize {
    let agree = whole.iter().zip(alone).take_while(|(a, b)| a == b).count();
    agree.saturating_sub(1).min(whole.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_ends_one_id_before_the_renderings_part() {
        assert_eq!(prefix_len(&[1, 2, 3, 4, 5], &[1, 2, 3, 9]), 2);
        assert_eq!(prefix_len(&[1, 2, 3], &[7]), 0);
        assert_eq!(prefix_len(&[1, 2, 3], &[]), 0);
        // The prefix is the whole prompt (an empty suffix): one id is still left to read.
        assert_eq!(prefix_len(&[1, 2, 3], &[1, 2, 3]), 2);
        assert_eq!(prefix_len(&[1, 2, 3], &[1, 2, 3, 4]), 2);
        assert_eq!(prefix_len(&[], &[]), 0);
    }
}

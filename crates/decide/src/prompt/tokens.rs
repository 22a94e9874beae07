//! The prompt as token ids: state-first (decider/prompt_fast.py `build_rows`) and schema-first
//! (decider/prompt.py `build_schema_first`) rows, plain or chat layout; slots, temperatures, usage. The state is
//! rendered and tokenized only as far as its token cap needs ([`capped_ids`]).

use crate::config::{DecideConfig, Layout, Order};
use crate::error::ApiError;
use crate::prompt::chat::{self, ChatError, ChatTemplate};
use crate::prompt::text::{
    plan_rows, render_questions, row_types, PlanEntry, PlanRow, QType, RenderedQuestion,
};
use crate::pyjson::{dumps_capped, Value as Json};
use crate::pyjson::{obj, Value};
use crate::request::Request;
use onepass_tokenizer::{Tokenizer, TokenizerError};

/// Option letters of the narrow rendering.
pub const LETTERS: &[u8; 10] = b"ABCDEFGHIJ";
/// Up to this many options a question block is one encoded string.
pub const NARROW: usize = 10;
pub const MAX_OPTIONS: usize = 255;

/// Why rows could not be built (not a client error: the tokenizer or the layout failed).
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Chat(ChatError),
    #[error("2..255 options required, got {0}")]
    Options(usize),
}

impl From<RowsError> for ApiError {
    fn from(e: RowsError) -> Self {
        ApiError::detail(500, e.to_string())
    }
}

/// One token sequence fed to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `[T]` token ids; no BOS.
    pub ids: Vec<u32>,
    /// Positions whose next-token label logits are read, in question order.
    pub slots: Vec<usize>,
    /// Options per slot (the readout uses label ids `[0, nopts)`).
    pub nopts: Vec<usize>,
    /// Answer type per slot (selects the temperature).
    pub types: Vec<QType>,
    /// Softmax temperature per slot.
    pub temperatures: Vec<f64>,
}

/// A planned request: the rendered questions, how answers map onto rows, and the rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub rqs: Vec<(String, RenderedQuestion)>,
    pub index: Vec<PlanEntry>,
    pub rows: Vec<Row>,
    /// Ids of `"Context:\n" + state` (after truncation) that open every row.
    pub ctx_len: usize,
    /// `usage.input_tokens` (decider-contract R4.5.1).
    pub input_tokens: usize,
}

impl Plan {
    /// Slots in row order, flattened: the order in which [`crate::assemble::assemble`] takes probabilities.
    pub fn slot_count(&self) -> usize {
        self.rows.iter().map(|r| r.slots.len()).sum()
    }

    /// `{"rows":[{"ids","slots","nopts"}],"usage":{"input_tokens"}}` — the `render` view of a plan.
    pub fn to_value(&self) -> Value {
        let ints =
            |xs: &mut dyn Iterator<Item = usize>| Value::Array(xs.map(Value::from).collect());
        let rows = self
            .rows
            .iter()
            .map(|r| {
                obj([
                    ("ids", ints(&mut r.ids.iter().map(|&i| i as usize))),
                    ("slots", ints(&mut r.slots.iter().copied())),
                    ("nopts", ints(&mut r.nopts.iter().copied())),
                ])
            })
            .collect();
        obj([
            ("rows", Value::Array(rows)),
            (
                "usage",
                obj([("input_tokens", Value::from(self.input_tokens))]),
            ),
        ])
    }
}

/// Request → rows: render (422s), plan, tokenize, temperatures, usage. Uses `isolated_levels && independent`
/// (decider-contract R1.8.4) and the state cap `cfg.max_state_tokens`.
pub fn plan(req: &Request, tok: &Tokenizer, cfg: &DecideConfig) -> Result<Plan, ApiError> {
    let rqs = render_questions(&req.questions)?;
    plan_rendered(
        rqs,
        StateText::Rendered(&req.state),
        req.independent,
        tok,
        cfg,
    )
    .map_err(ApiError::from)
}

/// [`plan`] after rendering (the server's `prepare`; for schema-first, the library's `_system_one_items`).
/// The layout is `cfg.layout` (plain or chat, with `cfg.chat`'s template; built here from `tok` if absent) and the
/// order `cfg.order`.
pub fn plan_rendered(
    rqs: Vec<(String, RenderedQuestion)>,
    context: StateText<'_>,
    independent: bool,
    tok: &Tokenizer,
    cfg: &DecideConfig,
) -> Result<Plan, RowsError> {
    let built;
    let chat: Option<&ChatTemplate> = match (cfg.layout, &cfg.chat) {
        (Layout::Plain, _) => None,
        (Layout::Chat, Some(c)) => Some(c),
        (Layout::Chat, None) => {
            built = chat::load(tok, None).map_err(RowsError::Chat)?;
            Some(&built)
        }
    };
    let (flat, index) = plan_rows(&rqs, cfg.isolated_levels && independent);
    let types = row_types(&rqs, &index);
    let groups: Vec<Vec<(&PlanRow, QType)>> = if independent {
        flat.iter()
            .zip(types.iter().copied())
            .map(|p| vec![p])
            .collect()
    } else {
        // Packed: always one row, even with no questions (the reference then reads a bare context row and counts
        // its tokens in usage).
        vec![flat.iter().zip(types.iter().copied()).collect()]
    };
    for g in &groups {
        if let Some((q, _)) = g
            .iter()
            .find(|(q, _)| !(2..=MAX_OPTIONS).contains(&q.options.len()))
        {
            return Err(RowsError::Options(q.options.len()));
        }
    }
    let temps = match cfg.order {
        Order::StateFirst | Order::SchemaFirst => &cfg.temperature,
        Order::SchemaFirstCached => &cfg.temperature_schema,
    };
    let questions: Vec<Vec<Question<'_>>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|(q, _)| (q.question.as_str(), q.options.as_slice()))
                .collect()
        })
        .collect();
    let (rows, ctx_len) = match cfg.order {
        Order::StateFirst => {
            state_first_rows(tok, chat, context, &questions, cfg.max_state_tokens)?
        }
        Order::SchemaFirst | Order::SchemaFirstCached => {
            schema_first_rows(tok, chat, context, &questions, cfg.max_state_tokens)?
        }
    };
    let rows = rows
        .into_iter()
        .zip(&groups)
        .map(|((ids, slots), group)| Row {
            ids,
            slots,
            nopts: group.iter().map(|(q, _)| q.options.len()).collect(),
            types: group.iter().map(|(_, t)| *t).collect(),
            temperatures: group
                .iter()
                .map(|(q, t)| temps.for_slot(*t, q.options.len()))
                .collect(),
        })
        .collect::<Vec<_>>();
    let input_tokens = unique_tokens(&rows.iter().map(|r| r.ids.as_slice()).collect::<Vec<_>>());
    Ok(Plan {
        rqs,
        index,
        rows,
        ctx_len,
        input_tokens,
    })
}

/// Ids and slots of one row.
pub type RowIds = (Vec<u32>, Vec<usize>);

/// A question as the rows see it: the text and the option texts (in label order).
pub type Question<'a> = (&'a str, &'a [String]);

/// State-first rows (prompt_fast.build_rows): plain R2.3 or chat R2.5.2. → rows and the shared leading ids
/// (`[chat head +] "Context:\n" + state`).
pub fn state_first_rows(
    tok: &Tokenizer,
    chat: Option<&ChatTemplate>,
    context: StateText<'_>,
    groups: &[Vec<Question<'_>>],
    max_ctx_tokens: usize,
) -> Result<(Vec<RowIds>, usize), TokenizerError> {
    let mut ctx = chat.map_or_else(Vec::new, |c| c.head.clone());
    ctx.extend(context_ids(tok, context, max_ctx_tokens)?); // the cap leaves the template out
    let mut rows = Vec::with_capacity(groups.len());
    for group in groups {
        let multi = group.len() > 1;
        let mut ids = ctx.clone();
        let mut slots = Vec::with_capacity(group.len());
        match chat {
            None => {
                for (k, (text, options)) in group.iter().enumerate() {
                    ids.extend(question_piece(tok, text, options, k, multi)?);
                    slots.push(ids.len() - 1); // decider-contract R2.3.2: slot = last id (" (")
                }
            }
            Some(c) => {
                // decider-contract R2.5.2: every question block (header and options encoded apart), the template
                // tail, then every answer piece.
                for (k, (text, options)) in group.iter().enumerate() {
                    let num = numbering(k, multi);
                    ids.extend(tok.encode(&format!("\n\nQuestion{num}: {text}\nOptions:"))?);
                    ids.extend(options_ids(tok, options)?);
                }
                chat_answers(tok, c, group.len(), &mut ids, &mut slots)?;
            }
        }
        rows.push((ids, slots));
    }
    Ok((rows, ctx.len()))
}

/// Schema-first rows (prompt.build_schema_first): prefix = `[chat head +]` the question blocks, suffix =
/// `"\n\nContext:\n"` + the state's own ids (only they are capped) + `[chat tail +]` the answer pieces.
/// → rows and the shared leading ids (the chat head, or none).
// decider-contract R2.4.1, R2.4.2, R2.5.3
pub fn schema_first_rows(
    tok: &Tokenizer,
    chat: Option<&ChatTemplate>,
    context: StateText<'_>,
    groups: &[Vec<Question<'_>>],
    max_ctx_tokens: usize,
) -> Result<(Vec<RowIds>, usize), TokenizerError> {
    let mut state = tok.encode("\n\nContext:\n")?;
    state.extend(capped_ids(tok, "", context, max_ctx_tokens)?);
    let mut rows = Vec::with_capacity(groups.len());
    for group in groups {
        let multi = group.len() > 1;
        let mut ids = chat.map_or_else(Vec::new, |c| c.head.clone());
        for (k, (text, options)) in group.iter().enumerate() {
            let sep = if k > 0 { "\n\n" } else { "" };
            let num = numbering(k, multi);
            ids.extend(tok.encode(&format!("{sep}Question{num}: {text}\nOptions:"))?);
            ids.extend(options_ids(tok, options)?);
        }
        ids.extend_from_slice(&state);
        let mut slots = Vec::with_capacity(group.len());
        match chat {
            Some(c) => chat_answers(tok, c, group.len(), &mut ids, &mut slots)?,
            None => {
                for k in 0..group.len() {
                    let sep = if k == 0 { "\n\n" } else { "\n" };
                    let num = numbering(k, multi);
                    ids.extend(tok.encode(&format!("{sep}Answer{num}: ("))?);
                    slots.push(ids.len() - 1);
                }
            }
        }
        rows.push((ids, slots));
    }
    Ok((rows, chat.map_or(0, |c| c.head.len())))
}

/// The chat template tail, then the answer piece of each of `n` questions, a slot at the end of every piece.
// decider-contract R2.5.2, R2.5.3
fn chat_answers(
    tok: &Tokenizer,
    c: &ChatTemplate,
    n: usize,
    ids: &mut Vec<u32>,
    slots: &mut Vec<usize>,
) -> Result<(), TokenizerError> {
    ids.extend_from_slice(&c.tail);
    for k in 0..n {
        ids.extend(c.answer_ids(tok, k, n > 1)?);
        slots.push(ids.len() - 1);
    }
    Ok(())
}

/// `" k"` (1-based) in rows with several questions, else nothing.
pub(crate) fn numbering(k: usize, multi: bool) -> String {
    if multi {
        format!(" {}", k + 1)
    } else {
        String::new()
    }
}

/// prompt.py `_options_ids`: the option block on its own — one encode of `"\n(A) o…"` up to ten options, else per
/// option `open_ids + [label id] + encode(") " + o)`.
pub fn options_ids(tok: &Tokenizer, options: &[String]) -> Result<Vec<u32>, TokenizerError> {
    if options.len() <= NARROW {
        return tok.encode(&narrow_options(options));
    }
    let table = tok.label_table()?;
    let mut out = Vec::new();
    for (j, o) in options.iter().enumerate() {
        out.extend_from_slice(&table.open_ids);
        out.push(table.ids[j]); // the label is an id, never tokenized from text
        out.extend(tok.encode(&format!(") {o}"))?);
    }
    Ok(out)
}

/// `"\n(A) o0\n(B) o1…"`: the text of a narrow (at most [`NARROW`]) option block.
fn narrow_options(options: &[String]) -> String {
    let mut s = String::new();
    for (j, o) in options.iter().enumerate() {
        s.push_str(&format!("\n({}) {o}", LETTERS[j] as char));
    }
    s
}

/// `encode("Context:\n" + state)[:max]` — one encode, header included in the cap.
// decider-contract R2.3.1
pub fn context_ids(
    tok: &Tokenizer,
    context: StateText<'_>,
    max_ctx_tokens: usize,
) -> Result<Vec<u32>, TokenizerError> {
    capped_ids(tok, "Context:\n", context, max_ctx_tokens)
}

/// The state as the prompt shows it, not yet built: a string shown verbatim (`/decide`'s context), or a request's
/// `state`, shown as `render_state` writes it (a string verbatim, anything else `json.dumps(annotate_indices(state))`,
/// decider-contract R1.2.1).
#[derive(Debug, Clone, Copy)]
pub enum StateText<'a> {
    Verbatim(&'a str),
    Rendered(&'a Json),
}

/// Bytes of state text first built per id of the cap, and most built per id (see [`capped_ids`]).
const FIRST_BYTES_PER_ID: usize = 8;
const MOST_BYTES_PER_ID: usize = 32;

/// `encode(head + text)[:max]`, where `text` is the state's text, with only as much of that text built and tokenized
/// as the cap needs: peak memory and time are bounded by the cap, not by the request.
///
/// The text is built up to a byte budget (`8 * max` bytes at first, doubled up to `32 * max`). When it ends within
/// the budget, the result is the reference's by construction. Otherwise it is cut at its last *exact cut* — just after
/// an ASCII digit, or between an ASCII letter, digit or punctuation mark and an ASCII space — and tokenized. Under the
/// Qwen3.5 pipeline such a cut is a pre-token boundary of the whole text whatever follows it: the split regex takes a
/// digit alone, none of its greedy runs crosses a digit or starts a non-space run at a space, NFC composes nothing
/// across either, and no added token holds a digit or a space (checked). So the ids before it are the ids of the whole
/// text, and once there are `max` of them they are the reference's. A text that reaches `32 * max` bytes without
/// `max` ids before an exact cut (more than 32 bytes per id, or no digit or space near the cut), or a tokenizer
/// without the Qwen3.5 pipeline, is cut at the budget: only the ids near that cut can differ from the reference's
/// (docs/systemone.md, "Divergences").
pub fn capped_ids(
    tok: &Tokenizer,
    head: &str,
    state: StateText<'_>,
    max: usize,
) -> Result<Vec<u32>, TokenizerError> {
    let verbatim = match state {
        StateText::Verbatim(s) => Some(s),
        StateText::Rendered(Json::Str(s)) => Some(s.as_str()),
        StateText::Rendered(_) => None,
    };
    let first = head.len() + FIRST_BYTES_PER_ID.saturating_mul(max).max(1 << 12);
    let most = head.len() + MOST_BYTES_PER_ID.saturating_mul(max).max(1 << 16);
    let exact = exact_cuts(tok);
    let mut budget = first.min(most);
    loop {
        let mut text = String::with_capacity(budget.min(1 << 20));
        text.push_str(head);
        let whole = match (verbatim, state) {
            (Some(s), _) => {
                let mut end = s.len().min(budget.saturating_sub(head.len()));
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                text.push_str(&s[..end]);
                end == s.len()
            }
            (None, StateText::Rendered(v)) => dumps_capped(&mut text, v, true, budget).is_ok(),
            (None, StateText::Verbatim(_)) => unreachable!("a verbatim state is a string"),
        };
        if !whole && exact {
            if let Some(cut) = last_exact_cut(&text) {
                let mut ids = tok.encode(&text[..cut])?;
                if ids.len() >= max {
                    ids.truncate(max);
                    return Ok(ids);
                }
            }
        }
        if whole || budget >= most {
            let mut ids = tok.encode(&text)?;
            ids.truncate(max);
            return Ok(ids);
        }
        budget = budget.saturating_mul(2).min(most);
    }
}

/// Whether [`last_exact_cut`]'s cuts are pre-token boundaries for `tok`: its pipeline is exactly the Qwen3.5 one
/// and no added token holds an ASCII digit or space.
fn exact_cuts(tok: &Tokenizer) -> bool {
    tok.has_fast_path()
        && tok
            .inner()
            .get_added_tokens_decoder()
            .values()
            .all(|t| !t.content.bytes().any(|b| b.is_ascii_digit() || b == b' '))
}

/// The last offset `c` of `text` just after an ASCII digit, or with an ASCII letter, digit or punctuation mark at
/// `c - 1` and a space at `c` (see [`capped_ids`]).
fn last_exact_cut(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    (1..=b.len()).rev().find(|&c| {
        b[c - 1].is_ascii_digit() || (b[c - 1].is_ascii_graphic() && b.get(c) == Some(&b' '))
    })
}

/// One `\n\nQuestion…: text\nOptions:…\nAnswer…: (` block.
// decider-contract R2.3.2, R2.3.4
pub fn question_piece(
    tok: &Tokenizer,
    text: &str,
    options: &[String],
    k: usize,
    multi: bool,
) -> Result<Vec<u32>, TokenizerError> {
    let num = numbering(k, multi);
    let head = format!("\n\nQuestion{num}: {text}\nOptions:");
    let tail = format!("\nAnswer{num}: (");
    if options.len() <= NARROW {
        // narrow: one encode of the whole block
        return tok.encode(&format!("{head}{}{tail}", narrow_options(options)));
    }
    let mut piece = tok.encode(&head)?;
    piece.extend(options_ids(tok, options)?);
    piece.extend(tok.encode(&tail)?);
    Ok(piece)
}

/// `systemone.unique_tokens`: LCP of all rows (capped at the shortest row) counted once, plus every remainder.
// decider-contract R4.5.1
pub fn unique_tokens(rows: &[&[u32]]) -> usize {
    if rows.len() < 2 {
        return rows.iter().map(|r| r.len()).sum();
    }
    let short = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let lcp = lcp_up_to(rows, short);
    lcp + rows.iter().map(|r| r.len() - lcp).sum::<usize>()
}

/// `shared_prefix.common_prefix_len`: the LCP capped one token below the shortest row, so every slot stays in a suffix.
// decider-contract R5.5.1
pub fn common_prefix_len(rows: &[&[u32]]) -> usize {
    let short = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    lcp_up_to(rows, short.saturating_sub(1))
}

fn lcp_up_to(rows: &[&[u32]], cap: usize) -> usize {
    let Some(first) = rows.first() else { return 0 };
    let mut n = 0;
    while n < cap && rows.iter().all(|r| r[n] == first[n]) {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_helpers() {
        let a: &[u32] = &[1, 2, 3, 4];
        let b: &[u32] = &[1, 2, 3];
        let c: &[u32] = &[1, 2, 3];
        assert_eq!(unique_tokens(&[a, b, c]), 3 + 1);
        assert_eq!(common_prefix_len(&[a, b, c]), 2);
        assert_eq!(unique_tokens(&[]), 0);
        assert_eq!(unique_tokens(&[a]), 4);
    }
}

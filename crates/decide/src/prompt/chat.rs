//! The chat layout (decider-contract R2.5, decider/prompt.py `ChatTemplate`): the model's own chat template rendered
//! around one user turn, split at a sentinel into the ids before the prompt (`head`) and between the prompt and the
//! answer pieces (`tail`).
//!
//! The template is rendered the way transformers 5.24 `apply_chat_template` renders it for decider-ai: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a `tojson` that is Python's
//! `json.dumps(ensure_ascii=False)`, `namespace`, Python string and dict methods (`startswith`, `split`, `items`, …),
//! and the variables `messages=[{"role": "user", "content": S}]`, `add_generation_prompt=True`, `tools=None`,
//! `documents=None`, the tokenizer's named special tokens (`bos_token`, `eos_token`, …) and `enable_thinking=False`
//! only when the template text mentions `enable_thinking`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Environment, Error as JError, ErrorKind, State, Value as JValue};
use onepass_tokenizer::{Tokenizer, TokenizerError};

use crate::prompt::tokens::NARROW;
use crate::pyjson::{is_py_space, json_float, repr_str, write_json_str};

/// The user content the template is rendered with; the rendering is split here.
pub const SENTINEL: &str = "@@DECIDER_USER_CONTENT@@";
/// The answer word of the assistant turn (`ChatTemplate(tok, answer="Answer")`).
pub const ANSWER: &str = "Answer";
/// transformers `SPECIAL_TOKENS_ATTRIBUTES`, in order.
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Why a chat-layout model cannot be read. Display is the reference's `ValueError` text where it has one; the
/// reference raises these at load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    #[error("the model is configured for the chat layout (\"layout\": \"chat\") but its tokenizer has no chat template")]
    NoTemplate,
    #[error("chat layout: rendering the chat template failed: {0}")]
    Render(String),
    /// The rendering holds the user content `n` times, not once (Python's unpacking error of `head, tail = s.split(S)`).
    #[error("{}", if *.0 == 0 { "not enough values to unpack (expected 2, got 1)" } else { "too many values to unpack (expected 2)" })]
    Sentinel(usize),
    #[error("chat layout: the label {} does not tokenize as one token after {}: (", repr_str(.0), repr_str(ANSWER))]
    Label(String),
    #[error("chat layout: the chat template tail merges with the answer prefix")]
    TailMerges,
    #[error("chat layout: tokenizer: {0}")]
    Tokenizer(String),
}

impl From<TokenizerError> for ChatError {
    fn from(e: TokenizerError) -> Self {
        ChatError::Tokenizer(e.to_string())
    }
}

/// The named special tokens transformers passes to every template (`special_tokens_map`: only those that are set).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpecialTokens(pub Vec<(String, String)>);

impl SpecialTokens {
    /// From `<dir>/tokenizer_config.json` (a token is a string or an AddedToken object with `content`); a missing
    /// file or key is no token.
    pub fn from_dir(dir: &Path) -> SpecialTokens {
        let cfg: Option<serde_json::Value> =
            std::fs::read_to_string(dir.join("tokenizer_config.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
        let mut out = Vec::new();
        if let Some(cfg) = cfg {
            for name in SPECIAL_TOKEN_NAMES {
                let s = match cfg.get(name) {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(serde_json::Value::Object(o)) => o
                        .get("content")
                        .and_then(|c| c.as_str())
                        .map(str::to_string),
                    _ => None,
                };
                if let Some(s) = s {
                    out.push((name.to_string(), s));
                }
            }
        }
        SpecialTokens(out)
    }

    /// What the tokenizer knows: `eos_token` and `pad_token` (no BOS, as for Qwen3.5).
    pub fn from_tokenizer(tok: &Tokenizer) -> SpecialTokens {
        let mut out = Vec::new();
        for (name, id) in [("eos_token", tok.eos_id()), ("pad_token", tok.pad_id())] {
            if let Some(s) = id.and_then(|i| tok.inner().id_to_token(i)) {
                out.push((name.to_string(), s));
            }
        }
        SpecialTokens(out)
    }
}

/// The chat template of one tokenizer, as ids around the user content.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTemplate {
    pub head_text: String,
    pub tail_text: String,
    /// `encode(head_text)`: opens every row.
    pub head: Vec<u32>,
    /// `encode(tail_text)`: between the last question (or the state) and the answer pieces.
    pub tail: Vec<u32>,
}

impl ChatTemplate {
    /// `ChatTemplate(tok)` for the tokenizer's own template (`chat_template.jinja` or `tokenizer_config.json`).
    // decider-contract R2.5.1
    pub fn new(tok: &Tokenizer, special: &SpecialTokens) -> Result<ChatTemplate, ChatError> {
        match tok.chat_template() {
            Some(t) if !t.is_empty() => ChatTemplate::from_template(tok, t, special),
            _ => Err(ChatError::NoTemplate),
        }
    }

    /// Render `template`, split at the sentinel, close an open thinking block, encode, validate.
    pub fn from_template(
        tok: &Tokenizer,
        template: &str,
        special: &SpecialTokens,
    ) -> Result<ChatTemplate, ChatError> {
        let s = render(template, SENTINEL, special)?;
        let parts: Vec<&str> = s.split(SENTINEL).collect();
        if parts.len() != 2 {
            return Err(ChatError::Sentinel(parts.len() - 1));
        }
        let head_text = parts[0].to_string();
        let mut tail_text = parts[1].to_string();
        // The fix-ups run in this order and each sees the result of the one before.
        for (opened, closed) in [
            ("<think>\n", "</think>\n\n"),
            ("<think>", "</think>\n\n"),
            ("<|channel>thought\n", "<channel|>"),
        ] {
            if tail_text.ends_with(opened) {
                tail_text.push_str(closed);
            }
        }
        let head = tok.encode(&head_text)?;
        let tail = tok.encode(&tail_text)?;
        let table = tok.label_table()?;
        let pre = tok.encode(&format!("{ANSWER}: ("))?;
        for (j, &id) in table.ids.iter().take(NARROW).enumerate() {
            let name = label_name(j);
            let mut want = pre.clone();
            want.push(id);
            if tok.encode(&format!("{ANSWER}: ({name}"))? != want {
                return Err(ChatError::Label(name));
            }
        }
        let mut want = tail.clone();
        want.extend_from_slice(&pre);
        if tok.encode(&format!("{tail_text}{ANSWER}: ("))? != want {
            return Err(ChatError::TailMerges);
        }
        Ok(ChatTemplate {
            head_text,
            tail_text,
            head,
            tail,
        })
    }

    /// Answer piece `k`: `"Answer: ("`, or `"Answer k: ("` with several questions; later pieces after a newline.
    // decider-contract R2.5.2
    pub fn answer_ids(
        &self,
        tok: &Tokenizer,
        k: usize,
        multi: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let nl = if k == 0 { "" } else { "\n" };
        let num = crate::prompt::tokens::numbering(k, multi);
        tok.encode(&format!("{nl}{ANSWER}{num}: ("))
    }
}

/// The first ten label names are `A`..`J` (the label table's first entries are the single letters).
fn label_name(j: usize) -> String {
    char::from(b'A' + j as u8).to_string()
}

/// `tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True,
/// enable_thinking=False /* only when the template mentions it */)`.
pub fn render(template: &str, content: &str, special: &SpecialTokens) -> Result<String, ChatError> {
    let thinking = template.contains("enable_thinking").then_some(false);
    render_messages(
        template,
        &[("user".to_string(), content.to_string())],
        special,
        true,
        thinking,
    )
}

/// `tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for `(role, content)` turns, with
/// `enable_thinking` passed only when given (the template's own default otherwise).
pub fn render_messages(
    template: &str,
    messages: &[(String, String)],
    special: &SpecialTokens,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
) -> Result<String, ChatError> {
    let env = environment(template).map_err(|e| ChatError::Render(describe(&e)))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| ChatError::Render(describe(&e)))?;
    let messages: Vec<JValue> = messages
        .iter()
        .map(|(role, content)| {
            JValue::from_object(Message {
                role: role.clone(),
                content: content.clone(),
            })
        })
        .collect();
    let mut ctx: BTreeMap<String, JValue> = BTreeMap::new();
    for (k, v) in &special.0 {
        ctx.insert(k.clone(), JValue::from(v.as_str()));
    }
    ctx.insert("messages".into(), JValue::from(messages));
    ctx.insert("tools".into(), JValue::from(()));
    ctx.insert("documents".into(), JValue::from(()));
    ctx.insert(
        "add_generation_prompt".into(),
        JValue::from(add_generation_prompt),
    );
    if let Some(t) = enable_thinking {
        ctx.insert("enable_thinking".into(), JValue::from(t));
    }
    tmpl.render(JValue::from(ctx))
        .map_err(|e| ChatError::Render(describe(&e)))
}

fn describe(e: &JError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        let _ = write!(s, ": {x}");
        src = x.source();
    }
    s
}

/// One chat message with Python's key order (`role`, then `content`).
#[derive(Debug)]
struct Message {
    role: String,
    content: String,
}

impl Object for Message {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &JValue) -> Option<JValue> {
        match key.as_str()? {
            "role" => Some(JValue::from(self.role.as_str())),
            "content" => Some(JValue::from(self.content.as_str())),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["role", "content"])
    }
}

/// The Jinja environment of transformers' `_compile_jinja_template`.
fn environment(template: &str) -> Result<Environment<'_>, JError> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.add_function("raise_exception", |msg: String| -> Result<JValue, JError> {
        Err(JError::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> Result<JValue, JError> {
        Ok(JValue::from(strftime_now(&fmt)))
    });
    env.add_filter("tojson", tojson);
    env.set_unknown_method_callback(py_method);
    env.add_template("chat", template)?;
    Ok(env)
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)` = Python `json.dumps`.
fn tojson(v: &JValue, kwargs: Kwargs) -> Result<JValue, JError> {
    let indent: Option<JValue> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<JValue> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => match (i.as_i64(), i.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (_, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(JError::new(
                    ErrorKind::InvalidOperation,
                    "tojson: bad indent",
                ))
            }
        },
    };
    let (item, kv) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<JValue> = s.try_iter()?.collect();
            match (
                parts.first().and_then(|x| x.as_str()),
                parts.get(1).and_then(|x| x.as_str()),
            ) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_string(), b.to_string()),
                _ => {
                    return Err(JError::new(
                        ErrorKind::InvalidOperation,
                        "tojson: bad separators",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    let w = JsonWriter {
        item: &item,
        kv: &kv,
        indent: indent.as_deref(),
        sort_keys: sort_keys.unwrap_or(false),
    };
    w.write(&mut out, v, 0)?;
    Ok(JValue::from(out))
}

struct JsonWriter<'a> {
    item: &'a str,
    kv: &'a str,
    indent: Option<&'a str>,
    sort_keys: bool,
}

impl JsonWriter<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, out: &mut String, v: &JValue, level: usize) -> Result<(), JError> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if let Some(i) = v.as_i64() {
                    let _ = write!(out, "{i}");
                } else {
                    match f64::try_from(v.clone()) {
                        Ok(f) => out.push_str(&json_float(f)),
                        Err(_) => out.push_str(&v.to_string()),
                    }
                }
            }
            ValueKind::String => write_json_str(out, v.as_str().unwrap_or("")),
            ValueKind::Map => {
                let mut keys: Vec<JValue> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item);
                    }
                    self.newline(out, level + 1);
                    match k.as_str() {
                        Some(s) => write_json_str(out, s),
                        None => write_json_str(out, &k.to_string()),
                    }
                    out.push_str(self.kv);
                    self.write(out, &v.get_item(k)?, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<JValue> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item);
                    }
                    self.newline(out, level + 1);
                    self.write(out, x, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            _ => write_json_str(out, &v.to_string()),
        }
        Ok(())
    }
}

/// Python `str` and `dict` methods chat templates call (`content.startswith(...)`, `message.items()`, ...).
fn py_method(
    _: &mut State,
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> Result<JValue, JError> {
    let unknown = || {
        JError::new(
            ErrorKind::UnknownMethod,
            format!("{} has no method named {method}", value.kind()),
        )
    };
    let arg_str = |i: usize| -> Result<Option<String>, JError> {
        match args.get(i) {
            None => Ok(None),
            Some(a) if a.is_none() => Ok(None),
            Some(a) => a.as_str().map(|s| Some(s.to_string())).ok_or_else(|| {
                JError::new(
                    ErrorKind::InvalidOperation,
                    format!("{method}: expected a string argument"),
                )
            }),
        }
    };
    if let Some(s) = value.as_str() {
        return match method {
            "startswith" | "endswith" => {
                let probe = args.first().ok_or_else(|| {
                    JError::new(
                        ErrorKind::MissingArgument,
                        format!("{method} takes a prefix"),
                    )
                })?;
                let cands: Vec<String> = match probe.as_str() {
                    Some(p) => vec![p.to_string()],
                    None => probe
                        .try_iter()?
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect(),
                };
                let hit = cands.iter().any(|c| {
                    if method == "startswith" {
                        s.starts_with(c.as_str())
                    } else {
                        s.ends_with(c.as_str())
                    }
                });
                Ok(JValue::from(hit))
            }
            "strip" | "lstrip" | "rstrip" => {
                let chars = arg_str(0)?;
                let pred = |c: char| match &chars {
                    Some(set) => set.contains(c),
                    None => is_py_space(c),
                };
                Ok(JValue::from(match method {
                    "strip" => s.trim_matches(pred),
                    "lstrip" => s.trim_start_matches(pred),
                    _ => s.trim_end_matches(pred),
                }))
            }
            "split" | "rsplit" => {
                let sep = arg_str(0)?;
                let max = args.get(1).and_then(JValue::as_i64).unwrap_or(-1);
                Ok(JValue::from(py_split(
                    s,
                    sep.as_deref(),
                    max,
                    method == "rsplit",
                )?))
            }
            "upper" => Ok(JValue::from(s.to_uppercase())),
            "lower" => Ok(JValue::from(s.to_lowercase())),
            "replace" => {
                let (Some(a), Some(b)) = (arg_str(0)?, arg_str(1)?) else {
                    return Err(unknown());
                };
                Ok(JValue::from(s.replace(a.as_str(), &b)))
            }
            "find" => {
                let a = arg_str(0)?.unwrap_or_default();
                Ok(JValue::from(
                    s.find(a.as_str())
                        .map_or(-1, |b| s[..b].chars().count() as i64),
                ))
            }
            "count" => {
                let a = arg_str(0)?.unwrap_or_default();
                Ok(JValue::from(if a.is_empty() {
                    s.chars().count() as i64 + 1
                } else {
                    s.matches(a.as_str()).count() as i64
                }))
            }
            "isspace" => Ok(JValue::from(!s.is_empty() && s.chars().all(is_py_space))),
            _ => Err(unknown()),
        };
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => Ok(JValue::from(
                value
                    .try_iter()?
                    .map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        JValue::from(vec![k, v])
                    })
                    .collect::<Vec<_>>(),
            )),
            "keys" => Ok(JValue::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => Ok(JValue::from(
                value
                    .try_iter()?
                    .map(|k| value.get_item(&k).unwrap_or_default())
                    .collect::<Vec<_>>(),
            )),
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(JValue::from(()))
                } else {
                    v
                })
            }
            _ => Err(unknown()),
        };
    }
    Err(unknown())
}

/// Python `str.split(sep, maxsplit)` / `rsplit`.
fn py_split(s: &str, sep: Option<&str>, max: i64, from_right: bool) -> Result<Vec<String>, JError> {
    let limit = if max < 0 { usize::MAX } else { max as usize };
    match sep {
        Some("") => Err(JError::new(ErrorKind::InvalidOperation, "empty separator")),
        Some(sep) => {
            let parts: Vec<String> = if from_right {
                let mut v: Vec<String> = s
                    .rsplitn(limit.saturating_add(1), sep)
                    .map(str::to_string)
                    .collect();
                v.reverse();
                v
            } else {
                s.splitn(limit.saturating_add(1), sep)
                    .map(str::to_string)
                    .collect()
            };
            Ok(parts)
        }
        None => {
            // Runs of whitespace; leading/trailing whitespace gives no empty strings.
            let words: Vec<&str> = s.split(is_py_space).filter(|w| !w.is_empty()).collect();
            if words.len() <= limit.saturating_add(1) || limit == usize::MAX {
                return Ok(words.into_iter().map(str::to_string).collect());
            }
            if from_right {
                let cut = words.len() - limit;
                let last_head = words[cut - 1];
                // Everything up to the end of word `cut - 1`, with its leading whitespace removed.
                let end = last_head.as_ptr() as usize - s.as_ptr() as usize + last_head.len();
                let mut v = vec![s[..end].trim_start_matches(is_py_space).to_string()];
                v.extend(words[cut..].iter().map(|w| w.to_string()));
                Ok(v)
            } else {
                let first_tail = words[limit];
                let start = first_tail.as_ptr() as usize - s.as_ptr() as usize;
                let mut v: Vec<String> = words[..limit].iter().map(|w| w.to_string()).collect();
                v.push(s[start..].trim_end_matches(is_py_space).to_string());
                Ok(v)
            }
        }
    }
}

/// `datetime.now().strftime(fmt)` for the common directives, in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('d') => {
                let _ = write!(out, "{d:02}");
            }
            Some('m') => {
                let _ = write!(out, "{m:02}");
            }
            Some('Y') => {
                let _ = write!(out, "{y}");
            }
            Some('y') => {
                let _ = write!(out, "{:02}", y.rem_euclid(100));
            }
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => {
                let _ = write!(out, "{:02}", tod / 3600);
            }
            Some('M') => {
                let _ = write!(out, "{:02}", tod / 60 % 60);
            }
            Some('S') => {
                let _ = write!(out, "{:02}", tod % 60);
            }
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Load the chat template of `dir` for `tok` (special tokens from `tokenizer_config.json`).
pub fn load(tok: &Tokenizer, dir: Option<&Path>) -> Result<ChatTemplate, ChatError> {
    let special = match dir {
        Some(d) if d.join("tokenizer_config.json").is_file() => SpecialTokens::from_dir(d),
        _ => SpecialTokens::from_tokenizer(tok),
    };
    ChatTemplate::new(tok, &special)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_split() {
        assert_eq!(
            py_split("a  b c ", None, -1, false).unwrap(),
            ["a", "b", "c"]
        );
        assert_eq!(py_split("  a  b c ", None, 1, false).unwrap(), ["a", "b c"]);
        assert_eq!(py_split("a  b c ", None, 1, true).unwrap(), ["a  b", "c"]);
        assert_eq!(
            py_split("x</think>y</think>z", Some("</think>"), -1, false).unwrap(),
            ["x", "y", "z"]
        );
        assert_eq!(py_split("a,b,c", Some(","), 1, true).unwrap(), ["a,b", "c"]);
    }

    #[test]
    fn jinja_features() {
        let sp = SpecialTokens(vec![("eos_token".into(), "<|endoftext|>".into())]);
        let t = "{%- set ns = namespace(n=0) %}{%- for m in messages[::-1] %}{% if m.content.startswith('x') %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}\n{{ ns.n }}|{{ eos_token }}|{{ messages[0].content.split('y')[-1].lstrip('_') }}|{{ messages[0] | tojson }}|{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}{{ bos_token is defined }}|{{ tools is none }}\n";
        let s = render(t, "xay__b", &sp).unwrap();
        assert_eq!(s, "1|<|endoftext|>|b|{\"role\": \"user\", \"content\": \"xay__b\"}|role=user;content=xay__b;False|True");
        let e = render("{{ raise_exception('no') }}", "x", &sp).unwrap_err();
        assert!(matches!(e, ChatError::Render(m) if m.contains("no")));
    }
}

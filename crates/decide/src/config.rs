//! `decider_config.json`: answer temperatures (decider/temperature.py), model name, isolated levels, prompt layout.
//! Validation happens at load, with the reference's messages (the reference server fails to start).

use crate::prompt::chat::{self, ChatTemplate};
use crate::prompt::text::QType;
use crate::pyjson::{decode_body, py_float, py_repr, py_str, repr_str, Object, Value};
use onepass_tokenizer::Tokenizer;
use std::path::Path;

/// A `decider_config.json` the reference would refuse at load. Display is the reference's `ValueError` text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

const WHERE: &str = "decider_config.json";
const KEYS_TEXT: &str = "the keys are \"choice\", \"noul\" and \"score\" (a /decide \"bool\" field is \"noul\", a \"scale\" field is \"score\"; a /v1/systemone \"bool\" question is \"noul\")";

/// How a slot's temperature is chosen on the state-first layout.
// decider-contract R3.2.1, R3.2.3
#[derive(Debug, Clone, PartialEq)]
pub enum TempMap {
    /// One temperature for every slot.
    Scalar,
    /// `temperature_by_type`: `(type, T)` pairs; a missing type uses the scalar.
    ByType(Vec<(QType, f64)>),
    /// `temperature_by_options`: `T(n) = max(min, a + b ln max(n, 2))`.
    ByOptions { a: f64, b: f64, min: f64 },
}

impl TempMap {
    /// `ByType(m)`, or `Scalar` when `m` is empty.
    fn from_pairs(m: Vec<(QType, f64)>) -> TempMap {
        if m.is_empty() {
            TempMap::Scalar
        } else {
            TempMap::ByType(m)
        }
    }
}

/// The temperatures of one layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Temperatures {
    pub t: f64,
    pub map: TempMap,
}

impl Temperatures {
    /// The temperature of a slot of answer type `qtype` with `nopts` options (isolated level rows: Score, n = 2).
    // decider-contract R3.2.3, R3.2.4
    pub fn for_slot(&self, qtype: QType, nopts: usize) -> f64 {
        match &self.map {
            TempMap::Scalar => self.t,
            TempMap::ByType(m) => m
                .iter()
                .find(|(k, _)| *k == qtype)
                .map_or(self.t, |(_, v)| *v),
            TempMap::ByOptions { a, b, min } => {
                let x = a + b * (nopts.max(2) as f64).ln();
                if x > *min {
                    x
                } else {
                    *min
                }
            }
        }
    }
}

/// The prompt layout (decider-contract R6.1, prompt.py resolve_layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Plain,
    Chat,
}

/// Where the questions go relative to the state (decider-contract R2.3 vs R2.4), orthogonal to [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Context first (R2.3, chat R2.5.2): the reference server's `prepare` and the library's default on CPU.
    #[default]
    StateFirst,
    /// Questions first (R2.4, chat R2.5.3), read at the **state-first** temperatures: the reference library's CPU
    /// fallback for `system_one(layout="schema_first")` (decider-contract R5.7 caveat).
    SchemaFirst,
    /// Questions first, read at the schema temperatures (`temperature_schema_first*`): what the reference's schema
    /// cache answers (library on CUDA; server from a question set's second request on).
    SchemaFirstCached,
}

/// Everything onepass reads from `decider_config.json`, plus the port-side state cap.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideConfig {
    /// `"decider-" + str(version)` (default `decider-dev`).
    pub model_name: String,
    /// State-first temperatures.
    pub temperature: Temperatures,
    /// Schema-cache temperatures (reported; onepass has no schema cache yet).
    pub temperature_schema: Temperatures,
    /// `bool(isolated_levels)`.
    pub isolated_levels: bool,
    pub layout: Layout,
    /// The chat template's ids (`Some` exactly when `layout` is `Chat` and [`DecideConfig::attach_chat`] ran).
    pub chat: Option<ChatTemplate>,
    /// Question/state order of the rows `plan` builds. Always `StateFirst` from a config file: the reference reads a
    /// `schema_first` model state-first on CPU and for every first-seen question set (docs/systemone.md).
    pub order: Order,
    /// `bool(schema_first)`: the model asks for the schema cache (reported; onepass serves state-first).
    pub schema_first: bool,
    /// `bool(schema_first_trained)`.
    pub schema_first_trained: bool,
    /// `DECIDER_MAX_STATE_TOKENS` (32768): cap on the ids of `"Context:\n" + state`.
    pub max_state_tokens: usize,
    /// The file as read (`{}` when absent).
    pub raw: Object,
}

/// decider-ai's `DECIDER_MAX_STATE_TOKENS` default: the ids of `"Context:\n" + state` kept per row.
pub const DEFAULT_MAX_STATE_TOKENS: usize = 32768;

impl Default for DecideConfig {
    fn default() -> Self {
        DecideConfig::from_object(&Object::new(), None)
            .unwrap_or_else(|_| unreachable!("the empty config is valid"))
    }
}

impl DecideConfig {
    /// Read `<dir>/decider_config.json`; a missing or unreadable file is `{}` (decider-contract R6.1).
    pub fn from_dir(dir: &Path) -> Result<DecideConfig, ConfigError> {
        DecideConfig::from_object(&read_config_object(dir), None)
    }

    /// [`DecideConfig::from_dir`], then `DECIDER_LAYOUT` (`layout_override`, see [`with_layout`]) and
    /// `DECIDER_TEMPERATURE` (`temperature_override`, a number as text, R3.2.1), then the chat template of `tok`
    /// when the layout is chat (its errors are load errors, decider-contract R2.5.1).
    pub fn load(
        dir: &Path,
        tok: &Tokenizer,
        layout_override: Option<&str>,
        temperature_override: Option<&str>,
    ) -> Result<DecideConfig, ConfigError> {
        let obj = with_layout(&read_config_object(dir), layout_override)?;
        let t = temperature_override.map(|t| Value::Str(t.to_string()));
        let mut cfg = DecideConfig::from_object(&obj, t.as_ref())?;
        cfg.attach_chat(tok, Some(dir))?;
        Ok(cfg)
    }

    /// Build and validate the chat template (`ChatTemplate(tok)`) when `layout` is `Chat`; a no-op otherwise.
    /// `dir` is the tokenizer folder (its `tokenizer_config.json` names the special tokens the template sees).
    pub fn attach_chat(&mut self, tok: &Tokenizer, dir: Option<&Path>) -> Result<(), ConfigError> {
        self.chat = match self.layout {
            Layout::Chat => Some(chat::load(tok, dir).map_err(|e| ConfigError(e.to_string()))?),
            Layout::Plain => None,
        };
        Ok(())
    }
}

/// `<dir>/decider_config.json` as an object; missing, unreadable or not an object → `{}`.
fn read_config_object(dir: &Path) -> Object {
    std::fs::read(dir.join("decider_config.json"))
        .ok()
        .and_then(|b| decode_body(&b).ok())
        .and_then(|v| match v {
            Value::Object(o) => Some(o),
            _ => None,
        })
        .unwrap_or_default()
}

impl DecideConfig {
    /// Validate a parsed config. `temperature_override` is `DECIDER_TEMPERATURE` / `Decider(temperature=...)`: it
    /// replaces `temperature` and switches both maps off.
    pub fn from_object(
        cfg: &Object,
        temperature_override: Option<&Value>,
    ) -> Result<DecideConfig, ConfigError> {
        let (temperature, temperature_schema) = from_config(cfg, temperature_override)?;
        let version = cfg
            .get("version")
            .cloned()
            .unwrap_or_else(|| Value::str("dev"));
        Ok(DecideConfig {
            model_name: format!("decider-{}", py_str(&version)), // decider-contract R4.4
            temperature,
            temperature_schema,
            isolated_levels: cfg.get("isolated_levels").is_some_and(Value::truthy),
            layout: resolve_layout(cfg)?,
            chat: None,
            order: Order::StateFirst,
            schema_first: cfg.get("schema_first").is_some_and(Value::truthy),
            schema_first_trained: cfg.get("schema_first_trained").is_some_and(Value::truthy),
            max_state_tokens: DEFAULT_MAX_STATE_TOKENS,
            raw: cfg.clone(),
        })
    }
}

/// `resolve_layout(cfg)`.
pub fn resolve_layout(cfg: &Object) -> Result<Layout, ConfigError> {
    let chat_true = matches!(cfg.get("chat_template"), Some(Value::Bool(true)));
    let layout = match cfg.get("layout") {
        None | Some(Value::Null) => {
            return Ok(if chat_true {
                Layout::Chat
            } else {
                Layout::Plain
            })
        }
        Some(v) => v,
    };
    match layout.as_str() {
        Some("plain") if chat_true => Err(ConfigError(
            "decider_config.json says \"layout\": \"plain\" and \"chat_template\": true; these contradict each other".into(),
        )),
        Some("plain") => Ok(Layout::Plain),
        Some("chat") => Ok(Layout::Chat),
        _ => Err(ConfigError(format!(
            "decider_config.json names the prompt layout {}; this version of decider-ai knows 'plain', 'chat'. Upgrade decider-ai, or check the model's config.",
            py_repr(layout)
        ))),
    }
}

/// prompt.py `with_layout(cfg, layout)`: `DECIDER_LAYOUT`. `None` or `""` keeps `cfg`; `"plain"`/`"chat"` replace its
/// layout (and drop `chat_template`); anything else is a load error.
// decider-contract R6.3
pub fn with_layout(cfg: &Object, layout: Option<&str>) -> Result<Object, ConfigError> {
    let mut out = cfg.clone();
    match layout {
        None | Some("") => {}
        Some(l @ ("plain" | "chat")) => {
            out.shift_remove("chat_template");
            out.insert("layout".into(), Value::str(l));
        }
        Some(other) => {
            return Err(ConfigError(format!(
                "layout {}: expected one of 'plain', 'chat'",
                repr_str(other)
            )))
        }
    }
    Ok(out)
}

/// temperature.py `positive(value, where)`.
fn positive(v: &Value, place: &str) -> Result<f64, ConfigError> {
    let bad = || {
        ConfigError(format!(
            "{place} must be a finite number > 0, got {}",
            py_repr(v)
        ))
    };
    let x = match v {
        Value::Float(f) => *f,
        Value::Int(d) => d.parse::<f64>().map_err(|_| bad())?,
        Value::Str(s) => py_float(s).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    if !x.is_finite() || x <= 0.0 {
        return Err(bad());
    }
    Ok(x)
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Float(f) => Some(*f),
        Value::Int(d) => d.parse::<f64>().ok(),
        _ => None,
    }
}

/// temperature.py `by_type(m, where)`.
fn by_type(m: Option<&Value>, place: &str) -> Result<Vec<(QType, f64)>, ConfigError> {
    let m = match m {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ConfigError(format!(
                "{place} must be a map {{answer type: temperature}}, got {}; {KEYS_TEXT}",
                other.py_type_name()
            )))
        }
    };
    let mut out = Vec::new();
    for (k, v) in m {
        let t = match k.as_str() {
            "choice" => QType::Choice,
            "noul" => QType::Noul,
            "score" => QType::Score,
            _ => {
                return Err(ConfigError(format!(
                    "{place} has the unknown key {}; {KEYS_TEXT}",
                    repr_str(k)
                )))
            }
        };
        let here = format!("{place}[{}]", repr_str(k));
        if number(v).is_none() {
            return Err(ConfigError(format!(
                "{here} must be a finite number > 0, got {}",
                py_repr(v)
            )));
        }
        out.push((t, positive(v, &here)?));
    }
    Ok(out)
}

/// temperature.py `by_options(spec, where)`.
fn by_options(spec: Option<&Value>, place: &str) -> Result<Option<(f64, f64, f64)>, ConfigError> {
    let spec = match spec {
        None | Some(Value::Null) => return Ok(None),
        Some(s) => s,
    };
    let shape_err = || {
        ConfigError(format!(
            "{place} must be {{\"a\": number, \"b\": number, \"min\": number > 0 (optional)}}, got {}",
            py_repr(spec)
        ))
    };
    let Value::Object(o) = spec else {
        return Err(shape_err());
    };
    if o.keys().any(|k| !matches!(k.as_str(), "a" | "b" | "min"))
        || !o.contains_key("a")
        || !o.contains_key("b")
    {
        return Err(shape_err());
    }
    let mut ab = [0.0; 2];
    for (i, k) in ["a", "b"].iter().enumerate() {
        let v = &o[*k];
        match number(v) {
            Some(x) if x.is_finite() => ab[i] = x,
            _ => {
                return Err(ConfigError(format!(
                    "{place}['{k}'] must be a finite number, got {}",
                    py_repr(v)
                )))
            }
        }
    }
    let min = positive(
        o.get("min").unwrap_or(&Value::Float(0.05)),
        &format!("{place}['min']"),
    )?;
    Ok(Some((ab[0], ab[1], min)))
}

/// temperature.py `from_config(cfg, temperature)` → (state-first, schema cache).
// decider-contract R3.2.1, R3.2.2
pub fn from_config(
    cfg: &Object,
    override_t: Option<&Value>,
) -> Result<(Temperatures, Temperatures), ConfigError> {
    let (t, mut m) = match override_t {
        Some(v) => (positive(v, "temperature")?, vec![]),
        None => (
            positive(
                cfg.get("temperature").unwrap_or(&Value::Float(1.0)),
                &format!("{WHERE} \"temperature\""),
            )?,
            by_type(
                cfg.get("temperature_by_type"),
                &format!("{WHERE} \"temperature_by_type\""),
            )?,
        ),
    };
    let ms = by_type(
        cfg.get("temperature_schema_first_by_type"),
        &format!("{WHERE} \"temperature_schema_first_by_type\""),
    )?;
    let opt = by_options(
        cfg.get("temperature_by_options"),
        &format!("{WHERE} \"temperature_by_options\""),
    )?;
    let mut map = TempMap::from_pairs(m.clone());
    if let (Some((a, b, min)), None) = (opt, override_t) {
        if !m.is_empty() {
            return Err(ConfigError(format!(
                "{WHERE}: \"temperature_by_options\" and \"temperature_by_type\" cannot both be set"
            )));
        }
        map = TempMap::ByOptions { a, b, min };
    }
    let schema = if let Some(v) = cfg.get("temperature_schema_first") {
        let ts = positive(v, &format!("{WHERE} \"temperature_schema_first\""))?;
        Temperatures {
            t: ts,
            map: TempMap::from_pairs(ms),
        }
    } else {
        // {**m without by_options, **ms}
        for (k, v) in ms {
            match m.iter_mut().find(|(q, _)| *q == k) {
                Some(e) => e.1 = v,
                None => m.push((k, v)),
            }
        }
        Temperatures {
            t,
            map: TempMap::from_pairs(m),
        }
    };
    Ok((Temperatures { t, map }, schema))
}

/// temperature.py `effective(T, m)` for `/health`: per type the number, or the by-options formula as text.
pub fn effective(temps: &Temperatures) -> Vec<(QType, Value)> {
    [QType::Choice, QType::Noul, QType::Score]
        .into_iter()
        .map(|q| {
            let v = match &temps.map {
                TempMap::ByOptions { a, b, min } => Value::Str(format!(
                    "max({}, {} + {} ln n_options)",
                    fmt_g(*min),
                    fmt_g(*a),
                    fmt_g(*b)
                )),
                _ => Value::Float(temps.for_slot(q, 2)),
            };
            (q, v)
        })
        .collect()
}

/// Python `format(x, "g")` (6 significant digits) for the finite values a config can hold.
fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let exp = x.abs().log10().floor() as i32;
    let sci = format!("{:.5e}", x);
    let (mant, e) = sci.split_once('e').unwrap_or((&sci, "0"));
    let e: i32 = e.parse().unwrap_or(exp);
    if (-4..6).contains(&e) {
        let s = format!("{:.*}", (5 - e).max(0) as usize, x);
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        };
        return s;
    }
    let m = mant.trim_end_matches('0').trim_end_matches('.');
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pyjson::loads;

    fn cfg(s: &str) -> Object {
        match loads(s) {
            Ok(Value::Object(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn selection() {
        let c = DecideConfig::from_object(
            &cfg(r#"{"temperature": 1.3, "temperature_by_type": {"noul": 2.0}}"#),
            None,
        )
        .expect("valid");
        assert_eq!(c.temperature.for_slot(QType::Noul, 2), 2.0);
        assert_eq!(c.temperature.for_slot(QType::Score, 2), 1.3);
        let c = DecideConfig::from_object(
            &cfg(r#"{"temperature_by_options": {"a": 2.0, "b": -1.0}, "version": 10}"#),
            None,
        )
        .expect("valid");
        assert_eq!(c.temperature.for_slot(QType::Choice, 1), 2.0 - 2f64.ln());
        assert_eq!(c.temperature.for_slot(QType::Choice, 255), 0.05);
        assert_eq!(c.model_name, "decider-10");
        assert_eq!(fmt_g(0.05), "0.05");
        assert_eq!(fmt_g(10.12), "10.12");
        assert_eq!(fmt_g(-1.63), "-1.63");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
    }

    #[test]
    fn messages() {
        let e = |s: &str| {
            DecideConfig::from_object(&cfg(s), None)
                .expect_err("invalid")
                .0
        };
        assert_eq!(
            e(r#"{"temperature": 0}"#),
            "decider_config.json \"temperature\" must be a finite number > 0, got 0"
        );
        assert_eq!(
            e(r#"{"temperature": true}"#),
            "decider_config.json \"temperature\" must be a finite number > 0, got True"
        );
        assert_eq!(e(r#"{"layout": "state_first"}"#), "decider_config.json names the prompt layout 'state_first'; this version of decider-ai knows 'plain', 'chat'. Upgrade decider-ai, or check the model's config.");
    }
}

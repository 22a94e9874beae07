//! The chat layout (decider-contract R2.5) and schema-first rows (R2.4) against decider-ai 1.10.0 golden files in
//! tests/fixtures/systemone/layouts (made by tools/oracle/decider_layouts.py): template head/tail text and ids, the
//! reference's load errors, and per request the rows (ids, slots, nopts, types), temperatures, ctx_len and usage.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use onepass_decide::chat::{ChatTemplate, SpecialTokens};
use onepass_decide::pyjson::{self, Value};
use onepass_decide::{parse_request, plan, DecideConfig, Layout, Order, Plan};
use onepass_tokenizer::{Tokenizer, QWEN3_CHAT_TEMPLATE, SYNTHETIC_CHAT_TEMPLATE};
use serde_json::Value as J;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

mod common;

use common::{check_rows, root, tok, u32s};

fn dir() -> PathBuf {
    root().join("tests/fixtures/systemone/layouts")
}

fn lines(name: &str) -> Vec<J> {
    common::jsonl(&dir().join(name))
}

fn special(v: &J) -> SpecialTokens {
    SpecialTokens(
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect(),
    )
}

/// name → the reference's ChatTemplate (or its error) of that template.
fn templates() -> &'static HashMap<String, Result<ChatTemplate, String>> {
    static T: OnceLock<HashMap<String, Result<ChatTemplate, String>>> = OnceLock::new();
    T.get_or_init(|| {
        let mut out = HashMap::new();
        for rec in lines("chat_templates.jsonl") {
            let name = rec["name"].as_str().unwrap().to_string();
            let text =
                std::fs::read_to_string(dir().join(rec["template"].as_str().unwrap())).unwrap();
            let sp = special(&rec["special_tokens"]);
            let got = if text.is_empty() {
                ChatTemplate::new(tok(), &sp) // testdata's tokenizer has no chat template
            } else {
                ChatTemplate::from_template(tok(), &text, &sp)
            };
            out.insert(name, got.map_err(|e| e.to_string()));
        }
        out
    })
}

fn temp_configs() -> Vec<(String, pyjson::Object)> {
    let text = std::fs::read_to_string(dir().join("temp_configs.json")).unwrap();
    let Ok(Value::Object(o)) = pyjson::loads(text.trim()) else {
        panic!("temp_configs.json")
    };
    o.into_iter()
        .map(|(k, v)| match v {
            Value::Object(c) => (k, c),
            _ => panic!("config {k}"),
        })
        .collect()
}

fn temps_of(plan: &Plan) -> Vec<f64> {
    plan.rows
        .iter()
        .flat_map(|r| r.temperatures.iter().copied())
        .collect()
}

fn f64s(v: &J) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn synthetic_template_is_the_tokenizer_crates() {
    let text = std::fs::read_to_string(dir().join("templates/synthetic.jinja")).unwrap();
    assert_eq!(text, SYNTHETIC_CHAT_TEMPLATE);
    let from_dir = SpecialTokens::from_dir(&root().join("testdata/qwen3_5-tokenizer"));
    let rec = &lines("chat_templates.jsonl")[0];
    assert_eq!(from_dir, special(&rec["special_tokens"]));
}

/// Synthetic checkpoints carry the `qwen3_style` template, which renders one user turn (all System One and decide
/// prompts) exactly as the minimal `synthetic` one does, so no System One answer depends on which of the two a
/// checkpoint has.
#[test]
fn synthetic_checkpoints_carry_the_qwen3_style_template() {
    let text = std::fs::read_to_string(dir().join("templates/qwen3_style.jinja")).unwrap();
    assert_eq!(text, QWEN3_CHAT_TEMPLATE);
    let sp = special(&lines("chat_templates.jsonl")[0]["special_tokens"]);
    for content in [
        "",
        "Context:\nx",
        "<tool_response>a</tool_response>",
        "a</think>b",
        "@@DECIDER_USER_CONTENT@@",
    ] {
        assert_eq!(
            onepass_decide::chat::render(QWEN3_CHAT_TEMPLATE, content, &sp).unwrap(),
            onepass_decide::chat::render(SYNTHETIC_CHAT_TEMPLATE, content, &sp).unwrap(),
            "{content:?}"
        );
    }
}

#[test]
fn chat_templates_match() {
    let recs = lines("chat_templates.jsonl");
    assert!(recs.len() >= 6);
    for rec in recs {
        let name = rec["name"].as_str().unwrap();
        let got = &templates()[name];
        match (got, rec.get("error")) {
            (Ok(c), None) => {
                assert_eq!(
                    c.head_text,
                    rec["head_text"].as_str().unwrap(),
                    "{name}: head text"
                );
                assert_eq!(
                    c.tail_text,
                    rec["tail_text"].as_str().unwrap(),
                    "{name}: tail text"
                );
                assert_eq!(c.head, u32s(&rec["head"]), "{name}: head ids");
                assert_eq!(c.tail, u32s(&rec["tail"]), "{name}: tail ids");
                let answers = rec["answers"].as_array().unwrap();
                for (i, (k, multi)) in [(0, false), (0, true), (1, true)].into_iter().enumerate() {
                    assert_eq!(
                        c.answer_ids(tok(), k, multi).unwrap(),
                        u32s(&answers[i]),
                        "{name}: answer {k} {multi}"
                    );
                }
            }
            (Err(e), Some(want)) => assert_eq!(e, want.as_str().unwrap(), "{name}: error"),
            (got, want) => panic!("{name}: got {got:?}, the reference {want:?}"),
        }
    }
}

#[test]
fn chat_rows_match() {
    let configs = temp_configs();
    let cases = lines("chat_rows.jsonl");
    assert!(cases.len() >= 80, "{} chat cases", cases.len());
    for case in cases {
        let name = format!(
            "{}/{}",
            case["template"].as_str().unwrap(),
            case["name"].as_str().unwrap()
        );
        let chat = templates()[case["template"].as_str().unwrap()]
            .clone()
            .unwrap();
        let req = parse_request(case["body"].as_str().unwrap().as_bytes()).unwrap();
        for (cn, obj) in &configs {
            let mut cfg = DecideConfig::from_object(obj, None).unwrap();
            cfg.layout = Layout::Chat;
            cfg.chat = Some(chat.clone());
            cfg.isolated_levels = case["isolated_levels"].as_bool().unwrap();
            cfg.max_state_tokens = case["max_state_tokens"].as_u64().unwrap() as usize;
            let p = plan(&req, tok(), &cfg).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            check_rows(&name, &p, &case);
            assert_eq!(
                p.ctx_len,
                case["ctx_len"].as_u64().unwrap() as usize,
                "{name}: ctx_len"
            );
            assert_eq!(
                temps_of(&p),
                f64s(&case["temperatures"][cn]),
                "{name}: temperatures {cn}"
            );
        }
    }
}

#[test]
fn schema_first_rows_match() {
    let configs = temp_configs();
    let cases = lines("schema_first.jsonl");
    assert!(cases.len() >= 40, "{} schema-first cases", cases.len());
    for case in cases {
        let name = format!(
            "{}/{}",
            case["layout"].as_str().unwrap(),
            case["name"].as_str().unwrap()
        );
        let req = parse_request(case["body"].as_str().unwrap().as_bytes()).unwrap();
        for (cn, obj) in &configs {
            for (order, key) in [
                (Order::SchemaFirst, "temperatures"),
                (Order::SchemaFirstCached, "schema_temperatures"),
            ] {
                let mut cfg = DecideConfig::from_object(obj, None).unwrap();
                if let Some(t) = case["template"].as_str() {
                    cfg.layout = Layout::Chat;
                    cfg.chat = Some(templates()[t].clone().unwrap());
                }
                cfg.order = order;
                cfg.isolated_levels = case["isolated_levels"].as_bool().unwrap();
                cfg.max_state_tokens = case["max_state_tokens"].as_u64().unwrap() as usize;
                let p = plan(&req, tok(), &cfg).unwrap_or_else(|e| panic!("{name}: {e:?}"));
                check_rows(&name, &p, &case);
                assert_eq!(temps_of(&p), f64s(&case[key][cn]), "{name}: {key} {cn}");
            }
        }
    }
}

#[test]
fn chat_layout_from_a_model_folder() {
    // decider_config.json "layout": "chat" + a tokenizer folder with the Qwen3-style template: load builds the
    // template once; DECIDER_LAYOUT=plain switches it off; an unknown override is a load error.
    let t = tempfile::tempdir().unwrap();
    let src = root().join("testdata/qwen3_5-tokenizer");
    std::fs::copy(src.join("tokenizer.json"), t.path().join("tokenizer.json")).unwrap();
    std::fs::copy(
        src.join("tokenizer_config.json"),
        t.path().join("tokenizer_config.json"),
    )
    .unwrap();
    std::fs::copy(
        dir().join("templates/qwen3_style.jinja"),
        t.path().join("chat_template.jinja"),
    )
    .unwrap();
    std::fs::write(
        t.path().join("decider_config.json"),
        r#"{"layout": "chat"}"#,
    )
    .unwrap();
    let tk = Tokenizer::from_dir(t.path(), None)
        .unwrap()
        .transformers_compatible();
    let cfg = DecideConfig::load(t.path(), &tk, None, None).unwrap();
    assert_eq!(cfg.layout, Layout::Chat);
    assert_eq!(cfg.chat.as_ref().unwrap().head, vec![248045, 846, 198]);
    let plain = DecideConfig::load(t.path(), &tk, Some("plain"), None).unwrap();
    assert_eq!((plain.layout, plain.chat.is_none()), (Layout::Plain, true));
    let e = DecideConfig::load(t.path(), &tk, Some("state_first"), None).unwrap_err();
    assert_eq!(e.0, "layout 'state_first': expected one of 'plain', 'chat'");
    // No template in the folder: the reference's load error.
    std::fs::remove_file(t.path().join("chat_template.jinja")).unwrap();
    let tk = Tokenizer::from_dir(t.path(), None).unwrap();
    let e = DecideConfig::load(t.path(), &tk, None, None).unwrap_err();
    assert!(e.0.contains("has no chat template"), "{e}");
}

//! POST /decide against decider-ai 1.10.0's own FastAPI app (tests/fixtures/decide_route.jsonl, made by
//! tests/oracle/decide_route.py): status, content type and body bytes equal, and the one packed row (ids, slots,
//! option counts, answer types) equal to the reference's; likewise the chat layout (decide_route_chat.jsonl) and
//! random bodies (decide_route_fuzz.jsonl, `decide_route.py --fuzz 1 150`). The engine is a fake returning the
//! oracle's fixed probabilities, so this checks everything around the model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use onepass_server::{router, ServerOptions};
use std::sync::Arc;

/// The oracle's probabilities: slot k with n options gets float32(w_j / sum(w)), w_j = 1 + ((5 j + 3 k) % 7).
fn oracle_probs(k: usize, n: usize) -> Vec<f32> {
    let w: Vec<f64> = (0..n).map(|j| 1.0 + ((5 * j + 3 * k) % 7) as f64).collect();
    let s: f64 = w.iter().sum();
    w.iter().map(|x| (x / s) as f32).collect()
}

/// A fake engine answering with the oracle's fixed probabilities.
fn oracle_engine() -> FakeEngine {
    FakeEngine::new(|plans| {
        Ok(plans
            .iter()
            .map(|p| {
                p.rows
                    .iter()
                    .flat_map(|r| r.nopts.iter().enumerate().map(|(k, &n)| oracle_probs(k, n)))
                    .collect()
            })
            .collect())
    })
}

fn fixture(name: &str) -> std::path::PathBuf {
    common::root()
        .join("crates/server/tests/fixtures")
        .join(name)
}

/// Every case of a fixture file: status, body bytes, content type, and the packed row the engine was handed.
async fn check_cases(fake: Arc<FakeEngine>, path: &std::path::Path) -> usize {
    let (app, _state) = router(fake.clone(), quiet(ServerOptions::default())).unwrap();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let body = case["body"].as_str().unwrap();
        fake.plans.lock().unwrap().clear();
        let r = post_json(&app, "/decide", body).await;
        let short: String = body.chars().take(120).collect();
        assert_eq!(
            r.status,
            case["status"].as_u64().unwrap() as u16,
            "{short}: {}",
            r.text()
        );
        assert_eq!(r.text(), case["response"].as_str().unwrap(), "{short}");
        assert_eq!(
            r.headers["content-type"].to_str().unwrap(),
            case["content_type"].as_str().unwrap(),
            "{short}"
        );
        let plans = fake.plans.lock().unwrap().clone();
        match case["row"].as_object() {
            None => assert!(plans.is_empty(), "{short}: no model call expected"),
            Some(row) => {
                assert_eq!(plans.len(), 1, "{short}");
                let got = &plans[0].rows[0];
                let ids: Vec<u32> = serde_json::from_value(row["ids"].clone()).unwrap();
                let slots: Vec<usize> = serde_json::from_value(row["slots"].clone()).unwrap();
                let nopts: Vec<usize> = serde_json::from_value(row["nopts"].clone()).unwrap();
                let types: Vec<String> = serde_json::from_value(row["types"].clone()).unwrap();
                assert_eq!(got.ids, ids, "{short}: ids");
                assert_eq!(got.slots, slots, "{short}: slots");
                assert_eq!(got.nopts, nopts, "{short}: nopts");
                let got_types: Vec<&str> = got.types.iter().map(|t| t.as_str()).collect();
                assert_eq!(got_types, types, "{short}: types");
            }
        }
        n += 1;
    }
    n
}

#[tokio::test]
async fn decide_matches_the_reference() {
    let n = check_cases(Arc::new(oracle_engine()), &fixture("decide_route.jsonl")).await;
    assert!(n >= 40, "only {n} cases");
}

/// Random bodies (`decide_route.py --fuzz 1 150`), or the file ONEPASS_DECIDE_FUZZ names (another seed or count).
#[tokio::test]
async fn decide_fuzz_matches_the_reference() {
    let path = std::env::var_os("ONEPASS_DECIDE_FUZZ")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| fixture("decide_route_fuzz.jsonl"));
    let n = check_cases(Arc::new(oracle_engine()), &path).await;
    assert!(n > 0);
}

/// The chat layout (a model whose decider_config.json says "layout": "chat"), with the Qwen3-style template of the
/// layout fixtures: the reference's rows wrap the packed question block in the template, and the 1536-id context
/// cap applies to the context alone (fixtures/decide_route_chat.jsonl, `decide_route.py --chat`).
#[tokio::test]
async fn decide_chat_layout_matches_the_reference() {
    let t = tempfile::tempdir().unwrap();
    let src = tokenizer_dir();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), t.path().join(f)).unwrap();
    }
    std::fs::copy(
        common::root().join("tests/fixtures/systemone/layouts/templates/qwen3_style.jinja"),
        t.path().join("chat_template.jinja"),
    )
    .unwrap();
    let tok = onepass_tokenizer::Tokenizer::from_dir(t.path(), None)
        .unwrap()
        .transformers_compatible();
    let mut fake = oracle_engine();
    fake.cfg.layout = onepass_decide::config::Layout::Chat;
    fake.cfg.attach_chat(&tok, Some(t.path())).unwrap();
    fake.tok = Arc::new(tok);
    let n = check_cases(Arc::new(fake), &fixture("decide_route_chat.jsonl")).await;
    assert!(n >= 12, "only {n} cases");
}

#[tokio::test]
async fn decide_over_255_options_is_a_422() {
    let fake = Arc::new(FakeEngine::new(|p| Ok(uniform(p))));
    let (app, _state) = router(fake, quiet(ServerOptions::default())).unwrap();
    let opts: Vec<String> = (0..256).map(|i| format!("\"o{i}\"")).collect();
    let body = format!(
        "{{\"context\":\"x\",\"schema\":{{\"q\":{{\"options\":[{}]}}}}}}",
        opts.join(",")
    );
    let r = post_json(&app, "/decide", &body).await;
    r.assert_says(422, "at most 255 options or levels, got 256");
}

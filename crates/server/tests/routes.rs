//! Every route of the app, without a socket: /v1/systemone byte-equal to `Engine::system_one` on a real synthetic
//! checkpoint, limits (413 order, 503 admission), auth, 422 bodies, zstd/gzip bodies, batching of concurrent
//! requests, engine failures (errors and panics) answered as 500s without taking the server down, and the prefix-state
//! LRU on /v1/systemone (hits in /metrics, answers as a fresh server, through the batching worker).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use onepass_decide::pyjson::dumps_compact;
use onepass_decide::Limits;
use onepass_server::{router, ServerOptions};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const REQ: &str = r#"{"state":{"ticket":"My card was charged twice for one order","tier":"gold"},"questions":{"topic":{"type":"choice","instructions":"What is the ticket about?","criteria":["billing","shipping","login"]},"urgent":{"type":"noul","instructions":"Is it urgent?"},"severity":{"type":"score","instructions":"How severe?","criteria":["minor","moderate","major"]}}}"#;

fn expected(body: &str) -> String {
    let v = real_engine()
        .system_one(body.as_bytes())
        .expect("engine answer");
    dumps_compact(&v).unwrap()
}

fn real_app(opts: ServerOptions) -> axum::Router {
    router(real_engine(), quiet(opts)).unwrap().0
}

#[tokio::test]
async fn systemone_is_byte_equal_to_the_engine() {
    let app = real_app(ServerOptions::default());
    let r = post_json(&app, "/v1/systemone", REQ).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.text(), expected(REQ));
    assert!(r
        .text()
        .starts_with(r#"{"model":"decider-dev","answers":{"topic":{"type":"choice","choice":"#));
    assert!(r.headers.contains_key("x-request-id"));
    // independent:false (one packed row) and the empty request
    let packed = REQ.replacen('{', r#"{"independent":false,"#, 1);
    let r = post_json(&app, "/v1/systemone", &packed).await;
    assert_eq!(r.text(), expected(&packed));
    let r = post_json(&app, "/v1/systemone", r#"{"state":null,"questions":{}}"#).await;
    assert_eq!(
        r.text(),
        r#"{"model":"decider-dev","answers":{},"usage":{"input_tokens":0,"output_tokens":0}}"#
    );
}

#[tokio::test]
async fn request_id_is_echoed() {
    let app = real_app(ServerOptions::default());
    let r = get(&app, "/health", &[("x-request-id", "abc-123")]).await;
    assert_eq!(r.headers["x-request-id"], "abc-123");
    assert_eq!(r.headers["x-typesafe-request-id"], "abc-123");
    let a = get(&app, "/health", &[]).await;
    let b = get(&app, "/health", &[]).await;
    assert_ne!(a.headers["x-request-id"], b.headers["x-request-id"]);
}

#[tokio::test]
async fn models_health_metrics_and_unknown_routes() {
    let app = real_app(ServerOptions {
        model_id: "/models/tiny".into(),
        ..Default::default()
    });
    let r = get(&app, "/v1/models", &[]).await;
    assert_eq!(
        r.text(),
        r#"{"models":[{"name":"decider-dev","description":"decider: one-pass typed decisions with calibrated probabilities","release_date":"2026-09-17"}]}"#
    );
    let r = get(&app, "/health", &[]).await;
    assert_eq!(
        r.text(),
        r#"{"ok":true,"model":"/models/tiny","device":"cpu","layout":"plain","temperature":1.0,"temperature_by_type":{"choice":1.0,"noul":1.0,"score":1.0}}"#
    );
    let r = get(&app, "/nope", &[]).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (404, r#"{"detail":"Not Found"}"#)
    );
    let r = get(&app, "/v1/systemone", &[]).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (405, r#"{"detail":"Method Not Allowed"}"#)
    );
    post_json(&app, "/v1/systemone", REQ).await;
    post_json(&app, "/v1/systemone", "{").await;
    let m = get(&app, "/metrics", &[]).await.text();
    for want in [
        r#"onepass_requests_total{route="/v1/systemone",status="200"} 1"#,
        r#"onepass_requests_total{route="/v1/systemone",status="422"} 1"#,
        r#"onepass_requests_total{route="other",status="404"} 1"#,
        r#"onepass_errors_total{status="422"} 1"#,
        "onepass_rows_total 3",
        "onepass_decisions_total 3",
        "onepass_batches_total 1",
        "onepass_queue_rows 0",
        "onepass_queue_rows_limit 4096",
        "onepass_up 1",
        r#"onepass_request_duration_seconds_count{route="/v1/systemone"} 3"#,
        r#"onepass_request_duration_seconds_bucket{route="/v1/systemone",le="+Inf"} 3"#,
        "# TYPE onepass_request_duration_seconds histogram",
    ] {
        assert!(m.contains(want), "metrics lack {want:?}:\n{m}");
    }
}

#[tokio::test]
async fn bad_json_and_validation_are_the_reference_422s() {
    let app = real_app(ServerOptions::default());
    let r = post_json(&app, "/v1/systemone", r#"{"state": }"#).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.text(),
        r#"{"detail":[{"type":"json_invalid","loc":["body",10],"msg":"JSON decode error","input":{},"ctx":{"error":"Expecting value"}}]}"#
    );
    let r = post_json(&app, "/v1/systemone", r#"{"questions":[]}"#).await;
    assert_eq!(
        r.text(),
        r#"{"detail":[{"type":"missing","loc":["body","state"],"msg":"Field required","input":{"questions":[]}},{"type":"dict_type","loc":["body","questions"],"msg":"Input should be a valid dictionary","input":[]}]}"#
    );
    let r = post_json(
        &app,
        "/v1/systemone",
        r#"{"state":1,"questions":{"q":{"type":"nope","instructions":"x"}}}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (422, r#"{"detail":"unknown question type 'nope'"}"#)
    );
    let r = post_json(
        &app,
        "/v1/systemone",
        r#"{"state":1,"questions":{},"assets":{"a":{}}}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (
            422,
            r#"{"detail":"this server was started without image support (DECIDER_IMAGES=1)"}"#
        )
    );
}

#[tokio::test]
async fn limits_are_413_in_the_reference_order() {
    let limits = Limits {
        max_rows: 2,
        max_row_tokens: 40,
        max_request_tokens: 60,
    };
    let app = real_app(ServerOptions {
        limits,
        ..Default::default()
    });
    let r = post_json(&app, "/v1/systemone", REQ).await;
    assert_eq!(r.status, 413);
    assert_eq!(
        r.text(),
        r#"{"detail":"too many questions: the request expands to 3 scoring rows, the limit is 2 (DECIDER_MAX_ROWS)"}"#
    );
    let long = format!(
        r#"{{"state":"{}","questions":{{"q":{{"type":"noul","instructions":"ok?"}}}}}}"#,
        "word ".repeat(60)
    );
    let r = post_json(&app, "/v1/systemone", &long).await;
    r.assert_says(413, "per row (DECIDER_MAX_ROW_TOKENS)");
    let two = r#"{"state":"a short state","questions":{"a":{"type":"noul","instructions":"one of two questions here?"},"b":{"type":"noul","instructions":"the other of the two questions?"}}}"#;
    let r = post_json(&app, "/v1/systemone", two).await;
    r.assert_says(
        413,
        "over 2 rows, the limit is 60 (DECIDER_MAX_REQUEST_TOKENS)",
    );
    // /decide: one row, same checks
    let r = post_json(
        &app,
        "/decide",
        &format!(
            r#"{{"context":"{}","schema":{{"q":{{"type":"bool"}}}}}}"#,
            "word ".repeat(60)
        ),
    )
    .await;
    assert_eq!(r.status, 413);
}

/// A row past the model's positions (config.json `max_position_embeddings`) is a 413 before any model work, on both
/// routes and in `Engine::system_one` (the reference has no such check; its forward would run); the server goes on
/// answering.
#[tokio::test]
async fn rows_past_the_models_positions_are_413s() {
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(checkpoint().join("config.json")).unwrap()).unwrap();
    let max = cfg["max_position_embeddings"]
        .as_u64()
        .or_else(|| cfg["text_config"]["max_position_embeddings"].as_u64())
        .unwrap() as usize;
    let app = real_app(ServerOptions::default());
    let long = format!(
        r#"{{"state":"{}","questions":{{"q":{{"type":"noul","instructions":"ok?"}}}}}}"#,
        "word ".repeat(max + 10)
    );
    let rows = onepass_decide::plan(
        &onepass_decide::parse_request(long.as_bytes()).unwrap(),
        real_engine().tokenizer(),
        real_engine().config(),
    )
    .unwrap();
    let longest = rows.rows[0].ids.len();
    assert!(longest > max && longest <= Limits::default().max_row_tokens);
    let want = format!(
        r#"{{"detail":"too many tokens: one row has {longest} tokens, the model has {max} positions (max_position_embeddings in config.json)"}}"#
    );
    let r = post_json(&app, "/v1/systemone", &long).await;
    assert_eq!((r.status, r.text()), (413, want.clone()));
    let e = real_engine().system_one(long.as_bytes()).unwrap_err();
    assert_eq!((e.status, e.http_body().2), (413, want));
    let r = post_json(
        &app,
        "/decide",
        &format!(
            r#"{{"context":"hi","schema":{{"{}?":{{"type":"bool"}}}}}}"#,
            "why ".repeat(max + 10)
        ),
    )
    .await;
    r.assert_says(413, &format!("the model has {max} positions"));
    let r = post_json(&app, "/v1/systemone", REQ).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A fake engine that answers only once `gate` is set, so that a first request holds its rows in the queue.
fn held_engine() -> (Arc<AtomicBool>, Arc<FakeEngine>) {
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let fake = Arc::new(FakeEngine::new(move |p| {
        while !g.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(uniform(p))
    }));
    (gate, fake)
}

/// Posts REQ in the background and returns once its 3 rows are queued.
async fn queue_first(
    app: &axum::Router,
    state: &onepass_server::App,
) -> tokio::task::JoinHandle<Resp> {
    let first = tokio::spawn({
        let app = app.clone();
        async move { post_json(&app, "/v1/systemone", REQ).await }
    });
    while state.admission.outstanding() < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first
}

#[tokio::test]
async fn queue_full_is_a_503_and_rows_are_released() {
    let (gate, fake) = held_engine();
    let (app, state) = router(
        fake,
        quiet(ServerOptions {
            max_queue_rows: 4,
            ..Default::default()
        }),
    )
    .unwrap();
    let first = queue_first(&app, &state).await;
    let r = post_json(&app, "/v1/systemone", REQ).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(
        r.text(),
        r#"{"detail":"server busy: 3 rows queued, the limit is 4 (DECIDER_MAX_QUEUE_ROWS); retry later"}"#
    );
    gate.store(true, Ordering::Release);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(state.admission.outstanding(), 0);
    assert_eq!(post_json(&app, "/v1/systemone", REQ).await.status, 200);
    // a request larger than the whole queue can never fit: 413, not "retry later"
    let (app, _) = router(
        real_engine(),
        quiet(ServerOptions {
            max_queue_rows: 2,
            ..Default::default()
        }),
    )
    .unwrap();
    let r = post_json(&app, "/v1/systemone", REQ).await;
    r.assert_says(413, "3 scoring rows and the queue holds at most 2");
}

/// A full queue answers 503 before the body is read or parsed: the engine is never asked, the body (here one that
/// would take the parser long) never reaches the pipeline.
#[tokio::test]
async fn a_full_queue_refuses_before_parsing() {
    let (gate, fake) = held_engine();
    let (app, state) = router(
        fake.clone(),
        quiet(ServerOptions {
            max_queue_rows: 3,
            ..Default::default()
        }),
    )
    .unwrap();
    let first = queue_first(&app, &state).await;
    // Not even JSON: a parsed body would be a 422, so a 503 shows nothing was parsed.
    let r = post_json(&app, "/v1/systemone", "{not json").await;
    assert_eq!(r.status, 503, "{}", r.text());
    let r = post_json(&app, "/decide", "{not json").await;
    assert_eq!(r.status, 503, "{}", r.text());
    gate.store(true, Ordering::Release);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(
        post_json(&app, "/v1/systemone", "{not json").await.status,
        422
    );
    assert_eq!(fake.calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn api_key_is_required_when_set() {
    let app = real_app(ServerOptions {
        api_key: Some("s3cret".into()),
        ..Default::default()
    });
    let r = post_json(&app, "/v1/systemone", REQ).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    assert_eq!(
        r.text(),
        r#"{"detail":"missing API key: send the header Authorization: Bearer <key>"}"#
    );
    let r = get(&app, "/v1/models", &[("authorization", "Bearer nope")]).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (401, r#"{"detail":"invalid API key"}"#)
    );
    let r = call(
        &app,
        "POST",
        "/v1/systemone",
        &[
            ("authorization", "Bearer s3cret"),
            ("content-type", "application/json"),
        ],
        REQ.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(get(&app, "/health", &[]).await.status, 200);
}

#[tokio::test]
async fn zstd_and_gzip_bodies() {
    let app = real_app(ServerOptions {
        max_body_bytes: 4096,
        ..Default::default()
    });
    let want = expected(REQ);
    let z = zstd::encode_all(REQ.as_bytes(), 3).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(REQ.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    for (enc, body) in [("zstd", z), ("gzip", gz)] {
        let r = call(
            &app,
            "POST",
            "/v1/systemone",
            &[
                ("content-encoding", enc),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await;
        assert_eq!(r.status, 200, "{enc}: {}", r.text());
        assert_eq!(r.text(), want, "{enc}");
    }
    // decompressed size capped; unknown codings and corrupt data refused
    let big = format!(r#"{{"state":"{}","questions":{{}}}}"#, "a".repeat(10_000));
    let zbig = zstd::encode_all(big.as_bytes(), 3).unwrap();
    let r = post_encoded(&app, "/v1/systemone", "zstd", zbig).await;
    assert_eq!(r.status, 413);
    assert_eq!(
        r.text(),
        r#"{"detail":"request body too large: more than 4096 bytes after decompression (--max-body-bytes)"}"#
    );
    let r = call(&app, "POST", "/v1/systemone", &[], big.into_bytes()).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (
            413,
            r#"{"detail":"request body too large: more than 4096 bytes (--max-body-bytes)"}"#
        )
    );
    let r = post_encoded(&app, "/v1/systemone", "br", b"x".to_vec()).await;
    assert_eq!(r.status, 415);
    let r = post_encoded(&app, "/v1/systemone", "zstd", b"not zstd".to_vec()).await;
    assert_eq!(r.status, 400);
    // /decide takes compressed bodies too
    let d = r#"{"context":"The cat sat.","schema":{"cat?":{"type":"bool"}}}"#;
    let plain = post_json(&app, "/decide", d).await;
    let zd = zstd::encode_all(d.as_bytes(), 1).unwrap();
    let r = post_encoded(&app, "/decide", "zstd", zd).await;
    assert_eq!((r.status, r.text()), (200, plain.text()));
}

/// `bodies` posted to `/v1/systemone` 10 ms apart, to a server over `eng` whose every engine call first sleeps 150 ms:
/// the first call holds the others back, which then queue and go to the worker together. → the answers, in order,
/// and the plan count of every engine call.
async fn behind_a_slow_call(
    eng: Arc<onepass_decide::Engine>,
    bodies: &[String],
) -> (Vec<Resp>, Vec<usize>) {
    let fake = Arc::new(FakeEngine::new(move |plans| {
        std::thread::sleep(Duration::from_millis(150));
        onepass_decide::Engine::score(&eng, plans).map_err(|e| e.to_string())
    }));
    let (app, _) = router(fake.clone(), quiet(ServerOptions::default())).unwrap();
    let mut tasks = vec![];
    for b in bodies {
        let (app, b) = (app.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            post_json(&app, "/v1/systemone", &b).await
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let calls = fake.calls.lock().unwrap().clone();
    (answers, calls)
}

#[tokio::test]
async fn concurrent_requests_are_batched_and_equal_to_alone() {
    let bodies: Vec<String> = (0..6)
        .map(|i| {
            format!(
                r#"{{"state":{{"n":{i},"text":"request number {i}"}},"questions":{{"q":{{"type":"choice","instructions":"Which parity?","criteria":["even","odd"]}},"r":{{"type":"noul","instructions":"Is it above three?"}}}}}}"#
            )
        })
        .collect();
    let alone: Vec<String> = bodies.iter().map(|b| expected(b)).collect();
    // a slow first call lets the others queue up behind it, then they go in one batch
    let (answers, calls) = behind_a_slow_call(real_engine(), &bodies).await;
    for (r, want) in answers.iter().zip(&alone) {
        assert_eq!(r.status, 200);
        assert_eq!(&r.text(), want);
    }
    assert_eq!(calls.iter().sum::<usize>(), 6);
    assert!(calls.len() < 6, "expected batching, got calls of {calls:?}");
    // the real engine behind the router, all at once
    let app = real_app(ServerOptions::default());
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let app = app.clone();
            tokio::spawn(async move { post_json(&app, "/v1/systemone", &b).await })
        })
        .collect();
    for (t, want) in tasks.into_iter().zip(&alone) {
        assert_eq!(&t.await.unwrap().text(), want);
    }
}

#[tokio::test]
async fn engine_errors_and_panics_are_500s_for_the_affected_request_only() {
    // Plans whose state is "boom" panic, "fail" error (told apart by their context ids); the others are answered.
    let tok = tokenizer();
    let boom = tok.encode("Context:\nboom boom boom").unwrap();
    let fail = tok.encode("Context:\nfail").unwrap();
    let is = |p: &onepass_decide::Plan, ctx: &[u32]| p.rows[0].ids[..p.ctx_len] == *ctx;
    let fake = Arc::new(FakeEngine::new(move |plans| {
        std::thread::sleep(Duration::from_millis(50));
        if plans.iter().any(|p| is(p, &boom)) {
            panic!("synthetic engine panic");
        }
        if plans.iter().any(|p| is(p, &fail)) {
            return Err("synthetic engine error".into());
        }
        Ok(uniform(plans))
    }));
    let (app, state) = router(fake, quiet(ServerOptions::default())).unwrap();
    let body = |s: &str| {
        format!(r#"{{"state":"{s}","questions":{{"q":{{"type":"noul","instructions":"ok?"}}}}}}"#)
    };
    let mut tasks = vec![];
    for s in ["fine", "boom boom boom", "well", "fail", "good to go"] {
        let app = app.clone();
        let b = body(s);
        tasks.push(tokio::spawn(async move {
            post_json(&app, "/v1/systemone", &b).await
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got: Vec<_> = futures_join(tasks).await;
    assert_eq!(got[0].status, 200);
    assert_eq!(got[1].status, 500);
    assert_eq!(
        got[1].text(),
        r#"{"detail":"the engine panicked: synthetic engine panic"}"#
    );
    assert_eq!(got[2].status, 200);
    assert_eq!(
        (got[3].status, got[3].text().as_str()),
        (500, r#"{"detail":"synthetic engine error"}"#)
    );
    assert_eq!(got[4].status, 200);
    assert_eq!(state.admission.outstanding(), 0);
    assert!(state.batcher.alive());
    assert_eq!(
        post_json(&app, "/v1/systemone", &body("after"))
            .await
            .status,
        200
    );
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Resp>>) -> Vec<Resp> {
    let mut out = vec![];
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// One `/metrics` value by its name (a line `NAME VALUE`).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

/// `/v1/systemone` with the prefix-state LRU: a repeated request starts from its kept context (a hit in `/metrics`)
/// and answers byte for byte as a fresh server; an LRU too small for a state keeps none (every lookup a miss) and
/// answers the same; requests over one state queued behind a slow call go to the batching worker together, start from
/// the context the first kept, and answer as each alone.
#[tokio::test]
async fn systemone_contexts_share_the_prefix_cache() {
    let load = |bytes: usize| {
        Arc::new(
            onepass_decide::Engine::load(
                checkpoint(),
                onepass_decide::EngineOptions {
                    prefix_cache_bytes: bytes,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    };
    let stats = |app: &axum::Router| {
        let app = app.clone();
        async move {
            let m = get(&app, "/metrics", &[]).await.text();
            [
                "onepass_prefix_cache_hits_total",
                "onepass_prefix_cache_misses_total",
                "onepass_prefix_cache_entries",
            ]
            .map(|n| metric(&m, n))
        }
    };
    let fresh = router(load(1 << 30), quiet(ServerOptions::default()))
        .unwrap()
        .0;
    let want = post_json(&fresh, "/v1/systemone", REQ).await;
    assert_eq!(want.status, 200, "{}", want.text());
    let app = router(load(1 << 30), quiet(ServerOptions::default()))
        .unwrap()
        .0;
    assert_eq!(
        post_json(&app, "/v1/systemone", REQ).await.text(),
        want.text()
    );
    assert_eq!(stats(&app).await, [0, 1, 1], "a miss, its context kept");
    assert_eq!(
        post_json(&app, "/v1/systemone", REQ).await.text(),
        want.text()
    );
    assert_eq!(
        stats(&app).await,
        [1, 1, 1],
        "the same request again: a hit"
    );
    let m = get(&app, "/metrics", &[]).await.text();
    assert!(metric(&m, "onepass_prefix_cache_bytes") > 0);
    // Too small for any state: nothing kept, the same answers.
    let small = router(load(1), quiet(ServerOptions::default())).unwrap().0;
    for _ in 0..2 {
        assert_eq!(
            post_json(&small, "/v1/systemone", REQ).await.text(),
            want.text()
        );
    }
    assert_eq!(stats(&small).await, [0, 2, 0]);
    let m = get(&small, "/metrics", &[]).await.text();
    assert_eq!(metric(&m, "onepass_prefix_cache_bytes"), 0);

    // The batching worker: one state, four question sets; the first call is held so the others queue behind it.
    let bodies: Vec<String> = ["What is the ticket about?", "Which team?", "What went wrong?", "Who pays?"]
        .iter()
        .map(|q| {
            format!(
                r#"{{"state":{{"ticket":"My card was charged twice for one order","tier":"gold"}},"questions":{{"q":{{"type":"choice","instructions":"{q}","criteria":["billing","shipping","login"]}},"u":{{"type":"noul","instructions":"Is it urgent?"}}}}}}"#
            )
        })
        .collect();
    let computed = router(load(1), quiet(ServerOptions::default())).unwrap().0;
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(post_json(&computed, "/v1/systemone", b).await.text());
    }
    let eng = load(1 << 30);
    let (answers, calls) = behind_a_slow_call(eng.clone(), &bodies).await;
    for (r, want) in answers.iter().zip(&alone) {
        assert_eq!((r.status, &r.text()), (200, want));
    }
    assert!(calls.len() < 4, "expected batching, got calls of {calls:?}");
    let s = eng.prefix_cache_stats();
    assert_eq!(
        (s.hits, s.misses, s.entries),
        (3, 1, 1),
        "the first call keeps the context, the batch after it starts from it"
    );
}

//! Client input that must get a 4xx, never a 500 or a wrong "too large": non-finite numbers, bodies that cannot be
//! read, bodies that come too slowly; and the state cut while it is built, whatever the body's size.

#![allow(clippy::unwrap_used)]

mod common;

use axum::body::{Body, Bytes};
use common::*;
use onepass_server::{router, ServerOptions};
use std::sync::Arc;
use std::time::Duration;

fn fake_app(opts: ServerOptions) -> axum::Router {
    router(Arc::new(FakeEngine::new(|p| Ok(uniform(p)))), quiet(opts))
        .unwrap()
        .0
}

async fn send(app: &axum::Router, path: &str, body: Body) -> Resp {
    call_body(
        app,
        "POST",
        path,
        &[("content-type", "application/json")],
        body,
    )
    .await
}

/// `NaN`, `Infinity`, `-Infinity` and `1e400` echoed in a validation error: the reference's writer fails and answers a
/// plain 500; onepass answers the 422 with each number as a string.
#[tokio::test]
async fn non_finite_numbers_in_client_input_are_a_422() {
    let app = fake_app(ServerOptions::default());
    for (path, body, echoed) in [
        (
            "/v1/systemone",
            r#"{"state":1,"questions":{},"independent":NaN}"#,
            r#""input":"nan""#,
        ),
        (
            "/v1/systemone",
            r#"{"state":1,"questions":{},"independent":1e400}"#,
            r#""input":"inf""#,
        ),
        (
            "/v1/systemone",
            r#"{"questions":{},"x":-Infinity}"#,
            r#""x":"-inf""#,
        ),
        (
            "/decide",
            r#"{"context":Infinity,"schema":{}}"#,
            r#""input":"inf""#,
        ),
        ("/decide", r#"{"context":NaN}"#, r#""input":"nan""#),
    ] {
        let r = post_json(&app, path, body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.headers["content-type"], "application/json", "{body}");
        assert!(r.text().contains(echoed), "{body}: {}", r.text());
    }
    let m = get(&app, "/metrics", &[]).await.text();
    assert!(m.contains(r#"onepass_errors_total{status="422"} 5"#), "{m}");
    assert!(!m.contains(r#"status="500""#), "{m}");
}

/// A body whose stream fails (what hyper reports for a body cut short, a bad chunk-size line or a missing last chunk)
/// is a 400 that says so, not a 413 "too large"; the metrics count a 400.
#[tokio::test]
async fn a_body_that_cannot_be_read_is_a_400() {
    let app = fake_app(ServerOptions::default());
    for path in ["/v1/systemone", "/decide"] {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"{\"state\":")),
            Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before message completed",
            )),
        ];
        let r = send(&app, path, Body::from_stream(futures_iter(chunks))).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        r.assert_says(400, "could not be read in full");
    }
    // Past the cap is still the 413.
    let small = fake_app(ServerOptions {
        max_body_bytes: 8,
        ..Default::default()
    });
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        vec![Ok(Bytes::from_static(b"{\"state\":1,\"questions\":{}}"))];
    let r = send(
        &small,
        "/v1/systemone",
        Body::from_stream(futures_iter(chunks)),
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.text());
    let m = get(&app, "/metrics", &[]).await.text();
    assert!(m.contains(r#"onepass_errors_total{status="400"} 2"#), "{m}");
    assert!(!m.contains(r#"status="413""#), "{m}");
}

/// A body that stops coming is cut at the body timeout with a 408.
#[tokio::test]
async fn a_body_that_stops_coming_is_a_408() {
    let app = fake_app(ServerOptions {
        body_timeout: Duration::from_millis(200),
        ..Default::default()
    });
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tx.send(Ok(Bytes::from_static(b"{\"state\":")))
        .await
        .unwrap();
    let stream = futures_util_stream(rx);
    let r = send(&app, "/v1/systemone", Body::from_stream(stream)).await;
    drop(tx);
    r.assert_says(408, "--body-timeout");
}

/// A state far past the token cap (a million-element array; and a long string) is cut while it is rendered: the
/// row starts with exactly the reference's ids (the whole text tokenized, then cut), and its context holds the cap.
#[tokio::test]
async fn a_huge_state_is_cut_to_the_reference_ids() {
    let tok = tokenizer();
    let cfg = onepass_decide::DecideConfig::default();
    let cap = 2000;
    let cfg = onepass_decide::DecideConfig {
        max_state_tokens: cap,
        ..cfg
    };
    let zeros = format!(
        r#"{{"state":[{}],"questions":{{"q":{{"instructions":"Is it?","criteria":["a","b"]}}}}}}"#,
        vec!["0"; 100_000].join(",")
    );
    let words = format!(
        r#"{{"state":"{}","questions":{{"q":{{"instructions":"Is it?","criteria":["a","b"]}}}}}}"#,
        "the quick brown fox, jumps over 12 lazy dogs; ".repeat(4000)
    );
    for body in [zeros, words] {
        let req = onepass_decide::parse_request(body.as_bytes()).unwrap();
        let plan = onepass_decide::plan(&req, &tok, &cfg).unwrap();
        let full = tok
            .encode(&format!(
                "Context:\n{}",
                onepass_decide::render::render_state(&req.state)
            ))
            .unwrap();
        assert!(full.len() > cap);
        assert_eq!(plan.ctx_len, cap);
        assert_eq!(plan.rows[0].ids[..cap], full[..cap]);
    }
}

/// The chunks as a body stream that ends after them (sent through [`futures_util_stream`]'s channel, filled up front).
fn futures_iter(
    items: Vec<Result<Bytes, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(items.len().max(1));
    for item in items {
        tx.try_send(item).expect("the channel holds every chunk");
    }
    futures_util_stream(rx)
}

fn futures_util_stream(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    Rx(rx)
}

struct Rx(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures_core::Stream for Rx {
    type Item = Result<Bytes, std::io::Error>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

//! `POST /v1/decide`: one decision over a list of choices (`onepass_decide::choice`). The body and the answer are a
//! session's decide line without its `"cmd"`; a refused or failed request answers `{"id", "error": {"type",
//! "message"}}` with 400 (nothing ran), 500 (the model failed) or 501 (an engine that does not decide). The server's LRU of prefix states stands in for a
//! session's kept state. Decisions run one at a time on the blocking pool, each holding one admission row, so a full
//! queue refuses them with 503 as it refuses System One requests.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use onepass_decide::choice::{DecideError, DecideRequest, PrefixCacheStats};
use serde_json::Value as J;

use crate::{busy, json_error, raw, read_body, App, Work};

fn error_response(e: &DecideError) -> Response {
    let status = match e.kind {
        onepass_decide::choice::ErrorKind::InvalidRequest => 400,
        onepass_decide::choice::ErrorKind::Server => 500,
        onepass_decide::choice::ErrorKind::Unsupported => 501,
    };
    raw(status, "application/json", e.to_json().to_string())
}

pub(crate) async fn decide(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let admitted = match app.admission.admit(1) {
        Ok(a) => a,
        Err(outstanding) => return json_error(busy(&app, outstanding)),
    };
    let bytes = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(e) => return json_error(e),
    };
    let v: J = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error_response(&DecideError::invalid(
                J::Null,
                format!("the body is not JSON: {e}"),
            ))
        }
    };
    let req = match DecideRequest::from_json(&v, &[]) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let Ok(_permit) = app.deciding.clone().acquire_owned().await else {
        return json_error(onepass_decide::ApiError::detail(
            500,
            "the server is shutting down",
        ));
    };
    let engine = app.engine.clone();
    let answer = tokio::task::spawn_blocking(move || engine.choose(&req))
        .await
        .unwrap_or_else(|e| {
            Err(DecideError::server(
                J::Null,
                format!("the decision failed: {e}"),
            ))
        });
    drop(admitted);
    match answer {
        Ok(a) => {
            let mut r = raw(200, "application/json", a.to_json().to_string());
            r.extensions_mut().insert(Work {
                rows: 1,
                tokens: a.n_tokens as u64,
                decisions: 1,
            });
            r
        }
        Err(e) => error_response(&e),
    }
}

/// The prefix-state cache's lines of `/metrics`.
pub(crate) fn metrics(s: &PrefixCacheStats) -> String {
    let mut out = String::new();
    let lines: [(&str, &str, &str, String); 6] = [
        (
            "onepass_prefix_cache_hits_total",
            "counter",
            "Lookups (a decision's prefix, a System One request's context) that found a kept prefix state.",
            s.hits.to_string(),
        ),
        (
            "onepass_prefix_cache_misses_total",
            "counter",
            "Lookups (a decision's prefix, a System One request's context) that found no kept prefix state.",
            s.misses.to_string(),
        ),
        (
            "onepass_prefix_cache_evictions_total",
            "counter",
            "Prefix states dropped to make room.",
            s.evictions.to_string(),
        ),
        (
            "onepass_prefix_cache_entries",
            "gauge",
            "Prefix states kept.",
            s.entries.to_string(),
        ),
        (
            "onepass_prefix_cache_bytes",
            "gauge",
            "Bytes of the prefix states kept.",
            s.bytes.to_string(),
        ),
        (
            "onepass_prefix_cache_capacity_bytes",
            "gauge",
            "The prefix-state cache's bound in bytes (--prefix-cache-mb).",
            s.cap_bytes.to_string(),
        ),
    ];
    for (name, kind, help, v) in lines {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    }
    out
}

//! The onepass HTTP server: decider-ai 1.10.0's serving API over axum, thin over `onepass-decide`.
//!
//! Why this crate exists: HTTP (routes, limits as status codes, admission, batching, timeouts, metrics) kept apart
//! from the decisions, which it never re-implements and which know nothing of HTTP.
//!
//! Routes: `POST /v1/systemone` (byte-exact with the reference), `POST /decide` (the plain form), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus). A scoring request is refused with 503 before its body is read when
//! the queue is full; otherwise its body is read (with a size cap and a time limit), then decompressed (zstd, gzip),
//! parsed, planned and checked against the limits by `onepass-decide`'s one [`Pipeline`] on the blocking pool (at
//! most one preparation per core at a time); the 413 checks and the 503 admission run before any model work
//! (decider-contract R1.9.1); then its plan goes to the single batching worker ([`batcher`]), which scores every
//! pending plan in one engine call, and the pipeline writes the answer. [`router`] builds the whole app around any
//! [`DecideEngine`], so tests drive it without a socket; [`serve`] runs it on a listener with the connection
//! timeouts and a bounded shutdown; docs/server.md describes the routes, options and what differs from the reference.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod batcher;
pub mod body;
mod choices;
pub mod engine;
pub mod metrics;
mod openai;
pub mod serve;

pub use engine::{DecideEngine, Scores};
pub use serve::{serve, Timeouts};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use batcher::{Admission, Batcher, Job};
use metrics::Metrics;
use onepass_decide::pyjson::{dumps_compact, obj, py_str, Object, Value};
use onepass_decide::{ApiError, Layout, Limits, Pipeline, Plan, Prepared, Route};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Semaphore};

/// Everything `onepass serve` can set.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOptions {
    /// 413 limits (`DECIDER_MAX_ROWS`, `DECIDER_MAX_ROW_TOKENS`, `DECIDER_MAX_REQUEST_TOKENS`).
    pub limits: Limits,
    /// `DECIDER_MAX_QUEUE_ROWS`: rows admitted and not yet answered (503 past it).
    pub max_queue_rows: usize,
    /// Most rows per engine call (a larger request still runs, alone).
    pub max_batch_rows: usize,
    /// Bearer token every route but `/health` requires; `None`: no auth.
    pub api_key: Option<String>,
    /// Cap on a request body, before and after decompression.
    pub max_body_bytes: usize,
    /// What `/health` reports as `"model"` (the `--model` argument, like `DECIDER_MODEL`).
    pub model_id: String,
    /// What `/health` reports as `"device"`.
    pub device: String,
    /// One stderr line per request.
    pub log_requests: bool,
    /// Time a client has to send a whole request body (408 past it).
    pub body_timeout: Duration,
    /// Request preparations (read body, decompress, parse, plan) running at once; more wait their turn. Each one's
    /// memory is bounded by the body cap and the state's token cap, so this bounds their sum.
    pub max_preparing: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            limits: Limits::default(),
            max_queue_rows: 4096,
            max_batch_rows: 64,
            api_key: None,
            max_body_bytes: 64 << 20,
            model_id: String::new(),
            device: "cpu".into(),
            log_requests: true,
            body_timeout: Duration::from_secs(30),
            max_preparing: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// The shared state behind every route.
pub struct App {
    pub engine: Arc<dyn DecideEngine>,
    pub opts: ServerOptions,
    pub admission: Arc<Admission>,
    pub batcher: Batcher,
    pub metrics: Arc<Metrics>,
    preparing: Semaphore,
    /// One generation at a time (each holds one admission row while it waits or runs).
    generating: Arc<Semaphore>,
    /// One decision over choices at a time (they share the engine's prefix-state cache).
    deciding: Arc<Semaphore>,
    id_seed: u64,
    seq: AtomicU64,
}

impl App {
    /// Stop the batching worker after it has answered everything queued (call after the HTTP server has drained).
    pub fn shutdown(&self) {
        self.batcher.shutdown();
    }

    /// A fresh request id (what `x-request-id` carries when the client sent none).
    fn next_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{:012x}{:08x}", self.id_seed >> 16, n)
    }
}

/// The app around `engine`: the router and its state (keep the state to call [`App::shutdown`]).
pub fn router(
    engine: Arc<dyn DecideEngine>,
    opts: ServerOptions,
) -> std::io::Result<(Router, Arc<App>)> {
    let metrics = Arc::new(Metrics::default());
    let batcher = Batcher::start(engine.clone(), opts.max_batch_rows, metrics.clone())?;
    let app = Arc::new(App {
        engine,
        admission: Admission::new(opts.max_queue_rows),
        batcher,
        metrics,
        preparing: Semaphore::new(opts.max_preparing.max(1)),
        generating: Arc::new(Semaphore::new(1)),
        deciding: Arc::new(Semaphore::new(1)),
        id_seed: std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish(),
        seq: AtomicU64::new(0),
        opts,
    });
    let r = Router::new()
        .route("/v1/systemone", post(systemone))
        .route("/decide", post(decide))
        .route("/v1/decide", post(choices::decide))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_route))
        .fallback(|| async { json_error(ApiError::detail(404, "Not Found")) })
        .method_not_allowed_fallback(|| async {
            json_error(ApiError::detail(405, "Method Not Allowed"))
        })
        .layer(middleware::from_fn_with_state(app.clone(), around))
        .with_state(app.clone());
    Ok((r, app))
}

/// What a route did, for the log line and the metrics (a response extension).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Work {
    pub(crate) rows: u64,
    pub(crate) tokens: u64,
    pub(crate) decisions: u64,
}

const ROUTES: [&str; 8] = [
    "/v1/decide",
    "/v1/systemone",
    "/decide",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
];

/// Request id, auth, then (after the route) the id headers, metrics and the log line.
async fn around(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let path = req.uri().path().to_string();
    let route = ROUTES
        .iter()
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other");
    let method = req.method().clone();
    let rid = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| app.next_id());
    let mut resp = match authorized(&app, &path, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            let mut r = json_error(e);
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    };
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v.clone());
        resp.headers_mut().insert("x-typesafe-request-id", v);
    }
    let secs = t0.elapsed().as_secs_f64();
    let status = resp.status().as_u16();
    let work = resp.extensions().get::<Work>().copied().unwrap_or_default();
    app.metrics
        .request(route, status, secs, work.rows, work.tokens, work.decisions);
    if app.opts.log_requests {
        eprintln!(
            "onepass-server: id={rid} {method} {path} status={status} rows={} tokens={} latency_ms={:.1}",
            work.rows,
            work.tokens,
            secs * 1e3
        );
    }
    resp
}

/// `Authorization: Bearer <key>` when a key is set; `/health` stays open for probes.
fn authorized(app: &App, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = app.opts.api_key.as_deref() else {
        return Ok(());
    };
    if path == "/health" {
        return Ok(());
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), key.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::detail(401, "invalid API key")),
        None => Err(ApiError::detail(
            401,
            "missing API key: send the header Authorization: Bearer <key>",
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An [`ApiError`] as Starlette writes it. A 503 (queue full) also says when to retry, which the TypeSafe SDK
/// honours (the reference sends no such header; clients that ignore it see the same response).
pub(crate) fn json_error(e: ApiError) -> Response {
    let (status, ctype, body) = e.served_body();
    let mut r = raw(status, ctype, body);
    if status == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

pub(crate) fn raw(status: u16, ctype: &'static str, body: String) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body,
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

/// A 200 JSON answer (compact, like Starlette's `JSONResponse`); a non-finite float is Starlette's plain 500.
fn json_ok(v: &Value, work: Work) -> Response {
    let mut r = match dumps_compact(v) {
        Ok(s) => raw(200, "application/json", s),
        Err(_) => raw(
            500,
            "text/plain; charset=utf-8",
            "Internal Server Error".into(),
        ),
    };
    r.extensions_mut().insert(work);
    r
}

/// Bodies at least this large (raw or decompressed) give their memory back to the system once prepared.
const TRIM_AFTER_BYTES: usize = 1 << 20;

/// Read the body (capped in size and time), then, on the blocking pool and at most `max_preparing` at a time, undo its
/// `Content-Encoding` and run the pipeline's `prepare`. A body that cannot be read (cut short, a bad chunk) is a 400, a
/// slow one a 408, a large one a 413.
async fn prepare(
    app: &Arc<App>,
    route: Route,
    headers: &HeaderMap,
    body: Body,
) -> Result<Prepared, ApiError> {
    let (raw, enc) = read_raw(app, headers, body).await?;
    let max = app.opts.max_body_bytes;
    let _permit = app
        .preparing
        .acquire()
        .await
        .map_err(|_| ApiError::detail(500, "the server is shutting down"))?;
    let app = app.clone();
    tokio::task::spawn_blocking(move || {
        let raw_len = raw.len();
        let bytes = body::decode(enc.as_deref(), Vec::from(raw), max)?;
        let big = raw_len.max(bytes.len()) >= TRIM_AFTER_BYTES;
        let r = pipeline(&app).prepare(route, &bytes);
        drop(bytes);
        if big {
            give_memory_back();
        }
        r
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::detail(
            500,
            format!("request preparation failed: {e}"),
        ))
    })
}

/// The body as sent (its declared and its read size capped, its arrival time limited) and its `Content-Encoding`.
async fn read_raw(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<(axum::body::Bytes, Option<String>), ApiError> {
    let max = app.opts.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(body::too_large(max, false));
    }
    let raw =
        match tokio::time::timeout(app.opts.body_timeout, axum::body::to_bytes(body, max)).await {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) => return Err(body::read_error(&e, max)),
            Err(_) => return Err(body::timed_out(app.opts.body_timeout)),
        };
    let enc = headers.get(header::CONTENT_ENCODING).map(|v| {
        v.to_str()
            .map(str::to_string)
            .unwrap_or_else(|_| "?".into())
    });
    Ok((raw, enc))
}

/// A whole body, read as [`prepare`] reads it and decompressed (the generation routes).
pub(crate) async fn read_body(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, ApiError> {
    let (raw, enc) = read_raw(app, headers, body).await?;
    let max = app.opts.max_body_bytes;
    tokio::task::spawn_blocking(move || body::decode(enc.as_deref(), Vec::from(raw), max))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::detail(
                500,
                format!("reading the body failed: {e}"),
            ))
        })
}

/// Return freed heap pages to the system (glibc keeps them otherwise, so one large request would hold its peak).
fn give_memory_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of glibc's heap; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn pipeline(app: &App) -> Pipeline<'_> {
    Pipeline {
        tokenizer: app.engine.tokenizer(),
        config: app.engine.config(),
        limits: &app.opts.limits,
        max_positions: app.engine.max_positions(),
    }
}

/// The 503 for a queue that cannot take `rows` more rows now.
pub(crate) fn busy(app: &App, outstanding: usize) -> ApiError {
    ApiError::detail(
        503,
        format!(
            "server busy: {outstanding} rows queued, the limit is {} (DECIDER_MAX_QUEUE_ROWS); retry later",
            app.admission.max_rows
        ),
    )
}

/// Reserve the plan's rows (413 when they could never fit the queue, 503 when it is full now) and score it on the
/// batching worker.
async fn score(app: &App, plan: Arc<Plan>) -> Result<Vec<Vec<f32>>, ApiError> {
    let rows = plan.rows.len();
    if rows > app.admission.max_rows {
        return Err(ApiError::detail(
            413,
            format!(
                "too many rows: the request expands to {rows} scoring rows and the queue holds at most {} \
                 (--max-queue-rows, DECIDER_MAX_QUEUE_ROWS); split the request",
                app.admission.max_rows
            ),
        ));
    }
    let admitted = app
        .admission
        .admit(rows)
        .map_err(|outstanding| busy(app, outstanding))?;
    let (tx, rx) = oneshot::channel();
    app.batcher
        .submit(Job {
            plan,
            reply: tx,
            admitted,
        })
        .map_err(|_| ApiError::detail(500, "the batching worker has stopped"))?;
    match rx.await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(msg)) => Err(ApiError::detail(500, msg)),
        Err(_) => Err(ApiError::detail(
            500,
            "the batching worker dropped the request",
        )),
    }
}

/// `POST /v1/systemone` and `POST /decide`: admission, prepare, score, answer.
async fn scoring(app: Arc<App>, route: Route, headers: HeaderMap, body: Body) -> Response {
    // Admission before any work: a full queue answers at once, without reading or parsing the body.
    let outstanding = app.admission.outstanding();
    if outstanding >= app.admission.max_rows {
        return json_error(busy(&app, outstanding));
    }
    let prepared = match prepare(&app, route, &headers, body).await {
        Ok(p) => p,
        Err(e) => return json_error(e),
    };
    let probs = if prepared.plan.rows.is_empty() {
        vec![]
    } else {
        match score(&app, prepared.plan.clone()).await {
            Ok(p) => p,
            Err(e) => return json_error(e),
        }
    };
    let work = work_of(&prepared.plan, prepared.decisions());
    match pipeline(&app).answer(&prepared, &probs, app.engine.model_name()) {
        Ok(v) => json_ok(&v, work),
        Err(e) => json_error(e),
    }
}

fn work_of(plan: &Plan, decisions: usize) -> Work {
    Work {
        rows: plan.rows.len() as u64,
        tokens: plan.rows.iter().map(|r| r.ids.len() as u64).sum(),
        decisions: decisions as u64,
    }
}

/// `POST /v1/systemone` (serve.py `systemone`, decider-contract §5.1).
async fn systemone(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    scoring(app, Route::SystemOne, headers, body).await
}

/// `POST /decide` (serve.py `decide`, decider-contract §5.2).
async fn decide(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    scoring(app, Route::Decide, headers, body).await
}

/// `GET /v1/models` (decider-contract §5.3).
async fn models(State(app): State<Arc<App>>) -> Response {
    let release = app
        .engine
        .config()
        .raw
        .get("release_date")
        .map(py_str)
        .unwrap_or_else(|| "2026-09-17".into());
    let m = obj([
        ("name", Value::str(app.engine.model_name())),
        (
            "description",
            Value::str("decider: one-pass typed decisions with calibrated probabilities"),
        ),
        ("release_date", Value::Str(release)),
    ]);
    json_ok(&obj([("models", Value::Array(vec![m]))]), Work::default())
}

/// `GET /health` (decider-contract §5.3): `ok` is "the batching worker runs".
async fn health(State(app): State<Arc<App>>) -> Response {
    let by_type: Object = onepass_decide::config::effective(&app.engine.config().temperature)
        .into_iter()
        .map(|(q, v)| (q.as_str().to_string(), v))
        .collect();
    let v = obj([
        ("ok", Value::Bool(app.batcher.alive())),
        ("model", Value::str(app.opts.model_id.clone())),
        ("device", Value::str(app.opts.device.clone())),
        (
            "layout",
            Value::str(match app.engine.config().layout {
                Layout::Plain => "plain",
                Layout::Chat => "chat",
            }),
        ),
        (
            "temperature",
            Value::Float(app.engine.config().temperature.t),
        ),
        ("temperature_by_type", Value::Object(by_type)),
    ]);
    json_ok(&v, Work::default())
}

/// `GET /metrics`: Prometheus text.
async fn metrics_route(State(app): State<Arc<App>>) -> Response {
    let mut text = app.metrics.render(
        app.admission.outstanding(),
        app.admission.max_rows,
        app.batcher.alive(),
    );
    if let Some(stats) = app.engine.prefix_cache_stats() {
        text.push_str(&choices::metrics(&stats));
    }
    raw(200, "text/plain; version=0.0.4; charset=utf-8", text)
}

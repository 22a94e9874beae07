//! `POST /v1/chat/completions` and `POST /v1/completions`: generation in the OpenAI shape, so the official clients
//! work unchanged.
//!
//! A body is read like every other (size cap, time limit, `Content-Encoding`), then parsed by
//! [`onepass_decide::generate::parse_generate`] (messages or prompt, `max_tokens`, `temperature`, `top_p`, `top_k`,
//! `seed`, `stop`, `stream`). Each generation reserves one row of the admission queue (503 when it is full, as for
//! scoring) and runs on the blocking pool, one generation at a time; System One's batching worker is untouched and
//! keeps scoring meanwhile. With `"stream": true` the answer is server-sent events: one `data: {chunk}` per piece of
//! text, a last chunk with `finish_reason` (and `usage` when `stream_options.include_usage` is set), then
//! `data: [DONE]`. A request refused before its first token (bad fields, a prompt longer than the context) gets an
//! HTTP error, streaming or not: `{"error": {"message", "type", "param", "code"}}`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use onepass_decide::generate::{parse_generate, Input};
use onepass_decide::{ApiError, GenerateError, GenerateRequest, Generation};
use serde_json::{json, Value as J};
use tokio::sync::mpsc;

use crate::{busy, read_body, App};

/// Which route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// `{"error": {...}}` with an HTTP status.
fn error(status: u16, kind: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body.to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == 503 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn api_error(e: ApiError) -> Response {
    let msg = e
        .message()
        .map(str::to_string)
        .unwrap_or_else(|| e.http_body().2);
    let kind = if e.status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    error(e.status, kind, &msg)
}

fn gen_error(e: &GenerateError) -> Response {
    match e.kind {
        "model" => error(500, "server_error", &e.message),
        "context_length" => error(400, "invalid_request_error", &e.message),
        _ => error(400, "invalid_request_error", &e.message),
    }
}

pub(crate) async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    completion(app, Kind::Chat, headers, body).await
}

pub(crate) async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    completion(app, Kind::Completion, headers, body).await
}

/// One event of a running generation.
enum Event {
    Delta(String),
    Done(Result<Generation, GenerateError>),
}

/// The request's fields for this route: chat takes `messages`, completions a `prompt` (a string, or a list of one).
fn request(kind: Kind, raw: &[u8]) -> Result<(GenerateRequest, bool), GenerateError> {
    let mut v: J = serde_json::from_slice(raw)
        .map_err(|e| GenerateError::invalid(format!("the body is not JSON: {e}")))?;
    if let Some(n) = v.get("n").and_then(J::as_u64) {
        if n != 1 {
            return Err(GenerateError::invalid(format!(
                "\"n\": {n}: this server returns one choice per request"
            )));
        }
    }
    if kind == Kind::Completion {
        if let Some(J::Array(a)) = v.get("prompt") {
            match a.as_slice() {
                [J::String(s)] => {
                    let s = s.clone();
                    v["prompt"] = J::String(s);
                }
                _ => {
                    return Err(GenerateError::invalid(
                        "\"prompt\" must be a string (or a list of one string)",
                    ))
                }
            }
        }
    }
    let req = parse_generate(&v)?;
    match (kind, &req.input) {
        (Kind::Chat, Input::Prompt(_)) => {
            return Err(GenerateError::invalid(
                "/v1/chat/completions takes \"messages\"; send a raw \"prompt\" to /v1/completions",
            ))
        }
        (Kind::Completion, Input::Messages(_)) => {
            return Err(GenerateError::invalid(
                "/v1/completions takes \"prompt\"; send \"messages\" to /v1/chat/completions",
            ))
        }
        _ => {}
    }
    let usage = v
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(J::as_bool)
        .unwrap_or(false);
    Ok((req, usage))
}

async fn completion(app: Arc<App>, kind: Kind, headers: HeaderMap, body: Body) -> Response {
    let outstanding = app.admission.outstanding();
    if outstanding >= app.admission.max_rows {
        return api_error(busy(&app, outstanding));
    }
    let raw = match read_body(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => return api_error(e),
    };
    let (req, include_usage) = match request(kind, &raw) {
        Ok(r) => r,
        Err(e) => return gen_error(&e),
    };
    let admitted = match app.admission.admit(1) {
        Ok(a) => a,
        Err(outstanding) => return api_error(busy(&app, outstanding)),
    };
    let (tx, mut rx) = mpsc::channel::<Event>(64);
    let worker = app.clone();
    let stream = req.stream;
    let permit = match app.generating.clone().acquire_owned().await {
        Ok(p) => p,
        Err(_) => return error(500, "server_error", "the server is shutting down"),
    };
    tokio::task::spawn_blocking(move || {
        let _hold = (admitted, permit);
        // A client that went away (its receiver dropped) ends the generation at its next piece of text.
        let r = worker.engine.generate(&req, &mut |d| {
            if stream {
                tx.blocking_send(Event::Delta(d.to_string())).is_ok()
            } else {
                !tx.is_closed()
            }
        });
        let _ = tx.blocking_send(Event::Done(r));
    });
    let id = format!(
        "{}-{}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        app.next_id()
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let model = app.opts.model_id.clone();
    let meta = Meta {
        kind,
        id,
        created,
        model,
    };
    if !stream {
        return match rx.recv().await {
            Some(Event::Done(Ok(g))) => {
                let mut r = (StatusCode::OK, meta.whole(&g).to_string()).into_response();
                r.extensions_mut().insert(crate::Work {
                    rows: 1,
                    tokens: (g.n_prompt + g.tokens.len()) as u64,
                    decisions: 0,
                });
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            Some(Event::Done(Err(e))) => gen_error(&e),
            _ => error(500, "server_error", "the generation stopped unexpectedly"),
        };
    }
    // Streaming: an error before the first piece of text is an HTTP error; after it, the stream ends early.
    let first = match rx.recv().await {
        Some(Event::Done(Err(e))) => return gen_error(&e),
        Some(ev) => ev,
        None => return error(500, "server_error", "the generation stopped unexpectedly"),
    };
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let send = |v: J| Bytes::from(format!("data: {v}\n\n"));
        if out_tx.send(send(meta.opening())).await.is_err() {
            return;
        }
        let mut ev = Some(first);
        while let Some(e) = ev.take() {
            match e {
                Event::Delta(d) => {
                    if out_tx.send(send(meta.delta(&d))).await.is_err() {
                        return;
                    }
                }
                Event::Done(Ok(g)) => {
                    let _ = out_tx.send(send(meta.last(&g))).await;
                    if include_usage {
                        let _ = out_tx.send(send(meta.usage_chunk(&g))).await;
                    }
                    break;
                }
                Event::Done(Err(e)) => {
                    let err = json!({"error": {"message": e.message, "type": "server_error", "param": null, "code": null}});
                    let _ = out_tx.send(send(err)).await;
                    break;
                }
            }
            ev = rx.recv().await;
        }
        let _ = out_tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut r = Response::new(Body::from_stream(Chunks(out_rx)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The receiving end of the event channel as a body stream.
struct Chunks(mpsc::Receiver<Bytes>);

impl futures_core::Stream for Chunks {
    type Item = Result<Bytes, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

/// What every object of one answer repeats.
struct Meta {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

fn usage(g: &Generation) -> J {
    json!({"prompt_tokens": g.n_prompt, "completion_tokens": g.tokens.len(),
        "total_tokens": g.n_prompt + g.tokens.len()})
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: J) -> J {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model,
            "choices": choices})
    }

    /// The whole answer (no stream).
    fn whole(&self, g: &Generation) -> J {
        let choice = match self.kind {
            Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": g.text},
                "logprobs": null, "finish_reason": g.finish.as_str()}),
            Kind::Completion => json!({"index": 0, "text": g.text, "logprobs": null,
                "finish_reason": g.finish.as_str()}),
        };
        let mut v = self.wrap(false, json!([choice]));
        v["usage"] = usage(g);
        v
    }

    /// The first chunk: the assistant role (chat), or an empty text (completions).
    fn opening(&self) -> J {
        match self.kind {
            Kind::Chat => self.wrap(
                true,
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
            ),
            Kind::Completion => self.wrap(
                true,
                json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": null}]),
            ),
        }
    }

    fn delta(&self, d: &str) -> J {
        match self.kind {
            Kind::Chat => self.wrap(
                true,
                json!([{"index": 0, "delta": {"content": d}, "logprobs": null, "finish_reason": null}]),
            ),
            Kind::Completion => self.wrap(
                true,
                json!([{"index": 0, "text": d, "logprobs": null, "finish_reason": null}]),
            ),
        }
    }

    fn last(&self, g: &Generation) -> J {
        match self.kind {
            Kind::Chat => self.wrap(
                true,
                json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": g.finish.as_str()}]),
            ),
            Kind::Completion => self.wrap(
                true,
                json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": g.finish.as_str()}]),
            ),
        }
    }

    fn usage_chunk(&self, g: &Generation) -> J {
        let mut v = self.wrap(true, json!([]));
        v["usage"] = usage(g);
        v
    }
}

//! Shared test helpers: the real tokenizer, a synthetic checkpoint, fake engines, and one-shot HTTP calls.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{HeaderMap, Request};
use axum::Router;
use http_body_util::BodyExt;
use onepass_decide::{DecideConfig, Engine, EngineOptions, Plan};
use onepass_server::{DecideEngine, Scores, ServerOptions};
use onepass_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use tower::ServiceExt;

#[path = "../../../decide/tests/common/process_dir.rs"]
mod process_dir;
pub use process_dir::process_dir;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// testdata/qwen3_5-tokenizer, or a panic that says how to make it.
pub fn tokenizer_dir() -> PathBuf {
    let d = root().join("testdata/qwen3_5-tokenizer");
    assert!(
        d.join("tokenizer.json").is_file() && d.join("tokenizer_config.json").is_file(),
        "{} is missing: run tools/setup-testdata.sh to build the Qwen3.5 test tokenizer",
        d.display()
    );
    d
}

pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&tokenizer_dir(), None).expect("tokenizer")
}

/// A `tiny-qwen-vocab` synthetic checkpoint with the real tokenizer, written once per test binary.
pub fn checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = process_dir().join("tiny-qwen-vocab");
        std::fs::create_dir_all(&dir).expect("checkpoint dir");
        let spec = onepass_model::synth::preset("tiny-qwen-vocab").expect("preset");
        onepass_model::synth::write_checkpoint(&spec, &dir, &mut |_, _| {}).expect("synth");
        let tok = tokenizer_dir();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(tok.join(f), dir.join(f)).expect("copy tokenizer");
        }
        dir
    })
}

/// The real engine on the synthetic checkpoint, loaded once per test binary.
pub fn real_engine() -> Arc<Engine> {
    static E: OnceLock<Arc<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        Arc::new(Engine::load(checkpoint(), EngineOptions::default()).expect("engine"))
    })
    .clone()
}

type ScoreFn = dyn Fn(&[&Plan]) -> Result<Scores, String> + Send + Sync;

/// A model-free engine: the real tokenizer and default config, `score` supplied by the test. Records every call's
/// plan count.
pub struct FakeEngine {
    pub tok: Arc<Tokenizer>,
    pub cfg: DecideConfig,
    pub score: Box<ScoreFn>,
    pub calls: Mutex<Vec<usize>>,
    pub plans: Mutex<Vec<Plan>>,
}

impl FakeEngine {
    pub fn new(
        score: impl Fn(&[&Plan]) -> Result<Scores, String> + Send + Sync + 'static,
    ) -> FakeEngine {
        static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
        FakeEngine {
            tok: TOK.get_or_init(|| Arc::new(tokenizer())).clone(),
            cfg: DecideConfig::default(),
            score: Box::new(score),
            calls: Mutex::new(vec![]),
            plans: Mutex::new(vec![]),
        }
    }
}

/// Uniform probabilities over every slot's options.
pub fn uniform(plans: &[&Plan]) -> Scores {
    plans
        .iter()
        .map(|p| {
            p.rows
                .iter()
                .flat_map(|r| r.nopts.iter().map(|&n| vec![1.0 / n as f32; n]))
                .collect()
        })
        .collect()
}

impl DecideEngine for FakeEngine {
    fn model_name(&self) -> &str {
        &self.cfg.model_name
    }
    fn config(&self) -> &DecideConfig {
        &self.cfg
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }
    fn score(&self, plans: &[&Plan]) -> Result<Scores, String> {
        self.calls.lock().unwrap().push(plans.len());
        self.plans
            .lock()
            .unwrap()
            .extend(plans.iter().map(|p| (*p).clone()));
        (self.score)(plans)
    }
}

pub fn quiet(opts: ServerOptions) -> ServerOptions {
    ServerOptions {
        log_requests: false,
        ..opts
    }
}

/// A response: status, headers, body bytes.
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("utf-8 body")
    }

    /// Asserts the status and that the body says `says` (the body is the failure message).
    pub fn assert_says(&self, status: u16, says: &str) {
        let text = self.text();
        assert_eq!(self.status, status, "{text}");
        assert!(text.contains(says), "{text:?} does not say {says:?}");
    }
}

/// One request through the router, no socket.
pub async fn call(
    router: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    call_body(router, method, path, headers, Body::from(body)).await
}

/// [`call`] with any request body (a stream that breaks off or comes slowly, say).
pub async fn call_body(
    router: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Body,
) -> Resp {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = router.clone().oneshot(b.body(body).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Resp {
        status,
        headers,
        body,
    }
}

/// A GET with `headers`.
pub async fn get(router: &Router, path: &str, headers: &[(&str, &str)]) -> Resp {
    call(router, "GET", path, headers, vec![]).await
}

pub async fn post_json(router: &Router, path: &str, body: &str) -> Resp {
    call(
        router,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.as_bytes().to_vec(),
    )
    .await
}

/// A POST whose body is compressed with `encoding` (its `content-encoding`).
pub async fn post_encoded(router: &Router, path: &str, encoding: &str, body: Vec<u8>) -> Resp {
    call(
        router,
        "POST",
        path,
        &[("content-encoding", encoding)],
        body,
    )
    .await
}

//! `onepass systemone` and `onepass render`: one `/v1/systemone` request from a file (or stdin), answered as the
//! server would (the response body on stdout; the same limits, so the same 413s and state cut), or only planned (ids,
//! slots, nopts, usage) without the model.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use onepass_decide::engine::Backend;
use onepass_decide::pyjson::{dumps_compact, py_str, Value};
use onepass_decide::{parse_request, ApiError, Engine, EngineOptions, Pipeline, Route};

use crate::device::{load_engine, plan_body, CudaArgs, DeviceArg};
use crate::limits::LimitArgs;
use serde_json::json;

#[derive(Args)]
pub struct SystemoneArgs {
    /// A model folder (config.json, *.safetensors weights, tokenizer.json, optional decider_config.json), a .gguf file, or a Hub repo
    /// id ORG/NAME[@REVISION] already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// The request body (JSON); `-` reads stdin.
    request: PathBuf,
    /// Run every question's prompt in full instead of running the part they share (the state) once; slower, for
    /// checking.
    #[arg(long)]
    no_shared_prefix: bool,
    /// Memory for the copies of the shared part's model state alive at once, in MiB.
    #[arg(long, default_value_t = 2048)]
    fork_budget_mb: usize,
    #[command(flatten)]
    limits: LimitArgs,
    /// Benchmarking: answer the request this many times after one load and write timings as JSON to stderr.
    #[arg(long, default_value_t = 1, hide = true)]
    repeat: usize,
    #[command(flatten)]
    dev: DeviceArg,
    #[command(flatten)]
    cuda: CudaArgs,
}

#[derive(Args)]
pub struct RenderArgs {
    /// A model folder, a .gguf file, or a Hub repo id ORG/NAME[@REVISION] already in the Hugging Face cache; only its tokenizer
    /// files and decider_config.json are read.
    #[arg(long)]
    model: String,
    /// The request body (JSON); `-` reads stdin.
    request: PathBuf,
    #[command(flatten)]
    limits: LimitArgs,
}

fn read_body(path: &Path) -> Result<Vec<u8>> {
    if path == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .context("reading stdin")?;
        Ok(b)
    } else {
        std::fs::read(path)
            .with_context(|| format!("cannot read the request file {}", path.display()))
    }
}

/// The request file's name as a user typed it (`stdin` for `-`).
fn request_name(path: &Path) -> String {
    if path == Path::new("-") {
        "stdin".to_string()
    } else {
        path.display().to_string()
    }
}

/// Refuses, in plain words naming the file, a body the server would turn away before reading any question: not
/// JSON, or not an object with `state` and `questions`. (The server's 422 for it is pydantic's list of errors.)
fn check_body(path: &Path, body: &[u8]) -> Result<()> {
    match parse_request(body) {
        Ok(_) => Ok(()),
        Err(e) => bail!("{}", unreadable_request(&request_name(path), body, &e)),
    }
}

/// `name`'s body could not be parsed as a request (`e`, the server's answer) → one sentence with what to do.
fn unreadable_request(name: &str, body: &[u8], e: &ApiError) -> String {
    const FORM: &str =
        "a request is one JSON object {\"state\": ..., \"questions\": {...}} (see docs/api.md)";
    let detail = e.body.as_object().and_then(|o| o.get("detail"));
    let items = match detail {
        Some(Value::Array(items)) => items,
        Some(Value::Str(msg)) => return format!("{name} cannot be read as JSON ({msg}); {FORM}"),
        _ => return format!("{name}: {e}"),
    };
    let mut not_json = None;
    let mut fields = Vec::new();
    for it in items {
        let Some(it) = it.as_object() else { continue };
        let get = |k: &str| it.get(k).and_then(Value::as_str).unwrap_or("");
        let loc: Vec<String> = match it.get("loc") {
            Some(Value::Array(l)) => l.iter().map(py_str).collect(),
            _ => Vec::new(),
        };
        if get("type") == "json_invalid" {
            let why = it
                .get("ctx")
                .and_then(|c| c.as_object())
                .and_then(|c| c.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("JSON decode error");
            // loc = ["body", <character offset>]
            let at = loc
                .get(1)
                .and_then(|o| o.parse::<usize>().ok())
                .unwrap_or(0);
            let (line, col) = line_col(body, at);
            not_json = Some(format!(
                "{name} is not JSON: {why} at line {line} column {col}"
            ));
        } else {
            let field = loc
                .iter()
                .skip_while(|l| *l == "body")
                .cloned()
                .collect::<Vec<_>>()
                .join(".");
            let field = if field.is_empty() {
                "the body".to_string()
            } else {
                format!("`{field}`")
            };
            let msg = match get("type") {
                "model_type" | "dict_type" => "must be a JSON object",
                _ => get("msg"),
            };
            fields.push(format!("{field}: {msg}"));
        }
    }
    match not_json {
        Some(s) => format!("{s}; {FORM}"),
        None => format!(
            "{name} is not a System One request ({}); {FORM}",
            fields.join("; ")
        ),
    }
}

/// 1-based line and column of character `at` of `body` (read as UTF-8, lossily).
fn line_col(body: &[u8], at: usize) -> (usize, usize) {
    let text = String::from_utf8_lossy(body);
    let before: String = text.chars().take(at).collect();
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Print an answer body on stdout; an error answer (`HTTP <status>: <body>`) goes to stderr and fails the command.
fn answer(r: Result<onepass_decide::pyjson::Value, ApiError>) -> Result<()> {
    let s = dumps_compact(&r?).context("response holds a non-finite number")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}")?;
    out.flush()?;
    Ok(())
}

pub fn systemone(a: SystemoneArgs) -> Result<()> {
    let dir = onepass_formats::resolve_model(&a.model)?;
    let body = read_body(&a.request)?;
    // Before the model loads: a file that is not a request at all is said so at once.
    check_body(&a.request, &body)?;
    // The same environment and limits as `onepass serve` (decider-contract R6.3, §1.10), so the body printed is the
    // one it would send.
    let limits = a.limits.resolve()?;
    let opts = EngineOptions {
        shared_prefix: !a.no_shared_prefix,
        fork_budget_bytes: a.fork_budget_mb << 20,
        limits: limits.limits,
        max_state_tokens: Some(limits.max_state_tokens),
        layout: crate::flag_or_env(None, "DECIDER_LAYOUT"),
        temperature: crate::flag_or_env(None, "DECIDER_TEMPERATURE"),
        ..EngineOptions::default()
    };
    let t0 = Instant::now();
    let e = load_engine(&dir, opts, a.dev.resolve()?, &a.cuda)?;
    let load_s = t0.elapsed().as_secs_f64();
    run(&e, &a, &body, load_s)
}

fn run<B: Backend>(engine: &Engine<B>, a: &SystemoneArgs, body: &[u8], load_s: f64) -> Result<()> {
    if a.repeat <= 1 {
        return answer(engine.system_one(body));
    }
    let mut secs = Vec::with_capacity(a.repeat);
    let mut last = None;
    for _ in 0..a.repeat {
        let t = Instant::now();
        let r = engine.system_one(body);
        secs.push(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    let (rows, tokens) = plan_body(engine, body)
        .map(|p| {
            (
                p.rows.len(),
                p.rows.iter().map(|r| r.ids.len()).sum::<usize>(),
            )
        })
        .unwrap_or((0, 0));
    eprintln!(
        "{}",
        json!({
            "engine": "onepass",
            "device": engine.device(),
            "shared_prefix": engine.options().shared_prefix,
            "load_s": load_s,
            "rows": rows,
            "row_tokens": tokens,
            "seconds": secs,
        })
    );
    answer(last.unwrap_or_else(|| Err(ApiError::detail(500, "no run"))))
}

pub fn render(a: RenderArgs) -> Result<()> {
    let dir = onepass_formats::resolve_model(&a.model)?;
    let body = read_body(&a.request)?;
    check_body(&a.request, &body)?;
    // The engine's tokenizer and config, without the weights; the chat layout honours DECIDER_LAYOUT (R6.3).
    let layout = crate::flag_or_env(None, "DECIDER_LAYOUT");
    let temperature = crate::flag_or_env(None, "DECIDER_TEMPERATURE");
    // The server's limits: its state cap and its 413s, so the rows printed are the ones it would run.
    let limits = a.limits.resolve()?;
    let (tok, mut cfg) = onepass_decide::engine::load_planner(
        &dir,
        crate::model_type_in(&dir).as_deref(),
        layout.as_deref(),
        temperature.as_deref(),
    )?;
    cfg.max_state_tokens = limits.max_state_tokens;
    let pipeline = Pipeline {
        tokenizer: &tok,
        config: &cfg,
        limits: &limits.limits,
        max_positions: usize::MAX, // no model: its positions are not known here
    };
    answer(
        pipeline
            .prepare(Route::SystemOne, &body)
            .map(|p| p.plan.to_value()),
    )
}

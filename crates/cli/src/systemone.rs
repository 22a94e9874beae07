//! `onepass systemone` and `onepass render`: one `/v1/systemone` request from a file (or stdin), answered as the
//! server would (the response body on stdout; the same limits, so the same 413s and state cut), or only planned (ids,
//! slots, nopts, usage) without the model.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use onepass_decide::engine::Backend;
use onepass_decide::pyjson::dumps_compact;
use onepass_decide::{ApiError, Engine, EngineOptions, Pipeline, Route};

use crate::device::{plan_body, AnyEngine, CudaArgs, DeviceArg};
use crate::limits::LimitArgs;
use serde_json::json;

#[derive(Args)]
pub struct SystemoneArgs {
    /// A model folder (config.json, weights, tokenizer.json, optional decider_config.json), or a cached Hub repo id.
    #[arg(long)]
    model: String,
    /// The request body (JSON); `-` reads stdin.
    request: PathBuf,
    /// Run every row whole instead of running each request's common prefix once and forking it.
    #[arg(long)]
    no_shared_prefix: bool,
    /// Bytes of forked sequence state alive at once, in MiB.
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
    /// A model folder (only the tokenizer and decider_config.json are read).
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
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
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
    let dir = onepass_formats::resolve_model_dir(&a.model)?;
    let body = read_body(&a.request)?;
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
    let any = AnyEngine::load(&dir, opts, a.dev.resolve()?, &a.cuda)?;
    let load_s = t0.elapsed().as_secs_f64();
    crate::with_engine!(&any, e => run(e, &a, &body, load_s))
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
    let dir = onepass_formats::resolve_model_dir(&a.model)?;
    let body = read_body(&a.request)?;
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

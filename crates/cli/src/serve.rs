//! `onepass serve`: decider-ai's HTTP API (`/v1/systemone`, `/decide`, `/v1/models`, `/health`) plus `/metrics`,
//! served by `onepass-server` over one loaded engine. See docs/server.md.

use anyhow::{bail, Context, Result};
use clap::Args;
use onepass_decide::EngineOptions;

use crate::device::{AnyEngine, CudaArgs, DeviceArg};
use crate::limits::{setting, LimitArgs, RequestLimits};
use onepass_server::ServerOptions;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A model folder, or a Hub repo id (ORG/NAME[@REV]) already in the Hugging Face cache.
    #[arg(long)]
    model: String,
    /// Address to bind (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to bind (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[command(flatten)]
    limits: LimitArgs,
    /// Rows admitted and not yet answered, over all requests; 503 past it [env DECIDER_MAX_QUEUE_ROWS, default 4096].
    #[arg(long)]
    max_queue_rows: Option<usize>,
    /// Most rows per engine call; a larger request still runs, alone.
    #[arg(long, default_value_t = 64)]
    max_batch_rows: usize,
    /// Largest request body in bytes, before and after decompression.
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
    /// Require `Authorization: Bearer <key>` on every route but /health [env ONEPASS_API_KEY].
    #[arg(long)]
    api_key: Option<String>,
    /// No per-request log lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Prompt layout, `plain` or `chat`, replacing decider_config.json's [env DECIDER_LAYOUT; default: the config's].
    #[arg(long)]
    layout: Option<String>,
    /// One temperature for every slot, replacing decider_config.json's temperature and its by-type / by-options maps
    /// [env DECIDER_TEMPERATURE; default: the config's].
    #[arg(long)]
    temperature: Option<String>,
    #[command(flatten)]
    dev: DeviceArg,
    #[command(flatten)]
    cuda: CudaArgs,
}

pub fn serve(a: ServeArgs) -> Result<()> {
    let RequestLimits {
        limits,
        max_state_tokens,
    } = a.limits.resolve()?;
    let max_queue_rows = setting(a.max_queue_rows, "DECIDER_MAX_QUEUE_ROWS", 4096)?;
    let api_key = crate::flag_or_env(a.api_key, "ONEPASS_API_KEY")
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty());
    if a.max_batch_rows == 0 {
        bail!("--max-batch-rows must be at least 1");
    }
    let dir = onepass_formats::resolve_model_dir(&a.model)?;
    let t0 = Instant::now();
    let engine = AnyEngine::load(
        &dir,
        EngineOptions {
            limits,
            max_state_tokens: Some(max_state_tokens),
            layout: crate::flag_or_env(a.layout.clone(), "DECIDER_LAYOUT"),
            temperature: crate::flag_or_env(a.temperature.clone(), "DECIDER_TEMPERATURE"),
            ..EngineOptions::default()
        },
        a.dev.resolve()?,
        &a.cuda,
    )?;
    let device = engine.device();
    let engine = engine.into_dyn();
    eprintln!(
        "onepass serve: loaded {} ({}) on {device} in {:.2}s",
        dir.display(),
        engine.model_name(),
        t0.elapsed().as_secs_f64()
    );
    let opts = ServerOptions {
        limits,
        max_queue_rows,
        max_batch_rows: a.max_batch_rows,
        api_key,
        max_body_bytes: a.max_body_bytes,
        model_id: a.model.clone(),
        device,
        log_requests: !a.quiet,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let (app, state) = onepass_server::router(engine, opts)?;
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!("onepass serve: listening on http://{addr}");
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving")?;
        state.shutdown();
        eprintln!("onepass serve: stopped");
        Ok(())
    })
}

/// SIGINT or SIGTERM: stop accepting, let in-flight requests finish.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("onepass serve: shutting down, draining in-flight requests");
}

//! `onepass serve`: decider-ai's HTTP API (`/v1/systemone`, `/decide`, `/v1/models`, `/health`) plus `/v1/decide`, `/metrics`,
//! served by `onepass-server` over one loaded engine. See docs/server.md.

use anyhow::{bail, Context, Result};
use clap::Args;
use onepass_decide::EngineOptions;

use crate::device::{load_engine, CudaArgs, DeviceArg};
use crate::limits::{setting, LimitArgs, RequestLimits};
use onepass_server::{ServerOptions, Timeouts};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A model folder, a .gguf file, or a Hub repo id (ORG/NAME[@REV]) already in the Hugging Face cache.
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
    /// Seconds a client has to send a request head, counted from the connection's accept or from the previous
    /// response, so also how long a kept-alive connection may sit idle.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client has to send a whole request body (408 past it).
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Seconds shutdown (SIGINT, SIGTERM) waits for in-flight requests before dropping their connections; a second
    /// signal stops at once.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Require `Authorization: Bearer <key>` on every route but /health [env ONEPASS_API_KEY]. Visible to other
    /// users in the process list: prefer the variable or --api-key-file.
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from this file (its first line, surrounding whitespace removed).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
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
    /// MiB of prefix states kept for POST /v1/decide and the contexts of /v1/systemone and /decide, least recently
    /// used out first (0: none kept).
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: usize,
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
    let api_key = api_key(
        a.api_key.clone(),
        std::env::var("ONEPASS_API_KEY").ok(),
        a.api_key_file.as_deref(),
    )?;
    if a.max_batch_rows == 0 {
        bail!("--max-batch-rows must be at least 1");
    }
    let header_timeout = seconds(a.header_timeout, "--header-timeout")?;
    let body_timeout = seconds(a.body_timeout, "--body-timeout")?;
    let shutdown_timeout = seconds(a.shutdown_timeout, "--shutdown-timeout")?;
    if max_queue_rows < limits.max_rows {
        eprintln!(
            "onepass serve: warning: --max-queue-rows ({max_queue_rows}) is below --max-rows ({}): a request of more \
             than {max_queue_rows} rows passes the row limit but can never be queued (it gets 413)",
            limits.max_rows
        );
    }
    if api_key.is_none() && !is_loopback(&a.host) {
        eprintln!(
            "onepass serve: warning: listening on {} without an API key: anyone who can reach this address can use \
             the model; set ONEPASS_API_KEY or --api-key-file",
            a.host
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Bind first, so a taken port or a bad address is reported before the model loads.
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((a.host.as_str(), a.port)))
        .with_context(|| format!("binding {}:{}", a.host, a.port))?;
    let addr = listener.local_addr()?;
    let dir = onepass_formats::resolve_model(&a.model)?;
    let t0 = Instant::now();
    let engine = load_engine(
        &dir,
        EngineOptions {
            limits,
            max_state_tokens: Some(max_state_tokens),
            layout: crate::flag_or_env(a.layout.clone(), "DECIDER_LAYOUT"),
            temperature: crate::flag_or_env(a.temperature.clone(), "DECIDER_TEMPERATURE"),
            prefix_cache_bytes: a.prefix_cache_mb.saturating_mul(1 << 20),
            ..EngineOptions::default()
        },
        a.dev.resolve()?,
        &a.cuda,
    )?;
    let device = engine.device();
    let engine: std::sync::Arc<dyn onepass_server::DecideEngine> = std::sync::Arc::new(engine);
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
        model_id: model_id(&a.model),
        device,
        log_requests: !a.quiet,
        body_timeout,
        ..ServerOptions::default()
    };
    let timeouts = Timeouts {
        header: header_timeout,
        shutdown: shutdown_timeout,
    };
    rt.block_on(async move {
        let (app, state) = onepass_server::router(engine, opts)?;
        eprintln!("onepass serve: listening on http://{addr}");
        let stopped = onepass_server::serve(listener, app, timeouts, shutdown_signal()).await;
        if stopped.dropped > 0 {
            eprintln!(
                "onepass serve: dropped {} connection(s) still open after --shutdown-timeout ({} s)",
                stopped.dropped,
                timeouts.shutdown.as_secs_f64()
            );
        }
        // The batching worker answers what is queued; a request whose connection was dropped is still scored (its
        // answer goes nowhere), which the shutdown timeout does not cut short.
        state.shutdown();
        eprintln!("onepass serve: stopped");
        Ok(())
    })
}

/// The API key: `--api-key`, else `--api-key-file`, else `ONEPASS_API_KEY`. A key that is empty or only whitespace
/// is an error wherever it comes from, so an unset shell variable cannot turn auth off silently.
fn api_key(
    flag: Option<String>,
    env: Option<String>,
    file: Option<&Path>,
) -> Result<Option<String>> {
    let (key, from) = if let Some(k) = flag {
        (k, "--api-key".to_string())
    } else if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the API key from {}", path.display()))?;
        let first = text.lines().next().unwrap_or_default().to_string();
        (first, format!("the first line of {}", path.display()))
    } else if let Some(k) = env {
        (k, "ONEPASS_API_KEY".to_string())
    } else {
        return Ok(None);
    };
    let key = key.trim();
    if key.is_empty() {
        bail!(
            "the API key from {from} is empty: give a non-empty key, or leave it unset to serve without auth"
        );
    }
    Ok(Some(key.to_string()))
}

/// A positive number of seconds.
fn seconds(v: f64, flag: &str) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{flag} must be a positive number of seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// `127.0.0.1`, `::1`, `localhost`: reachable from this machine only.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// What `/health` reports as `"model"`: a Hub repo id as given, a folder by its name only (no filesystem path
/// leaks to clients).
fn model_id(arg: &str) -> String {
    let p = Path::new(arg);
    if p.exists() {
        let canonical = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if let Some(name) = canonical.file_name() {
            return name.to_string_lossy().into_owned();
        }
    }
    arg.to_string()
}

/// SIGINT or SIGTERM: stop accepting, let in-flight requests finish (within --shutdown-timeout). A second signal
/// exits at once. The signal streams exist from the start, so a second signal sent right after the first is not lost.
async fn shutdown_signal() {
    let mut signals = Signals::new();
    signals.next().await;
    eprintln!(
        "onepass serve: shutting down, draining in-flight requests (a second signal stops at once)"
    );
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("onepass serve: second signal, exiting now");
        std::process::exit(130);
    });
}

/// SIGINT and SIGTERM, listened to for the whole run.
struct Signals {
    #[cfg(unix)]
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                streams: signal(SignalKind::interrupt())
                    .and_then(|i| Ok((i, signal(SignalKind::terminate())?)))
                    .ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        match &mut self.streams {
            Some((int, term)) => {
                tokio::select! {
                    _ = int.recv() => {},
                    _ = term.recv() => {},
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_key_is_an_error_wherever_it_comes_from() {
        for blank in ["", "   ", "\t\n"] {
            assert!(
                api_key(Some(blank.into()), None, None).is_err(),
                "{blank:?}"
            );
            assert!(
                api_key(None, Some(blank.into()), None).is_err(),
                "{blank:?}"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").expect("write");
        assert!(api_key(None, None, Some(&empty)).is_err());
        let good = dir.path().join("key");
        std::fs::write(&good, "  s3cret \nignored\n").expect("write");
        assert_eq!(
            api_key(None, Some("env".into()), Some(&good)).expect("file"),
            Some("s3cret".into())
        );
        assert_eq!(
            api_key(Some("flag".into()), Some("env".into()), None).expect("flag"),
            Some("flag".into())
        );
        assert_eq!(
            api_key(None, Some(" env ".into()), None).expect("env"),
            Some("env".into())
        );
        assert_eq!(api_key(None, None, None).expect("none"), None);
        assert!(api_key(None, None, Some(&dir.path().join("missing"))).is_err());
    }

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "10.0.0.1", "example.com"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}

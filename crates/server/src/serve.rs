//! The app on a TCP listener: HTTP/1.1 connections with a time limit on every request head, and a shutdown that ends
//! within a bounded time whatever the clients do.
//!
//! Each accepted connection is served by hyper with its header read timeout set: a head (request line and headers)
//! must arrive in full within [`Timeouts::header`], counted from when the server starts waiting for it — from the
//! accept on a new connection, from the previous response on a kept-alive one — so a drip-fed head and an idle
//! keep-alive connection are both closed after it. (The body's own limit is `ServerOptions::body_timeout`, applied
//! by the routes.) On shutdown the listener closes at once, every connection is told to finish its current request and
//! close, and after [`Timeouts::shutdown`] the ones still open are dropped.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Connection-level time limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Time to send a request head in full, counted from the accept or from the previous response (so also the
    /// longest a kept-alive connection may sit idle).
    pub header: Duration,
    /// Longest wait, once shutdown starts, for in-flight requests to finish; connections still open then are dropped.
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            shutdown: Duration::from_secs(30),
        }
    }
}

/// How a [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Connections still open when [`Timeouts::shutdown`] ran out, dropped mid-request.
    pub dropped: usize,
}

/// Serve `app` on `listener` until `shutdown` completes, then drain (see the module docs).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) -> Stopped {
    let (close_tx, close_rx) = tokio::sync::watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: say so, breathe, keep serving.
                        eprintln!("onepass-server: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let svc = TowerToHyperService::new(app.clone());
                let mut closing = close_rx.clone();
                let header = timeouts.header;
                conns.spawn(async move {
                    let mut b = hyper::server::conn::http1::Builder::new();
                    b.timer(TokioTimer::new()).header_read_timeout(header);
                    let conn = b.serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = async { let _ = closing.wait_for(|c| *c).await; } => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = close_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    match tokio::time::timeout(timeouts.shutdown, drain).await {
        Ok(()) => Stopped { dropped: 0 },
        Err(_) => {
            let dropped = conns.len();
            conns.abort_all();
            Stopped { dropped }
        }
    }
}

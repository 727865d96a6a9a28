//! Serving a router on a TCP listener so that slow or idle clients cannot starve it: a request
//! head must arrive within [`ListenerLimits::header_read_timeout`] (which also closes a
//! keep-alive connection idle that long, as the wait for its next head), and beyond
//! [`ListenerLimits::max_connections`] open connections a new one is answered `503` and
//! closed. Every request carries the peer's address (`ConnectInfo<SocketAddr>`), which the
//! console throttles sign-ins by. The console, a worker's endpoints and its push routes are all
//! served by [`serve`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower_service::Service;

/// What one listener allows its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// How long a client has to send a request's head, and how long a keep-alive connection
    /// may wait idle for its next one.
    pub header_read_timeout: Duration,
    /// Open connections at most; the next is answered `503` and closed.
    pub max_connections: usize,
}

impl Default for ListenerLimits {
    /// Ten seconds for a head; 256 connections, far more than operators' browsers, probes
    /// and a vendor's callbacks need, far fewer than a process's descriptors.
    fn default() -> Self {
        ListenerLimits {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// The answer to a connection beyond the limit.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
    content-length: 24\r\nconnection: close\r\nretry-after: 1\r\n\r\ntoo many open connections";

/// Serves `app` on `listener` within `limits` until `shutdown` resolves, then lets the open
/// connections finish their requests (each closes after its current one) and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = limits.max_connections, "too many open connections: refused one");
            tokio::spawn(async move {
                let mut stream = stream;
                let refuse = async {
                    stream.write_all(BUSY).await?;
                    stream.shutdown().await
                };
                let _ = tokio::time::timeout(Duration::from_secs(1), refuse).await;
            });
            continue;
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let mut app = app.clone();
            async move { app.call(request.map(axum::body::Body::new)).await }
        });
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = async { drop(stopping.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    let _ = stop.send(true);
    // Every connection holds a slot until it ends.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

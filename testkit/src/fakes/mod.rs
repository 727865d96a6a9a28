//! Local fakes of the HTTP vendors the adapters talk to.
//!
//! Each fake is a small axum server bound to `127.0.0.1` on an ephemeral port, started by an
//! async `start` and stopped when dropped. It reproduces the vendor's wire format (paths,
//! authentication, status codes, error bodies) closely enough for an adapter's tests to run
//! against it instead of the real service, records what it accepted for assertions, and has
//! fault hooks (`fail_next`) to make the next requests answer an error status.
//!
//! The fakes know nothing of the adapters: they speak HTTP and JSON, and depend on no adapter.
//!
//! - [`betterstack`]: BetterStack Uptime's create-incident endpoint.
//! - [`resend`]: Resend's batch email endpoint.
//! - [`vercel_queues`]: the Vercel Queues v3 API (send, batch, receive, leases, push
//!   callbacks), with fault hooks for what Vercel's own emulator cannot do.
//! - [`qstash`]: Upstash QStash: publishing, signed push deliveries with retries, queues,
//!   schedules and the DLQ.

pub mod betterstack;
pub mod qstash;
pub mod resend;
pub mod vercel_queues;

pub use betterstack::FakeBetterStack;
pub use vercel_queues::FakeVercelQueues;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The HTTP server under every fake: bound to `127.0.0.1`, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Server {
    base_url: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `app` on `127.0.0.1:port` (`0` for any free port, so parallel tests never
    /// collide); fails only if the address cannot be bound.
    pub(crate) async fn start(port: u16, app: Router) -> std::io::Result<Server> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Serving ends when the fake is dropped; an accept error then has no one to tell.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Server {
            base_url: format!("http://{address}"),
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Stops the server and waits until it has closed its connections.
    pub(crate) async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Server {
    /// Signals the server to stop; the task ends on its own, or with the test's runtime.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A credential unique to this moment, for a fake started without one.
pub(crate) fn fresh_secret(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    format!("{prefix}{nanos:x}")
}

/// `body` as a JSON answer with `status`.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The error body Vercel Queues and QStash both answer: `{"error": "…"}`.
pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({ "error": message }))
}

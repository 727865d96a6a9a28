//! Vercel Queues push consumption as an axum route: Vercel calls `POST /api/queue` once per
//! message, the route feeds the worker runtime, and answers as Vercel expects.
//!
//! ```text
//! VERCEL_REGION=iad1 VERCEL_OIDC_TOKEN=… cargo run -p jobs-ops --features sqlite,vercel-queues --example vercel_push
//! ```
//!
//! `VERCEL_QUEUES_URL` points the adapter at an emulator instead (e.g. the one
//! `python -m vercel.queue.devserver` starts). The store is SQLite in `./.jobs/push.db`.

use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use jobs_adapter_sqlite::{SqliteStore, SqliteWorkTx};
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
use jobs_core::{ConsumerName, QueueName};

/// The business work: here, a log line.
struct Greet;

#[async_trait]
impl Handler<SqliteWorkTx> for Greet {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: Job<serde_json::Value>,
        _tx: &mut SqliteWorkTx,
    ) -> Result<(), JobError> {
        tracing::info!(data = %job.envelope.data, "hello from a pushed job");
        Ok(())
    }
}

#[derive(Clone)]
struct App {
    vercel: VercelQueues,
    worker: Arc<Worker<SqliteStore>>,
}

/// The route: parse the callback, run the delivery through the runtime, answer Vercel.
async fn queue_callback(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let reply = app
        .vercel
        .handle_push(&headers, body.to_vec(), |delivery| async {
            // Settled means acked, retried, deferred or dead-lettered through the lease API;
            // only an unsettled delivery makes Vercel call again.
            !matches!(
                app.worker.process(delivery).await,
                Outcome::Unsettled { .. }
            )
        })
        .await;
    let status = StatusCode::from_u16(reply.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, reply.body())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().init();
    let region = Region::new(&std::env::var("VERCEL_REGION").unwrap_or_else(|_| "iad1".into()))?;
    let token = std::env::var("VERCEL_OIDC_TOKEN").context("VERCEL_OIDC_TOKEN is not set")?;
    let mut config = VercelQueuesConfig::new(region, StaticToken::new(token));
    if let Ok(url) = std::env::var("VERCEL_QUEUES_URL") {
        config = config.base_url_override(&url)?;
    }
    let vercel = VercelQueues::new(config)?;

    std::fs::create_dir_all(".jobs")?;
    let store = SqliteStore::open(".jobs/push.db").await?;
    store.migrate().await?;
    let queue: QueueName = "hello.greetings".parse()?;
    let worker = Worker::builder(
        ConsumerName::try_from("hello.greeter")?,
        queue,
        Arc::new(vercel.clone()),
        Arc::new(store.clone()),
        Arc::new(store),
    )
    .handler("hello.greet".parse()?, Greet)
    .build()?;

    let app = Router::new()
        .route("/api/queue", post(queue_callback))
        .with_state(App {
            vercel,
            worker: Arc::new(worker),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    tracing::info!("Vercel Queues callbacks on http://127.0.0.1:3000/api/queue");
    axum::serve(listener, app).await?;
    Ok(())
}

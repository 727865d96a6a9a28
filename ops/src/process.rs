//! The worker process: what a module binary runs to consume its queues in production.
//!
//! [`WorkerProcess`] takes its configuration the way `jobsctl` does ([`Config`]: flags the
//! binary passes, then the environment, then `jobs.toml`, then defaults), opens the store
//! its handlers are typed for ([`ProcessStore`]) with one connection pool sized for every
//! queue's worker, runs them, and serves `/healthz`, `/readyz` and `/metrics` on
//! [`HTTP_ADDR`], with the operations console beside them when [`CONSOLE_TOKENS`] is set
//! ([`crate::console`]). SIGTERM or SIGINT stops it: `/readyz` answers 503 at once, fetching stops,
//! in-flight jobs finish within [`SHUTDOWN_GRACE`], what was fetched and not started is given
//! back, and [`WorkerProcess::run`] returns `Ok`. A second signal exits at once.
//!
//! ```no_run
//! use async_trait::async_trait;
//! use jobs_adapter_postgres::{PgStore, PgWorkTx};
//! use jobs_consumers::{Handler, Job, JobError};
//! use jobs_ops::process::WorkerProcess;
//!
//! struct Noop;
//!
//! #[async_trait]
//! impl Handler<PgWorkTx> for Noop {
//!     type Data = serde_json::Value;
//!     async fn handle(&self, _: Job<serde_json::Value>, _: &mut PgWorkTx) -> Result<(), JobError> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), jobs_ops::process::ProcessError> {
//! WorkerProcess::<PgStore>::from_env()
//!     .queue("billing.invoices", "billing.booker", |worker| {
//!         worker.handler("billing.invoice_issued".parse().expect("a kind"), Noop)
//!     })
//!     .run()
//!     .await
//! # }
//! ```
//!
//! ## Endpoints
//!
//! | path | 200 when | otherwise |
//! |---|---|---|
//! | `/healthz` | every worker's loop turns ([`Worker::stuck`]) and none has ended | 503, naming the stuck queues |
//! | `/readyz` | the store and the queue answered the last check (every 5 s, in the background) and no stop was asked | 503, with the reason |
//! | `/metrics` | always: the runtime's metrics in the Prometheus text format | |
//!
//! A push transport's deliveries arrive on the same server: QStash's on `POST` at its
//! destination's path (`QSTASH_DESTINATION`, `{queue}` replaced), verified by signature
//! before anything is read; Vercel Queues' callbacks on `POST /vercel/queues` when
//! `VERCEL_QUEUES_PUSH=on` (else its workers pull), each pushed payload run only once its
//! receipt handle is confirmed as a lease of ours. A delivery for a queue the process does
//! not serve is refused.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures_util::future::BoxFuture;
#[cfg(feature = "postgres")]
use jobs_adapter_postgres::{PgQueue, PgStore};
#[cfg(feature = "sqlite")]
use jobs_adapter_sqlite::SqliteStore;
use jobs_consumers::{CoalescingAlerter, Drained, Worker, WorkerBuilder, WorkerError};
use jobs_core::{
    BulkRuns, ConsumerName, DeadLetterStore, NameError, QueueDepth, QueueName, QueuePort,
    SystemClock, TenantDirectory, TenantFairness, WorkStore,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::compose::{
    self, CONCURRENCY, CONSOLE_TOKENS, CRON, ComposeError, Config, DATABASE_URL, FAIR, HTTP_ADDR,
    Key, LOG_FORMAT, OUTBOX_RELAY, QUEUE_URL, Queue, SHUTDOWN_GRACE,
};
use crate::console::{Console, ConsoleToken};

/// How often the background check behind `/readyz` asks the store and the queue.
pub const READINESS_EVERY: Duration = Duration::from_secs(5);

/// How long one readiness check may take before it counts as a failure.
const READINESS_TIMEOUT: Duration = Duration::from_secs(3);

/// How long coalesced dead-letter alerts are held before they go out.
const ALERT_WINDOW: Duration = Duration::from_secs(60);

/// Why a worker process could not start, or did not stop cleanly.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The configuration is incomplete, malformed or names what this build cannot compose.
    #[error(transparent)]
    Config(#[from] ComposeError),
    /// A queue or consumer name given to [`WorkerProcess::queue`] is not a valid name.
    #[error("`{value}` is not a valid {what} name: {source}")]
    Name {
        /// `queue` or `consumer`.
        what: &'static str,
        /// The name given.
        value: String,
        /// Why it is refused.
        #[source]
        source: NameError,
    },
    /// [`WorkerProcess::queue`] was never called.
    #[error("a worker process needs at least one queue (WorkerProcess::queue)")]
    NoQueues,
    /// A queue's worker cannot be built.
    #[error("the worker of `{queue}`: {source}")]
    Worker {
        /// The queue.
        queue: QueueName,
        /// Why.
        #[source]
        source: WorkerError,
    },
    /// The HTTP address cannot be listened on.
    #[error("listening on {addr} ({key}): {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// How it is set.
        key: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<crate::config::ConfigError> for ProcessError {
    fn from(e: crate::config::ConfigError) -> Self {
        ProcessError::Config(e.into())
    }
}

/// A store a worker process can run handlers on: it opens itself and the transport its
/// workers consume from the configuration. Implemented for `PgStore` (feature `postgres`)
/// and `SqliteStore` (feature `sqlite`).
#[async_trait]
pub trait ProcessStore: WorkStore + DeadLetterStore + BulkRuns + Clone
where
    Self::Tx: Send,
{
    /// The engine, for messages (`PostgreSQL`).
    const ENGINE: &'static str;

    /// The [`DATABASE_URL`] schemes that name this store.
    const SCHEMES: &'static [&'static str];

    /// Opens the store named by [`DATABASE_URL`] (refusing one of another engine, naming the
    /// key) with a pool of `connections`, and the transport its workers consume.
    async fn open(config: &Config, connections: u32) -> Result<Opened<Self>, ProcessError>;
}

/// What [`ProcessStore::open`] opened.
pub struct Opened<S: WorkStore> {
    store: S,
    /// Where the cron scheduler reads tenants, when the store keeps them.
    tenants: Option<Arc<dyn TenantDirectory>>,
    /// The outbox relay to the process's queue, when the store keeps an outbox.
    relay: Option<Standing>,
    /// The routes of a push transport.
    push: Option<PushRoutes<S>>,
    /// What the workers consume, for the start line.
    transport: String,
    publisher: Arc<dyn QueuePort>,
    depth: Option<Arc<dyn QueueDepth>>,
    builder: Builders<S>,
    ping: Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>,
}

/// A standing loop (the cron scheduler, the outbox relay), started with the process's stop
/// signal.
type Standing = Box<dyn FnOnce(watch::Receiver<bool>) -> BoxFuture<'static, ()> + Send>;

/// Refuses a [`DATABASE_URL`] of another engine than the handlers', naming the key.
fn expect_engine<S: ProcessStore>(config: &Config) -> Result<&str, ProcessError>
where
    S::Tx: Send,
{
    let url = config.require(&DATABASE_URL)?;
    let scheme = compose::scheme(url);
    if S::SCHEMES.contains(&scheme) {
        return Ok(url);
    }
    Err(refused(
        &DATABASE_URL,
        &format!(
            "names a `{scheme}:` store, but this process's handlers run on {} ({})",
            S::ENGINE,
            S::SCHEMES
                .iter()
                .map(|s| format!("{s}://…"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// The transport [`QUEUE_URL`] names for a store's workers: pulled per job, or, for QStash,
/// delivered to routes of the process's HTTP server.
struct Composed<S: WorkStore> {
    builder: Builders<S>,
    publisher: Arc<dyn QueuePort>,
    depth: Option<Arc<dyn QueueDepth>>,
    transport: String,
    push: Option<PushRoutes<S>>,
}

/// Makes each queue's worker builder.
type Builders<S> = Box<dyn Fn(ConsumerName, QueueName) -> WorkerBuilder<S> + Send + Sync>;

/// The routes a push transport delivers to, given the workers they run.
type PushRoutes<S> = Box<dyn FnOnce(&[Arc<Worker<S>>]) -> Result<Router, ProcessError> + Send>;

async fn composed<S: ProcessStore>(config: &Config, store: &S) -> Result<Composed<S>, ProcessError>
where
    S::Tx: Send,
{
    let queue = Queue::connect(config).await?;
    let store = Arc::new(store.clone());
    #[cfg(feature = "vercel-queues")]
    if queue.scheme == "vercel-queues" && switch(config, &compose::VERCEL_QUEUES_PUSH)? {
        return vercel_push(config, store, queue);
    }
    let Some(consumer) = queue.consumer.clone() else {
        #[cfg(feature = "qstash")]
        if queue.scheme == "qstash" {
            return qstash_push(config, store, queue);
        }
        return Err(refused(
            &QUEUE_URL,
            &format!(
                "`{}:` pushes its deliveries, and this build serves no route for it",
                queue.scheme
            ),
        ));
    };
    if !queue.durable {
        tracing::warn!(
            queue_url = %queue.scheme,
            "the queue lives in this process only: jobs left when it stops are lost"
        );
    }
    Ok(Composed {
        builder: Box::new(move |name, queue| {
            Worker::builder_on(name, queue, consumer.clone(), store.clone())
        }),
        transport: format!("{}: (per job)", queue.scheme),
        publisher: queue.publisher,
        depth: queue.depth,
        push: None,
    })
}

/// QStash delivers each queue's jobs to `POST` on the path of its destination
/// ([`QSTASH_DESTINATION`](crate::compose::QSTASH_DESTINATION), `{queue}` replaced), each
/// request's signature verified before anything of it is read (its `sub` claim must be that
/// queue's URL, so a queue's route refuses another's deliveries).
#[cfg(feature = "qstash")]
fn qstash_push<S: ProcessStore>(
    config: &Config,
    store: Arc<S>,
    queue: Queue,
) -> Result<Composed<S>, ProcessError>
where
    S::Tx: Send,
{
    use jobs_adapter_qstash::{PushConsumer, Receiver};
    let publisher = compose::qstash_queue(config)?;
    let keys = compose::qstash_signing_keys(config)?;
    let consumer = Arc::new(PushConsumer::default());
    let settle = consumer.clone();
    let routes: PushRoutes<S> = Box::new(move |workers| {
        let mut router = Router::new();
        for worker in workers {
            let name = worker.queue().clone();
            let url = publisher
                .config()
                .destination(&name)
                .map(|d| d.url().to_owned())
                .ok_or_else(|| {
                    refused(
                        &compose::QSTASH_DESTINATION,
                        &format!("names no destination for `{name}`"),
                    )
                })?;
            let path = url_path(&url).to_owned();
            let receiver = Arc::new(
                Receiver::new(name, url, keys.clone(), consumer.clone())
                    .with_republisher(publisher.clone()),
            );
            let worker = worker.clone();
            router = router.route(
                &path,
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                        let (receiver, worker) = (receiver.clone(), worker.clone());
                        async move { qstash_delivery(&receiver, &worker, &headers, body).await }
                    },
                ),
            );
        }
        Ok(router)
    });
    Ok(Composed {
        builder: Box::new(move |name, queue| {
            Worker::push_builder(name, queue, settle.clone(), store.clone(), store.clone())
        }),
        transport: "qstash: (pushed to this process's routes)".to_owned(),
        publisher: queue.publisher,
        depth: queue.depth,
        push: Some(routes),
    })
}

/// The path Vercel Queues' callbacks are served on.
pub const VERCEL_CALLBACK_PATH: &str = "/vercel/queues";

/// Vercel Queues calls `POST` [`VERCEL_CALLBACK_PATH`] once per message; the callback names
/// its queue, and one of a queue this process does not serve is refused (400). A pushed
/// payload runs only once its receipt handle is confirmed (ADR 0009).
#[cfg(feature = "vercel-queues")]
fn vercel_push<S: ProcessStore>(
    config: &Config,
    store: Arc<S>,
    queue: Queue,
) -> Result<Composed<S>, ProcessError>
where
    S::Tx: Send,
{
    let vercel = compose::vercel_queues_of(config)?;
    // Settled through the composed transport, so a depth count sees the acks.
    let Some(consumer) = queue.consumer.clone() else {
        return Err(refused(&QUEUE_URL, "names no Vercel Queues consumer"));
    };
    let settle: Arc<dyn jobs_core::SettlePort> = consumer;
    let routes: PushRoutes<S> = Box::new(move |workers| {
        let served: Arc<std::collections::HashMap<QueueName, Arc<Worker<S>>>> = Arc::new(
            workers
                .iter()
                .map(|w| (w.queue().clone(), w.clone()))
                .collect(),
        );
        Ok(Router::new().route(
            VERCEL_CALLBACK_PATH,
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (vercel, served) = (vercel.clone(), served.clone());
                    async move { vercel_callback(&vercel, &served, &headers, body).await }
                },
            ),
        ))
    });
    Ok(Composed {
        builder: Box::new(move |name, queue| {
            Worker::push_builder(name, queue, settle.clone(), store.clone(), store.clone())
        }),
        transport: format!("vercel-queues: (callbacks on POST {VERCEL_CALLBACK_PATH})"),
        publisher: queue.publisher,
        depth: queue.depth,
        push: Some(routes),
    })
}

/// One Vercel Queues callback through the worker of its queue.
#[cfg(feature = "vercel-queues")]
async fn vercel_callback<S: WorkStore>(
    vercel: &jobs_adapter_vercel_queues::VercelQueues,
    served: &std::collections::HashMap<QueueName, Arc<Worker<S>>>,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String)
where
    S::Tx: Send,
{
    use jobs_adapter_vercel_queues::push::{PushCallback, PushReply};
    let reply = match PushCallback::parse(headers, body.to_vec()) {
        Err(e) => PushReply::BadRequest(e.to_string()),
        Ok(callback) => match served.get(callback.queue()) {
            None => PushReply::BadRequest(format!(
                "this process does not serve `{}`",
                callback.queue()
            )),
            Some(worker) => {
                vercel
                    .handle_push(headers, body.to_vec(), |delivery| async move {
                        !matches!(
                            worker.process(delivery).await,
                            jobs_consumers::Outcome::Unsettled { .. }
                        )
                    })
                    .await
            }
        },
    };
    let status = StatusCode::from_u16(reply.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, reply.body())
}

/// One QStash delivery through `worker`, answered as the receiver says.
#[cfg(feature = "qstash")]
async fn qstash_delivery<S: WorkStore>(
    receiver: &jobs_adapter_qstash::Receiver,
    worker: &Worker<S>,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response
where
    S::Tx: Send,
{
    use axum::response::IntoResponse;
    use jobs_adapter_qstash::{Processed, PushRequest};
    let request = PushRequest::from_headers(headers, body.to_vec());
    let answer = receiver
        .handle(request, |delivery| async move {
            match worker.process(delivery).await {
                jobs_consumers::Outcome::DeadLettered { .. } => Processed::DeadLettered,
                _ => Processed::Settled,
            }
        })
        .await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    for (name, value) in answer.headers {
        if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(axum::http::HeaderName::from_static(name), value);
        }
    }
    response
}

/// The path of `url` (`/qstash/billing.invoices` of `https://app.example/qstash/billing.invoices`).
#[cfg(feature = "qstash")]
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/", |at| &rest[at..])
}

#[cfg(feature = "postgres")]
#[async_trait]
impl ProcessStore for PgStore {
    const ENGINE: &'static str = "PostgreSQL";
    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];

    /// The PostgreSQL queue in the store's own database, on its pool, grouped
    /// (`WorkerBuilder::grouped`), unless [`QUEUE_URL`] names another transport.
    async fn open(config: &Config, connections: u32) -> Result<Opened<PgStore>, ProcessError> {
        let url = expect_engine::<PgStore>(config)?;
        let timeout = compose::connect_timeout(config)?;
        let options = PgStore::pool_options(connections);
        let store = PgStore::connect_with(url, options, timeout)
            .await
            .map_err(ComposeError::Store)?;
        let pool = store.pool().clone();
        let ping = Box::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let migrated: Option<bool> = jobs_adapter_postgres::sqlx::query_scalar(
                    "select to_regclass('core.processed_jobs') is not null",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("the store does not answer: {e}"))?;
                match migrated {
                    Some(true) => Ok(()),
                    _ => Err("the store has no core schema: run `jobsctl migrate`".to_owned()),
                }
            }) as BoxFuture<'static, Result<(), String>>
        });
        let own_queue = config
            .setting(&QUEUE_URL)
            .is_none_or(|s| s.source == compose::Source::Default);
        if !own_queue {
            let composed = composed(config, &store).await?;
            return Ok(Opened {
                builder: composed.builder,
                transport: composed.transport,
                tenants: Some(pg_tenants(&store)),
                relay: Some(pg_relay(&store, composed.publisher.clone())),
                push: composed.push,
                store,
                publisher: composed.publisher,
                depth: composed.depth,
                ping,
            });
        }
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        match queue.is_migrated().await {
            Ok(true) => {}
            Ok(false) => {
                return Err(ComposeError::Queue(
                    "that database has no core.jobs table: run `jobsctl migrate` on it first"
                        .into(),
                )
                .into());
            }
            Err(e) => return Err(ComposeError::Queue(e.to_string()).into()),
        }
        let shared = Arc::new(store.clone());
        let grouped = queue.clone();
        Ok(Opened {
            tenants: Some(pg_tenants(&store)),
            relay: Some(pg_relay(&store, queue.clone())),
            push: None,
            store,
            transport: "the PostgreSQL queue in the store's database (grouped)".to_owned(),
            publisher: queue.clone(),
            depth: Some(queue.clone()),
            builder: Box::new(move |name, queue_name| {
                Worker::builder_on(name, queue_name, grouped.clone(), shared.clone())
                    .grouped(grouped.clone())
            }),
            ping,
        })
    }
}

/// The tenants of `core.tenants`, for the cron scheduler.
#[cfg(feature = "postgres")]
fn pg_tenants(store: &PgStore) -> Arc<dyn TenantDirectory> {
    Arc::new(jobs_adapter_postgres::PgTenantDirectory::new(
        store.pool().clone(),
    ))
}

/// The relay of `core.outbox` to `target`.
#[cfg(feature = "postgres")]
fn pg_relay(store: &PgStore, target: Arc<dyn QueuePort>) -> Standing {
    let relay = jobs_adapter_postgres::OutboxRelay::new(store.pool().clone(), target);
    Box::new(move |stop| Box::pin(crate::standing::run_relay(relay, stop)))
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl ProcessStore for SqliteStore {
    const ENGINE: &'static str = "SQLite";
    const SCHEMES: &'static [&'static str] = &["sqlite"];

    /// The transport [`QUEUE_URL`] names (SQLite holds no queue), per job.
    async fn open(config: &Config, _connections: u32) -> Result<Opened<SqliteStore>, ProcessError> {
        expect_engine::<SqliteStore>(config)?;
        // Irrefutable in a build that composes no other store.
        #[allow(irrefutable_let_patterns)]
        let compose::Store::Sqlite(store) = compose::Store::connect(config).await? else {
            unreachable!("the scheme was checked");
        };
        let composed = composed(config, &store).await?;
        let pool = store.pool().clone();
        Ok(Opened {
            builder: composed.builder,
            transport: composed.transport,
            // SQLite keeps neither tenants nor an outbox.
            tenants: None,
            relay: None,
            push: composed.push,
            store,
            publisher: composed.publisher,
            depth: composed.depth,
            ping: Box::new(move || {
                let pool = pool.clone();
                Box::pin(async move {
                    jobs_adapter_sqlite::sqlx::query("select 1")
                        .execute(&pool)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("the store does not answer: {e}"))
                })
            }),
        })
    }
}

/// One queue's worker, as [`WorkerProcess::queue`] was told.
struct QueueSpec<S: WorkStore> {
    queue: String,
    consumer: String,
    build: Box<dyn FnOnce(WorkerBuilder<S>) -> WorkerBuilder<S> + Send>,
}

/// A worker process over the store `S` its handlers are typed for: build it, name its queues
/// and their handlers, and [`run`](WorkerProcess::run) it.
pub struct WorkerProcess<S: ProcessStore>
where
    S::Tx: Send,
{
    config: Result<Config, ComposeError>,
    queues: Vec<QueueSpec<S>>,
}

/// The settings a binary may offer as flags of its own command line, flattened with
/// `#[command(flatten)]`; unset flags fall back to the environment, `jobs.toml` and the
/// defaults, as for `jobsctl`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProcessFlags {
    /// The configuration file [env: JOBS_CONFIG] [default: ./jobs.toml when present].
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The store [env: DATABASE_URL].
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// The queue transport [env: JOBS_QUEUE_URL] [default: the store's own, on PostgreSQL].
    #[arg(long, value_name = "URL")]
    pub queue_url: Option<String>,
    /// Where /healthz, /readyz and /metrics are served [env: JOBS_HTTP_ADDR]
    /// [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// Log lines: human or json [env: JOBS_LOG_FORMAT] [default: human].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Jobs each queue's worker runs at once [env: JOBS_CONCURRENCY] [default: 8].
    #[arg(long, value_name = "N")]
    pub concurrency: Option<String>,
    /// How long in-flight jobs may finish after a stop signal [env: JOBS_SHUTDOWN_GRACE]
    /// [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<String>,
}

impl ProcessFlags {
    /// The configuration these flags resolve to in this process.
    pub fn resolve(&self) -> Result<Config, ComposeError> {
        let keys: [(&Key, &Option<String>); 6] = [
            (&DATABASE_URL, &self.database_url),
            (&QUEUE_URL, &self.queue_url),
            (&HTTP_ADDR, &self.http_addr),
            (&LOG_FORMAT, &self.log_format),
            (&CONCURRENCY, &self.concurrency),
            (&SHUTDOWN_GRACE, &self.shutdown_grace),
        ];
        let mut flags = BTreeMap::new();
        for (key, value) in keys {
            if let (Some(flag), Some(value)) = (key.flag, value) {
                flags.insert(flag, value.clone());
            }
        }
        Ok(Config::from_process(&flags, self.config.clone())?)
    }
}

impl<S: ProcessStore> WorkerProcess<S>
where
    S::Tx: Send,
{
    /// Configured from this process's environment and `jobs.toml` (no flags).
    pub fn from_env() -> Self {
        Self::from_flags(&ProcessFlags::default())
    }

    /// Configured from `flags`, then the environment and `jobs.toml`.
    pub fn from_flags(flags: &ProcessFlags) -> Self {
        WorkerProcess {
            config: flags.resolve(),
            queues: vec![],
        }
    }

    /// Configured by `config`.
    pub fn with_config(config: Config) -> Self {
        WorkerProcess {
            config: Ok(config),
            queues: vec![],
        }
    }

    /// Consumes `queue` as `consumer`, with the handlers `build` registers on the worker's
    /// builder (and any setting but the concurrency, which [`CONCURRENCY`] sets for the whole
    /// process because it sizes the pool). Invalid names are reported by
    /// [`start`](Self::start).
    pub fn queue(
        mut self,
        queue: &str,
        consumer: &str,
        build: impl FnOnce(WorkerBuilder<S>) -> WorkerBuilder<S> + Send + 'static,
    ) -> Self {
        self.queues.push(QueueSpec {
            queue: queue.to_owned(),
            consumer: consumer.to_owned(),
            build: Box::new(build),
        });
        self
    }

    /// Starts, then runs until SIGTERM or SIGINT and stops gracefully
    /// ([`Running::until_signal`]).
    pub async fn run(self) -> Result<(), ProcessError> {
        self.start().await?.until_signal().await
    }

    /// Opens the store and the transport, builds every queue's worker, starts them and the
    /// HTTP endpoints, and logs the effective configuration (secrets hidden).
    pub async fn start(self) -> Result<Running<S>, ProcessError> {
        let config = self.config?;
        init_tracing(config.get(&LOG_FORMAT).unwrap_or("human"))?;
        if self.queues.is_empty() {
            return Err(ProcessError::NoQueues);
        }
        let (cron, relay) = (switch(&config, &CRON)?, switch(&config, &OUTBOX_RELAY)?);
        let mut fair = fair_queues(&config)?;
        if let Some(unknown) = fair
            .keys()
            .find(|q| !self.queues.iter().any(|s| s.queue == q.as_str()))
        {
            return Err(refused(
                &FAIR,
                &format!("names `{unknown}`, which this process does not consume"),
            ));
        }
        let concurrency = positive(&config, &CONCURRENCY)?;
        let grace = compose::shutdown_grace(&config)?;
        let addr = socket_addr(&config)?;
        let queues = u32::try_from(self.queues.len()).unwrap_or(u32::MAX);
        // Each worker's jobs, its fetch and its settlements; one listener for the wake-ups.
        let connections = u32::try_from(concurrency)
            .unwrap_or(u32::MAX)
            .saturating_add(2)
            .saturating_mul(queues)
            .saturating_add(1);
        let mut opened = S::open(&config, connections).await?;
        let alerts = CoalescingAlerter::new(
            compose::alerter(&config)?,
            Arc::new(SystemClock),
            ALERT_WINDOW,
        );
        let mut workers = Vec::with_capacity(self.queues.len());
        for spec in self.queues {
            let queue: QueueName = spec.queue.parse().map_err(|source| ProcessError::Name {
                what: "queue",
                value: spec.queue.clone(),
                source,
            })?;
            let consumer = ConsumerName::try_from(spec.consumer.as_str()).map_err(|source| {
                ProcessError::Name {
                    what: "consumer",
                    value: spec.consumer.clone(),
                    source,
                }
            })?;
            let mut builder = (opened.builder)(consumer, queue.clone())
                .concurrency(concurrency)
                .shutdown_grace(grace)
                .alerts(alerts.clone());
            if let Some(fairness) = fair.remove(&queue) {
                builder = builder.fair(fairness);
            }
            let builder = (spec.build)(builder);
            if builder.settings().concurrency != concurrency {
                return Err(ProcessError::Worker {
                    queue,
                    source: WorkerError::Config {
                        field: "concurrency".to_owned(),
                        value: builder.settings().concurrency.to_string(),
                        why: format!(
                            "a worker process sizes its pool from {}; set it there",
                            CONCURRENCY.describe()
                        ),
                    },
                });
            }
            let worker = builder.build().map_err(|source| ProcessError::Worker {
                queue: queue.clone(),
                source,
            })?;
            workers.push(Arc::new(worker));
        }
        let console = console_router(&config, &opened, &workers)?;
        // The standing loops are set up before anything starts, so a refusal leaves nothing
        // running.
        let mut loops: Vec<Standing> = Vec::new();
        if cron {
            let Some(tenants) = opened.tenants.clone() else {
                return Err(refused(
                    &CRON,
                    "the tenants live in PostgreSQL (core.tenants)",
                ));
            };
            let scheduler = jobs_cron::Scheduler::new(
                jobs_cron::standard_tasks(),
                tenants,
                opened.publisher.clone(),
                Arc::new(SystemClock),
                jobs_cron::CatchUp::default(),
            )
            .map_err(|e| refused(&CRON, &e.to_string()))?;
            loops.push(Box::new(move |stop| {
                Box::pin(crate::standing::run_cron(scheduler, stop))
            }));
        }
        if relay {
            let Some(start) = opened.relay else {
                return Err(refused(&OUTBOX_RELAY, "the outbox lives in PostgreSQL"));
            };
            loops.push(start);
        }
        let push = match opened.push.take() {
            Some(routes) => routes(&workers)?,
            None => Router::new(),
        }
        .merge(console);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ProcessError::Listen {
                addr,
                key: HTTP_ADDR.describe(),
                source,
            })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let (stop, stopped) = watch::channel(false);
        let state = Arc::new(Probes {
            workers: workers
                .iter()
                .map(|w| w.clone() as Arc<dyn Turning>)
                .collect(),
            ended: Mutex::default(),
            stopping: AtomicBool::new(false),
            readiness: Mutex::new(Err("not checked yet".to_owned())),
            metrics: metrics_handle(),
        });
        let checks = tokio::spawn(check_readiness(
            state.clone(),
            opened.ping,
            opened.depth.clone(),
            workers[0].queue().clone(),
            stopped.clone(),
        ));
        // The endpoints outlive the workers' drain: /readyz says 503 while it lasts.
        let (server_stop, server_stopped) = watch::channel(false);
        let server = tokio::spawn(serve(listener, state.clone(), push, server_stopped));
        let standing: Vec<JoinHandle<()>> = loops
            .into_iter()
            .map(|start| tokio::spawn(start(stopped.clone())))
            .collect();
        let mut running = Vec::with_capacity(workers.len());
        // A push transport's workers run from its routes; the others pull in a loop.
        for worker in workers.iter().filter(|w| w.pulls()) {
            let mut stopped = stopped.clone();
            let until = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let probes = state.clone();
            let worker = worker.clone();
            let queue = worker.queue().clone();
            running.push((
                queue.clone(),
                tokio::spawn(async move {
                    let drained = worker.run(until).await;
                    probes.ended(&queue);
                    drained
                }),
            ));
        }
        tracing::info!(
            ?config,
            store = S::ENGINE,
            transport = %opened.transport,
            queues = ?workers.iter().map(|w| w.queue().to_string()).collect::<Vec<_>>(),
            concurrency,
            connections,
            http = %addr,
            "worker process started"
        );
        Ok(Running {
            addr,
            publisher: opened.publisher,
            stop,
            probes: state,
            workers: running,
            server,
            server_stop,
            checks,
            standing,
            store: opened.store,
        })
    }
}

/// A started worker process.
pub struct Running<S> {
    addr: SocketAddr,
    publisher: Arc<dyn QueuePort>,
    stop: watch::Sender<bool>,
    probes: Arc<Probes>,
    workers: Vec<(QueueName, JoinHandle<Drained>)>,
    server: JoinHandle<()>,
    /// Stops the endpoints, once the workers have drained.
    server_stop: watch::Sender<bool>,
    checks: JoinHandle<()>,
    /// The cron scheduler and the outbox relay, when configured.
    standing: Vec<JoinHandle<()>>,
    store: S,
}

impl<S> Running<S> {
    /// The store, for the application's own queries (its schema, say) outside work
    /// transactions.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Runs until SIGTERM or SIGINT, then stops gracefully ([`Running::stop`]); a second
    /// signal while it drains exits the process at once (status 130).
    pub async fn until_signal(self) -> Result<(), ProcessError> {
        stop_signal().await;
        tracing::info!("stop signal received; draining (a second signal exits at once)");
        tokio::spawn(async {
            stop_signal().await;
            tracing::warn!("second stop signal: exiting at once");
            std::process::exit(130);
        });
        self.stop().await;
        Ok(())
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served (the port chosen, when
    /// [`HTTP_ADDR`] asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Publishes to the process's transport.
    pub fn publisher(&self) -> &Arc<dyn QueuePort> {
        &self.publisher
    }

    /// Stops gracefully: `/readyz` answers 503 at once, the workers stop fetching, give back
    /// what they fetched and did not start, and let in-flight jobs finish within the grace;
    /// one line per queue says what was drained.
    pub async fn stop(self) {
        self.probes.stopping.store(true, Ordering::SeqCst);
        self.stop.send_replace(true);
        for (queue, worker) in self.workers {
            match worker.await {
                Ok(drained) => tracing::info!(
                    %queue,
                    finished = drained.finished,
                    abandoned = drained.abandoned,
                    given_back = drained.given_back,
                    "worker stopped"
                ),
                Err(e) => tracing::error!(%queue, error = %e, "the worker's task failed"),
            }
        }
        for task in self.standing {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "a standing loop's task failed");
            }
        }
        self.checks.abort();
        self.server_stop.send_replace(true);
        let _ = self.server.await;
        tracing::info!("worker process stopped");
    }
}

/// A worker as the health check sees it, whatever its store.
trait Turning: Send + Sync {
    fn queue(&self) -> &QueueName;
    fn stuck(&self) -> Option<Duration>;
}

impl<S: WorkStore> Turning for Worker<S>
where
    S::Tx: Send,
{
    fn queue(&self) -> &QueueName {
        Worker::queue(self)
    }

    fn stuck(&self) -> Option<Duration> {
        Worker::stuck(self)
    }
}

/// What the endpoints report on.
struct Probes {
    workers: Vec<Arc<dyn Turning>>,
    /// Queues whose worker's loop has ended.
    ended: Mutex<Vec<QueueName>>,
    stopping: AtomicBool,
    /// The last readiness check.
    readiness: Mutex<Result<(), String>>,
    metrics: PrometheusHandle,
}

impl Probes {
    fn ended(&self, queue: &QueueName) {
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(queue.clone());
    }

    /// `Ok` while every loop turns and none has ended before a stop.
    fn health(&self) -> Result<(), String> {
        let mut wrong: Vec<String> = self
            .workers
            .iter()
            .filter_map(|w| {
                w.stuck()
                    .map(|since| format!("{}: its loop has not turned for {since:?}", w.queue()))
            })
            .collect();
        if !self.stopping.load(Ordering::SeqCst) {
            let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
            wrong.extend(ended.iter().map(|q| format!("{q}: its loop ended")));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }

    fn readiness(&self) -> Result<(), String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("stopping".to_owned());
        }
        self.readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Asks the store (and the queue, when it reports depth) every [`READINESS_EVERY`], so that
/// probes read a cached answer and never hammer a vendor.
async fn check_readiness(
    probes: Arc<Probes>,
    ping: Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>,
    depth: Option<Arc<dyn QueueDepth>>,
    queue: QueueName,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let check = async {
            ping().await?;
            if let Some(depth) = &depth {
                depth
                    .depth(&queue)
                    .await
                    .map_err(|e| format!("the queue does not answer: {e}"))?;
            }
            Ok(())
        };
        let answer = tokio::time::timeout(READINESS_TIMEOUT, check)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {READINESS_TIMEOUT:?}")));
        if let Err(why) = &answer {
            tracing::warn!(%why, "not ready");
        }
        *probes
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = answer;
        tokio::select! {
            () = tokio::time::sleep(READINESS_EVERY) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    probes: Arc<Probes>,
    push: Router,
    mut stopped: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probes)
        .merge(push);
    let served = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    if let Err(e) = served.await {
        tracing::error!(error = %e, "the HTTP endpoints failed");
    }
}

fn answer(result: Result<(), String>, ok: &'static str) -> (StatusCode, String) {
    match result {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn healthz(State(probes): State<Arc<Probes>>) -> (StatusCode, String) {
    answer(probes.health(), "alive")
}

async fn readyz(State(probes): State<Arc<Probes>>) -> (StatusCode, String) {
    answer(probes.readiness(), "ready")
}

async fn metrics(
    State(probes): State<Arc<Probes>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        probes.metrics.render(),
    )
}

/// The process's Prometheus recorder: installed by the first worker process of the process,
/// shared by any later one (a recorder is global).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "another metrics recorder is installed; /metrics shows none of the runtime's"
                );
            }
            handle
        })
        .clone()
}

/// `tracing` to standard error, as `format` ([`LOG_FORMAT`]) says, filtered by `RUST_LOG`
/// (default `info`); left alone when the binary installed a subscriber of its own.
pub fn init_tracing(format: &str) -> Result<(), ProcessError> {
    use tracing_subscriber::EnvFilter;
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter());
    let _ = match format {
        "human" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => {
            return Err(refused(
                &LOG_FORMAT,
                &format!("`{other}` is neither human nor json"),
            ));
        }
    };
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = terminate => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// `on` or `off` from `key`.
fn switch(config: &Config, key: &Key) -> Result<bool, ProcessError> {
    match config.require(key)? {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(refused(key, &format!("`{other}` is neither on nor off"))),
    }
}

/// The operations console on the process's address, when [`CONSOLE_TOKENS`] is set: over the
/// process's store and transport, showing its workers' queues. Refused beside a push
/// transport, whose delivery routes the address serves.
fn console_router<S: ProcessStore>(
    config: &Config,
    opened: &Opened<S>,
    workers: &[Arc<Worker<S>>],
) -> Result<Router, ProcessError>
where
    S::Tx: Send,
{
    let Some(list) = config.get(&CONSOLE_TOKENS) else {
        return Ok(Router::new());
    };
    if opened.push.is_some() {
        return Err(refused(
            &CONSOLE_TOKENS,
            "this process serves a push transport's deliveries on its address; run `jobsctl \
             console` beside it instead",
        ));
    }
    let tokens = ConsoleToken::parse_list(list).map_err(|e| refused(&CONSOLE_TOKENS, &e))?;
    let store: Arc<dyn DeadLetterStore> = Arc::new(opened.store.clone());
    let mut console = Console::new(store, opened.publisher.clone(), tokens)
        .bulk_runs(Arc::new(opened.store.clone()))
        .replay_rate(compose::console_replay_rate(config)?);
    if let Some(tenants) = &opened.tenants {
        console = console.tenants(tenants.clone());
    }
    if let Some(depth) = &opened.depth {
        let queues = workers.iter().map(|w| w.queue().clone()).collect();
        console = console.depth(depth.clone(), queues);
    }
    Ok(console.router())
}

/// The queues [`FAIR`] names, each with its fairness: `QUEUE` or `QUEUE=LIMIT`.
fn fair_queues(config: &Config) -> Result<HashMap<QueueName, TenantFairness>, ProcessError> {
    let mut fair = HashMap::new();
    let Some(value) = config.get(&FAIR) else {
        return Ok(fair);
    };
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, limit) = match item.split_once('=') {
            Some((name, limit)) => (name.trim(), Some(limit.trim())),
            None => (item, None),
        };
        let queue: QueueName = name
            .parse()
            .map_err(|e| refused(&FAIR, &format!("`{name}` is not a queue name: {e}")))?;
        let mut fairness = TenantFairness::round_robin();
        if let Some(limit) = limit {
            let limit = limit.parse::<NonZeroU32>().map_err(|_| {
                refused(
                    &FAIR,
                    &format!("the limit of `{name}`, `{limit}`, is not a whole number above zero"),
                )
            })?;
            fairness = fairness.limit(limit);
        }
        if fair.insert(queue, fairness).is_some() {
            return Err(refused(&FAIR, &format!("names `{name}` twice")));
        }
    }
    Ok(fair)
}

/// `key` cannot be honoured, for `why`.
fn refused(key: &Key, why: &str) -> ProcessError {
    ComposeError::Invalid {
        key: key.describe(),
        message: why.to_owned(),
    }
    .into()
}

/// A positive whole number from `key`.
fn positive(config: &Config, key: &Key) -> Result<usize, ProcessError> {
    let value = config.require(key)?;
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(refused(
            key,
            &format!("`{value}` is not a whole number above zero"),
        )),
    }
}

fn socket_addr(config: &Config) -> Result<SocketAddr, ProcessError> {
    let value = config.require(&HTTP_ADDR)?;
    value.parse().map_err(|_| {
        refused(
            &HTTP_ADDR,
            &format!("`{value}` is not an address such as 127.0.0.1:9464"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker as the health check sees it, stuck or not as told.
    struct Seen(QueueName, Option<Duration>);

    impl Turning for Seen {
        fn queue(&self) -> &QueueName {
            &self.0
        }
        fn stuck(&self) -> Option<Duration> {
            self.1
        }
    }

    fn probes(workers: Vec<Arc<dyn Turning>>) -> Probes {
        Probes {
            workers,
            ended: Mutex::default(),
            stopping: AtomicBool::new(false),
            readiness: Mutex::new(Ok(())),
            metrics: metrics_handle(),
        }
    }

    #[test]
    fn health_fails_on_a_stuck_or_ended_loop_and_readiness_on_a_stop() {
        let queue = |name: &str| name.parse::<QueueName>().expect("a queue");
        let stuck = probes(vec![
            Arc::new(Seen(queue("billing.invoices"), None)),
            Arc::new(Seen(queue("notify.email"), Some(Duration::from_secs(95)))),
        ]);
        let why = stuck.health().expect_err("a stuck loop");
        assert_eq!(why, "notify.email: its loop has not turned for 95s");

        let fine = probes(vec![Arc::new(Seen(queue("billing.invoices"), None))]);
        assert_eq!(fine.health(), Ok(()));
        assert_eq!(fine.readiness(), Ok(()));
        fine.ended(&queue("billing.invoices"));
        assert_eq!(
            fine.health(),
            Err("billing.invoices: its loop ended".to_owned())
        );
        fine.stopping.store(true, Ordering::SeqCst);
        assert_eq!(fine.health(), Ok(()), "loops end when a stop is asked");
        assert_eq!(fine.readiness(), Err("stopping".to_owned()));
        assert_eq!(
            answer(fine.readiness(), "ready").0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn a_binary_flattens_the_process_flags_into_its_own_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            process: ProcessFlags,
            /// A flag of the binary's own.
            #[arg(long)]
            dry_run: bool,
        }
        let cli = Cli::parse_from([
            "billing-worker",
            "--concurrency",
            "16",
            "--http-addr",
            "0.0.0.0:9464",
            "--dry-run",
        ]);
        assert!(cli.dry_run);
        assert_eq!(cli.process.concurrency.as_deref(), Some("16"));
        let config = cli.process.resolve().expect("resolves");
        assert_eq!(config.get(&CONCURRENCY), Some("16"));
        assert_eq!(
            config.setting(&HTTP_ADDR).map(|s| s.source.clone()),
            Some(compose::Source::Flag)
        );
    }
}

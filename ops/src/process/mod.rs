//! The worker process: what a module binary runs to consume its queues in production.
//!
//! [`WorkerProcess`] takes its configuration the way `jobsctl` does ([`Config`]: flags the
//! binary passes, then the environment, then `jobs.toml`, then defaults), opens the store
//! its handlers are typed for ([`ProcessStore`]) with one connection pool sized for every
//! queue's worker, runs them, and serves `/healthz`, `/readyz` and `/metrics` on
//! [`HTTP_ADDR`], with the operations console beside them when [`CONSOLE_TOKENS`] is set
//! ([`crate::console`]). SIGTERM or SIGINT stops it: `/readyz` answers 503 at once, fetching stops,
//! in-flight jobs finish within [`SHUTDOWN_GRACE`](crate::config::SHUTDOWN_GRACE), what was fetched and not started is given
//! back, and [`WorkerProcess::run`] returns `Ok`. A second signal exits at once.
//!
//! A binary names the store its handlers are typed for (`WorkerProcess::<PgStore>`, with the
//! `postgres` feature; `ops/examples/worker.rs` is a whole one); here, any:
//!
//! ```no_run
//! use async_trait::async_trait;
//! use jobs_consumers::{Handler, Job, JobError};
//! use jobs_ops::process::{ProcessError, ProcessStore, WorkerProcess};
//!
//! struct Noop;
//!
//! #[async_trait]
//! impl<Tx: Send + 'static> Handler<Tx> for Noop {
//!     type Data = serde_json::Value;
//!     async fn handle(&self, _: Job<serde_json::Value>, _: &mut Tx) -> Result<(), JobError> {
//!         Ok(())
//!     }
//! }
//!
//! async fn run<S: ProcessStore>() -> Result<(), ProcessError>
//! where
//!     S::Tx: Send,
//! {
//!     WorkerProcess::<S>::from_env()
//!         .queue("billing.invoices", "billing.booker", |worker| {
//!             worker.handler("billing.invoice_issued".parse().expect("a kind"), Noop)
//!         })
//!         .run()
//!         .await
//! }
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

mod commands;
mod endpoints;
mod gauges;
#[cfg(feature = "postgres")]
mod postgres;
mod push;
mod settings;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use futures_util::future::BoxFuture;
use jobs_consumers::{CoalescingAlerter, Drained, Worker, WorkerBuilder, WorkerError};
use jobs_core::{
    BulkRuns, ConsumerName, DeadLetterStore, NameError, QueueDepth, QueueName, QueuePort,
    SystemClock, TenantDirectory, WorkStore,
};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::compose::{
    self, CONCURRENCY, CONSOLE_TOKENS, CRON, ComposeError, Config, ConfigError, DATABASE_URL, FAIR,
    HTTP_ADDR, Key, LOG_FORMAT, OUTBOX_RELAY, QUEUE_URL, Queue,
};
use crate::console::{Console, ConsoleToken};
use endpoints::{Ping, Probes, Turning};
use push::{Push, Routes, Run, Served};

pub use endpoints::READINESS_EVERY;
pub use push::VERCEL_CALLBACK_PATH;
pub use settings::ProcessFlags;

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
    /// The module's own migrations, run by [`WorkerProcess::migrate`], failed.
    #[error("the module's own migrations: {0}")]
    Migrate(String),
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

impl From<ConfigError> for ProcessError {
    fn from(e: ConfigError) -> Self {
        ProcessError::Config(e.into())
    }
}

/// `key` cannot be honoured, for `why`.
fn refused(key: &Key, why: &str) -> ProcessError {
    key.invalid(why).into()
}

/// A store a worker process can run handlers on: it opens itself from the configuration, with
/// what it keeps beside the jobs (tenants, an outbox) and, when it holds a queue of its own,
/// that queue. Implemented for `PgStore` (feature `postgres`) and `SqliteStore` (feature
/// `sqlite`).
#[async_trait]
pub trait ProcessStore: WorkStore + DeadLetterStore + BulkRuns + Clone
where
    Self::Tx: Send,
{
    /// The engine, for messages (`PostgreSQL`).
    const ENGINE: &'static str;

    /// The [`DATABASE_URL`] schemes that name this store.
    const SCHEMES: &'static [&'static str];

    /// Opens the store named by [`DATABASE_URL`] (already checked to be of this engine) with
    /// a pool of `connections`.
    async fn open(config: &Config, connections: u32) -> Result<Opened<Self>, ProcessError>;

    /// Connects the store [`DATABASE_URL`] names and creates or updates the framework's
    /// tables in it (idempotent), for a module binary's `migrate`
    /// ([`WorkerProcess::migrate`]).
    async fn migrated(config: &Config) -> Result<Self, ProcessError>;
}

/// What [`ProcessStore::open`] opened.
pub struct Opened<S: WorkStore> {
    store: S,
    /// Whether the store answers, for `/readyz`.
    ping: Ping,
    /// Where the cron scheduler reads tenants, when the store keeps them.
    tenants: Option<Arc<dyn TenantDirectory>>,
    /// The outbox relay to the process's queue, when the store keeps an outbox.
    relay: Option<Relay>,
    /// The store's own queue, when [`QUEUE_URL`] names no other: its workers run grouped.
    own: Option<Transport<S>>,
}

/// A standing loop (the cron scheduler, the outbox relay), started with the process's stop
/// signal.
type Standing = Box<dyn FnOnce(watch::Receiver<bool>) -> BoxFuture<'static, ()> + Send>;

/// The outbox relay, given the queue it forwards to.
type Relay = Box<dyn FnOnce(Arc<dyn QueuePort>) -> Standing + Send>;

/// The transport a store's workers consume: pulled per job, grouped in the store's own
/// queue, or pushed to routes of the process's HTTP server.
struct Transport<S: WorkStore> {
    builder: Builders<S>,
    publisher: Arc<dyn QueuePort>,
    depth: Option<Arc<dyn QueueDepth>>,
    /// Whether the transport answers, when its depth is not how to ask.
    ready: Option<endpoints::Ping>,
    /// What the workers consume, for the start line.
    transport: String,
    push: Option<Routes>,
}

/// Makes each queue's worker builder.
type Builders<S> = Box<dyn Fn(ConsumerName, QueueName) -> WorkerBuilder<S> + Send + Sync>;

/// Refuses a [`DATABASE_URL`] of another engine than the handlers', naming the key.
fn expect_engine<S: ProcessStore>(config: &Config) -> Result<(), ProcessError>
where
    S::Tx: Send,
{
    let scheme = compose::scheme(config.require(&DATABASE_URL)?);
    if S::SCHEMES.contains(&scheme) {
        return Ok(());
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

/// The transport [`QUEUE_URL`] names, for `store`'s workers.
async fn transport<S: ProcessStore>(
    config: &Config,
    store: &S,
) -> Result<Transport<S>, ProcessError>
where
    S::Tx: Send,
{
    let queue = Queue::connect(config).await?;
    let store = Arc::new(store.clone());
    if let Some(Push {
        settle,
        transport,
        routes,
        ready,
    }) = push::push(config, &queue)?
    {
        return Ok(Transport {
            builder: Box::new(move |name, queue| {
                Worker::push_builder(name, queue, settle.clone(), store.clone(), store.clone())
            }),
            transport,
            publisher: queue.publisher,
            depth: queue.depth,
            ready,
            push: Some(routes),
        });
    }
    let Some(consumer) = queue.consumer.clone() else {
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
    Ok(Transport {
        builder: Box::new(move |name, queue| {
            Worker::builder_on(name, queue, consumer.clone(), store.clone())
        }),
        transport: format!("{}: (per job)", queue.scheme),
        publisher: queue.publisher,
        depth: queue.depth,
        ready: None,
        push: None,
    })
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
    /// HTTP endpoints, and logs the effective configuration (secrets hidden). Anything refused
    /// is refused before anything starts.
    pub async fn start(self) -> Result<Running<S>, ProcessError> {
        let config = self.config?;
        init_tracing(config.get(&LOG_FORMAT).unwrap_or("human"))?;
        if self.queues.is_empty() {
            return Err(ProcessError::NoQueues);
        }
        let (cron, relay) = (config.switch(&CRON)?, config.switch(&OUTBOX_RELAY)?);
        let fair = settings::fair_queues(&config)?;
        if let Some(unknown) = fair
            .keys()
            .find(|q| !self.queues.iter().any(|s| s.queue == q.as_str()))
        {
            return Err(refused(
                &FAIR,
                &format!("names `{unknown}`, which this process does not consume"),
            ));
        }
        let concurrency = settings::positive(&config, &CONCURRENCY, settings::MAX_CONCURRENCY)?;
        let limits = compose::envelope_limits(&config)?;
        let error_values = config.switch(&compose::ERROR_VALUES)?;
        let grace = compose::shutdown_grace(&config)?;
        let addr = settings::socket_addr(&config)?;
        let queues = u32::try_from(self.queues.len()).unwrap_or(u32::MAX);
        // Each worker's jobs, its fetch and its settlements; one listener for the wake-ups.
        let connections = u32::try_from(concurrency)
            .unwrap_or(u32::MAX)
            .saturating_add(2)
            .saturating_mul(queues)
            .saturating_add(1);
        expect_engine::<S>(&config)?;
        let mut opened = S::open(&config, connections).await?;
        let mut transport = match opened.own.take() {
            Some(own) => own,
            None => transport(&config, &opened.store).await?,
        };
        let alerts = CoalescingAlerter::new(
            compose::alerter(&config)?,
            Arc::new(SystemClock),
            ALERT_WINDOW,
        );
        let mut fair = fair;
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
            let mut builder = (transport.builder)(consumer, queue.clone())
                .concurrency(concurrency)
                .decode_limits(limits)
                .error_values(error_values)
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
        let console = console_router(&config, &opened, &transport, &workers)?;
        let loops = standing(cron, relay, &mut opened, &transport)?;
        let routes = match transport.push.take() {
            Some(routes) => routes(&served(&workers))?,
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
        let probes = Arc::new(Probes::new(
            workers
                .iter()
                .map(|w| w.clone() as Arc<dyn Turning>)
                .collect(),
        ));
        let checks = tokio::spawn(endpoints::check_readiness(
            probes.clone(),
            opened.ping,
            transport.ready.take(),
            transport.depth.clone(),
            workers[0].queue().clone(),
            stopped.clone(),
        ));
        // The endpoints outlive the workers' drain: /readyz says 503 while it lasts.
        let (server_stop, server_stopped) = watch::channel(false);
        let server = tokio::spawn(endpoints::serve(
            listener,
            compose::allowed_hosts(&config)?,
            probes.clone(),
            routes,
            server_stopped,
        ));
        let mut standing: Vec<JoinHandle<()>> = loops
            .into_iter()
            .map(|start| tokio::spawn(start(stopped.clone())))
            .collect();
        if let Some(depth) = transport.depth.clone() {
            let queues = workers.iter().map(|w| w.queue().clone()).collect();
            standing.push(tokio::spawn(gauges::sample(depth, queues, stopped.clone())));
        }
        let mut running = Vec::with_capacity(workers.len());
        // A push transport's workers run from its routes; the others pull in a loop.
        for worker in workers.iter().filter(|w| w.pulls()) {
            let mut stopped = stopped.clone();
            let until = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            let probes = probes.clone();
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
            transport = %transport.transport,
            queues = ?workers.iter().map(|w| w.queue().to_string()).collect::<Vec<_>>(),
            concurrency,
            connections,
            http = %addr,
            "worker process started"
        );
        Ok(Running {
            addr,
            publisher: transport.publisher,
            stop,
            probes,
            workers: running,
            server,
            server_stop,
            checks,
            standing,
            store: opened.store,
        })
    }
}

/// Each worker's queue with what runs one of its deliveries, for a push transport's routes.
fn served<S: WorkStore + 'static>(workers: &[Arc<Worker<S>>]) -> Served
where
    S::Tx: Send,
{
    workers
        .iter()
        .map(|worker| {
            let queue = worker.queue().clone();
            let worker = worker.clone();
            let run: Run = Arc::new(move |delivery| {
                let worker = worker.clone();
                Box::pin(async move { worker.process(delivery).await })
            });
            (queue, run)
        })
        .collect()
}

/// The standing loops the configuration asks for ([`CRON`], [`OUTBOX_RELAY`]), refused
/// before anything starts when the store cannot feed them.
fn standing<S: ProcessStore>(
    cron: bool,
    relay: bool,
    opened: &mut Opened<S>,
    transport: &Transport<S>,
) -> Result<Vec<Standing>, ProcessError>
where
    S::Tx: Send,
{
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
            transport.publisher.clone(),
            Arc::new(SystemClock),
            jobs_cron::CatchUp::default(),
        )
        .map_err(|e| refused(&CRON, &e.to_string()))?;
        loops.push(Box::new(move |stop| {
            Box::pin(crate::standing::run_cron(scheduler, stop))
        }));
    }
    if relay {
        let Some(start) = opened.relay.take() else {
            return Err(refused(&OUTBOX_RELAY, "the outbox lives in PostgreSQL"));
        };
        loops.push(start(transport.publisher.clone()));
    }
    Ok(loops)
}

/// The operations console on the process's address, when [`CONSOLE_TOKENS`] is set: over the
/// process's store and transport, showing its workers' queues. Refused beside a push
/// transport, whose delivery routes the address serves.
fn console_router<S: ProcessStore>(
    config: &Config,
    opened: &Opened<S>,
    transport: &Transport<S>,
    workers: &[Arc<Worker<S>>],
) -> Result<Router, ProcessError>
where
    S::Tx: Send,
{
    let Some(list) = config.get(&CONSOLE_TOKENS) else {
        return Ok(Router::new());
    };
    if transport.push.is_some() {
        return Err(refused(
            &CONSOLE_TOKENS,
            "this process serves a push transport's deliveries on its address; run `jobsctl \
             console` beside it instead",
        ));
    }
    let tokens = ConsoleToken::parse_list(list).map_err(|e| refused(&CONSOLE_TOKENS, &e))?;
    let store: Arc<dyn DeadLetterStore> = Arc::new(opened.store.clone());
    let mut console = Console::new(store, transport.publisher.clone(), tokens)
        .bulk_runs(Arc::new(opened.store.clone()))
        .replay_rate(compose::console_replay_rate(config)?)
        .trusted_proxies(compose::console_trusted_proxies(config)?)
        .allowed_hosts(compose::allowed_hosts(config)?);
    if let Some(url) = compose::console_public_url(config)? {
        console = console.public_url(url);
    }
    if let Some(tenants) = &opened.tenants {
        console = console.tenants(tenants.clone());
    }
    if let Some(depth) = &transport.depth {
        let queues = workers.iter().map(|w| w.queue().clone()).collect();
        console = console.depth(depth.clone(), queues);
    }
    Ok(console.router())
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
        self.probes.stopping();
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

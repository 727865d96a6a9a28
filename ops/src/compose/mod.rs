//! The composition root: the adapters chosen by URL scheme from a [`Config`].
//!
//! This is the one module a downstream binary copies or calls. Library crates never read
//! configuration or the environment; they receive ports built here. The configuration itself
//! ([`Config`], the keys, their precedence) is [`crate::config`], re-exported here.
//!
//! | port | URL | adapter | feature |
//! | --- | --- | --- | --- |
//! | store | `sqlite://PATH` (or `sqlite:PATH`) | `SqliteStore`, the file created on first use | `sqlite` |
//! | store | `postgres://…`, `postgresql://…` | `PgStore` | `postgres` |
//! | queue | `memory:` | `MemoryQueue`, in this process only | |
//! | queue | `postgres-queue:` (the default when the store is PostgreSQL) | `PgQueue` over the store's own `core.jobs` | `postgres` |
//! | queue | `postgres-queue://…` (a `postgres://` URL with `-queue`) | `PgQueue` over `core.jobs` | `postgres` |
//! | queue | `vercel-queues://REGION` | `VercelQueues` from the `vercel_queues.*` keys; with `depth_url`, counted in Redis by `CountedQueue` | `vercel-queues` (and `redis` to count) |
//! | queue | `qstash:` or `qstash://REGION` | `QStashQueue` (publish only) from the `qstash.*` keys | `qstash` |
//! | rate limiter | `memory:` | `MemoryRateLimiter`, in this process only | |
//! | rate limiter | `redis://…`, `rediss://…` | `RedisRateLimiter` under `rate_limit_prefix` | `redis` |
//! | alerter | `console` | [`ConsoleAlerter`], one line per alert on standard error | |
//! | alerter | `betterstack` | `BetterStackAlerter` from the `betterstack.*` keys | `betterstack` |
//!
//! Each adapter's composition is a module of its own, built with the adapter's cargo feature
//! (`postgres.rs`, `sqlite.rs`, `redis.rs`, `vercel_queues.rs`, `qstash.rs`,
//! `betterstack.rs`); this module knows every scheme and asks the adapters this build has for
//! the one named, so a scheme whose feature is not built is refused with
//! [`ComposeError::NotBuilt`], naming the feature. Adding a transport is a module, its entry
//! in the registry of built adapters and its rows in the table of schemes. A grouped PostgreSQL worker takes its
//! store and queue from `postgres_worker` instead: one pool for both, sized for the worker.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use jobs_adapter_memory::{MemoryQueue, MemoryRateLimiter};
use jobs_core::{
    Alerter, BulkRuns, ConsumerPort, DeadLetterStore, ProcessedJobs, QueueDepth, QueuePort,
    RateLimiter, StoreError, SystemClock, TenantDirectory,
};
use thiserror::Error;

/// The default alerter, from the runtime crate.
pub use jobs_consumers::ConsoleAlerter;

#[doc(no_inline)]
pub use crate::config::*;

// One module per adapter, each built with its feature, with its entry in `BUILT` and its
// public functions re-exported here.
#[cfg(feature = "betterstack")]
mod betterstack;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{is_store_queue, postgres_worker};
#[cfg(feature = "qstash")]
mod qstash;
#[cfg(feature = "qstash")]
pub use qstash::{qstash_queue, qstash_signing_keys};
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "vercel-queues")]
mod vercel_queues;
#[cfg(feature = "vercel-queues")]
pub use vercel_queues::vercel_queues_of;

/// The adapters this build composes.
const BUILT: &[&Adapter] = &[
    #[cfg(feature = "betterstack")]
    &betterstack::ADAPTER,
    #[cfg(feature = "postgres")]
    &postgres::ADAPTER,
    #[cfg(feature = "qstash")]
    &qstash::ADAPTER,
    #[cfg(feature = "redis")]
    &redis::ADAPTER,
    #[cfg(feature = "sqlite")]
    &sqlite::ADAPTER,
    #[cfg(feature = "vercel-queues")]
    &vercel_queues::ADAPTER,
];

/// What one adapter composes: a connector for each port it stands behind, for the schemes
/// [`SCHEMES`] gives its feature.
struct Adapter {
    /// Its cargo feature.
    feature: &'static str,
    store: Option<ConnectStore>,
    queue: Option<ConnectQueue>,
    rate_limiter: Option<ConnectLimiter>,
    alerter: Option<ConnectAlerter>,
    /// Counts the depth of a transport that reports none ([`DEPTH_URL`]).
    depth: Option<CountDepth>,
}

/// Opens the store a URL names.
type ConnectStore = for<'a> fn(&'a Config, &'a str) -> BoxFuture<'a, Result<Store, ComposeError>>;
/// Builds the transport a URL names.
type ConnectQueue = for<'a> fn(&'a Config, &'a str) -> BoxFuture<'a, Result<Queue, ComposeError>>;
/// Builds the rate limiter a URL names.
type ConnectLimiter = fn(&Config, &str) -> Result<Arc<dyn RateLimiter>, ComposeError>;
/// Builds the alerter the configuration names.
type ConnectAlerter = fn(&Config) -> Result<Arc<dyn Alerter>, ComposeError>;
/// Counts, at a URL, what goes through a transport's two sides; the result is that
/// transport, of the given scheme, with a depth.
type CountDepth =
    fn(&str, &str, Arc<dyn QueuePort>, Arc<dyn ConsumerPort>) -> Result<Queue, ComposeError>;

/// What an adapter stands behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// [`Store`], from [`DATABASE_URL`].
    Store,
    /// [`Queue`], from [`QUEUE_URL`].
    Queue,
    /// [`rate_limiter`], from [`RATE_LIMIT_URL`].
    RateLimiter,
    /// [`alerter`], from [`ALERTER`] (a name rather than a URL).
    Alerter,
    /// The depth counted for a transport without one, from [`DEPTH_URL`].
    Depth,
}

/// One scheme this library composes (or an alerter's name), and the cargo feature of
/// `jobs-ops` that builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scheme {
    port: Port,
    /// What a value begins with, before its `:` (`postgres-queue`, `postgresql-queue`).
    names: &'static [&'static str],
    /// As messages list it (`postgres-queue://…`).
    shown: &'static str,
    /// The feature that builds it; `None` for the in-process defaults, always built.
    feature: Option<&'static str>,
}

impl Scheme {
    /// Whether this build composes it.
    fn is_built(&self) -> bool {
        self.feature
            .is_none_or(|feature| BUILT.iter().any(|adapter| adapter.feature == feature))
    }
}

/// Every scheme this library composes, whatever the build: one built without its feature is
/// refused, naming the feature.
const SCHEMES: &[Scheme] = &[
    scheme_of(Port::Store, &["sqlite"], "sqlite://PATH", Some("sqlite")),
    scheme_of(Port::Store, &["postgres"], "postgres://…", Some("postgres")),
    scheme_of(
        Port::Store,
        &["postgresql"],
        "postgresql://…",
        Some("postgres"),
    ),
    scheme_of(Port::Queue, &["memory"], "memory:", None),
    scheme_of(
        Port::Queue,
        &["postgres-queue", "postgresql-queue"],
        "postgres-queue://…",
        Some("postgres"),
    ),
    scheme_of(
        Port::Queue,
        &["vercel-queues"],
        "vercel-queues://REGION",
        Some("vercel-queues"),
    ),
    scheme_of(
        Port::Queue,
        &["qstash"],
        "qstash://[REGION]",
        Some("qstash"),
    ),
    scheme_of(Port::RateLimiter, &["memory"], "memory:", None),
    scheme_of(Port::RateLimiter, &["redis"], "redis://…", Some("redis")),
    scheme_of(Port::RateLimiter, &["rediss"], "rediss://…", Some("redis")),
    scheme_of(Port::Alerter, &["console"], "console", None),
    scheme_of(
        Port::Alerter,
        &["betterstack"],
        "betterstack",
        Some("betterstack"),
    ),
    scheme_of(Port::Depth, &["redis"], "redis://…", Some("redis")),
    scheme_of(Port::Depth, &["rediss"], "rediss://…", Some("redis")),
];

const fn scheme_of(
    port: Port,
    names: &'static [&'static str],
    shown: &'static str,
    feature: Option<&'static str>,
) -> Scheme {
    Scheme {
        port,
        names,
        shown,
        feature,
    }
}

/// Every queue URL scheme this library composes (a build refuses those whose adapter's
/// feature it leaves out, naming the feature).
pub const QUEUE_SCHEMES: &[&str] = &[
    "memory:",
    "postgres-queue://…",
    "vercel-queues://REGION",
    "qstash://[REGION]",
];
/// Every store URL scheme this library composes.
pub const STORE_SCHEMES: &[&str] = &["sqlite://PATH", "postgres://…", "postgresql://…"];
/// Every rate limiter URL scheme this library composes.
pub const RATE_LIMIT_SCHEMES: &[&str] = &["memory:", "redis://…", "rediss://…"];
/// Every alerter this library composes.
pub const ALERTERS: &[&str] = &["console", "betterstack"];

/// The scheme of a URL: what precedes the first `:` (`memory` for `memory:`).
pub fn scheme(url: &str) -> &str {
    url.split_once(':').map_or(url, |(scheme, _)| scheme)
}

/// The connector `connector` takes from the adapter behind `key`'s scheme for `port`:
/// `Ok(None)` for an in-process default (`memory:`, `console`), refused when the scheme is
/// unknown or its feature not built.
fn pick<T>(
    config: &Config,
    key: &Key,
    port: Port,
    connector: fn(&Adapter) -> Option<T>,
) -> Result<Option<T>, ComposeError> {
    pick_among(BUILT, config, key, port, connector)
}

/// [`pick`] among the adapters `built`.
fn pick_among<T>(
    built: &[&Adapter],
    config: &Config,
    key: &Key,
    port: Port,
    connector: fn(&Adapter) -> Option<T>,
) -> Result<Option<T>, ComposeError> {
    let value = config.require(key)?;
    let name = scheme(value);
    let Some(known) = SCHEMES
        .iter()
        .find(|s| s.port == port && s.names.contains(&name))
    else {
        return Err(unsupported(config, key, port));
    };
    let Some(feature) = known.feature else {
        return Ok(None);
    };
    built
        .iter()
        .filter(|adapter| adapter.feature == feature)
        .find_map(|adapter| connector(adapter))
        .map(Some)
        .ok_or_else(|| ComposeError::NotBuilt {
            key: key.describe(),
            scheme: name.to_owned(),
            feature: feature.to_owned(),
        })
}

/// [`ComposeError::Unsupported`] for the scheme of `key`'s value, listing what this build
/// accepts for `port`.
fn unsupported(config: &Config, key: &Key, port: Port) -> ComposeError {
    let value = config.get(key).unwrap_or_default();
    let accepted: Vec<&str> = SCHEMES
        .iter()
        .filter(|s| s.port == port && s.is_built())
        .map(|s| s.shown)
        .collect();
    ComposeError::Unsupported {
        key: key.describe(),
        scheme: scheme(value).to_owned(),
        source_of: config
            .setting(key)
            .map_or_else(|| "nothing".to_owned(), |s| s.source.to_string()),
        accepted: accepted.join(", "),
    }
}

/// A failure to compose: a configuration problem (the operator's to fix; `jobsctl` exits 2)
/// or a service that could not be reached.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// The URL's scheme names no adapter of this build.
    #[error("unsupported {key} scheme `{scheme}:` (set by {source_of}); accepted: {accepted}")]
    Unsupported {
        /// How the key is set.
        key: String,
        /// The scheme found.
        scheme: String,
        /// Where the value came from.
        source_of: String,
        /// The schemes this build accepts.
        accepted: String,
    },
    /// The URL's scheme names an adapter this build leaves out: its cargo feature is off.
    #[error(
        "{key} names `{scheme}:`, whose adapter this build leaves out: build jobs-ops with its \
         `{feature}` feature"
    )]
    NotBuilt {
        /// How the key is set.
        key: String,
        /// The scheme found.
        scheme: String,
        /// The `jobs-ops` feature that composes it.
        feature: String,
    },
    /// The configuration is missing a key or holds a value its key refuses.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be opened.
    #[error("opening the store: {0}")]
    Store(StoreError),
    /// The queue transport could not be reached or set up.
    #[error("opening the queue: {0}")]
    Queue(String),
    /// The BetterStack alerter refused its configuration.
    #[cfg(feature = "betterstack")]
    #[error("configuring the BetterStack alerter: {0}")]
    BetterStack(jobs_adapter_betterstack::BetterStackError),
}

impl ComposeError {
    /// Whether the operator's configuration is at fault (rather than a service being down).
    pub fn is_configuration(&self) -> bool {
        !matches!(self, ComposeError::Store(_) | ComposeError::Queue(_))
    }
}

/// A store chosen by URL. Its variants are the stores this build composes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Store {
    /// `sqlite://PATH`.
    #[cfg(feature = "sqlite")]
    Sqlite(jobs_adapter_sqlite::SqliteStore),
    /// `postgres://…`.
    #[cfg(feature = "postgres")]
    Postgres(jobs_adapter_postgres::PgStore),
}

/// What [`Store`] asks of the store it holds; each store's module implements it.
#[async_trait::async_trait]
trait Engine: Send + Sync {
    async fn migrate(&self) -> Result<(), StoreError>;
    fn dead_letters(&self) -> Arc<dyn DeadLetterStore>;
    fn bulk_runs(&self) -> Arc<dyn BulkRuns>;
    fn tenants(&self) -> Option<Arc<dyn TenantDirectory>>;
    fn processed(&self) -> Arc<dyn ProcessedJobs>;
}

impl Store {
    /// Connects to the store [`DATABASE_URL`] names (without migrating it).
    pub async fn connect(config: &Config) -> Result<Store, ComposeError> {
        let url = config.require(&DATABASE_URL)?;
        match pick(config, &DATABASE_URL, Port::Store, |a| a.store)? {
            Some(connect) => connect(config, url).await,
            // Every store is an adapter's.
            None => Err(unsupported(config, &DATABASE_URL, Port::Store)),
        }
    }

    /// The store as [`Engine`]: the one place that tells the variants apart.
    fn engine(&self) -> &dyn Engine {
        match *self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(ref store) => store,
            #[cfg(feature = "postgres")]
            Store::Postgres(ref store) => store,
        }
    }

    /// Applies the store's migrations; idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.engine().migrate().await
    }

    /// The dead-letter port.
    pub fn dead_letters(&self) -> Arc<dyn DeadLetterStore> {
        self.engine().dead_letters()
    }

    /// The journal of bulk dead-letter runs, shared by every `jobsctl` and console on the
    /// store.
    pub fn bulk_runs(&self) -> Arc<dyn BulkRuns> {
        self.engine().bulk_runs()
    }

    /// The tenants the cron fan-out reaches, when the store keeps them (`core.tenants` on
    /// PostgreSQL; SQLite keeps none).
    pub fn tenants(&self) -> Option<Arc<dyn TenantDirectory>> {
        self.engine().tenants()
    }

    /// The processed-jobs housekeeping port.
    pub fn processed(&self) -> Arc<dyn ProcessedJobs> {
        self.engine().processed()
    }
}

/// A queue transport chosen by URL, as the ports it offers.
#[derive(Clone)]
#[non_exhaustive]
pub struct Queue {
    /// The scheme it was chosen by (`memory`).
    pub scheme: String,
    /// Publishing.
    pub publisher: Arc<dyn QueuePort>,
    /// The pull side a worker drives; `None` for push transports (QStash calls an endpoint).
    pub consumer: Option<Arc<dyn ConsumerPort>>,
    /// Queue depth, when the engine reports it.
    pub depth: Option<Arc<dyn QueueDepth>>,
    /// Whether messages outlive this process (`false` for `memory:`: publishing from a
    /// one-shot command to it loses the message when the command exits).
    pub durable: bool,
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("scheme", &self.scheme)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// Builds the transport [`QUEUE_URL`] names: `memory:` here, any other by its adapter.
    pub async fn connect(config: &Config) -> Result<Queue, ComposeError> {
        let url = config.require(&QUEUE_URL)?;
        match pick(config, &QUEUE_URL, Port::Queue, |a| a.queue)? {
            Some(connect) => counted(config, connect(config, url).await?),
            None => {
                let memory = MemoryQueue::new(Arc::new(SystemClock))
                    .with_envelope_limits(envelope_limits(config)?);
                Ok(Queue::pull(scheme(url), memory, false))
            }
        }
    }

    /// A pull transport that reports depth: every port from the one `transport`.
    fn pull<T>(scheme: &str, transport: T, durable: bool) -> Queue
    where
        T: QueuePort + ConsumerPort + QueueDepth + Clone + 'static,
    {
        Queue {
            scheme: scheme.to_owned(),
            publisher: Arc::new(transport.clone()),
            consumer: Some(Arc::new(transport.clone())),
            depth: Some(Arc::new(transport)),
            durable,
        }
    }
}

/// `queue` counted where [`DEPTH_URL`] says, when it is a pull transport that reports no
/// depth (Vercel Queues); any other as it is. Publishers and workers must all go through the
/// count for it to hold.
fn counted(config: &Config, queue: Queue) -> Result<Queue, ComposeError> {
    let (Some(url), None, Some(consumer)) = (config.get(&DEPTH_URL), &queue.depth, &queue.consumer)
    else {
        return Ok(queue);
    };
    match pick(config, &DEPTH_URL, Port::Depth, |a| a.depth)? {
        Some(count) => count(
            url,
            &queue.scheme,
            queue.publisher.clone(),
            consumer.clone(),
        ),
        None => Err(unsupported(config, &DEPTH_URL, Port::Depth)),
    }
}

/// Builds the rate limiter [`RATE_LIMIT_URL`] names: `memory:` here, any other by its adapter
/// (Redis connects on first use).
pub fn rate_limiter(config: &Config) -> Result<Arc<dyn RateLimiter>, ComposeError> {
    let url = config.require(&RATE_LIMIT_URL)?;
    match pick(config, &RATE_LIMIT_URL, Port::RateLimiter, |a| {
        a.rate_limiter
    })? {
        Some(connect) => connect(config, url),
        None => Ok(Arc::new(MemoryRateLimiter::new(Arc::new(SystemClock)))),
    }
}

/// Builds the alerter [`ALERTER`] names: `console` here, any other by its adapter.
pub fn alerter(config: &Config) -> Result<Arc<dyn Alerter>, ComposeError> {
    match pick(config, &ALERTER, Port::Alerter, |a| a.alerter)? {
        Some(connect) => connect(config),
        None => Ok(Arc::new(ConsoleAlerter::default())),
    }
}

#[cfg(test)]
mod tests;

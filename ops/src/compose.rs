//! The composition root: configuration resolved from flags, the environment and `jobs.toml`,
//! and the adapters chosen from it by URL scheme.
//!
//! This is the one module a downstream binary copies or calls. Library crates never read
//! configuration or the environment; they receive ports built here.
//!
//! **Precedence:** a command-line flag, else the environment variable, else the key in the
//! configuration file (`--config PATH` / `JOBS_CONFIG`, else `./jobs.toml` when present), else
//! the default. [`KEYS`] lists every key.
//!
//! | port | URL | adapter |
//! | --- | --- | --- |
//! | store | `sqlite://PATH` (or `sqlite:PATH`) | [`SqliteStore`], the file created on first use |
//! | store | `postgres://…`, `postgresql://…` | [`PgStore`] |
//! | queue | `memory:` | [`MemoryQueue`], in this process only |
//! | queue | `postgres-queue://…` (a `postgres://` URL with `-queue`) | [`PgQueue`] over `core.jobs` |
//! | queue | `vercel-queues://REGION` | [`VercelQueues`] from the `vercel_queues.*` keys; with `depth_url`, counted in Redis by [`CountedQueue`] |
//! | queue | `qstash:` or `qstash://REGION` | [`QStashQueue`] (publish only) from the `qstash.*` keys |
//! | rate limiter | `memory:` | [`MemoryRateLimiter`], in this process only |
//! | rate limiter | `redis://…`, `rediss://…` | [`RedisRateLimiter`] under `rate_limit_prefix` |
//! | alerter | `console` | [`ConsoleAlerter`], one line per alert on standard error |
//! | alerter | `betterstack` | [`BetterStackAlerter`] from the `betterstack.*` keys |
//!
//! Adding a transport is one match arm in [`Queue::connect`] (and its scheme in
//! [`QUEUE_SCHEMES`]). A grouped PostgreSQL worker takes its store and queue from
//! [`postgres_worker`] instead: one pool for both, sized for the worker.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "betterstack")]
use jobs_adapter_betterstack::{BetterStackAlerter, BetterStackConfig, BetterStackError};
use jobs_adapter_memory::{MemoryQueue, MemoryRateLimiter};
#[cfg(feature = "postgres")]
use jobs_adapter_postgres::{PgQueue, PgStore};
#[cfg(feature = "qstash")]
use jobs_adapter_qstash::{Destination, QStashConfig, QStashQueue, SigningKeys};
#[cfg(feature = "redis")]
use jobs_adapter_redis::RedisRateLimiter;
#[cfg(all(feature = "redis", feature = "vercel-queues"))]
use jobs_adapter_redis::{CountedQueue, DEFAULT_HORIZON};
#[cfg(feature = "sqlite")]
use jobs_adapter_sqlite::SqliteStore;
#[cfg(feature = "vercel-queues")]
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};
#[cfg(feature = "postgres")]
use jobs_consumers::WorkerConfig;
use jobs_core::{
    Alerter, BulkRuns, ConsumerPort, DeadLetterStore, ProcessedJobs, QueueDepth, QueuePort,
    RateLimiter, StoreError, SystemClock, TenantDirectory,
};
use thiserror::Error;

#[doc(no_inline)]
pub use crate::config::*;

/// The queue URL schemes this build composes (the adapters' cargo features choose them).
pub const QUEUE_SCHEMES: &[&str] = &[
    "memory:",
    #[cfg(feature = "postgres")]
    "postgres-queue://…",
    #[cfg(feature = "vercel-queues")]
    "vercel-queues://REGION",
    #[cfg(feature = "qstash")]
    "qstash://[REGION]",
];
/// The store URL schemes this build composes.
pub const STORE_SCHEMES: &[&str] = &[
    #[cfg(feature = "sqlite")]
    "sqlite://PATH",
    #[cfg(feature = "postgres")]
    "postgres://…",
    #[cfg(feature = "postgres")]
    "postgresql://…",
];
/// The rate limiter URL schemes this build composes.
pub const RATE_LIMIT_SCHEMES: &[&str] = &[
    "memory:",
    #[cfg(feature = "redis")]
    "redis://…",
    #[cfg(feature = "redis")]
    "rediss://…",
];
/// The alerters this build composes.
pub const ALERTERS: &[&str] = &[
    "console",
    #[cfg(feature = "betterstack")]
    "betterstack",
];

/// The scheme of a URL: what precedes the first `:` (`memory` for `memory:`).
pub fn scheme(url: &str) -> &str {
    url.split_once(':').map_or(url, |(scheme, _)| scheme)
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
    /// A key the chosen adapter needs is not set.
    #[error("{key} is not set")]
    Missing {
        /// How the key is set.
        key: String,
    },
    /// A value is malformed.
    #[error("{key}: {message}")]
    Invalid {
        /// How the key is set.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value its key refuses, named with where it came from.
    #[error("{setting} {message}")]
    BadValue {
        /// The key and where its value came from.
        setting: String,
        /// What the key accepts, and why the value is not that.
        message: String,
    },
    /// The configuration file cannot be read or holds something unexpected.
    #[error("configuration file {}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The store could not be opened.
    #[error("opening the store: {0}")]
    Store(StoreError),
    /// The queue transport could not be reached or set up.
    #[error("opening the queue: {0}")]
    Queue(String),
    /// The BetterStack alerter refused its configuration.
    #[cfg(feature = "betterstack")]
    #[error("configuring the BetterStack alerter: {0}")]
    BetterStack(BetterStackError),
}

impl From<ConfigError> for ComposeError {
    fn from(e: ConfigError) -> Self {
        match e {
            ConfigError::Missing { key } => ComposeError::Missing { key },
            ConfigError::Invalid { key, message } => ComposeError::Invalid { key, message },
            ConfigError::File { path, message } => ComposeError::File { path, message },
            ConfigError::BadValue { setting, message } => {
                ComposeError::BadValue { setting, message }
            }
        }
    }
}

/// [`ComposeError::Unsupported`] for the scheme of `key`'s value, listing `accepted`.
fn unsupported(config: &Config, key: &Key, accepted: &'static [&'static str]) -> ComposeError {
    let value = config.get(key).unwrap_or_default();
    ComposeError::Unsupported {
        key: key.describe(),
        scheme: scheme(value).to_owned(),
        source_of: config
            .setting(key)
            .map_or_else(|| "nothing".to_owned(), |s| s.source.to_string()),
        accepted: accepted.join(", "),
    }
}

impl ComposeError {
    /// Whether the operator's configuration is at fault (rather than a service being down).
    pub fn is_configuration(&self) -> bool {
        !matches!(self, ComposeError::Store(_) | ComposeError::Queue(_))
    }
}

/// A store chosen by URL.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Store {
    /// `sqlite://PATH`.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// `postgres://…`.
    #[cfg(feature = "postgres")]
    Postgres(PgStore),
}

impl Store {
    /// Connects to the store [`DATABASE_URL`] names (without migrating it).
    pub async fn connect(config: &Config) -> Result<Store, ComposeError> {
        let url = config.require(&DATABASE_URL)?;
        match scheme(url) {
            #[cfg(feature = "sqlite")]
            "sqlite" => {
                let path = url
                    .strip_prefix("sqlite://")
                    .or_else(|| url.strip_prefix("sqlite:"))
                    .unwrap_or_default();
                if let Some(dir) = Path::new(path).parent() {
                    if !dir.as_os_str().is_empty() {
                        std::fs::create_dir_all(dir).map_err(|e| ComposeError::Invalid {
                            key: DATABASE_URL.describe(),
                            message: format!("creating {}: {e}", dir.display()),
                        })?;
                    }
                }
                let store = SqliteStore::open(path).await.map_err(ComposeError::Store)?;
                Ok(Store::Sqlite(store))
            }
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                let timeout = connect_timeout(config)?;
                let options = jobs_adapter_postgres::sqlx::postgres::PgPoolOptions::new();
                let store = PgStore::connect_with(url, options, timeout)
                    .await
                    .map_err(ComposeError::Store)?;
                Ok(Store::Postgres(store))
            }
            _ => Err(unsupported(config, &DATABASE_URL, STORE_SCHEMES)),
        }
    }

    /// Applies the store's migrations; idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => s.migrate().await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.migrate().await,
        }
    }

    /// The dead-letter port.
    pub fn dead_letters(&self) -> Arc<dyn DeadLetterStore> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Arc::new(s.clone()),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// The journal of bulk dead-letter runs, shared by every `jobsctl` and console on the
    /// store.
    pub fn bulk_runs(&self) -> Arc<dyn BulkRuns> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Arc::new(s.clone()),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// The tenants the cron fan-out reaches, when the store keeps them (`core.tenants` on
    /// PostgreSQL; SQLite keeps none).
    pub fn tenants(&self) -> Option<Arc<dyn TenantDirectory>> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => Some(Arc::new(jobs_adapter_postgres::PgTenantDirectory::new(
                s.pool().clone(),
            ))),
        }
    }

    /// The processed-jobs housekeeping port.
    pub fn processed(&self) -> Arc<dyn ProcessedJobs> {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => Arc::new(s.clone()),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => Arc::new(s.clone()),
        }
    }
}

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("jobs-ops composes a store: enable its `postgres` or `sqlite` feature");

/// The store and queue of a grouped PostgreSQL worker (`WorkerBuilder::grouped`): the
/// PostgreSQL queue in [`DATABASE_URL`]'s own database, on the store's pool, sized for
/// `worker` ([`WorkerConfig::connections`]: one connection per concurrent group, plus
/// fetching, settlements outside a transaction and the wake-up listener). The schema must be
/// migrated (`jobsctl migrate`).
#[cfg(feature = "postgres")]
pub async fn postgres_worker(
    config: &Config,
    worker: &WorkerConfig,
) -> Result<(PgStore, PgQueue), ComposeError> {
    let url = config.require(&DATABASE_URL)?;
    if !matches!(scheme(url), "postgres" | "postgresql") {
        return Err(unsupported(
            config,
            &DATABASE_URL,
            &["postgres://…", "postgresql://…"],
        ));
    }
    let store = PgStore::connect_sized(url, worker.connections())
        .await
        .map_err(ComposeError::Store)?;
    let queue = PgQueue::new(store.pool().clone());
    match queue.is_migrated().await {
        Ok(true) => Ok((store, queue)),
        Ok(false) => Err(ComposeError::Queue(
            "that database has no core.jobs table: run `jobsctl migrate` on it first".into(),
        )),
        Err(e) => Err(ComposeError::Queue(e.to_string())),
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
    /// Builds the transport [`QUEUE_URL`] names. One arm per scheme.
    pub async fn connect(config: &Config) -> Result<Queue, ComposeError> {
        let url = config.require(&QUEUE_URL)?;
        let scheme_of_url = scheme(url);
        match scheme_of_url {
            "memory" => {
                let memory = MemoryQueue::new(Arc::new(SystemClock));
                Ok(Queue::pull(scheme_of_url, memory, false))
            }
            #[cfg(feature = "postgres")]
            "postgres-queue" | "postgresql-queue" => {
                Ok(Queue::pull(scheme_of_url, pg_queue(url).await?, true))
            }
            #[cfg(feature = "vercel-queues")]
            "vercel-queues" => {
                let vercel = vercel_queues(config, url)?;
                #[cfg(feature = "redis")]
                if let Some(counted) = counted(config, &vercel)? {
                    return Ok(Queue::pull(scheme_of_url, counted, true));
                }
                // Counting needs Redis, which this build does not compose.
                #[cfg(not(feature = "redis"))]
                if config.get(&DEPTH_URL).is_some() {
                    return Err(unsupported(config, &DEPTH_URL, &[]));
                }
                Ok(Queue {
                    scheme: scheme_of_url.to_owned(),
                    publisher: Arc::new(vercel.clone()),
                    consumer: Some(Arc::new(vercel)),
                    depth: None,
                    durable: true,
                })
            }
            #[cfg(feature = "qstash")]
            "qstash" => {
                let qstash = qstash(config, url)?;
                Ok(Queue {
                    scheme: scheme_of_url.to_owned(),
                    publisher: Arc::new(qstash.clone()),
                    consumer: None,
                    depth: Some(Arc::new(qstash)),
                    durable: true,
                })
            }
            _ => Err(unsupported(config, &QUEUE_URL, QUEUE_SCHEMES)),
        }
    }
}

impl Queue {
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

/// What follows `scheme://` in `url`, refusing any other shape.
#[cfg(any(feature = "postgres", feature = "vercel-queues"))]
fn authority<'u>(url: &'u str, scheme: &str, shape: &str) -> Result<&'u str, ComposeError> {
    url.strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
        .ok_or_else(|| ComposeError::Invalid {
            key: QUEUE_URL.describe(),
            message: format!("expected {shape}"),
        })
}

/// `postgres-queue://…`: the PostgreSQL queue over `core.jobs` of the database the rest of the
/// URL names. Its table comes with the store's migrations (`jobsctl migrate` on that URL).
#[cfg(feature = "postgres")]
async fn pg_queue(url: &str) -> Result<PgQueue, ComposeError> {
    let shape = "postgres-queue://USER@HOST:PORT/DB";
    let rest = authority(url, "postgres-queue", shape)
        .or_else(|_| authority(url, "postgresql-queue", shape))?;
    let store = PgStore::connect(&format!("postgres://{rest}"))
        .await
        .map_err(|e| ComposeError::Queue(e.to_string()))?;
    let queue = PgQueue::new(store.pool().clone());
    match queue.is_migrated().await {
        Ok(true) => Ok(queue),
        Ok(false) => Err(ComposeError::Queue(
            "that database has no core.jobs table: run `jobsctl migrate --database-url \
             postgres://…` on the same database first"
                .into(),
        )),
        Err(e) => Err(ComposeError::Queue(e.to_string())),
    }
}

/// `transport` counted in the Redis [`DEPTH_URL`] names (keys `jobs:depth:<queue>`), or
/// `None` when it is not set. Publishers and workers must all go through the count for it to
/// hold; a count that misses an ack is repaired after [`DEFAULT_HORIZON`].
#[cfg(all(feature = "vercel-queues", feature = "redis"))]
fn counted(
    config: &Config,
    transport: &VercelQueues,
) -> Result<Option<CountedQueue>, ComposeError> {
    let Some(url) = config.get(&DEPTH_URL) else {
        return Ok(None);
    };
    if !matches!(scheme(url), "redis" | "rediss") {
        return Err(unsupported(
            config,
            &DEPTH_URL,
            &["redis://…", "rediss://…"],
        ));
    }
    let client =
        jobs_adapter_redis::redis::Client::open(url).map_err(|e| ComposeError::Invalid {
            key: DEPTH_URL.describe(),
            message: e.to_string(),
        })?;
    Ok(Some(CountedQueue::new(
        Arc::new(transport.clone()),
        Arc::new(transport.clone()),
        client,
        "jobs",
        DEFAULT_HORIZON,
    )))
}

/// `vercel-queues://REGION`, the token from [`VERCEL_QUEUES_TOKEN`].
#[cfg(feature = "vercel-queues")]
fn vercel_queues(config: &Config, url: &str) -> Result<VercelQueues, ComposeError> {
    let invalid = |key: &Key, e: &dyn fmt::Display| ComposeError::Invalid {
        key: key.describe(),
        message: e.to_string(),
    };
    let region = authority(
        url,
        "vercel-queues",
        "vercel-queues://REGION, e.g. vercel-queues://iad1",
    )?;
    let region = Region::new(region.trim_end_matches('/')).map_err(|e| invalid(&QUEUE_URL, &e))?;
    let token = StaticToken::new(config.require(&VERCEL_QUEUES_TOKEN)?);
    let mut settings = VercelQueuesConfig::new(region, token)
        .consumer_group(config.require(&VERCEL_QUEUES_CONSUMER_GROUP)?)
        .map_err(|e| invalid(&VERCEL_QUEUES_CONSUMER_GROUP, &e))?;
    if let Some(base) = config.get(&VERCEL_QUEUES_BASE_URL) {
        settings = settings
            .base_url_override(base)
            .map_err(|e| invalid(&VERCEL_QUEUES_BASE_URL, &e))?;
    }
    if let Some(id) = config.get(&VERCEL_DEPLOYMENT_ID) {
        settings = settings.deployment_id(id);
    }
    if config.get(&VERCEL_QUEUES_TRUST_PUSHED) == Some("on") {
        settings = settings.trust_pushed_payload();
    }
    VercelQueues::new(settings).map_err(|e| invalid(&QUEUE_URL, &e))
}

/// `qstash:` (the global endpoint) or `qstash://REGION` (`eu-central-1`, `us-east-1`), the
/// token from [`QSTASH_TOKEN`], every queue delivered to [`QSTASH_DESTINATION`].
#[cfg(feature = "qstash")]
fn qstash(config: &Config, url: &str) -> Result<QStashQueue, ComposeError> {
    let invalid = |key: &Key, message: String| ComposeError::Invalid {
        key: key.describe(),
        message,
    };
    let region = url
        .strip_prefix("qstash:")
        .map(|rest| rest.trim_start_matches("//").trim_end_matches('/'))
        .unwrap_or_default();
    if !region
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(invalid(
            &QUEUE_URL,
            format!("`{region}` is not a QStash region such as eu-central-1 or us-east-1"),
        ));
    }
    let base_url = match (config.get(&QSTASH_BASE_URL), region) {
        (Some(base), _) => base.to_owned(),
        (None, "") => jobs_adapter_qstash::DEFAULT_BASE_URL.to_owned(),
        (None, region) => format!("https://qstash-{region}.upstash.io"),
    };
    let settings = QStashConfig::new(config.require(&QSTASH_TOKEN)?)
        .with_base_url(base_url)
        .with_destination_template(Destination::new(config.require(&QSTASH_DESTINATION)?))
        .map_err(|e| invalid(&QSTASH_DESTINATION, e.to_string()))?;
    QStashQueue::new(settings).map_err(|e| invalid(&QUEUE_URL, e.to_string()))
}

/// answers its callbacks with it).
#[cfg(feature = "vercel-queues")]
pub fn vercel_queues_of(config: &Config) -> Result<VercelQueues, ComposeError> {
    vercel_queues(config, config.require(&QUEUE_URL)?)
}

/// The QStash transport [`QUEUE_URL`] names (`qstash:` or `qstash://REGION`), as its own
/// type: a worker process also needs it to republish deferrals.
#[cfg(feature = "qstash")]
pub fn qstash_queue(config: &Config) -> Result<QStashQueue, ComposeError> {
    qstash(config, config.require(&QUEUE_URL)?)
}

/// The keys QStash signs deliveries with, from [`QSTASH_CURRENT_SIGNING_KEY`] and
/// [`QSTASH_NEXT_SIGNING_KEY`]; both are needed, as a rotation may be under way.
#[cfg(feature = "qstash")]
pub fn qstash_signing_keys(config: &Config) -> Result<SigningKeys, ComposeError> {
    Ok(SigningKeys::new(
        config.require(&QSTASH_CURRENT_SIGNING_KEY)?,
        config.require(&QSTASH_NEXT_SIGNING_KEY)?,
    ))
}

/// Builds the rate limiter [`RATE_LIMIT_URL`] names (Redis connects on first use).
pub fn rate_limiter(config: &Config) -> Result<Arc<dyn RateLimiter>, ComposeError> {
    let url = config.require(&RATE_LIMIT_URL)?;
    match scheme(url) {
        "memory" => Ok(Arc::new(MemoryRateLimiter::new(Arc::new(SystemClock)))),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let prefix = config.require(&RATE_LIMIT_PREFIX)?;
            let limiter =
                RedisRateLimiter::new(url, prefix).map_err(|e| ComposeError::Invalid {
                    key: RATE_LIMIT_URL.describe(),
                    message: e.to_string(),
                })?;
            Ok(Arc::new(limiter))
        }
        _ => Err(unsupported(config, &RATE_LIMIT_URL, RATE_LIMIT_SCHEMES)),
    }
}

/// Builds the alerter [`ALERTER`] names.
pub fn alerter(config: &Config) -> Result<Arc<dyn Alerter>, ComposeError> {
    match config.require(&ALERTER)? {
        "console" => Ok(Arc::new(ConsoleAlerter::default())),
        #[cfg(feature = "betterstack")]
        "betterstack" => {
            let settings = BetterStackConfig::new(
                config.require(&BETTERSTACK_TOKEN)?,
                config.require(&BETTERSTACK_REQUESTER_EMAIL)?,
            )
            .with_base_url(config.require(&BETTERSTACK_BASE_URL)?);
            Ok(Arc::new(
                BetterStackAlerter::new(settings).map_err(ComposeError::BetterStack)?,
            ))
        }
        other => Err(ComposeError::Unsupported {
            key: ALERTER.describe(),
            scheme: other.to_owned(),
            source_of: config
                .setting(&ALERTER)
                .map_or_else(String::new, |s| s.source.to_string()),
            accepted: ALERTERS.join(", "),
        }),
    }
}

/// The default alerter, from the runtime crate.
pub use jobs_consumers::ConsoleAlerter;

#[cfg(all(test, feature = "jobsctl"))]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn defaults_copied_from_adapters_match_them() {
        assert_eq!(
            BETTERSTACK_BASE_URL.default,
            Some(jobs_adapter_betterstack::DEFAULT_BASE_URL)
        );
        assert_eq!(
            VERCEL_QUEUES_CONSUMER_GROUP.default,
            Some(jobs_adapter_vercel_queues::DEFAULT_CONSUMER_GROUP)
        );
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn an_alerter_missing_its_token_names_the_variable() {
        let env = env_of(&[
            ("JOBS_ALERTER", "betterstack"),
            ("BETTERSTACK_REQUESTER_EMAIL", "a@b.c"),
        ]);
        let config = Config::resolve(&BTreeMap::new(), &env, &ConfigFile::None).expect("resolves");
        let missing = alerter(&config).err().expect("no token");
        assert!(
            missing.to_string().contains("BETTERSTACK_TOKEN"),
            "{missing}"
        );
    }
    #[tokio::test]
    async fn unsupported_schemes_name_the_flag_the_source_and_the_accepted_schemes() {
        let flags = BTreeMap::from([
            ("--queue-url", "kafka://broker:9092".to_owned()),
            ("--database-url", "mysql://x".to_owned()),
            ("--rate-limit-url", "memcached://x".to_owned()),
        ]);
        let config = Config::resolve(&flags, &env_of(&[]), &ConfigFile::None).expect("resolves");
        let queue = Queue::connect(&config).await.expect_err("no kafka here");
        assert_eq!(
            queue.to_string(),
            "unsupported --queue-url (JOBS_QUEUE_URL, queue_url in jobs.toml) scheme `kafka:` \
             (set by flag); accepted: memory:, postgres-queue://…, vercel-queues://REGION, \
             qstash://[REGION]"
        );
        assert!(queue.is_configuration());
        let store = Store::connect(&config).await.expect_err("no mysql");
        assert!(store.to_string().contains("--database-url"), "{store}");
        assert!(
            !store.to_string().contains("mysql://x"),
            "only the scheme is shown"
        );
        let limiter = rate_limiter(&config).err().expect("no memcached");
        assert!(limiter.to_string().contains("redis://"), "{limiter}");
    }

    #[tokio::test]
    async fn durable_transports_refuse_malformed_urls_and_missing_settings_by_name() {
        let with = |url: &str, env: &[(&str, &str)]| {
            let flags = BTreeMap::from([("--queue-url", url.to_owned())]);
            Config::resolve(&flags, &env_of(env), &ConfigFile::None).expect("resolves")
        };
        let failure = |config: Config| async move {
            let err = Queue::connect(&config).await.expect_err("refused");
            assert!(err.is_configuration(), "{err}");
            err.to_string()
        };
        let shape = failure(with("postgres-queue:db", &[])).await;
        assert!(
            shape.contains("postgres-queue://USER@HOST:PORT/DB"),
            "{shape}"
        );
        let region = failure(with("vercel-queues://Mars!", &[("VERCEL_OIDC_TOKEN", "t")])).await;
        assert!(region.contains("--queue-url"), "{region}");
        let token = failure(with("vercel-queues://iad1", &[])).await;
        assert!(token.contains("VERCEL_OIDC_TOKEN"), "{token}");
        let qstash_region = failure(with("qstash://EU!", &[("QSTASH_TOKEN", "t")])).await;
        assert!(
            qstash_region.contains("not a QStash region"),
            "{qstash_region}"
        );
        let destination = failure(with("qstash:", &[("QSTASH_TOKEN", "t")])).await;
        assert!(destination.contains("QSTASH_DESTINATION"), "{destination}");

        let vercel = Queue::connect(&with("vercel-queues://iad1", &[("VERCEL_OIDC_TOKEN", "t")]))
            .await
            .expect("composes without a request");
        assert!(vercel.durable && vercel.consumer.is_some() && vercel.depth.is_none());
        let qstash = Queue::connect(&with(
            "qstash://eu-central-1",
            &[
                ("QSTASH_TOKEN", "t"),
                ("QSTASH_DESTINATION", "https://app.example.com/q/{queue}"),
            ],
        ))
        .await
        .expect("composes without a request");
        assert!(qstash.durable && qstash.consumer.is_none(), "QStash pushes");
    }

    #[tokio::test]
    async fn the_defaults_compose_in_process_adapters() {
        let config =
            Config::resolve(&BTreeMap::new(), &env_of(&[]), &ConfigFile::None).expect("resolves");
        let queue = Queue::connect(&config).await.expect("memory");
        assert!(!queue.durable && queue.depth.is_some() && queue.consumer.is_some());
        rate_limiter(&config).expect("memory limiter");
        alerter(&config).expect("console");
        let redis = Config::resolve(
            &BTreeMap::from([("--rate-limit-url", "redis://127.0.0.1:6379".to_owned())]),
            &env_of(&[]),
            &ConfigFile::None,
        )
        .expect("resolves");
        rate_limiter(&redis).expect("Redis connects on first use");
    }
}

//! The PostgreSQL store of softcrum-jobs: `core.processed_jobs` claimed inside the work
//! transaction, `core.dead_letters`, and the journal of bulk runs over them.
//!
//! [`PgStore`] implements [`WorkStore`], [`ProcessedJobs`], [`DeadLetterStore`](jobs_core::DeadLetterStore)
//! and [`BulkRuns`](jobs_core::BulkRuns) (`core.bulk_runs`, `core.bulk_run_items`). A work
//! transaction, [`PgWorkTx`], is a real PostgreSQL transaction: the handler writes its business
//! rows through [`PgWorkTx::conn`], and those rows commit or roll back together with the claim
//! of `(job_id, consumer)`. That is what makes a redelivered job a no-op rather than a second
//! effect.
//!
//! The schema is created by [`PgStore::migrate`], from the migrations embedded in this crate
//! (tracked by sqlx in `_sqlx_migrations`); it is never run implicitly, so deployments choose
//! when their schema changes. See ADR 0004 for the schema and why pending dead letters are
//! deduplicated.
//!
//! With the feature `queue`, the crate is also a transport (ADR 0011): [`PgQueue`] implements
//! `QueuePort`, `PullPort`, `SettlePort` and `QueueDepth` over `core.jobs` (batches fetched with
//! `FOR UPDATE SKIP LOCKED`, leases fenced by a generation, delete on ack), with
//! [`PgQueue::publish_in`] joining the caller's transaction, and `SettleInTransaction` for
//! [`PgStore`], so a grouped worker holds, runs and settles many jobs in one work transaction;
//! [`Outbox`] / [`OutboxRelay`] publish atomically with a business write to any other transport.
//! The feature's tables are created by the same migrations.
//!
//! Errors are classified for the runtime: connection, pool and I/O failures, serialization
//! failures, deadlocks and server shutdowns are [`StoreError::Unavailable`] (retry later);
//! everything else is [`StoreError::Failed`]. The sqlx error is kept as the source.
//!
//! ```no_run
//! use jobs_adapter_postgres::PgStore;
//! use jobs_core::{WorkStore, WorkTransaction, Claim, JobId, ConsumerName};
//! use std::time::{Duration, SystemTime};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/app").await?;
//! store.migrate().await?;
//! let consumer: ConsumerName = "billing.invoice_mailer".parse()?;
//! let mut tx = store.begin().await?;
//! if tx.claim(JobId::generate(), &consumer, SystemTime::now()).await? == Claim::Claimed {
//!     sqlx::query("select 1").execute(tx.conn()).await?; // the handler's writes
//! }
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```

mod bulk_runs;
mod convert;
mod dead_letters;
mod error;
#[cfg(feature = "queue")]
mod fair;
#[cfg(feature = "queue")]
mod mark;
#[cfg(feature = "queue")]
mod outbox;
#[cfg(feature = "queue")]
mod oversized;
mod partitions;
mod processed;
#[cfg(feature = "queue")]
mod queue;
#[cfg(feature = "queue")]
mod rows;
mod snapshots;
mod tenants;
#[cfg(feature = "test-util")]
pub mod test_util;
mod tx;

pub use error::error_class;
#[cfg(feature = "queue")]
pub use outbox::{Outbox, OutboxRelay};
pub use partitions::{
    MonthlyPartition, PartitionError, PartitionPrecreation, precreate_monthly_partitions,
};
#[cfg(feature = "queue")]
pub use queue::{LEASE_STATEMENT, NewJob, PgQueue, Wake, Wakeups};
pub use snapshots::{SnapshotHolder, oldest_snapshot};
/// The sqlx this crate is built with, sqlx 0.9: handlers write through [`PgWorkTx::conn`]
/// with it, so they need the same version (this re-export, or `sqlx = "0.9"` of their own).
pub use sqlx;
use std::time::Duration;
pub use tenants::PgTenantDirectory;
pub use tx::PgWorkTx;

use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{ConsumerName, JobId, ProcessedJobs, StoreError, WorkStore};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgPool};

use crate::error::store_error;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long [`PgStore::connect`] waits for the server's first answer: long enough for a
/// server across a region, short enough that a wrong host fails before an operator wonders.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The PostgreSQL store over a connection pool; clones share the pool.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects a pool with sqlx's default settings, after one connection made within
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    ///
    /// An unreachable server is [`StoreError::Unavailable`], naming its host, port and the
    /// cause (`Connection refused`, or no answer within the timeout); a malformed URL or
    /// refused credentials are [`StoreError::Failed`]. To size the pool or its timeouts,
    /// build a [`PgPool`] yourself and use [`PgStore::from_pool`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, PgPoolOptions::new(), DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects a pool of at most `connections` connections ([`PgStore::pool_options`]) as
    /// [`connect`](Self::connect) does: for a worker whose queue shares the pool,
    /// `WorkerConfig::connections` in `jobs-consumers` says how many it needs.
    pub async fn connect_sized(url: &str, connections: u32) -> Result<Self, StoreError> {
        Self::connect_with(
            url,
            Self::pool_options(connections),
            DEFAULT_CONNECT_TIMEOUT,
        )
        .await
    }

    /// A pool built by `options`, after one connection made within `timeout`, so that a
    /// server that cannot be reached fails fast with its cause rather than after the pool's
    /// acquire timeout with "pool timed out".
    pub async fn connect_with(
        url: &str,
        options: PgPoolOptions,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let target: PgConnectOptions = url
            .parse()
            .map_err(|e| store_error("read the PostgreSQL URL", e))?;
        let at = format!(
            "connect to PostgreSQL at {}:{}",
            target.get_host(),
            target.get_port()
        );
        match tokio::time::timeout(timeout, PgConnection::connect_with(&target)).await {
            Err(_) => {
                return Err(StoreError::unavailable(format!(
                    "{at}: no answer within {timeout:?}"
                )));
            }
            Ok(Err(e)) => return Err(store_error(&at, e)),
            Ok(Ok(first)) => {
                // Only a probe: the pool makes its own.
                let _ = first.close().await;
            }
        }
        let pool = options
            .connect_with(target)
            .await
            .map_err(|e| store_error(&at, e))?;
        Ok(PgStore { pool })
    }

    /// The options of a worker's pool ([`connect_sized`](Self::connect_sized) uses them): at
    /// most `connections`, and no ping before every acquire, which sqlx does by default and
    /// which costs a grouped worker a round trip per group (about a fifth of the no-op
    /// shape's). A connection that broke since its last use fails the statement that uses
    /// it, as a ping would have, and sqlx drops it: a failed `begin` defers its jobs without
    /// spending an attempt.
    pub fn pool_options(connections: u32) -> sqlx::postgres::PgPoolOptions {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections)
            .test_before_acquire(false)
    }

    /// A store over an existing pool, e.g. the application's own, so handlers' tables and the
    /// store's live in one database and commit in one transaction.
    pub fn from_pool(pool: PgPool) -> Self {
        PgStore { pool }
    }

    /// The pool, for the application's own queries outside work transactions.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates or updates the `core` schema: `core.processed_jobs` and `core.dead_letters`.
    ///
    /// Idempotent: sqlx records applied migrations in `_sqlx_migrations` and takes an advisory
    /// lock, so concurrent or repeated calls are safe. Never called implicitly.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            MigrateError::Execute(e) => store_error("migrate the core schema", e),
            other => StoreError::Failed {
                message: format!("migrate the core schema: {other}"),
                source: Some(Box::new(other)),
            },
        })?;
        tracing::debug!("core schema migrated");
        Ok(())
    }
}

#[async_trait]
impl WorkStore for PgStore {
    type Tx = PgWorkTx;

    /// Opens a `READ COMMITTED` transaction: a concurrent claim of the same job blocks on the
    /// unique key until this one ends. A pool that does not ping before each acquire
    /// ([`PgStore::pool_options`]) can hand out an idle connection the server has closed
    /// since: its `BEGIN` fails, and another connection is tried, at most as many times as
    /// the pool holds connections, so that a server restart costs no job a deferral.
    async fn begin(&self) -> Result<PgWorkTx, StoreError> {
        self.begin_with(None).await
    }

    async fn begin_within(&self, limit: Duration) -> Result<PgWorkTx, StoreError> {
        // PostgreSQL takes at most i32::MAX ms; 0 would turn the timeout off.
        let ms = limit.as_millis().clamp(1, i32::MAX as u128);
        self.begin_with(Some(format!("BEGIN; SET LOCAL statement_timeout = {ms}")))
            .await
    }
}

impl PgStore {
    /// A work transaction begun by `statement` (`BEGIN` when none), on another pooled
    /// connection when the server closed the one it was given.
    async fn begin_with(&self, statement: Option<String>) -> Result<PgWorkTx, StoreError> {
        let mut tries = self.pool.size().saturating_add(1);
        loop {
            let begun = match &statement {
                None => self.pool.begin().await,
                // `BEGIN` and a formatted number (`begin_within`): no input in the text.
                Some(statement) => self.pool.begin_with(AssertSqlSafe(statement.clone())).await,
            };
            match begun {
                Ok(tx) => return Ok(PgWorkTx::new(tx)),
                Err(e) if tries > 1 && error::is_broken_connection(&e) => {
                    tracing::debug!(error = %e, "a pooled connection was closed; trying another");
                    tries -= 1;
                }
                Err(e) => return Err(store_error("begin a work transaction", e)),
            }
        }
    }
}

/// [`ProcessedJobs::is_processed`]'s read of the job's slice: `$1` the job id, `$2` the
/// consumer.
static IS_PROCESSED: processed::PerSlice = processed::PerSlice::new(|table, slot| {
    format!(
        "select exists (select 1 from {table} \
         where job_id = $1 and consumer = $2 and slot = {})",
        slot("$1")
    )
});

#[async_trait]
impl ProcessedJobs for PgStore {
    async fn is_processed(
        &self,
        job_id: JobId,
        consumer: &ConsumerName,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(IS_PROCESSED.get(Some(processed::slot(job_id.as_uuid()))))
            .bind(job_id.as_uuid())
            .bind(consumer.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| store_error("read core.processed_jobs", e))
    }

    /// Bounded `DELETE`s slice by slice, so no call holds locks on more than `batch` rows.
    async fn purge_processed(&self, older_than: SystemTime, batch: u32) -> Result<u64, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| store_error("purge core.processed_jobs", e))?;
        processed::purge_batch(&mut conn, older_than, batch).await
    }

    /// Truncates each slice whose claims expired, putting back the ones it keeps (ADR 0014).
    async fn purge_expired_slices(&self, older_than: SystemTime) -> Result<u64, StoreError> {
        processed::purge_expired_slices(&self.pool, older_than).await
    }

    /// A day: the claims of the day the cutoff falls in go with their slice the next day.
    fn slice_span(&self) -> Duration {
        processed::SLICE_SPAN
    }
}

//! The SQLite store of softcrum-jobs, the embedded default: `processed_jobs` claimed inside the
//! work transaction, and `dead_letters`, in one local file.
//!
//! [`SqliteStore`] implements [`WorkStore`], [`ProcessedJobs`], [`DeadLetterStore`](jobs_core::DeadLetterStore)
//! and [`BulkRuns`](jobs_core::BulkRuns) (`bulk_runs`, `bulk_run_items`) with the semantics of
//! the PostgreSQL store. SQLite has no schemas, so the standard's
//! `core.processed_jobs` and `core.dead_letters` are the tables `processed_jobs` and
//! `dead_letters`; UUIDs are stored as lower-case TEXT, times as INTEGER Unix milliseconds
//! (finer digits are dropped), payloads as BLOBs. See ADR 0005.
//!
//! SQLite has one writer at a time. A work transaction, [`SqliteWorkTx`], starts with
//! `BEGIN IMMEDIATE`, taking the write lock up front: a second work transaction waits in
//! `begin` (up to the busy timeout, [`BUSY_TIMEOUT`]) instead of failing later when a read lock
//! cannot be upgraded. Reads are not blocked (WAL mode). A handler's writes through
//! [`SqliteWorkTx::conn`] commit or roll back together with the claim.
//!
//! Errors are classified for the runtime: `SQLITE_BUSY`/`SQLITE_LOCKED` (the busy timeout ran
//! out), pool and I/O failures are [`StoreError::Unavailable`] (retry later); everything else is
//! [`StoreError::Failed`]. The sqlx error is kept as the source.
//!
//! ```no_run
//! use jobs_adapter_sqlite::SqliteStore;
//! use jobs_core::{Claim, ConsumerName, JobId, WorkStore, WorkTransaction};
//! use std::time::SystemTime;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open("jobs.db").await?; // created on first use
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
mod tx;

/// The sqlx this crate is built with, sqlx 0.9: handlers write through [`SqliteWorkTx::conn`]
/// with it, so they need the same version (this re-export, or `sqlx = "0.9"` of their own).
pub use sqlx;
pub use tx::SqliteWorkTx;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{ConsumerName, JobId, ProcessedJobs, StoreError, WorkStore};
use sqlx::SqlitePool;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::convert::to_millis;
use crate::error::store_error;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long [`SqliteStore::open`]'s connections wait for a lock held by another connection
/// before giving up with `SQLITE_BUSY` ([`StoreError::Unavailable`]).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections of [`SqliteStore::open`]'s pool: one writer at a time, the others read.
pub const MAX_CONNECTIONS: u32 = 4;

/// The SQLite store over a connection pool; clones share the pool.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// One work transaction at a time in this process, taken before a connection: a
    /// transaction waiting for SQLite's write lock would otherwise hold a pool connection
    /// while it waits, and a handler that reads through the pool while holding the lock could
    /// find every connection held by such waiters until their busy timeouts ran out.
    writer: Arc<tokio::sync::Semaphore>,
}

impl SqliteStore {
    /// Opens the database file at `path`, creating it on first use, in WAL mode with a busy
    /// timeout of [`BUSY_TIMEOUT`], foreign keys on and `synchronous = FULL` (a commit is on
    /// disk before the message is acked).
    ///
    /// A file that cannot be opened or created (missing directory, not a database) is
    /// [`StoreError::Failed`]. For other settings, build a pool and use
    /// [`SqliteStore::from_pool`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .connect_with(options)
            .await
            .map_err(|e| store_error(&format!("open SQLite database {}", path.display()), e))?;
        Ok(SqliteStore::from_pool(pool))
    }

    /// A store over an existing pool, e.g. the application's own, so handlers' tables and the
    /// store's live in one file and commit in one transaction. The pool needs at least two
    /// connections (reads while a work transaction is open), and a busy timeout.
    pub fn from_pool(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            writer: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// The pool, for the application's own queries outside work transactions.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates or updates the tables `processed_jobs` and `dead_letters`.
    ///
    /// Idempotent: sqlx records applied migrations in `_sqlx_migrations`, so repeated calls are
    /// safe. Never called implicitly.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            MigrateError::Execute(e) => store_error("migrate the SQLite store", e),
            other => StoreError::Failed {
                message: format!("migrate the SQLite store: {other}"),
                source: Some(Box::new(other)),
            },
        })?;
        tracing::debug!("SQLite store migrated");
        Ok(())
    }
}

#[async_trait]
impl WorkStore for SqliteStore {
    type Tx = SqliteWorkTx;

    /// `BEGIN IMMEDIATE`: waits for the write lock (up to the busy timeout) while another work
    /// transaction is open, so claims never race.
    async fn begin(&self) -> Result<SqliteWorkTx, StoreError> {
        let writer = self
            .writer
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::failed("the store is closed"))?;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| store_error("begin a work transaction", e))?;
        Ok(SqliteWorkTx::new(tx, writer))
    }
}

/// One bounded batch of the TTL cleanup: `?1` the cutoff in milliseconds, `?2` the batch. A
/// claim whose job waits in the dead letters is kept, however old (replaying the letter
/// releases it).
pub(crate) const PURGE_PROCESSED: &str = "delete from processed_jobs where rowid in ( \
    select p.rowid from processed_jobs p where p.processed_at < ?1 \
    and not exists (select 1 from dead_letters d where d.job_id = p.job_id \
        and d.consumer = p.consumer and d.status = 'pending_review') \
    limit ?2)";

#[async_trait]
impl ProcessedJobs for SqliteStore {
    async fn is_processed(
        &self,
        job_id: JobId,
        consumer: &ConsumerName,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "select exists (select 1 from processed_jobs where job_id = ?1 and consumer = ?2)",
        )
        .bind(job_id.to_string())
        .bind(consumer.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| store_error("read processed_jobs", e))
    }

    /// One bounded `DELETE` by rowid; rows are compared at millisecond precision.
    async fn purge_processed(&self, older_than: SystemTime, batch: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(PURGE_PROCESSED)
            .bind(to_millis(older_than)?)
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await
            .map_err(|e| store_error("purge processed_jobs", e))?;
        Ok(done.rows_affected())
    }
}

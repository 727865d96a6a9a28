//! The work transaction.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{Claim, ConsumerName, JobId, NewDeadLetter, Recorded, StoreError, WorkTransaction};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::convert::to_millis;
use crate::error::store_error;

/// A work transaction on SQLite (`BEGIN IMMEDIATE`): the claim in `processed_jobs` and the
/// handler's own writes, made through [`SqliteWorkTx::conn`], commit or roll back together.
///
/// It holds the database's write lock until it ends, so keep handlers short. Dropping it
/// without [`commit`](WorkTransaction::commit) rolls it back. It dereferences to the
/// [`SqliteConnection`] as well, so `&mut *tx` is an executor too.
pub struct SqliteWorkTx {
    tx: Transaction<'static, Sqlite>,
    /// The store's one writer in this process, released when the transaction ends.
    _writer: tokio::sync::OwnedSemaphorePermit,
}

impl SqliteWorkTx {
    pub(crate) fn new(
        tx: Transaction<'static, Sqlite>,
        writer: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        SqliteWorkTx {
            tx,
            _writer: writer,
        }
    }

    /// The transaction's connection: a handler's queries run on it, inside the work
    /// transaction.
    ///
    /// ```no_run
    /// use jobs_adapter_sqlite::SqliteWorkTx;
    /// use jobs_core::{JobId, TenantId};
    ///
    /// /// A handler: its row commits with the claim, so a redelivery cannot insert it twice.
    /// async fn issue_invoice(
    ///     tx: &mut SqliteWorkTx,
    ///     job_id: JobId,
    ///     tenant: TenantId,
    /// ) -> Result<(), sqlx::Error> {
    ///     sqlx::query("insert into invoices (job_id, tenant_id) values (?1, ?2)")
    ///         .bind(job_id.to_string())
    ///         .bind(tenant.to_string())
    ///         .execute(tx.conn())
    ///         .await?;
    ///     Ok(())
    /// }
    /// ```
    pub fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl Deref for SqliteWorkTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for SqliteWorkTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl fmt::Debug for SqliteWorkTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteWorkTx").finish_non_exhaustive()
    }
}

#[async_trait]
impl WorkTransaction for SqliteWorkTx {
    /// `insert ... on conflict do nothing`: one row inserted is [`Claim::Claimed`]. Only when
    /// the row was there does a second statement ask whether the job waits for review. The
    /// write lock taken by `begin` means no other transaction holds an uncommitted claim.
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        let done = sqlx::query(
            "insert into processed_jobs (job_id, consumer, processed_at) values (?1, ?2, ?3) \
             on conflict (job_id, consumer) do nothing",
        )
        .bind(job_id.to_string())
        .bind(consumer.as_str())
        .bind(to_millis(at)?)
        .execute(&mut *self.tx)
        .await
        .map_err(|e| store_error("claim in processed_jobs", e))?;
        if done.rows_affected() == 1 {
            return Ok(Claim::Claimed);
        }
        let waiting: bool = sqlx::query_scalar(
            "select exists (select 1 from dead_letters \
                 where job_id = ?1 and consumer = ?2 and status = 'pending_review')",
        )
        .bind(job_id.to_string())
        .bind(consumer.as_str())
        .fetch_one(&mut *self.tx)
        .await
        .map_err(|e| store_error("read dead_letters", e))?;
        Ok(if waiting {
            Claim::DeadLettered
        } else {
            Claim::AlreadyProcessed
        })
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        crate::dead_letters::record_on(&mut self.tx, &letter).await
    }

    /// The store's batch delete, on this transaction's connection (which holds the write
    /// lock).
    async fn purge_processed(
        &mut self,
        older_than: SystemTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(crate::PURGE_PROCESSED)
            .bind(to_millis(older_than)?)
            .bind(i64::from(batch))
            .execute(&mut *self.tx)
            .await
            .map_err(|e| store_error("purge processed_jobs", e))?;
        Ok(done.rows_affected())
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.tx
            .commit()
            .await
            .map_err(|e| store_error("commit the work transaction", e))
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.tx
            .rollback()
            .await
            .map_err(|e| store_error("roll back the work transaction", e))
    }
}

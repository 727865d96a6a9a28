//! The work transaction.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{Claim, ConsumerName, JobId, NewDeadLetter, Recorded, StoreError, WorkTransaction};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::convert::to_timestamp;
use crate::error::store_error;

/// A work transaction on PostgreSQL: the claim in `core.processed_jobs` and the handler's own
/// writes, made through [`PgWorkTx::conn`], commit or roll back together.
///
/// Dropping it without [`commit`](WorkTransaction::commit) rolls it back. It dereferences to
/// the [`PgConnection`] as well, so `&mut *tx` is an executor too.
pub struct PgWorkTx {
    tx: Transaction<'static, Postgres>,
}

impl PgWorkTx {
    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        PgWorkTx { tx }
    }

    /// The transaction's connection: a handler's queries run on it, inside the work
    /// transaction.
    ///
    /// ```no_run
    /// use jobs_adapter_postgres::PgWorkTx;
    /// use jobs_core::{JobId, TenantId};
    ///
    /// /// A handler: its row commits with the claim, so a redelivery cannot insert it twice.
    /// async fn issue_invoice(
    ///     tx: &mut PgWorkTx,
    ///     job_id: JobId,
    ///     tenant: TenantId,
    /// ) -> Result<(), sqlx::Error> {
    ///     sqlx::query("insert into billing.invoices (job_id, tenant_id) values ($1, $2)")
    ///         .bind(job_id.as_uuid())
    ///         .bind(tenant.as_uuid())
    ///         .execute(tx.conn())
    ///         .await?;
    ///     Ok(())
    /// }
    /// ```
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl Deref for PgWorkTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for PgWorkTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl fmt::Debug for PgWorkTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgWorkTx").finish_non_exhaustive()
    }
}

#[async_trait]
impl WorkTransaction for PgWorkTx {
    /// `insert ... on conflict do nothing`: one row inserted is [`Claim::Claimed`]. Only when
    /// the row was there does a second statement ask whether the job waits for review. If
    /// another open transaction inserted the same key, the insert waits for it to end.
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        let done = sqlx::query(
            "insert into core.processed_jobs (job_id, consumer, processed_at) values ($1, $2, $3) \
             on conflict (job_id, consumer) do nothing",
        )
        .bind(job_id.as_uuid())
        .bind(consumer.as_str())
        .bind(to_timestamp(at)?)
        .execute(&mut *self.tx)
        .await
        .map_err(|e| store_error("claim in core.processed_jobs", e))?;
        if done.rows_affected() == 1 {
            return Ok(Claim::Claimed);
        }
        let waiting: bool = sqlx::query_scalar(
            "select exists (select 1 from core.dead_letters \
                 where job_id = $1 and consumer = $2 and status = 'pending_review')",
        )
        .bind(job_id.as_uuid())
        .bind(consumer.as_str())
        .fetch_one(&mut *self.tx)
        .await
        .map_err(|e| store_error("read core.dead_letters", e))?;
        Ok(if waiting {
            Claim::DeadLettered
        } else {
            Claim::AlreadyProcessed
        })
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        crate::dead_letters::record_on(&mut self.tx, &letter).await
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

//! The work transaction.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{Claim, ConsumerName, JobId, StoreError, WorkTransaction};
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
    /// One statement: insert the row unless the job is pending in the dead letters, `on
    /// conflict do nothing`. One row inserted is [`Claim::Claimed`], none is
    /// [`Claim::AlreadyProcessed`]. If another open transaction inserted the same key, this
    /// waits for it to end.
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        let done = sqlx::query(
            "insert into core.processed_jobs (job_id, consumer, processed_at) \
             select $1, $2, $3 where not exists (select 1 from core.dead_letters \
                 where dedup_key = $4 and status = 'pending_review') \
             on conflict (job_id, consumer) do nothing",
        )
        .bind(job_id.as_uuid())
        .bind(consumer.as_str())
        .bind(to_timestamp(at)?)
        .bind(job_id.to_string())
        .execute(&mut *self.tx)
        .await
        .map_err(|e| store_error("claim in core.processed_jobs", e))?;
        Ok(if done.rows_affected() == 1 {
            Claim::Claimed
        } else {
            Claim::AlreadyProcessed
        })
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

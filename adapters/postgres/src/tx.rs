//! The work transaction.

use std::collections::HashSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{
    Claim, ConsumerName, GroupTransaction, JobId, NewDeadLetter, Recorded, StoreError,
    WorkTransaction,
};
use sqlx::types::Uuid;
use sqlx::{Executor, PgConnection, Postgres, Transaction};

use crate::convert::to_timestamp;
use crate::error::store_error;
use crate::processed::{PerSlice, common_slot, slot};

/// [`WorkTransaction::claim`]'s insert, into the job's slice (ADR 0014): `$1` the job id, `$2`
/// the consumer, `$3` the time.
static CLAIM: PerSlice = PerSlice::new(|table, slot| {
    format!(
        "insert into {table} (job_id, consumer, processed_at, slot) values ($1, $2, $3, {}) \
         on conflict (job_id, consumer, slot) do nothing",
        slot("$1")
    )
});

/// [`GroupTransaction::claim_all`]'s insert: `$1` the sorted job ids, `$2` the consumer, `$3`
/// the time; returns the ids it claimed.
static CLAIM_ALL: PerSlice = PerSlice::new(|table, slot| {
    format!(
        "with claimed as ( \
             insert into {table} (job_id, consumer, processed_at, slot) \
             select u.id, $2, $3, {} from unnest($1::uuid[]) as u(id) \
             on conflict (job_id, consumer, slot) do nothing \
             returning job_id) \
         select coalesce(array_agg(job_id), '{{}}') from claimed",
        slot("u.id")
    )
});

/// [`GroupTransaction::unclaim`]'s delete: `$1` the job id, `$2` the consumer.
static UNCLAIM: PerSlice = PerSlice::new(|table, slot| {
    format!(
        "delete from {table} where job_id = $1 and consumer = $2 and slot = {}",
        slot("$1")
    )
});

/// [`GroupTransaction::unclaim_all`]'s delete: `$1` the job ids, `$2` the consumer.
static UNCLAIM_ALL: PerSlice = PerSlice::new(|table, slot| {
    format!(
        "delete from {table} where job_id = any($1) and consumer = $2 \
         and slot in (select {} from unnest($1::uuid[]) as u(id))",
        slot("u.id")
    )
});

/// A work transaction on PostgreSQL: the claim in `core.processed_jobs` and the handler's own
/// writes, made through [`PgWorkTx::conn`], commit or roll back together.
///
/// Dropping it without [`commit`](WorkTransaction::commit) rolls it back. It dereferences to
/// the [`PgConnection`] as well, so `&mut *tx` is an executor too.
///
/// As a [`GroupTransaction`] its checkpoint is one savepoint, and it is "touched" when a
/// handler reached the connection mutably (through [`PgWorkTx::conn`] or `&mut *tx`).
pub struct PgWorkTx {
    tx: Transaction<'static, Postgres>,
    /// A handler reached the connection since [`GroupTransaction::take_touched`] last asked.
    touched: bool,
    /// The checkpoint's savepoint exists.
    savepoint: bool,
    /// The messages of `core.jobs` a group took in this transaction and has not settled yet:
    /// the commit is refused while one is left.
    pub(crate) taken: Vec<Taken>,
}

/// A message a group took out of `core.jobs` (deleted in its transaction, so acked when it
/// commits), with what it takes to put it back for a retry or a deferral.
#[cfg_attr(not(feature = "queue"), allow(dead_code))]
pub(crate) struct Taken {
    /// Its row id.
    pub(crate) id: i64,
    /// Its dedup key: `None` when it is `job_id`'s text, the default.
    pub(crate) dedup_key: Option<String>,
    /// The job id the runtime gave with its lease, if it did.
    pub(crate) job_id: Option<JobId>,
    pub(crate) tenant_id: Option<Uuid>,
    pub(crate) deliveries: i32,
    pub(crate) created_at: chrono::DateTime<chrono::Utc>,
    pub(crate) lane: Option<Uuid>,
}

/// The first checkpoint of [`GroupTransaction::checkpoint`]: a savepoint named so that a
/// handler's own savepoints do not collide with it.
const FIRST_CHECKPOINT: &str = "savepoint jobs_checkpoint";
/// A later checkpoint: the last one released and a new one made, in one round trip.
const NEXT_CHECKPOINT: &str = "release savepoint jobs_checkpoint; savepoint jobs_checkpoint";
/// [`GroupTransaction::undo`].
const UNDO: &str = "rollback to savepoint jobs_checkpoint";

/// [`GroupTransaction::checkpoint_budget`]: a backend keeps the ids of 64 subtransactions in
/// shared memory, and past that every session's snapshots consult `pg_subtrans` on disk
/// (the "suboverflow" that slows a whole database). A checkpoint that a job writes after is
/// one subtransaction; the runtime's take at most half, leaving the rest to handlers' own
/// savepoints.
const MAX_CHECKPOINTS: usize = 31;

impl PgWorkTx {
    /// The claims of `job_ids` for `consumer`, given those `claimed` just now: the others were
    /// settled before, and a second statement tells a dead letter waiting for review from a
    /// processed job, only when there are such.
    pub(crate) async fn claims(
        &mut self,
        job_ids: &[JobId],
        mut claimed: HashSet<Uuid>,
        consumer: &ConsumerName,
    ) -> Result<Vec<Claim>, StoreError> {
        let settled: Vec<Uuid> = job_ids
            .iter()
            .map(|id| id.as_uuid())
            .filter(|id| !claimed.contains(id))
            .collect();
        let waiting: HashSet<Uuid> = if settled.is_empty() {
            HashSet::new()
        } else {
            sqlx::query_scalar::<_, Uuid>(
                "select job_id from core.dead_letters \
                 where job_id = any($1) and consumer = $2 and status = 'pending_review'",
            )
            .bind(&settled)
            .bind(consumer.as_str())
            .fetch_all(self.own())
            .await
            .map_err(|e| store_error("read core.dead_letters", e))?
            .into_iter()
            .collect()
        };
        Ok(job_ids
            .iter()
            .map(|id| {
                let id = id.as_uuid();
                if claimed.remove(&id) {
                    Claim::Claimed
                } else if waiting.contains(&id) {
                    Claim::DeadLettered
                } else {
                    Claim::AlreadyProcessed
                }
            })
            .collect())
    }

    pub(crate) fn new(tx: Transaction<'static, Postgres>) -> Self {
        PgWorkTx {
            tx,
            touched: false,
            savepoint: false,
            taken: Vec::new(),
        }
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
        self.touched = true;
        &mut self.tx
    }

    /// The connection for the runtime's own statements (claims, settlements, dead letters),
    /// which do not count as a handler's touch.
    pub(crate) fn own(&mut self) -> &mut PgConnection {
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
        self.conn()
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
        let done = sqlx::query(CLAIM.get(Some(slot(job_id.as_uuid()))))
            .bind(job_id.as_uuid())
            .bind(consumer.as_str())
            .bind(to_timestamp(at)?)
            .execute(self.own())
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
        .fetch_one(self.own())
        .await
        .map_err(|e| store_error("read core.dead_letters", e))?;
        Ok(if waiting {
            Claim::DeadLettered
        } else {
            Claim::AlreadyProcessed
        })
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        crate::dead_letters::record_on(self.own(), &letter).await
    }

    /// The store's batch delete, in this transaction.
    async fn purge_processed(
        &mut self,
        older_than: SystemTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        crate::processed::purge_batch(self.own(), older_than, batch).await
    }

    /// Refused, and rolled back, while a message taken from the queue in this transaction is
    /// unsettled: committing would ack it.
    async fn commit(self) -> Result<(), StoreError> {
        if !self.taken.is_empty() {
            return Err(StoreError::failed(format!(
                "{} messages taken from core.jobs in this transaction were not settled; \
                 it was rolled back",
                self.taken.len()
            )));
        }
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

#[async_trait]
impl GroupTransaction for PgWorkTx {
    /// One `insert ... select from unnest ... on conflict do nothing` for the group, in job id
    /// order so that two groups claiming the same jobs wait for each other in one order and
    /// never deadlock; a second statement only when a job was claimed before.
    async fn claim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut sorted: Vec<Uuid> = job_ids.iter().map(|id| id.as_uuid()).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let claimed: Vec<Uuid> = sqlx::query_scalar(CLAIM_ALL.get(common_slot(&sorted)))
            .bind(&sorted)
            .bind(consumer.as_str())
            .bind(to_timestamp(at)?)
            .fetch_one(self.own())
            .await
            .map_err(|e| store_error("claim a group in core.processed_jobs", e))?;
        self.claims(job_ids, claimed.into_iter().collect(), consumer)
            .await
    }

    fn take_touched(&mut self) -> bool {
        std::mem::take(&mut self.touched)
    }

    fn checkpoint_budget(&self) -> usize {
        MAX_CHECKPOINTS
    }

    /// `savepoint`, or `release savepoint` of the last checkpoint and a new `savepoint` in one
    /// round trip.
    async fn checkpoint(&mut self) -> Result<(), StoreError> {
        let sql = if self.savepoint {
            NEXT_CHECKPOINT
        } else {
            FIRST_CHECKPOINT
        };
        self.tx
            .execute(sql)
            .await
            .map_err(|e| store_error("take a checkpoint", e))?;
        self.savepoint = true;
        Ok(())
    }

    /// `rollback to savepoint`, which keeps the savepoint for the next undo.
    async fn undo(&mut self) -> Result<(), StoreError> {
        if !self.savepoint {
            return Err(StoreError::failed("undo without a checkpoint"));
        }
        self.tx
            .execute(UNDO)
            .await
            .map_err(|e| store_error("undo to the checkpoint", e))?;
        Ok(())
    }

    async fn unclaim(&mut self, job_id: JobId, consumer: &ConsumerName) -> Result<(), StoreError> {
        sqlx::query(UNCLAIM.get(Some(slot(job_id.as_uuid()))))
            .bind(job_id.as_uuid())
            .bind(consumer.as_str())
            .execute(self.own())
            .await
            .map_err(|e| store_error("release a claim in core.processed_jobs", e))?;
        Ok(())
    }

    async fn unclaim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
    ) -> Result<(), StoreError> {
        let ids: Vec<Uuid> = job_ids.iter().map(|id| id.as_uuid()).collect();
        sqlx::query(UNCLAIM_ALL.get(common_slot(&ids)))
            .bind(&ids)
            .bind(consumer.as_str())
            .execute(self.own())
            .await
            .map_err(|e| store_error("release claims in core.processed_jobs", e))?;
        Ok(())
    }
}

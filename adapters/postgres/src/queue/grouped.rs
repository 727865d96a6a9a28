//! The grouped side of the PostgreSQL queue ([`SettleInTransaction`]): a group's rows held,
//! taken and claimed inside the work transaction, and put back under their ids when it rolls
//! back.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use jobs_core::{
    Claim, ConsumerName, Delivery, JobId, Lease, SettleInTransaction, Settlement, StoreError,
};
use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::types::Uuid;

use crate::convert::to_timestamp;
use crate::error::store_error;
use crate::processed::{PerSlice, common_slot};
use crate::rows::parse_token;
use crate::tx::Taken;
use crate::{PgStore, PgWorkTx};

use super::PgQueue;

#[async_trait]
impl SettleInTransaction<PgStore> for PgQueue {
    /// The same pool: the queue built over `store.pool()` (or a clone of it). Two pools, even
    /// on one database, are refused, since a worker's connections are then counted twice.
    fn shares_transactions_with(&self, store: &PgStore) -> Result<(), jobs_core::Unsupported> {
        if Arc::ptr_eq(
            &self.pool.connect_options(),
            &store.pool().connect_options(),
        ) {
            Ok(())
        } else {
            Err(jobs_core::Unsupported::new(
                "the PgQueue and the PgStore have different pools: build the queue with \
                 PgQueue::new(store.pool().clone())",
            ))
        }
    }

    /// Deletes, in `tx`, the rows whose generation is the lease's and still leased: another
    /// receiver's `skip locked` passes them by until the transaction ends, and if it commits
    /// they are acked without another statement; `settle` puts back those to retry or
    /// defer.
    async fn hold(&self, tx: &mut PgWorkTx, leases: &[&Lease]) -> Result<Vec<bool>, StoreError> {
        let (ids, generations) = tokens(leases.iter().copied());
        let taken: TakenRows = sqlx::query_as(HOLD.as_str())
            .bind(&ids)
            .bind(&generations)
            .bind(Vec::<Uuid>::new())
            .fetch_one(tx.own())
            .await
            .map_err(|e| store_error("take a group from core.jobs", e))?;
        let held = keep_taken(tx, taken, &[]);
        Ok(ids.iter().map(|id| held.contains(id)).collect())
    }

    /// One statement: the rows taken as [`hold`](Self::hold) takes them, and the jobs of those
    /// taken claimed as [`claim_all`](jobs_core::GroupTransaction::claim_all) does, in job id
    /// order.
    async fn hold_and_claim(
        &self,
        tx: &mut PgWorkTx,
        deliveries: &[(&Lease, JobId)],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Option<Claim>>, StoreError> {
        let (ids, generations) = tokens(deliveries.iter().map(|(lease, _)| *lease));
        let job_ids: Vec<Uuid> = deliveries.iter().map(|(_, id)| id.as_uuid()).collect();
        let (taken, claimed): (TakenRows, Vec<Uuid>) = {
            let row = sqlx::query(HOLD_AND_CLAIM.get(common_slot(&job_ids)))
                .bind(&ids)
                .bind(&generations)
                .bind(&job_ids)
                .bind(consumer.as_str())
                .bind(to_timestamp(at)?)
                .fetch_one(tx.own())
                .await
                .map_err(|e| store_error("take and claim a group", e))?;
            let corrupt = |e| store_error("read a taken group", e);
            let taken = <TakenRows as sqlx::FromRow<'_, PgRow>>::from_row(&row).map_err(corrupt)?;
            (taken, row.try_get("claimed").map_err(corrupt)?)
        };
        let jobs: Vec<(i64, JobId)> = ids
            .iter()
            .copied()
            .zip(deliveries.iter().map(|(_, id)| *id))
            .collect();
        let held = keep_taken(tx, taken, &jobs);
        let held_jobs: Vec<JobId> = deliveries
            .iter()
            .zip(&ids)
            .filter(|(_, id)| held.contains(id))
            .map(|((_, job_id), _)| *job_id)
            .collect();
        let mut claims = tx
            .claims(&held_jobs, claimed.into_iter().collect(), consumer)
            .await?
            .into_iter();
        Ok(ids
            .iter()
            .map(|id| {
                if held.contains(id) {
                    claims.next()
                } else {
                    None
                }
            })
            .collect())
    }

    /// Acks cost nothing more (their rows went at [`hold`](Self::hold)); retries and
    /// deferrals go back in one insert, under their id and generation, released to their time
    /// (a deferral gives its attempt back).
    async fn settle(
        &self,
        tx: &mut PgWorkTx,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError> {
        let mut back = PutBack::default();
        for (delivery, settlement) in settlements {
            let Some((id, generation)) = parse_token(delivery.lease.token()) else {
                return Err(StoreError::failed(
                    "settled a delivery whose lease token is not this queue's",
                ));
            };
            let Some(at) = tx.taken.iter().position(|taken| taken.id == id) else {
                return Err(StoreError::failed(
                    "settled a delivery this transaction did not take: a lease was not held",
                ));
            };
            let taken = tx.taken.swap_remove(at);
            let (at, deliveries) = match *settlement {
                Settlement::Ack => continue,
                Settlement::RetryAt(at) => (at, taken.deliveries),
                Settlement::Defer(until) => (until, (taken.deliveries - 1).max(0)),
                _ => {
                    return Err(StoreError::failed(format!(
                        "unknown settlement {settlement:?}"
                    )));
                }
            };
            back.ids.push(id);
            back.generations.push(generation);
            back.visible.push(to_timestamp(at)?);
            back.deliveries.push(deliveries);
            back.payloads.push(delivery.payload.as_slice());
            back.queues.push(delivery.lease.queue().as_str());
            let key = match (taken.dedup_key, taken.job_id) {
                (Some(key), _) => key,
                (None, Some(job_id)) => job_id.to_string(),
                (None, None) => return Err(StoreError::failed("a taken row without its key")),
            };
            back.keys.push(key);
            back.tenants.push(taken.tenant_id);
            back.created.push(taken.created_at);
            back.lanes.push(taken.lane);
        }
        if back.ids.is_empty() {
            return Ok(());
        }
        let put: i64 = sqlx::query_scalar(
            "with put as ( \
                 insert into core.jobs (id, queue, dedup_key, payload, tenant_id, visible_at, \
                     deliveries, lease_gen, leased, created_at, lane) overriding system value \
                 select id, queue, dedup_key, payload, tenant_id, visible_at, deliveries, gen, \
                     false, created_at, lane \
                 from unnest($1::bigint[], $2::text[], $3::text[], $4::bytea[], $5::uuid[], \
                     $6::timestamptz[], $7::int[], $8::bigint[], $9::timestamptz[], $10::uuid[]) \
                     as u(id, queue, dedup_key, payload, tenant_id, visible_at, deliveries, gen, \
                         created_at, lane) \
                 returning 1) \
             select count(*) from put",
        )
        .bind(&back.ids)
        .bind(&back.queues)
        .bind(&back.keys)
        .bind(&back.payloads)
        .bind(&back.tenants)
        .bind(&back.visible)
        .bind(&back.deliveries)
        .bind(&back.generations)
        .bind(&back.created)
        .bind(&back.lanes)
        .fetch_one(tx.own())
        .await
        .map_err(|e| store_error("put a group's retries back into core.jobs", e))?;
        if usize::try_from(put).ok() == Some(back.ids.len()) {
            Ok(())
        } else {
            Err(StoreError::failed(format!(
                "put back {put} of {} messages",
                back.ids.len()
            )))
        }
    }
}

/// The fenced delete of a group's rows (`$1` ids, `$2` generations, `$3` their job ids when
/// known), returning what putting one back takes besides its queue (the lease's) and payload
/// (the delivery's): the dedup key only when it is not the job id's text, the default.
const TAKE: &str = "delete from core.jobs j \
     using unnest($1::bigint[], $2::bigint[], $3::uuid[]) as l(id, gen, job_id) \
     where j.id = l.id and j.lease_gen = l.gen and j.leased \
     returning j.id, nullif(j.dedup_key, l.job_id::text) as dedup_key, j.tenant_id, \
         j.deliveries, j.created_at, j.lane";

/// The taken rows as one row of arrays, in one order ([`TakenRows`]).
const TAKEN_ARRAYS: &str = "coalesce(array_agg(id), '{}') as ids, \
     coalesce(array_agg(dedup_key), '{}') as keys, \
     coalesce(array_agg(tenant_id), '{}') as tenants, \
     coalesce(array_agg(deliveries), '{}') as deliveries, \
     coalesce(array_agg(created_at), '{}') as created, \
     coalesce(array_agg(lane), '{}') as lanes";

/// [`SettleInTransaction::hold`]'s statement.
static HOLD: LazyLock<String> =
    LazyLock::new(|| format!("with taken as ({TAKE}) select {TAKEN_ARRAYS} from taken"));

/// [`SettleInTransaction::hold_and_claim`]'s statement: `$3` the job ids, `$4` the consumer,
/// `$5` the time of the claims, which go into the jobs' slice when they share one (ADR 0014).
static HOLD_AND_CLAIM: PerSlice = PerSlice::new(|table, slot| {
    format!(
        "with taken as ({TAKE}), \
         claimed as ( \
             insert into {table} (job_id, consumer, processed_at, slot) \
             select distinct d.job_id, $4, $5, {} \
             from unnest($1::bigint[], $3::uuid[]) as d(id, job_id) join taken using (id) \
             order by d.job_id \
             on conflict (job_id, consumer, slot) do nothing returning job_id) \
         select t.*, c.claimed from (select {TAKEN_ARRAYS} from taken) as t, \
             (select coalesce(array_agg(job_id), '{{}}') as claimed from claimed) as c",
        slot("d.job_id")
    )
});

/// The rows a group took, column by column ([`TAKEN_ARRAYS`]).
#[derive(sqlx::FromRow)]
struct TakenRows {
    ids: Vec<i64>,
    keys: Vec<Option<String>>,
    tenants: Vec<Option<Uuid>>,
    deliveries: Vec<i32>,
    created: Vec<DateTime<Utc>>,
    lanes: Vec<Option<Uuid>>,
}

/// Keeps the rows `taken` in `tx` until they are settled, with their job ids from `jobs` (row
/// id, job id); returns their ids.
fn keep_taken(tx: &mut PgWorkTx, taken: TakenRows, jobs: &[(i64, JobId)]) -> HashSet<i64> {
    let TakenRows {
        ids,
        keys,
        tenants,
        deliveries,
        created,
        lanes,
    } = taken;
    let rows = keys
        .into_iter()
        .zip(tenants)
        .zip(deliveries)
        .zip(created)
        .zip(lanes);
    tx.taken.clear();
    for (&id, ((((dedup_key, tenant_id), deliveries), created_at), lane)) in ids.iter().zip(rows) {
        let job_id = jobs.iter().find(|(row, _)| *row == id).map(|(_, job)| *job);
        tx.taken.push(Taken {
            id,
            dedup_key,
            job_id,
            tenant_id,
            deliveries,
            created_at,
            lane,
        });
    }
    ids.into_iter().collect()
}

/// The columns of the rows a group puts back.
#[derive(Default)]
struct PutBack<'a> {
    ids: Vec<i64>,
    generations: Vec<i64>,
    visible: Vec<DateTime<Utc>>,
    deliveries: Vec<i32>,
    payloads: Vec<&'a [u8]>,
    queues: Vec<&'a str>,
    keys: Vec<String>,
    tenants: Vec<Option<Uuid>>,
    created: Vec<DateTime<Utc>>,
    lanes: Vec<Option<Uuid>>,
}

/// The row ids and generations of `leases`; a token that does not parse (not this queue's)
/// is row 0, which no row is (identities count from 1), so it holds nothing.
fn tokens<'a>(leases: impl Iterator<Item = &'a Lease>) -> (Vec<i64>, Vec<i64>) {
    leases
        .map(|lease| parse_token(lease.token()).unwrap_or((0, 0)))
        .unzip()
}

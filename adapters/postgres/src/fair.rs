//! Fair dequeue across tenants on the PostgreSQL queue (ADR 0013): which queues are fetched
//! through `core.lease_fair`, listing them in `core.fair_queues`, the fetch itself, and the
//! weights of `core.tenant_weights`.
//!
//! The database's list is what counts: a queue listed there gives its rows a lane at insert
//! and is fetched fairly by every worker, also by one built without asking for it (which
//! reads the list again every [`RECHECK`]), so one process cannot serve a fair queue oldest
//! first.
//!
//! The queue keeps a [`Lanes`] for its clones and calls in with what each statement needs,
//! its pool and its clock: the fair fetch does not know the queue, so the dependency runs one
//! way, from the queue to here.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use jobs_core::{Clock, Delivery, QueueError, QueueName, TenantFairness, TenantId};
use sqlx::PgPool;
use sqlx::types::Uuid;
use tokio::time::Instant;

use crate::rows::{deliveries, queue_error, timestamp};

/// How long a queue not asked to be fair trusts its last reading of `core.fair_queues`.
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

/// The fair-fetch state of every queue, shared by a queue's clones.
#[derive(Default)]
pub(crate) struct Lanes {
    queues: Mutex<HashMap<QueueName, Lane>>,
}

/// What this process knows of one queue's fair fetch.
#[derive(Default)]
struct Lane {
    /// Asked of this process ([`jobs_core::PullPort::share_by_tenant`]).
    wanted: Option<TenantFairness>,
    /// The database lists the queue with the wanted limit, since this process made sure.
    listed_as_wanted: bool,
    /// Whether the database listed the queue, when last read, and when that was.
    listed: Option<(bool, Instant)>,
    /// The lane served last and what is left of its turn, for the next fetch.
    cursor: (Option<Uuid>, i32),
}

/// How a receive fetches, as [`Lanes::fetch_mode`] decides.
pub(crate) enum Fetch {
    /// `LEASE_STATEMENT`: oldest first over the rows without a lane.
    Oldest,
    /// `core.lease_fair`, with the queue listed as this process wants when that is `Some`.
    Fair(Option<TenantFairness>),
}

impl Lanes {
    /// The map, locked for one short step, never across an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueName, Lane>> {
        // Every mutation leaves the map consistent before it can panic.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that this process fetches `queue` fairly with `fairness`; the queue is listed
    /// with it at the next fetch ([`Fetch::Fair`] with `Some`), or at once by
    /// [`make_fair`](Self::make_fair). A new limit is listed again.
    pub(crate) fn want(&self, queue: &QueueName, fairness: TenantFairness) {
        let mut queues = self.lock();
        let lane = queues.entry(queue.clone()).or_default();
        if lane.wanted != Some(fairness) {
            lane.wanted = Some(fairness);
            lane.listed_as_wanted = false;
        }
    }

    /// How `queue` is fetched now, when the database's list need not be read again.
    fn known(&self, queue: &QueueName) -> Option<Fetch> {
        let queues = self.lock();
        let lane = queues.get(queue)?;
        match (lane.wanted, lane.listed) {
            (Some(wanted), _) if !lane.listed_as_wanted => Some(Fetch::Fair(Some(wanted))),
            (Some(_), _) => Some(Fetch::Fair(None)),
            (None, Some((listed, at))) if at.elapsed() < RECHECK => Some(if listed {
                Fetch::Fair(None)
            } else {
                Fetch::Oldest
            }),
            (None, _) => None,
        }
    }

    /// The lane to start after on `queue`'s next fair fetch, and what is left of its turn.
    fn cursor(&self, queue: &QueueName) -> (Option<Uuid>, i32) {
        self.lock().get(queue).map(|l| l.cursor).unwrap_or_default()
    }

    /// How a receive on `queue` fetches: fairly when this process asked for it or the
    /// database lists the queue, oldest first otherwise.
    pub(crate) async fn fetch_mode(
        &self,
        pool: &PgPool,
        queue: &QueueName,
    ) -> Result<Fetch, QueueError> {
        if let Some(known) = self.known(queue) {
            return Ok(known);
        }
        let listed: bool =
            sqlx::query_scalar("select exists (select 1 from core.fair_queues where queue = $1)")
                .bind(queue.as_str())
                .fetch_one(pool)
                .await
                .map_err(|e| queue_error(queue, "read core.fair_queues", e))?;
        let mut queues = self.lock();
        let lane = queues.entry(queue.clone()).or_default();
        if listed && !lane.listed.is_some_and(|(was, _)| was) {
            tracing::warn!(
                %queue,
                "the database lists this queue as fair: fetching it fairly, as every worker must"
            );
        }
        lane.listed = Some((listed, Instant::now()));
        Ok(if listed {
            Fetch::Fair(None)
        } else {
            Fetch::Oldest
        })
    }

    /// Fetches `queue` fairly from now on, as [`want`](Self::want) does, and lists it in
    /// `pool`'s database at once rather than at the first receive, so that jobs published
    /// before the workers start get their lanes.
    pub(crate) async fn make_fair(
        &self,
        pool: &PgPool,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), QueueError> {
        self.want(queue, fairness);
        self.list(pool, queue, fairness).await
    }

    /// Lists `queue` in `core.fair_queues` with `fairness`' limit, and gives its rows their
    /// lanes. The table is locked against writes meanwhile (`share row exclusive`), so that
    /// no insert made before the listing commits is left without its lane; that is done once
    /// per process and queue, and only when the list does not already say so.
    async fn list(
        &self,
        pool: &PgPool,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), QueueError> {
        let fail = |what| move |e| queue_error(queue, what, e);
        let limit: Option<i32> = fairness
            .limit_value()
            .map(|l| i32::try_from(l.get()).unwrap_or(i32::MAX));
        let listed: Option<Option<i32>> =
            sqlx::query_scalar("select tenant_limit from core.fair_queues where queue = $1")
                .bind(queue.as_str())
                .fetch_optional(pool)
                .await
                .map_err(fail("read core.fair_queues"))?;
        if listed != Some(limit) {
            let mut tx = pool.begin().await.map_err(fail("begin"))?;
            sqlx::query("lock table core.jobs in share row exclusive mode")
                .execute(&mut *tx)
                .await
                .map_err(fail("lock core.jobs"))?;
            sqlx::query(
                "insert into core.fair_queues (queue, tenant_limit) values ($1, $2) \
                 on conflict (queue) do update set tenant_limit = excluded.tenant_limit",
            )
            .bind(queue.as_str())
            .bind(limit)
            .execute(&mut *tx)
            .await
            .map_err(fail("list the queue in core.fair_queues"))?;
            let moved = sqlx::query(
                "update core.jobs set lane = coalesce(tenant_id, '00000000-0000-0000-0000-000000000000') \
                 where queue = $1 and lane is null",
            )
            .bind(queue.as_str())
            .execute(&mut *tx)
            .await
            .map_err(fail("give the queue's jobs their lanes"))?
            .rows_affected();
            tx.commit().await.map_err(fail("commit"))?;
            if let Some(before) = listed {
                tracing::warn!(
                    %queue,
                    before = ?before,
                    now = ?limit,
                    "the per-tenant limit of this fair queue changed"
                );
            } else {
                tracing::info!(%queue, %fairness, jobs = moved, "queue fetched fairly from now on");
            }
        }
        let mut queues = self.lock();
        let lane = queues.entry(queue.clone()).or_default();
        lane.listed_as_wanted = lane.wanted == Some(fairness);
        lane.listed = Some((true, Instant::now()));
        Ok(())
    }

    /// One call of `core.lease_fair`, after listing the queue when `list` says so; the
    /// deliveries in the order the rounds served them. "Now" is read from `clock` after the
    /// listing, so the leases start when the fetch does.
    pub(crate) async fn lease_fair(
        &self,
        pool: &PgPool,
        clock: &dyn Clock,
        queue: &QueueName,
        list: Option<TenantFairness>,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if let Some(fairness) = list {
            self.list(pool, queue, fairness).await?;
        }
        let now = clock.now();
        let (after, left) = self.cursor(queue);
        let rows = sqlx::query(
            "select id, payload, deliveries, lease_gen, visible_at, expired, ord, cursor_lane, \
                    cursor_left \
             from core.lease_fair($1, $2, $3, $4, $5, $6)",
        )
        .bind(queue.as_str())
        .bind(timestamp(queue, now)?)
        .bind(timestamp(
            queue,
            jobs_core::later(queue, now, lease, "lease")?,
        )?)
        .bind(i32::try_from(max).unwrap_or(i32::MAX))
        .bind(after)
        .bind(left)
        .fetch_all(pool)
        .await
        .map_err(|e| queue_error(queue, "lease jobs fairly from core.jobs", e))?;
        if let Some(row) = rows.first() {
            use sqlx::Row;
            let cursor: (Option<Uuid>, Option<i32>) = (
                row.try_get(7)
                    .map_err(|e| queue_error(queue, "read a leased row", e))?,
                row.try_get(8)
                    .map_err(|e| queue_error(queue, "read a leased row", e))?,
            );
            if let Some(lane) = self.lock().get_mut(queue) {
                lane.cursor = (cursor.0, cursor.1.unwrap_or(0));
            }
        }
        deliveries(queue, rows, 6)
    }
}

/// Sets `tenant`'s weight on `queue` in `core.tenant_weights` of `pool`'s database, which
/// `core.lease_fair` reads in the same round trip as its fetch: the next fair fetch of any
/// worker serves by it.
pub(crate) async fn set_weight(
    pool: &PgPool,
    queue: &QueueName,
    tenant: TenantId,
    weight: NonZeroU32,
) -> Result<(), QueueError> {
    sqlx::query(
        "insert into core.tenant_weights (queue, tenant_id, weight) values ($1, $2, $3) \
         on conflict (queue, tenant_id) do update set weight = excluded.weight",
    )
    .bind(queue.as_str())
    .bind(tenant.as_uuid())
    .bind(i32::try_from(weight.get()).unwrap_or(i32::MAX))
    .execute(pool)
    .await
    .map_err(|e| queue_error(queue, "write core.tenant_weights", e))?;
    Ok(())
}

//! The PostgreSQL queue (feature `queue`, ADR 0011): `core.jobs`, fetched in batches with
//! `FOR UPDATE SKIP LOCKED`, leased with a fencing token, deleted on ack.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use jobs_core::{
    Clock, DecodeLimits, Delivery, Envelope, JobId, Lease, PublishOptions, PullPort, QueueError,
    QueueName, QueuePort, Receipt, SettlePort, SystemClock, TenantFairness, TenantId,
    TenantWeights, later,
};
use sqlx::pool::PoolConnection;
use sqlx::types::Uuid;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::convert::{from_timestamp, to_timestamp};
use crate::fair::{self, Fetch, Lanes};
use crate::mark::Marks;
use crate::oversized;
use crate::rows::{Batch, Fetched, Leased, parse_token, queue_error, timestamp};

/// The queue on PostgreSQL: [`QueuePort`], [`PullPort`], [`SettlePort`] and [`QueueDepth`](jobs_core::QueueDepth) over
/// `core.jobs`; clones share the pool.
///
/// Every statement takes "now" from the queue's [`Clock`] (the system clock unless
/// [`PgQueue::with_clock`] says otherwise), never from the server, so tests move time by hand.
/// The schema comes from [`PgStore::migrate`](crate::PgStore::migrate).
///
/// Idle workers of the runtime wake through [`PullPort::wait_for_work`] (one shared
/// LISTEN connection per queue and its clones); a loop of its own, as below, can hold a
/// [`Wakeups`] instead.
///
/// ```no_run
/// use jobs_adapter_postgres::{PgQueue, PgStore};
/// use jobs_core::{PullPort, QueueName, SettlePort};
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/app").await?;
/// store.migrate().await?;
/// let queue = PgQueue::new(store.pool().clone());
/// let name: QueueName = "billing.invoices".parse()?;
/// let mut wakeups = queue.wakeups();
/// loop {
///     let batch = queue.receive(&name, 100, Duration::from_secs(60)).await?;
///     if batch.is_empty() {
///         wakeups.wait(&name, Duration::from_secs(1)).await;
///     }
///     // ... hand each delivery to the runtime (`Worker::process`).
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct PgQueue {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    hub: Arc<Hub>,
    lanes: Arc<Lanes>,
    marks: Arc<Marks>,
    limits: DecodeLimits,
}

impl fmt::Debug for PgQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgQueue")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The lane of a row of queue `$1` for tenant `$tenant` (SQL): on a queue listed in
/// `core.fair_queues`, the tenant or the nil UUID, else none. The list is read by the
/// inserting statement's own snapshot, taken after its lock on `core.jobs`, which the listing
/// holds exclusively until it commits.
macro_rules! lane {
    ($tenant:literal) => {
        concat!(
            "case when exists (select 1 from core.fair_queues f where f.queue = $1) \
             then coalesce(",
            $tenant,
            ", '00000000-0000-0000-0000-000000000000'::uuid) end"
        )
    };
}

/// The guard of every settlement: this delivery's generation, leased, lease not expired.
macro_rules! fenced {
    ($head:literal) => {
        concat!(
            $head,
            " where id = $1 and lease_gen = $2 and leased and visible_at > $3"
        )
    };
}

// After the SQL macros, which the statements of the submodules share.
mod depth;
mod grouped;
mod wakeups;

use wakeups::Hub;
pub use wakeups::{Wake, Wakeups};

/// One job of a batch publish.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// The job.
    pub envelope: Envelope,
    /// Its delay and dedup key.
    pub opts: PublishOptions,
}

impl PgQueue {
    /// A queue over `pool` (migrated by [`PgStore::migrate`](crate::PgStore::migrate)), on the
    /// system clock.
    pub fn new(pool: PgPool) -> Self {
        PgQueue {
            hub: Arc::new(Hub::new(pool.clone())),
            pool,
            clock: Arc::new(SystemClock),
            lanes: Arc::default(),
            marks: Arc::default(),
            limits: DecodeLimits::default(),
        }
    }

    /// Holds envelopes to `limits`, the limits the consumers decode with (the default matches
    /// theirs): a publish over them fails with [`QueueError::TooLarge`] and writes nothing, and a
    /// fetch leaves a row over them (one written by direct SQL, say) in the database and moves
    /// it to `core.dead_letters` with its bytes, unread.
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The same queue reading time from `clock` (a `ManualClock` in tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A connection of the pool, for one call on `queue`.
    async fn connection(&self, queue: &QueueName) -> Result<PoolConnection<Postgres>, QueueError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| queue_error(queue, "acquire a connection", e))
    }

    /// Whether the database holds the queue's table, so that a composition root can say
    /// "migrate first" once instead of every call failing on a missing relation.
    pub async fn is_migrated(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("select to_regclass('core.jobs') is not null")
            .fetch_one(&self.pool)
            .await
    }

    /// Publishes `envelope` on `queue` inside the caller's transaction (`conn` is e.g.
    /// `&mut *tx` of a `sqlx::Transaction`): the job exists if and only if that transaction
    /// commits, and its wake-up is sent at the commit.
    pub async fn publish_in(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let payload = envelope.encode_for(queue, &self.limits)?;
        let now = self.clock.now();
        let run_at = opts.visible_at(queue, now)?;
        let key = opts.dedup_key_for(envelope);
        self.insert(
            conn,
            queue,
            &key,
            payload,
            Some(envelope.tenant_id.as_uuid()),
            run_at,
            now,
        )
        .await
    }

    /// Queues raw bytes, delivered as they are (the runtime dead-letters them if they do not
    /// decode; the envelope limit does not apply, and a fetch moves a row over it to the dead
    /// letters). The dedup key is the one in `opts`, else a fresh one: raw bytes have no job id.
    pub async fn publish_bytes(
        &self,
        queue: &QueueName,
        payload: Vec<u8>,
        opts: &PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let now = self.clock.now();
        let run_at = opts.visible_at(queue, now)?;
        let key = match opts.dedup_key_value() {
            Some(key) => key.to_owned(),
            None => JobId::generate().to_string(),
        };
        let mut conn = self.connection(queue).await?;
        self.insert(&mut conn, queue, &key, payload, None, run_at, now)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn insert(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        key: &str,
        payload: Vec<u8>,
        tenant: Option<Uuid>,
        run_at: SystemTime,
        now: SystemTime,
    ) -> Result<Receipt, QueueError> {
        let id: Option<i64> = sqlx::query_scalar(concat!(
            "insert into core.jobs (queue, dedup_key, payload, tenant_id, visible_at, created_at, lane) \
             values ($1, $2, $3, $4, $5, $6, ",
            lane!("$4"),
            ") on conflict (queue, dedup_key) do nothing returning id",
        ))
        .bind(queue.as_str())
        .bind(key)
        .bind(payload)
        .bind(tenant)
        .bind(timestamp(queue, run_at.max(now))?)
        .bind(timestamp(queue, now)?)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| queue_error(queue, "insert into core.jobs", e))?;
        if let Some(id) = id {
            return Ok(Receipt::queued(Some(id.to_string())));
        }
        let pending: Option<i64> =
            sqlx::query_scalar("select id from core.jobs where queue = $1 and dedup_key = $2")
                .bind(queue.as_str())
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| queue_error(queue, "read core.jobs", e))?;
        Ok(Receipt::duplicate_of(pending.map(|id| id.to_string())))
    }

    /// Publishes `jobs` on `queue` with one multi-row insert; the receipts are in the jobs'
    /// order. A dedup key already pending, or repeated within `jobs`, is a duplicate receipt.
    pub async fn publish_batch(
        &self,
        queue: &QueueName,
        jobs: &[NewJob],
    ) -> Result<Vec<Receipt>, QueueError> {
        let mut conn = self.connection(queue).await?;
        self.publish_batch_in(&mut conn, queue, jobs).await
    }

    /// [`PgQueue::publish_batch`] inside the caller's transaction.
    pub async fn publish_batch_in(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        jobs: &[NewJob],
    ) -> Result<Vec<Receipt>, QueueError> {
        if jobs.is_empty() {
            return Ok(vec![]);
        }
        let now = self.clock.now();
        let mut keys = Vec::with_capacity(jobs.len());
        let mut payloads = Vec::with_capacity(jobs.len());
        let mut tenants = Vec::with_capacity(jobs.len());
        let mut run_ats = Vec::with_capacity(jobs.len());
        for job in jobs {
            keys.push(job.opts.dedup_key_for(&job.envelope).into_owned());
            payloads.push(job.envelope.encode_for(queue, &self.limits)?);
            tenants.push(job.envelope.tenant_id.as_uuid());
            let run_at = job.opts.visible_at(queue, now)?;
            run_ats.push(timestamp(queue, run_at)?);
        }
        // The receipts come back as one row of two arrays: a row per job costs the client
        // more than the insert costs the server.
        let (ids, inserted_keys): (Vec<i64>, Vec<String>) = sqlx::query_as(concat!(
            "with new as ( \
                 insert into core.jobs (queue, dedup_key, payload, tenant_id, visible_at, created_at, lane) \
                 select $1, k, p, t, v, $6, ",
            lane!("t"),
            " from unnest($2::text[], $3::bytea[], $4::uuid[], $5::timestamptz[]) as u(k, p, t, v) \
                 on conflict (queue, dedup_key) do nothing returning id, dedup_key) \
             select coalesce(array_agg(id), '{}'), coalesce(array_agg(dedup_key), '{}') from new",
        ))
        .bind(queue.as_str())
        .bind(&keys)
        .bind(payloads)
        .bind(tenants)
        .bind(run_ats)
        .bind(timestamp(queue, now)?)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| queue_error(queue, "insert a batch into core.jobs", e))?;
        let mut new: HashMap<&str, i64> =
            inserted_keys.iter().map(String::as_str).zip(ids).collect();
        // Every key inserted: no duplicate, no second statement.
        if new.len() == keys.len() {
            return Ok(keys
                .iter()
                .map(|key| Receipt::queued(new.get(key.as_str()).map(i64::to_string)))
                .collect());
        }
        let missing: Vec<&String> = keys
            .iter()
            .filter(|k| !new.contains_key(k.as_str()))
            .collect();
        let mut pending: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
            "select dedup_key, id from core.jobs where queue = $1 and dedup_key = any($2)",
        )
        .bind(queue.as_str())
        .bind(missing)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| queue_error(queue, "read core.jobs", e))?
        .into_iter()
        .collect();
        Ok(keys
            .iter()
            .map(|key| match new.remove(key.as_str()) {
                // The first occurrence in the batch; a later one is its duplicate.
                Some(id) => {
                    pending.insert(key.clone(), id);
                    Receipt::queued(Some(id.to_string()))
                }
                None => Receipt::duplicate_of(pending.get(key).map(i64::to_string)),
            })
            .collect())
    }

    /// A listener for the queue's wake-ups, on a connection of its own (made on first use).
    pub fn wakeups(&self) -> Wakeups {
        Wakeups::new(self.pool.clone())
    }

    async fn settle(
        &self,
        lease: &Lease,
        sql: &'static str,
        at: Option<SystemTime>,
    ) -> Result<(), QueueError> {
        let queue = lease.queue();
        let (id, generation) = parse_token(lease.token()).ok_or_else(|| lost(queue))?;
        let mut query = sqlx::query(sql)
            .bind(id)
            .bind(generation)
            .bind(timestamp(queue, self.clock.now())?);
        if let Some(at) = at {
            query = query.bind(timestamp(queue, at)?);
        }
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|e| queue_error(queue, "settle a job in core.jobs", e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(lost(queue))
        }
    }
}

/// The lease of up to `$4` ready jobs of queue `$1` at `$2` until `$3`, reading the ready index
/// from `$5` (the queue's low-water mark, [`crate::mark`]; null for its start), in one committed
/// statement: a new fencing generation, one delivery more. Its commit does not wait for the WAL
/// flush (`synchronous_commit` off for this statement's transaction): a lease lost to a server
/// crash only makes its jobs ready again with their earlier attempt count, and any effect of a
/// lease (a group's commit, an ack) is a later synchronous commit, whose flush makes the lease
/// durable first. A worker's crash loses nothing of it.
///
/// It answers in one row, as arrays in id order (insertion order, which is also the fetch order
/// among rows due at the same time), each job's id, payload, deliveries, lease generation, and
/// whether it was leased before (a lease that expired unsettled: [`Delivery::expired`]), and the
/// earliest `visible_at` the rows had (`first`, the next mark); every lease ends at `$3`. A payload
/// longer than `$6` bytes is not read: it comes back empty, flagged `oversized`. One row
/// of arrays, rather than a row per job, costs the client a fraction of the decoding. It fetches
/// the rows without a lane: a fair queue's rows have one, and `core.lease_fair` fetches them.
///
/// Public for one reader only, `jobs-bench`'s raw baseline, so that what the runtime is
/// compared with is always the statement the queue runs; hidden from the documentation, not
/// part of the API a module binary uses.
#[doc(hidden)]
pub const LEASE_STATEMENT: &str = "with async_commit as \
         (select set_config('synchronous_commit', 'off', true)), \
     leased as (update core.jobs j set leased = true, visible_at = $3, \
         deliveries = j.deliveries + 1, lease_gen = j.lease_gen + 1 \
     from (select id, leased, visible_at from core.jobs where queue = $1 and lane is null \
           and visible_at >= coalesce($5, '-infinity') and visible_at <= $2 \
           order by visible_at, id limit $4 for update skip locked) as c, async_commit \
     where j.id = c.id \
     returning j.id, case when octet_length(j.payload) <= $6 then j.payload else ''::bytea end \
         as payload, j.deliveries, j.lease_gen, c.leased as expired, \
         c.visible_at as was_visible_at, j.tenant_id, octet_length(j.payload) > $6 as oversized) \
     select min(was_visible_at) as first, \
         coalesce(array_agg(id order by id), '{}') as ids, \
         coalesce(array_agg(payload order by id), '{}') as payloads, \
         coalesce(array_agg(deliveries order by id), '{}') as deliveries, \
         coalesce(array_agg(lease_gen order by id), '{}') as generations, \
         coalesce(array_agg(expired order by id), '{}') as expired, \
         coalesce(array_agg(oversized order by id), '{}') as oversized, \
         coalesce(array_agg(tenant_id order by id), '{}') as tenants \
     from leased";

/// The error of a settlement whose lease no longer holds its row: settled already, expired
/// and leased again, or a token that is not this queue's.
fn lost(queue: &QueueName) -> QueueError {
    QueueError::LeaseLost {
        queue: queue.clone(),
    }
}

#[async_trait]
impl QueuePort for PgQueue {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let mut conn = self.connection(queue).await?;
        self.publish_in(&mut conn, queue, envelope, opts).await
    }
}

#[async_trait]
impl PullPort for PgQueue {
    /// One statement: the oldest ready rows, skipping those another receiver holds locked, are
    /// leased (a new fencing generation, one delivery more) and returned. Rows over the
    /// envelope limit ([`PgQueue::with_envelope_limits`]) are leased without their payload and
    /// moved to `core.dead_letters` by a second statement.
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(vec![]);
        }
        let batch = Batch {
            max,
            lease,
            max_bytes: oversized::max_bytes(&self.limits),
        };
        // A fetch that found only rows over the limit fetches again (it moved them away), so
        // that an empty answer still means that nothing is ready.
        for _ in 0..OVERSIZED_ROUNDS {
            let fetched = self.fetch(queue, batch).await?;
            let moved = self.divert(queue, &fetched.oversized).await;
            if fetched.oversized.is_empty() || !fetched.deliveries.is_empty() || !moved {
                return Ok(fetched.deliveries);
            }
        }
        Ok(vec![])
    }

    /// Resolves at the next `core_jobs` notification for `queue` (a committed insert), or one
    /// that came since the last wait; also when the shared listener (re)connects, since
    /// notifications sent while it was not listening are lost. One LISTEN connection serves
    /// every clone of this queue, started by the first wait.
    ///
    /// It also resolves when the queue's next row falls due (a delay or a retry ending, a
    /// lease running out), which no notification announces, so a retry starts on time
    /// rather than at the caller's next poll. Not on a fair queue, whose rows are in lanes:
    /// there the poll covers them.
    async fn wait_for_work(&self, queue: &QueueName) {
        let waker = self.hub.waker(queue.as_str());
        let mut notified = std::pin::pin!(waker.notified());
        // A wake-up kept since the last wait resolves at once, without asking the database;
        // one sent while it is asked is kept by the registration.
        if notified.as_mut().enable() {
            return;
        }
        match self.next_due(queue).await {
            Some(wait) => tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(wait.max(DUE_FLOOR)) => {}
            },
            None => notified.await,
        }
    }

    /// Fetches `queue` through `core.lease_fair` from now on. The first receive lists it in
    /// `core.fair_queues` with `fairness`' limit (one list per database: the last worker to
    /// start with another limit sets it, and says so in its log) and gives its pending rows
    /// their lanes; from then on every worker of the database fetches it fairly, and every
    /// publish gives its rows a lane. Weights come from `core.tenant_weights`
    /// ([`TenantWeights`]).
    fn share_by_tenant(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), jobs_core::Unsupported> {
        self.lanes.want(queue, fairness);
        Ok(())
    }
}

impl PgQueue {
    /// Fetches `queue` fairly from now on, as [`PullPort::share_by_tenant`] does, and lists
    /// it in the database at once rather than at the first receive: for a composition that
    /// publishes before its workers start, so that those jobs are published with their lanes.
    ///
    /// [`PullPort::share_by_tenant`]: jobs_core::PullPort::share_by_tenant
    pub async fn make_fair(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), QueueError> {
        self.lanes.make_fair(&self.pool, queue, fairness).await
    }
}

/// How many fetches one receive makes at most while each finds only rows over the envelope
/// limit.
const OVERSIZED_ROUNDS: usize = 8;

impl PgQueue {
    /// One fetch of `batch` from `queue`, fair or oldest first as the queue is.
    async fn fetch(&self, queue: &QueueName, batch: Batch) -> Result<Fetched, QueueError> {
        match self.lanes.fetch_mode(&self.pool, queue).await? {
            Fetch::Fair(list) => {
                let clock = self.clock.as_ref();
                let lanes = &self.lanes;
                lanes
                    .lease_fair(&self.pool, clock, queue, list, batch)
                    .await
            }
            Fetch::Oldest => self.lease_oldest(queue, batch).await,
        }
    }

    /// Moves the rows over the limit a fetch of `queue` leased to the dead letters; whether
    /// that worked. The deliveries beside them are leased already: should this fail, those
    /// rows come back when their leases end, and that fetch moves them.
    async fn divert(&self, queue: &QueueName, leased: &[(i64, i64)]) -> bool {
        let now = self.clock.now();
        match oversized::divert(&self.pool, queue, &self.limits, now, leased).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(queue = %queue, error = %e, "moving rows over the envelope limit failed");
                false
            }
        }
    }

    /// One [`LEASE_STATEMENT`]: the oldest ready rows without a lane, from the queue's mark.
    async fn lease_oldest(&self, queue: &QueueName, batch: Batch) -> Result<Fetched, QueueError> {
        let Batch {
            max,
            lease,
            max_bytes,
        } = batch;
        let now = self.clock.now();
        let until = timestamp(queue, later(queue, now, lease, "lease")?)?;
        let start = self.marks.start(queue);
        let from = start.from.map(|from| timestamp(queue, from)).transpose()?;
        let leased: Leased = sqlx::query_as(LEASE_STATEMENT)
            .bind(queue.as_str())
            .bind(timestamp(queue, now)?)
            .bind(until)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(from)
            .bind(max_bytes)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| queue_error(queue, "lease jobs from core.jobs", e))?;
        self.marks.learn(queue, start, now, leased.first());
        // The lease's end as the database keeps it, to the microsecond.
        let until = from_timestamp(until).map_err(|e| QueueError::Rejected {
            queue: queue.clone(),
            reason: e.to_string(),
        })?;
        Ok(leased.deliveries(queue, until))
    }
}

/// Weights in `core.tenant_weights`, which `core.lease_fair` reads in the same round trip.
#[async_trait]
impl TenantWeights for PgQueue {
    async fn set_weight(
        &self,
        queue: &QueueName,
        tenant: TenantId,
        weight: NonZeroU32,
    ) -> Result<(), QueueError> {
        fair::set_weight(&self.pool, queue, tenant, weight).await
    }
}

/// The shortest a wait for a row's due time sleeps: a row due already (one another receiver
/// holds locked), or a clock that does not move (a test's manual clock), costs one query per
/// this, never a spin.
const DUE_FLOOR: Duration = Duration::from_millis(5);

impl PgQueue {
    /// How long until `queue`'s first row becomes ready: zero for one that got ready since
    /// the caller's empty receive; none when there is no row, when every row is in a lane (a
    /// fair queue), or when the database does not answer (the wait then relies on the
    /// notification and the caller's poll).
    async fn next_due(&self, queue: &QueueName) -> Option<Duration> {
        let from = self.marks.low(queue).map(to_timestamp).transpose().ok()?;
        let due: Option<DateTime<Utc>> = sqlx::query_scalar(
            "select min(visible_at) from core.jobs where queue = $1 and lane is null \
             and visible_at >= coalesce($2, '-infinity')",
        )
        .bind(queue.as_str())
        .bind(from)
        .fetch_one(&self.pool)
        .await
        .ok()?;
        let due = from_timestamp(due?).ok()?;
        Some(due.duration_since(self.clock.now()).unwrap_or_default())
    }
}

#[async_trait]
impl SettlePort for PgQueue {
    /// Deletes the row, if this lease still holds it.
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.settle(lease, fenced!("delete from core.jobs"), None)
            .await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.settle(
            lease,
            fenced!("update core.jobs set leased = false, visible_at = $4"),
            Some(at),
        )
        .await
    }

    /// Gives the delivery's attempt back, so the next one carries the same number.
    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.settle(
            lease,
            fenced!(
                "update core.jobs set leased = false, visible_at = $4, \
                 deliveries = greatest(deliveries - 1, 0)"
            ),
            Some(until),
        )
        .await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let until = later(lease.queue(), self.clock.now(), by, "lease extension")?;
        self.settle(
            lease,
            fenced!("update core.jobs set visible_at = $4"),
            Some(until),
        )
        .await?;
        Ok(Lease::new(
            lease.queue().clone(),
            lease.token().to_owned(),
            until,
        ))
    }
}

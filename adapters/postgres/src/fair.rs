//! Fair dequeue across tenants on the PostgreSQL queue (ADR 0013): which queues are fetched
//! through `core.lease_fair`, listing them in `core.fair_queues`, the fetch itself, and the
//! weights of `core.tenant_weights`.
//!
//! The database's list is what counts: a queue listed there gives its rows a lane at insert
//! and is fetched fairly by every worker, also by one built without asking for it (which
//! reads the list again every [`RECHECK`]), so one process cannot serve a fair queue oldest
//! first.
//!
//! The fetch reads each lane from a low-water mark of its own (ADR 0015, [`Mark`]): the lanes
//! it has met, at most [`MAX_LANES`] per queue, go to `core.lease_fair_marked` with their
//! marks, so that a snapshot held elsewhere does not make every visit of a lane walk the
//! entries its done jobs left; lanes it has not met are found between them as before. A lane
//! whose visits found nothing ready for [`FORGET`] is forgotten.
//!
//! The queue keeps a [`Lanes`] for its clones and calls in with what each statement needs,
//! its pool and its clock: the fair fetch does not know the queue, so the dependency runs one
//! way, from the queue to here.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use jobs_core::{Clock, QueueError, QueueName, TenantFairness, TenantId};
use sqlx::PgPool;
use sqlx::postgres::PgRow;
use sqlx::types::Uuid;
use tokio::time::Instant;

use crate::convert::from_timestamp;
use crate::mark::{Mark, Start};
use crate::rows::{Batch, Fetched, deliveries, queue_error, timestamp};

/// How long a queue not asked to be fair trusts its last reading of `core.fair_queues`.
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

/// The most lanes of one queue whose marks a process keeps; the fetch finds the others
/// between them, read from their start.
const MAX_LANES: usize = 1_024;

/// How long a lane stays known while every visit finds nothing ready in it.
const FORGET: Duration = Duration::from_secs(60);

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
    /// The lanes met, ascending as PostgreSQL orders uuids (by their bytes).
    known: BTreeMap<Uuid, Known>,
}

/// What the fair fetch knows of one lane.
#[derive(Debug, Clone, Copy)]
struct Known {
    mark: Mark,
    /// Since when every visit found no ready row at or above the mark.
    empty_since: Option<std::time::Instant>,
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

    /// One call of `core.lease_fair_marked`, after listing the queue when `list` says so;
    /// the deliveries in the order the rounds served them. "Now" is read from `clock` after
    /// the listing, so the leases start when the fetch does.
    pub(crate) async fn lease_fair(
        &self,
        pool: &PgPool,
        clock: &dyn Clock,
        queue: &QueueName,
        list: Option<TenantFairness>,
        batch: Batch,
    ) -> Result<Fetched, QueueError> {
        let Batch {
            max,
            lease,
            max_bytes,
        } = batch;
        if let Some(fairness) = list {
            self.list(pool, queue, fairness).await?;
        }
        let now = clock.now();
        let at = std::time::Instant::now();
        let (after, left) = self.cursor(queue);
        let (lanes, starts) = self.known_lanes(queue, at);
        let marks = starts
            .iter()
            .map(|start| start.from.map(|from| timestamp(queue, from)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let rows = sqlx::query(
            "select f.id, \
                    case when octet_length(f.payload) <= $9 then f.payload else ''::bytea end, \
                    f.deliveries, f.lease_gen, f.visible_at, f.expired, f.ord, f.cursor_lane, \
                    f.cursor_left, f.mark_lane, f.mark_first, octet_length(f.payload) > $9, \
                    j.tenant_id \
             from core.lease_fair_marked($1, $2, $3, $4, $5, $6, $7, $8) as f \
             left join core.jobs as j on j.id = f.id",
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
        .bind(&lanes)
        .bind(&marks)
        .bind(max_bytes)
        .fetch_all(pool)
        .await
        .map_err(|e| queue_error(queue, "lease jobs fairly from core.jobs", e))?;
        let (leased, seen) = split(queue, rows)?;
        self.learn(queue, &lanes, &starts, at, now, seen);
        if let Some(row) = leased.first() {
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
        deliveries(queue, leased, 6, 11, 12)
    }

    /// The lanes of `queue` its next fair fetch knows, ascending, and where the fetch starting
    /// at `at` reads each from.
    fn known_lanes(&self, queue: &QueueName, at: std::time::Instant) -> (Vec<Uuid>, Vec<Start>) {
        let queues = self.lock();
        let Some(lane) = queues.get(queue) else {
            return (vec![], vec![]);
        };
        lane.known
            .iter()
            .map(|(id, known)| (*id, Start::at(Some(&known.mark), at)))
            .unzip()
    }

    /// The marks after a fetch of `queue` that started at `at` (`now` on the queue's clock),
    /// passing `lanes` with their `starts`, and whose visits found `seen`: each lane visited,
    /// with its earliest candidate's `visible_at`, or none when nothing in it was ready.
    fn learn(
        &self,
        queue: &QueueName,
        lanes: &[Uuid],
        starts: &[Start],
        at: std::time::Instant,
        now: SystemTime,
        seen: Vec<(Uuid, Option<SystemTime>)>,
    ) {
        let mut queues = self.lock();
        let Some(lane) = queues.get_mut(queue) else {
            return;
        };
        let mut emptied = false;
        for (id, first) in seen {
            // A lane the fetch did not know was read from its start.
            let start = lanes
                .binary_search(&id)
                .map_or(Start::at(None, at), |i| starts[i]);
            let known = lane.known.get(&id);
            if known.is_none() && lane.known.len() >= MAX_LANES {
                continue;
            }
            let empty_since = match first {
                Some(_) => None,
                None => {
                    emptied = true;
                    Some(known.and_then(|k| k.empty_since).unwrap_or(at))
                }
            };
            let mark = Mark::after(known.map(|k| &k.mark), start, now, first);
            lane.known.insert(id, Known { mark, empty_since });
        }
        if emptied {
            lane.known.retain(|_, known| {
                known
                    .empty_since
                    .is_none_or(|since| at.saturating_duration_since(since) < FORGET)
            });
        }
    }
}

/// `core.lease_fair_marked`'s answer: the leased rows, and apart from them what each visited
/// lane showed (its earliest candidate's `visible_at`, none when nothing was ready).
type Answer = (Vec<PgRow>, Vec<(Uuid, Option<SystemTime>)>);

fn split(queue: &QueueName, rows: Vec<PgRow>) -> Result<Answer, QueueError> {
    use sqlx::Row;
    let corrupt = |e: sqlx::Error| queue_error(queue, "read a leased row", e);
    let mut leased = Vec::with_capacity(rows.len());
    let mut seen = Vec::new();
    for row in rows {
        let id: Option<i64> = row.try_get(0).map_err(corrupt)?;
        if id.is_some() {
            leased.push(row);
            continue;
        }
        let lane: Option<Uuid> = row.try_get(9).map_err(corrupt)?;
        let first: Option<DateTime<Utc>> = row.try_get(10).map_err(corrupt)?;
        if let Some(lane) = lane {
            seen.push((lane, first.and_then(|first| from_timestamp(first).ok())));
        }
    }
    Ok((leased, seen))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueName {
        "billing.invoices".parse().unwrap()
    }

    fn lane(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// Lanes of a queue this process fetches fairly.
    fn lanes() -> Lanes {
        let lanes = Lanes::default();
        lanes.want(&queue(), TenantFairness::round_robin());
        lanes
    }

    /// A fetch at `at` (`now` on the queue's clock) that found `seen`.
    fn fetch(lanes: &Lanes, at: std::time::Instant, now: SystemTime, seen: &[(Uuid, Option<u64>)]) {
        let (known, starts) = lanes.known_lanes(&queue(), at);
        let seen = seen
            .iter()
            .map(|(l, first)| (*l, first.map(super::tests::at)))
            .collect();
        lanes.learn(&queue(), &known, &starts, at, now, seen);
    }

    #[test]
    fn lanes_met_are_passed_ascending_with_their_marks() {
        let lanes = lanes();
        let start = std::time::Instant::now();
        fetch(
            &lanes,
            start,
            at(1_000),
            &[(lane(9), Some(900)), (lane(3), None)],
        );
        let (known, starts) = lanes.known_lanes(&queue(), start);
        assert_eq!(known, vec![lane(3), lane(9)]);
        let from: Vec<_> = starts.iter().map(|s| s.from).collect();
        assert_eq!(
            from,
            vec![Some(at(999)), Some(at(900))],
            "a second behind, or the first row"
        );
    }

    #[test]
    fn a_lane_is_swept_on_its_own_when_its_sweep_is_due() {
        let lanes = lanes();
        let start = std::time::Instant::now();
        fetch(&lanes, start, at(1_000), &[(lane(1), Some(900))]);
        let later = start + Duration::from_millis(1_500);
        fetch(&lanes, later, at(1_001), &[(lane(2), Some(950))]);
        let (known, starts) = lanes.known_lanes(&queue(), later + Duration::from_millis(100));
        assert_eq!(known, vec![lane(1), lane(2)]);
        assert_eq!(starts[0].from, None, "lane 1's sweep is due");
        assert_eq!(starts[1].from, Some(at(950)), "lane 2 was swept just now");
    }

    #[test]
    fn a_lane_with_nothing_ready_for_a_minute_is_forgotten() {
        let lanes = lanes();
        let start = std::time::Instant::now();
        fetch(
            &lanes,
            start,
            at(1_000),
            &[(lane(1), None), (lane(2), Some(990))],
        );
        fetch(&lanes, start + FORGET / 2, at(1_030), &[(lane(1), None)]);
        assert_eq!(lanes.known_lanes(&queue(), start).0, vec![lane(1), lane(2)]);
        fetch(&lanes, start + FORGET, at(1_060), &[(lane(1), None)]);
        assert_eq!(
            lanes.known_lanes(&queue(), start).0,
            vec![lane(2)],
            "empty since the first fetch, a minute ago"
        );
        fetch(
            &lanes,
            start + FORGET * 2,
            at(1_120),
            &[(lane(2), Some(1_100))],
        );
        assert_eq!(lanes.known_lanes(&queue(), start).0, vec![lane(2)]);
    }

    #[test]
    fn a_lane_with_rows_again_is_no_longer_empty() {
        let lanes = lanes();
        let start = std::time::Instant::now();
        fetch(&lanes, start, at(1_000), &[(lane(1), None)]);
        fetch(
            &lanes,
            start + FORGET / 2,
            at(1_030),
            &[(lane(1), Some(1_020))],
        );
        fetch(&lanes, start + FORGET, at(1_060), &[(lane(1), None)]);
        assert_eq!(lanes.known_lanes(&queue(), start).0, vec![lane(1)]);
    }

    #[test]
    fn the_lanes_kept_are_bounded() {
        let lanes = lanes();
        let start = std::time::Instant::now();
        {
            let mut queues = lanes.lock();
            let known = &mut queues.get_mut(&queue()).unwrap().known;
            for n in 0..MAX_LANES as u32 {
                let mut id = [0u8; 16];
                id[..4].copy_from_slice(&n.to_be_bytes());
                let mark = Mark::after(None, Start::at(None, start), at(1_000), None);
                known.insert(
                    Uuid::from_bytes(id),
                    Known {
                        mark,
                        empty_since: None,
                    },
                );
            }
        }
        fetch(&lanes, start, at(1_000), &[(lane(0xff), Some(900))]);
        let (known, _) = lanes.known_lanes(&queue(), start);
        assert_eq!(known.len(), MAX_LANES);
        assert!(
            !known.contains(&lane(0xff)),
            "a lane past the bound is not kept"
        );
    }
}

//! The queue's low-water marks (ADR 0015) against a real PostgreSQL: a fetch reads the ready
//! index from where the last one found its first row, a row committed below that is late by
//! one sweep and never lost, and rows due later or whose lease runs out stay above it; a fair
//! queue's fetch does the same per lane, finds a lane it does not know at once, and under a
//! held snapshot reads a marked lane without walking the entries of its done jobs. (What the
//! marks save in throughput is measured by `cargo xtask bench soak`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobs_adapter_postgres::{NewJob, PgQueue, sqlx};
use jobs_core::{
    ManualClock, PublishOptions, PullPort, QueueName, QueuePort, SettlePort, TenantFairness,
};
use jobs_testkit::fixtures;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};

use crate::db::with_databases;

const LEASE: Duration = Duration::from_secs(30);

/// Longer than the queue's least time between two sweeps (one second).
const SWEEP: Duration = Duration::from_millis(1_200);

#[tokio::test]
async fn a_row_committed_below_the_mark_is_late_by_one_sweep_never_lost() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let clock = ManualClock::default();
        let queue = PgQueue::new(pool.clone()).with_clock(Arc::new(clock.clone()));
        let q: QueueName = "mark.jobs".parse().expect("a queue name");
        let publish = |n: u64| {
            let queue = queue.clone();
            let q = q.clone();
            async move {
                queue
                    .publish(&q, &fixtures::envelope(1, n), PublishOptions::default())
                    .await
                    .expect("publish");
            }
        };
        publish(1).await;
        // The first fetch sweeps: the ones within a second of it read from the mark.
        let swept_at = Instant::now();
        let first = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(first.len(), 1);
        queue.ack(&first[0].lease).await.expect("ack");

        // A minute on, a job is fetched: the mark is now a second behind it.
        clock.advance(Duration::from_secs(60));
        publish(2).await;
        let second = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(second.len(), 1);
        queue.ack(&second[0].lease).await.expect("ack");

        // A publisher whose clock is half a minute behind commits a row below the mark.
        let behind = ManualClock::default();
        behind.advance(Duration::from_secs(30));
        PgQueue::new(pool.clone())
            .with_clock(Arc::new(behind))
            .publish(&q, &fixtures::envelope(1, 3), PublishOptions::default())
            .await
            .expect("publish from behind");
        let skipped = queue.receive(&q, 10, LEASE).await.expect("receive");
        if !skipped.is_empty() {
            // Only a sweep reads below the mark: this machine took more than a second.
            assert!(
                swept_at.elapsed() >= Duration::from_secs(1),
                "a fetch between sweeps reads from the mark, not the index's start"
            );
            return;
        }
        let rows: i64 = sqlx::query_scalar("select count(*) from core.jobs")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(rows, 1, "the row is there, below the mark");

        tokio::time::sleep(SWEEP).await;
        let swept = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(swept.len(), 1, "the next sweep finds the row");
        assert_eq!(swept[0].attempt, 1);
        queue.ack(&swept[0].lease).await.expect("ack");
    })
    .await;
}

#[tokio::test]
async fn rows_due_later_and_expired_leases_stay_above_the_mark() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let clock = ManualClock::default();
        let queue = PgQueue::new(pool.clone()).with_clock(Arc::new(clock.clone()));
        let q: QueueName = "mark.later".parse().expect("a queue name");
        let publish = |n: u64, delay: Duration| {
            let queue = queue.clone();
            let q = q.clone();
            async move {
                queue
                    .publish(
                        &q,
                        &fixtures::envelope(1, n),
                        PublishOptions::default().delay(delay),
                    )
                    .await
                    .expect("publish");
            }
        };
        publish(1, Duration::ZERO).await;
        publish(2, Duration::from_secs(600)).await;
        let held = queue.receive(&q, 1, LEASE).await.expect("receive");
        assert_eq!(held.len(), 1, "the ready row");

        // Fetches go on at later times while the lease runs out and the delay ends.
        for step in 1..=20 {
            clock.advance(Duration::from_secs(60));
            publish(100 + step, Duration::ZERO).await;
            let got = queue.receive(&q, 1, LEASE).await.expect("receive");
            assert_eq!(got.len(), 1, "step {step}");
            if got[0].expired {
                // The lease of job 1 ran out: delivered again, one attempt more.
                assert_eq!(got[0].attempt, 2);
            }
            queue.ack(&got[0].lease).await.expect("ack");
        }
        let left = queue.receive(&q, 100, LEASE).await.expect("receive");
        let rows: i64 = sqlx::query_scalar("select count(*) from core.jobs")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(
            rows as usize,
            left.len(),
            "every row left is fetched without a sweep"
        );
    })
    .await;
}

/// A fair queue on `pool`, on `clock`.
async fn fair(pool: &PgPool, clock: &ManualClock, q: &QueueName) -> PgQueue {
    let queue = PgQueue::new(pool.clone()).with_clock(Arc::new(clock.clone()));
    queue
        .make_fair(q, TenantFairness::round_robin())
        .await
        .expect("the queue made fair");
    queue
}

/// The tenant of a delivery's job.
fn tenant_of(delivery: &jobs_core::Delivery) -> jobs_core::TenantId {
    jobs_core::Envelope::decode(&delivery.payload)
        .expect("a job")
        .tenant_id
}

#[tokio::test]
async fn a_fair_lane_is_read_from_its_mark_and_a_new_lane_is_found_at_once() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let clock = ManualClock::default();
        let q: QueueName = "mark.fair".parse().expect("a queue name");
        let queue = fair(&pool, &clock, &q).await;
        let publish = |queue: PgQueue, tenant: u32, n: u64| {
            let q = q.clone();
            async move {
                let job = fixtures::envelope(tenant, n);
                queue
                    .publish(&q, &job, PublishOptions::default())
                    .await
                    .expect("publish");
            }
        };
        publish(queue.clone(), 1, 1).await;
        // The first visit of lane 1 reads it from its start; those within a second of it
        // read from its mark.
        let swept_at = Instant::now();
        let first = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(first.len(), 1);
        queue.ack(&first[0].lease).await.expect("ack");
        clock.advance(Duration::from_secs(60));
        publish(queue.clone(), 1, 2).await;
        let second = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(second.len(), 1);
        queue.ack(&second[0].lease).await.expect("ack");

        // A publisher half a minute behind commits a row below lane 1's mark; tenant 2, whom
        // no fetch has met, publishes now.
        let behind = ManualClock::default();
        behind.advance(Duration::from_secs(30));
        let late = PgQueue::new(pool.clone()).with_clock(Arc::new(behind));
        publish(late, 1, 3).await;
        publish(queue.clone(), 2, 4).await;
        let got = queue.receive(&q, 10, LEASE).await.expect("receive");
        let tenants: Vec<_> = got.iter().map(tenant_of).collect();
        assert!(
            tenants.contains(&fixtures::tenant(2)),
            "a lane no fetch knew is found by the next fetch: {tenants:?}"
        );
        for delivery in &got {
            queue.ack(&delivery.lease).await.expect("ack");
        }
        if got.len() == 2 {
            // Only a sweep of lane 1 reads below its mark: this machine took over a second.
            assert!(
                swept_at.elapsed() >= Duration::from_secs(1),
                "a visit between sweeps reads the lane from its mark"
            );
            return;
        }
        assert_eq!(got.len(), 1, "lane 1's late row is below its mark");

        tokio::time::sleep(SWEEP).await;
        let swept = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(swept.len(), 1, "the next sweep of lane 1 finds the row");
        assert_eq!(tenant_of(&swept[0]), fixtures::tenant(1));
        assert_eq!(swept[0].attempt, 1);
        queue.ack(&swept[0].lease).await.expect("ack");
    })
    .await;
}

/// The index entries of `core.jobs_lanes` the scans of every backend returned so far, after
/// `conn`'s own are flushed to the shared statistics.
async fn lane_entries_read(pool: &PgPool) -> i64 {
    sqlx::query("select pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .expect("flush the statistics");
    sqlx::query_scalar("select pg_stat_get_tuples_returned('core.jobs_lanes'::regclass)")
        .fetch_one(pool)
        .await
        .expect("read the statistics")
}

#[tokio::test]
async fn under_a_held_snapshot_a_marked_lane_is_read_without_walking_its_done_jobs() {
    const JOBS: usize = 2_000;
    const LEFT: usize = 10;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        // One connection: the fetches and the reads of their statistics share a backend.
        let options = store.pool().connect_options().as_ref().clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .expect("a pool of one");
        let clock = ManualClock::default();
        let q: QueueName = "mark.fair.held".parse().expect("a queue name");
        let queue = fair(&pool, &clock, &q).await;
        // Tenant 1's jobs a millisecond apart, as a stream of publishes would be.
        let jobs: Vec<NewJob> = (0..JOBS)
            .map(|i| NewJob {
                envelope: fixtures::envelope(1, i as u64),
                opts: PublishOptions::default().delay(Duration::from_millis(i as u64)),
            })
            .collect();
        queue.publish_batch(&q, &jobs).await.expect("publish");
        clock.advance(Duration::from_secs(10));

        // A report's snapshot, taken now and held to the end.
        let mut report = sqlx::PgConnection::connect_with(&options)
            .await
            .expect("the report's connection");
        sqlx::query("begin isolation level repeatable read")
            .execute(&mut report)
            .await
            .expect("begin");
        sqlx::query("select count(*) from core.jobs")
            .execute(&mut report)
            .await
            .expect("the report reads");

        let mut done = 0;
        while done < JOBS - LEFT {
            let batch = queue
                .receive(&q, 50.min(JOBS - LEFT - done), LEASE)
                .await
                .expect("receive");
            assert!(!batch.is_empty(), "ready jobs are fetched");
            for delivery in &batch {
                queue.ack(&delivery.lease).await.expect("ack");
            }
            done += batch.len();
        }

        // Two fetches in a row: at most one of them can be a sweep of the lane.
        let mut reads = vec![];
        let mut left = vec![];
        for _ in 0..2 {
            let before = lane_entries_read(&pool).await;
            left.extend(queue.receive(&q, 1, LEASE).await.expect("receive"));
            reads.push(lane_entries_read(&pool).await - before);
        }
        let least = reads.iter().copied().min().unwrap_or(i64::MAX);
        assert!(
            least < 200,
            "a fetch from the lane's mark reads a few entries, not the {done} its done jobs \
             left: {reads:?}"
        );

        // The fetch without marks, as workers of the previous version run it, walks them.
        let before = lane_entries_read(&pool).await;
        let now = sqlx::types::chrono::DateTime::<sqlx::types::chrono::Utc>::from(
            jobs_core::Clock::now(&clock),
        );
        let rows = sqlx::query("select id from core.lease_fair($1, $2, $3, 1, null, 0)")
            .bind(q.as_str())
            .bind(now)
            .bind(now + Duration::from_secs(30))
            .fetch_all(&pool)
            .await
            .expect("the unmarked fetch");
        let unmarked = lane_entries_read(&pool).await - before;
        assert_eq!(rows.len(), 1);
        assert!(
            unmarked >= done as i64,
            "without a mark the fetch walks the done jobs' entries: {unmarked}"
        );

        // Nothing was lost: every job not done is still there.
        let rows: i64 = sqlx::query_scalar("select count(*) from core.jobs")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(rows as usize, LEFT);
        sqlx::query("rollback")
            .execute(&mut report)
            .await
            .expect("the report ends");
        drop(left);
    })
    .await;
}

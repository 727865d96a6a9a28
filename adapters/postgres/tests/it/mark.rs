//! The queue's low-water mark (ADR 0015) against a real PostgreSQL: a fetch reads the ready
//! index from where the last one found its first row, a row committed below that is late by
//! one sweep and never lost, and rows due later or whose lease runs out stay above it. (What
//! the mark saves under a held snapshot is measured by `cargo xtask bench soak`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobs_adapter_postgres::{PgQueue, sqlx};
use jobs_core::{ManualClock, PublishOptions, PullPort, QueueName, QueuePort, SettlePort};
use jobs_testkit::fixtures;

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

//! The transactional outbox on a real PostgreSQL: a job exists iff the business write commits,
//! and the relay delivers each job once downstream even when killed mid-batch or doubled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_postgres::{Outbox, OutboxRelay, sqlx};
use jobs_core::{Envelope, JobId, PublishOptions, QueueError, QueueName, QueuePort, Receipt};
use jobs_testkit::fixtures;
use sqlx::PgPool;

use crate::db::with_databases;

/// A downstream transport that deduplicates by key (as Vercel Queues and QStash do), counts
/// what it accepted, and can hang after a number of publishes, like a relay's process dying
/// mid-batch.
#[derive(Default)]
struct Downstream {
    seen: Mutex<HashMap<String, JobId>>,
    accepted: Mutex<Vec<JobId>>,
    calls: AtomicUsize,
    hang_after: Mutex<Option<usize>>,
    hanging: AtomicBool,
}

#[async_trait]
impl QueuePort for Downstream {
    async fn publish(
        &self,
        _queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let hang_after = *self.seen_lock(&self.hang_after);
        if hang_after.is_some_and(|n| call >= n) {
            self.hanging.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        let key = opts.dedup_key_for(envelope).into_owned();
        let mut seen = self.seen_lock(&self.seen);
        if seen.contains_key(&key) {
            return Ok(Receipt::duplicate_of(Some(key)));
        }
        seen.insert(key.clone(), envelope.job_id);
        self.seen_lock(&self.accepted).push(envelope.job_id);
        Ok(Receipt::queued(Some(key)))
    }
}

impl Downstream {
    fn seen_lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn accepted(&self) -> Vec<JobId> {
        self.seen_lock(&self.accepted).clone()
    }
}

fn queue() -> QueueName {
    "outbox.jobs".parse().expect("valid")
}

async fn outbox_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from core.outbox")
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Writes `n` jobs for two tenants through the outbox, each in a committed transaction with a
/// business row; returns them in commit order.
async fn commit_jobs(pool: &PgPool, n: u64) -> Vec<Envelope> {
    let outbox = Outbox::new();
    let mut jobs = vec![];
    for i in 0..n {
        let envelope = fixtures::envelope(1 + u32::from(i % 2 == 1), i);
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("insert into orders (job_id) values ($1)")
            .bind(envelope.job_id.as_uuid())
            .execute(&mut *tx)
            .await
            .expect("the business write");
        outbox
            .publish_in(&mut tx, &queue(), &envelope, PublishOptions::default())
            .await
            .expect("publish in the transaction");
        tx.commit().await.expect("commit");
        jobs.push(envelope);
    }
    jobs
}

/// Relays batches of `batch` until one forwards nothing, and returns how many rows left the
/// outbox; a relay that never says it is done fails the test instead of holding it.
async fn relay_all(relay: &OutboxRelay, batch: usize) -> usize {
    let mut moved = 0;
    for _ in 0..1_000 {
        let n = relay.relay_once(batch).await.expect("relay");
        if n == 0 {
            return moved;
        }
        moved += n;
    }
    panic!("the relay still forwards after 1,000 batches ({moved} rows)");
}

async fn orders_table(pool: &PgPool) {
    sqlx::query("create table orders (job_id uuid primary key)")
        .execute(pool)
        .await
        .expect("create orders");
}

#[tokio::test]
async fn a_rolled_back_business_write_leaves_no_job() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        orders_table(&pool).await;
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("insert into orders (job_id) values ($1)")
            .bind(JobId::generate().as_uuid())
            .execute(&mut *tx)
            .await
            .expect("the business write");
        Outbox::new()
            .publish_in(
                &mut tx,
                &queue(),
                &fixtures::envelope(1, 1),
                PublishOptions::default(),
            )
            .await
            .expect("publish in the transaction");
        tx.rollback().await.expect("roll back");
        assert_eq!(outbox_rows(&pool).await, 0, "the job outlived its rollback");

        let downstream = Arc::new(Downstream::default());
        let relay = OutboxRelay::new(pool.clone(), downstream.clone());
        assert_eq!(relay.relay_once(10).await.expect("relay"), 0);
        assert!(downstream.accepted().is_empty());

        let jobs = commit_jobs(&pool, 3).await;
        assert_eq!(relay.relay_once(10).await.expect("relay"), 3);
        let sent: Vec<JobId> = jobs.iter().map(|e| e.job_id).collect();
        assert_eq!(downstream.accepted(), sent, "the committed jobs, in order");
        assert_eq!(outbox_rows(&pool).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_mid_batch_and_restarted_delivers_each_job_once() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        orders_table(&pool).await;
        let jobs = commit_jobs(&pool, 20).await;
        let downstream = Arc::new(Downstream::default());
        *downstream.seen_lock(&downstream.hang_after) = Some(7);
        let relay = OutboxRelay::new(pool.clone(), downstream.clone());

        let doomed = tokio::spawn({
            let relay = relay.clone();
            async move { relay.relay_once(50).await }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !downstream.hanging.load(Ordering::SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay never reached its seventh forward"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        doomed.abort();
        assert!(doomed.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(downstream.accepted().len(), 7, "forwarded before the kill");
        assert_eq!(
            outbox_rows(&pool).await,
            20,
            "the killed relay committed nothing"
        );

        *downstream.seen_lock(&downstream.hang_after) = None;
        let restarted = OutboxRelay::new(pool.clone(), downstream.clone());
        assert_eq!(relay_all(&restarted, 6).await, 20);
        let sent: Vec<JobId> = jobs.iter().map(|e| e.job_id).collect();
        assert_eq!(
            downstream.accepted(),
            sent,
            "each job accepted once downstream, in commit order"
        );
        assert_eq!(outbox_rows(&pool).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_at_once_forward_each_job_once_in_order() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        orders_table(&pool).await;
        let jobs = commit_jobs(&pool, 40).await;
        let downstream = Arc::new(Downstream::default());
        let relays: Vec<_> = (0..2)
            .map(|_| {
                let relay = OutboxRelay::new(pool.clone(), downstream.clone());
                tokio::spawn(async move { relay_all(&relay, 5).await })
            })
            .collect();
        for relay in relays {
            relay.await.expect("a relay");
        }
        let sent: Vec<JobId> = jobs.iter().map(|e| e.job_id).collect();
        assert_eq!(downstream.accepted(), sent);
        assert_eq!(
            downstream.calls.load(Ordering::SeqCst),
            40,
            "a row was forwarded twice"
        );
    })
    .await;
}

#[tokio::test]
async fn a_row_committed_below_the_relays_mark_is_forwarded_by_the_next_sweep() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let outbox = Outbox::new();
        let downstream = Arc::new(Downstream::default());
        let relay = OutboxRelay::new(pool.clone(), downstream.clone());
        // A transaction takes its row's id, then commits after a relay has read past it.
        let slow = fixtures::envelope(1, 1);
        let mut open = pool.begin().await.expect("begin");
        outbox
            .publish_in(&mut open, &queue(), &slow, PublishOptions::default())
            .await
            .expect("the slow row");
        let fast = fixtures::envelope(1, 2);
        let mut tx = pool.begin().await.expect("begin");
        outbox
            .publish_in(&mut tx, &queue(), &fast, PublishOptions::default())
            .await
            .expect("the fast row");
        tx.commit().await.expect("commit");
        let swept_at = std::time::Instant::now();
        assert_eq!(relay.relay_once(10).await.expect("relay"), 1);
        open.commit().await.expect("the slow row commits");

        let next = relay.relay_once(10).await.expect("relay");
        if next == 0 {
            assert_eq!(
                outbox_rows(&pool).await,
                1,
                "the slow row waits below the mark"
            );
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            assert_eq!(
                relay.relay_once(10).await.expect("relay"),
                1,
                "the sweep finds it"
            );
        } else {
            // Only a sweep reads below the mark: this machine took more than a second.
            assert!(swept_at.elapsed() >= Duration::from_secs(1));
        }
        assert_eq!(downstream.accepted(), vec![fast.job_id, slow.job_id]);
        assert_eq!(outbox_rows(&pool).await, 0);
    })
    .await;
}

#[tokio::test]
async fn under_a_held_snapshot_the_relay_reads_from_its_mark() {
    const ROWS: u64 = 2_000;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        // One connection: the relay's reads and the reads of their statistics share a backend.
        let options = store.pool().connect_options().as_ref().clone();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .expect("a pool of one");
        let outbox = Outbox::new();
        let mut tx = pool.begin().await.expect("begin");
        for n in 0..ROWS {
            let job = fixtures::envelope(1, n);
            outbox
                .publish_in(&mut tx, &queue(), &job, PublishOptions::default())
                .await
                .expect("publish");
        }
        tx.commit().await.expect("commit");
        let mut report = <sqlx::PgConnection as sqlx::Connection>::connect_with(&options)
            .await
            .expect("the report's connection");
        for statement in [
            "begin isolation level repeatable read",
            "select count(*) from core.outbox",
        ] {
            sqlx::query(statement)
                .execute(&mut report)
                .await
                .expect("the report reads");
        }
        let relay = OutboxRelay::new(pool.clone(), Arc::new(Downstream::default()));
        let mut forwarded = 0;
        for _ in 0..ROWS {
            if forwarded >= ROWS - 10 {
                break;
            }
            forwarded += relay
                .relay_once(100.min((ROWS - 10 - forwarded) as usize))
                .await
                .expect("relay") as u64;
        }
        assert_eq!(
            forwarded,
            ROWS - 10,
            "the relay forwards what it is asked to"
        );
        let entries = |pool: PgPool| async move {
            sqlx::query("select pg_stat_force_next_flush()")
                .execute(&pool)
                .await
                .expect("flush the statistics");
            sqlx::query_scalar::<_, i64>(
                "select pg_stat_get_tuples_returned('core.outbox_pkey'::regclass)",
            )
            .fetch_one(&pool)
            .await
            .expect("read the statistics")
        };
        // Two reads in a row: at most one of them can be a sweep.
        let mut reads = vec![];
        for _ in 0..2 {
            let before = entries(pool.clone()).await;
            assert_eq!(relay.relay_once(1).await.expect("relay"), 1);
            reads.push(entries(pool.clone()).await - before);
        }
        assert!(
            reads.iter().min().is_some_and(|least| *least < 200),
            "a read from the mark does not walk the {forwarded} rows forwarded: {reads:?}"
        );
        // A read from the outbox's start, as a relay without a mark makes it, walks them.
        let before = entries(pool.clone()).await;
        let ids: Vec<i64> = sqlx::query_scalar("select id from core.outbox order by id limit 1")
            .fetch_all(&pool)
            .await
            .expect("read from the start");
        assert_eq!(ids.len(), 1);
        let walked = entries(pool.clone()).await - before;
        assert!(walked >= forwarded as i64, "from the start: {walked}");
        sqlx::query("rollback")
            .execute(&mut report)
            .await
            .expect("the report ends");
    })
    .await;
}

#[tokio::test]
async fn rows_that_can_never_be_forwarded_become_dead_letters_and_hold_up_nothing() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        orders_table(&pool).await;
        let limits = jobs_core::DecodeLimits::default().max_bytes(4_096);
        let big = fixtures::envelope_with(
            1,
            "test.job",
            serde_json::json!({"blob": "x".repeat(8_192)}),
        );
        let mut tx = pool.begin().await.expect("begin");
        let refused = Outbox::new()
            .with_envelope_limits(limits)
            .publish_in(&mut tx, &queue(), &big, PublishOptions::default())
            .await;
        assert!(
            matches!(refused, Err(QueueError::TooLarge { limit: 4_096, .. })),
            "{refused:?}"
        );
        drop(tx);
        assert_eq!(outbox_rows(&pool).await, 0, "nothing written");

        let before = commit_jobs(&pool, 2).await;
        // Rows an older version or direct SQL wrote: over the limit, not an envelope, and for a
        // queue whose name is not valid.
        sqlx::query(
            "insert into core.outbox (queue, dedup_key, tenant_id, payload, run_at, created_at) \
             values ($1, 'big', $2, $3, now(), now()), ($1, 'junk', $2, 'not json', now(), now()), \
                    ('Bad Name', 'name', $2, $4, now(), now())",
        )
        .bind(queue().as_str())
        .bind(fixtures::tenant(1).as_uuid())
        .bind(big.to_json_bytes().expect("encodes"))
        .bind(fixtures::envelope(1, 99).to_json_bytes().expect("encodes"))
        .execute(&pool)
        .await
        .expect("rows that cannot be forwarded");
        let after = commit_jobs(&pool, 2).await;

        let downstream = Arc::new(Downstream::default());
        let relay = OutboxRelay::new(pool.clone(), downstream.clone()).with_envelope_limits(limits);
        assert_eq!(relay_all(&relay, 10).await, 7, "every row left the outbox");
        let forwarded: Vec<JobId> = before.iter().chain(&after).map(|e| e.job_id).collect();
        assert_eq!(downstream.accepted(), forwarded, "the good rows, in order");
        let letters: Vec<(String, String, bool, Option<String>)> = sqlx::query_as(
            "select d.queue, d.last_error, d.tenant_id = $1, d.reason from core.dead_letters d \
             order by d.id",
        )
        .bind(fixtures::tenant(1).as_uuid())
        .fetch_all(&pool)
        .await
        .expect("letters");
        assert_eq!(letters.len(), 3, "{letters:?}");
        let big_size = big.to_json_bytes().expect("encodes").len();
        assert!(
            letters[0].1.starts_with(&format!(
                "the envelope is {big_size} bytes, over the limit of 4096 bytes"
            )),
            "{letters:?}"
        );
        assert!(letters[1].1.contains("does not decode"), "{letters:?}");
        assert_eq!(
            letters[2].0, "core.outbox",
            "an invalid queue name is kept out"
        );
        assert!(letters[2].1.contains("no valid queue"), "{letters:?}");
        assert!(letters.iter().all(|l| l.2), "each keeps its tenant");
        assert!(
            letters
                .iter()
                .all(|l| l.3.as_deref() == Some("unforwardable")),
            "each says why: {letters:?}"
        );
        let kept: i64 =
            sqlx::query_scalar("select count(*) from core.dead_letters where payload = $1")
                .bind(big.to_json_bytes().expect("encodes"))
                .fetch_one(&pool)
                .await
                .expect("count");
        assert_eq!(kept, 1, "the oversized row's bytes are kept");
    })
    .await;
}

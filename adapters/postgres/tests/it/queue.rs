//! `PgQueue` against a real PostgreSQL: the queue contract suite, the model-based property
//! tests of the runtime (PostgreSQL as both transport and store), and what only this queue
//! has (fencing after a takeover, batch publish, batched consumption, wake-ups, publishing in
//! the caller's transaction).

use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, Wake, sqlx};
use jobs_core::{
    Claim, Clock, ConsumerName, GroupTransaction, ManualClock, PublishOptions, PullPort,
    QueueDepth, QueueError, QueueName, QueuePort, SettleInTransaction, SettlePort, Settlement,
    TenantFairness, WorkStore, WorkTransaction,
};
use jobs_testkit::contract::fairness::{self, FairUnderTest};
use jobs_testkit::contract::queue::{self, QueueUnderTest};
use jobs_testkit::fixtures;
use jobs_testkit::model::{self, Backend, Transport};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::db::{Databases, with_databases};

const LEASE: Duration = Duration::from_secs(30);

fn name(s: &str) -> QueueName {
    s.parse().expect("a valid queue name")
}

/// A queue on a fresh migrated database, on a manual clock.
async fn queue(dbs: &Databases) -> (PgQueue, ManualClock) {
    let store = dbs.store().await;
    let clock = ManualClock::default();
    let queue = PgQueue::new(store.pool().clone()).with_clock(Arc::new(clock.clone()));
    (queue, clock)
}

/// A queue on `pool`'s database, emptied for one check of the contract (and no queue listed
/// as fair), on a manual clock.
async fn emptied(pool: PgPool) -> QueueUnderTest {
    sqlx::query("truncate core.jobs, core.fair_queues")
        .execute(&pool)
        .await
        .expect("empty core.jobs");
    let clock = ManualClock::default();
    QueueUnderTest::of(
        PgQueue::new(pool).with_clock(Arc::new(clock.clone())),
        clock,
    )
}

/// The queue contract with every queue fetched through `core.lease_fair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_queue_passes_the_queue_contract_when_fair() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        queue::run_fair(TenantFairness::round_robin(), || emptied(pool.clone())).await;
    })
    .await;
}

/// Fair dequeue on random mixes of backlogs, weights, limits, holds and retries, each case a
/// queue of its own on one database (`PROPTEST_CASES` raises the count).
#[test]
fn pg_queue_keeps_the_fairness_contract() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (dbs, options) = model_database(&runtime);
    fairness::check(model::cases(24), || {
        let options = options.clone();
        async move {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await
                .expect("connect");
            let clock = ManualClock::default();
            let queue = PgQueue::new(pool).with_clock(Arc::new(clock.clone()));
            FairUnderTest {
                queue: QueueUnderTest::of(queue.clone(), clock),
                weights: Arc::new(queue),
            }
        }
    });
    runtime.block_on(dbs.drop_all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_queue_passes_the_queue_contract() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        queue::run(|| emptied(pool.clone())).await;
    })
    .await;
}

#[tokio::test]
async fn a_stale_lease_can_settle_nothing_once_another_worker_holds_the_job() {
    with_databases(|dbs| async move {
        let (queue, clock) = queue(&dbs).await;
        let q = name("fence.jobs");
        queue
            .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
            .await
            .expect("publish");
        let first = queue
            .receive(&q, 1, LEASE)
            .await
            .expect("receive")
            .remove(0);
        clock.advance(LEASE + Duration::from_secs(1));
        // Expired but not yet taken over: already refused.
        assert!(matches!(
            queue.ack(&first.lease).await,
            Err(QueueError::LeaseLost { .. })
        ));
        let second = queue
            .receive(&q, 1, LEASE)
            .await
            .expect("receive")
            .remove(0);
        assert_eq!(second.attempt, 2);
        let now = jobs_core::Clock::now(&clock);
        for (what, result) in [
            ("ack", queue.ack(&first.lease).await),
            ("retry_at", queue.retry_at(&first.lease, now).await),
            ("defer", queue.defer(&first.lease, now).await),
            ("extend", queue.extend(&first.lease, LEASE).await.map(drop)),
        ] {
            assert!(
                matches!(result, Err(QueueError::LeaseLost { .. })),
                "{what} with the stale lease: {result:?}"
            );
        }
        assert_eq!(
            queue.depth(&q).await.expect("depth").in_flight,
            1,
            "the stale worker moved the job"
        );
        queue.ack(&second.lease).await.expect("the holder acks");
        assert_eq!(queue.depth(&q).await.expect("depth").total(), 0);
        let rows: i64 = sqlx::query_scalar("select count(*) from core.jobs")
            .fetch_one(queue.pool())
            .await
            .expect("count");
        assert_eq!(rows, 0, "an acked job is deleted");
    })
    .await;
}

#[tokio::test]
async fn batch_publish_inserts_once_per_pending_key() {
    with_databases(|dbs| async move {
        let (queue, _clock) = queue(&dbs).await;
        let q = name("batch.jobs");
        let pending = fixtures::envelope(1, 0);
        queue
            .publish(&q, &pending, PublishOptions::default())
            .await
            .expect("publish");
        let mut jobs: Vec<NewJob> = (1..=5)
            .map(|n| NewJob {
                envelope: fixtures::envelope(1, n),
                opts: PublishOptions::default(),
            })
            .collect();
        jobs.push(NewJob {
            envelope: pending,
            opts: PublishOptions::default(),
        });
        jobs.push(jobs[2].clone());
        let receipts = queue
            .publish_batch(&q, &jobs)
            .await
            .expect("publish a batch");
        let duplicates: Vec<bool> = receipts.iter().map(|r| r.duplicate).collect();
        assert_eq!(
            duplicates,
            [false, false, false, false, false, true, true],
            "{receipts:?}"
        );
        assert_eq!(
            receipts[6].message_id, receipts[2].message_id,
            "a repeat within the batch names the first"
        );
        assert_eq!(queue.depth(&q).await.expect("depth").ready, 6);
    })
    .await;
}

#[tokio::test]
async fn publishing_in_a_rolled_back_transaction_leaves_no_job() {
    with_databases(|dbs| async move {
        let (queue, _clock) = queue(&dbs).await;
        let q = name("tx.jobs");
        let mut tx = queue.pool().begin().await.expect("begin");
        queue
            .publish_in(
                &mut tx,
                &q,
                &fixtures::envelope(1, 1),
                PublishOptions::default(),
            )
            .await
            .expect("publish in the transaction");
        tx.rollback().await.expect("roll back");
        assert_eq!(queue.depth(&q).await.expect("depth").total(), 0);
        let mut tx = queue.pool().begin().await.expect("begin");
        queue
            .publish_in(
                &mut tx,
                &q,
                &fixtures::envelope(1, 2),
                PublishOptions::default(),
            )
            .await
            .expect("publish in the transaction");
        assert_eq!(
            queue.depth(&q).await.expect("depth").total(),
            0,
            "visible before the commit"
        );
        tx.commit().await.expect("commit");
        assert_eq!(queue.depth(&q).await.expect("depth").ready, 1);
    })
    .await;
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select count(*) from {table}")))
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test]
async fn hold_and_claim_claims_only_the_jobs_whose_leases_hold() {
    with_databases(|dbs| async move {
        let (queue, clock) = queue(&dbs).await;
        let store = PgStore::from_pool(queue.pool().clone());
        let consumer = ConsumerName::try_from("group.consumer").expect("valid");
        let q = name("group.claims");
        let envelopes: Vec<_> = (0..4).map(|n| fixtures::envelope(1, n)).collect();
        for (i, envelope) in envelopes.iter().enumerate() {
            // Job 3 carries a key of its own; the others are keyed by their job ids.
            let opts = match i {
                3 => PublishOptions::default().dedup_key("invoice-3"),
                _ => PublishOptions::default(),
            };
            queue.publish(&q, envelope, opts).await.expect("publish");
        }
        let first = queue.receive(&q, 4, LEASE).await.expect("receive");
        let job = |i: usize| envelopes[i].job_id;
        // Job 0's lease goes to another worker; job 1 was processed by an earlier copy.
        clock.advance(LEASE * 2);
        let taken = queue.receive(&q, 1, LEASE).await.expect("receive");
        assert_eq!(taken[0].message_id, first[0].message_id);
        let mut tx = store.begin().await.expect("begin");
        tx.claim(job(1), &consumer, clock.now())
            .await
            .expect("claim");
        tx.commit().await.expect("commit");

        let deliveries: Vec<_> = (0..4).map(|i| (&first[i].lease, job(i))).collect();
        let mut tx = store.begin().await.expect("begin");
        let claims = queue
            .hold_and_claim(&mut tx, &deliveries, &consumer, clock.now())
            .await
            .expect("hold and claim");
        assert_eq!(
            claims,
            [
                None,
                Some(Claim::AlreadyProcessed),
                Some(Claim::Claimed),
                Some(Claim::Claimed),
            ],
            "a lease not held claims nothing; the others answer as claim_all does"
        );
        // Jobs 2 and 3 go back, keeping their keys.
        let later = clock.now() + Duration::from_secs(600);
        let settlements = [
            (&first[1], Settlement::Ack),
            (&first[2], Settlement::RetryAt(later)),
            (&first[3], Settlement::Defer(later)),
        ];
        queue.settle(&mut tx, &settlements).await.expect("settle");
        tx.commit().await.expect("commit");
        let keys: Vec<String> =
            sqlx::query_scalar("select dedup_key from core.jobs where not leased order by id")
                .fetch_all(queue.pool())
                .await
                .expect("keys");
        assert_eq!(keys, [job(2).to_string(), "invoice-3".to_owned()]);
        let again = queue
            .publish(
                &q,
                &envelopes[3],
                PublishOptions::default().dedup_key("invoice-3"),
            )
            .await
            .expect("publish");
        assert!(
            again.duplicate,
            "the key still dedups while the job is pending: {again:?}"
        );
        let claimed: Vec<sqlx::types::Uuid> = sqlx::query_scalar(
            "select job_id from core.processed_jobs where consumer = $1 order by job_id",
        )
        .bind(consumer.as_str())
        .fetch_all(queue.pool())
        .await
        .expect("claims");
        let mut expected: Vec<_> = (1..4).map(|i| job(i).as_uuid()).collect();
        expected.sort_unstable();
        assert_eq!(
            claimed, expected,
            "job 0 is not claimed by the stale holder"
        );
    })
    .await;
}

/// The row id of a delivery of the PostgreSQL queue.
fn kept_acked(delivery: &jobs_core::Delivery) -> i64 {
    delivery
        .message_id
        .as_deref()
        .and_then(|id| id.parse().ok())
        .expect("a row id")
}

#[tokio::test]
async fn a_transaction_that_took_a_message_and_did_not_settle_it_does_not_commit() {
    with_databases(|dbs| async move {
        let (queue, _clock) = queue(&dbs).await;
        let store = PgStore::from_pool(queue.pool().clone());
        let q = name("group.unsettled");
        for n in 0..2 {
            queue
                .publish(&q, &fixtures::envelope(1, n), PublishOptions::default())
                .await
                .expect("publish");
        }
        let leased = queue.receive(&q, 2, LEASE).await.expect("receive");
        let mut tx = store.begin().await.expect("begin");
        let leases: Vec<_> = leased.iter().map(|d| &d.lease).collect();
        assert_eq!(
            queue.hold(&mut tx, &leases).await.expect("hold"),
            [true, true]
        );
        queue
            .settle(&mut tx, &[(&leased[0], Settlement::Ack)])
            .await
            .expect("settle one");
        let refused = tx.commit().await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("not settled")),
            "{refused:?}"
        );
        assert_eq!(
            count(queue.pool(), "core.jobs where leased").await,
            2,
            "nothing of the refused transaction committed: neither the ack nor the take"
        );
    })
    .await;
}

#[tokio::test]
async fn held_deliveries_are_fenced_and_settle_only_with_the_work_transaction() {
    with_databases(|dbs| async move {
        let (queue, clock) = queue(&dbs).await;
        let pool = queue.pool().clone();
        let store = PgStore::from_pool(pool.clone());
        assert_eq!(queue.shares_transactions_with(&store), Ok(()));
        sqlx::query("create table effects (n int not null)")
            .execute(&pool)
            .await
            .expect("create effects");
        let q = name("group.jobs");
        for n in 0..4 {
            queue
                .publish(&q, &fixtures::envelope(1, n), PublishOptions::default())
                .await
                .expect("publish");
        }
        let first = queue.receive(&q, 4, LEASE).await.expect("receive");
        // Job 0's lease expires and another worker takes it: the first lease is stale.
        clock.advance(LEASE * 2);
        let taken = queue.receive(&q, 1, LEASE).await.expect("receive");
        assert_eq!(taken[0].message_id, first[0].message_id);
        let leases: Vec<_> = first.iter().map(|d| &d.lease).collect();

        let mut tx = store.begin().await.expect("begin");
        let held = queue.hold(&mut tx, &leases).await.expect("hold");
        assert_eq!(held, [false, true, true, true], "only live leases are held");
        // Held rows stay with this transaction even past their leases' expiry.
        clock.advance(LEASE * 2);
        let others = queue.receive(&q, 4, LEASE).await.expect("receive");
        assert_eq!(
            others
                .iter()
                .map(|d| d.message_id.clone())
                .collect::<Vec<_>>(),
            [first[0].message_id.clone()],
            "another receiver passes the held rows by"
        );

        // A checkpoint keeps what came before; an undo discards what came after it.
        sqlx::query("insert into effects values (1)")
            .execute(tx.conn())
            .await
            .expect("insert");
        tx.checkpoint().await.expect("checkpoint");
        sqlx::query("insert into effects values (2)")
            .execute(tx.conn())
            .await
            .expect("insert");
        assert!(
            sqlx::query("insert into no_such_table values (3)")
                .execute(tx.conn())
                .await
                .is_err()
        );
        tx.undo()
            .await
            .expect("the undo recovers the aborted transaction");

        let later = clock.now() + Duration::from_secs(600);
        let stale = queue.settle(&mut tx, &[(&first[0], Settlement::Ack)]).await;
        assert!(
            stale.is_err(),
            "a lease not held settles nothing: {stale:?}"
        );
        let mut forged = first[1].clone();
        forged.lease = jobs_core::Lease::new(q.clone(), "not-a-row", forged.lease.expires_at());
        assert_eq!(
            queue.hold(&mut tx, &[&forged.lease]).await.expect("hold"),
            [false],
            "a token another transport made holds nothing"
        );
        let refused = queue.settle(&mut tx, &[(&forged, Settlement::Ack)]).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("lease token is not this queue's")),
            "a token another transport made settles nothing: {refused:?}"
        );
        drop(tx);
        // Every column but the lease's survives a put back.
        let columns = "select id, queue, dedup_key, payload, tenant_id, created_at::text, lane, \
                       lease_gen from core.jobs order by id";
        type Columns = (
            i64,
            String,
            String,
            Vec<u8>,
            Option<sqlx::types::Uuid>,
            String,
            Option<sqlx::types::Uuid>,
            i64,
        );
        let kept: Vec<Columns> = sqlx::query_as(columns)
            .fetch_all(&pool)
            .await
            .expect("rows");
        let mut tx = store.begin().await.expect("begin");
        let held = queue.hold(&mut tx, &leases[1..]).await.expect("hold");
        assert_eq!(held, [true, true, true]);
        sqlx::query("insert into effects values (1)")
            .execute(tx.conn())
            .await
            .expect("insert");
        queue
            .settle(
                &mut tx,
                &[
                    (&first[1], Settlement::Ack),
                    (&first[2], Settlement::RetryAt(later)),
                    (&first[3], Settlement::Defer(later)),
                ],
            )
            .await
            .expect("settle");
        let before: i64 = count(&pool, "core.jobs where leased").await;
        assert_eq!(before, 4, "nothing settled before the commit");
        tx.commit().await.expect("commit");
        let rows: Vec<(String, bool, i32)> =
            sqlx::query_as("select id::text, leased, deliveries from core.jobs order by id")
                .fetch_all(&pool)
                .await
                .expect("rows");
        let id = |d: &jobs_core::Delivery| d.message_id.clone().expect("an id");
        assert_eq!(
            rows,
            [
                (id(&first[0]), true, 3),
                (id(&first[2]), false, 1),
                (id(&first[3]), false, 0),
            ],
            "acked, retried (attempt kept), deferred (attempt given back)"
        );
        assert_eq!(count(&pool, "effects").await, 1);
        let put_back: Vec<Columns> = sqlx::query_as(columns)
            .fetch_all(&pool)
            .await
            .expect("rows");
        let kept: Vec<Columns> = kept.into_iter().filter(|row| row.0 != kept_acked(&first[1])).collect();
        assert_eq!(put_back, kept, "retried and deferred rows keep their id, key, payload, tenant, creation, lane and generation");

        let elsewhere = PgStore::from_pool(dbs.pool().await);
        assert!(queue.shares_transactions_with(&elsewhere).is_err());
    })
    .await;
}

#[tokio::test]
async fn wakeups_report_inserts_on_their_queue_and_poll_otherwise() {
    with_databases(|dbs| async move {
        let (queue, _clock) = queue(&dbs).await;
        let q = name("wake.jobs");
        let other = name("wake.other");
        let mut wakeups = queue.wakeups();
        wakeups.listen().await.expect("listen");
        queue
            .publish(&other, &fixtures::envelope(1, 1), PublishOptions::default())
            .await
            .expect("publish");
        assert_eq!(
            wakeups.wait(&q, Duration::from_millis(50)).await,
            Wake::Polled,
            "woken by another queue"
        );
        queue
            .publish(&q, &fixtures::envelope(1, 2), PublishOptions::default())
            .await
            .expect("publish");
        // The notification arrived before the wait: it is kept, not missed.
        assert_eq!(
            wakeups.wait(&q, Duration::from_secs(30)).await,
            Wake::Notified
        );
        let mut tx = queue.pool().begin().await.expect("begin");
        queue
            .publish_in(
                &mut tx,
                &q,
                &fixtures::envelope(1, 3),
                PublishOptions::default(),
            )
            .await
            .expect("publish");
        tx.rollback().await.expect("roll back");
        assert_eq!(
            wakeups.wait(&q, Duration::from_millis(50)).await,
            Wake::Polled,
            "a rolled back insert woke the listener"
        );
    })
    .await;
}

/// Whether `wait` is resolved without waiting: polled once, at a deadline already past.
async fn resolved(wait: impl std::future::Future<Output = ()>) -> bool {
    resolved_within(Duration::ZERO, wait).await
}

/// Whether `wait` resolves within `time`.
async fn resolved_within(time: Duration, wait: impl std::future::Future<Output = ()>) -> bool {
    tokio::time::timeout(time, wait).await.is_ok()
}

/// Waits for `wait`, failing the test rather than hanging if it never resolves.
async fn resolves(wait: impl std::future::Future<Output = ()>, what: &str) {
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("{what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_work_resolves_for_each_committed_publish_to_its_queue() {
    with_databases(|dbs| async move {
        let (queue, _clock) = queue(&dbs).await;
        let q = name("wake.port");
        let other = name("wake.elsewhere");
        // The first wait starts the shared listener, which wakes every waiter once it listens
        // (what was published before it listened would otherwise be missed).
        resolves(queue.wait_for_work(&q), "the listener never started").await;
        let _ = resolved(queue.wait_for_work(&q)).await; // a spare wake-up, if any
        assert!(
            !resolved(queue.wait_for_work(&q)).await,
            "nothing was published"
        );

        // An empty receive, then a publish that may land before the wait: still woken.
        assert!(
            queue
                .receive(&q, 10, LEASE)
                .await
                .expect("receive")
                .is_empty()
        );
        queue
            .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
            .await
            .expect("publish");
        resolves(queue.wait_for_work(&q), "the publish did not wake the wait").await;
        let _ = resolved(queue.wait_for_work(&q)).await;

        // Another clone shares the listener; a publish elsewhere or a rolled back one does not
        // wake `q`. Notifications arrive in order, so once `other` is woken by the publish
        // after them, they have been handled.
        let clone = queue.clone();
        let mut tx = queue.pool().begin().await.expect("begin");
        queue
            .publish_in(
                &mut tx,
                &q,
                &fixtures::envelope(1, 2),
                PublishOptions::default(),
            )
            .await
            .expect("publish");
        tx.rollback().await.expect("roll back");
        queue
            .publish(&other, &fixtures::envelope(1, 3), PublishOptions::default())
            .await
            .expect("publish");
        resolves(clone.wait_for_work(&other), "the clone was not woken").await;
        assert!(
            !resolved(queue.wait_for_work(&q)).await,
            "woken by another queue or a rolled back insert"
        );

        // A wait already under way is woken too.
        let waiting = tokio::spawn({
            let (clone, q) = (clone.clone(), q.clone());
            async move { clone.wait_for_work(&q).await }
        });
        queue
            .publish(&q, &fixtures::envelope(1, 4), PublishOptions::default())
            .await
            .expect("publish");
        resolves(
            async { waiting.await.expect("the wait") },
            "the waiting task was not woken",
        )
        .await;
    })
    .await;
}

/// A delay or a retry ends without a notification: the wait resolves when the queue's next
/// row falls due, so an idle worker starts it then rather than at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_work_resolves_when_a_delay_or_a_retry_falls_due() {
    const SOON: Duration = Duration::from_millis(200);
    with_databases(|dbs| async move {
        let (queue, clock) = queue(&dbs).await;
        let q = name("wake.due");
        let other = name("wake.due_other");
        resolves(queue.wait_for_work(&q), "the listener never started").await;
        let _ = resolved(queue.wait_for_work(&q)).await; // a spare wake-up, if any
        assert!(
            !resolved_within(SOON, queue.wait_for_work(&q)).await,
            "woken with no job at all"
        );
        queue
            .publish(
                &q,
                &fixtures::envelope(1, 1),
                PublishOptions::default().delay(SOON),
            )
            .await
            .expect("publish");
        // Notifications arrive in order: once `other` is woken, the insert's wake-up of `q`
        // is kept, and the next wait takes it.
        queue
            .publish(&other, &fixtures::envelope(1, 2), PublishOptions::default())
            .await
            .expect("publish");
        resolves(queue.wait_for_work(&other), "the publish did not wake").await;
        let _ = resolved(queue.wait_for_work(&q)).await;
        assert!(
            queue
                .receive(&q, 10, LEASE)
                .await
                .expect("receive")
                .is_empty(),
            "not due yet"
        );
        // The manual clock stands still, so the delay is still ahead, in full, of each wait.
        assert!(
            !resolved_within(SOON / 4, queue.wait_for_work(&q)).await,
            "woken before the delay was over"
        );
        resolves(queue.wait_for_work(&q), "the wait outlasted the delay").await;
        clock.advance(SOON);
        let leased = queue.receive(&q, 10, LEASE).await.expect("receive");
        assert_eq!(leased.len(), 1, "due once the delay is over");

        queue
            .retry_at(&leased[0].lease, clock.now() + SOON)
            .await
            .expect("retry");
        assert!(
            queue
                .receive(&q, 10, LEASE)
                .await
                .expect("receive")
                .is_empty(),
            "the retry is not due yet"
        );
        resolves(
            queue.wait_for_work(&q),
            "the wait outlasted the retry's backoff",
        )
        .await;
    })
    .await;
}

/// A database for the model's cases, migrated, with its effects table.
fn model_database(runtime: &tokio::runtime::Runtime) -> (Arc<Databases>, PgConnectOptions) {
    runtime.block_on(async {
        let dbs = Databases::connect().await;
        let options = dbs.create().await;
        let pool = PgPool::connect_with(options.clone())
            .await
            .expect("connect");
        PgStore::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        crate::effects::create_table(&pool).await;
        pool.close().await;
        (dbs, options)
    })
}

/// One case of the model on the emptied database: the store, the transport and the queue.
/// Each case runs in its own async runtime, so it gets its own pools: per job, one for the
/// store, whose work transactions stay open while the handler reads the effects, and one for
/// the queue, which settles while they are open; grouped, one for both, since the queue
/// settles inside the store's transactions.
async fn model_case(
    options: PgConnectOptions,
    grouped: bool,
) -> (Backend<PgStore>, Transport, Arc<PgQueue>) {
    let connect = |max| {
        PgPoolOptions::new()
            .max_connections(max)
            .connect_with(options.clone())
    };
    let pool = connect(16).await.expect("connect");
    let queue_pool = if grouped {
        pool.clone()
    } else {
        connect(4).await.expect("connect")
    };
    sqlx::query("truncate core.jobs, core.processed_jobs, core.dead_letter_events, core.dead_letters, model_effects")
        .execute(&pool)
        .await
        .expect("empty the tables");
    let clock = ManualClock::default();
    let queue = PgQueue::new(queue_pool).with_clock(Arc::new(clock.clone()));
    let inject_clock = clock.clone();
    (
        crate::effects::backend(PgStore::from_pool(pool)),
        Transport {
            publisher: Arc::new(queue.clone()),
            consumer: Arc::new(queue.clone()),
            depth: Arc::new(queue.clone()),
            // The model injects synchronously: publish on a connection of a runtime of its
            // own, on another thread, and wait for it.
            inject: Arc::new(move |name, bytes| {
                let (options, clock, name) = (options.clone(), inject_clock.clone(), name.clone());
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime")
                        .block_on(async move {
                            let pool = PgPoolOptions::new()
                                .max_connections(1)
                                .connect_with(options)
                                .await
                                .expect("connect");
                            PgQueue::new(pool.clone())
                                .with_clock(Arc::new(clock))
                                .publish_bytes(&name, bytes, &PublishOptions::default())
                                .await
                                .expect("inject");
                            pool.close().await;
                        });
                })
                .join()
                .expect("the inject thread");
            }),
            clock,
        },
        Arc::new(queue),
    )
}

/// Runs `round` (a grouped model check over a few random cases, every invariant checked)
/// until the rounds together reached what `enough` asks of their counts (groups, released,
/// undone, crashed, refused), at most three times: a round of few cases may draw no rare
/// event (a crash right after a group settled), which another round draws.
fn exercised(
    round: impl Fn() -> Arc<model::GroupStats>,
    enough: impl Fn((u64, u64, u64, u64, u64)) -> bool,
) -> model::GroupStats {
    let total = model::GroupStats::default();
    for _ in 0..3 {
        total.add(&round());
        if enough(total.counts()) {
            return total;
        }
    }
    panic!("the model exercised too little in three rounds: {total:?}");
}

/// The runtime's invariants with PostgreSQL as transport and store, per job, at a small case
/// count (`PROPTEST_CASES` raises it).
#[test]
fn the_runtime_keeps_every_invariant_on_the_pg_queue() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (dbs, options) = model_database(&runtime);
    model::check_invariants(model::cases(8), || {
        let case = model_case(options.clone(), false);
        async move {
            let (backend, transport, _) = case.await;
            (backend, transport)
        }
    });
    runtime.block_on(dbs.drop_all());
}

/// The same invariants with the worker grouped on the PostgreSQL queue: groups with failures,
/// deferrals and dead letters inside them, and crashes after a group settled, before its
/// commit. The run must have exercised each of those; the grouped mutants (a failed job's
/// writes or claim kept) must be caught.
#[test]
fn the_grouped_runtime_keeps_every_invariant_on_the_pg_queue() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (dbs, options) = model_database(&runtime);
    let setup = || model_case(options.clone(), true);
    let stats = exercised(
        || model::check_grouped_invariants(model::cases(16), setup),
        |(groups, released, undone, crashed, refused)| {
            groups > 0 && released > 0 && undone > 0 && crashed > 0 && refused > 0
        },
    );
    let (groups, released, undone, crashed, refused) = stats.counts();
    println!(
        "grouped model: {groups} groups of two jobs or more, {released} retries and deferrals \
         settled in a group, {undone} failed jobs undone, {crashed} groups crashed before \
         commit, {refused} work transactions refused by a store that was down"
    );
    for (mutant, reason) in model::check_grouped_mutants_are_caught(setup) {
        println!("{mutant:?} caught: {reason}");
    }
    runtime.block_on(dbs.drop_all());
}

/// The grouped invariants with the model's queue fetched fairly (`core.lease_fair`): the
/// dedup, fencing and exactly-once promises do not depend on how a batch is chosen.
#[test]
fn the_grouped_runtime_keeps_every_invariant_on_a_fair_pg_queue() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (dbs, options) = model_database(&runtime);
    let setup = || {
        let case = model_case(options.clone(), true);
        async move {
            let (backend, transport, queue) = case.await;
            queue
                .make_fair(&name(model::QUEUE), TenantFairness::round_robin())
                .await
                .expect("the model's queue made fair");
            (backend, transport, queue)
        }
    };
    let stats = exercised(
        || model::check_grouped_invariants(model::cases(8), setup),
        |(groups, released, undone, ..)| groups > 0 && released > 0 && undone > 0,
    );
    let (groups, released, undone, crashed, _) = stats.counts();
    println!(
        "fair grouped model: {groups} groups, {released} released, {undone} undone, {crashed} crashed"
    );
    runtime.block_on(dbs.drop_all());
}

/// The grouped invariants again with the model's handler declared `RERUNNABLE`: groups take
/// checkpoints only as often as jobs failed lately (none at first), and a failure goes back to
/// the last one or, without one, rolls its group back and makes another pass.
#[test]
fn the_grouped_runtime_keeps_every_invariant_with_rerunnable_handlers() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (dbs, options) = model_database(&runtime);
    let setup = || model_case(options.clone(), true);
    let stats = exercised(
        || model::check_grouped_rerunnable_invariants(model::cases(8), setup),
        |(groups, released, _, crashed, _)| groups > 0 && released > 0 && crashed > 0,
    );
    let (groups, released, undone, crashed, _) = stats.counts();
    println!(
        "rerunnable grouped model: {groups} groups of two jobs or more, {released} retries and \
         deferrals settled in a group, {undone} undone to a checkpoint (few: the model's \
         groups are smaller than the checkpoints' spacing; \
         a_rerunnable_group_checkpoints_as_often_as_its_jobs_fail undoes an optimistic one), \
         {crashed} crashed"
    );
    runtime.block_on(dbs.drop_all());
}

#[tokio::test]
async fn a_queue_without_its_table_says_to_migrate() {
    with_databases(|dbs| async move {
        let queue = PgQueue::new(dbs.pool().await);
        let e = queue
            .receive(&name("test.unmigrated"), 1, Duration::from_secs(30))
            .await
            .expect_err("no core.jobs before migrate");
        assert!(e.to_string().ends_with("run `jobsctl migrate`)"), "{e}");
    })
    .await;
}

/// The per-tenant limit holds across concurrent fetches: four receivers on their own
/// connections drain a backlog of two tenants, holding what they get for a moment, and no
/// tenant ever has more deliveries in flight than its limit (counted down before each ack, so
/// the count never runs ahead of the database's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tenant_limit_holds_under_concurrent_fetches() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LIMIT: usize = 3;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let q = name("fair.concurrent");
        let queue = PgQueue::new(store.pool().clone());
        let fair =
            TenantFairness::round_robin().limit(std::num::NonZeroU32::new(3).expect("not zero"));
        queue.share_by_tenant(&q, fair).expect("shared");
        for n in 0..120 {
            let envelope = fixtures::envelope(1 + (n % 2) as u32, n);
            queue
                .publish(&q, &envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let in_flight: Arc<[AtomicUsize; 2]> = Arc::new(Default::default());
        let most = Arc::new(AtomicUsize::new(0));
        let acked = Arc::new(AtomicUsize::new(0));
        let receivers: Vec<_> = (0..4)
            .map(|_| {
                let (queue, q) = (queue.clone(), q.clone());
                let (in_flight, most, acked) = (in_flight.clone(), most.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut idle = 0;
                    while acked.load(Ordering::SeqCst) < 120 && idle < 200 {
                        let batch = queue.receive(&q, 4, LEASE).await.expect("receive");
                        if batch.is_empty() {
                            idle += 1;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            continue;
                        }
                        let tenants: Vec<usize> = batch
                            .iter()
                            .map(|d| {
                                let e = jobs_core::Envelope::decode(&d.payload).expect("decode");
                                usize::from(e.tenant_id != fixtures::tenant(1))
                            })
                            .collect();
                        for t in &tenants {
                            let now = in_flight[*t].fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        for (d, t) in batch.iter().zip(&tenants) {
                            in_flight[*t].fetch_sub(1, Ordering::SeqCst);
                            queue.ack(&d.lease).await.expect("ack");
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for receiver in receivers {
            receiver.await.expect("a receiver");
        }
        assert_eq!(
            acked.load(Ordering::SeqCst),
            120,
            "every job delivered once"
        );
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= LIMIT,
            "{most} of one tenant in flight, limit {LIMIT}"
        );
        assert_eq!(most, LIMIT, "the receivers filled the limit at some point");
    })
    .await;
}

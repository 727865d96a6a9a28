//! `PgQueue` against a real PostgreSQL: the queue contract suite, the model-based property
//! tests of the runtime (PostgreSQL as both transport and store), and what only this queue
//! has (fencing after a takeover, batch publish, batched consumption, wake-ups, publishing in
//! the caller's transaction).

use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, PgWorkTx, Wake, sqlx};
use jobs_core::{
    Claim, Clock, ConsumerName, GroupTransaction, ManualClock, PublishOptions, PullPort,
    QueueDepth, QueueError, QueueName, QueuePort, SettleInTransaction, SettlePort, Settlement,
    StoreError, TenantFairness, WorkStore, WorkTransaction,
};
use jobs_testkit::contract::fairness::{self, FairUnderTest};
use jobs_testkit::contract::queue::{self, QueueUnderTest};
use jobs_testkit::fixtures;
use jobs_testkit::model::{self, Backend, BoxFuture, Transport};
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
    sqlx::query_scalar(&format!("select count(*) from {table}"))
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

fn write_effect(tx: &mut PgWorkTx, key: String) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move {
        sqlx::query("insert into model_effects (key) values ($1)")
            .bind(key)
            .execute(tx.conn())
            .await
            .map(drop)
            .map_err(|e| StoreError::Unavailable {
                message: "insert the effect".into(),
                source: Some(Box::new(e)),
            })
    })
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
        sqlx::query("create table model_effects (key text not null)")
            .execute(&pool)
            .await
            .expect("create the effects table");
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
    let effects_pool = pool.clone();
    let inject_clock = clock.clone();
    (
        Backend {
            store: PgStore::from_pool(pool),
            write_effect,
            effects: Arc::new(move || {
                let pool = effects_pool.clone();
                Box::pin(async move {
                    sqlx::query_scalar("select key from model_effects")
                        .fetch_all(&pool)
                        .await
                        .expect("read the effects")
                })
            }),
        },
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

/// A worker of `test.job` jobs on `jobs` running `handler`, grouped over `queue`, with
/// `store` as its store and dead letters.
fn grouped(
    store: &PgStore,
    queue: Arc<PgQueue>,
    jobs: QueueName,
    handler: impl jobs_testkit::runtime::Handler<PgWorkTx>,
) -> jobs_testkit::runtime::WorkerBuilder<PgStore> {
    jobs_testkit::runtime::Worker::grouped_builder(
        ConsumerName::try_from("test.grouped").expect("valid"),
        jobs,
        queue,
        Arc::new(store.clone()),
    )
    .handler("test.job".parse().expect("valid"), handler)
}

/// A handler with nothing to do, for workers a test only builds.
struct Noop;

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Noop {
    type Data = ();

    async fn handle(
        &self,
        _: jobs_testkit::runtime::Job<()>,
        _: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_grouped_worker_needs_the_queue_on_the_stores_own_pool() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let other = PgPoolOptions::new()
            .max_connections(2)
            .connect_with((*store.pool().connect_options()).clone())
            .await
            .expect("connect");
        let build =
            |queue: PgQueue| grouped(&store, Arc::new(queue), name("grouped.jobs"), Noop).build();
        let refused = build(PgQueue::new(other)).expect_err("a pool of its own");
        assert!(refused.to_string().contains("different pools"), "{refused}");
        assert!(
            build(PgQueue::new(store.pool().clone())).is_ok(),
            "the store's pool"
        );
    })
    .await;
}

/// Job 1 writes and succeeds, job 2 fails for good without writing, job 3 writes and fails
/// for a retry.
struct Mixed;

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Mixed {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_u64().unwrap_or_default();
        if n != 2 {
            sqlx::query("insert into group_effects (n) values ($1)")
                .bind(n as i64)
                .execute(tx.conn())
                .await
                .map_err(jobs_testkit::runtime::JobError::retry)?;
        }
        match n {
            1 => Ok(()),
            2 => Err(jobs_testkit::runtime::JobError::permanent(
                "invoice 2 does not exist",
            )),
            _ => Err(jobs_testkit::runtime::JobError::retry(
                "the provider timed out",
            )),
        }
    }
}

/// One group of three in order: undoing job 3's writes goes back to a checkpoint taken after
/// job 2's dead letter, so the letter stays, job 1's write commits and job 3's does not.
#[tokio::test]
async fn undoing_a_failed_job_in_a_group_keeps_what_its_neighbours_settled() {
    use jobs_testkit::runtime::Outcome;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table group_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.jobs");
        let mut published = vec![];
        for n in 1..=3 {
            let envelope = fixtures::envelope(1, n);
            queue
                .publish(&jobs, &envelope, PublishOptions::default())
                .await
                .expect("publish");
            published.push(envelope.job_id);
        }
        let worker = grouped(&store, queue.clone(), jobs.clone(), Mixed)
            .group_size(3)
            .build()
            .expect("valid");
        let outcomes = worker.run_once().await.expect("receive");
        assert!(
            matches!(
                outcomes[..],
                [
                    Outcome::Processed,
                    Outcome::DeadLettered { .. },
                    Outcome::Retrying { .. }
                ]
            ),
            "{outcomes:?}"
        );
        let effects: Vec<i64> = sqlx::query_scalar("select n from group_effects order by n")
            .fetch_all(store.pool())
            .await
            .expect("read the effects");
        assert_eq!(effects, [1], "job 1's write committed, job 3's undone");
        let letters =
            jobs_core::DeadLetterStore::list(&store, &jobs_core::DeadLetterFilter::default())
                .await
                .expect("list");
        let lettered: Vec<_> = letters.iter().map(|l| l.letter.job_id).collect();
        assert_eq!(
            lettered,
            [Some(published[1])],
            "job 2's letter survived job 3's undo"
        );
    })
    .await;
}

/// Writes one row per run of a job, without a unique constraint (a job run twice shows), then
/// fails on the first attempt when its data says `"fail": true`.
struct Counts;

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Counts {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_i64().unwrap_or_default();
        sqlx::query("insert into run_effects (n) values ($1)")
            .bind(n)
            .execute(tx.conn())
            .await
            .map_err(jobs_testkit::runtime::JobError::retry)?;
        if job.envelope.data["fail"] == true && job.attempt == 1 {
            return Err(jobs_testkit::runtime::JobError::retry("fails once"));
        }
        Ok(())
    }
}

/// The jobs whose effect `run_effects` holds more than once, with their counts.
async fn run_twice(store: &PgStore) -> Vec<(i64, i64)> {
    sqlx::query_as("select n, count(*) from run_effects group by n having count(*) > 1")
        .fetch_all(store.pool())
        .await
        .expect("read the effects")
}

/// Publishes jobs `from..to` on `jobs` for the [`Counts`] handler.
async fn publish_counted(queue: &PgQueue, jobs: &QueueName, from: u64, to: u64) {
    let batch: Vec<NewJob> = (from..to)
        .map(|n| NewJob {
            envelope: fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": n })),
            opts: PublishOptions::default(),
        })
        .collect();
    queue.publish_batch(jobs, &batch).await.expect("publish");
}

/// A group of jobs that write takes a checkpoint per job but the first, 31 at most in one
/// transaction on PostgreSQL: what it cannot cover goes back unrun with its attempt unspent,
/// and the worker's next groups fit the budget, growing back after groups that used at most
/// half of it.
#[tokio::test]
async fn groups_fit_the_transactions_checkpoint_budget() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.budget");
        // Groups sized by the checkpoints alone, however long a loaded machine's inserts take.
        let worker = grouped(&store, queue.clone(), jobs.clone(), Counts)
            .group_size(48)
            .group_time(Duration::from_secs(60))
            .build()
            .expect("valid");
        let outcomes_of = |outcomes: &[jobs_testkit::runtime::Outcome]| {
            let processed = outcomes
                .iter()
                .filter(|o| **o == jobs_testkit::runtime::Outcome::Processed)
                .count();
            (processed, outcomes.len() - processed)
        };

        publish_counted(&queue, &jobs, 0, 40).await;
        let outcomes = worker.run_once().await.expect("run");
        assert_eq!(outcomes_of(&outcomes), (32, 8), "{outcomes:?}");
        assert!(
            outcomes[32..]
                .iter()
                .all(|o| matches!(o, jobs_testkit::runtime::Outcome::Deferred { .. })),
            "given back: {outcomes:?}"
        );
        let back: Vec<(i32, bool)> =
            sqlx::query_as("select deliveries, leased from core.jobs order by id")
                .fetch_all(store.pool())
                .await
                .expect("rows");
        assert_eq!(back, vec![(0, false); 8], "ready again, attempts unspent");
        let (claims, effects): (i64, i64) = sqlx::query_as(
            "select (select count(*) from core.processed_jobs), \
                    (select count(*) from run_effects)",
        )
        .fetch_one(store.pool())
        .await
        .expect("count");
        assert_eq!(
            (claims, effects),
            (32, 32),
            "the given-back jobs left no claim and no effect"
        );
        // The next groups hold one job more than the budget: the 8 given back and 32 more
        // run as a group of 32 (31 checkpoints, none to spare) and one of 8, all processed.
        publish_counted(&queue, &jobs, 40, 72).await;
        let outcomes = worker.run_once().await.expect("run");
        assert_eq!(outcomes_of(&outcomes), (40, 0), "{outcomes:?}");
        // The group of 8 took 7 checkpoints, at most half the budget: the groups grew back
        // to `group_size`, so 40 jobs are one group again, which runs out at 32.
        publish_counted(&queue, &jobs, 72, 112).await;
        let outcomes = worker.run_once().await.expect("run");
        assert_eq!(outcomes_of(&outcomes), (32, 8), "{outcomes:?}");
        let runs = run_twice(&store).await;
        assert!(runs.is_empty(), "jobs run twice: {runs:?}");
    })
    .await;
}

/// [`Counts`], made ready first as its data says: `"ready": "wait"` after a pause (its
/// readiness pending when first asked), `"defer"` not at all (deferred a minute).
struct Readied;

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Readied {
    type Data = serde_json::Value;

    async fn ready(
        &self,
        job: &jobs_testkit::runtime::Job<serde_json::Value>,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        match job.envelope.data["ready"].as_str() {
            Some("wait") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            }
            Some("defer") => Err(jobs_testkit::runtime::JobError::Defer {
                until: std::time::SystemTime::now() + Duration::from_secs(60),
            }),
            _ => Ok(()),
        }
    }

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        Counts.handle(job, tx).await
    }
}

/// A group asks each job's handler whether it is ready before its transaction opens, waits
/// for those that are not yet, and settles on their own those that will not be.
#[tokio::test]
async fn a_group_runs_the_jobs_that_get_ready_and_defers_the_others() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.ready");
        let worker = grouped(&store, queue.clone(), jobs.clone(), Readied)
            .build()
            .expect("valid");
        let batch: Vec<NewJob> = [(1, "wait"), (2, "defer"), (3, "now"), (4, "wait")]
            .into_iter()
            .map(|(n, ready)| NewJob {
                envelope: fixtures::envelope_with(
                    1,
                    "test.job",
                    serde_json::json!({ "n": n, "ready": ready }),
                ),
                opts: PublishOptions::default(),
            })
            .collect();
        queue.publish_batch(&jobs, &batch).await.expect("publish");
        let outcomes = worker.run_once().await.expect("run");
        use jobs_testkit::runtime::Outcome;
        assert_eq!(outcomes[0], Outcome::Processed);
        assert!(
            matches!(outcomes[1], Outcome::Deferred { .. }),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[2..], [Outcome::Processed, Outcome::Processed]);
        let effects: Vec<i64> = sqlx::query_scalar("select n from run_effects order by n")
            .fetch_all(store.pool())
            .await
            .expect("effects");
        assert_eq!(effects, [1, 3, 4]);
        let (deliveries, leased): (i32, bool) =
            sqlx::query_as("select deliveries, leased from core.jobs")
                .fetch_one(store.pool())
                .await
                .expect("the deferred job");
        assert_eq!(
            (deliveries, leased),
            (0, false),
            "deferred, its attempt unspent"
        );
    })
    .await;
}

/// One group of two kinds, with a retry and a second copy of a job: each job counted once, by
/// its outcome and its kind, and each handler run timed once.
#[test]
fn a_grouped_worker_counts_each_job_once_by_outcome_and_kind() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(with_databases(|dbs| async move {
            let store = dbs.store().await;
            sqlx::query("create table run_effects (n bigint not null)")
                .execute(store.pool())
                .await
                .expect("create the effects table");
            let queue = Arc::new(PgQueue::new(store.pool().clone()));
            let jobs = name("grouped.counted");
            let worker = jobs_testkit::runtime::Worker::grouped_builder(
                ConsumerName::try_from("test.counted").expect("valid"),
                jobs.clone(),
                queue.clone(),
                Arc::new(store.clone()),
            )
            .handler("test.a".parse().expect("valid"), Counts)
            .handler("test.b".parse().expect("valid"), Counts)
            .build()
            .expect("valid");
            let job = |kind, n, fail| {
                fixtures::envelope_with(1, kind, serde_json::json!({ "n": n, "fail": fail }))
            };
            let first = job("test.a", 1, false);
            for envelope in [
                first.clone(),
                job("test.a", 2, true),
                job("test.b", 3, false),
                job("test.b", 4, false),
            ] {
                queue
                    .publish(&jobs, &envelope, PublishOptions::default())
                    .await
                    .expect("publish");
            }
            let copy = PublishOptions::default().dedup_key("copy");
            queue.publish(&jobs, &first, copy).await.expect("publish");
            let outcomes = worker.run_once().await.expect("run");
            assert_eq!(outcomes.len(), 5, "one group: {outcomes:?}");
        }));
    });
    let mut counted: Vec<(String, String, u64)> = Vec::new();
    let mut timed: Vec<(String, usize)> = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let kind = (key.labels())
            .find(|label| label.key() == "kind")
            .map(|label| label.value().to_owned())
            .unwrap_or_default();
        match value {
            DebugValue::Counter(n) => counted.push((key.name().to_owned(), kind, n)),
            DebugValue::Histogram(runs) if key.name() == "jobs_handler_seconds" => {
                timed.push((kind, runs.len()));
            }
            _ => {}
        }
    }
    counted.sort();
    timed.sort();
    assert_eq!(
        counted,
        [
            (
                "jobs_duplicate_skipped_total".to_owned(),
                "test.a".to_owned(),
                1
            ),
            ("jobs_processed_total".to_owned(), "test.a".to_owned(), 1),
            ("jobs_processed_total".to_owned(), "test.b".to_owned(), 2),
            ("jobs_retried_total".to_owned(), "test.a".to_owned(), 1),
        ]
    );
    assert_eq!(timed, [("test.a".to_owned(), 2), ("test.b".to_owned(), 2)]);
}

/// Writes a row, counts its runs, and fails on the first attempt when its data says so (with
/// `"early"`, before writing: `"retry"` or `"permanent"`); its only effect is the row, so it
/// may run again.
#[derive(Clone, Default)]
struct Rerunnable {
    runs: Arc<std::sync::Mutex<std::collections::HashMap<i64, u32>>>,
}

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Rerunnable {
    type Data = serde_json::Value;
    const RERUNNABLE: bool = true;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_i64().unwrap_or_default();
        *self
            .runs
            .lock()
            .expect("not poisoned")
            .entry(n)
            .or_default() += 1;
        use jobs_testkit::runtime::JobError;
        match job.envelope.data["early"].as_str() {
            Some("retry") if job.attempt == 1 => Err(JobError::retry("fails before writing")),
            Some("permanent") => Err(JobError::permanent("refuses before writing")),
            _ => Counts.handle(job, tx).await,
        }
    }
}

/// A group of rerunnable jobs in which three fail after writing: two more passes without
/// checkpoints, each running again the jobs the last rolled back, then a careful one, which
/// runs out of checkpoints and gives the last jobs back. Every job's effect commits once.
#[tokio::test]
async fn a_rerunnable_group_tries_again_without_checkpoints_then_carefully() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.rerun");
        let handler = Rerunnable::default();
        let worker = grouped(&store, queue.clone(), jobs.clone(), handler.clone())
            .group_size(48)
            .group_time(Duration::from_secs(60))
            .build()
            .expect("valid");
        let batch: Vec<NewJob> = (0..40)
            .map(|n| NewJob {
                envelope: fixtures::envelope_with(
                    1,
                    "test.job",
                    serde_json::json!({ "n": n, "fail": (1..=3).contains(&n) }),
                ),
                opts: PublishOptions::default(),
            })
            .collect();
        queue.publish_batch(&jobs, &batch).await.expect("publish");
        let outcomes = worker.run_once().await.expect("run");
        let runs = |n: i64| handler.runs.lock().expect("not poisoned")[&n];
        // Passes 1 to 3 end at jobs 1, 2 and 3, each failing once and decided; job 0 ran in
        // each and in the careful fourth.
        assert_eq!(
            (runs(0), runs(1), runs(2), runs(3), runs(4)),
            (4, 1, 1, 1, 1)
        );
        use jobs_testkit::runtime::Outcome;
        let retried: Vec<usize> = (0..40)
            .filter(|&n| matches!(outcomes[n], Outcome::Retrying { .. }))
            .collect();
        assert_eq!(retried, [1, 2, 3]);
        // The careful pass: a checkpoint before job 0 and before each of jobs 4 to 33, 31 in
        // all; jobs 34 to 39 go back unrun.
        let given_back: Vec<usize> = (0..40)
            .filter(|&n| matches!(outcomes[n], Outcome::Deferred { .. }))
            .collect();
        assert_eq!(given_back, (34..40).collect::<Vec<_>>(), "{outcomes:?}");
        let effects: Vec<i64> = sqlx::query_scalar("select n from run_effects order by n")
            .fetch_all(store.pool())
            .await
            .expect("effects");
        let expected: Vec<i64> = (0..34).filter(|n| !(1..=3).contains(n)).collect();
        assert_eq!(effects, expected, "each processed job's row, once");
    })
    .await;
}

/// Once rerunnable jobs have failed after writing, their groups take a checkpoint every so
/// many jobs that wrote, and a failure goes back to the last one: only the jobs since run
/// again, in the same transaction, rather than the whole group in another.
#[tokio::test]
async fn a_rerunnable_group_checkpoints_as_often_as_its_jobs_fail() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.rerun");
        let handler = Rerunnable::default();
        let worker = grouped(&store, queue.clone(), jobs.clone(), handler.clone())
            .group_size(48)
            .group_time(Duration::from_secs(60))
            .build()
            .expect("valid");
        let publish = |range: std::ops::Range<i64>, failing: i64| {
            let early = |n| match n {
                131 => "retry",
                132 => "permanent",
                _ => "",
            };
            let batch: Vec<NewJob> = range
                .map(|n| NewJob {
                    envelope: fixtures::envelope_with(
                        1,
                        "test.job",
                        serde_json::json!({ "n": n, "fail": n == failing, "early": early(n) }),
                    ),
                    opts: PublishOptions::default(),
                })
                .collect();
            let (queue, jobs) = (queue.clone(), jobs.clone());
            async move { queue.publish_batch(&jobs, &batch).await.expect("publish") }
        };
        let runs = |n: i64| handler.runs.lock().expect("not poisoned")[&n];
        // The first failure after writing finds no checkpoint: a second pass runs job 0 again.
        publish(0..40, 1).await;
        worker.run_once().await.expect("run");
        assert_eq!((runs(0), runs(1), runs(2)), (2, 1, 1));
        // That failure, folded into the rate (1/64) and decayed by the 39 jobs after it,
        // spaces the next group's checkpoints 15 writing jobs apart: before jobs 115 and 130.
        // Jobs 131 and 132 fail before writing (a retry and a dead letter); job 135 fails
        // after writing, and the undo goes back to before job 130: jobs 130, 133 and 134 run
        // again, 131's claim is released and 132's letter recorded again, and no other runs.
        publish(100..140, 135).await;
        let outcomes = worker.run_once().await.expect("run");
        let twice: Vec<i64> = (100..140).filter(|&n| runs(n) == 2).collect();
        assert_eq!(twice, [130, 133, 134]);
        assert!((100..140).all(|n| (1..=2).contains(&runs(n))));
        use jobs_testkit::runtime::Outcome;
        let retried: Vec<usize> = (0..40)
            .filter(|&i| matches!(outcomes[i], Outcome::Retrying { .. }))
            .collect();
        assert_eq!(retried, [31, 35], "{outcomes:?}");
        assert!(
            matches!(outcomes[32], Outcome::DeadLettered { .. }),
            "{outcomes:?}"
        );
        let letters =
            jobs_core::DeadLetterStore::list(&store, &jobs_core::DeadLetterFilter::default())
                .await
                .expect("list");
        assert_eq!(letters.len(), 1, "job 132's letter, once: {letters:?}");
        // Every job holds its claim but the three to retry (1, 131 and 135): the released
        // claims survived the undo.
        let claims: i64 = sqlx::query_scalar("select count(*) from core.processed_jobs")
            .fetch_one(store.pool())
            .await
            .expect("claims");
        assert_eq!(claims, 80 - 3);
        let effects: Vec<i64> = sqlx::query_scalar("select n from run_effects order by n")
            .fetch_all(store.pool())
            .await
            .expect("effects");
        let expected: Vec<i64> = (0..40)
            .chain(100..140)
            .filter(|&n| ![1, 131, 132, 135].contains(&n))
            .collect();
        assert_eq!(effects, expected, "each processed job's row, once");
    })
    .await;
}

/// Writes a row per run; while its job waits to be ready, moves the lease of the job its data
/// names (`"steal"`) on, as another worker that received it after its lease ran out would.
struct Steals {
    pool: PgPool,
    runs: Arc<std::sync::Mutex<Vec<i64>>>,
}

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Steals {
    type Data = serde_json::Value;

    async fn ready(
        &self,
        job: &jobs_testkit::runtime::Job<serde_json::Value>,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        if let Some(victim) = job.envelope.data["steal"].as_str() {
            sqlx::query("update core.jobs set lease_gen = lease_gen + 1 where dedup_key = $1")
                .bind(victim)
                .execute(&self.pool)
                .await
                .expect("move the lease on");
        }
        Ok(())
    }

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_i64().unwrap_or_default();
        self.runs.lock().expect("not poisoned").push(n);
        Counts.handle(job, tx).await
    }
}

/// A job whose lease another worker took before its group held it is not run, claimed or
/// settled by the group: its neighbours commit, and it stays with the other worker.
#[tokio::test]
async fn a_job_whose_lease_moved_on_before_its_group_held_it_is_left_to_its_new_holder() {
    use jobs_testkit::runtime::Outcome;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.lost");
        let victim = fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": 2 }));
        let thief = fixtures::envelope_with(
            1,
            "test.job",
            serde_json::json!({ "n": 1, "steal": victim.job_id.to_string() }),
        );
        let last = fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": 3 }));
        for envelope in [&thief, &victim, &last] {
            queue
                .publish(&jobs, envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let runs = Arc::default();
        let handler = Steals {
            pool: store.pool().clone(),
            runs: Arc::clone(&runs),
        };
        let worker = grouped(&store, queue.clone(), jobs.clone(), handler)
            .group_size(3)
            .build()
            .expect("valid");
        let outcomes = worker.run_once().await.expect("run");
        assert!(
            matches!(
                &outcomes[..],
                [Outcome::Processed, Outcome::Unsettled { error }, Outcome::Processed]
                    if error.contains("lease was lost")
            ),
            "{outcomes:?}"
        );
        assert_eq!(
            *runs.lock().expect("not poisoned"),
            [1, 3],
            "job 2 never ran"
        );
        let effects: Vec<i64> = sqlx::query_scalar("select n from run_effects order by n")
            .fetch_all(store.pool())
            .await
            .expect("effects");
        assert_eq!(effects, [1, 3]);
        let (left, claims): (Vec<String>, i64) = sqlx::query_as(
            "select (select coalesce(array_agg(dedup_key), '{}') from core.jobs where leased), \
                    (select count(*) from core.processed_jobs)",
        )
        .fetch_one(store.pool())
        .await
        .expect("read the queue");
        assert_eq!(
            left,
            [victim.job_id.to_string()],
            "job 2 is still leased, to its thief"
        );
        assert_eq!(claims, 2, "no claim for job 2");
    })
    .await;
}

/// Writes a row whose deferred foreign key fails only at the commit, when its data says
/// `"orphan": true`.
struct Orphans;

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Orphans {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let parent = if job.envelope.data["orphan"] == true {
            2
        } else {
            1
        };
        sqlx::query("insert into children (parent) values ($1)")
            .bind(parent)
            .execute(tx.conn())
            .await
            .map_err(jobs_testkit::runtime::JobError::retry)?;
        Ok(())
    }
}

/// A group whose commit fails (here a deferred constraint) settles nothing: every job says
/// the group did not commit and stays leased, to come back after its lease, with no claim
/// and no write left behind.
#[tokio::test]
async fn a_group_whose_commit_fails_leaves_its_jobs_leased_and_says_why() {
    use jobs_testkit::runtime::Outcome;
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::raw_sql(
            "create table parents (id int primary key); insert into parents values (1); \
             create table children (parent int references parents \
                 deferrable initially deferred)",
        )
        .execute(store.pool())
        .await
        .expect("create the tables");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.orphans");
        for orphan in [false, true, false] {
            let data = serde_json::json!({ "orphan": orphan });
            let envelope = fixtures::envelope_with(1, "test.job", data);
            queue
                .publish(&jobs, &envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let worker = grouped(&store, queue.clone(), jobs.clone(), Orphans)
            .group_size(3)
            .build()
            .expect("valid");
        let outcomes = worker.run_once().await.expect("run");
        assert_eq!(outcomes.len(), 3);
        for outcome in &outcomes {
            assert!(
                matches!(outcome, Outcome::Unsettled { error } if error.contains("the group did not commit")),
                "{outcomes:?}"
            );
        }
        let (leased, claims, children): (i64, i64, i64) = sqlx::query_as(
            "select (select count(*) from core.jobs where leased), \
                    (select count(*) from core.processed_jobs), \
                    (select count(*) from children)",
        )
        .fetch_one(store.pool())
        .await
        .expect("read the tables");
        assert_eq!((leased, claims, children), (3, 0, 0));
    })
    .await;
}

/// A worker's [`run`](jobs_testkit::runtime::Worker::run) in the background, as a worker
/// process runs it, until [`Running::stop`].
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<jobs_testkit::runtime::Drained>,
}

impl Running {
    fn start(worker: &Arc<jobs_testkit::runtime::Worker<PgStore>>) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(worker.clone().run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    async fn stop(self) -> jobs_testkit::runtime::Drained {
        self.stop.send(()).expect("running");
        self.task.await.expect("stops")
    }
}

/// Waits until `done` holds, looking every 10 ms; fails after a minute, saying `what`.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut done: impl FnMut() -> F,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within a minute"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Records each job's transaction, so a test sees which jobs ran in one group.
#[derive(Clone, Default)]
struct Transactions {
    seen: Arc<std::sync::Mutex<Vec<(i64, i64)>>>,
}

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Transactions {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        tx: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_i64().unwrap_or_default();
        let txid: i64 = sqlx::query_scalar("select txid_current()")
            .fetch_one(tx.conn())
            .await
            .map_err(jobs_testkit::runtime::JobError::retry)?;
        self.seen.lock().expect("not poisoned").push((n, txid));
        Ok(())
    }
}

/// The loop's first fetch takes one job (its slow start); with `group_linger` it then waits
/// and fetches what fills the group, so the jobs published before it run in one transaction.
/// (Without a linger, whether the next fetch joins the first job before it starts depends on
/// timing, so that side is not asserted.)
#[tokio::test]
async fn a_lingering_fetch_fills_its_group() {
    let linger = Duration::from_millis(20);
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.linger");
        for n in 0..3 {
            let envelope = fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": n }));
            queue
                .publish(&jobs, &envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let handler = Transactions::default();
        let worker = Arc::new(
            grouped(&store, queue.clone(), jobs.clone(), handler.clone())
                .group_size(4)
                .group_linger(linger)
                .concurrency(1)
                .build()
                .expect("valid"),
        );
        let running = Running::start(&worker);
        let seen = || handler.seen.lock().expect("not poisoned").len();
        eventually("the three jobs ran", || async { seen() >= 3 }).await;
        running.stop().await;
        let seen = handler.seen.lock().expect("not poisoned").clone();
        let mut transactions: Vec<i64> = seen.iter().map(|&(_, txid)| txid).collect();
        transactions.dedup();
        assert_eq!(transactions.len(), 1, "one group: {seen:?}");
    })
    .await;
}

/// A linger waits only to fill a group that a fetch started: a fetch that found nothing, or
/// a group of one, never waits, so an hour's linger delays neither the idle worker's wake-up
/// nor the jobs of a full group.
#[tokio::test]
async fn a_linger_never_delays_an_empty_fetch_or_a_full_group() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.no_linger");
        let handler = Transactions::default();
        let worker = Arc::new(
            grouped(&store, queue.clone(), jobs.clone(), handler.clone())
                .group_size(1)
                .group_linger(Duration::from_secs(3_600))
                .concurrency(1)
                .build()
                .expect("valid"),
        );
        let running = Running::start(&worker);
        // The worker finds the queue empty first, then each publish wakes it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        for n in 0..3 {
            let envelope = fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": n }));
            queue
                .publish(&jobs, &envelope, PublishOptions::default())
                .await
                .expect("publish");
            let seen = || handler.seen.lock().expect("not poisoned").len();
            eventually(&format!("job {n} ran"), || async { seen() > n }).await;
        }
        running.stop().await;
    })
    .await;
}

/// Holds the job `n = 1` until the test lets it go, recording which jobs started.
#[derive(Clone)]
struct Held {
    started: Arc<std::sync::Mutex<Vec<i64>>>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl jobs_testkit::runtime::Handler<PgWorkTx> for Held {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: jobs_testkit::runtime::Job<serde_json::Value>,
        _: &mut PgWorkTx,
    ) -> Result<(), jobs_testkit::runtime::JobError> {
        let n = job.envelope.data["n"].as_i64().unwrap_or_default();
        self.started.lock().expect("not poisoned").push(n);
        if n == 1 {
            let _ = self.gate.acquire().await.expect("open");
        }
        Ok(())
    }
}

/// A grouped worker fetches ahead only once less than a group waits in its buffer: with
/// every slot busy and one group waiting, it leases nothing more, so what it holds leased
/// beyond its running jobs stays small and their leases do not run out in a buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_grouped_worker_leases_no_more_while_a_group_waits() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.ahead");
        for n in 0..10 {
            let envelope = fixtures::envelope_with(1, "test.job", serde_json::json!({ "n": n }));
            queue
                .publish(&jobs, &envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let handler = Held {
            started: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let worker = Arc::new(
            grouped(&store, queue.clone(), jobs.clone(), handler.clone())
                .group_size(1)
                .concurrency(1)
                .build()
                .expect("valid"),
        );
        let running = Running::start(&worker);
        let started = || handler.started.lock().expect("not poisoned").clone();
        eventually("the second job started", || async {
            started().contains(&1)
        })
        .await;
        // Time for a fetch the loop should not start to lease what it would.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let depth = queue.depth(&jobs).await.expect("depth");
        assert_eq!(
            (depth.in_flight, depth.ready),
            (2, 7),
            "the running job and one waiting leased, the first acked: {depth:?}"
        );
        handler.gate.add_permits(1);
        eventually("the queue drained", || async {
            let depth = queue.depth(&jobs).await.expect("depth");
            depth.total() == 0
        })
        .await;
        running.stop().await;
        let mut started = started();
        started.sort_unstable();
        assert_eq!(started, (0..10).collect::<Vec<_>>(), "each job once");
    })
    .await;
}

/// `Worker::run` grouped, as a worker process runs it: every job of a backlog processed
/// once, in groups, and the queue empty after the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grouped_loop_drains_a_backlog_once_and_leaves_the_queue_empty() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table run_effects (n bigint not null)")
            .execute(store.pool())
            .await
            .expect("create the effects table");
        let queue = Arc::new(PgQueue::new(store.pool().clone()));
        let jobs = name("grouped.loop");
        let envelopes: Vec<_> = (0..300).map(|n| fixtures::envelope(1, n)).collect();
        for envelope in &envelopes {
            queue
                .publish(&jobs, envelope, PublishOptions::default())
                .await
                .expect("publish");
        }
        let worker = Arc::new(
            grouped(&store, queue.clone(), jobs.clone(), Counts)
                .group_size(8)
                .concurrency(3)
                .build()
                .expect("valid"),
        );
        let count = || async {
            let rows: i64 = sqlx::query_scalar("select count(*) from run_effects")
                .fetch_one(store.pool())
                .await
                .expect("count");
            rows
        };
        let running = Running::start(&worker);
        eventually("the backlog drained", || async { count().await >= 300 }).await;
        running.stop().await;
        let runs = run_twice(&store).await;
        assert!(runs.is_empty(), "jobs run twice: {runs:?}");
        let depth = queue.depth(&jobs).await.expect("depth");
        assert_eq!(
            depth.pending() + depth.in_flight,
            0,
            "nothing left: {depth:?}"
        );
    })
    .await;
}

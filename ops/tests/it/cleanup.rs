//! The processed-jobs TTL cleanup as a job through a worker, on the embedded default store
//! (SQLite, one writer at a time: one bounded batch per job, purged in the job's own work
//! transaction, the rest in follow-up jobs) and on PostgreSQL (the expired slice emptied at
//! once, ADR 0014).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::PgStore;
use jobs_adapter_sqlite::SqliteStore;
use jobs_consumers::{CLEANUP_KIND, Outcome, ProcessedCleanup, Worker};
use jobs_core::{
    Clock, ConsumerName, DeadLetterStore, JobId, ManualClock, ProcessedJobs, QueueName, QueuePort,
    WorkStore, WorkTransaction,
};

use crate::pg::TestDb;
use crate::temp::TempDb;

const OLD: usize = 25;

/// Claims `OLD` jobs ten days ago and one now, runs one cleanup job (TTL a day, batches of
/// ten) through a worker on `store`, and checks that the old rows went, in `jobs` jobs, and
/// the recent one stayed.
async fn cleans_through_a_worker<S>(store: S, jobs: usize)
where
    S: WorkStore + ProcessedJobs + DeadLetterStore + Clone,
{
    let clock = ManualClock::default();
    clock.set(SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000));
    let consumer = ConsumerName::try_from("billing.booker").expect("valid");
    // Ids of the time their jobs were published, as a producer's would be.
    let minted_at = |t: SystemTime, n: usize| {
        let ms = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis();
        JobId::from_parts(u64::try_from(ms).expect("ms"), n as u128)
    };
    let ten_days_ago = clock.now() - Duration::from_secs(10 * 86_400);
    let old: Vec<JobId> = (0..OLD).map(|n| minted_at(ten_days_ago, n)).collect();
    let recent = minted_at(clock.now(), OLD);
    let mut tx = store.begin().await.expect("begin");
    for job in &old {
        tx.claim(*job, &consumer, ten_days_ago)
            .await
            .expect("claim");
    }
    tx.claim(recent, &consumer, clock.now())
        .await
        .expect("claim");
    tx.commit().await.expect("commit");

    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    let maintenance: QueueName = "core.maintenance".parse().expect("valid");
    let cleanup = ProcessedCleanup::new(Arc::new(store.clone()))
        .ttl(Duration::from_secs(86_400))
        .below_floor()
        .batch(10)
        .clock(Arc::new(clock.clone()))
        .follow_ups(Arc::new(queue.clone()));
    let worker = Worker::builder(
        ConsumerName::try_from("core.cleanup").expect("valid"),
        maintenance.clone(),
        Arc::new(queue.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(CLEANUP_KIND.parse().expect("valid"), cleanup)
    .clock(Arc::new(clock.clone()))
    .build()
    .expect("valid");
    let job = jobs_testkit::fixtures::envelope_with(1, CLEANUP_KIND, serde_json::json!({}));
    queue
        .publish(&maintenance, &job, Default::default())
        .await
        .expect("publish");
    let mut outcomes = vec![];
    for _ in 0..10 {
        let batch = worker.run_once().await.expect("receive");
        if batch.is_empty() {
            break;
        }
        outcomes.extend(batch);
    }
    assert_eq!(outcomes, vec![Outcome::Processed; jobs], "cleanup jobs run");
    for job in &old {
        assert!(
            !store.is_processed(*job, &consumer).await.expect("read"),
            "a row past the TTL survived"
        );
    }
    assert!(store.is_processed(recent, &consumer).await.expect("read"));
}

#[tokio::test]
async fn the_cleanup_job_succeeds_through_a_worker_on_sqlite() {
    let db = TempDb::new("cleanup");
    let store = SqliteStore::open(&db.0).await.expect("open");
    store.migrate().await.expect("migrate");
    // 10 + 10 + 5 rows, each batch a job of its own.
    cleans_through_a_worker(store, 3).await;
}

#[tokio::test]
async fn the_cleanup_job_succeeds_through_a_worker_on_postgres() {
    let db = TestDb::create().await;
    let store = PgStore::from_pool(db.pool().await);
    store.migrate().await.expect("migrate");
    // The old claims' ids are of one day, so one slice: one job empties it and leaves nothing
    // to the batches.
    cleans_through_a_worker(store.clone(), 1).await;
    store.pool().close().await;
    db.drop_db().await;
}

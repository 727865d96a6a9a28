//! The worker runtime on PostgreSQL: a handler's business row is committed exactly once, however
//! often its job is delivered.

use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::PgStore;
use jobs_consumers::{Outcome, Worker};
use jobs_core::{ConsumerName, ManualClock, PublishOptions, QueueName, QueuePort};
use jobs_testkit::faults::LosesAcks;

use crate::book::{self, Book};
use crate::pg::TestDb;

#[tokio::test]
async fn a_business_row_is_committed_once_under_duplicates_and_a_crash_before_ack() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await.expect("migrate");
    book::create_table(&pool).await;

    let clock = ManualClock::default();
    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    let name: QueueName = "billing.invoices".parse().expect("valid");
    let transport = LosesAcks::new(Arc::new(queue.clone()));
    transport.lose_next(1);
    let transport = Arc::new(transport);
    let worker = Worker::builder(
        ConsumerName::try_from("billing.booker").expect("valid"),
        name.clone(),
        transport,
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(
        "billing.invoice_issued".parse().expect("valid"),
        Book::succeeding(),
    )
    .clock(Arc::new(clock.clone()))
    .concurrency(1)
    .build()
    .expect("a valid worker");

    let envelope = jobs_testkit::fixtures::envelope_with(
        1,
        "billing.invoice_issued",
        serde_json::json!({ "invoice": 42 }),
    );
    for copy in 0..4 {
        let opts = PublishOptions::default().dedup_key(format!("copy-{copy}"));
        queue
            .publish(&name, &envelope, opts)
            .await
            .expect("publish");
    }
    let mut outcomes = vec![];
    for _ in 0..8 {
        outcomes.extend(worker.run_once().await.expect("receive"));
        clock.advance(Duration::from_secs(120));
    }
    let processed = outcomes
        .iter()
        .filter(|o| **o == Outcome::Processed)
        .count();
    let duplicates = outcomes
        .iter()
        .filter(|o| **o == Outcome::Duplicate)
        .count();
    let unsettled = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Unsettled { .. }))
        .count();
    assert_eq!(
        (processed, unsettled),
        (0, 1),
        "the first commit lost its ack: {outcomes:?}"
    );
    assert_eq!(
        duplicates, 4,
        "every other copy is a duplicate: {outcomes:?}"
    );

    let rows: Vec<(i64,)> = sqlx::query_as("select invoice from booked")
        .fetch_all(&pool)
        .await
        .expect("query");
    assert_eq!(rows, [(42,)], "exactly one business row");
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_failing_handler_leaves_no_business_row_and_no_claim() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await.expect("migrate");
    book::create_table(&pool).await;
    let queue = MemoryQueue::new(Arc::new(ManualClock::default()));
    let name: QueueName = "billing.invoices".parse().expect("valid");
    let worker = Worker::builder(
        ConsumerName::try_from("billing.booker").expect("valid"),
        name.clone(),
        Arc::new(queue.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(
        "billing.invoice_issued".parse().expect("valid"),
        Book::failing(u32::MAX),
    )
    .build()
    .expect("valid");
    let envelope = jobs_testkit::fixtures::envelope_with(
        1,
        "billing.invoice_issued",
        serde_json::json!({ "invoice": 7 }),
    );
    queue
        .publish(&name, &envelope, PublishOptions::default())
        .await
        .expect("publish");
    let outcomes = worker.run_once().await.expect("receive");
    assert!(
        matches!(outcomes[..], [Outcome::Retrying { .. }]),
        "{outcomes:?}"
    );
    let (booked,): (i64,) = sqlx::query_as("select count(*) from booked")
        .fetch_one(&pool)
        .await
        .expect("query");
    let (claims,): (i64,) = sqlx::query_as("select count(*) from core.processed_jobs")
        .fetch_one(&pool)
        .await
        .expect("query");
    assert_eq!(
        (booked, claims),
        (0, 0),
        "the rollback took the row and the claim"
    );
    pool.close().await;
    db.drop_db().await;
}

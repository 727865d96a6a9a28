//! The worker runtime over Vercel Queues (Vercel's own emulator) and the PostgreSQL store:
//! effects committed once under redelivery, retries through lease changes, and dead letters
//! that are ours, acked on Vercel.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use jobs_adapter_postgres::PgStore;
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};
use jobs_consumers::{Outcome, Worker, WorkerConfig};
use jobs_core::{
    ConsumerName, ConsumerPort, DeadLetterFilter, DeadLetterStore, PublishOptions, PullPort,
    QueueName, QueuePort,
};
use jobs_testkit::emulators::VercelQueuesEmulator;
use jobs_testkit::faults::LosesAcks;
use jobs_testkit::{TimeTravel, fixtures};

use crate::book::{self, Book};
use crate::pg::TestDb;

struct Setup {
    emulator: VercelQueuesEmulator,
    vercel: VercelQueues,
    store: PgStore,
    pool: sqlx::PgPool,
    db: TestDb,
    queue: QueueName,
}

async fn setup() -> Setup {
    let emulator = VercelQueuesEmulator::start().await;
    let clock = Arc::new(emulator.clock().expect("a manual clock"));
    let config = VercelQueuesConfig::new(Region::new("iad1").unwrap(), StaticToken::new("t"))
        .base_url_override(emulator.base_url())
        .unwrap();
    let vercel = VercelQueues::with_clock(config, clock).unwrap();
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await.expect("migrate");
    book::create_table(&pool).await;
    Setup {
        emulator,
        vercel,
        store,
        pool,
        db,
        queue: "billing.invoices".parse().unwrap(),
    }
}

fn worker(s: &Setup, transport: Arc<dyn ConsumerPort>, book: Book) -> Worker<PgStore> {
    Worker::builder(
        ConsumerName::try_from("billing.booker").unwrap(),
        s.queue.clone(),
        transport,
        Arc::new(s.store.clone()),
        Arc::new(s.store.clone()),
    )
    .handler("billing.invoice_issued".parse().unwrap(), book)
    .clock(Arc::new(s.emulator.clock().unwrap()))
    .concurrency(1)
    .build()
    .expect("a valid worker")
}

fn invoice(n: i64) -> jobs_core::Envelope {
    fixtures::envelope_with(
        1,
        "billing.invoice_issued",
        serde_json::json!({ "invoice": n }),
    )
}

async fn booked(pool: &sqlx::PgPool) -> Vec<(i64,)> {
    sqlx::query_as("select invoice from booked order by invoice")
        .fetch_all(pool)
        .await
        .expect("query")
}

#[tokio::test]
async fn a_commit_whose_ack_was_lost_is_redelivered_by_vercel_and_skipped_as_a_duplicate() {
    let s = setup().await;
    let crashing = LosesAcks::new(Arc::new(s.vercel.clone()));
    crashing.lose_next(1);
    let runs = Arc::new(AtomicU32::new(0));
    let book = Book {
        failures: 0,
        runs: runs.clone(),
    };
    let w = worker(&s, Arc::new(crashing), book);
    s.vercel
        .publish(&s.queue, &invoice(42), PublishOptions::default())
        .await
        .unwrap();

    let first = w.run_once().await.expect("receive");
    assert!(
        matches!(first[..], [Outcome::Unsettled { .. }]),
        "committed, then the worker died before the ack: {first:?}"
    );
    // Vercel redelivers once the lease runs out.
    s.emulator.advance(WorkerConfig::default().lease * 2).await;
    let second = w.run_once().await.expect("receive");
    assert_eq!(second, [Outcome::Duplicate], "the redelivery is skipped");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(booked(&s.pool).await, [(42,)], "exactly one business row");
    s.emulator.advance(Duration::from_secs(3600)).await;
    assert!(w.run_once().await.unwrap().is_empty(), "acked on Vercel");
    s.pool.close().await;
    s.db.drop_db().await;
}

#[tokio::test]
async fn failures_retry_through_vercel_then_dead_letter_here_and_ack_there() {
    let s = setup().await;
    let runs = Arc::new(AtomicU32::new(0));
    let recovers = worker(
        &s,
        Arc::new(s.vercel.clone()),
        Book {
            failures: 2,
            runs: runs.clone(),
        },
    );
    s.vercel
        .publish(&s.queue, &invoice(7), PublishOptions::default())
        .await
        .unwrap();
    let mut outcomes = vec![];
    for _ in 0..6 {
        outcomes.extend(recovers.run_once().await.expect("receive"));
        s.emulator.advance(Duration::from_secs(3600)).await;
    }
    assert!(
        matches!(
            outcomes[..],
            [
                Outcome::Retrying { .. },
                Outcome::Retrying { .. },
                Outcome::Processed
            ]
        ),
        "two failures then success: {outcomes:?}"
    );
    assert_eq!(booked(&s.pool).await, [(7,)], "failed attempts left no row");

    // A job that never succeeds spends the policy's five attempts, then is dead-lettered here.
    let hopeless = worker(&s, Arc::new(s.vercel.clone()), Book::failing(u32::MAX));
    s.vercel
        .publish(&s.queue, &invoice(8), PublishOptions::default())
        .await
        .unwrap();
    let mut outcomes = vec![];
    for _ in 0..8 {
        outcomes.extend(hopeless.run_once().await.expect("receive"));
        s.emulator.advance(Duration::from_secs(3600)).await;
    }
    let retries = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Retrying { .. }))
        .count();
    assert_eq!(retries, 4, "{outcomes:?}");
    assert!(
        matches!(outcomes.last(), Some(Outcome::DeadLettered { .. })),
        "{outcomes:?}"
    );
    let letters = s
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].letter.attempts, 5);
    assert!(
        s.vercel
            .receive(&s.queue, 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "the dead-lettered message was acked on Vercel"
    );
    s.pool.close().await;
    s.db.drop_db().await;
}

/// Trusted-payload mode lets anyone who reaches the callback route run a job: the worker
/// process says so at start, at WARN, naming the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_trusting_pushed_payloads_warns_at_start_that_anyone_can_run_a_job() {
    let emulator = VercelQueuesEmulator::start().await;
    let db = TestDb::create().await;
    let port = crate::worker_process::free_port();
    let mut command = crate::worker_process::readme_worker(&db.url, port);
    command
        .env("JOBS_QUEUE_URL", "vercel-queues://iad1")
        .env("VERCEL_OIDC_TOKEN", "a-token")
        .env("VERCEL_QUEUES_BASE_URL", emulator.base_url())
        .env("VERCEL_QUEUES_PUSH", "on")
        .env("VERCEL_QUEUES_TRUST_PUSHED_PAYLOAD", "on");
    let child = crate::process::Reaped(command.spawn().expect("the example starts"));
    crate::process::eventually("the process serves", async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let (_, log) = crate::process::terminate(child).await;
    let warning = log
        .lines()
        .find(|line| line.contains("VERCEL_QUEUES_TRUST_PUSHED_PAYLOAD is on"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{log}"));
    assert!(
        warning.contains("WARN")
            && warning.contains("anyone who can reach the route can run a job")
            && warning.contains("/vercel/queues"),
        "{warning}"
    );
    db.drop_db().await;
}

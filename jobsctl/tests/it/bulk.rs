//! The real `jobsctl` over dead letters a real worker produced, on SQLite and on PostgreSQL:
//! list, show, replay, discard, and a bulk replay interrupted halfway then resumed from the
//! run journaled in the store.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::PgStore;
use jobs_adapter_sqlite::SqliteStore;
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
use jobs_core::{
    BulkRuns, ConsumerName, DeadLetter, DeadLetterFilter, DeadLetterId, DeadLetterStatus,
    DeadLetterStore, JobId, ProcessedJobs, PublishOptions, QueueName, QueuePort, Resolution,
    TenantId, WorkStore,
};

use crate::temp::TempDb;

const KIND: &str = "billing.invoice_issued";
const QUEUE: &str = "billing.invoices";
const CONSUMER: &str = "billing.booker";

/// A handler that refuses every job for good, so each becomes a dead letter at once.
struct Refuses;

#[async_trait]
impl<Tx: Send + 'static> Handler<Tx> for Refuses {
    type Data = serde_json::Value;

    async fn handle(&self, _job: Job<serde_json::Value>, _tx: &mut Tx) -> Result<(), JobError> {
        Err(JobError::permanent("the ledger refuses the invoice"))
    }
}

/// Runs a worker over `jobs` jobs for tenant 1, two for tenant 2 and one poison message, all of
/// which end in the dead letters; returns each tenant's letters, oldest first.
async fn produce<S>(store: S, jobs: u32) -> (Vec<DeadLetter>, Vec<DeadLetter>)
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: Send,
{
    let queue = MemoryQueue::default();
    let name: QueueName = QUEUE.parse().expect("valid");
    let worker = Worker::builder(
        ConsumerName::try_from(CONSUMER).expect("valid"),
        name.clone(),
        Arc::new(queue.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(KIND.parse().expect("valid"), Refuses)
    .build()
    .expect("a valid worker");
    let published = (0..jobs)
        .map(|n| (1, n))
        .chain([(2, 100), (2, 101)])
        .collect::<Vec<_>>();
    for (tenant, invoice) in &published {
        let envelope = jobs_testkit::fixtures::envelope_with(
            *tenant,
            KIND,
            serde_json::json!({ "invoice": invoice }),
        );
        queue
            .publish(&name, &envelope, PublishOptions::default())
            .await
            .expect("publish");
    }
    queue.publish_bytes(
        &name,
        b"{\"job_id\": oops".to_vec(),
        &PublishOptions::default(),
    );
    let mut dead = 0;
    while dead < published.len() + 1 {
        let outcomes = worker.run_once().await.expect("receive");
        assert!(!outcomes.is_empty(), "every message is delivered at once");
        for outcome in outcomes {
            assert!(
                matches!(outcome, Outcome::DeadLettered { .. }),
                "{outcome:?}"
            );
            dead += 1;
        }
    }
    let letters = store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    let of = |n: u32| {
        let tenant = jobs_testkit::fixtures::tenant(n);
        letters
            .iter()
            .filter(|l| l.letter.tenant_id == Some(tenant))
            .cloned()
            .collect::<Vec<_>>()
    };
    (of(1), of(2))
}

fn jobsctl(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jobsctl"))
        .args(args)
        .args(["--database-url", url])
        .env_remove("DATABASE_URL")
        .env_remove("JOBS_QUEUE_URL")
        .env_remove("JOBS_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("jobsctl runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The ids and results of a run's JSON Lines.
fn results(output: &Output) -> Vec<(i64, String)> {
    text(&output.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("JSON Lines");
            (
                v["id"].as_i64().expect("an id"),
                v["result"].as_str().expect("a result").to_owned(),
            )
        })
        .collect()
}

async fn status(store: &dyn DeadLetterStore, id: DeadLetterId) -> DeadLetterStatus {
    store.get(id).await.expect("get").expect("exists").status
}

/// Everything the operator does to dead letters, against the store at `url`, replaying to the
/// queue at `queue_url`; `runs` is the store's journal of bulk runs. Returns the job ids
/// replayed, in no particular order.
async fn review(
    url: &str,
    queue_url: &str,
    store: Arc<dyn DeadLetterStore>,
    processed: Arc<dyn ProcessedJobs>,
    runs: Arc<dyn BulkRuns>,
) -> BTreeSet<JobId> {
    let (mine, theirs) = (store.clone(), processed);
    let run = |args: &[&str]| jobsctl(url, args);
    let all = store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    // Each letter keeps its reason, and the list filters by it.
    let by_reason = |reason: &str| {
        let listed = run(&["dead-letters", "list", "--reason", reason, "--json"]);
        assert!(listed.status.success(), "{listed:?}");
        (text(&listed.stdout).lines())
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).expect("JSON Lines");
                v["reason"].as_str().expect("a reason").to_owned()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(by_reason("poison"), ["poison"], "the broken payload");
    assert_eq!(
        by_reason("permanent").len(),
        all.len() - 1,
        "the refused jobs"
    );
    assert!(by_reason("exhausted").is_empty());
    let unknown = run(&["dead-letters", "list", "--reason", "tired"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert!(text(&unknown.stderr).contains("exhausted"), "{unknown:?}");
    let tenant1: TenantId = jobs_testkit::fixtures::tenant(1);
    let ones: Vec<DeadLetterId> = all
        .iter()
        .filter(|l| l.letter.tenant_id == Some(tenant1))
        .map(|l| l.id)
        .collect();
    let twos: Vec<&DeadLetter> = all
        .iter()
        .filter(|l| l.letter.tenant_id == Some(jobs_testkit::fixtures::tenant(2)))
        .collect();
    let poison = all
        .iter()
        .find(|l| l.letter.job_id.is_none())
        .expect("the poison letter")
        .id;
    assert_eq!((ones.len(), twos.len()), (4, 2));

    // list and show
    let listed = run(&[
        "dead-letters",
        "list",
        "--tenant",
        &tenant1.to_string(),
        "--json",
    ]);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(text(&listed.stdout).lines().count(), 4);
    let shown = run(&["dead-letters", "show", &ones[0].to_string()]);
    let shown_text = text(&shown.stdout);
    assert!(
        shown_text.contains(KIND) && shown_text.contains("the ledger refuses the invoice"),
        "{shown_text}"
    );

    // replay by id: the claim is released and the letter marked; a repeat is harmless
    let b1 = twos[0];
    let job = b1.letter.job_id.expect("a job id");
    let consumer = ConsumerName::try_from(CONSUMER).expect("valid");
    assert!(theirs.is_processed(job, &consumer).await.expect("read"));
    if queue_url == "memory:" {
        // A SQLite store's default queue is the in-process one (a PostgreSQL store's is its
        // own database's), which would lose the replay.
        let default_queue = run(&["dead-letters", "replay", &b1.id.to_string()]);
        assert_eq!(
            default_queue.status.code(),
            Some(2),
            "the default in-process queue would lose the replay: {default_queue:?}"
        );
        assert_eq!(status(&*mine, b1.id).await, DeadLetterStatus::PendingReview);
    }
    let replay = ["dead-letters", "replay", "--queue-url", queue_url];
    let b1_id = b1.id.to_string();
    let once = run(&[&replay[..], &[b1_id.as_str()]].concat());
    assert!(once.status.success(), "{once:?}");
    assert_eq!(status(&*mine, b1.id).await, DeadLetterStatus::Replayed);
    assert!(
        !theirs.is_processed(job, &consumer).await.expect("read"),
        "the replay released the claim so the job can run again"
    );
    let twice = run(&[&replay[..], &[b1_id.as_str()]].concat());
    assert!(
        twice.status.success() && text(&twice.stdout).contains("already replayed"),
        "{twice:?}"
    );

    // discard by id; a discarded letter is not replayed
    let b2 = twos[1].id.to_string();
    assert!(run(&["dead-letters", "discard", &b2]).status.success());
    let refused = run(&[&replay[..], &[b2.as_str()]].concat());
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(text(&refused.stdout).contains("discarded"), "{refused:?}");
    let poison_id = poison.to_string();
    let poison_replay = run(&[&replay[..], &[poison_id.as_str()]].concat());
    assert_eq!(poison_replay.status.code(), Some(1), "{poison_replay:?}");

    // bulk replay: no prompt possible without a terminal, so --yes is required
    let tenant1_id = tenant1.to_string();
    let bulk = [
        &replay[..],
        &["--all", "--tenant", tenant1_id.as_str(), "--json"],
    ]
    .concat();
    let unconfirmed = run(&bulk);
    assert_eq!(unconfirmed.status.code(), Some(3), "{unconfirmed:?}");
    for &id in &ones {
        assert_eq!(status(&*mine, id).await, DeadLetterStatus::PendingReview);
    }
    assert!(
        runs.runs(10).await.expect("runs").is_empty(),
        "an unconfirmed run is not started"
    );

    // interrupted after two letters...
    let first = run(&[&bulk[..], &["--yes", "--stop-after", "2"]].concat());
    assert_eq!(first.status.code(), Some(1), "{first:?}");
    assert!(
        !text(&first.stderr).contains('\r'),
        "no progress bar off a terminal"
    );
    let first = results(&first);
    assert_eq!(
        first,
        [
            (ones[0].0, "replayed".to_owned()),
            (ones[1].0, "replayed".to_owned())
        ]
    );
    // ...journaled in the store, where every operator's tool sees it: its snapshot, and the two
    // letters settled...
    let key = format!("replay status=pending_review tenant={tenant1}");
    let interrupted = runs.runs(10).await.expect("runs");
    assert_eq!(interrupted.len(), 1, "{interrupted:?}");
    let journaled = &interrupted[0];
    assert_eq!(
        (
            journaled.key.as_str(),
            journaled.action,
            journaled.ids.as_slice(),
            journaled.is_finished()
        ),
        (key.as_str(), Resolution::Replay, ones.as_slice(), false),
        "the snapshot of tenant 1's pending letters, in id order"
    );
    assert!(
        journaled.by.starts_with("jobsctl ("),
        "started by jobsctl: {}",
        journaled.by
    );
    assert_eq!(
        journaled.settled,
        [(ones[0], "done".to_owned()), (ones[1], "done".to_owned())].into(),
        "the two letters settled before the interruption"
    );
    assert_eq!(journaled.pending().collect::<Vec<_>>(), ones[2..]);
    // ...and the third marked replayed but never published, as a crash between the two would
    // leave it: it no longer matches pending_review, yet the resumed run must publish it.
    mine.transition(
        ones[2],
        jobs_core::Resolution::Replay,
        None,
        SystemTime::now(),
        "crash test",
    )
    .await
    .expect("mark");
    let second = run(&[&bulk[..], &["--yes"]].concat());
    assert!(second.status.success(), "{second:?}");
    let second = results(&second);
    assert_eq!(
        second,
        [
            (ones[2].0, "already_replayed".to_owned()),
            (ones[3].0, "replayed".to_owned())
        ],
        "the resumed run takes the rest of the snapshot, the half-done letter included"
    );
    let seen: BTreeSet<i64> = first.iter().chain(&second).map(|(id, _)| *id).collect();
    assert_eq!(seen.len(), first.len() + second.len(), "nothing done twice");
    assert_eq!(
        seen,
        ones.iter().map(|id| id.0).collect(),
        "nothing skipped"
    );
    for &id in &ones {
        assert_eq!(status(&*mine, id).await, DeadLetterStatus::Replayed);
    }
    let resumed = runs
        .run(journaled.id)
        .await
        .expect("read the run")
        .expect("the run");
    assert!(
        resumed.is_finished(),
        "the resumed run is closed: {resumed:?}"
    );
    assert_eq!(
        resumed.settled,
        [
            (ones[0], "done".to_owned()),
            (ones[1], "done".to_owned()),
            (ones[2], "already done".to_owned()),
            (ones[3], "done".to_owned()),
        ]
        .into(),
        "every letter of the snapshot settled exactly once"
    );
    let third = run(&[&bulk[..], &["--yes"]].concat());
    assert!(
        third.status.success() && third.stdout.is_empty(),
        "a finished run is not resumed, and nothing matches any more: {third:?}"
    );
    assert_eq!(
        runs.runs(10).await.expect("runs").len(),
        1,
        "nothing to do starts no run"
    );

    // bulk discard of what is still pending: the poison letter only
    let discard = run(&["dead-letters", "discard", "--all", "--yes", "--json"]);
    assert!(discard.status.success(), "{discard:?}");
    assert_eq!(results(&discard), [(poison.0, "discarded".to_owned())]);
    let listed = runs.runs(10).await.expect("runs");
    assert_eq!(
        listed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["discard status=pending_review", key.as_str()],
        "the newest run first"
    );
    assert_eq!(
        (
            listed[0].action,
            listed[0].is_finished(),
            listed[0].settled.clone()
        ),
        (
            Resolution::Discard,
            true,
            [(poison, "done".to_owned())].into()
        ),
    );
    let mut replayed = BTreeSet::from([job]);
    for id in ones {
        let letter = store.get(id).await.expect("get").expect("exists");
        replayed.insert(letter.letter.job_id.expect("a job id"));
    }
    replayed
}

#[tokio::test]
async fn dead_letters_from_a_real_worker_are_reviewed_replayed_and_discarded_on_sqlite() {
    let db = TempDb::new("bulk");
    let migrated = crate::cli::jobsctl(&["migrate", "--database-url", &db.url()]);
    assert!(migrated.status.success(), "{migrated:?}");
    let store = SqliteStore::open(&db.0).await.expect("open");
    produce(store.clone(), 4).await;
    // In-process: what is replayed is lost when jobsctl exits; only the store is checked.
    review(
        &db.url(),
        "memory:",
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .await;
    store.pool().close().await;
}

#[tokio::test]
async fn dead_letters_from_a_real_worker_are_reviewed_replayed_and_discarded_on_postgres() {
    let db = crate::pg::TestDb::create().await;
    let migrated = crate::cli::jobsctl(&["migrate", "--database-url", &db.url]);
    assert!(migrated.status.success(), "{migrated:?}");
    let store = PgStore::from_pool(db.pool().await);
    produce(store.clone(), 4).await;
    let queue_url = db.url.replacen("postgres", "postgres-queue", 1);
    let replayed = review(
        &db.url,
        &queue_url,
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .await;
    // Every replay, the interrupted bulk run and its resumption included, reached the durable
    // queue exactly once.
    let queued: Vec<(String,)> = sqlx::query_as(
        "select convert_from(payload, 'UTF8')::jsonb->>'job_id' from core.jobs \
         where queue = $1 order by id",
    )
    .bind(QUEUE)
    .fetch_all(store.pool())
    .await
    .expect("read the queue");
    let queued: Vec<JobId> = queued
        .into_iter()
        .map(|(id,)| id.parse().expect("a job id"))
        .collect();
    assert_eq!(queued.len(), replayed.len(), "nothing doubled: {queued:?}");
    assert_eq!(
        queued.into_iter().collect::<BTreeSet<_>>(),
        replayed,
        "nothing lost"
    );
    store.pool().close().await;
    db.drop_db().await;
}

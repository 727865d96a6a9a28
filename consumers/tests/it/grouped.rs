//! The grouped runtime on the memory queue and store, with time paused: the test kit's
//! grouped suite (`jobs_testkit::grouped`), and what the loop does while a suspect job waits
//! to run alone.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
use jobs_core::{
    ConsumerName, Delivery, Lease, ManualClock, PublishOptions, PullPort, QueueError, QueueName,
    QueuePort, SettleInTransaction, SettlePort, Settlement, StoreError,
};
use serde::Deserialize;

const QUEUE: &str = "test.grouped";
const KIND: &str = "test.sleeps";

#[derive(Deserialize)]
struct Nap {
    n: u64,
    /// How long the handler takes, in seconds (of paused time).
    secs: u64,
}

/// Takes the seconds its job says, then records its number as an effect.
struct Sleeps;

#[async_trait]
impl Handler<MemoryWorkTx> for Sleeps {
    type Data = Nap;

    async fn handle(&self, job: Job<Nap>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_secs(job.envelope.data.secs)).await;
        tx.record_effect(job.envelope.data.n.to_string());
        Ok(())
    }
}

const REFUSED: &str = "test.refused";

/// Refuses every job for good.
struct Refuses;

#[async_trait]
impl Handler<MemoryWorkTx> for Refuses {
    type Data = Nap;

    async fn handle(&self, _: Job<Nap>, _: &mut MemoryWorkTx) -> Result<(), JobError> {
        Err(JobError::permanent("never"))
    }
}

/// A memory queue with one fault of a transport.
struct Faulty(MemoryQueue, Fault);

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Its settlement inside the transaction panics for a group holding job 1: a
    /// transport's bug inside a grouped task.
    PanicsOnSettle,
    /// It says it cannot join the store's transactions, as a queue on another database
    /// would.
    Elsewhere,
    /// A group's second lease does not hold: it expired and moved on before the group held
    /// it.
    LosesHold,
    /// Its settlement inside the transaction fails: the queue's database went away.
    FailsSettle,
}

#[async_trait]
impl PullPort for Faulty {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.0.receive(queue, max, lease).await
    }
}

#[async_trait]
impl SettlePort for Faulty {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.0.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: std::time::SystemTime) -> Result<(), QueueError> {
        self.0.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: std::time::SystemTime) -> Result<(), QueueError> {
        self.0.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.0.extend(lease, by).await
    }
}

#[async_trait]
impl SettleInTransaction<MemoryStore> for Faulty {
    fn shares_transactions_with(&self, store: &MemoryStore) -> Result<(), jobs_core::Unsupported> {
        if self.1 == Fault::Elsewhere {
            return Err(jobs_core::Unsupported::new("this queue lives elsewhere"));
        }
        self.0.shares_transactions_with(store)
    }

    async fn hold(
        &self,
        tx: &mut MemoryWorkTx,
        leases: &[&Lease],
    ) -> Result<Vec<bool>, StoreError> {
        if self.1 == Fault::LosesHold && leases.len() > 1 {
            let mut others = leases.to_vec();
            others.remove(1);
            let mut held = self.0.hold(tx, &others).await?;
            held.insert(1, false);
            return Ok(held);
        }
        self.0.hold(tx, leases).await
    }

    async fn settle(
        &self,
        tx: &mut MemoryWorkTx,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError> {
        let first = |(delivery, _): &&(&Delivery, Settlement)| {
            let data: serde_json::Value = serde_json::from_slice(&delivery.payload).expect("a job");
            data["data"]["n"] == 1
        };
        if self.1 == Fault::PanicsOnSettle && settlements.iter().any(|s| first(&s)) {
            panic!("the queue's settlement is broken");
        }
        if self.1 == Fault::FailsSettle {
            return Err(StoreError::unavailable("the queue's database went away"));
        }
        self.0.settle(tx, settlements).await
    }
}

/// The memory pair on a manual clock, with job 0 leased by a worker that died on it: its
/// lease runs out once the clock moves a minute on. Jobs `1..=neighbours` (taking `secs`
/// each) are published before its lease ran out, so a worker fetches them first.
async fn a_suspect_behind(neighbours: u64, secs: u64) -> (MemoryQueue, MemoryStore, ManualClock) {
    let (queue, store, clock) = fresh();
    let name: QueueName = QUEUE.parse().expect("valid");
    let publish = |n: u64, secs: u64| {
        let envelope = jobs_testkit::fixtures::envelope_with(
            1,
            KIND,
            serde_json::json!({ "n": n, "secs": secs }),
        );
        let (queue, name) = (queue.clone(), name.clone());
        async move {
            (queue
                .publish(&name, &envelope, PublishOptions::default())
                .await)
                .expect("publish");
        }
    };
    publish(0, 0).await;
    let taken = queue.receive(&name, 1, Duration::from_secs(60)).await;
    assert_eq!(
        taken.expect("receive").len(),
        1,
        "job 0 leased, never settled"
    );
    for n in 1..=neighbours {
        publish(n, secs).await;
    }
    clock.advance(Duration::from_secs(61));
    (queue, store, clock)
}

/// An empty memory pair on a manual clock.
fn fresh() -> (MemoryQueue, MemoryStore, ManualClock) {
    let clock = ManualClock::default();
    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    (queue, MemoryStore::default(), clock)
}

/// Waits (in paused time, ten minutes of it at most) until `store` holds `n` effects.
async fn effects(store: &MemoryStore, n: usize) {
    let done = || async { store.effects().len() >= n };
    jobs_testkit::eventually(&format!("{n} effects"), Duration::from_secs(600), done).await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_running_a_suspect_job_alone_is_not_reported_stuck() {
    // Three neighbours of 50 s each: the suspect waits for them about 100 s (two groups run
    // at once), longer than a loop may go without turning (71 s by default).
    let (queue, store, clock) = a_suspect_behind(3, 50).await;
    let worker = Arc::new(
        grouped_builder(queue, &store, clock)
            .group_time(Duration::from_secs(3_600))
            .build()
            .expect("valid"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.clone().run(async {
        let _ = stopped.await;
    }));
    let mut longest = Duration::ZERO;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while store.effects().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "the four jobs ran");
        tokio::time::sleep(Duration::from_secs(1)).await;
        longest = longest.max(worker.stuck().unwrap_or_default());
    }
    assert_eq!(
        longest,
        Duration::ZERO,
        "a loop waiting for the suspect's neighbours, then for the suspect, is not stuck"
    );
    let mut done = store.effects();
    done.sort();
    assert_eq!(done, ["0", "1", "2", "3"]);
    stop.send(()).expect("running");
    running.await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_grouped_worker_stopped_and_run_again_runs_jobs_again() {
    // A stop leaves the worker stopping (its groups give back what they have not started);
    // the next run must begin afresh, or it would give back every job it fetched.
    let (queue, store, clock) = fresh();
    let worker = Arc::new(grouped(queue.clone(), &store, clock));
    for round in 0..2 {
        publish(&queue, KIND, round).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(worker.clone().run(async {
            let _ = stopped.await;
        }));
        effects(&store, usize::try_from(round + 1).expect("small")).await;
        stop.send(()).expect("running");
        running.await.expect("stops");
    }
    let mut done = store.effects();
    done.sort();
    assert_eq!(
        done,
        ["0", "1"],
        "the second run ran the job published for it"
    );
}

#[test]
fn a_panic_in_a_grouped_task_while_a_suspect_waits_is_logged_and_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            // Job 1 runs for 10 s, then its group's settlement panics while the suspect
            // (job 0) waits for it.
            let (queue, store, clock) = a_suspect_behind(1, 10).await;
            let worker = Arc::new(
                grouped_builder(Faulty(queue, Fault::PanicsOnSettle), &store, clock)
                    .build()
                    .expect("valid"),
            );
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let running = tokio::spawn(worker.run(async {
                let _ = stopped.await;
            }));
            effects(&store, 1).await;
            assert_eq!(
                store.effects(),
                ["0"],
                "the suspect ran; job 1's group did not commit"
            );
            stop.send(()).expect("running");
            running.await.expect("the loop itself survives");
        });
    });
    let panics: Vec<(Vec<String>, u64)> = (snapshotter.snapshot().into_vec().into_iter())
        .filter(|(key, ..)| key.key().name() == "jobs_task_panics_total")
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().labels().map(|l| l.value().to_owned()).collect(),
                n,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        panics,
        [(vec![QUEUE.to_owned()], 1)],
        "counted once, by queue"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queue_that_cannot_join_the_stores_transactions_is_refused_at_build() {
    let (queue, store, clock) = a_suspect_behind(0, 0).await;
    let built = grouped_builder(Faulty(queue, Fault::Elsewhere), &store, clock).build();
    let Err(refused) = built else {
        panic!("refused: its groups could not commit with their work");
    };
    assert!(
        refused.to_string().contains("this queue lives elsewhere"),
        "the queue's reason is given: {refused}"
    );
    assert!(store.effects().is_empty(), "nothing ran");
}

/// A grouped worker over `queue`, as [`grouped_builder`] configures it.
fn grouped<Q>(queue: Q, store: &MemoryStore, clock: ManualClock) -> Worker<MemoryStore>
where
    Q: SettleInTransaction<MemoryStore> + PullPort + 'static,
{
    grouped_builder(queue, store, clock).build().expect("valid")
}

/// A grouped worker's builder over `queue`, on `store` and `clock`, handling [`KIND`] with
/// [`Sleeps`] and [`REFUSED`] with [`Refuses`].
fn grouped_builder<Q>(
    queue: Q,
    store: &MemoryStore,
    clock: ManualClock,
) -> jobs_consumers::WorkerBuilder<MemoryStore>
where
    Q: SettleInTransaction<MemoryStore> + PullPort + 'static,
{
    Worker::grouped_builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        QUEUE.parse().expect("valid"),
        Arc::new(queue),
        Arc::new(store.clone()),
    )
    .handler(KIND.parse().expect("valid"), Sleeps)
    .handler(REFUSED.parse().expect("valid"), Refuses)
    .clock(Arc::new(clock))
}

/// Publishes a job of `kind` numbered `n` that takes no time.
async fn publish(queue: &MemoryQueue, kind: &str, n: u64) {
    let data = serde_json::json!({ "n": n, "secs": 0 });
    let envelope = jobs_testkit::fixtures::envelope_with(1, kind, data);
    (queue.publish(
        &QUEUE.parse().expect("valid"),
        &envelope,
        PublishOptions::default(),
    ))
    .await
    .expect("publish");
}

/// Jobs 1, 2 and 3 run once by a grouped worker over a queue with `fault`: their outcomes,
/// and the store.
async fn three_jobs_run_once(fault: Fault) -> (Vec<Outcome>, MemoryStore) {
    let (queue, store, clock) = fresh();
    for n in 1..=3 {
        publish(&queue, KIND, n).await;
    }
    let worker = grouped(Faulty(queue, fault), &store, clock);
    (worker.run_once().await.expect("receive"), store)
}

#[tokio::test(start_paused = true)]
async fn a_job_whose_lease_moved_before_its_group_held_it_is_left_unsettled_and_says_so() {
    let (outcomes, store) = three_jobs_run_once(Fault::LosesHold).await;
    let lost: Vec<&Outcome> = (outcomes.iter())
        .filter(|outcome| !matches!(outcome, Outcome::Processed))
        .collect();
    let [Outcome::Unsettled { error }] = &lost[..] else {
        panic!("one job's lease was lost, the others processed: {outcomes:?}");
    };
    assert!(
        error.contains("lease was lost before the group held it"),
        "{error}"
    );
    assert_eq!(outcomes.len(), 3, "an outcome a job: {outcomes:?}");
    let mut ran = store.effects();
    ran.sort();
    assert_eq!(ran, ["1", "3"], "the lost job did not run here");
}

#[tokio::test(start_paused = true)]
async fn a_group_that_cannot_settle_commits_nothing_and_says_so_for_each_job() {
    let (outcomes, store) = three_jobs_run_once(Fault::FailsSettle).await;
    assert_eq!(outcomes.len(), 3, "an outcome a job: {outcomes:?}");
    for outcome in &outcomes {
        let Outcome::Unsettled { error } = outcome else {
            panic!("left to its lease: {outcomes:?}");
        };
        assert!(
            error.contains("the group did not commit") && error.contains("went away"),
            "{error}"
        );
    }
    assert!(store.effects().is_empty(), "rolled back");
}

/// Metrics name a job's kind only when a handler of the worker knows it, so that no producer
/// can make up series: a kind nobody handles is counted by queue as it is retried, not as a
/// kind's retry, and dead-lettered as `unknown`; a known kind's dead letter names it.
#[test]
fn grouped_counters_name_only_the_kinds_the_worker_knows() {
    let counted = crate::harness::every_counter(async {
        let (queue, store, clock) = fresh();
        publish(&queue, "billing.new_in_this_deploy", 1).await;
        publish(&queue, REFUSED, 2).await;
        let worker = grouped(queue, &store, clock.clone());
        for _ in 0..10 {
            for _ in 0..10 {
                if worker.run_once().await.expect("receive").is_empty() {
                    break;
                }
            }
            // Each retry falls due within the policy's cap.
            clock.advance(Duration::from_secs(3_600));
        }
    });
    let named = |name: &str| -> Vec<(Vec<String>, u64)> {
        (counted.iter())
            .filter(|(counter, ..)| counter == name)
            .map(|(_, labels, n)| (labels.clone(), *n))
            .collect()
    };
    let labels = |values: &[&str]| values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        named("jobs_unknown_kind_retried_total"),
        [(labels(&[QUEUE]), 4)],
        "{counted:?}"
    );
    assert_eq!(named("jobs_retried_total"), [], "{counted:?}");
    assert_eq!(
        named("jobs_dead_lettered_total"),
        [
            (labels(&[QUEUE, REFUSED, "permanent"]), 1),
            (labels(&[QUEUE, "unknown", "unknown_kind"]), 1),
        ],
        "{counted:?}"
    );
}

/// The memory pair for the suite: a fresh queue and store on one manual clock, the store's
/// transactions allowed PostgreSQL's 31 checkpoints.
async fn memory() -> jobs_testkit::grouped::GroupedBackend<MemoryStore, MemoryQueue> {
    fn write(
        tx: &mut MemoryWorkTx,
        key: String,
    ) -> jobs_testkit::model::BoxFuture<'_, Result<(), StoreError>> {
        tx.record_effect(key);
        Box::pin(async { Ok(()) })
    }
    let clock = ManualClock::default();
    let store = MemoryStore::default().with_checkpoint_budget(31);
    let effects = store.clone();
    jobs_testkit::grouped::GroupedBackend {
        backend: jobs_testkit::model::Backend {
            store,
            write_effect: write,
            effects: Arc::new(move || {
                let effects = effects.effects();
                Box::pin(async move { effects })
            }),
        },
        queue: Arc::new(MemoryQueue::new(Arc::new(clock.clone()))),
        clock,
    }
}

/// One test per case of the suite, on [`memory`] with time paused.
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod suite {
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    jobs_testkit::grouped::$case(super::memory().await).await;
                }
            )*
        }
    };
}

jobs_testkit::grouped_cases!(suite);

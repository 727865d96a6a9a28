//! The grouped runtime's behaviour suite: what a grouped worker (`jobs-consumers`'
//! `Worker::grouped_builder`) does with its jobs, over any queue that settles inside its
//! store's transactions, written once and run on each such pair.
//!
//! `jobs-consumers` runs it on the memory queue and store with tokio's time paused (no case
//! waits on the wall clock there); the PostgreSQL adapter runs it on `PgQueue` and `PgStore`
//! in real time. What depends on one engine's row locks, savepoints or fencing stays with
//! that engine's own tests.
//!
//! Each case is an async function taking a fresh [`GroupedBackend`]; it panics, saying what
//! broke, when the runtime does not behave. [`passes`] holds what a group does in its
//! transaction (each job failing alone, duplicates, readiness, the checkpoint budget,
//! rerunnable passes, counts); [`run`] holds what the loop does around the groups (sizing by
//! the handlers' time, linger, fetching ahead, a suspect job run alone, the stop that gives
//! back what it fetched, a backlog drained).
//!
//! The cases need a checkpoint budget between 14 and 36 (PostgreSQL's is 31): a budget
//! outside it is refused by name rather than tested weakly.
//! [`grouped_cases!`](crate::grouped_cases) names every case, so that each pair runs them all.

pub mod passes;
pub mod run;

/// Calls the macro `$each` with the name of every case of the suite, comma-separated: a
/// runner declares one test per case in `$each` (its attributes, its pair), and runs a case
/// added here without being told.
///
/// ```ignore
/// macro_rules! suite {
///     ($($case:ident),*) => {$(
///         #[tokio::test(start_paused = true)]
///         async fn $case() { jobs_testkit::grouped::$case(pair().await).await }
///     )*};
/// }
/// jobs_testkit::grouped_cases!(suite);
/// ```
#[macro_export]
macro_rules! grouped_cases {
    ($each:ident) => {
        $each!(
            a_failing_job_takes_nothing_from_its_group,
            a_group_skips_a_job_processed_before,
            undoing_a_failed_job_keeps_what_its_neighbours_settled,
            a_group_size_out_of_bounds_is_refused,
            a_group_runs_the_jobs_that_get_ready_and_defers_the_others,
            groups_fit_the_transactions_checkpoint_budget,
            when_the_first_job_to_write_fails_the_group_starts_again_without_it,
            a_group_of_rerunnable_jobs_runs_the_others_again_when_one_fails,
            a_rerunnable_group_tries_again_without_checkpoints_then_carefully,
            a_rerunnable_group_checkpoints_as_often_as_its_jobs_fail,
            a_grouped_worker_counts_each_job_once_by_outcome_and_kind,
            groups_hold_about_group_time_of_their_handlers,
            a_lingering_fetch_fills_its_group,
            a_linger_never_delays_an_empty_fetch_or_a_full_group,
            a_busy_grouped_worker_leases_no_more_while_a_group_waits,
            a_stop_gives_back_fetched_jobs_with_their_attempt_unspent,
            a_stop_ends_a_running_group_after_its_current_job,
            a_job_whose_lease_expired_runs_alone_with_nothing_else_leased,
            the_grouped_loop_drains_a_backlog_once_and_wakes_for_new_jobs
        );
    };
}

pub use passes::*;
pub use run::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jobs_consumers::{Handler, Job, JobError, Worker, WorkerBuilder};
use jobs_core::{
    ConsumerName, DeadLetterStore, Envelope, GroupTransaction, ManualClock, ProcessedJobs,
    PullPort, QueueDepth, QueueName, QueuePort, SettleInTransaction, WorkStore, WorkTransaction,
};
use serde::Deserialize;

use crate::fixtures;
use crate::model::Backend;

/// A store a grouped worker can run on: its transactions hold groups, it keeps its dead
/// letters and answers whether a job was processed.
pub trait GroupedStore:
    WorkStore<Tx: GroupTransaction + Send> + DeadLetterStore + ProcessedJobs + Clone
{
}

impl<S> GroupedStore for S where
    S: WorkStore<Tx: GroupTransaction + Send> + DeadLetterStore + ProcessedJobs + Clone
{
}

/// A queue kept in `S`'s database: it publishes, leases, reports its depth, and settles
/// inside `S`'s transactions.
pub trait GroupedQueue<S: WorkStore>:
    SettleInTransaction<S> + PullPort + QueuePort + QueueDepth + 'static
{
}

impl<S: WorkStore, Q> GroupedQueue<S> for Q where
    Q: SettleInTransaction<S> + PullPort + QueuePort + QueueDepth + 'static
{
}

/// One fresh, empty pair under test.
pub struct GroupedBackend<S: WorkStore, Q> {
    /// The store, how a handler writes an effect in its work transaction, and how the
    /// committed effects read back (as [`model`](crate::model) takes them). An effect is the
    /// job's number as text.
    pub backend: Backend<S>,
    /// The queue, in the store's own database.
    pub queue: Arc<Q>,
    /// The queue's clock, which the suite's workers take too.
    pub clock: ManualClock,
}

/// The queue every case consumes.
const QUEUE: &str = "grouped.jobs";
/// The kind of the scripted jobs.
const KIND: &str = "test.step";

/// What a scripted job does, from its data: `{"n": 1, "then": "retry", "ready": "wait"}`.
#[derive(Deserialize)]
struct Step {
    n: i64,
    /// What its handler does (see [`Scripted`]); `ok` when absent.
    #[serde(default)]
    then: String,
    /// How its handler gets ready: `wait` (20 ms), `defer` (a minute on), `gate` (until the
    /// test opens the gate); at once when absent.
    #[serde(default)]
    ready: String,
}

/// What the scripted handler saw, in order: with one group at a time, a run of readies
/// followed by their runs is one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Ready(i64),
    Ran(i64),
}

/// The suite's handler: writes its job's number as an effect and then does what the job's
/// `then` says, on its first run only (later runs succeed): `ok`, `no-write` (writes
/// nothing), `retry`, `permanent`, `defer` (an hour on), `panic` (each after writing),
/// `retry-early` (on the first attempt, before writing), `permanent-early` (before writing,
/// always), `hold` (writes once the test opens the gate), `nap` (writes after 40 ms). Counts every run by number, which
/// stands for an effect outside the transaction (an HTTP call) that must not repeat because
/// of a neighbour.
struct Scripted<Tx> {
    write: crate::model::WriteEffect<Tx>,
    clock: ManualClock,
    log: Arc<Mutex<Log>>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl<Tx> Clone for Scripted<Tx> {
    fn clone(&self) -> Self {
        Scripted {
            write: self.write,
            clock: self.clock.clone(),
            log: self.log.clone(),
            gate: self.gate.clone(),
        }
    }
}

/// The scripted handler's record.
#[derive(Default)]
struct Log {
    runs: HashMap<i64, u32>,
    /// The attempt of each run, by number.
    attempts: HashMap<i64, Vec<u32>>,
    seen: Vec<Seen>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<Tx> Scripted<Tx> {
    fn log(&self) -> MutexGuard<'_, Log> {
        lock(&self.log)
    }

    /// How often job `n` ran.
    fn runs(&self, n: i64) -> u32 {
        self.log().runs.get(&n).copied().unwrap_or(0)
    }

    /// The attempts job `n` ran at.
    fn attempts(&self, n: i64) -> Vec<u32> {
        self.log().attempts.get(&n).cloned().unwrap_or_default()
    }

    /// The numbers of the jobs that ran, in the order they started.
    fn started(&self) -> Vec<i64> {
        (self.log().seen.iter())
            .filter_map(|seen| match seen {
                Seen::Ran(n) => Some(*n),
                Seen::Ready(_) => None,
            })
            .collect()
    }

    /// The groups the jobs ran in, for a worker running one group at a time: a group's
    /// readiness is asked of all its jobs before the first runs.
    fn groups(&self) -> Vec<Vec<i64>> {
        let mut groups: Vec<Vec<i64>> = Vec::new();
        let mut readying = false;
        for seen in &self.log().seen {
            match seen {
                Seen::Ready(_) if !readying => {
                    groups.push(Vec::new());
                    readying = true;
                }
                Seen::Ready(_) => {}
                Seen::Ran(n) => {
                    readying = false;
                    if let Some(group) = groups.last_mut() {
                        group.push(*n);
                    }
                }
            }
        }
        groups.retain(|group| !group.is_empty());
        groups
    }
}

#[async_trait]
impl<Tx: Send + 'static> Handler<Tx> for Scripted<Tx> {
    type Data = Step;

    async fn ready(&self, job: &Job<Step>) -> Result<(), JobError> {
        let step = &job.envelope.data;
        self.log().seen.push(Seen::Ready(step.n));
        match step.ready.as_str() {
            "wait" => tokio::time::sleep(Duration::from_millis(20)).await,
            "defer" => {
                let until = jobs_core::Clock::now(&self.clock) + Duration::from_secs(60);
                return Err(JobError::Defer { until });
            }
            "gate" => drop(self.gate.acquire().await.map_err(JobError::retry)?),
            _ => {}
        }
        Ok(())
    }

    async fn handle(&self, job: Job<Step>, tx: &mut Tx) -> Result<(), JobError> {
        let Step { n, then, .. } = job.envelope.data;
        let run = {
            let mut log = self.log();
            log.seen.push(Seen::Ran(n));
            log.attempts.entry(n).or_default().push(job.attempt);
            let runs = log.runs.entry(n).or_default();
            *runs += 1;
            *runs
        };
        match then.as_str() {
            "no-write" => return Ok(()),
            "retry-early" if job.attempt == 1 => return Err(JobError::retry("fails early")),
            "permanent-early" => return Err(JobError::permanent("refuses early")),
            "hold" => drop(self.gate.acquire().await.map_err(JobError::retry)?),
            "nap" => tokio::time::sleep(Duration::from_millis(40)).await,
            _ => {}
        }
        (self.write)(tx, n.to_string())
            .await
            .map_err(JobError::retry)?;
        if run > 1 {
            return Ok(());
        }
        match then.as_str() {
            "retry" => Err(JobError::retry("the ledger is down after the insert")),
            "permanent" => Err(JobError::permanent("invoice does not exist")),
            "defer" => {
                let until = jobs_core::Clock::now(&self.clock) + Duration::from_secs(3_600);
                Err(JobError::Defer { until })
            }
            "panic" => panic!("the handler panics after its insert"),
            _ => Ok(()),
        }
    }
}

/// [`Scripted`], declared rerunnable: its only effects are its writes.
struct Rerunnable<Tx>(Scripted<Tx>);

#[async_trait]
impl<Tx: Send + 'static> Handler<Tx> for Rerunnable<Tx> {
    type Data = Step;
    const RERUNNABLE: bool = true;

    async fn handle(&self, job: Job<Step>, tx: &mut Tx) -> Result<(), JobError> {
        self.0.handle(job, tx).await
    }
}

/// A case's pair, its scripted handler and its queue's name.
struct Fixture<S: GroupedStore, Q> {
    b: GroupedBackend<S, Q>,
    handler: Scripted<S::Tx>,
    name: QueueName,
}

impl<S: GroupedStore, Q: GroupedQueue<S>> Fixture<S, Q> {
    fn new(b: GroupedBackend<S, Q>) -> Self {
        let handler = Scripted {
            write: b.backend.write_effect,
            clock: b.clock.clone(),
            log: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        Fixture {
            b,
            handler,
            name: QUEUE.parse().expect("a valid queue"),
        }
    }

    /// A grouped worker of the fixture's queue and store on its clock, without a handler.
    fn bare(&self) -> WorkerBuilder<S> {
        let consumer = ConsumerName::try_from("test.grouped").expect("a valid consumer");
        let store = Arc::new(self.b.backend.store.clone());
        Worker::grouped_builder(consumer, self.name.clone(), self.b.queue.clone(), store)
            .clock(Arc::new(self.b.clock.clone()))
    }

    /// [`Fixture::bare`] running the scripted handler, `group_size` jobs a group, two groups
    /// at once.
    fn worker(&self, group_size: usize) -> WorkerBuilder<S> {
        (self.bare())
            .handler(KIND.parse().expect("a valid kind"), self.handler.clone())
            .group_size(group_size)
            .concurrency(2)
    }

    /// [`Fixture::worker`] with the handler declared rerunnable.
    fn rerunnable(&self, group_size: usize) -> WorkerBuilder<S> {
        (self.bare())
            .handler(
                KIND.parse().expect("a valid kind"),
                Rerunnable(self.handler.clone()),
            )
            .group_size(group_size)
            .concurrency(2)
    }

    fn envelope(&self, n: i64, then: &str) -> Envelope {
        step(n, then, "")
    }

    async fn publish(&self, envelope: &Envelope) {
        self.publish_with(envelope, jobs_core::PublishOptions::default())
            .await;
    }

    async fn publish_with(&self, envelope: &Envelope, opts: jobs_core::PublishOptions) {
        (self.b.queue)
            .publish(&self.name, envelope, opts)
            .await
            .expect("publish");
    }

    /// Publishes a job of each `(n, then)` step, in order; their envelopes.
    async fn publish_steps(&self, steps: &[(i64, &str)]) -> Vec<Envelope> {
        let mut envelopes = Vec::with_capacity(steps.len());
        for &(n, then) in steps {
            let envelope = self.envelope(n, then);
            self.publish(&envelope).await;
            envelopes.push(envelope);
        }
        envelopes
    }

    /// Jobs numbered `ns`, each doing `then`.
    async fn publish_all(&self, ns: impl IntoIterator<Item = i64>, then: &str) {
        for n in ns {
            self.publish(&self.envelope(n, then)).await;
        }
    }

    /// The committed effects: the numbers of the jobs whose writes committed, sorted.
    async fn effects(&self) -> Vec<i64> {
        let mut effects: Vec<i64> = ((self.b.backend.effects)().await.iter())
            .map(|effect| effect.parse().expect("an effect is a job's number"))
            .collect();
        effects.sort_unstable();
        effects
    }

    async fn depth(&self) -> jobs_core::Depth {
        self.b.queue.depth(&self.name).await.expect("depth")
    }

    /// The store's checkpoint budget, as a transaction reports it.
    async fn budget(&self) -> usize {
        let tx = self.b.backend.store.begin().await.expect("begin");
        let budget = tx.checkpoint_budget();
        tx.rollback().await.expect("roll back");
        assert!(
            (14..=36).contains(&budget),
            "the suite needs a checkpoint budget of 14 to 36, this store has {budget}"
        );
        budget
    }

    /// Whether the job of `envelope` holds its claim for the fixture's consumer.
    async fn processed(&self, envelope: &Envelope) -> bool {
        let consumer = ConsumerName::try_from("test.grouped").expect("a valid consumer");
        (self.b.backend.store)
            .is_processed(envelope.job_id, &consumer)
            .await
            .expect("read processed_jobs")
    }
}

/// A scripted job's envelope.
fn step(n: i64, then: &str, ready: &str) -> Envelope {
    let data = serde_json::json!({ "n": n, "then": then, "ready": ready });
    fixtures::envelope_with(1, KIND, data)
}

/// [`crate::eventually`] within a minute.
async fn eventually<F: Future<Output = bool>>(what: &str, done: impl FnMut() -> F) {
    crate::eventually(what, Duration::from_secs(60), done).await;
}

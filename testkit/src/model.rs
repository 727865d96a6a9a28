//! Model-based property tests of the runtime's retry and idempotency semantics, for any store.
//!
//! Arbitrary sequences of events (publishes, duplicate publishes, poison, work, crashes before
//! the ack or in the middle of a job, a store that refuses a work transaction, clock jumps,
//! replays) drive the real runtime
//! (`jobs-consumers`) on a transport and a store the caller provides, with a manual clock. After every step the safety invariants are
//! checked; at the end the queue is drained and the liveness ones too. Each failure message
//! names the invariant it broke:
//!
//! 1. every valid job's effect is committed exactly once, or the job waits in the dead letters
//!    exactly once; never both, never neither once the queue has drained;
//! 2. after a commit, no copy of the job runs the handler again;
//! 3. no attempt exceeds the policy's maximum, and every retry delay lies in `[d/2, d]` with
//!    `d = min(cap, base·2^(n-1))` for the true attempt `n`;
//! 4. poison is never retried and lands in the dead letters with its bytes intact;
//! 5. a dead letter carries attempts, last_error, queue and correlation_id;
//! 6. a valid job of a kind no handler knows is never run and never dead-lettered before
//!    the policy's attempts: it is retried with the backoff (invariant 3's bounds) and then
//!    lands in the dead letters with its bytes intact (ADR 0012);
//! 7. with no crash injected, the worker settles every delivery it receives, but for a dead
//!    letter the store refused to record (left leased, to come back): a refused work
//!    transaction defers its jobs, their attempts unspent, rather than leave them leased.
//!
//! The suite must have teeth: [`check_mutants_are_caught`] wraps the ports so that one rule at
//! a time is broken (no claim, ack on receive, poison retried, attempts counted from zero, a
//! failed job's writes kept, a failed job's claim kept) and checks that the same property fails
//! for each. The handler writes its effect before it fails, so a failure that is not rolled
//! back (or undone) shows as an effect committed twice.
//!
//! A store joins by a [`Backend`]: the store, how a handler writes an effect in its work
//! transaction, and how to read the committed effects back. A queue in the store's own
//! database runs the same model grouped ([`check_grouped_invariants`]): the worker settles
//! inside its work transactions, and a crash before the ack becomes a group that never
//! commits.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use jobs_consumers::{
    DeadLetters, Handler, Job, JobError, Outcome, RetryPolicy, Worker, WorkerBuilder,
};
use jobs_core::{
    Claim, Clock, ConsumerName, ConsumerPort, DeadLetter, DeadLetterEvent, DeadLetterFilter,
    DeadLetterId, DeadLetterStatus, DeadLetterStore, Delivery, Envelope, GroupTransaction, JobId,
    Lease, ManualClock, NewDeadLetter, PublishOptions, PullPort, QueueDepth, QueueError, QueueName,
    QueuePort, Recorded, SettleInTransaction, SettlePort, Settlement, StoreError, TenantId,
    Transition, WorkStore, WorkTransaction,
};
use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestError, TestRng, TestRunner,
};
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::AtomicU64;

/// The queue the model publishes to and its worker consumes, for a setup that configures it
/// (makes it fair, say).
pub const QUEUE: &str = "model.jobs";
const KIND: &str = "model.job";
const MAX_ATTEMPTS: u32 = 5;

/// What the handler does on its k-th invocation for a job (beyond the script: succeed).
#[derive(Clone, Copy, Debug)]
enum Step {
    Ok,
    Retry,
    Permanent,
    Panic,
    Defer,
}

#[derive(Clone, Debug)]
enum Poison {
    Bytes(Vec<u8>),
    BrokenField,
    UnknownKind,
    BadData,
}

#[derive(Clone, Debug)]
enum Event {
    Publish(Vec<Step>),
    /// Publish job `i` again under a fresh dedup key: the transport delivers it twice.
    Duplicate(usize),
    Poison(Poison),
    /// One poll of the worker.
    Work,
    /// The worker dies after its next commit or dead letter, before the ack.
    CrashBeforeAck,
    /// The worker leases up to `n` deliveries and dies before committing anything.
    CrashMidWork(usize),
    Advance(u32),
    /// The store refuses the worker's next work transaction (a database restart, a pool run
    /// dry): what it would have run is deferred, its attempt unspent.
    StoreDown,
    /// An operator replays pending dead letter `i`.
    Replay(usize),
}

/// One rule broken on purpose, to prove the properties notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The real thing.
    None,
    /// The claim always succeeds: `processed_jobs` is never consulted.
    NoClaim,
    /// Messages are acked as soon as they are received, before any commit.
    AckOnReceive,
    /// A poison message is released for a retry instead of acked.
    RetryPoison,
    /// Every delivery claims to be the first attempt.
    AttemptsFromZero,
    /// Grouped: a failed job's writes are not undone, so they commit with its group.
    NoUndo,
    /// Grouped: a failed job's claim is not released, so its group commits it.
    KeepClaim,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Ok),
        4 => Just(Step::Retry),
        1 => Just(Step::Permanent),
        1 => Just(Step::Panic),
        1 => Just(Step::Defer),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => prop::collection::vec(step(), 0..8).prop_map(Event::Publish),
        1 => any::<usize>().prop_map(Event::Duplicate),
        1 => prop_oneof![
            prop::collection::vec(any::<u8>(), 0..24).prop_map(Poison::Bytes),
            Just(Poison::BrokenField),
            Just(Poison::UnknownKind),
            Just(Poison::BadData),
        ]
        .prop_map(Event::Poison),
        5 => Just(Event::Work),
        1 => Just(Event::CrashBeforeAck),
        1 => (1usize..4).prop_map(Event::CrashMidWork),
        2 => (1u32..4_000).prop_map(Event::Advance),
        1 => any::<usize>().prop_map(Event::Replay),
        1 => Just(Event::StoreDown),
    ]
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A boxed future, as the backend's functions return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Writes the effect `key` in a work transaction of the store.
pub type WriteEffect<Tx> = for<'a> fn(&'a mut Tx, String) -> BoxFuture<'a, Result<(), StoreError>>;

/// A store under test: the store, how a handler writes an effect in its work transaction, and
/// how to read the committed effects (in any order).
pub struct Backend<S: WorkStore> {
    /// A fresh, empty, migrated store.
    pub store: S,
    /// Writes an effect inside the work transaction.
    pub write_effect: WriteEffect<S::Tx>,
    /// Reads the committed effects.
    pub effects: Effects,
}

/// Publishes raw bytes to a queue, as a poisoned producer would.
pub type Inject = Arc<dyn Fn(&QueueName, Vec<u8>) + Send + Sync>;

/// Reads the committed effects.
pub type Effects = Arc<dyn Fn() -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// The transport under test, over a [`ManualClock`].
pub struct Transport {
    /// Publishes jobs.
    pub publisher: Arc<dyn QueuePort>,
    /// Delivers them.
    pub consumer: Arc<dyn ConsumerPort>,
    /// Reports depth, to know when the queue has drained.
    pub depth: Arc<dyn QueueDepth>,
    /// Publishes raw bytes (poison).
    pub inject: Inject,
    /// The transport's clock.
    pub clock: ManualClock,
}

/// What the handler observed.
#[derive(Default)]
struct HandlerLog {
    invocations: HashMap<u64, usize>,
    attempts: Vec<(u64, u32)>,
    violations: Vec<String>,
}

#[derive(Deserialize)]
struct Data {
    n: u64,
}

/// [`ModelHandler`] declared rerunnable: its only effect is its write through the transaction
/// (its invocation log is the test's own bookkeeping).
struct Rerunnable<Tx>(ModelHandler<Tx>);

#[async_trait]
impl<Tx: WorkTransaction> Handler<MutantTx<Tx>> for Rerunnable<Tx> {
    type Data = Data;
    const RERUNNABLE: bool = true;

    async fn handle(&self, job: Job<Data>, tx: &mut MutantTx<Tx>) -> Result<(), JobError> {
        self.0.handle(job, tx).await
    }
}

struct ModelHandler<Tx> {
    scripts: Arc<Mutex<HashMap<u64, Vec<Step>>>>,
    log: Arc<Mutex<HandlerLog>>,
    write_effect: WriteEffect<Tx>,
    effects: Effects,
    clock: ManualClock,
}

#[async_trait]
impl<Tx: WorkTransaction> Handler<MutantTx<Tx>> for ModelHandler<Tx> {
    type Data = Data;

    async fn handle(&self, job: Job<Data>, tx: &mut MutantTx<Tx>) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        let committed = (self.effects)().await.contains(&n.to_string());
        let k = {
            let mut log = lock(&self.log);
            if committed {
                log.violations.push(format!(
                    "invariant 2: the handler ran for job {n} after its effect was committed"
                ));
            }
            log.attempts.push((n, job.attempt));
            let k = log.invocations.entry(n).or_default();
            *k += 1;
            *k - 1
        };
        let step = lock(&self.scripts)
            .get(&n)
            .and_then(|s| s.get(k).copied())
            .unwrap_or(Step::Ok);
        // Written before any failure, so a failure must undo it.
        (self.write_effect)(&mut tx.inner, n.to_string())
            .await
            .map_err(|e| JobError::classed(e.class(), e))?;
        match step {
            Step::Ok => Ok(()),
            Step::Retry => Err(JobError::retry("scripted retryable failure")),
            Step::Permanent => Err(JobError::permanent("scripted permanent failure")),
            Step::Panic => panic!("{SCRIPTED_PANIC} {n}"),
            Step::Defer => Err(JobError::Defer {
                until: self.clock.now() + Duration::from_secs(10),
            }),
        }
    }
}

/// The store under test, or a mutant of it (no claim; grouped: no undo, a claim kept).
#[derive(Clone)]
struct MutantStore<S> {
    inner: S,
    mutant: Mutant,
    stats: Arc<GroupStats>,
    /// Set by [`Event::StoreDown`]: the next transaction is refused.
    down: Arc<AtomicBool>,
    /// Refusals of a transaction that is not a job's work ([`WorkStore::begin`], as a dead
    /// letter's): the message stays leased, as the dead-letter path must leave it.
    others_refused: Arc<AtomicU64>,
}

struct MutantTx<T> {
    inner: T,
    mutant: Mutant,
    stats: Arc<GroupStats>,
}

#[async_trait]
impl<T: WorkTransaction> WorkTransaction for MutantTx<T> {
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        if self.mutant == Mutant::NoClaim {
            return Ok(Claim::Claimed);
        }
        self.inner.claim(job_id, consumer, at).await
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        self.inner.record_dead_letter(letter).await
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.inner.commit().await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.inner.rollback().await
    }
}

#[async_trait]
impl<T: GroupTransaction> GroupTransaction for MutantTx<T> {
    async fn claim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Claim>, StoreError> {
        if self.mutant == Mutant::NoClaim {
            return Ok(vec![Claim::Claimed; job_ids.len()]);
        }
        self.inner.claim_all(job_ids, consumer, at).await
    }

    fn take_touched(&mut self) -> bool {
        self.inner.take_touched()
    }

    async fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.inner.checkpoint().await
    }

    fn checkpoint_budget(&self) -> usize {
        self.inner.checkpoint_budget()
    }

    async fn undo(&mut self) -> Result<(), StoreError> {
        self.stats.undone.fetch_add(1, Ordering::Relaxed);
        if self.mutant == Mutant::NoUndo {
            return Ok(());
        }
        self.inner.undo().await
    }

    async fn unclaim(&mut self, job_id: JobId, consumer: &ConsumerName) -> Result<(), StoreError> {
        if self.mutant == Mutant::KeepClaim {
            return Ok(());
        }
        self.inner.unclaim(job_id, consumer).await
    }

    async fn unclaim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
    ) -> Result<(), StoreError> {
        if self.mutant == Mutant::KeepClaim {
            return Ok(());
        }
        self.inner.unclaim_all(job_ids, consumer).await
    }
}

#[async_trait]
impl<S: WorkStore> WorkStore for MutantStore<S> {
    type Tx = MutantTx<S::Tx>;

    async fn begin(&self) -> Result<MutantTx<S::Tx>, StoreError> {
        if let Err(refused) = self.refuse_if_down() {
            self.others_refused.fetch_add(1, Ordering::Relaxed);
            return Err(refused);
        }
        Ok(self.wrap(self.inner.begin().await?))
    }

    async fn begin_within(
        &self,
        limit: std::time::Duration,
    ) -> Result<MutantTx<S::Tx>, StoreError> {
        self.refuse_if_down()?;
        Ok(self.wrap(self.inner.begin_within(limit).await?))
    }
}

impl<S: WorkStore> MutantStore<S> {
    /// Refuses one transaction after [`Event::StoreDown`].
    fn refuse_if_down(&self) -> Result<(), StoreError> {
        if self.down.swap(false, Ordering::SeqCst) {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::unavailable("the model's store is down"));
        }
        Ok(())
    }

    fn wrap(&self, inner: S::Tx) -> MutantTx<S::Tx> {
        MutantTx {
            inner,
            mutant: self.mutant,
            stats: self.stats.clone(),
        }
    }
}

#[async_trait]
impl<S: DeadLetterStore> DeadLetterStore for MutantStore<S> {
    async fn record(&self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        self.inner.record(letter).await
    }
    async fn get(&self, id: DeadLetterId) -> Result<Option<DeadLetter>, StoreError> {
        self.inner.get(id).await
    }
    async fn list(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.list(filter).await
    }
    async fn listing(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<jobs_core::ListedLetter>, StoreError> {
        self.inner.listing(filter).await
    }
    async fn pending(&self, q: &QueueName, key: &str) -> Result<Option<DeadLetterId>, StoreError> {
        self.inner.pending(q, key).await
    }
    async fn transition(
        &self,
        id: DeadLetterId,
        to: jobs_core::Resolution,
        tenant: Option<TenantId>,
        at: SystemTime,
        by: &str,
    ) -> Result<Transition, StoreError> {
        self.inner.transition(id, to, tenant, at, by).await
    }
    async fn history(&self, id: DeadLetterId) -> Result<Vec<DeadLetterEvent>, StoreError> {
        self.inner.history(id).await
    }
}

/// A retry the transport was asked for, with the delivery's true attempt.
struct RetryRecord {
    attempt: u32,
    now: SystemTime,
    at: SystemTime,
    payload: Vec<u8>,
}

/// The transport as the runtime sees it: the real one, a recorder of the truth beneath,
/// crash injection, and the transport mutants above.
struct Wire {
    inner: Arc<dyn ConsumerPort>,
    clock: ManualClock,
    mutant: Mutant,
    lose_next_ack: AtomicBool,
    /// Lease token → (true attempt, payload) of every delivery handed out.
    leases: Mutex<HashMap<String, (u32, Vec<u8>)>>,
    retries: Mutex<Vec<RetryRecord>>,
    poison: Mutex<HashSet<Vec<u8>>>,
}

impl Wire {
    fn payload(&self, lease: &Lease) -> Option<(u32, Vec<u8>)> {
        lock(&self.leases).get(lease.token()).cloned()
    }

    async fn record_retry(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        if let Some((attempt, payload)) = self.payload(lease) {
            lock(&self.retries).push(RetryRecord {
                attempt,
                now: self.clock.now(),
                at,
                payload,
            });
        }
        self.inner.retry_at(lease, at).await
    }
}

#[async_trait]
impl PullPort for Wire {
    async fn receive(
        &self,
        q: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let deliveries = self.inner.receive(q, max, lease).await?;
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            lock(&self.leases).insert(d.lease.token().to_owned(), (d.attempt, d.payload.clone()));
            if self.mutant == Mutant::AckOnReceive {
                self.inner.ack(&d.lease).await?;
            }
            let attempt = if self.mutant == Mutant::AttemptsFromZero {
                1
            } else {
                d.attempt
            };
            out.push(
                Delivery::new(d.payload, attempt, d.message_id, d.lease).after_expiry(d.expired),
            );
        }
        Ok(out)
    }

    async fn wait_for_work(&self, q: &QueueName) {
        self.inner.wait_for_work(q).await;
    }
}

#[async_trait]
impl SettlePort for Wire {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        if self.lose_next_ack.swap(false, Ordering::SeqCst) {
            return Err(QueueError::Unavailable {
                queue: lease.queue().clone(),
                message: "the worker died before the ack".into(),
                source: None,
            });
        }
        if self.mutant == Mutant::RetryPoison
            && let Some((_, payload)) = self.payload(lease)
            && lock(&self.poison).contains(&payload)
        {
            return self.record_retry(lease, self.clock.now()).await;
        }
        self.inner.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.record_retry(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.inner.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.inner.extend(lease, by).await
    }
}

/// What the grouped model exercised, counted over every case: the proof that a run reached
/// groups at all.
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Groups of two jobs or more that settled in their transaction.
    pub groups: AtomicU64,
    /// Retries and deferrals settled inside a group.
    pub released: AtomicU64,
    /// Failed jobs undone back to their checkpoint.
    pub undone: AtomicU64,
    /// Groups that died after settling and never committed (an injected crash).
    pub crashed: AtomicU64,
    /// Work transactions the store refused (a store down, one of the events), grouped or not.
    pub refused: AtomicU64,
}

impl GroupStats {
    /// `(groups, released, undone, crashed, refused)`.
    pub fn counts(&self) -> (u64, u64, u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            get(&self.groups),
            get(&self.released),
            get(&self.undone),
            get(&self.crashed),
            get(&self.refused),
        )
    }

    /// Adds `other`'s counts to these: what several runs reached together.
    pub fn add(&self, other: &GroupStats) {
        for (total, more) in [
            (&self.groups, &other.groups),
            (&self.released, &other.released),
            (&self.undone, &other.undone),
            (&self.crashed, &other.crashed),
            (&self.refused, &other.refused),
        ] {
            total.fetch_add(more.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// The grouped transport as the runtime sees it: the [`Wire`] for fetching and for what
/// settles outside a transaction, and the queue's own settlement inside the work transaction,
/// recorded like the wire records its retries, and crashing on cue after settling.
struct GroupWire<S: WorkStore> {
    wire: Arc<Wire>,
    inner: Arc<dyn SettleInTransaction<S>>,
    stats: Arc<GroupStats>,
}

#[async_trait]
impl<S: WorkStore> PullPort for GroupWire<S> {
    async fn receive(
        &self,
        q: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.wire.receive(q, max, lease).await
    }

    async fn wait_for_work(&self, q: &QueueName) {
        self.wire.wait_for_work(q).await;
    }
}

#[async_trait]
impl<S: WorkStore> SettlePort for GroupWire<S> {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.wire.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.wire.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.wire.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.wire.extend(lease, by).await
    }
}

#[async_trait]
impl<S: WorkStore> SettleInTransaction<MutantStore<S>> for GroupWire<S> {
    fn shares_transactions_with(
        &self,
        store: &MutantStore<S>,
    ) -> Result<(), jobs_core::Unsupported> {
        self.inner.shares_transactions_with(&store.inner)
    }

    async fn hold(
        &self,
        tx: &mut MutantTx<S::Tx>,
        leases: &[&Lease],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.hold(&mut tx.inner, leases).await
    }

    async fn settle(
        &self,
        tx: &mut MutantTx<S::Tx>,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError> {
        self.inner.settle(&mut tx.inner, settlements).await?;
        if self.wire.lose_next_ack.swap(false, Ordering::SeqCst) {
            self.stats.crashed.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::unavailable("the worker died before the commit"));
        }
        if settlements.len() > 1 {
            self.stats.groups.fetch_add(1, Ordering::Relaxed);
        }
        for (delivery, settlement) in settlements {
            match settlement {
                Settlement::RetryAt(at) => {
                    self.stats.released.fetch_add(1, Ordering::Relaxed);
                    if let Some((attempt, payload)) = self.wire.payload(&delivery.lease) {
                        lock(&self.wire.retries).push(RetryRecord {
                            attempt,
                            now: self.wire.clock.now(),
                            at: *at,
                            payload,
                        });
                    }
                }
                Settlement::Defer(_) => {
                    self.stats.released.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// How a case's worker starts to be built, from its consumer, queue, wire and store: per job
/// over the wire, or grouped over the queue the setup gave.
type Shape<S> = Box<
    dyn FnOnce(
        ConsumerName,
        QueueName,
        Arc<Wire>,
        Arc<MutantStore<S>>,
        Arc<GroupStats>,
    ) -> WorkerBuilder<MutantStore<S>>,
>;

/// A job of `kind` for the model's one tenant, with a fresh correlation id.
fn envelope(kind: &str, data: serde_json::Value) -> Envelope {
    let tenant: TenantId = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
        .parse()
        .expect("valid");
    let correlation = JobId::generate()
        .to_string()
        .parse()
        .expect("a v7 is a uuid");
    Envelope::new(tenant, correlation, kind.parse().expect("valid"), data)
}

struct ModelJob {
    n: u64,
    envelope: Envelope,
    replays: u32,
}

struct System<S: WorkStore> {
    clock: ManualClock,
    /// [`MutantStore::down`].
    store_down: Arc<AtomicBool>,
    /// [`MutantStore::others_refused`].
    others_refused: Arc<AtomicU64>,
    queue: Transport,
    store: S,
    effects: Effects,
    transport: Arc<Wire>,
    worker: Worker<MutantStore<S>>,
    ops: DeadLetters,
    scripts: Arc<Mutex<HashMap<u64, Vec<Step>>>>,
    log: Arc<Mutex<HandlerLog>>,
    name: QueueName,
    policy: RetryPolicy,
    jobs: Vec<ModelJob>,
    poison: Vec<Vec<u8>>,
    /// Valid jobs of a kind no handler knows, as published (replays included).
    unknown: Vec<Vec<u8>>,
}

impl<S> System<S>
where
    S: WorkStore + DeadLetterStore + Clone,
{
    fn new(
        backend: Backend<S>,
        queue: Transport,
        mutant: Mutant,
        shape: Shape<S>,
        stats: Arc<GroupStats>,
        rerunnable: bool,
    ) -> System<S> {
        let clock = queue.clock.clone();
        let store = backend.store;
        let transport = Arc::new(Wire {
            inner: queue.consumer.clone(),
            clock: clock.clone(),
            mutant,
            lose_next_ack: AtomicBool::new(false),
            leases: Mutex::default(),
            retries: Mutex::default(),
            poison: Mutex::default(),
        });
        let scripts: Arc<Mutex<HashMap<u64, Vec<Step>>>> = Arc::default();
        let log: Arc<Mutex<HandlerLog>> = Arc::default();
        let store_down = Arc::new(AtomicBool::new(false));
        let others_refused = Arc::new(AtomicU64::new(0));
        let mutant_store = MutantStore {
            inner: store.clone(),
            mutant,
            stats: stats.clone(),
            down: store_down.clone(),
            others_refused: others_refused.clone(),
        };
        let name: QueueName = QUEUE.parse().expect("valid");
        let handler = ModelHandler {
            scripts: scripts.clone(),
            log: log.clone(),
            write_effect: backend.write_effect,
            effects: backend.effects.clone(),
            clock: clock.clone(),
        };
        let consumer = ConsumerName::try_from("model.consumer").expect("valid");
        let store_of_worker = Arc::new(mutant_store);
        let builder = shape(
            consumer,
            name.clone(),
            transport.clone(),
            store_of_worker,
            stats,
        );
        let kind = KIND.parse().expect("valid");
        let builder = if rerunnable {
            builder.handler(kind, Rerunnable(handler))
        } else {
            builder.handler(kind, handler)
        };
        let worker = builder
            .clock(Arc::new(clock.clone()))
            .build()
            .expect("a valid worker");
        let ops = DeadLetters::new(Arc::new(store.clone()), queue.publisher.clone())
            .with_clock(Arc::new(clock.clone()));
        System {
            clock,
            store_down,
            others_refused,
            queue,
            store,
            effects: backend.effects,
            transport,
            worker,
            ops,
            scripts,
            log,
            name,
            policy: RetryPolicy::default(),
            jobs: vec![],
            poison: vec![],
            unknown: vec![],
        }
    }

    async fn apply(&mut self, event: &Event) {
        match event {
            Event::Publish(script) => {
                let n = self.jobs.len() as u64;
                let envelope = envelope(KIND, json!({ "n": n }));
                lock(&self.scripts).insert(n, script.clone());
                self.queue
                    .publisher
                    .publish(&self.name, &envelope, PublishOptions::default())
                    .await
                    .expect("publish");
                self.jobs.push(ModelJob {
                    n,
                    envelope,
                    replays: 0,
                });
            }
            Event::Duplicate(i) => {
                if self.jobs.is_empty() {
                    return;
                }
                let job = &self.jobs[i % self.jobs.len()];
                let key = format!("copy-{}", JobId::generate());
                let opts = PublishOptions::default().dedup_key(key);
                self.queue
                    .publisher
                    .publish(&self.name, &job.envelope, opts)
                    .await
                    .expect("publish");
            }
            Event::Poison(poison) => {
                let bytes = match poison {
                    Poison::Bytes(bytes) => bytes.clone(),
                    Poison::BrokenField => {
                        let mut v = serde_json::to_value(envelope(KIND, json!({"n": 0})))
                            .expect("serialises");
                        v["job_id"] = json!("not-a-uuid");
                        serde_json::to_vec(&v).expect("serialises")
                    }
                    Poison::UnknownKind => {
                        // Not poison: a rolling deploy's kind, retried until its attempts run
                        // out (invariant 6).
                        let bytes = serde_json::to_vec(&envelope("model.unknown", json!({"n": 0})))
                            .expect("serialises");
                        (self.queue.inject)(&self.name, bytes.clone());
                        self.unknown.push(bytes);
                        return;
                    }
                    Poison::BadData => {
                        serde_json::to_vec(&envelope(KIND, json!({"n": "x"}))).expect("serialises")
                    }
                };
                lock(&self.transport.poison).insert(bytes.clone());
                (self.queue.inject)(&self.name, bytes.clone());
                self.poison.push(bytes);
            }
            Event::Work => {
                let crash = self.transport.lose_next_ack.load(Ordering::SeqCst);
                self.poll(crash).await;
            }
            Event::CrashBeforeAck => self.transport.lose_next_ack.store(true, Ordering::SeqCst),
            Event::CrashMidWork(n) => {
                // Leased and never settled: the lease expires and the messages come back.
                let _ = self
                    .transport
                    .receive(&self.name, *n, Duration::from_secs(60))
                    .await
                    .expect("receive");
            }
            Event::Advance(secs) => self.clock.advance(Duration::from_secs(u64::from(*secs))),
            Event::StoreDown => self.store_down.store(true, Ordering::SeqCst),
            Event::Replay(i) => {
                let pending = self
                    .store
                    .list(&DeadLetterFilter {
                        status: Some(DeadLetterStatus::PendingReview),
                        limit: 1_000,
                        ..DeadLetterFilter::default()
                    })
                    .await
                    .expect("list");
                let replayable: Vec<_> = pending
                    .iter()
                    .filter(|l| {
                        l.letter.job_id.is_some() && Envelope::decode(&l.letter.payload).is_ok()
                    })
                    .collect();
                if replayable.is_empty() {
                    return;
                }
                let letter = replayable[i % replayable.len()];
                if self.ops.replay(letter.id, None).await.is_ok() {
                    if self.poison.contains(&letter.letter.payload) {
                        // Replayed poison is published again, and lands again.
                        self.poison.push(letter.letter.payload.clone());
                    }
                    if self.unknown.contains(&letter.letter.payload) {
                        self.unknown.push(letter.letter.payload.clone());
                    }
                    if let Some(job) = self
                        .jobs
                        .iter_mut()
                        .find(|j| Some(j.envelope.job_id) == letter.letter.job_id)
                    {
                        job.replays += 1;
                    }
                }
            }
        }
    }

    async fn letters(&self) -> Vec<DeadLetter> {
        self.store
            .list(&DeadLetterFilter {
                limit: 100_000,
                ..DeadLetterFilter::default()
            })
            .await
            .expect("list")
    }

    /// One poll of the worker and, unless a `crash` is injected, invariant 7: a delivery is
    /// left unsettled only by a dead letter the store refused to record.
    async fn poll(&self, crash: bool) -> Vec<Outcome> {
        let before = self.others_refused.load(Ordering::Relaxed);
        let outcomes = self.worker.run_once().await.expect("receive");
        let excused = self.others_refused.load(Ordering::Relaxed) - before;
        let unsettled: Vec<&str> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Unsettled { error } => Some(error.as_str()),
                _ => None,
            })
            .collect();
        if !crash && unsettled.len() as u64 > excused {
            lock(&self.log).violations.push(format!(
                "invariant 7: {} deliveries left unsettled with no crash injected and {excused} \
                 dead letters refused: {unsettled:?}",
                unsettled.len()
            ));
        }
        outcomes
    }

    /// The invariants that hold after every step.
    async fn check_safety(&self) -> Result<(), String> {
        if let Some(v) = lock(&self.log).violations.first() {
            return Err(v.clone());
        }
        let effects = (self.effects)().await;
        let letters = self.letters().await;
        for job in &self.jobs {
            let committed = effects.iter().filter(|e| **e == job.n.to_string()).count();
            if committed > 1 {
                return Err(format!(
                    "invariant 1: job {} committed {committed} times",
                    job.n
                ));
            }
            let pending = letters
                .iter()
                .filter(|l| {
                    l.status == DeadLetterStatus::PendingReview
                        && l.letter.job_id == Some(job.envelope.job_id)
                })
                .count();
            if committed == 1 && pending > 0 {
                return Err(format!(
                    "invariant 1: job {} is both committed and dead-lettered",
                    job.n
                ));
            }
            if pending > 1 {
                return Err(format!(
                    "invariant 1: job {} dead-lettered {pending} times",
                    job.n
                ));
            }
        }
        for (n, attempt) in &lock(&self.log).attempts {
            if *attempt > MAX_ATTEMPTS {
                return Err(format!(
                    "invariant 3: job {n} ran at attempt {attempt} > {MAX_ATTEMPTS}"
                ));
            }
        }
        for r in lock(&self.transport.retries).iter() {
            if self.poison.contains(&r.payload) {
                return Err("invariant 4: a poison message was released for a retry".to_owned());
            }
            let d = self.policy.ceiling(r.attempt);
            let delay = r.at.duration_since(r.now).unwrap_or_default();
            if delay < d / 2 || delay > d {
                return Err(format!(
                    "invariant 3: retry after attempt {} in {delay:?}, outside [{:?}, {d:?}]",
                    r.attempt,
                    d / 2
                ));
            }
        }
        for letter in &letters {
            let l = &letter.letter;
            if l.attempts == 0 || l.last_error.is_empty() || l.queue != self.name {
                return Err(format!("invariant 5: incomplete dead letter {letter:?}"));
            }
            if let Some(job) = self
                .jobs
                .iter()
                .find(|j| Some(j.envelope.job_id) == l.job_id)
                && l.correlation_id != Some(job.envelope.correlation_id)
            {
                return Err(format!(
                    "invariant 5: dead letter of job {} lost its correlation id",
                    job.n
                ));
            }
        }
        Ok(())
    }

    /// Stops the crashes, lets time pass until the queue is empty, and checks the end state.
    async fn drain_and_check(&mut self) -> Result<(), String> {
        self.transport.lose_next_ack.store(false, Ordering::SeqCst);
        for _ in 0..60 {
            for _ in 0..200 {
                if self.poll(false).await.is_empty() {
                    break;
                }
            }
            self.check_safety().await?;
            if self
                .queue
                .depth
                .depth(&self.name)
                .await
                .expect("depth")
                .total()
                == 0
            {
                break;
            }
            self.clock.advance(Duration::from_secs(3_600));
        }
        if self
            .queue
            .depth
            .depth(&self.name)
            .await
            .expect("depth")
            .total()
            != 0
        {
            return Err("invariant 1: the queue never drained".to_owned());
        }
        let effects = (self.effects)().await;
        let letters = self.letters().await;
        for job in &self.jobs {
            let committed = effects.iter().filter(|e| **e == job.n.to_string()).count();
            let pending = letters
                .iter()
                .filter(|l| {
                    l.status == DeadLetterStatus::PendingReview
                        && l.letter.job_id == Some(job.envelope.job_id)
                })
                .count();
            if committed + pending != 1 {
                return Err(format!(
                    "invariant 1: job {} ended committed {committed} times and pending in the dead letters {pending} times (replayed {} times)",
                    job.n, job.replays
                ));
            }
        }
        for bytes in &self.poison {
            let published = self.poison.iter().filter(|b| *b == bytes).count();
            let landed = letters
                .iter()
                .filter(|l| l.letter.payload == *bytes)
                .count();
            if landed != published {
                return Err(format!(
                    "invariant 4: poison {bytes:?} published {published} times, {landed} dead letters hold it intact"
                ));
            }
        }
        for bytes in &self.unknown {
            let published = self.unknown.iter().filter(|b| *b == bytes).count();
            let landed: Vec<_> = letters
                .iter()
                .filter(|l| l.letter.payload == *bytes)
                .collect();
            if landed.len() != published {
                return Err(format!(
                    "invariant 6: a job of an unknown kind published {published} times, {} dead letters hold it intact",
                    landed.len()
                ));
            }
            if let Some(early) = landed.iter().find(|l| l.letter.attempts < MAX_ATTEMPTS) {
                return Err(format!(
                    "invariant 6: a job of an unknown kind was dead-lettered after {} attempts, before the policy's {MAX_ATTEMPTS}",
                    early.letter.attempts
                ));
            }
        }
        Ok(())
    }
}

/// Keeps the scripted panics (thousands per run) out of the test output; any other panic
/// still reaches the default hook.
fn quiet_scripted_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let scripted = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with(SCRIPTED_PANIC));
            if !scripted {
                default(info);
            }
        }));
    });
}

const SCRIPTED_PANIC: &str = "scripted panic in job";

/// Runs `events` against a fresh system from `setup` with `mutant`; `Err` names the broken
/// invariant.
fn run_model<S, F, Fut>(
    events: &[Event],
    mutant: Mutant,
    setup: &F,
    stats: &Arc<GroupStats>,
    rerunnable: bool,
) -> Result<(), String>
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Shape<S>)>,
{
    quiet_scripted_panics();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let (backend, transport, shape) = setup().await;
            let mut system =
                System::new(backend, transport, mutant, shape, stats.clone(), rerunnable);
            for (i, event) in events.iter().enumerate() {
                system.apply(event).await;
                system
                    .check_safety()
                    .await
                    .map_err(|e| format!("after step {i} ({event:?}): {e}"))?;
            }
            system.drain_and_check().await
        })
}

/// The case count: `PROPTEST_CASES` when set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec(event(), 1..40)
}

/// Checks every invariant over `cases` random event sequences, each on a fresh system from
/// `setup` (called inside the case's own async runtime). Panics with the broken invariant and
/// the minimal sequence that breaks it.
pub fn check_invariants<S, F, Fut>(cases: u32, setup: F)
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport)> + 'static,
{
    check(cases, &per_job(setup), &Arc::default(), false);
}

/// [`check_invariants`] with the worker grouped over `queue` (from `setup`), a queue in the
/// store's own database: several jobs per work transaction, settled in it. Answers what the
/// runs exercised of groups, for the caller to show (and to check it is not nothing).
pub fn check_grouped_invariants<S, Q, F, Fut>(cases: u32, setup: F) -> Arc<GroupStats>
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Arc<Q>)> + 'static,
{
    check_grouped(cases, setup, false)
}

/// [`check_grouped_invariants`] with the model's handler declared
/// [`RERUNNABLE`](Handler::RERUNNABLE): groups take checkpoints only as often as jobs failed
/// lately, and a failure goes back to the last one (or rolls its group back) and runs the
/// others since again, which every invariant must survive (a rerun after an undo is no second
/// run to a commit).
pub fn check_grouped_rerunnable_invariants<S, Q, F, Fut>(cases: u32, setup: F) -> Arc<GroupStats>
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Arc<Q>)> + 'static,
{
    check_grouped(cases, setup, true)
}

fn check_grouped<S, Q, F, Fut>(cases: u32, setup: F, rerunnable: bool) -> Arc<GroupStats>
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Arc<Q>)> + 'static,
{
    let stats = Arc::default();
    check(cases, &grouped(setup), &stats, rerunnable);
    stats
}

/// One case's system parts, built in the case's own (single-threaded) runtime.
type Case<S> = Pin<Box<dyn Future<Output = (Backend<S>, Transport, Shape<S>)>>>;

/// A setup whose worker runs per job.
fn per_job<S, F, Fut>(setup: F) -> impl Fn() -> Case<S>
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport)> + 'static,
{
    move || {
        let setup = setup();
        Box::pin(async move {
            let (backend, transport) = setup.await;
            let shape: Shape<S> = Box::new(|consumer, queue, wire, store, _| {
                Worker::builder(consumer, queue, wire, store.clone(), store)
            });
            (backend, transport, shape)
        })
    }
}

/// A setup whose worker runs grouped over the queue `setup` gives.
fn grouped<S, Q, F, Fut>(setup: F) -> impl Fn() -> Case<S>
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Arc<Q>)> + 'static,
{
    move || {
        let setup = setup();
        Box::pin(async move {
            let (backend, transport, queue) = setup.await;
            let shape: Shape<S> = Box::new(move |consumer, name, wire, store, stats| {
                let queue = Arc::new(GroupWire {
                    wire,
                    inner: queue,
                    stats,
                });
                Worker::grouped_builder(consumer, name, queue, store)
            });
            (backend, transport, shape)
        })
    }
}

fn check<S, F, Fut>(cases: u32, setup: &F, stats: &Arc<GroupStats>, rerunnable: bool)
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Shape<S>)>,
{
    let config = Config {
        cases,
        // Relative to the calling crate: each keeps its own seeds of past failures, replayed
        // first on every run. Commit the file when proptest writes one.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/model.txt",
        ))),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&events(), |events| {
        run_model(&events, Mutant::None, setup, stats, rerunnable).map_err(TestCaseError::fail)
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// Checks that each [`Mutant`] of the per-job runtime breaks an invariant within 256 sequences
/// of a fixed seed: the suite's proof that it would notice those bugs. Returns what caught
/// each mutant.
pub fn check_mutants_are_caught<S, F, Fut>(setup: F) -> Vec<(Mutant, String)>
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport)> + 'static,
{
    catch(
        &[
            Mutant::NoClaim,
            Mutant::AckOnReceive,
            Mutant::RetryPoison,
            Mutant::AttemptsFromZero,
        ],
        &per_job(setup),
    )
}

/// [`check_mutants_are_caught`] for the grouped runtime, with its own mutants too: a failed
/// job's writes kept ([`Mutant::NoUndo`]) and its claim kept ([`Mutant::KeepClaim`]).
pub fn check_grouped_mutants_are_caught<S, Q, F, Fut>(setup: F) -> Vec<(Mutant, String)>
where
    S: WorkStore + DeadLetterStore + Clone,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Arc<Q>)> + 'static,
{
    catch(
        &[
            Mutant::NoClaim,
            Mutant::AttemptsFromZero,
            Mutant::NoUndo,
            Mutant::KeepClaim,
        ],
        &grouped(setup),
    )
}

fn catch<S, F, Fut>(mutants: &[Mutant], setup: &F) -> Vec<(Mutant, String)>
where
    S: WorkStore + DeadLetterStore + Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = (Backend<S>, Transport, Shape<S>)>,
{
    let mut caught = vec![];
    for &mutant in mutants {
        let config = Config {
            cases: 256,
            failure_persistence: None,
            // Caught is enough: the first failing sequence, not the smallest.
            max_shrink_iters: 0,
            ..Config::default()
        };
        let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let stats = Arc::default();
        let result = runner.run(&events(), |events| {
            run_model(&events, mutant, setup, &stats, false).map_err(TestCaseError::fail)
        });
        match result {
            Err(TestError::Fail(reason, _)) => caught.push((mutant, reason.to_string())),
            other => panic!(
                "the properties did not notice the mutant {mutant:?} ({other:?}): the suite lost its teeth"
            ),
        }
    }
    caught
}

//! The worker: receive, decode, claim, handle, commit, ack; or retry, defer, dead-letter.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use jobs_core::{
    Claim, Clock, ConsumerName, ConsumerPort, CorrelationId, DeadLetterId, DeadLetterStore,
    DecodeLimits, Delivery, Envelope, GroupTransaction, JobId, JobKind, Kind, LeaseLimits,
    NewDeadLetter, PullPort, QueueError, QueueName, Recorded, SettleInTransaction, SettlePort,
    StoreError, SystemClock, TenantFairness, TenantId, WorkStore, WorkTransaction,
};
use serde_json::Value;
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{Instrument, field};

use crate::alerts::CoalescingAlerter;
use crate::group::{Groups, GroupsOf};
use crate::handler::{Canceller, ErasedHandler, Handler, JobError, Prepared, Typed};
use crate::retry::{Backoff, QueuePolicy, RetryPolicy};

/// What became of one delivery. Non-exhaustive, so that a new way for a delivery to end
/// breaks no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler's work committed and the message was acked.
    Processed,
    /// The job had been processed before: acked without running the handler.
    Duplicate,
    /// Released for another attempt at this time.
    Retrying {
        /// When the next attempt becomes due.
        at: SystemTime,
    },
    /// Released without spending an attempt (rate limited, store unavailable).
    Deferred {
        /// When it becomes due again.
        until: SystemTime,
    },
    /// Recorded in the dead letters and acked.
    DeadLettered {
        /// The dead letter.
        id: DeadLetterId,
        /// Why.
        reason: DeadReason,
    },
    /// Nothing could be settled (the transport or the dead-letter store failed): the lease
    /// will expire and the message come back. Nothing is lost.
    Unsettled {
        /// What failed.
        error: String,
    },
}

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// The payload is not a valid envelope, or its data does not fit the handler (or no
    /// handler knows its kind, with [`WorkerBuilder::unknown_kinds_are_poison`]). Never
    /// retried.
    Poison,
    /// No handler of the worker knows the job's kind, after every attempt the policy allows
    /// (ADR 0012: in a rolling deploy producers ship a kind before every worker has its
    /// handler).
    UnknownKind,
    /// The handler said retrying cannot help.
    Permanent,
    /// Every attempt the policy allows failed.
    Exhausted,
}

impl DeadReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeadReason::Poison => "poison",
            DeadReason::UnknownKind => "unknown_kind",
            DeadReason::Permanent => "permanent",
            DeadReason::Exhausted => "exhausted",
        }
    }
}

/// A worker that cannot be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A worker with no handler could only dead-letter.
    #[error("worker `{0}` has no handler registered")]
    NoHandlers(ConsumerName),
    /// Two handlers for one kind.
    #[error("kind `{0}` has two handlers")]
    DuplicateKind(Kind),
    /// A [`JobKind::KIND`] given to [`WorkerBuilder::job`] is not a valid kind.
    #[error("{0}")]
    InvalidKind(String),
    /// A setting that cannot work (a worker with no concurrency, a lease too short to extend,
    /// a zero poll interval or time limit, a lease or a time limit longer than the transport
    /// can hold a delivery), named as in [`WorkerConfig`].
    #[error("{field} = {value} cannot work: {why}")]
    Config {
        /// The setting, e.g. `concurrency`, or `timeout of kind ...`.
        field: String,
        /// Its value.
        value: String,
        /// What it must be.
        why: String,
    },
    /// [`WorkerBuilder::grouped`] was given a queue whose statements cannot join the store's
    /// transactions.
    #[error("worker `{consumer}` cannot run grouped: {reason}")]
    NotInStore {
        /// The worker's consumer.
        consumer: ConsumerName,
        /// Why the queue and the store do not share transactions.
        reason: String,
    },
    /// A group size outside 1 to [`MAX_GROUP_SIZE`].
    #[error("group_size {0} is outside 1 to {MAX_GROUP_SIZE}")]
    GroupSize(usize),
    /// An override for a queue this worker does not consume.
    #[error("retry policy override for `{policy}` given to the worker of `{queue}`")]
    PolicyForOtherQueue {
        /// The worker's queue.
        queue: QueueName,
        /// The override's queue.
        policy: QueueName,
    },
}

/// Tuning of a worker. The defaults suit handlers that take milliseconds to seconds.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Deliveries handled at once.
    pub concurrency: usize,
    /// How long a delivery stays leased before another worker may take it; extended every
    /// third of it for as long as the delivery's work runs (waiting for a connection, the
    /// handler within its time limit, the commit). A grouped job's row is locked by its
    /// group's transaction instead, which no expiry can take away.
    pub lease: Duration,
    /// How long a handler may run (one minute by default; per kind,
    /// [`WorkerBuilder::timeout`]). Past it the handler is stopped, its writes are rolled
    /// back and the job is retried, spending an attempt, with an error that says it timed
    /// out. A time limit stops only code that yields: a handler that blocks its thread is not
    /// stopped by it. A store that can bound each statement of the work transaction by the
    /// limit does ([`WorkStore::begin_within`]; PostgreSQL does, SQLite runs a statement to
    /// its end), so a handler stopped in the middle of a statement leaves nothing running.
    pub handler_timeout: Duration,
    /// How long to wait before polling an empty queue again, unless the transport's wake-up
    /// ([`PullPort::wait_for_work`]) comes first. With a transport that notifies, this
    /// bounds only the latency of delays and retries falling due.
    pub poll_interval: Duration,
    /// How long in-flight jobs may finish after shutdown is asked; the rest are left unacked
    /// and come back to another worker.
    pub shutdown_grace: Duration,
    /// Limits applied when decoding payloads.
    pub decode_limits: DecodeLimits,
    /// In grouped mode ([`WorkerBuilder::grouped`]), the most jobs one work transaction
    /// carries (1 to [`MAX_GROUP_SIZE`]). Larger groups commit less often; each job of a group
    /// waits for the ones before it, since they share one connection. A group whose jobs
    /// write needs a checkpoint per job, and a transaction takes only so many
    /// ([`GroupTransaction::checkpoint_budget`](jobs_core::GroupTransaction::checkpoint_budget),
    /// 31 on PostgreSQL): past them a group gives its other jobs back, unrun and their attempts
    /// unspent, and the next groups are made that much smaller, growing back while they need
    /// fewer.
    pub group_size: usize,
    /// In grouped mode, how long a group that found fewer than `group_size` jobs ready waits
    /// for more before it starts. Zero by default: a job published to an idle worker starts at
    /// once, and groups fill only under load.
    pub group_linger: Duration,
    /// In grouped mode, about how long a group's handlers should take in all (100 ms by
    /// default; 30 ms at most for a worker that fetches fairly across tenants): groups hold no
    /// more jobs than this over the handlers' recent mean time (at least one). A group's jobs
    /// commit when the last has run, and each waits for the ones before it, so groups of fast
    /// handlers are large and slow handlers run few to a transaction (a 10 ms handler ten, a
    /// 100 ms one alone) rather than holding their connection, locks and results back for
    /// seconds. A fair worker's light tenant should not wait behind a group of another's
    /// jobs, hence its tighter bound. Under a saturated database every handler takes longer,
    /// so too tight a bound makes groups smaller just when their overhead costs most.
    pub group_time: Duration,
}

/// The largest group: its jobs run one after another on one connection and its rows stay
/// locked until its commit, so a larger one mostly makes its jobs wait.
pub const MAX_GROUP_SIZE: usize = 64;

/// The shortest lease a worker accepts.
const MIN_LEASE: Duration = Duration::from_secs(1);

/// The longest lease a worker accepts.
const MAX_LEASE: Duration = Duration::from_secs(86_400);

/// The most warning a shutdown gives in-flight handlers ([`Cancellation`](crate::Cancellation))
/// before it abandons them.
const SHUTDOWN_NOTICE: Duration = Duration::from_secs(5);

/// Why a worker built for a push transport does not run a loop.
const NOTHING_TO_PULL: &str = "this worker has nothing to pull (built with \
    Worker::push_builder): its transport delivers through Worker::process";

/// The most a fair worker's group's handlers take in all ([`WorkerConfig::group_time`]): a
/// light tenant's job waits for the ones before it in its group, of another tenant's backlog
/// (behind 1 ms handlers, groups of 64 made it wait 56 ms at p99, groups of 30 about 30; 20
/// waited less but drained a 100,000-job backlog at 0.86 of the oldest-first worker's pace).
const FAIR_GROUP_TIME: Duration = Duration::from_millis(30);

/// How many groups a grouped worker's fetch brings beyond its free slots. A fetch starts when
/// less than a group waits in the buffer, so with two the fetches of a busy worker bring a
/// group or two each rather than less than one, and the lease statement's cost is spread over
/// more jobs (the no-op drain at concurrency 4 went from about 45k to 47k jobs/s); a worker
/// leases at most its running groups and two groups ahead.
const FETCH_AHEAD: usize = 2;

/// The most jobs one fetch of a grouped worker leases: enough for many groups at once when
/// the fetch falls behind them, few enough that one statement stays short.
const MAX_FETCH: usize = 1_024;

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 8,
            lease: Duration::from_secs(60),
            handler_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            shutdown_grace: Duration::from_secs(30),
            decode_limits: DecodeLimits::default(),
            group_size: 64,
            group_linger: Duration::ZERO,
            group_time: Duration::from_millis(100),
        }
    }
}

impl WorkerConfig {
    /// The limits `WorkerBuilder::build` holds a configuration to:
    ///
    /// | setting | default | must be |
    /// |---|---|---|
    /// | `concurrency` | 8 | at least 1 |
    /// | `lease` | 60 s | 1 s to a day (it is extended every third of it), and no longer than the transport sets ([`LeaseLimits::per_lease`]) |
    /// | `handler_timeout` | 60 s | above zero, and (like every kind's own) no longer than the transport holds a delivery ([`LeaseLimits::per_delivery`]) |
    /// | `poll_interval` | 500 ms | above zero |
    /// | `shutdown_grace` | 30 s | any |
    /// | `group_size` | 64 | 1 to [`MAX_GROUP_SIZE`] when grouped |
    /// | `group_linger` | 0 | any |
    /// | `group_time` | 100 ms (at most 30 ms when fair) | above zero |
    fn check(&self) -> Result<(), WorkerError> {
        let refuse = |field: &str, value: String, why: &str| {
            Err(WorkerError::Config {
                field: field.to_owned(),
                value,
                why: why.to_owned(),
            })
        };
        if self.concurrency == 0 {
            return refuse(
                "concurrency",
                "0".to_owned(),
                "a worker must run at least one job",
            );
        }
        if self.lease < MIN_LEASE {
            return refuse(
                "lease",
                format!("{:?}", self.lease),
                "at least 1 s, or extending it would be a storm of requests",
            );
        }
        if self.lease > MAX_LEASE {
            return refuse(
                "lease",
                format!("{:?}", self.lease),
                "at most a day: a crashed worker's jobs come back only after it",
            );
        }
        if self.handler_timeout.is_zero() {
            return refuse(
                "handler_timeout",
                "0s".to_owned(),
                "a handler needs some time to run",
            );
        }
        if self.poll_interval.is_zero() {
            return refuse(
                "poll_interval",
                "0s".to_owned(),
                "a zero interval polls an empty queue in a busy loop",
            );
        }
        if self.group_time.is_zero() {
            return refuse(
                "group_time",
                "0s".to_owned(),
                "a group needs some time for its jobs",
            );
        }
        Ok(())
    }

    /// The connections a worker with this configuration needs from a pool it shares with its
    /// queue: one per concurrent job (or group), one for fetching, one for settlements and
    /// lease extensions made outside a work transaction, and one for the queue's wake-ups
    /// (LISTEN). A smaller pool makes jobs wait for connections held by their neighbours.
    pub fn connections(&self) -> u32 {
        u32::try_from(self.concurrency)
            .unwrap_or(u32::MAX)
            .saturating_add(3)
    }
}

/// Builds a [`Worker`].
pub struct WorkerBuilder<S: WorkStore> {
    consumer: ConsumerName,
    queue: QueueName,
    settle: Arc<dyn SettlePort>,
    /// The transport's pull side; none for a push transport.
    pull: Option<Arc<dyn PullPort>>,
    /// A layer given to [`WorkerBuilder::pull`], which replaces the transport's.
    layer: Option<Arc<dyn PullPort>>,
    store: Arc<S>,
    dead_letters: Arc<dyn DeadLetterStore>,
    handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    timeouts: HashMap<Kind, Duration>,
    duplicate: Option<Kind>,
    policy: RetryPolicy,
    rationale: Option<QueuePolicy>,
    clock: Arc<dyn Clock>,
    alerts: Option<CoalescingAlerter>,
    config: WorkerConfig,
    groups: Option<Arc<dyn Groups<S>>>,
    unknown_is_poison: bool,
    /// Why a [`WorkerBuilder::job`] kind was refused.
    invalid_kind: Option<String>,
    fairness: Option<TenantFairness>,
}

impl<S: WorkStore> WorkerBuilder<S> {
    /// Runs `handler` for jobs of `kind`.
    pub fn handler<H: Handler<S::Tx>>(mut self, kind: Kind, handler: H) -> Self
    where
        S::Tx: Send,
    {
        if self.handlers.contains_key(&kind) {
            self.duplicate = Some(kind.clone());
        }
        self.handlers.insert(kind, Arc::new(Typed::new(handler)));
        self
    }

    /// Runs `handler` for the jobs of its data's kind ([`JobKind`]): the kind is named once,
    /// on the data type, so a handler cannot be registered under a kind whose data it does not
    /// take. An invalid [`JobKind::KIND`] is refused by [`build`](Self::build).
    ///
    /// ```compile_fail,E0271
    /// # use jobs_consumers::{Handler, Job, JobError, WorkerBuilder};
    /// # use jobs_core::JobKind;
    /// # use serde::{Deserialize, Serialize};
    /// #[derive(Serialize, Deserialize)]
    /// struct InvoiceIssued { invoice: i64 }
    /// impl JobKind for InvoiceIssued { const KIND: &'static str = "billing.invoice_issued"; }
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct ParcelShipped { parcel: i64 }
    ///
    /// struct ShipParcel;
    /// #[async_trait::async_trait]
    /// impl<Tx: Send + 'static> Handler<Tx> for ShipParcel {
    ///     type Data = ParcelShipped;
    ///     async fn handle(&self, _: Job<ParcelShipped>, _: &mut Tx) -> Result<(), JobError> { Ok(()) }
    /// }
    ///
    /// fn wire<S: jobs_core::WorkStore>(builder: WorkerBuilder<S>) -> WorkerBuilder<S> where S::Tx: Send {
    ///     // A handler of parcels for invoices: refused by the compiler, not found poison later.
    ///     builder.job::<InvoiceIssued, _>(ShipParcel)
    /// }
    /// ```
    pub fn job<J, H>(mut self, handler: H) -> Self
    where
        J: JobKind,
        H: Handler<S::Tx, Data = J>,
        S::Tx: Send,
    {
        match jobs_core::kind_of::<J>() {
            Ok(kind) => self.handler(kind, handler),
            Err(e) => {
                self.invalid_kind.get_or_insert(e.to_string());
                self
            }
        }
    }

    /// Lets handlers of `kind` run for `limit` instead of [`WorkerConfig::handler_timeout`].
    pub fn timeout(mut self, kind: Kind, limit: Duration) -> Self {
        self.timeouts.insert(kind, limit);
        self
    }

    /// Overrides the standard retry policy for this queue; the rationale is logged at start.
    pub fn policy(mut self, policy: QueuePolicy) -> Self {
        self.policy = policy.policy();
        self.rationale = Some(policy);
        self
    }

    /// Takes time from `clock` (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration as set so far, for a composition that sizes a pool from it.
    pub fn settings(&self) -> &WorkerConfig {
        &self.config
    }

    /// Raises (coalesced) alerts when jobs are dead-lettered.
    pub fn alerts(mut self, alerts: CoalescingAlerter) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// Replaces the tuning; the setters below change one setting each.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// [`WorkerConfig::concurrency`].
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.config.concurrency = concurrency;
        self
    }

    /// [`WorkerConfig::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// [`WorkerConfig::handler_timeout`], every kind's unless [`timeout`](Self::timeout) sets
    /// its own.
    pub fn handler_timeout(mut self, limit: Duration) -> Self {
        self.config.handler_timeout = limit;
        self
    }

    /// [`WorkerConfig::poll_interval`].
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// [`WorkerConfig::shutdown_grace`].
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.config.shutdown_grace = grace;
        self
    }

    /// [`WorkerConfig::group_size`].
    pub fn group_size(mut self, size: usize) -> Self {
        self.config.group_size = size;
        self
    }

    /// [`WorkerConfig::group_linger`].
    pub fn group_linger(mut self, linger: Duration) -> Self {
        self.config.group_linger = linger;
        self
    }

    /// [`WorkerConfig::group_time`].
    pub fn group_time(mut self, time: Duration) -> Self {
        self.config.group_time = time;
        self
    }

    /// [`WorkerConfig::decode_limits`].
    pub fn decode_limits(mut self, limits: DecodeLimits) -> Self {
        self.config.decode_limits = limits;
        self
    }

    /// Dead-letters a job whose kind no handler of this worker knows at once, as poison,
    /// instead of retrying it with the queue's backoff (the default, so that in a rolling
    /// deploy a kind published before every worker has its handler waits for it): for a
    /// worker that is the only consumer of its queue and knows every kind there can be.
    pub fn unknown_kinds_are_poison(mut self) -> Self {
        self.unknown_is_poison = true;
        self
    }

    /// Fetches the queue's ready jobs shared out among tenants as `fairness` says, instead of
    /// oldest first. [`build`](Self::build) asks the pull side (the layer given to
    /// [`pull`](Self::pull), else the transport) for it, and fails when it cannot: a push
    /// transport, or one that fetches oldest first only, fails the build rather than serving
    /// one tenant's backlog first at run time.
    pub fn fair(mut self, fairness: TenantFairness) -> Self {
        self.fairness = Some(fairness);
        self
    }

    /// Fetches through `pull`, a layer over the pull side of the worker's transport that
    /// decides what to hand out (a priority gate), while deliveries are still settled through
    /// the transport itself. Its deliveries must be the transport's: the layer passes them on.
    pub fn pull(mut self, pull: Arc<dyn PullPort>) -> Self {
        self.layer = Some(pull);
        self
    }

    /// Runs grouped: `queue`, kept in the store's own database, becomes the transport, and
    /// several of its jobs run in one work transaction that also settles them, committing once
    /// (up to [`WorkerConfig::group_size`]). Each job still succeeds or fails alone: its writes
    /// are undone back to a checkpoint when it fails. A job whose previous lease expired
    /// unsettled (its worker may have died on it) runs alone, after the jobs fetched with it
    /// and with nothing else in flight, so one that crashes the process cannot take other jobs'
    /// attempts with it twice. [`build`](Self::build) refuses a queue that does not share the
    /// store's transactions. A layer given to [`pull`](Self::pull) still fetches for it.
    pub fn grouped<Q>(mut self, queue: Arc<Q>) -> Self
    where
        Q: SettleInTransaction<S> + PullPort + 'static,
        S::Tx: GroupTransaction,
    {
        self.settle = queue.clone();
        self.pull = Some(queue.clone());
        self.groups = Some(Arc::new(GroupsOf(queue)));
        self
    }

    /// Refuses a lease, or a time limit, longer than the transport can hold a delivery: a
    /// job that outlived it would be delivered again while it still runs, and its
    /// settlement refused.
    fn check_lease_limits(&self, limits: LeaseLimits) -> Result<(), WorkerError> {
        if let Some(most) = limits.per_lease
            && self.config.lease > most
        {
            return Err(WorkerError::Config {
                field: "lease".to_owned(),
                value: format!("{:?}", self.config.lease),
                why: format!("this transport sets a lease of at most {most:?}"),
            });
        }
        let Some(most) = limits.per_delivery else {
            return Ok(());
        };
        let limits = std::iter::once(("handler_timeout".to_owned(), self.config.handler_timeout))
            .chain(
                self.timeouts
                    .iter()
                    .map(|(kind, limit)| (format!("the timeout of `{kind}`"), *limit)),
            );
        for (field, limit) in limits {
            if limit > most {
                return Err(WorkerError::Config {
                    field,
                    value: format!("{limit:?}"),
                    why: format!(
                        "this transport holds a delivery at most {most:?}, however it is extended"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The worker, or why it makes no sense.
    pub fn build(self) -> Result<Worker<S>, WorkerError> {
        if let Some(why) = self.invalid_kind {
            return Err(WorkerError::InvalidKind(why));
        }
        if self.handlers.is_empty() {
            return Err(WorkerError::NoHandlers(self.consumer));
        }
        if let Some(kind) = self.duplicate {
            return Err(WorkerError::DuplicateKind(kind));
        }
        self.config.check()?;
        for (kind, limit) in &self.timeouts {
            if limit.is_zero() {
                return Err(WorkerError::Config {
                    field: format!("the timeout of `{kind}`"),
                    value: format!("{limit:?}"),
                    why: "a handler needs some time to run".to_owned(),
                });
            }
        }
        self.check_lease_limits(self.settle.lease_limits())?;
        if let Some(p) = &self.rationale {
            if p.queue() != &self.queue {
                return Err(WorkerError::PolicyForOtherQueue {
                    queue: self.queue,
                    policy: p.queue().clone(),
                });
            }
            tracing::info!(
                queue = %self.queue,
                consumer = %self.consumer,
                policy = %p,
                "retry policy overridden for this queue"
            );
        }
        if let Some(fairness) = self.fairness {
            let refused = |why: String| WorkerError::Config {
                field: "fairness".to_owned(),
                value: fairness.to_string(),
                why,
            };
            let pull = self.layer.as_ref().or(self.pull.as_ref()).ok_or_else(|| {
                refused(
                    "a push transport delivers what it is sent: fairness needs a pull transport"
                        .to_owned(),
                )
            })?;
            pull.share_by_tenant(&self.queue, fairness)
                .map_err(refused)?;
        }
        if let Some(groups) = &self.groups {
            if !(1..=MAX_GROUP_SIZE).contains(&self.config.group_size) {
                return Err(WorkerError::GroupSize(self.config.group_size));
            }
            groups
                .check(&self.store)
                .map_err(|reason| WorkerError::NotInStore {
                    consumer: self.consumer.clone(),
                    reason,
                })?;
        }
        tracing::info!(
            queue = %self.queue,
            consumer = %self.consumer,
            mode = if self.groups.is_some() { "grouped" } else { "per job" },
            fetch = %self.fairness.map_or_else(|| "oldest first".to_owned(), |f| f.to_string()),
            concurrency = self.config.concurrency,
            group_size = self.groups.as_ref().map(|_| self.config.group_size),
            "worker built"
        );
        let group_limit = std::sync::atomic::AtomicUsize::new(self.config.group_size);
        let group_time = match self.fairness {
            Some(_) => self.config.group_time.min(FAIR_GROUP_TIME),
            None => self.config.group_time,
        };
        let metrics = (self.handlers.keys())
            .map(|kind| (kind.clone(), KindMetrics::new(&self.queue, kind)))
            .collect();
        Ok(Worker {
            consumer: self.consumer,
            queue: self.queue,
            settle: self.settle,
            pull: self.layer.or(self.pull),
            store: self.store,
            dead_letters: self.dead_letters,
            metrics,
            handlers: self.handlers,
            timeouts: self.timeouts,
            policy: self.policy,
            clock: self.clock,
            alerts: self.alerts,
            config: self.config,
            groups: self.groups,
            unknown_is_poison: self.unknown_is_poison,
            shutting_down: tokio::sync::watch::Sender::new(false),
            born: tokio::time::Instant::now(),
            turned_ms: std::sync::atomic::AtomicU64::new(0),
            span: std::sync::OnceLock::new(),
            group_limit,
            handler_ns: std::sync::atomic::AtomicU64::new(0),
            undo_ppm: std::sync::atomic::AtomicU64::new(0),
            group_time,
            store_failures: std::sync::atomic::AtomicU32::new(0),
        })
    }
}

/// Consumes one queue as one consumer: idempotent, retrying, dead-lettering.
///
/// For each delivery: decode the envelope (poison → dead letter); open a work transaction and
/// claim `(job_id, consumer)` in `processed_jobs` (already there → ack, skip); run the kind's
/// handler in that transaction; commit, then ack. A handler failure rolls everything back and
/// retries with backoff, or dead-letters when attempts run out or the failure is permanent.
/// The message is acked only after the commit or the dead letter is durable.
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
/// use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
/// use jobs_core::{CorrelationId, Envelope, PublishOptions, QueuePort, SystemClock};
///
/// struct Book;
///
/// #[async_trait]
/// impl Handler<MemoryWorkTx> for Book {
///     type Data = serde_json::Value;
///
///     async fn handle(&self, job: Job<serde_json::Value>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
///         tx.record_effect(job.envelope.data.to_string());
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let queue = MemoryQueue::new(Arc::new(SystemClock));
/// let store = Arc::new(MemoryStore::default());
/// let worker = Worker::builder_on("billing.booker".parse()?, "billing.invoices".parse()?, Arc::new(queue.clone()), store.clone())
///     .handler("billing.invoice_issued".parse()?, Book)
///     .concurrency(4)
///     .build()?;
///
/// let job = Envelope::new(
///     "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?,
///     CorrelationId::generate(),
///     "billing.invoice_issued".parse()?,
///     serde_json::json!({ "invoice": 42 }),
/// );
/// queue.publish(worker.queue(), &job, PublishOptions::default()).await?;
/// // `Arc::new(worker).run(shutdown)` in production; one batch here.
/// assert_eq!(worker.run_once().await?, [Outcome::Processed]);
/// assert_eq!(store.effects(), [r#"{"invoice":42}"#]);
/// # Ok(())
/// # }
/// ```
pub struct Worker<S: WorkStore> {
    pub(crate) consumer: ConsumerName,
    queue: QueueName,
    settle: Arc<dyn SettlePort>,
    /// Where deliveries come from; none for a push transport, whose deliveries arrive through
    /// [`Worker::process`].
    pull: Option<Arc<dyn PullPort>>,
    pub(crate) store: Arc<S>,
    dead_letters: Arc<dyn DeadLetterStore>,
    handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    /// The metric keys of each registered kind, built once: counting a job allocates nothing.
    metrics: HashMap<Kind, KindMetrics>,
    timeouts: HashMap<Kind, Duration>,
    pub(crate) policy: RetryPolicy,
    pub(crate) clock: Arc<dyn Clock>,
    alerts: Option<CoalescingAlerter>,
    pub(crate) config: WorkerConfig,
    groups: Option<Arc<dyn Groups<S>>>,
    /// [`WorkerBuilder::unknown_kinds_are_poison`].
    unknown_is_poison: bool,
    /// Fires every in-flight job's cancellation shortly before a shutdown abandons them.
    shutting_down: tokio::sync::watch::Sender<bool>,
    /// Store failures in a row, for the backoff of [`Worker::store_unavailable`].
    store_failures: std::sync::atomic::AtomicU32,
    /// When the worker was built: the origin of `turned_ms`.
    born: tokio::time::Instant,
    /// When its loop last turned, in milliseconds after `born`; 0 before it first did.
    turned_ms: std::sync::atomic::AtomicU64,
    /// The parent of its jobs' spans ([`Worker::job_span`]), made at the first job.
    span: std::sync::OnceLock<tracing::Span>,
    /// The size of the next groups: `group_size`, or less while groups run out of their
    /// transaction's checkpoints ([`Worker::fit_groups`]).
    group_limit: std::sync::atomic::AtomicUsize,
    /// The handlers' recent mean time, in nanoseconds (0 before the first): the next groups
    /// hold about `group_time` of it.
    handler_ns: std::sync::atomic::AtomicU64,
    /// How often, lately, a grouped job failed after writing, in parts per million (each job
    /// weighs 1/64): how far apart a group of rerunnable jobs takes its checkpoints
    /// ([`Worker::checkpoint_every`]).
    undo_ppm: std::sync::atomic::AtomicU64,
    /// [`WorkerConfig::group_time`], at most [`FAIR_GROUP_TIME`] when the worker is fair.
    group_time: Duration,
}

/// What a [`Worker::run`] left behind when it stopped, for the line a process logs at exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Tasks (jobs; groups, when grouped) still running at shutdown that finished within the
    /// grace.
    pub finished: usize,
    /// Tasks still running when the grace ran out, left unacked for redelivery.
    pub abandoned: usize,
    /// Jobs fetched but not started, given back with their attempt unspent.
    pub given_back: usize,
}

/// How much longer than its own waits a loop may go without turning before
/// [`Worker::stuck`] says it is.
const STUCK_SLACK: Duration = Duration::from_secs(10);

impl<S: WorkStore> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("consumer", &self.consumer)
            .field("queue", &self.queue)
            .field("policy", &self.policy)
            .field("grouped", &self.groups.is_some())
            .finish_non_exhaustive()
    }
}

/// The envelope fields that could be read from a payload, for a dead letter.
#[derive(Default)]
pub(crate) struct Salvage {
    /// Whether the fields come from a valid envelope (then the job id is its identity), rather
    /// than from whatever a broken payload still holds.
    pub(crate) valid: bool,
    pub(crate) job_id: Option<JobId>,
    pub(crate) tenant_id: Option<TenantId>,
    pub(crate) kind: Option<Kind>,
    pub(crate) correlation_id: Option<CorrelationId>,
}

impl Salvage {
    fn of(envelope: &Envelope) -> Self {
        Salvage {
            valid: true,
            job_id: Some(envelope.job_id),
            tenant_id: Some(envelope.tenant_id),
            kind: Some(envelope.kind.clone()),
            correlation_id: Some(envelope.correlation_id),
        }
    }

    /// Whatever valid fields a broken payload still has.
    fn from_bytes(payload: &[u8]) -> Self {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(payload) else {
            return Salvage::default();
        };
        let field = |name: &str| map.get(name).and_then(Value::as_str);
        Salvage {
            valid: false,
            job_id: field("job_id").and_then(|s| s.parse().ok()),
            tenant_id: field("tenant_id").and_then(|s| s.parse().ok()),
            kind: field("kind").and_then(|s| s.parse().ok()),
            correlation_id: field("correlation_id").and_then(|s| s.parse().ok()),
        }
    }
}

impl<S: WorkStore> Worker<S>
where
    S::Tx: Send,
{
    /// Starts building the worker of `consumer` on `queue`, pulling from `transport` and
    /// settling through it.
    pub fn builder(
        consumer: ConsumerName,
        queue: QueueName,
        transport: Arc<dyn ConsumerPort>,
        store: Arc<S>,
        dead_letters: Arc<dyn DeadLetterStore>,
    ) -> WorkerBuilder<S> {
        let mut builder =
            Self::push_builder(consumer, queue, transport.clone(), store, dead_letters);
        builder.pull = Some(transport);
        builder
    }

    /// [`Worker::builder`] for a store that keeps its own dead letters (every store of this
    /// project does): the store is given once.
    pub fn builder_on(
        consumer: ConsumerName,
        queue: QueueName,
        transport: Arc<dyn ConsumerPort>,
        store: Arc<S>,
    ) -> WorkerBuilder<S>
    where
        S: DeadLetterStore,
    {
        Self::builder(consumer, queue, transport, store.clone(), store)
    }

    /// Starts building the worker of `consumer` on `queue` for a push transport, which
    /// delivers each message through [`Worker::process`] and settles it through `settle`.
    /// Such a worker has nothing to pull: [`run`](Self::run) and
    /// [`run_once`](Self::run_once) refuse to start.
    pub fn push_builder(
        consumer: ConsumerName,
        queue: QueueName,
        settle: Arc<dyn SettlePort>,
        store: Arc<S>,
        dead_letters: Arc<dyn DeadLetterStore>,
    ) -> WorkerBuilder<S> {
        WorkerBuilder {
            consumer,
            queue,
            settle,
            pull: None,
            layer: None,
            store,
            dead_letters,
            handlers: HashMap::new(),
            timeouts: HashMap::new(),
            duplicate: None,
            policy: RetryPolicy::default(),
            rationale: None,
            clock: Arc::new(SystemClock),
            alerts: None,
            config: WorkerConfig::default(),
            groups: None,
            unknown_is_poison: false,
            invalid_kind: None,
            fairness: None,
        }
    }

    /// Whether [`Worker::run`] has a transport to pull from (built with
    /// [`Worker::builder`]), rather than deliveries pushed through [`Worker::process`].
    pub fn pulls(&self) -> bool {
        self.pull.is_some()
    }

    /// The queue this worker consumes.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// Receives one batch and processes it, returning the outcomes; empty when nothing was
    /// ready. Tests drain a queue by calling this until it is empty. Per job, the batch is up
    /// to the concurrency; grouped, up to the group size, run as the groups the loop would
    /// make of it, one after another.
    pub async fn run_once(&self) -> Result<Vec<Outcome>, QueueError> {
        let Some(pull) = &self.pull else {
            return Err(QueueError::Rejected {
                queue: self.queue.clone(),
                reason: NOTHING_TO_PULL.to_owned(),
            });
        };
        let outcomes = match &self.groups {
            None => {
                let deliveries = pull
                    .receive(&self.queue, self.config.concurrency, self.config.lease)
                    .await?;
                futures_util::future::join_all(deliveries.into_iter().map(|d| self.process(d)))
                    .await
            }
            Some(groups) => {
                let mut buffer: VecDeque<Delivery> = pull
                    .receive(&self.queue, self.config.group_size, self.config.lease)
                    .await?
                    .into();
                let mut outcomes = Vec::with_capacity(buffer.len());
                while !buffer.is_empty() {
                    let group = next_group(&mut buffer, self.group_limit());
                    outcomes.extend(groups.run(self, group).await);
                }
                outcomes
            }
        };
        if let Some(alerts) = &self.alerts {
            alerts.flush();
        }
        Ok(outcomes)
    }

    /// Runs until `shutdown` completes: receives, processes up to `concurrency` deliveries (or,
    /// grouped, groups) at once, extends leases of long handlers. When the queue is empty it
    /// waits for the transport's wake-up ([`PullPort::wait_for_work`]) or the poll
    /// interval, whichever comes first, so a job published to an idle worker starts without
    /// waiting out the poll. On shutdown it stops receiving, gives back what it fetched but
    /// did not start, lets in-flight jobs finish within the grace period and abandons the rest
    /// unacked (they are delivered again elsewhere).
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()> + Send) -> Drained {
        let Some(pull) = self.pull.clone() else {
            tracing::error!(queue = %self.queue, "{NOTHING_TO_PULL}");
            return Drained::default();
        };
        self.shutting_down.send_replace(false);
        match self.groups.clone() {
            Some(groups) => self.run_grouped(pull, groups, shutdown).await,
            None => self.run_each(pull, shutdown).await,
        }
    }

    /// [`Worker::run`] per job: a work transaction, and settlements through the transport, per
    /// delivery.
    async fn run_each(
        self: Arc<Self>,
        pull: Arc<dyn PullPort>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Drained {
        let permits = Arc::new(Semaphore::new(self.config.concurrency));
        let mut in_flight = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut given_back = 0;
        let mut turn = self.turn_every();
        loop {
            self.turned();
            while let Some(joined) = in_flight.try_join_next() {
                self.reaped(joined);
            }
            let free = permits.available_permits();
            let received = if free == 0 {
                None
            } else {
                let receiving = pull.receive(&self.queue, free, self.config.lease);
                let mut receiving = std::pin::pin!(receiving);
                tokio::select! {
                    () = &mut shutdown => {
                        // A receive is never dropped half-way (its leases could be applied on
                        // the server and lost here): it finishes within the grace, and what it
                        // brought is given back.
                        let grace = self.config.shutdown_grace;
                        if let Ok(Ok(batch)) = tokio::time::timeout(grace, receiving).await {
                            given_back += self.release(batch).await;
                        }
                        break;
                    }
                    r = &mut receiving => Some(r),
                }
            };
            let idle = match received {
                Some(Ok(batch)) if !batch.is_empty() => {
                    for delivery in batch {
                        let Ok(permit) = permits.clone().acquire_owned().await else {
                            break;
                        };
                        let worker = self.clone();
                        in_flight.spawn(async move {
                            worker.process(delivery).await;
                            drop(permit);
                        });
                    }
                    Idle::Busy
                }
                Some(Ok(_)) => Idle::Empty,
                Some(Err(e)) => {
                    tracing::warn!(queue = %self.queue, error = %e, "receive failed; will poll again");
                    Idle::Failed
                }
                None => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        Some(joined) = in_flight.join_next() => self.reaped(joined),
                        // Turns while every slot is busy, for `Worker::stuck`.
                        _ = turn.tick() => {}
                    }
                    Idle::Busy
                }
            };
            if let Some(alerts) = &self.alerts {
                alerts.flush();
            }
            if self.idle(&*pull, idle, &mut shutdown).await.is_break() {
                break;
            }
        }
        Drained {
            given_back,
            ..self.drain(in_flight).await
        }
    }

    /// [`Worker::run`] grouped: up to `concurrency` groups at once, each in its own work
    /// transaction, fed from a local buffer that one fetch at a time keeps a group or two
    /// ahead of them. The fetch runs while the groups do, and asks for as many jobs as there
    /// are free slots plus [`FETCH_AHEAD`] groups, so a fetch slower than the groups brings
    /// more each time.
    async fn run_grouped(
        self: Arc<Self>,
        pull: Arc<dyn PullPort>,
        groups: Arc<dyn Groups<S>>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Drained {
        let permits = Arc::new(Semaphore::new(self.config.concurrency));
        let mut in_flight = JoinSet::new();
        let mut buffer = VecDeque::with_capacity(2 * self.config.group_size);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut fetching: Option<BoxFuture<'static, Result<Vec<Delivery>, QueueError>>> = None;
        // After an empty or failed fetch: the wake-up or the poll before the next.
        let mut waiting: Option<BoxFuture<'static, ()>> = None;
        // A job whose worker may have died on it, waiting to run alone.
        let mut suspect: Option<Delivery> = None;
        // Slow start: one job, then twice as many each fetch. Every fetched job spends an
        // attempt, so a process that a job crashes at once (an abort, an OOM) costs that job
        // an attempt and leaves its neighbours' alone.
        let mut most = 1;
        let mut given_back = 0;
        let mut turn = self.turn_every();
        loop {
            self.turned();
            while let Some(joined) = in_flight.try_join_next() {
                self.reaped(joined);
            }
            if buffer.is_empty()
                && let Some(delivery) = suspect.take()
            {
                // Alone, once every job fetched with it has settled, and with nothing else
                // leased while it runs, so that if it crashes this process too it takes no
                // other job's attempt with it.
                let settled = tokio::select! {
                    () = &mut shutdown => false,
                    () = join_all(&mut in_flight) => true,
                };
                if !settled {
                    buffer.push_back(delivery);
                    break;
                }
                let (worker, groups) = (self.clone(), groups.clone());
                in_flight.spawn(async move {
                    groups.run(&worker, vec![delivery]).await;
                });
                tokio::select! {
                    () = &mut shutdown => break,
                    () = join_all(&mut in_flight) => {}
                }
                most = 1;
                continue;
            }
            let size = self.group_limit();
            if fetching.is_none() && waiting.is_none() && suspect.is_none() && buffer.len() < size {
                let room = (permits.available_permits() + FETCH_AHEAD)
                    .saturating_mul(size)
                    .saturating_sub(buffer.len());
                fetching = Some(self.fetch(&pull, room.min(most)));
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                fetched = async { fetching.as_mut().expect("guarded").await }, if fetching.is_some() => {
                    fetching = None;
                    match fetched {
                        Ok(batch) if batch.is_empty() => waiting = Some(self.wake_or_poll(&pull)),
                        Ok(batch) => {
                            // One suspect a fetch; the others are given back at once, attempt
                            // unspent, so that none of them is leased while it runs.
                            let (suspects, fresh): (Vec<_>, Vec<_>) =
                                batch.into_iter().partition(|d| d.expired);
                            let mut suspects = suspects.into_iter();
                            buffer.extend(fresh);
                            suspect = suspects.next();
                            given_back += self.release(suspects).await;
                            most = most.saturating_mul(2).min(MAX_FETCH);
                        }
                        Err(e) => {
                            tracing::warn!(queue = %self.queue, error = %e, "receive failed; will poll again");
                            let poll = self.config.poll_interval;
                            waiting = Some(Box::pin(tokio::time::sleep(poll)));
                        }
                    }
                    if let Some(alerts) = &self.alerts {
                        alerts.flush();
                    }
                }
                () = async { waiting.as_mut().expect("guarded").await }, if waiting.is_some() => {
                    waiting = None;
                }
                // Turns while every slot is busy, for `Worker::stuck`.
                _ = turn.tick() => {}
                permit = permits.clone().acquire_owned(), if !buffer.is_empty() => {
                    let Ok(permit) = permit else { break };
                    let group = next_group(&mut buffer, self.group_limit());
                    let (worker, groups) = (self.clone(), groups.clone());
                    in_flight.spawn(async move {
                        groups.run(&worker, group).await;
                        drop(permit);
                    });
                }
            }
        }
        // What a fetch under way leases is given back with the rest; a fetch that does not
        // answer within the grace is left (its leases expire).
        if let Some(fetching) = fetching
            && let Ok(Ok(batch)) = tokio::time::timeout(self.config.shutdown_grace, fetching).await
        {
            buffer.extend(batch);
        }
        buffer.extend(suspect);
        // A transport that does not answer keeps the rest; their leases expire.
        let grace = self.config.shutdown_grace;
        match tokio::time::timeout(grace, self.release(buffer)).await {
            Ok(released) => given_back += released,
            Err(_) => {
                tracing::warn!(queue = %self.queue, "could not give back every fetched job within the grace");
            }
        }
        Drained {
            given_back,
            ..self.drain(in_flight).await
        }
    }

    /// One fetch of up to `limit` deliveries, lingering for more (up to a group) when the
    /// configuration says so.
    fn fetch(
        self: &Arc<Self>,
        pull: &Arc<dyn PullPort>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Delivery>, QueueError>> {
        let (worker, pull) = (self.clone(), pull.clone());
        Box::pin(async move {
            let (queue, lease) = (&worker.queue, worker.config.lease);
            let mut batch = pull.receive(queue, limit, lease).await?;
            let missing = worker.config.group_size.saturating_sub(batch.len());
            if !batch.is_empty() && missing > 0 && !worker.config.group_linger.is_zero() {
                tokio::time::sleep(worker.config.group_linger).await;
                match pull.receive(queue, missing, lease).await {
                    Ok(more) => batch.extend(more),
                    Err(e) => tracing::warn!(queue = %queue, error = %e, "receive failed"),
                }
            }
            Ok(batch)
        })
    }

    /// Until the transport's wake-up or the next poll, whichever is first (the poll also
    /// covers delays and retries falling due).
    fn wake_or_poll(self: &Arc<Self>, pull: &Arc<dyn PullPort>) -> BoxFuture<'static, ()> {
        let (worker, pull) = (self.clone(), pull.clone());
        Box::pin(async move {
            tokio::select! {
                () = tokio::time::sleep(worker.config.poll_interval) => {}
                () = pull.wait_for_work(&worker.queue) => {}
            }
        })
    }

    /// Waits as `idle` says: at once when busy, for a wake-up or the poll when the queue was
    /// empty, for the poll when the receive failed. Breaks when shutdown comes first.
    async fn idle(
        &self,
        pull: &dyn PullPort,
        idle: Idle,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> ControlFlow<()> {
        match idle {
            Idle::Busy => {}
            // Nothing ready: until the transport's wake-up or the next poll, whichever is
            // first (the poll also covers delays and retries falling due).
            Idle::Empty => {
                tokio::select! {
                    () = shutdown => return ControlFlow::Break(()),
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                    () = pull.wait_for_work(&self.queue) => {}
                }
            }
            // A failing transport is polled, never woken into a tight loop.
            Idle::Failed => {
                tokio::select! {
                    () = shutdown => return ControlFlow::Break(()),
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// Gives back deliveries fetched but never started, due now and with their attempt
    /// unspent; one that cannot be given back comes back when its lease expires.
    /// Says how many were given back.
    async fn release(&self, deliveries: impl IntoIterator<Item = Delivery>) -> usize {
        let now = self.clock.now();
        let mut released = 0;
        for delivery in deliveries {
            match self.settle.defer(&delivery.lease, now).await {
                Ok(()) => released += 1,
                Err(e) => {
                    tracing::warn!(queue = %self.queue, error = %e, "could not give back a fetched job; it returns after its lease");
                }
            }
        }
        released
    }

    /// One timer for the loop's whole life that wakes it every poll interval, so it turns
    /// (for [`Worker::stuck`]) while every slot is busy; a missed tick is skipped, not made up.
    fn turn_every(&self) -> tokio::time::Interval {
        let mut turn = tokio::time::interval(self.config.poll_interval);
        turn.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        turn
    }

    /// Records that the loop turned.
    fn turned(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.turned_ms
            .store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// How long the worker's loop has not turned, when that is longer than any of its own
    /// waits explains (twice the poll interval, plus the longest time limit, plus 10 s): a
    /// loop stuck on a call that does not return. `None` while it turns, and before
    /// [`Worker::run`] first turned it. A process's health check fails on it.
    pub fn stuck(&self) -> Option<Duration> {
        let turned = self.turned_ms.load(std::sync::atomic::Ordering::Relaxed);
        if turned == 0 {
            return None;
        }
        let since = self
            .born
            .elapsed()
            .saturating_sub(Duration::from_millis(turned));
        let longest = self
            .timeouts
            .values()
            .copied()
            .chain([self.config.handler_timeout])
            .max()
            .unwrap_or_default();
        let allowed = (self.config.poll_interval.saturating_mul(2))
            .saturating_add(longest)
            .saturating_add(STUCK_SLACK);
        (since > allowed).then_some(since)
    }

    /// A finished task of the loop: one that panicked outside the handler's guard (in the
    /// runtime itself, or a transport's call) is logged with its queue and counted in
    /// `jobs_task_panics_total`, not dropped; its jobs come back after their leases.
    fn reaped(&self, joined: Result<(), tokio::task::JoinError>) {
        if let Err(e) = joined
            && e.is_panic()
        {
            metrics::counter!("jobs_task_panics_total", "queue" => self.queue.to_string())
                .increment(1);
            tracing::error!(queue = %self.queue, error = %e, "a worker task panicked; its jobs come back after their leases");
        }
    }

    /// Lets in-flight work finish within the shutdown grace, then abandons it. A quarter of
    /// the grace (at most 5 s) before the end, in-flight jobs' cancellations fire, so that
    /// handlers that heed them stop and are settled.
    async fn drain(&self, mut in_flight: JoinSet<()>) -> Drained {
        let grace = self.config.shutdown_grace;
        let mut finished = 0;
        let notice = (grace / 4).min(SHUTDOWN_NOTICE);
        let drained = tokio::time::timeout(grace, async {
            let deadline = tokio::time::sleep(grace - notice);
            let mut deadline = std::pin::pin!(deadline);
            let mut told = false;
            loop {
                tokio::select! {
                    joined = in_flight.join_next() => match joined {
                        Some(joined) => {
                            self.reaped(joined);
                            finished += 1;
                        }
                        None => break,
                    },
                    () = &mut deadline, if !told => {
                        told = true;
                        self.shutting_down.send_replace(true);
                    }
                }
            }
        })
        .await;
        let abandoned = in_flight.len();
        if drained.is_err() {
            tracing::warn!(
                queue = %self.queue,
                abandoned,
                "shutdown grace elapsed; in-flight jobs left unacked for redelivery"
            );
            in_flight.shutdown().await;
        }
        Drained {
            finished,
            abandoned,
            given_back: 0,
        }
    }

    /// The size of the next group: what fits its transaction's checkpoints, and about
    /// `group_time` of the handlers' recent mean time.
    fn group_limit(&self) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let fits = self.group_limit.load(Relaxed);
        match self.handler_ns.load(Relaxed) {
            0 => fits,
            mean => {
                let in_time = self.group_time.as_nanos() / u128::from(mean);
                fits.min(usize::try_from(in_time).unwrap_or(usize::MAX).max(1))
            }
        }
    }

    /// The most jobs the next group carries: [`WorkerConfig::group_size`], or fewer while
    /// groups run out of their transaction's checkpoints, or while the handlers take long
    /// enough that fewer fill [`WorkerConfig::group_time`].
    pub fn next_group_size(&self) -> usize {
        self.group_limit()
    }

    /// Sizes the next groups after one whose transaction took `taken` of its `budget` of
    /// checkpoints: a group that `ran_out` gave jobs back, so the next ones hold one job more
    /// than the budget (the first job to write needs none); groups that used at most half of
    /// it grow again, twice as large each time, up to `group_size`. A steady stream of jobs
    /// that write settles at the budget's size, one that writes nothing at `group_size`.
    pub(crate) fn fit_groups(&self, taken: usize, budget: usize, ran_out: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let size = self.config.group_size;
        if ran_out {
            let fits = budget.saturating_add(1).min(size);
            self.group_limit.store(fits, Relaxed);
            tracing::debug!(queue = %self.queue, size = fits, "a group ran out of checkpoints; the next groups are smaller");
        } else if taken.saturating_mul(2) <= budget {
            // The checkpoints' limit alone, whatever the handlers' time makes of it.
            let limit = self.group_limit.load(Relaxed);
            self.group_limit
                .store(limit.saturating_mul(2).min(size), Relaxed);
        }
    }

    /// Folds one grouped job into the rate of failures after writing ([`Worker::undo_ppm`]).
    pub(crate) fn count_undo(&self, undone: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let ppm = self.undo_ppm.load(Relaxed);
        let sample = if undone { 1_000_000 } else { 0 };
        self.undo_ppm
            .store(ppm - ppm.div_ceil(64) + sample / 64, Relaxed);
    }

    /// How many jobs that write a group of rerunnable jobs runs between checkpoints: none
    /// while they do not fail after writing. A checkpoint costs about a job's round trip, and a
    /// failure rolls back to the last one and runs again the jobs since (half the interval,
    /// on average), so with a failure rate `p` the interval `sqrt(2 / p)` costs least.
    pub(crate) fn checkpoint_every(&self) -> Option<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        match self.undo_ppm.load(Relaxed) {
            0 => None,
            ppm => {
                let every = (2_000_000 / ppm).isqrt().max(1);
                Some(usize::try_from(every).unwrap_or(usize::MAX))
            }
        }
    }

    /// The span of one delivery's processing, made once with every field: the envelope's as
    /// `salvage` has them (all of a valid envelope's; whatever a broken payload still holds).
    /// Its parent, the worker's span, carries the queue and the consumer, formatted once for
    /// every job rather than once per job; should the worker's span be disabled (made before
    /// a subscriber was installed), each job's span carries them itself. The attempt is on
    /// the events that report a failure, where it matters, rather than formatted for every
    /// job.
    pub(crate) fn job_span(&self, salvage: &Salvage) -> tracing::Span {
        let worker = self.span.get_or_init(
            || tracing::info_span!("worker", queue = %self.queue, consumer = %self.consumer),
        );
        let (job_id, tenant_id, correlation_id, kind) = (
            salvage.job_id.map(field::display),
            salvage.tenant_id.map(field::display),
            salvage.correlation_id.map(field::display),
            salvage.kind.as_ref().map(field::display),
        );
        if worker.is_disabled() {
            return tracing::info_span!(
                "job",
                queue = %self.queue,
                consumer = %self.consumer,
                job_id,
                tenant_id,
                correlation_id,
                kind,
            );
        }
        tracing::info_span!(parent: worker, "job", job_id, tenant_id, correlation_id, kind)
    }

    /// Processes one delivery to the end, settling it with the transport, and says what
    /// happened. Push transports call this with the delivery an HTTP request carries and turn
    /// the outcome into their answer.
    ///
    /// A delivery of another queue than the worker's is refused, unsettled: filed under this
    /// worker's queue, its labels, dead letter and retries would be wrong.
    pub async fn process(&self, delivery: Delivery) -> Outcome {
        if delivery.queue() != &self.queue {
            let error = format!(
                "a delivery of `{}` was given to the worker of `{}`",
                delivery.queue(),
                self.queue
            );
            tracing::error!(queue = %self.queue, "{error}");
            return Outcome::Unsettled { error };
        }
        let triaged = self.triage(&delivery);
        let span = self.job_span(Ready::salvage_of(&triaged));
        let outcome = self
            .process_inner(delivery, triaged)
            .instrument(span.clone())
            .await;
        span.in_scope(|| tracing::debug!(?outcome, "delivery settled"));
        outcome
    }

    /// Decodes the delivery and finds its handler, or says why no handler runs it (poison, an
    /// unknown kind, data that does not fit, an attempt beyond the policy's):
    /// [`Worker::rejected`] decides what becomes of it.
    pub(crate) fn triage(&self, delivery: &Delivery) -> Result<Ready<S::Tx>, Reject> {
        let envelope = match Envelope::decode_with(&delivery.payload, &self.config.decode_limits) {
            Ok(envelope) => envelope,
            Err(e) => {
                return Err(Reject {
                    salvage: Salvage::from_bytes(&delivery.payload),
                    reason: DeadReason::Poison,
                    error: e.to_string(),
                });
            }
        };
        let salvage = Salvage::of(&envelope);
        let kind = envelope.kind.clone();
        let reject = |reason, error| Reject {
            salvage: Salvage::of(&envelope),
            reason,
            error,
        };
        if delivery.attempt > self.policy.max_attempts() {
            let error = format!(
                "delivered for attempt {} beyond the policy's {}",
                delivery.attempt,
                self.policy.max_attempts()
            );
            return Err(reject(DeadReason::Exhausted, error));
        }
        let Some(handler) = self.handlers.get(&kind) else {
            let error = format!(
                "`kind`: no handler registered for `{kind}` in consumer `{}`",
                self.consumer
            );
            let reason = if self.unknown_is_poison {
                DeadReason::Poison
            } else {
                DeadReason::UnknownKind
            };
            return Err(reject(reason, error));
        };
        let job_id = envelope.job_id;
        let (cancel, cancellation) = Canceller::new(&self.shutting_down);
        match handler.prepare(envelope, self.queue.clone(), delivery.attempt, cancellation) {
            Ok(prepared) => Ok(Ready {
                prepared,
                salvage,
                kind,
                job_id,
                rerunnable: handler.rerunnable(),
                cancel,
            }),
            Err(e) => Err(Reject {
                salvage,
                reason: DeadReason::Poison,
                error: e.to_string(),
            }),
        }
    }

    async fn process_inner(
        &self,
        delivery: Delivery,
        triaged: Result<Ready<S::Tx>, Reject>,
    ) -> Outcome {
        let Ready {
            prepared,
            salvage,
            kind,
            job_id,
            cancel,
            ..
        } = match triaged {
            Ok(ready) => ready,
            Err(reject) => return self.rejected(&delivery, reject).await,
        };

        // The lease is kept for the whole work, from the handler's readiness (before any
        // connection is taken) to the commit, not only while the handler runs.
        let work = async {
            let limit = self.time_limit(&kind);
            match ready_bounded(&*prepared, limit, &cancel).await {
                Ok(()) => self.work(prepared, job_id, &kind, &cancel).await,
                Err(error) => Worked::Failed(error),
            }
        };
        let worked = self.with_lease(&delivery, &cancel, work).await;
        let worked = match worked {
            Ok(worked) => worked,
            // The lease went to another worker: nothing of this run may commit or settle.
            Err(_) => {
                return Outcome::Unsettled {
                    error: "the lease was lost while the job ran; it was stopped and rolled back"
                        .to_owned(),
                };
            }
        };
        match worked {
            Worked::Committed => {
                self.count(Counted::Processed, &kind);
                match self.settle.ack(&delivery.lease).await {
                    Ok(()) => Outcome::Processed,
                    // Committed: the redelivery will be skipped as a duplicate.
                    Err(e) => unsettled("ack after commit", &e),
                }
            }
            Worked::Duplicate => {
                self.count(Counted::Duplicate, &kind);
                match self.settle.ack(&delivery.lease).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => unsettled("ack of a duplicate", &e),
                }
            }
            // Whether a failed commit committed is unknown; the redelivery's claim will tell.
            Worked::StoreFailed(e) => self.store_unavailable(&delivery, &e).await,
            Worked::Failed(error) => self.settle_failure(&delivery, salvage, &kind, error).await,
        }
    }

    /// Settles a job its handler failed (nothing of it committed) through the transport, as
    /// `error` says: deferred, retried after the policy's backoff, or dead-lettered.
    pub(crate) async fn settle_failure(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        kind: &Kind,
        error: JobError,
    ) -> Outcome {
        match error {
            JobError::Defer { until } => self.defer(delivery, until).await,
            JobError::Permanent(e) => {
                self.dead_letter(delivery, salvage, DeadReason::Permanent, e.to_string())
                    .await
            }
            JobError::Retry(e) => {
                let retried = || self.count(Counted::Retried, kind);
                self.retry_or_dead_letter(
                    delivery,
                    salvage,
                    e.to_string(),
                    DeadReason::Exhausted,
                    retried,
                )
                .await
            }
        }
    }

    /// Another attempt after the policy's backoff (`retried` counts it), or, with the attempts
    /// spent, the dead letter for `exhausted`.
    async fn retry_or_dead_letter(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        error: String,
        exhausted: DeadReason,
        retried: impl FnOnce(),
    ) -> Outcome {
        match self.policy.after_failure(delivery.attempt) {
            Backoff::RetryIn(delay) => {
                let at = self.clock.now() + delay;
                tracing::warn!(attempt = delivery.attempt, error = %error, retry_in = ?delay, reason = exhausted.as_str(), "job not done; will retry");
                match self.settle.retry_at(&delivery.lease, at).await {
                    Ok(()) => {
                        retried();
                        Outcome::Retrying { at }
                    }
                    Err(e) => unsettled("retry", &e),
                }
            }
            Backoff::Exhausted => self.dead_letter(delivery, salvage, exhausted, error).await,
        }
    }

    /// What becomes of a delivery no handler runs: a job of a kind no handler knows is retried
    /// with the policy's backoff (spending attempts) and dead-lettered once they are spent, so
    /// that a rolling deploy's new kinds wait for their handlers; anything else is
    /// dead-lettered at once.
    pub(crate) async fn rejected(&self, delivery: &Delivery, reject: Reject) -> Outcome {
        let Reject {
            salvage,
            reason,
            error,
        } = reject;
        if reason != DeadReason::UnknownKind {
            return self.dead_letter(delivery, salvage, reason, error).await;
        }
        let retried = || {
            metrics::counter!("jobs_unknown_kind_retried_total", "queue" => self.queue.to_string())
                .increment(1);
        };
        self.retry_or_dead_letter(delivery, salvage, error, DeadReason::UnknownKind, retried)
            .await
    }

    /// One delivery's work transaction, up to its commit or rollback: begin, claim, the
    /// handler within its time limit, commit.
    async fn work(
        &self,
        prepared: Box<dyn Prepared<S::Tx>>,
        job_id: JobId,
        kind: &Kind,
        cancel: &Canceller,
    ) -> Worked {
        let limit = self.time_limit(kind);
        let mut tx = match self.store.begin_within(limit).await {
            Ok(tx) => tx,
            Err(e) => return Worked::StoreFailed(e),
        };
        match tx.claim(job_id, &self.consumer, self.clock.now()).await {
            Ok(Claim::Claimed) => {}
            // Settled before: processed, or dead-lettered (a replay releases the claim).
            Ok(Claim::AlreadyProcessed | Claim::DeadLettered) => {
                rollback(tx).await;
                return Worked::Duplicate;
            }
            // A claim this runtime does not know: not claimed, so not run here.
            Ok(other) => {
                rollback(tx).await;
                return Worked::StoreFailed(StoreError::failed(format!("unknown claim {other:?}")));
            }
            Err(e) => {
                rollback(tx).await;
                return Worked::StoreFailed(e);
            }
        }
        let started = Instant::now();
        let result = run_bounded(prepared, &mut tx, limit, cancel).await;
        self.timed(kind, started);
        match result {
            Ok(()) => match tx.commit().await {
                Ok(()) => {
                    self.store_works();
                    Worked::Committed
                }
                Err(e) => Worked::StoreFailed(e),
            },
            Err(error) => {
                rollback(tx).await;
                Worked::Failed(error)
            }
        }
    }

    /// Runs `work` while extending `delivery`'s lease every third of it. `Err` when an
    /// extension finds the lease lost: `work` is dropped (its transaction rolls back) and the
    /// job's cancellation fires, since nothing it does can be settled any more.
    async fn with_lease<T>(
        &self,
        delivery: &Delivery,
        cancel: &Canceller,
        work: impl Future<Output = T>,
    ) -> Result<T, QueueError> {
        let mut work = std::pin::pin!(work);
        let mut lease = delivery.lease.clone();
        let every = self.config.lease / 3;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return Ok(done),
                () = tokio::time::sleep(every) => {
                    match self.settle.extend(&lease, self.config.lease).await {
                        Ok(extended) => lease = extended,
                        Err(e @ QueueError::LeaseLost { .. }) => {
                            tracing::warn!(error = %e, "lease lost; stopping the job");
                            cancel.cancel();
                            return Err(e);
                        }
                        Err(e) => tracing::warn!(error = %e, "could not extend the lease"),
                    }
                }
            }
        }
    }

    /// How long handlers of `kind` may run.
    pub(crate) fn time_limit(&self, kind: &Kind) -> Duration {
        self.timeouts
            .get(kind)
            .copied()
            .unwrap_or(self.config.handler_timeout)
    }

    /// The dead letter of `delivery`, as the runtime records it.
    pub(crate) fn letter(
        &self,
        delivery: &Delivery,
        salvage: &Salvage,
        error: String,
    ) -> NewDeadLetter {
        NewDeadLetter {
            job_id: salvage.job_id,
            queue: self.queue.clone(),
            consumer: Some(self.consumer.clone()),
            tenant_id: salvage.tenant_id,
            kind: salvage.kind.clone(),
            correlation_id: salvage.correlation_id,
            payload: delivery.payload.clone(),
            attempts: delivery.attempt,
            last_error: error,
            dedup_key: salvage
                .job_id
                .map(|id| id.to_string())
                .or_else(|| delivery.message_id.clone()),
            at: self.clock.now(),
        }
    }

    /// Logs, counts and alerts a dead letter recorded for the first time.
    pub(crate) async fn announce_dead(
        &self,
        kind: Option<&Kind>,
        attempt: u32,
        reason: DeadReason,
        error: &str,
    ) {
        tracing::error!(attempt, reason = reason.as_str(), error = %error, "job dead-lettered");
        // A payload's kind labels the counters only when this worker knows it, so that no
        // producer can make up metric series.
        let known = kind.filter(|kind| self.handlers.contains_key(*kind));
        let labels = vec![
            metrics::Label::new("queue", self.queue.to_string()),
            metrics::Label::new(
                "kind",
                known.map_or_else(|| "unknown".to_owned(), ToString::to_string),
            ),
        ];
        if reason == DeadReason::Poison {
            metrics::counter!("jobs_poison_total", labels.clone()).increment(1);
        }
        let mut labels = labels;
        labels.push(metrics::Label::new("reason", reason.as_str()));
        metrics::counter!("jobs_dead_lettered_total", labels).increment(1);
        if let Some(alerts) = &self.alerts {
            alerts.dead_lettered(&self.queue, error);
        }
    }

    /// Records the dead letter, then acks. A valid envelope is dead-lettered in a work
    /// transaction that claims its job, so the letter and the claim commit together: no copy of the
    /// job can commit its effect as well, and a copy that committed first wins (the delivery is
    /// then a duplicate). Whatever fails, the message stays unacked and comes back.
    pub(crate) async fn dead_letter(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        reason: DeadReason,
        error: String,
    ) -> Outcome {
        let letter = self.letter(delivery, &salvage, error.clone());
        // A broken payload's job id is not trusted to settle anyone's claim.
        let claimable = salvage.job_id.filter(|_| salvage.valid);
        let recorded = match claimable {
            Some(job_id) => self.record_claimed(job_id, letter).await,
            None => self.dead_letters.record(letter).await.map(Some),
        };
        let recorded = match recorded {
            Ok(Some(recorded)) => recorded,
            Ok(None) => {
                // A copy settled the job first.
                return match self.settle.ack(&delivery.lease).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => unsettled("ack of a duplicate", &e),
                };
            }
            Err(e) => {
                tracing::error!(error = %e, "could not record the dead letter; leaving the message unacked");
                return Outcome::Unsettled {
                    error: format!("recording the dead letter failed: {e}"),
                };
            }
        };
        if let Recorded::New(_) = recorded {
            self.announce_dead(salvage.kind.as_ref(), delivery.attempt, reason, &error)
                .await;
        }
        self.ack_dead(delivery, recorded.id(), reason).await
    }

    /// Claims the job and records the letter in one work transaction; `None` when the job was
    /// settled already (processed, or dead-lettered by an earlier delivery).
    async fn record_claimed(
        &self,
        job_id: JobId,
        letter: NewDeadLetter,
    ) -> Result<Option<Recorded>, StoreError> {
        let mut tx = self.store.begin().await?;
        match tx.claim(job_id, &self.consumer, self.clock.now()).await {
            Ok(Claim::Claimed) => {}
            Ok(Claim::AlreadyProcessed) => {
                rollback(tx).await;
                return Ok(None);
            }
            Ok(Claim::DeadLettered) => {
                rollback(tx).await;
                let key = job_id.to_string();
                return Ok(self
                    .dead_letters
                    .pending(&self.queue, &key)
                    .await?
                    .map(Recorded::Existing));
            }
            Ok(other) => {
                rollback(tx).await;
                return Err(StoreError::failed(format!("unknown claim {other:?}")));
            }
            Err(e) => {
                rollback(tx).await;
                return Err(e);
            }
        }
        match tx.record_dead_letter(letter).await {
            Ok(recorded) => {
                tx.commit().await?;
                Ok(Some(recorded))
            }
            Err(e) => {
                rollback(tx).await;
                Err(e)
            }
        }
    }

    async fn ack_dead(&self, delivery: &Delivery, id: DeadLetterId, reason: DeadReason) -> Outcome {
        match self.settle.ack(&delivery.lease).await {
            Ok(()) => Outcome::DeadLettered { id, reason },
            Err(e) => unsettled("ack after dead-lettering", &e),
        }
    }

    /// The store failed: come back later without spending an attempt, so an outage never
    /// exhausts a job's retries (the dead letters live in that store too). The wait grows
    /// with the worker's consecutive store failures, as the retry policy's backoff does; a
    /// failure retrying cannot fix (a missing table) is logged at error level. Both count in
    /// `jobs_store_failures_total{queue, class}`.
    pub(crate) async fn store_unavailable(
        &self,
        delivery: &Delivery,
        error: &StoreError,
    ) -> Outcome {
        let failures = self
            .store_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1);
        let wait = self.policy.ceiling(failures);
        let class = error.class();
        metrics::counter!(
            "jobs_store_failures_total",
            "queue" => self.queue.to_string(),
            "class" => class.to_string(),
        )
        .increment(1);
        if class.is_retryable() {
            tracing::warn!(error = %error, retry_in = ?wait, "store unavailable; deferring the job");
        } else {
            tracing::error!(error = %error, retry_in = ?wait, "the store refuses the work (a missing table, a permission?); deferring the job until it is fixed");
        }
        let until = self.clock.now() + wait;
        self.defer(delivery, until).await
    }

    /// A work transaction committed: the store is back, so the next failure waits the least.
    pub(crate) fn store_works(&self) {
        self.store_failures
            .store(0, std::sync::atomic::Ordering::Relaxed);
    }

    async fn defer(&self, delivery: &Delivery, until: SystemTime) -> Outcome {
        match self.settle.defer(&delivery.lease, until).await {
            Ok(()) => Outcome::Deferred { until },
            Err(e) => unsettled("defer", &e),
        }
    }

    /// Counts one job of `kind` in `counted`'s counter.
    pub(crate) fn count(&self, counted: Counted, kind: &Kind) {
        self.count_n(counted, kind, 1);
    }

    /// Counts `n` jobs of `kind` in `counted`'s counter.
    pub(crate) fn count_n(&self, counted: Counted, kind: &Kind, n: u64) {
        match self.metrics.get(kind) {
            Some(keys) => {
                let key = &keys.counted[counted as usize];
                metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                    .increment(n);
            }
            None => {
                let labels = metric_labels(&self.queue, kind).to_vec();
                metrics::counter!(counted.name(), labels).increment(n);
            }
        }
    }

    /// Records the handler's time for a job of `kind` that started at `started`, and folds it
    /// into the handlers' mean time (each run weighs an eighth) that sizes the groups.
    pub(crate) fn timed(&self, kind: &Kind, started: Instant) {
        use std::sync::atomic::Ordering::Relaxed;
        let elapsed = started.elapsed();
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let mean = folded(self.handler_ns.load(Relaxed), ns);
        self.handler_ns.store(mean, Relaxed);
        let seconds = elapsed.as_secs_f64();
        match self.metrics.get(kind) {
            Some(keys) => {
                let key = &keys.handler_seconds;
                metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
                    .record(seconds);
            }
            None => {
                let labels = metric_labels(&self.queue, kind).to_vec();
                metrics::histogram!("jobs_handler_seconds", labels).record(seconds);
            }
        }
    }
}

/// A mean of the handlers' times with one more, `sample`, weighing an eighth; the first
/// sample when `mean` is 0 (nothing measured). Never 0 itself, so that it stays measured.
fn folded(mean: u64, sample: u64) -> u64 {
    let folded = match mean {
        0 => sample,
        _ => mean - mean / 8 + sample / 8,
    };
    folded.max(1)
}

/// The per-job counters a runtime keeps, by kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// `jobs_processed_total`: jobs whose work committed.
    Processed,
    /// `jobs_duplicate_skipped_total`: deliveries of jobs processed before.
    Duplicate,
    /// `jobs_retried_total`: failed attempts released for another.
    Retried,
}

impl Counted {
    const ALL: [Counted; 3] = [Counted::Processed, Counted::Duplicate, Counted::Retried];

    fn name(self) -> &'static str {
        match self {
            Counted::Processed => "jobs_processed_total",
            Counted::Duplicate => "jobs_duplicate_skipped_total",
            Counted::Retried => "jobs_retried_total",
        }
    }
}

/// Where the runtime's metrics say they come from, as the `metrics` macros would.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// A registered kind's metric keys on its worker's queue.
struct KindMetrics {
    /// By [`Counted`].
    counted: [metrics::Key; 3],
    handler_seconds: metrics::Key,
}

impl KindMetrics {
    fn new(queue: &QueueName, kind: &Kind) -> Self {
        let labels = metric_labels(queue, kind);
        let key = |name: &'static str| metrics::Key::from_parts(name, labels.to_vec());
        KindMetrics {
            counted: Counted::ALL.map(|counted| key(counted.name())),
            handler_seconds: key("jobs_handler_seconds"),
        }
    }
}

/// The `queue` and `kind` labels of a job's metrics, their values shared rather than copied.
fn metric_labels(queue: &QueueName, kind: &Kind) -> [metrics::Label; 2] {
    let shared = |text: &str| metrics::SharedString::from_shared(Arc::<str>::from(text));
    [
        metrics::Label::new("queue", shared(queue.as_str())),
        metrics::Label::new("kind", shared(kind.as_str())),
    ]
}

/// What the loop does after a receive.
enum Idle {
    /// Deliveries were handed out, or a slot freed up: receive again at once.
    Busy,
    /// Nothing was ready: wait for a wake-up or the poll interval.
    Empty,
    /// The receive failed: wait for the poll interval.
    Failed,
}

async fn rollback<T: WorkTransaction>(tx: T) {
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "rollback failed; the transaction is abandoned");
    }
}

fn unsettled(what: &str, error: &QueueError) -> Outcome {
    tracing::warn!(error = %error, "{what} failed; the lease will expire and the message return");
    Outcome::Unsettled {
        error: format!("{what} failed: {error}"),
    }
}

/// A delivery decoded and matched to its handler, ready to run in a work transaction.
pub(crate) struct Ready<Tx: Send> {
    pub(crate) prepared: Box<dyn Prepared<Tx>>,
    pub(crate) salvage: Salvage,
    pub(crate) kind: Kind,
    pub(crate) job_id: JobId,
    /// [`Handler::RERUNNABLE`] of its handler.
    pub(crate) rerunnable: bool,
    /// Fires the job's [`Cancellation`](crate::Cancellation).
    pub(crate) cancel: Canceller,
}

impl<Tx: Send> Ready<Tx> {
    /// The envelope's fields a triage found, whatever it decided.
    pub(crate) fn salvage_of(triaged: &Result<Ready<Tx>, Reject>) -> &Salvage {
        match triaged {
            Ok(ready) => &ready.salvage,
            Err(reject) => &reject.salvage,
        }
    }
}

/// What one delivery's work transaction came to, before the delivery is settled.
enum Worked {
    /// The handler's work committed with the claim.
    Committed,
    /// The job was settled before (processed, or dead-lettered): rolled back.
    Duplicate,
    /// The handler failed: rolled back.
    Failed(JobError),
    /// The store failed (to begin, claim or commit).
    StoreFailed(StoreError),
}

/// A delivery that can only be dead-lettered, and why.
pub(crate) struct Reject {
    pub(crate) salvage: Salvage,
    pub(crate) reason: DeadReason,
    pub(crate) error: String,
}

/// A handler stopped at its time limit.
#[derive(Debug, Error)]
#[error("the handler timed out after {0:?}; its writes were rolled back")]
struct TimedOut(Duration);

/// Runs a prepared job in `tx` within `limit` ([`bounded`]).
pub(crate) async fn run_bounded<Tx: Send>(
    prepared: Box<dyn Prepared<Tx>>,
    tx: &mut Tx,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    bounded(prepared.run(tx), limit, cancel).await
}

/// Waits for a prepared job to be ready ([`Handler::ready`]) within `limit` ([`bounded`]).
pub(crate) async fn ready_bounded<Tx: Send>(
    prepared: &dyn Prepared<Tx>,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    bounded(prepared.ready(), limit, cancel).await
}

/// Handler code within `limit`: past it the future is dropped (it stops at its next
/// `.await`), the job's cancellation fires and the job fails with [`TimedOut`], retryable; a
/// panic becomes a retryable failure that names it.
async fn bounded(
    work: impl Future<Output = Result<(), JobError>>,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    let caught = AssertUnwindSafe(work).catch_unwind();
    match tokio::time::timeout(limit, caught).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            tracing::error!(panic = %message, "handler panicked");
            Err(JobError::retry(format!("handler panicked: {message}")))
        }
        Err(_) => {
            tracing::warn!(timeout = ?limit, "handler timed out");
            cancel.cancel();
            Err(JobError::retry(TimedOut(limit)))
        }
    }
}

/// The next group from the front of `buffer`: a delivery whose previous lease expired
/// unsettled ([`Delivery::expired`]) alone, else the first deliveries up to `size`, stopping
/// before such a one. A job that crashed its process (and so its group) thus runs alone from
/// then on, and cannot take neighbours down with it again.
pub(crate) fn next_group(buffer: &mut VecDeque<Delivery>, size: usize) -> Vec<Delivery> {
    let mut group = Vec::with_capacity(size.min(buffer.len()));
    while let Some(delivery) = buffer.pop_front() {
        let alone = delivery.expired;
        if alone && !group.is_empty() {
            buffer.push_front(delivery);
            break;
        }
        group.push(delivery);
        if alone || group.len() >= size {
            break;
        }
    }
    group
}

/// Waits until every task of `in_flight` has finished.
async fn join_all(in_flight: &mut JoinSet<()>) {
    while in_flight.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliveries numbered by their message ids, `expired` where the flags say.
    fn buffer(expired: &[bool]) -> VecDeque<Delivery> {
        let queue: QueueName = "test.groups".parse().expect("valid");
        (expired.iter().enumerate())
            .map(|(n, &expired)| {
                let lease =
                    jobs_core::Lease::new(queue.clone(), n.to_string(), SystemTime::UNIX_EPOCH);
                Delivery::new(vec![], 1, Some(n.to_string()), lease).after_expiry(expired)
            })
            .collect()
    }

    fn ids(group: &[Delivery]) -> Vec<String> {
        group.iter().filter_map(|d| d.message_id.clone()).collect()
    }

    #[test]
    fn a_group_takes_up_to_its_size_from_the_front() {
        let mut deliveries = buffer(&[false; 5]);
        assert_eq!(ids(&next_group(&mut deliveries, 3)), ["0", "1", "2"]);
        assert_eq!(ids(&next_group(&mut deliveries, 3)), ["3", "4"]);
        assert!(next_group(&mut deliveries, 3).is_empty());
    }

    #[test]
    fn a_delivery_after_an_expired_lease_runs_alone() {
        let mut deliveries = buffer(&[false, false, true, false, true, true]);
        assert_eq!(
            ids(&next_group(&mut deliveries, 8)),
            ["0", "1"],
            "the group stops before it"
        );
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["2"], "alone");
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["3"]);
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["4"]);
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["5"]);
        assert!(deliveries.is_empty());
    }

    /// A worker of `group_size` on the embedded defaults, for what needs one but no job.
    fn worker(group_size: usize) -> Worker<jobs_adapter_memory::MemoryStore> {
        builder(group_size).build().expect("valid")
    }

    fn builder(group_size: usize) -> WorkerBuilder<jobs_adapter_memory::MemoryStore> {
        let clock = Arc::new(jobs_core::SystemClock);
        let queue = Arc::new(jobs_adapter_memory::MemoryQueue::new(clock));
        let store = Arc::new(jobs_adapter_memory::MemoryStore::default());
        let consumer = "test.consumer".parse().expect("valid");
        Worker::builder_on(
            consumer,
            "test.groups".parse().expect("valid"),
            queue,
            store,
        )
        .handler("test.nothing".parse().expect("valid"), Nothing)
        .group_size(group_size)
    }

    #[test]
    fn a_fair_workers_groups_hold_at_most_thirty_milliseconds() {
        let kind: Kind = "test.nothing".parse().expect("valid");
        let fair = builder(64)
            .fair(jobs_core::TenantFairness::round_robin())
            .build()
            .expect("the memory queue shares by tenant");
        fair.timed(&kind, Instant::now() - Duration::from_millis(1));
        let size = fair.next_group_size();
        assert!((29..=30).contains(&size), "30 ms of 1 ms handlers: {size}");
        let tighter = builder(64)
            .fair(jobs_core::TenantFairness::round_robin())
            .group_time(Duration::from_millis(5))
            .build()
            .expect("valid");
        tighter.timed(&kind, Instant::now() - Duration::from_millis(1));
        let size = tighter.next_group_size();
        assert!((4..=5).contains(&size), "its own, tighter bound: {size}");
    }

    struct Nothing;

    #[async_trait::async_trait]
    impl crate::Handler<jobs_adapter_memory::MemoryWorkTx> for Nothing {
        type Data = serde_json::Value;

        async fn handle(
            &self,
            _: crate::Job<serde_json::Value>,
            _: &mut jobs_adapter_memory::MemoryWorkTx,
        ) -> Result<(), crate::JobError> {
            Ok(())
        }
    }

    #[test]
    fn groups_shrink_to_one_more_than_the_budget_and_grow_back_by_doubling() {
        let worker = worker(48);
        assert_eq!(worker.next_group_size(), 48);
        worker.fit_groups(31, 31, true);
        assert_eq!(
            worker.next_group_size(),
            32,
            "ran out: one more than the budget"
        );
        worker.fit_groups(16, 31, false);
        assert_eq!(
            worker.next_group_size(),
            32,
            "more than half the budget: as it is"
        );
        worker.fit_groups(15, 31, false);
        assert_eq!(
            worker.next_group_size(),
            48,
            "at most half: twice, up to group_size"
        );
        worker.fit_groups(3, 7, true);
        assert_eq!(worker.next_group_size(), 8);
        worker.fit_groups(3, 7, false);
        assert_eq!(worker.next_group_size(), 16, "doubled");
        worker.fit_groups(0, usize::MAX, false);
        assert_eq!(worker.next_group_size(), 32);
    }

    #[test]
    fn a_budget_larger_than_the_groups_leaves_them_whole() {
        let worker = worker(8);
        worker.fit_groups(7, 31, true);
        assert_eq!(worker.next_group_size(), 8, "never more than group_size");
        worker.fit_groups(usize::MAX, usize::MAX, false);
        assert_eq!(worker.next_group_size(), 8);
    }

    #[test]
    fn groups_hold_about_group_time_of_the_handlers_mean_time() {
        let worker = worker(48);
        let kind: Kind = "test.nothing".parse().expect("valid");
        assert_eq!(worker.next_group_size(), 48, "nothing measured yet");
        worker.timed(&kind, Instant::now() - Duration::from_millis(1));
        let size = worker.next_group_size();
        assert_eq!(size, 48, "100 ms of 1 ms handlers: more than group_size");
        worker.timed(&kind, Instant::now() - Duration::from_millis(79));
        let size = worker.next_group_size();
        assert!(
            (9..=10).contains(&size),
            "100 ms of about 10 ms handlers: {size}"
        );
        worker.timed(&kind, Instant::now() - Duration::from_millis(2_000));
        assert_eq!(worker.next_group_size(), 1, "a slow handler runs alone");
        for _ in 0..100 {
            worker.timed(&kind, Instant::now());
        }
        assert_eq!(
            worker.next_group_size(),
            48,
            "fast again: as large as they may be"
        );
        worker.fit_groups(31, 31, true);
        assert_eq!(
            worker.next_group_size(),
            32,
            "and no larger than the checkpoints allow"
        );
    }

    #[test]
    fn the_handlers_mean_time_weighs_each_run_an_eighth() {
        assert_eq!(folded(0, 800), 800, "the first run is the mean");
        assert_eq!(folded(800, 1_600), 900);
        assert_eq!(folded(800, 0), 700);
        assert_eq!(folded(0, 0), 1, "measured, however short");
        assert_eq!(folded(1, 0), 1);
        assert_eq!(
            folded(u64::MAX, u64::MAX),
            u64::MAX - u64::MAX / 8 + u64::MAX / 8
        );
    }

    #[test]
    fn slow_handlers_do_not_shrink_what_the_checkpoints_allow() {
        let worker = worker(64);
        let kind: Kind = "test.nothing".parse().expect("valid");
        worker.timed(&kind, Instant::now() - Duration::from_millis(10));
        assert!((9..=10).contains(&worker.next_group_size()));
        worker.fit_groups(31, 31, true);
        worker.fit_groups(0, 31, false);
        for _ in 0..100 {
            worker.timed(&kind, Instant::now());
        }
        assert_eq!(
            worker.next_group_size(),
            64,
            "grown from 32, not from the time's 10"
        );
    }
}

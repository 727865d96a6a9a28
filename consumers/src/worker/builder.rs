//! Building a worker: its constructors, the builder's setters, and the checks that refuse a
//! worker that could not work.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jobs_core::{
    Clock, ConsumerName, ConsumerPort, DeadLetterStore, DecodeLimits, GroupTransaction, JobKind,
    Kind, LeaseLimits, PullPort, QueueName, SettleInTransaction, SettlePort, SystemClock,
    TenantFairness, WorkStore,
};

use super::config::{MAX_GROUP_SIZE, WorkerConfig, WorkerError};
use super::{Mode, Worker};
use crate::alerts::CoalescingAlerter;
use crate::delivery::{Context, Parts};
use crate::grouped::{Grouped, Groups, GroupsOf, Sizing};
use crate::handler::{ErasedHandler, Handler, Typed};
use crate::lifecycle::Heartbeat;
use crate::retry::{QueuePolicy, RetryPolicy};

/// Builds a [`Worker`]: the handlers it runs, its retry policy and its tuning. Made by one of
/// [`Worker`]'s constructors, which say where its deliveries come from.
pub struct WorkerBuilder<S: WorkStore> {
    consumer: ConsumerName,
    queue: QueueName,
    settle: Arc<dyn SettlePort>,
    /// The transport's pull side; none for a push transport.
    pull: Option<Arc<dyn PullPort>>,
    /// A layer given to [`WorkerBuilder::pull`], which replaces the transport's.
    layer: Option<Arc<dyn PullPort>>,
    /// The queue that settles inside the store's transactions, for a grouped worker.
    groups: Option<Arc<dyn Groups<S>>>,
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
    unknown_is_poison: bool,
    /// Why a [`WorkerBuilder::job`] kind was refused.
    invalid_kind: Option<String>,
    fairness: Option<TenantFairness>,
}

impl<S: WorkStore> Worker<S>
where
    S::Tx: Send,
{
    /// Starts building the worker of `consumer` on `queue`, pulling from `transport` and
    /// settling through it, one work transaction per job.
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

    /// Starts building a grouped worker of `consumer` on `queue`, whose `transport` is kept in
    /// the store's own database: several of its jobs run in one work transaction that also
    /// settles them, committing once (up to [`WorkerConfig::group_size`]). Each job still
    /// succeeds or fails alone: its writes are undone back to a checkpoint when it fails. A
    /// job whose previous lease expired unsettled (its worker may have died on it) runs
    /// alone, after the jobs fetched with it and with nothing else in flight, so one that
    /// crashes the process cannot take other jobs' attempts with it twice.
    /// [`build`](WorkerBuilder::build) refuses a transport that does not share the store's
    /// transactions. A layer given to [`pull`](WorkerBuilder::pull) still fetches for it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
    /// use jobs_consumers::{Handler, Job, JobError, Worker};
    ///
    /// struct Book;
    ///
    /// #[async_trait::async_trait]
    /// impl Handler<MemoryWorkTx> for Book {
    ///     type Data = serde_json::Value;
    ///
    ///     async fn handle(&self, job: Job<serde_json::Value>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
    ///         tx.record_effect(job.envelope.data.to_string());
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // In process, the memory queue settles inside the memory store's transactions.
    /// let (queue, store) = (Arc::new(MemoryQueue::default()), Arc::new(MemoryStore::default()));
    /// let worker = Worker::grouped_builder("billing.booker".parse()?, "billing.invoices".parse()?, queue, store)
    ///     .handler("billing.invoice_issued".parse()?, Book)
    ///     .group_size(32)
    ///     .build()?;
    /// # let _ = worker;
    /// # Ok(())
    /// # }
    /// ```
    pub fn grouped_builder<Q>(
        consumer: ConsumerName,
        queue: QueueName,
        transport: Arc<Q>,
        store: Arc<S>,
    ) -> WorkerBuilder<S>
    where
        Q: SettleInTransaction<S> + PullPort + 'static,
        S: DeadLetterStore,
        S::Tx: GroupTransaction,
    {
        let mut builder = Self::builder(consumer, queue, transport.clone(), store.clone(), store);
        builder.groups = Some(Arc::new(GroupsOf(transport)));
        builder
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
            groups: None,
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
            unknown_is_poison: false,
            invalid_kind: None,
            fairness: None,
        }
    }
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

    /// [`WorkerConfig::error_values`].
    pub fn error_values(mut self, on: bool) -> Self {
        self.config.error_values = on;
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

    /// Runs grouped over `queue`, which replaces the transport given to the constructor.
    #[deprecated(
        since = "0.1.0",
        note = "build the worker with `Worker::grouped_builder`, which takes the queue once \
                instead of replacing the transport given to `Worker::builder`"
    )]
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
        let pull = self.layer.or(self.pull);
        if let Some(fairness) = self.fairness {
            let refused = |why: String| WorkerError::Config {
                field: "fairness".to_owned(),
                value: fairness.to_string(),
                why,
            };
            let pull = pull.as_ref().ok_or_else(|| {
                refused(
                    "a push transport delivers what it is sent: fairness needs a pull transport"
                        .to_owned(),
                )
            })?;
            pull.share_by_tenant(&self.queue, fairness)
                .map_err(|e| refused(e.reason))?;
        }
        let config = self.config;
        let mode = match self.groups {
            None => Mode::PerJob,
            Some(groups) => {
                if !(1..=MAX_GROUP_SIZE).contains(&config.group_size) {
                    return Err(WorkerError::GroupSize(config.group_size));
                }
                let sizing = Sizing::new(
                    config.group_size,
                    config.group_time,
                    self.fairness.is_some(),
                );
                let grouped = Grouped::new(groups, sizing, config.group_linger);
                grouped
                    .check(&self.store)
                    .map_err(|e| WorkerError::NotInStore {
                        consumer: self.consumer.clone(),
                        reason: e.reason,
                    })?;
                Mode::Grouped(Arc::new(grouped))
            }
        };
        tracing::info!(
            queue = %self.queue,
            consumer = %self.consumer,
            mode = match mode { Mode::PerJob => "per job", Mode::Grouped(_) => "grouped" },
            fetch = %self.fairness.map_or_else(|| "oldest first".to_owned(), |f| f.to_string()),
            concurrency = config.concurrency,
            group_size = matches!(mode, Mode::Grouped(_)).then_some(config.group_size),
            "worker built"
        );
        let ctx = Context::new(Parts {
            consumer: self.consumer,
            queue: self.queue,
            clock: self.clock,
            policy: self.policy,
            limits: config.limits(self.timeouts),
            store: self.store,
            dead_letters: self.dead_letters,
            settle: self.settle,
            handlers: self.handlers,
            unknown_is_poison: self.unknown_is_poison,
            alerts: self.alerts,
        });
        Ok(Worker {
            ctx: Arc::new(ctx),
            pull,
            mode,
            heartbeat: Heartbeat::new(),
        })
    }
}

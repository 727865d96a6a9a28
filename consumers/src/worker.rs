//! The worker: receive, decode, claim, handle, commit, ack; or retry, defer, dead-letter.

use std::collections::HashMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use jobs_core::{
    Claim, Clock, ConsumerName, ConsumerPort, CorrelationId, DeadLetterId, DeadLetterStore,
    DecodeLimits, Delivery, Envelope, JobId, Kind, NewDeadLetter, QueueError, QueueName, Recorded,
    StoreError, SystemClock, TenantId, WorkStore, WorkTransaction,
};
use serde_json::Value;
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{Instrument, field};

use crate::alerts::CoalescingAlerter;
use crate::handler::{ErasedHandler, Handler, JobError, Typed};
use crate::retry::{Backoff, QueuePolicy, RetryPolicy};

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
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
pub enum DeadReason {
    /// The payload is not a valid envelope, its data does not fit the handler, or no handler
    /// knows its kind. Never retried.
    Poison,
    /// The handler said retrying cannot help.
    Permanent,
    /// Every attempt the policy allows failed.
    Exhausted,
}

impl DeadReason {
    fn as_str(self) -> &'static str {
        match self {
            DeadReason::Poison => "poison",
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
    /// How long a delivery stays leased before another worker may take it; extended while the
    /// handler runs.
    pub lease: Duration,
    /// How long to wait before polling an empty queue again, unless the transport's wake-up
    /// ([`ConsumerPort::wait_for_work`]) comes first. With a transport that notifies, this
    /// bounds only the latency of delays and retries falling due.
    pub poll_interval: Duration,
    /// How long in-flight jobs may finish after shutdown is asked; the rest are left unacked
    /// and come back to another worker.
    pub shutdown_grace: Duration,
    /// Limits applied when decoding payloads.
    pub decode_limits: DecodeLimits,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 8,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            shutdown_grace: Duration::from_secs(30),
            decode_limits: DecodeLimits::default(),
        }
    }
}

/// Builds a [`Worker`].
pub struct WorkerBuilder<S: WorkStore> {
    consumer: ConsumerName,
    queue: QueueName,
    transport: Arc<dyn ConsumerPort>,
    store: Arc<S>,
    dead_letters: Arc<dyn DeadLetterStore>,
    handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    duplicate: Option<Kind>,
    policy: RetryPolicy,
    rationale: Option<QueuePolicy>,
    clock: Arc<dyn Clock>,
    alerts: Option<CoalescingAlerter>,
    config: WorkerConfig,
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

    /// Raises (coalesced) alerts when jobs are dead-lettered.
    pub fn alerts(mut self, alerts: CoalescingAlerter) -> Self {
        self.alerts = Some(alerts);
        self
    }

    /// Replaces the tuning.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// The worker, or why it makes no sense.
    pub fn build(self) -> Result<Worker<S>, WorkerError> {
        if self.handlers.is_empty() {
            return Err(WorkerError::NoHandlers(self.consumer));
        }
        if let Some(kind) = self.duplicate {
            return Err(WorkerError::DuplicateKind(kind));
        }
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
        Ok(Worker {
            consumer: self.consumer,
            queue: self.queue,
            transport: self.transport,
            store: self.store,
            dead_letters: self.dead_letters,
            handlers: self.handlers,
            policy: self.policy,
            clock: self.clock,
            alerts: self.alerts,
            config: self.config,
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
pub struct Worker<S: WorkStore> {
    consumer: ConsumerName,
    queue: QueueName,
    transport: Arc<dyn ConsumerPort>,
    store: Arc<S>,
    dead_letters: Arc<dyn DeadLetterStore>,
    handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    alerts: Option<CoalescingAlerter>,
    config: WorkerConfig,
}

impl<S: WorkStore> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("consumer", &self.consumer)
            .field("queue", &self.queue)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The envelope fields that could be read from a payload, for a dead letter.
#[derive(Default)]
struct Salvage {
    /// Whether the fields come from a valid envelope (then the job id is its identity), rather
    /// than from whatever a broken payload still holds.
    valid: bool,
    job_id: Option<JobId>,
    tenant_id: Option<TenantId>,
    kind: Option<Kind>,
    correlation_id: Option<CorrelationId>,
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
    /// Starts building the worker of `consumer` on `queue`.
    pub fn builder(
        consumer: ConsumerName,
        queue: QueueName,
        transport: Arc<dyn ConsumerPort>,
        store: Arc<S>,
        dead_letters: Arc<dyn DeadLetterStore>,
    ) -> WorkerBuilder<S> {
        WorkerBuilder {
            consumer,
            queue,
            transport,
            store,
            dead_letters,
            handlers: HashMap::new(),
            duplicate: None,
            policy: RetryPolicy::default(),
            rationale: None,
            clock: Arc::new(SystemClock),
            alerts: None,
            config: WorkerConfig::default(),
        }
    }

    /// The queue this worker consumes.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// Receives one batch (up to the concurrency) and processes it, returning the outcomes;
    /// empty when nothing was ready. Tests drain a queue by calling this until it is empty.
    pub async fn run_once(&self) -> Result<Vec<Outcome>, QueueError> {
        let deliveries = self
            .transport
            .receive(&self.queue, self.config.concurrency, self.config.lease)
            .await?;
        let outcomes =
            futures_util::future::join_all(deliveries.into_iter().map(|d| self.process(d))).await;
        if let Some(alerts) = &self.alerts {
            alerts.flush().await;
        }
        Ok(outcomes)
    }

    /// Runs until `shutdown` completes: receives, processes up to `concurrency` deliveries at
    /// once, extends leases of long handlers. When the queue is empty it waits for the
    /// transport's wake-up ([`ConsumerPort::wait_for_work`]) or the poll interval, whichever
    /// comes first, so a job published to an idle worker starts without waiting out the poll.
    /// On shutdown it stops receiving, lets in-flight
    /// jobs finish within the grace period and abandons the rest unacked (they are delivered
    /// again elsewhere).
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()> + Send) {
        let permits = Arc::new(Semaphore::new(self.config.concurrency));
        let mut in_flight = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            while in_flight.try_join_next().is_some() {}
            let free = permits.available_permits();
            let received = if free == 0 {
                None
            } else {
                tokio::select! {
                    () = &mut shutdown => break,
                    r = self.transport.receive(&self.queue, free, self.config.lease) => Some(r),
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
                        _ = in_flight.join_next() => {}
                    }
                    Idle::Busy
                }
            };
            if let Some(alerts) = &self.alerts {
                alerts.flush().await;
            }
            match idle {
                Idle::Busy => {}
                // Nothing ready: until the transport's wake-up or the next poll, whichever is
                // first (the poll also covers delays and retries falling due).
                Idle::Empty => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(self.config.poll_interval) => {}
                        () = self.transport.wait_for_work(&self.queue) => {}
                    }
                }
                // A failing transport is polled, never woken into a tight loop.
                Idle::Failed => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(self.config.poll_interval) => {}
                    }
                }
            }
        }
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                queue = %self.queue,
                abandoned = in_flight.len(),
                "shutdown grace elapsed; in-flight jobs left unacked for redelivery"
            );
            in_flight.shutdown().await;
        }
    }

    /// Processes one delivery to the end, settling it with the transport, and says what
    /// happened. Push transports call this with the delivery an HTTP request carries and turn
    /// the outcome into their answer.
    pub async fn process(&self, delivery: Delivery) -> Outcome {
        let span = tracing::info_span!(
            "job",
            queue = %self.queue,
            consumer = %self.consumer,
            attempt = delivery.attempt,
            job_id = field::Empty,
            tenant_id = field::Empty,
            correlation_id = field::Empty,
            kind = field::Empty,
        );
        let outcome = self
            .process_inner(delivery, &span)
            .instrument(span.clone())
            .await;
        span.in_scope(|| tracing::debug!(?outcome, "delivery settled"));
        outcome
    }

    async fn process_inner(&self, delivery: Delivery, span: &tracing::Span) -> Outcome {
        let envelope = match Envelope::decode_with(&delivery.payload, &self.config.decode_limits) {
            Ok(envelope) => envelope,
            Err(e) => {
                let salvage = Salvage::from_bytes(&delivery.payload);
                return self
                    .dead_letter(&delivery, salvage, DeadReason::Poison, e.to_string())
                    .await;
            }
        };
        span.record("job_id", field::display(envelope.job_id));
        span.record("tenant_id", field::display(envelope.tenant_id));
        span.record("correlation_id", field::display(envelope.correlation_id));
        span.record("kind", field::display(&envelope.kind));
        let salvage = Salvage::of(&envelope);
        let kind = envelope.kind.clone();

        if delivery.attempt > self.policy.max_attempts() {
            let error = format!(
                "delivered for attempt {} beyond the policy's {}",
                delivery.attempt,
                self.policy.max_attempts()
            );
            return self
                .dead_letter(&delivery, salvage, DeadReason::Exhausted, error)
                .await;
        }

        let Some(handler) = self.handlers.get(&kind) else {
            let error = format!(
                "`kind`: no handler registered for `{kind}` in consumer `{}`",
                self.consumer
            );
            return self
                .dead_letter(&delivery, salvage, DeadReason::Poison, error)
                .await;
        };
        let job_id = envelope.job_id;
        let prepared = match handler.prepare(envelope, self.queue.clone(), delivery.attempt) {
            Ok(prepared) => prepared,
            Err(e) => {
                return self
                    .dead_letter(&delivery, salvage, DeadReason::Poison, e.to_string())
                    .await;
            }
        };

        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return self.store_unavailable(&delivery, &e).await,
        };
        match tx.claim(job_id, &self.consumer, self.clock.now()).await {
            Ok(Claim::Claimed) => {}
            // Settled before: processed, or dead-lettered (a replay releases the claim).
            Ok(Claim::AlreadyProcessed | Claim::DeadLettered) => {
                rollback(tx).await;
                metrics::counter!("jobs_duplicate_skipped_total", self.labels(&kind)).increment(1);
                return match self.transport.ack(&delivery.lease).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => unsettled("ack of a duplicate", &e),
                };
            }
            Err(e) => {
                rollback(tx).await;
                return self.store_unavailable(&delivery, &e).await;
            }
        }

        let started = Instant::now();
        let result = self.run_with_lease(prepared, &mut tx, &delivery).await;
        metrics::histogram!("jobs_handler_seconds", self.labels(&kind))
            .record(started.elapsed().as_secs_f64());

        match result {
            Ok(()) => match tx.commit().await {
                Ok(()) => {
                    metrics::counter!("jobs_processed_total", self.labels(&kind)).increment(1);
                    match self.transport.ack(&delivery.lease).await {
                        Ok(()) => Outcome::Processed,
                        // Committed: the redelivery will be skipped as a duplicate.
                        Err(e) => unsettled("ack after commit", &e),
                    }
                }
                // Whether it committed is unknown; the redelivery's claim will tell.
                Err(e) => self.store_unavailable(&delivery, &e).await,
            },
            Err(JobError::Defer { until }) => {
                rollback(tx).await;
                self.defer(&delivery, until).await
            }
            Err(JobError::Permanent(e)) => {
                rollback(tx).await;
                self.dead_letter(&delivery, salvage, DeadReason::Permanent, e.to_string())
                    .await
            }
            Err(JobError::Retry(e)) => {
                rollback(tx).await;
                let error = e.to_string();
                match self.policy.after_failure(delivery.attempt) {
                    Backoff::RetryIn(delay) => {
                        let at = self.clock.now() + delay;
                        tracing::warn!(error = %error, retry_in = ?delay, "job failed; will retry");
                        match self.transport.retry_at(&delivery.lease, at).await {
                            Ok(()) => {
                                metrics::counter!("jobs_retried_total", self.labels(&kind))
                                    .increment(1);
                                Outcome::Retrying { at }
                            }
                            Err(e) => unsettled("retry", &e),
                        }
                    }
                    Backoff::Exhausted => {
                        self.dead_letter(&delivery, salvage, DeadReason::Exhausted, error)
                            .await
                    }
                }
            }
        }
    }

    /// Runs the handler, catching panics (a retryable failure) and extending the lease while
    /// it runs.
    async fn run_with_lease(
        &self,
        prepared: Box<dyn crate::handler::Prepared<S::Tx>>,
        tx: &mut S::Tx,
        delivery: &Delivery,
    ) -> Result<(), JobError> {
        let work = AssertUnwindSafe(prepared.run(tx)).catch_unwind();
        let mut work = std::pin::pin!(work);
        let mut lease = delivery.lease.clone();
        let every = self.config.lease / 3;
        loop {
            tokio::select! {
                result = &mut work => {
                    return result.unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a non-string panic payload".to_owned());
                        tracing::error!(panic = %message, "handler panicked");
                        Err(JobError::retry(format!("handler panicked: {message}")))
                    });
                }
                () = tokio::time::sleep(every) => {
                    match self.transport.extend(&lease, self.config.lease).await {
                        Ok(extended) => lease = extended,
                        Err(e) => tracing::warn!(error = %e, "could not extend the lease"),
                    }
                }
            }
        }
    }

    /// Records the dead letter, then acks. A valid envelope is dead-lettered in a work
    /// transaction that claims its job, so the letter and the claim commit together: no copy of the
    /// job can commit its effect as well, and a copy that committed first wins (the delivery is
    /// then a duplicate). Whatever fails, the message stays unacked and comes back.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        reason: DeadReason,
        error: String,
    ) -> Outcome {
        let kind_label = salvage
            .kind
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), ToString::to_string);
        let dedup_key = salvage
            .job_id
            .map(|id| id.to_string())
            .or_else(|| delivery.message_id.clone());
        let job_id = salvage.job_id;
        // A broken payload's job id is not trusted to settle anyone's claim.
        let claimable = salvage.job_id.filter(|_| salvage.valid);
        let letter = NewDeadLetter {
            job_id,
            queue: self.queue.clone(),
            consumer: Some(self.consumer.clone()),
            tenant_id: salvage.tenant_id,
            kind: salvage.kind,
            correlation_id: salvage.correlation_id,
            payload: delivery.payload.clone(),
            attempts: delivery.attempt,
            last_error: error.clone(),
            dedup_key,
            at: self.clock.now(),
        };
        let recorded = match claimable {
            Some(job_id) => self.record_claimed(job_id, letter).await,
            None => self.dead_letters.record(letter).await.map(Some),
        };
        let recorded = match recorded {
            Ok(Some(recorded)) => recorded,
            Ok(None) => {
                // A copy settled the job first.
                return match self.transport.ack(&delivery.lease).await {
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
            tracing::error!(reason = reason.as_str(), error = %error, "job dead-lettered");
            let labels = vec![
                metrics::Label::new("queue", self.queue.to_string()),
                metrics::Label::new("kind", kind_label),
            ];
            if reason == DeadReason::Poison {
                metrics::counter!("jobs_poison_total", labels.clone()).increment(1);
            }
            let mut labels = labels;
            labels.push(metrics::Label::new("reason", reason.as_str()));
            metrics::counter!("jobs_dead_lettered_total", labels).increment(1);
            if let Some(alerts) = &self.alerts {
                alerts.dead_lettered(&self.queue, &error).await;
            }
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
        match self.transport.ack(&delivery.lease).await {
            Ok(()) => Outcome::DeadLettered { id, reason },
            Err(e) => unsettled("ack after dead-lettering", &e),
        }
    }

    /// The store failed: come back later without spending an attempt, so an outage never
    /// exhausts a job's retries.
    async fn store_unavailable(&self, delivery: &Delivery, error: &StoreError) -> Outcome {
        tracing::warn!(error = %error, "store unavailable; deferring the job");
        let until = self.clock.now() + self.policy.ceiling(1);
        self.defer(delivery, until).await
    }

    async fn defer(&self, delivery: &Delivery, until: SystemTime) -> Outcome {
        match self.transport.defer(&delivery.lease, until).await {
            Ok(()) => Outcome::Deferred { until },
            Err(e) => unsettled("defer", &e),
        }
    }

    fn labels(&self, kind: &Kind) -> Vec<metrics::Label> {
        vec![
            metrics::Label::new("queue", self.queue.to_string()),
            metrics::Label::new("kind", kind.to_string()),
        ]
    }
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

//! The worker: one queue consumed as one consumer, per job or grouped.
//!
//! [`Worker`] is what a module binary builds ([`builder`]) and runs; [`config`] is its tuning
//! and the limits its build checks; [`each`] is the per-job loop. The grouped loop lives in
//! `crate::grouped`, and what both loops do with a delivery in `crate::delivery`.

mod builder;
mod config;
mod each;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jobs_core::{Delivery, PullPort, QueueError, QueueName, WorkStore};

use crate::delivery::Context;
use crate::grouped::Grouped;
use crate::lifecycle::{Drained, Heartbeat, allowed_silence};
use crate::verdict::Outcome;

pub use builder::WorkerBuilder;
pub use config::{MAX_GROUP_SIZE, WorkerConfig, WorkerError};

/// Why a worker built for a push transport does not run a loop.
const NOTHING_TO_PULL: &str = "this worker has nothing to pull (built with \
    Worker::push_builder): its transport delivers through Worker::process";

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
    /// What running and settling a delivery needs, shared with the loop's tasks.
    ctx: Arc<Context<S>>,
    /// Where deliveries come from; none for a push transport, whose deliveries arrive through
    /// [`Worker::process`].
    pull: Option<Arc<dyn PullPort>>,
    mode: Mode<S>,
    /// When the loop last turned, for [`Worker::stuck`].
    heartbeat: Heartbeat,
}

/// How a worker runs its jobs.
enum Mode<S: WorkStore> {
    /// A work transaction, and settlements through the transport, per delivery.
    PerJob,
    /// Several jobs per work transaction, settled in it.
    Grouped(Arc<Grouped<S>>),
}

impl<S: WorkStore> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("consumer", &self.ctx.consumer)
            .field("queue", &self.ctx.queue)
            .field("policy", &self.ctx.policy)
            .field("grouped", &matches!(self.mode, Mode::Grouped(_)))
            .finish_non_exhaustive()
    }
}

impl<S: WorkStore> Worker<S>
where
    S::Tx: Send,
{
    /// Whether [`Worker::run`] has a transport to pull from (built with
    /// [`Worker::builder`]), rather than deliveries pushed through [`Worker::process`].
    pub fn pulls(&self) -> bool {
        self.pull.is_some()
    }

    /// The queue this worker consumes.
    pub fn queue(&self) -> &QueueName {
        &self.ctx.queue
    }

    /// Receives one batch and processes it, returning the outcomes; empty when nothing was
    /// ready. Tests drain a queue by calling this until it is empty. Per job, the batch is up
    /// to the concurrency; grouped, up to the group size, run as the groups the loop would
    /// make of it, one after another.
    pub async fn run_once(&self) -> Result<Vec<Outcome>, QueueError> {
        let Some(pull) = &self.pull else {
            return Err(QueueError::Rejected {
                queue: self.ctx.queue.clone(),
                reason: NOTHING_TO_PULL.to_owned(),
            });
        };
        let ctx = &self.ctx;
        let outcomes = match &self.mode {
            Mode::PerJob => {
                let (queue, limits) = (&ctx.queue, &ctx.limits);
                let deliveries = pull
                    .receive(queue, limits.concurrency, limits.lease)
                    .await?;
                futures_util::future::join_all(deliveries.into_iter().map(|d| ctx.process(d))).await
            }
            Mode::Grouped(grouped) => grouped.run_once(ctx, &**pull).await?,
        };
        ctx.flush_alerts();
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
            tracing::error!(queue = %self.ctx.queue, "{NOTHING_TO_PULL}");
            return Drained::default();
        };
        self.ctx.begin_run();
        match &self.mode {
            Mode::PerJob => each::run(&self.ctx, pull, &self.heartbeat, shutdown).await,
            Mode::Grouped(grouped) => {
                grouped
                    .run(&self.ctx, pull, &self.heartbeat, shutdown)
                    .await
            }
        }
    }

    /// How long the worker's loop has not turned, when that is longer than any of its own
    /// waits explains (twice the poll interval, plus the longest time limit, plus 10 s): a
    /// loop stuck on a call that does not return. `None` while it turns, and before
    /// [`Worker::run`] first turned it. A process's health check fails on it.
    pub fn stuck(&self) -> Option<Duration> {
        self.heartbeat.stuck(allowed_silence(&self.ctx))
    }

    /// Processes one delivery to the end, settling it with the transport, and says what
    /// happened. Push transports call this with the delivery an HTTP request carries and turn
    /// the outcome into their answer.
    ///
    /// A delivery of another queue than the worker's is refused, unsettled: filed under this
    /// worker's queue, its labels, dead letter and retries would be wrong.
    pub async fn process(&self, delivery: Delivery) -> Outcome {
        self.ctx.process(delivery).await
    }
}

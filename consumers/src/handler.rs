//! Handlers: what a job of a kind does, and how it says what should happen next.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{DataError, Envelope, ErrorClass, QueueName};
use serde::de::DeserializeOwned;
use thiserror::Error;
use tokio::sync::watch;

/// A boxed error from handler code.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One job as a handler sees it: the envelope with typed data, and where it stands.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Job<T> {
    /// The job, `data` already deserialised into the handler's type.
    pub envelope: Envelope<T>,
    /// The queue it came from.
    pub queue: QueueName,
    /// 1 on the first attempt.
    pub attempt: u32,
    /// Fires when the runtime stops the job (its time limit passed, its lease was lost) or
    /// the worker is shutting down, so a handler, and tasks it started, can stop early.
    pub cancellation: Cancellation,
}

impl<T> Job<T> {
    /// The job a handler receives for `envelope` on `queue` at `attempt` (1 for the first),
    /// with a cancellation that never fires: for running a handler outside a worker, in its
    /// unit tests. Run it in a store's work transaction as the worker would:
    ///
    /// ```
    /// use async_trait::async_trait;
    /// use jobs_adapter_memory::{MemoryStore, MemoryWorkTx};
    /// use jobs_consumers::{Handler, Job, JobError};
    /// use jobs_core::{CorrelationId, Envelope, WorkStore, WorkTransaction};
    ///
    /// struct Greet;
    ///
    /// #[async_trait]
    /// impl Handler<MemoryWorkTx> for Greet {
    ///     type Data = String;
    ///
    ///     async fn handle(&self, job: Job<String>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
    ///         tx.record_effect(format!("hello {}", job.envelope.data));
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::default();
    /// let envelope = Envelope::new(
    ///     "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?,
    ///     CorrelationId::generate(),
    ///     "greet.person".parse()?,
    ///     "Ada".to_owned(),
    /// );
    /// let mut tx = store.begin().await?;
    /// Greet.handle(Job::new(envelope, "greet".parse()?, 1), &mut tx).await?;
    /// tx.commit().await?;
    /// assert_eq!(store.effects(), ["hello Ada"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(envelope: Envelope<T>, queue: QueueName, attempt: u32) -> Job<T> {
        Job {
            envelope,
            queue,
            attempt,
            cancellation: Cancellation::never(),
        }
    }
}

/// A job's cancellation signal, as its handler sees it: cheap to clone into tasks the handler
/// starts.
///
/// The runtime fires it when the job's time limit passes or its lease is found lost (the
/// handler's future is then dropped: this is for work it started elsewhere), and when the
/// worker shuts down, a quarter of the shutdown grace (at most 5 s) before in-flight jobs are
/// abandoned, so a handler that stops then (returning a retry, say) is settled instead of
/// waiting out its lease.
#[derive(Debug, Clone)]
pub struct Cancellation {
    job: watch::Receiver<bool>,
    run: watch::Receiver<bool>,
    /// Keeps the senders of a cancellation that never fires ([`Job::new`]) alive.
    _never: Option<Arc<(watch::Sender<bool>, watch::Sender<bool>)>>,
}

impl Cancellation {
    /// A signal that never fires, for a job run outside a worker (a handler's unit test).
    pub fn never() -> Cancellation {
        let (job_tx, job) = watch::channel(false);
        let (run_tx, run) = watch::channel(false);
        Cancellation {
            job,
            run,
            _never: Some(Arc::new((job_tx, run_tx))),
        }
    }

    /// Whether it has fired.
    pub fn is_cancelled(&self) -> bool {
        *self.job.borrow() || *self.run.borrow()
    }

    /// Resolves once it has fired, or once the job's run is over and it never can.
    pub async fn cancelled(&self) {
        let (mut job, mut run) = (self.job.clone(), self.run.clone());
        tokio::select! {
            _ = job.wait_for(|fired| *fired) => {}
            _ = run.wait_for(|fired| *fired) => {}
        }
    }
}

/// The runtime's side of one job's [`Cancellation`].
pub(crate) struct Canceller(watch::Sender<bool>);

impl Canceller {
    /// A job's signal, which also fires with `run`'s (the worker's shutdown).
    pub(crate) fn new(run: &watch::Sender<bool>) -> (Canceller, Cancellation) {
        let (tx, job) = watch::channel(false);
        (
            Canceller(tx),
            Cancellation {
                job,
                run: run.subscribe(),
                _never: None,
            },
        )
    }

    pub(crate) fn cancel(&self) {
        self.0.send_replace(true);
    }
}

/// Why a handler did not finish, and so what the runtime does next.
///
/// A typed outcome rather than an error to classify: the runtime never guesses from a message
/// or a downcast whether to retry. Whatever it is, the handler's writes are rolled back.
///
/// ```
/// use jobs_consumers::JobError;
/// use std::time::{Duration, SystemTime};
///
/// fn verdict(status: u16, retry_after: Option<Duration>) -> Result<(), JobError> {
///     match status {
///         200..=299 => Ok(()),
///         // Rate limited: come back then, without spending an attempt.
///         429 => Err(JobError::Defer {
///             until: SystemTime::now() + retry_after.unwrap_or(Duration::from_secs(1)),
///         }),
///         // Transient: again after the retry policy's backoff, until attempts run out.
///         500..=599 => Err(JobError::retry(format!("the provider answered {status}"))),
///         // The provider refuses it and always will: dead-letter it now.
///         _ => Err(JobError::permanent(format!("the provider refused it ({status})"))),
///     }
/// }
/// # assert!(matches!(verdict(503, None), Err(JobError::Retry(_))));
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum JobError {
    /// Transient: try again after the retry policy's backoff, until attempts run out.
    #[error("{0}")]
    Retry(#[source] BoxError),
    /// Trying again cannot help: dead-letter the job now.
    #[error("{0}")]
    Permanent(#[source] BoxError),
    /// Not a failure (rate limited, a provider's 429): come back at `until` without spending
    /// an attempt.
    #[error("deferred until {until:?}")]
    Defer {
        /// When to try again.
        until: SystemTime,
    },
}

impl JobError {
    /// [`JobError::Retry`] from anything error-like (`"text"` included).
    pub fn retry(error: impl Into<BoxError>) -> Self {
        JobError::Retry(error.into())
    }

    /// [`JobError::Permanent`] from anything error-like.
    pub fn permanent(error: impl Into<BoxError>) -> Self {
        JobError::Permanent(error.into())
    }

    /// Retry or permanent, as `class` says: for errors of the ports, which carry a class.
    pub fn classed(class: ErrorClass, error: impl Into<BoxError>) -> Self {
        match class {
            ErrorClass::Retryable => JobError::retry(error),
            ErrorClass::Permanent => JobError::permanent(error),
        }
    }
}

/// What jobs of one kind do, with the store's work transaction `Tx`.
///
/// Writes made through `tx` commit atomically with the job's `processed_jobs` row: exactly
/// once, however often the job is delivered. A handler that needs no transaction can be
/// generic over `Tx`, so it works with every store.
///
/// The trait is declared with the `async-trait` crate (handlers of every kind live in one
/// registry as trait objects), so an implementation carries `#[async_trait]` too. What the
/// handler returns decides what happens next ([`JobError`]):
///
/// ```
/// use async_trait::async_trait;
/// use jobs_adapter_memory::MemoryWorkTx;
/// use jobs_consumers::{Handler, Job, JobError};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Charge {
///     cents: i64,
/// }
///
/// struct ChargeCard;
///
/// #[async_trait]
/// impl Handler<MemoryWorkTx> for ChargeCard {
///     type Data = Charge;
///
///     async fn handle(&self, job: Job<Charge>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
///         if job.envelope.data.cents <= 0 {
///             // Trying again cannot help: straight to the dead letters, for review.
///             return Err(JobError::permanent("a charge must be positive"));
///         }
///         // Committed with the job's processed_jobs row, or not at all.
///         tx.record_effect(format!("charged {}", job.envelope.data.cents));
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler<Tx: Send>: Send + Sync + 'static {
    /// The kind's `data`; a payload that does not deserialise into it is poison.
    type Data: DeserializeOwned + Send + Sync + 'static;

    /// `true` when the handler's only effects are its writes through `tx`: no HTTP call, no
    /// email, no write anywhere else, so running it again after its transaction rolled back
    /// repeats nothing. A grouped worker then runs a group of such jobs without a checkpoint
    /// per job (one round trip fewer for each job that writes), and when one of them fails,
    /// goes back to a sparser checkpoint or rolls the group back, and runs the others since
    /// again. `false` by default: a failing job then never makes a neighbour's handler run
    /// twice.
    const RERUNNABLE: bool = false;

    /// Does the job's work in `tx`.
    async fn handle(&self, job: Job<Self::Data>, tx: &mut Tx) -> Result<(), JobError>;

    /// Waits until the job may run, before its work transaction opens: for waits that must
    /// not hold a connection, a claim or (on SQLite) the write lock, such as taking tokens
    /// from a rate limiter ([`Throttled`](crate::Throttled) does it here). `Ok` lets the job
    /// run; an error settles it as from [`Handler::handle`] (`JobError::Defer` for a wait too
    /// long to spend here). Bounded by the job's time limit like `handle`. Ready at once by
    /// default.
    async fn ready(&self, job: &Job<Self::Data>) -> Result<(), JobError> {
        let _ = job;
        Ok(())
    }
}

/// A job whose data has been decoded, ready to run in a transaction.
#[async_trait]
pub(crate) trait Prepared<Tx: Send>: Send + Sync {
    /// [`Handler::ready`].
    async fn ready(&self) -> Result<(), JobError>;

    async fn run(self: Box<Self>, tx: &mut Tx) -> Result<(), JobError>;
}

/// A handler with its data type erased, so handlers of all kinds fit one registry.
pub(crate) trait ErasedHandler<Tx: Send>: Send + Sync {
    /// [`Handler::RERUNNABLE`].
    fn rerunnable(&self) -> bool;

    fn prepare(
        &self,
        envelope: Envelope,
        queue: QueueName,
        attempt: u32,
        cancellation: Cancellation,
    ) -> Result<Box<dyn Prepared<Tx>>, DataError>;
}

pub(crate) struct Typed<H, Tx> {
    handler: Arc<H>,
    _tx: PhantomData<fn(&mut Tx)>,
}

impl<H, Tx> Typed<H, Tx> {
    pub(crate) fn new(handler: H) -> Self {
        Typed {
            handler: Arc::new(handler),
            _tx: PhantomData,
        }
    }
}

struct TypedJob<H: Handler<Tx>, Tx: Send> {
    handler: Arc<H>,
    job: Job<H::Data>,
}

#[async_trait]
impl<H: Handler<Tx>, Tx: Send> Prepared<Tx> for TypedJob<H, Tx> {
    async fn ready(&self) -> Result<(), JobError> {
        self.handler.ready(&self.job).await
    }

    async fn run(self: Box<Self>, tx: &mut Tx) -> Result<(), JobError> {
        let TypedJob { handler, job } = *self;
        handler.handle(job, tx).await
    }
}

impl<H: Handler<Tx>, Tx: Send + 'static> ErasedHandler<Tx> for Typed<H, Tx> {
    fn rerunnable(&self) -> bool {
        H::RERUNNABLE
    }

    fn prepare(
        &self,
        envelope: Envelope,
        queue: QueueName,
        attempt: u32,
        cancellation: Cancellation,
    ) -> Result<Box<dyn Prepared<Tx>>, DataError> {
        let envelope = envelope.into_typed::<H::Data>()?;
        Ok(Box::new(TypedJob {
            handler: self.handler.clone(),
            job: Job {
                envelope,
                queue,
                attempt,
                cancellation,
            },
        }))
    }
}

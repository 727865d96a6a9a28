//! Rate limits in front of a handler: a denied token defers the job, it never fails it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jobs_core::{Acquired, Bucket, BucketKey, Clock, Envelope, RateLimiter, SystemClock};

use crate::handler::{Handler, Job, JobError};

/// How long a job waits when the limiter itself cannot be reached.
const LIMITER_DOWN_BACKOFF: Duration = Duration::from_secs(5);

/// The most a job waits for its tokens by default ([`Throttled::wait_at_most`]) before its
/// transaction opens; a longer wait defers it through the transport instead. Short enough to
/// stay well inside any lease (at least a second, extended every third of it).
pub const MAX_TOKEN_WAIT: Duration = Duration::from_secs(1);

/// Wraps a handler so that each job first takes a token from every bucket `buckets` names for
/// it (the provider's global bucket and the tenant's, say), all or none.
///
/// The tokens are taken in [`Handler::ready`], after the job is received and before its work
/// transaction opens, so waiting for them holds no connection, claim or write lock. A short
/// wait (up to [`MAX_TOKEN_WAIT`]) is waited there, so a worker paced by its provider does
/// not send every job back through the transport. A longer one defers the job to the moment
/// the tokens will be there, plus a random part of the longest refill interval of its
/// buckets, so that jobs denied together do not all come back at one instant to be denied
/// again. No attempt is spent and it can never be dead-lettered for it. An unreachable limiter
/// defers the job briefly too: sends wait, they are never dropped. A bucket the limiter
/// refuses (`InvalidBucket`, a configuration error waiting cannot fix) fails the job
/// permanently, so it goes to the dead letters for review instead of being deferred forever.
///
/// ```
/// use jobs_consumers::Throttled;
/// use jobs_core::{Bucket, BucketKey};
/// use std::time::{Duration, Instant};
///
/// # fn wrap<H>(handler: H, limiter: std::sync::Arc<dyn jobs_core::RateLimiter>) -> Result<(), jobs_core::RateLimitError> {
/// let resend = Bucket::new(5, 5, Duration::from_secs(1))?; // 5 requests/s per team
/// let tenant = Bucket::new(2, 2, Duration::from_secs(1))?;
/// let throttled = Throttled::new(handler, limiter, move |envelope: &jobs_core::Envelope<serde_json::Value>| {
///     vec![
///         (BucketKey::provider("resend"), resend),
///         (BucketKey::tenant(envelope.tenant_id, "resend"), tenant),
///     ]
/// });
/// # let _ = throttled;
/// # Ok(())
/// # }
/// ```
pub struct Throttled<H, F> {
    inner: H,
    limiter: Arc<dyn RateLimiter>,
    buckets: F,
    clock: Arc<dyn Clock>,
    most_wait: Duration,
}

impl<H, F> Throttled<H, F> {
    /// `inner` behind the buckets `buckets` chooses for each job.
    pub fn new(inner: H, limiter: Arc<dyn RateLimiter>, buckets: F) -> Self {
        Throttled {
            inner,
            limiter,
            buckets,
            clock: Arc::new(SystemClock),
            most_wait: MAX_TOKEN_WAIT,
        }
    }

    /// Waits for tokens at most `wait` in all (instead of [`MAX_TOKEN_WAIT`]) before deferring
    /// the job through the transport; zero defers every denied job at once.
    pub fn wait_at_most(mut self, wait: Duration) -> Self {
        self.most_wait = wait.min(MAX_TOKEN_WAIT);
        self
    }

    /// Takes time from `clock` (for the brief wait when the limiter is down).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

#[async_trait]
impl<Tx, H, F> Handler<Tx> for Throttled<H, F>
where
    Tx: Send,
    H: Handler<Tx>,
    F: Fn(&Envelope<H::Data>) -> Vec<(BucketKey, Bucket)> + Send + Sync + 'static,
{
    type Data = H::Data;
    const RERUNNABLE: bool = H::RERUNNABLE;

    async fn ready(&self, job: &Job<H::Data>) -> Result<(), JobError> {
        let buckets = (self.buckets)(&job.envelope);
        let waited_enough = Instant::now() + self.most_wait;
        loop {
            match self.limiter.acquire(&buckets, 1).await {
                Ok(Acquired::Granted) => return self.inner.ready(job).await,
                Ok(Acquired::Denied { retry_at }) => {
                    let wait = retry_at
                        .duration_since(self.clock.now())
                        .unwrap_or_default()
                        // Never a busy loop, whatever the limiter answers.
                        .max(Duration::from_millis(1));
                    if Instant::now() + wait <= waited_enough {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    let refill = buckets
                        .iter()
                        .map(|(_, bucket)| bucket.interval())
                        .max()
                        .unwrap_or_default();
                    let spread = refill.mul_f64(crate::retry::random_unit());
                    return Err(JobError::Defer {
                        until: retry_at.checked_add(spread).unwrap_or(retry_at),
                    });
                }
                Err(e) if !e.class().is_retryable() => {
                    tracing::error!(error = %e, "the rate limiter refuses the job's buckets");
                    return Err(JobError::permanent(e));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rate limiter unavailable; deferring the job");
                    return Err(JobError::Defer {
                        until: self.clock.now() + LIMITER_DOWN_BACKOFF,
                    });
                }
            }
        }
    }

    async fn handle(&self, job: Job<H::Data>, tx: &mut Tx) -> Result<(), JobError> {
        self.inner.handle(job, tx).await
    }
}

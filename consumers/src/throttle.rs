//! Rate limits in front of a handler: a denied token defers the job, it never fails it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jobs_core::{Acquired, Bucket, BucketKey, Clock, Envelope, RateLimiter, SystemClock};

use crate::handler::{Handler, Job, JobError};

/// How long a job waits when the limiter itself cannot be reached.
const LIMITER_DOWN_BACKOFF: Duration = Duration::from_secs(5);

/// Wraps a handler so that each job first takes a token from every bucket `buckets` names for
/// it (the provider's global bucket and the tenant's, say), all or none.
///
/// Denied, the job is deferred to the moment the tokens will be there, plus a random part of
/// the longest refill interval of its buckets, so that jobs denied together do not all come
/// back at one instant to be denied again: no attempt is spent and it can never be
/// dead-lettered for it. An unreachable limiter defers the job briefly too: sends wait, they
/// are never dropped. A bucket the limiter refuses (`InvalidBucket`, a configuration error
/// waiting cannot fix) fails the job permanently, so it goes to the dead letters for review
/// instead of being deferred forever.
///
/// ```
/// use jobs_consumers::Throttled;
/// use jobs_core::{Bucket, BucketKey};
/// use std::time::Duration;
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
}

impl<H, F> Throttled<H, F> {
    /// `inner` behind the buckets `buckets` chooses for each job.
    pub fn new(inner: H, limiter: Arc<dyn RateLimiter>, buckets: F) -> Self {
        Throttled {
            inner,
            limiter,
            buckets,
            clock: Arc::new(SystemClock),
        }
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
    H::Data: Sync,
    F: Fn(&Envelope<H::Data>) -> Vec<(BucketKey, Bucket)> + Send + Sync + 'static,
{
    type Data = H::Data;

    async fn handle(&self, job: Job<H::Data>, tx: &mut Tx) -> Result<(), JobError> {
        let buckets = (self.buckets)(&job.envelope);
        match self.limiter.acquire(&buckets, 1).await {
            Ok(Acquired::Granted) => self.inner.handle(job, tx).await,
            Ok(Acquired::Denied { retry_at }) => {
                let refill = buckets
                    .iter()
                    .map(|(_, bucket)| bucket.interval)
                    .max()
                    .unwrap_or_default();
                let spread = refill.mul_f64(crate::retry::random_unit());
                Err(JobError::Defer {
                    until: retry_at.checked_add(spread).unwrap_or(retry_at),
                })
            }
            Err(e) if !e.class().is_retryable() => {
                tracing::error!(error = %e, "the rate limiter refuses the job's buckets");
                Err(JobError::permanent(e))
            }
            Err(e) => {
                tracing::warn!(error = %e, "rate limiter unavailable; deferring the job");
                Err(JobError::Defer {
                    until: self.clock.now() + LIMITER_DOWN_BACKOFF,
                })
            }
        }
    }
}

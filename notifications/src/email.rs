//! Email on the rails: blasts split into chunk jobs, each chunk sent as one provider batch.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_core::{
    Bucket, BucketKey, Clock, CorrelationId, Email, EmailError, EmailProvider, Envelope, JobId,
    Kind, PublishOptions, QueueError, QueueName, QueuePort, RateLimiter, SystemClock, TenantId,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The kind of a chunk job: its data is an [`EmailChunk`].
pub const SEND_EMAIL_KIND: &str = "notif.email.send";

/// How long a 429 without `Retry-After` (or reset headers) holds the provider back.
pub const DEFAULT_RATE_LIMIT_BACKOFF: Duration = Duration::from_secs(1);

/// One chunk of a blast (or a single transactional email): the data of one job, sent as one
/// provider batch.
///
/// Its idempotency key is a function of the blast's job id and the chunk's index only, so
/// every retry of the chunk presents the same key and the provider answers a chunk it already
/// accepted without sending it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailChunk {
    /// The job id of the blast this chunk belongs to.
    pub blast: JobId,
    /// The chunk's position in the blast, from 0.
    pub index: u32,
    /// The emails, at most the provider's batch size.
    pub emails: Vec<Email>,
}

impl EmailChunk {
    /// `{blast}-{index}`: stable across retries and republishing, distinct between chunks.
    pub fn idempotency_key(&self) -> String {
        format!("{}-{}", self.blast, self.index)
    }
}

/// Splits `emails` into chunks of at most `max_batch` (at least 1), in order, indexed from 0.
///
/// ```
/// use jobs_core::{Email, JobId};
/// use jobs_notifications::chunk_emails;
///
/// let blast = JobId::generate();
/// let chunks = chunk_emails(blast, vec![Email::new("a@acme.test", vec!["b@acme.test".into()], "Hi"); 250], 100);
/// assert_eq!(chunks.iter().map(|c| c.emails.len()).collect::<Vec<_>>(), [100, 100, 50]);
/// assert_eq!(chunks[2].idempotency_key(), format!("{blast}-2"));
/// ```
pub fn chunk_emails(blast: JobId, emails: Vec<Email>, max_batch: usize) -> Vec<EmailChunk> {
    let max_batch = max_batch.max(1);
    let mut chunks = Vec::with_capacity(emails.len().div_ceil(max_batch));
    let mut rest = emails.into_iter().peekable();
    let mut index = 0u32;
    while rest.peek().is_some() {
        chunks.push(EmailChunk {
            blast,
            index,
            emails: rest.by_ref().take(max_batch).collect(),
        });
        index += 1;
    }
    chunks
}

/// Who a blast is from and where its chunks go.
#[derive(Debug, Clone)]
pub struct Blast {
    /// The blast's own id: chunk keys derive from it. Reuse it to republish safely.
    pub id: JobId,
    /// The tenant sending.
    pub tenant: TenantId,
    /// The request or workflow the blast belongs to.
    pub correlation: CorrelationId,
    /// The rail's queue, e.g. [`marketing`](crate::marketing)`("email")`.
    pub queue: QueueName,
}

/// Publishes `emails` as chunk jobs of kind [`SEND_EMAIL_KIND`] on `blast.queue`, one job per
/// chunk of at most `max_batch` (the provider's [`EmailProvider::max_batch`]), each deduplicated
/// by its idempotency key, so publishing the same blast twice queues each chunk once (within
/// the transport's window). Returns the chunk jobs' ids.
///
/// A failed chunk then retries alone, and a transactional email is a blast of one.
///
/// ```no_run
/// use jobs_core::{Email, JobId, QueueName, QueuePort};
/// use jobs_notifications::{Blast, publish_emails};
///
/// # async fn example(queue: &dyn QueuePort, tenant: jobs_core::TenantId, correlation: jobs_core::CorrelationId, recipients: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
/// let blast = Blast {
///     id: JobId::generate(), // keep it to republish the same blast safely
///     tenant,
///     correlation,
///     queue: jobs_notifications::marketing("email")?,
/// };
/// let emails = recipients
///     .into_iter()
///     .map(|to| Email::new("Acme <news@acme.test>", vec![to], "Winter sale"))
///     .collect();
/// let jobs = publish_emails(queue, &blast, emails, 100).await?; // Resend: 100 per batch
/// # let _ = jobs;
/// # Ok(())
/// # }
/// ```
pub async fn publish_emails(
    queue: &dyn QueuePort,
    blast: &Blast,
    emails: Vec<Email>,
    max_batch: usize,
) -> Result<Vec<JobId>, QueueError> {
    let kind: Kind = SEND_EMAIL_KIND
        .parse()
        .unwrap_or_else(|_| unreachable!("a valid kind"));
    let mut ids = Vec::new();
    for chunk in chunk_emails(blast.id, emails, max_batch) {
        let key = chunk.idempotency_key();
        let data = serde_json::to_value(&chunk)?;
        let envelope = Envelope::new(blast.tenant, blast.correlation, kind.clone(), data);
        queue
            .publish(
                &blast.queue,
                &envelope,
                PublishOptions::default().dedup_key(key),
            )
            .await?;
        ids.push(envelope.job_id);
    }
    Ok(ids)
}

/// A provider's rate limits: its global bucket, shared by every tenant and worker, and each
/// tenant's own bucket for it (fair use). One token per batch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderLimits {
    /// The provider's name in bucket keys, e.g. `resend`.
    pub provider: String,
    /// The provider's bucket (Resend: 5 requests/s per team).
    pub provider_bucket: Bucket,
    /// Each tenant's bucket.
    pub tenant_bucket: Bucket,
}

impl ProviderLimits {
    /// Limits for `provider`.
    pub fn new(
        provider: impl Into<String>,
        provider_bucket: Bucket,
        tenant_bucket: Bucket,
    ) -> Self {
        ProviderLimits {
            provider: provider.into(),
            provider_bucket,
            tenant_bucket,
        }
    }

    /// The provider's global bucket key.
    pub fn provider_key(&self) -> BucketKey {
        BucketKey::provider(&self.provider)
    }

    /// The buckets one send of `tenant` takes a token from, provider first: both or neither
    /// ([`RateLimiter::acquire`]).
    pub fn buckets(&self, tenant: TenantId) -> Vec<(BucketKey, Bucket)> {
        vec![
            (self.provider_key(), self.provider_bucket),
            (
                BucketKey::tenant(tenant, &self.provider),
                self.tenant_bucket,
            ),
        ]
    }
}

/// Why a chunk was not sent, and so what the job does next: a typed verdict that a worker maps
/// one to one onto its own (defer, retry, dead-letter), never by reading messages.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SendError {
    /// The provider is rate limiting: come back at `until`. Not a failed attempt; never
    /// dropped, never dead-lettered for it.
    #[error("deferred until {until:?}: {cause}")]
    Deferred {
        /// When the provider said to come back (its bucket is drained until then).
        until: SystemTime,
        /// The provider's answer.
        #[source]
        cause: EmailError,
    },
    /// A transient failure (5xx, timeout, connection): retry with backoff, spending an attempt.
    #[error("{0}")]
    Retryable(#[source] EmailError),
    /// The provider refused the chunk and will again (4xx validation, credentials): dead-letter
    /// it with the provider's message.
    #[error("{0}")]
    Permanent(#[source] EmailError),
}

/// Sends chunk jobs through an [`EmailProvider`] with the provider-agnostic rules of the
/// standard: the chunk's idempotency key on every try, and a provider's 429 turned into a
/// deferral that also drains the provider's bucket until the provider's retry time, so every
/// worker of every process backs off, not only the one that was told.
///
/// Taking the tokens is the caller's step before [`EmailSender::send`]: run it behind the
/// limiter with [`ProviderLimits::buckets`] (in a worker, the consumers' `Throttled` layer,
/// which defers a denied job without spending an attempt).
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use jobs_core::{Bucket, EmailProvider, RateLimiter};
/// use jobs_notifications::{EmailChunk, EmailSender, ProviderLimits, SendError};
///
/// # async fn example(provider: Arc<dyn EmailProvider>, limiter: Arc<dyn RateLimiter>, chunk: EmailChunk) -> Result<(), Box<dyn std::error::Error>> {
/// let limits = ProviderLimits::new(
///     "resend",
///     Bucket::new(5, 5, Duration::from_secs(1))?, // 5 requests/s per team
///     Bucket::new(2, 2, Duration::from_secs(1))?, // per tenant
/// );
/// let sender = EmailSender::new(provider, limiter, limits);
/// match sender.send(&chunk).await {
///     Ok(ids) => println!("sent as {ids:?}"),
///     Err(SendError::Deferred { until, .. }) => println!("come back at {until:?}"),
///     Err(e) => return Err(e.into()),
/// }
/// # Ok(())
/// # }
/// ```
pub struct EmailSender {
    provider: Arc<dyn EmailProvider>,
    limiter: Arc<dyn RateLimiter>,
    limits: ProviderLimits,
    clock: Arc<dyn Clock>,
    fallback: Duration,
}

impl EmailSender {
    /// A sender through `provider`, draining `limits`' provider bucket in `limiter` on a 429.
    pub fn new(
        provider: Arc<dyn EmailProvider>,
        limiter: Arc<dyn RateLimiter>,
        limits: ProviderLimits,
    ) -> Self {
        EmailSender {
            provider,
            limiter,
            limits,
            clock: Arc::new(SystemClock),
            fallback: DEFAULT_RATE_LIMIT_BACKOFF,
        }
    }

    /// Takes time from `clock` (to turn a `Retry-After` into an instant).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long a 429 that names no retry time holds back (default
    /// [`DEFAULT_RATE_LIMIT_BACKOFF`]).
    pub fn rate_limit_backoff(mut self, backoff: Duration) -> Self {
        self.fallback = backoff;
        self
    }

    /// The limits this sender drains on a 429, and whose buckets a send should take tokens from.
    pub fn limits(&self) -> &ProviderLimits {
        &self.limits
    }

    /// The most emails one chunk may hold.
    pub fn max_batch(&self) -> usize {
        self.provider.max_batch()
    }

    /// Sends `chunk` as one batch with its idempotency key; returns the provider's ids in order.
    pub async fn send(&self, chunk: &EmailChunk) -> Result<Vec<String>, SendError> {
        let max = self.provider.max_batch();
        if chunk.emails.is_empty() || chunk.emails.len() > max {
            return Err(SendError::Permanent(EmailError::Rejected {
                status: 0,
                message: format!(
                    "a chunk holds {} emails; the provider takes 1 to {max} per batch \
                     (nothing was sent)",
                    chunk.emails.len()
                ),
            }));
        }
        let error = match self
            .provider
            .send_batch(&chunk.emails, &chunk.idempotency_key())
            .await
        {
            Ok(ids) => return Ok(ids),
            Err(error) => error,
        };
        match error {
            EmailError::RateLimited { retry_after } => {
                let until = self.clock.now() + retry_after.unwrap_or(self.fallback);
                let key = self.limits.provider_key();
                if let Err(e) = self
                    .limiter
                    .drain_until(&key, self.limits.provider_bucket, until)
                    .await
                {
                    // The job still waits; other workers will meet the 429 themselves.
                    tracing::warn!(error = %e, bucket = %key, "could not drain the provider bucket");
                }
                Err(SendError::Deferred {
                    until,
                    cause: error,
                })
            }
            other => Err(match other.class() {
                jobs_core::ErrorClass::Permanent => SendError::Permanent(other),
                jobs_core::ErrorClass::Retryable => SendError::Retryable(other),
            }),
        }
    }
}

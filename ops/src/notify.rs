//! The email sender composed for the worker runtime: `jobs-notifications`' provider-agnostic
//! [`EmailSender`] behind `jobs-consumers`' [`Throttled`] layer. The two crates may not know
//! each other (ADR 0001), so a composition root joins them; a downstream binary calls or
//! copies [`email_handler`].

use std::sync::Arc;

use async_trait::async_trait;
use jobs_consumers::{Handler, Job, JobError, Throttled};
use jobs_core::{Bucket, BucketKey, Clock, Envelope, RateLimiter};
use jobs_notifications::{EmailChunk, EmailSender, SendError};

/// The handler of [`jobs_notifications::SEND_EMAIL_KIND`] jobs: sends the chunk and maps the
/// sender's verdict onto the runtime's: a 429 defers without spending an attempt, a transient
/// failure retries, a refusal dead-letters the chunk with the provider's message.
///
/// Takes no tokens itself: use [`email_handler`], which puts it behind the limiter.
pub struct SendEmails {
    sender: Arc<EmailSender>,
}

impl SendEmails {
    /// Sends through `sender`.
    pub fn new(sender: Arc<EmailSender>) -> Self {
        SendEmails { sender }
    }
}

#[async_trait]
impl<Tx: Send + 'static> Handler<Tx> for SendEmails {
    type Data = EmailChunk;

    async fn handle(&self, job: Job<EmailChunk>, _tx: &mut Tx) -> Result<(), JobError> {
        match self.sender.send(&job.envelope.data).await {
            Ok(_ids) => Ok(()),
            Err(SendError::Deferred { until, cause }) => {
                tracing::info!(%cause, job = %job.envelope.job_id, "provider rate limit; deferring the chunk");
                Err(JobError::Defer { until })
            }
            Err(SendError::Retryable(e)) => Err(JobError::retry(e)),
            Err(e) => Err(JobError::permanent(e)),
        }
    }
}

/// The buckets a chunk job takes a token from: its provider's and its tenant's.
pub type ChunkBuckets =
    Box<dyn Fn(&Envelope<EmailChunk>) -> Vec<(BucketKey, Bucket)> + Send + Sync>;

/// The email handler for a worker: one token from the provider's bucket and one from the
/// job's tenant's bucket (both or neither; denied, the job is deferred to when they will be
/// there, no attempt spent), then [`SendEmails`].
///
/// ```no_run
/// # fn wire(provider: std::sync::Arc<dyn jobs_core::EmailProvider>, limiter: std::sync::Arc<dyn jobs_core::RateLimiter>) -> Result<(), jobs_core::RateLimitError> {
/// use std::{sync::Arc, time::Duration};
/// use jobs_core::Bucket;
/// use jobs_notifications::{EmailSender, ProviderLimits};
///
/// let limits = ProviderLimits::new(
///     "resend",
///     Bucket::new(5, 5, Duration::from_secs(1))?, // Resend: 5 requests/s per team
///     Bucket::new(2, 2, Duration::from_secs(1))?, // fair use per tenant
/// );
/// let sender = Arc::new(EmailSender::new(provider, limiter.clone(), limits));
/// let handler = jobs_ops::notify::email_handler(sender, limiter, Arc::new(jobs_core::SystemClock));
/// // Worker::builder(…).handler(jobs_notifications::SEND_EMAIL_KIND.parse()?, handler)
/// # let _ = handler;
/// # Ok(())
/// # }
/// ```
pub fn email_handler(
    sender: Arc<EmailSender>,
    limiter: Arc<dyn RateLimiter>,
    clock: Arc<dyn Clock>,
) -> Throttled<SendEmails, ChunkBuckets> {
    let limits = sender.limits().clone();
    let buckets: ChunkBuckets = Box::new(move |envelope| limits.buckets(envelope.tenant_id));
    Throttled::new(SendEmails::new(sender), limiter, buckets).clock(clock)
}

#[cfg(all(test, feature = "resend"))]
mod tests {
    //! The sender through the real worker runtime, the Resend adapter and the Resend fake, on
    //! the in-memory queue, store and limiter sharing one manual clock.

    use std::sync::Arc;
    use std::time::Duration;

    use jobs_adapter_memory::{MemoryQueue, MemoryRateLimiter, MemoryStore};
    use jobs_adapter_resend::{ResendConfig, ResendProvider};
    use jobs_consumers::{DeadReason, Outcome, RetryPolicy, Worker};
    use jobs_core::{
        Acquired, Bucket, Clock, ConsumerName, DeadLetterFilter, DeadLetterStore, Email, JobId,
        ManualClock, QueueDepth, QueueName, RateLimiter, TenantId,
    };
    use jobs_notifications::{Blast, EmailSender, ProviderLimits, SEND_EMAIL_KIND, publish_emails};
    use jobs_testkit::fakes::resend::FakeResend;

    struct Rig {
        clock: Arc<ManualClock>,
        queue: MemoryQueue,
        store: MemoryStore,
        limiter: Arc<MemoryRateLimiter>,
        limits: ProviderLimits,
        fake: FakeResend,
        worker: Worker<MemoryStore>,
        marketing: QueueName,
    }

    fn tenant(n: u8) -> TenantId {
        format!("00000000-0000-4000-8000-0000000000{n:02}")
            .parse()
            .expect("a tenant id")
    }

    async fn rig() -> Rig {
        let clock = Arc::new(ManualClock::default());
        let queue = MemoryQueue::new(clock.clone());
        let store = MemoryStore::default();
        let limiter = Arc::new(MemoryRateLimiter::new(clock.clone()));
        let fake = FakeResend::start().await.expect("the fake starts");
        let provider =
            ResendProvider::new(ResendConfig::new(fake.api_key()).with_base_url(fake.base_url()))
                .expect("valid config");
        let per_second = Bucket::new(5, 5, Duration::from_secs(1)).expect("valid");
        let limits = ProviderLimits::new("resend", per_second, per_second);
        let sender = Arc::new(
            EmailSender::new(Arc::new(provider), limiter.clone(), limits.clone())
                .clock(clock.clone()),
        );
        let marketing = jobs_notifications::marketing("email").expect("valid");
        let worker = Worker::builder(
            ConsumerName::try_from("notif.email.sender").expect("valid"),
            marketing.clone(),
            Arc::new(queue.clone()),
            Arc::new(store.clone()),
            Arc::new(store.clone()),
        )
        .handler(
            SEND_EMAIL_KIND.parse().expect("valid"),
            super::email_handler(sender, limiter.clone(), clock.clone()),
        )
        .policy(
            jobs_consumers::QueuePolicy::new(
                marketing.clone(),
                RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(4)).expect("valid"),
                "tests: short backoff",
            )
            .expect("valid"),
        )
        .clock(clock.clone())
        .concurrency(1)
        .build()
        .expect("a worker");
        Rig {
            clock,
            queue,
            store,
            limiter,
            limits,
            fake,
            worker,
            marketing,
        }
    }

    fn emails(n: usize) -> Vec<Email> {
        (0..n)
            .map(|i| {
                let mut email = Email::new(
                    "news@acme.test",
                    vec![format!("user{i}@example.test")],
                    "News",
                );
                email.text = Some(format!("hello {i}"));
                email
            })
            .collect()
    }

    async fn blast(rig: &Rig, n: usize) -> Blast {
        let blast = Blast {
            id: JobId::generate(),
            tenant: tenant(1),
            correlation: JobId::generate().to_string().parse().expect("valid"),
            queue: rig.marketing.clone(),
        };
        publish_emails(&rig.queue, &blast, emails(n), 100)
            .await
            .expect("publish");
        blast
    }

    /// Runs the worker, moving the clock past every wait, until the queue is empty; returns
    /// every outcome.
    async fn drain(rig: &Rig) -> Vec<Outcome> {
        let mut outcomes = vec![];
        for _ in 0..200 {
            let got = rig.worker.run_once().await.expect("run");
            if got.is_empty() {
                if rig
                    .queue
                    .depth(&rig.marketing)
                    .await
                    .expect("depth")
                    .total()
                    == 0
                {
                    return outcomes;
                }
                rig.clock.advance(Duration::from_millis(500));
            }
            outcomes.extend(got);
        }
        panic!("the queue did not drain: {outcomes:?}");
    }

    fn sent_once(rig: &Rig, n: usize) {
        let sent = rig.fake.sent();
        assert_eq!(sent.len(), n, "emails accepted by the provider");
        let mut recipients: Vec<String> = sent.iter().map(|e| e["to"].to_string()).collect();
        recipients.sort();
        recipients.dedup();
        assert_eq!(recipients.len(), n, "an email was sent twice");
    }

    fn only_the_batch_endpoint(rig: &Rig) {
        let paths = rig.fake.paths();
        assert!(!paths.is_empty());
        assert!(
            paths.iter().all(|p| p == "/emails/batch"),
            "a request went elsewhere (Audiences, contacts?): {paths:?}"
        );
    }

    #[tokio::test]
    async fn a_429_defers_without_an_attempt_and_holds_back_every_worker() {
        let rig = rig().await;
        blast(&rig, 250).await;
        rig.fake.rate_limit_next(1, 4);
        let started = rig.clock.now();

        let first = rig.worker.run_once().await.expect("run");
        let [Outcome::Deferred { until }] = first[..] else {
            panic!("a 429 defers the chunk: {first:?}");
        };
        assert_eq!(until, started + Duration::from_secs(4));
        // Another tenant's worker, which has spent nothing, finds the provider's bucket drained.
        let other = rig.limits.buckets(tenant(2));
        assert!(matches!(
            rig.limiter.acquire(&other, 1).await.expect("acquire"),
            Acquired::Denied { retry_at } if retry_at >= until
        ));
        // And this worker's next chunks wait too: no request reaches the provider before then.
        let before = rig.fake.batch_request_times().len();
        let next = rig.worker.run_once().await.expect("run");
        assert!(
            next.iter().all(|o| matches!(o, Outcome::Deferred { .. })),
            "{next:?}"
        );
        assert_eq!(rig.fake.batch_request_times().len(), before);

        let outcomes = drain(&rig).await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Processed | Outcome::Deferred { .. })),
            "a rate limit is never a failure: {outcomes:?}"
        );
        sent_once(&rig, 250);
        assert!(
            rig.store
                .list(&DeadLetterFilter::default())
                .await
                .expect("list")
                .is_empty()
        );
        only_the_batch_endpoint(&rig);
    }

    #[tokio::test]
    async fn a_5xx_is_retried_and_the_chunk_is_sent_once() {
        let rig = rig().await;
        blast(&rig, 120).await;
        rig.fake.fail_next(503, 1);
        let outcomes = drain(&rig).await;
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Retrying { .. }))
                .count(),
            1,
            "{outcomes:?}"
        );
        sent_once(&rig, 120);
        only_the_batch_endpoint(&rig);
    }

    #[tokio::test]
    async fn a_validation_error_dead_letters_the_chunk_with_the_providers_message() {
        let rig = rig().await;
        blast(&rig, 150).await;
        rig.fake.fail_next(422, 1);
        let outcomes = drain(&rig).await;
        assert!(
            outcomes.iter().any(|o| matches!(
                o,
                Outcome::DeadLettered {
                    reason: DeadReason::Permanent,
                    ..
                }
            )),
            "{outcomes:?}"
        );
        let letters = rig
            .store
            .list(&DeadLetterFilter::default())
            .await
            .expect("list");
        assert_eq!(letters.len(), 1);
        let error = &letters[0].letter.last_error;
        assert!(
            error.contains("422") && error.contains("injected by FakeResend"),
            "the provider's message is kept: {error}"
        );
        // Only the other chunk went out; the refused one waits for review, not for a retry.
        assert_eq!(rig.fake.sent().len() % 100, 50);
        assert_eq!(letters[0].letter.attempts, 1);
    }

    #[tokio::test]
    async fn a_retried_chunk_is_never_sent_twice() {
        let rig = rig().await;
        blast(&rig, 230).await;
        // The provider sends the first chunk, but its answer is lost: the job is retried, with
        // the same idempotency key, and the provider answers it without sending again.
        rig.fake.lose_answer_next(1);
        let outcomes = drain(&rig).await;
        assert!(
            outcomes
                .iter()
                .any(|o| matches!(o, Outcome::Retrying { .. })),
            "{outcomes:?}"
        );
        sent_once(&rig, 230);
        let keys: Vec<_> = rig
            .fake
            .batches()
            .into_iter()
            .map(|b| b.idempotency_key)
            .collect();
        assert_eq!(
            keys.len(),
            3,
            "three chunks, three accepted batches: {keys:?}"
        );
        assert!(
            rig.fake.batch_request_times().len() > 3,
            "the lost answer was retried"
        );
        only_the_batch_endpoint(&rig);
    }
}

//! Email chunks and the sender's verdicts, over a scripted provider and the in-process limiter.
//! The whole path through the worker runtime and the Resend fake is tested where it is composed
//! (`jobs_ops::notify`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryQueue, MemoryRateLimiter};
use jobs_core::{
    Acquired, Bucket, Clock, Email, EmailError, EmailProvider, Envelope, JobId, ManualClock,
    PullPort, QueueDepth, RateLimiter,
};
use jobs_notifications::{
    Blast, EmailChunk, EmailSender, ProviderLimits, SEND_EMAIL_KIND, SendError, chunk_emails,
    publish_emails,
};
use jobs_testkit::fixtures;
use proptest::prelude::*;

fn email(n: usize) -> Email {
    Email::new(
        "news@acme.test",
        vec![format!("user{n}@example.test")],
        "News",
    )
}

/// Answers each `send_batch` with the next scripted result (success when the script is empty)
/// and records the keys it was called with.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<(), EmailError>>>,
    keys: Mutex<Vec<String>>,
}

impl Scripted {
    fn then(self, answer: Result<(), EmailError>) -> Self {
        self.answers.lock().unwrap().push_back(answer);
        self
    }
}

#[async_trait]
impl EmailProvider for Scripted {
    fn max_batch(&self) -> usize {
        100
    }

    async fn send_batch(
        &self,
        emails: &[Email],
        idempotency_key: &str,
    ) -> Result<Vec<String>, EmailError> {
        self.keys.lock().unwrap().push(idempotency_key.to_owned());
        match self.answers.lock().unwrap().pop_front() {
            Some(Err(e)) => Err(e),
            _ => Ok((0..emails.len()).map(|n| format!("id-{n}")).collect()),
        }
    }
}

fn limits() -> ProviderLimits {
    let per_second = Bucket::new(5, 5, Duration::from_secs(1)).expect("valid");
    ProviderLimits::new("resend", per_second, per_second)
}

struct Setup {
    clock: Arc<ManualClock>,
    limiter: Arc<MemoryRateLimiter>,
    provider: Arc<Scripted>,
    sender: EmailSender,
}

fn setup(provider: Scripted) -> Setup {
    let clock = Arc::new(ManualClock::default());
    let limiter = Arc::new(MemoryRateLimiter::new(clock.clone()));
    let provider = Arc::new(provider);
    let sender = EmailSender::new(provider.clone(), limiter.clone(), limits()).clock(clock.clone());
    Setup {
        clock,
        limiter,
        provider,
        sender,
    }
}

fn chunk(n: usize) -> EmailChunk {
    chunk_emails(JobId::generate(), (0..n).map(email).collect(), 100).remove(0)
}

#[tokio::test]
async fn a_429_defers_to_retry_after_and_drains_the_provider_bucket_for_everyone() {
    let s = setup(Scripted::default().then(Err(EmailError::RateLimited {
        retry_after: Some(Duration::from_secs(7)),
    })));
    let started = s.clock.now();
    let Err(SendError::Deferred { until, .. }) = s.sender.send(&chunk(3)).await else {
        panic!("a 429 is a deferral");
    };
    assert_eq!(until, started + Duration::from_secs(7));

    // Another tenant, which has spent nothing, is held back too: the provider's bucket is empty.
    let other = limits().buckets(fixtures::tenant(2));
    let Acquired::Denied { retry_at } = s.limiter.acquire(&other, 1).await.expect("acquire") else {
        panic!("another worker sent while the provider said to wait");
    };
    assert!(retry_at >= until, "{retry_at:?} is before {until:?}");
    s.clock.set(until);
    assert_eq!(
        s.limiter.acquire(&other, 1).await.expect("acquire"),
        Acquired::Granted
    );
}

#[tokio::test]
async fn a_429_without_a_retry_time_defers_by_the_fallback() {
    let s = setup(Scripted::default().then(Err(EmailError::RateLimited { retry_after: None })));
    let sender = s.sender.rate_limit_backoff(Duration::from_secs(3));
    let started = s.clock.now();
    let Err(SendError::Deferred { until, .. }) = sender.send(&chunk(1)).await else {
        panic!("a 429 is a deferral");
    };
    assert_eq!(until, started + Duration::from_secs(3));
}

#[tokio::test]
async fn unavailable_is_retryable_and_a_rejection_is_permanent_with_the_message() {
    let s = setup(
        Scripted::default()
            .then(Err(EmailError::Unavailable {
                message: "500 internal_server_error".into(),
                source: None,
            }))
            .then(Err(EmailError::Rejected {
                status: 422,
                message: "Invalid `from` field.".into(),
            })),
    );
    let one = chunk(2);
    assert!(matches!(
        s.sender.send(&one).await,
        Err(SendError::Retryable(_))
    ));
    match s.sender.send(&one).await {
        Err(e @ SendError::Permanent(_)) => {
            assert!(e.to_string().contains("Invalid `from` field."), "{e}");
        }
        other => panic!("a 422 is permanent, got {other:?}"),
    }
    // Neither touched the provider's bucket.
    assert_eq!(s.limiter.held(), 0);
    assert_eq!(
        s.sender.send(&one).await.expect("sent"),
        vec!["id-0".to_owned(), "id-1".to_owned()]
    );
    let keys = s.provider.keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        vec![one.idempotency_key(); 3],
        "every try of a chunk presents the same idempotency key"
    );
}

#[tokio::test]
async fn an_oversized_or_empty_chunk_is_refused_before_any_request() {
    let s = setup(Scripted::default());
    assert_eq!(s.sender.max_batch(), 100, "the provider's batch size");
    let full = chunk(100);
    assert_eq!(
        s.sender
            .send(&full)
            .await
            .expect("a full batch is sent")
            .len(),
        100
    );
    s.provider.keys.lock().unwrap().clear();
    let mut big = chunk(100);
    big.emails.push(email(100));
    assert!(matches!(
        s.sender.send(&big).await,
        Err(SendError::Permanent(_))
    ));
    big.emails.clear();
    assert!(matches!(
        s.sender.send(&big).await,
        Err(SendError::Permanent(_))
    ));
    assert!(s.provider.keys.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_blast_is_published_as_one_job_per_chunk_once() {
    let queue = MemoryQueue::new(Arc::new(ManualClock::default()));
    let marketing = jobs_notifications::marketing("email").expect("valid");
    let blast = Blast {
        id: JobId::generate(),
        tenant: fixtures::tenant(1),
        correlation: fixtures::correlation(),
        queue: marketing.clone(),
    };
    let emails: Vec<Email> = (0..250).map(email).collect();
    let ids = publish_emails(&queue, &blast, emails.clone(), 100)
        .await
        .expect("publish");
    assert_eq!(ids.len(), 3);
    // Publishing the same blast again (a producer's retry) queues nothing new.
    publish_emails(&queue, &blast, emails.clone(), 100)
        .await
        .expect("publish");
    assert_eq!(queue.depth(&marketing).await.expect("depth").total(), 3);

    let deliveries = queue
        .receive(&marketing, 10, Duration::from_secs(30))
        .await
        .expect("receive");
    let mut chunks: Vec<EmailChunk> = deliveries
        .iter()
        .map(|d| {
            let envelope = Envelope::decode(&d.payload).expect("valid");
            assert_eq!(envelope.kind.as_str(), SEND_EMAIL_KIND);
            assert_eq!(envelope.tenant_id, blast.tenant);
            envelope.into_typed::<EmailChunk>().expect("a chunk").data
        })
        .collect();
    chunks.sort_by_key(|c| c.index);
    let sent: Vec<Email> = chunks.iter().flat_map(|c| c.emails.clone()).collect();
    assert_eq!(sent, emails);
    assert_eq!(
        chunks
            .iter()
            .map(EmailChunk::idempotency_key)
            .collect::<Vec<_>>(),
        (0..3)
            .map(|n| format!("{}-{n}", blast.id))
            .collect::<Vec<_>>()
    );
}

proptest! {
    #[test]
    fn chunks_keep_order_respect_the_size_and_have_distinct_stable_keys(
        n in 0usize..700,
        max in 1usize..150,
    ) {
        let blast = JobId::generate();
        let emails: Vec<Email> = (0..n).map(email).collect();
        let chunks = chunk_emails(blast, emails.clone(), max);
        prop_assert_eq!(chunks.len(), n.div_ceil(max));
        prop_assert!(chunks.iter().all(|c| !c.emails.is_empty() && c.emails.len() <= max));
        let joined: Vec<Email> = chunks.iter().flat_map(|c| c.emails.clone()).collect();
        prop_assert_eq!(&joined, &emails);
        let keys: std::collections::HashSet<String> =
            chunks.iter().map(EmailChunk::idempotency_key).collect();
        prop_assert_eq!(keys.len(), chunks.len());
        prop_assert_eq!(chunk_emails(blast, emails, max), chunks);
    }
}

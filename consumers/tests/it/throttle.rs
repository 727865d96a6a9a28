//! A throttled handler: denied tokens defer jobs without spending attempts, and every job is
//! processed once the tokens come back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryRateLimiter, MemoryWorkTx};
use jobs_consumers::{Handler, Job, JobError, Outcome, Throttled, Worker};
use jobs_core::{Bucket, BucketKey, ConsumerName, DeadLetterFilter, DeadLetterStore, Envelope};

use crate::harness::{Harness, KIND, TestData};

struct Send {
    attempts: Arc<Mutex<Vec<u32>>>,
}

#[async_trait]
impl Handler<MemoryWorkTx> for Send {
    type Data = TestData;

    async fn handle(&self, job: Job<TestData>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
        self.attempts
            .lock()
            .expect("not poisoned")
            .push(job.attempt);
        tx.record_effect(job.envelope.data.n.to_string());
        Ok(())
    }
}

/// The provider buckets a test's jobs take their token from.
type Buckets =
    Box<dyn Fn(&Envelope<TestData>) -> Vec<(BucketKey, Bucket)> + std::marker::Send + Sync>;

/// `Send` (recording attempts in `attempts`) behind `limiter`, taking one token from the
/// provider bucket `bucket` per job.
fn on_resend(
    limiter: Arc<dyn jobs_core::RateLimiter>,
    bucket: Bucket,
    attempts: &Arc<Mutex<Vec<u32>>>,
) -> Throttled<Send, Buckets> {
    let send = Send {
        attempts: attempts.clone(),
    };
    let buckets: Buckets = Box::new(move |_| vec![(BucketKey::provider("resend"), bucket)]);
    Throttled::new(send, limiter, buckets)
}

/// The sender's worker on the harness's queue, running `handler`.
fn sender(
    h: &Harness,
    handler: impl Handler<MemoryWorkTx>,
) -> Worker<jobs_adapter_memory::MemoryStore> {
    Worker::builder(
        ConsumerName::try_from("test.sender").expect("valid"),
        h.name.clone(),
        Arc::new(h.queue.clone()),
        Arc::new(h.store.clone()),
        Arc::new(h.store.clone()),
    )
    .handler(KIND.parse().expect("valid"), handler)
    .clock(Arc::new(h.clock.clone()))
    .build()
    .expect("valid")
}

#[tokio::test]
async fn denied_tokens_defer_without_spending_attempts() {
    let h = Harness::new();
    let limiter = Arc::new(MemoryRateLimiter::new(Arc::new(h.clock.clone())));
    let provider = Bucket::new(2, 2, Duration::from_secs(10)).expect("valid");
    let attempts = Arc::new(Mutex::new(vec![]));
    let handler = on_resend(limiter, provider, &attempts)
        // The manual clock does not move while a job would wait for its tokens.
        .wait_at_most(Duration::ZERO);
    let worker = sender(&h, handler);
    for n in 0..7 {
        h.publish(n).await;
    }

    let first = worker.run_once().await.expect("receive");
    let processed = first.iter().filter(|o| **o == Outcome::Processed).count();
    let deferred = first
        .iter()
        .filter(|o| matches!(o, Outcome::Deferred { .. }))
        .count();
    assert_eq!((processed, deferred), (2, 5), "{first:?}");
    let untils: Vec<std::time::SystemTime> = first
        .iter()
        .filter_map(|o| match o {
            Outcome::Deferred { until } => Some(*until),
            _ => None,
        })
        .collect();
    let (earliest, latest) = (
        *untils.iter().min().expect("five"),
        *untils.iter().max().expect("five"),
    );
    assert!(
        latest > earliest
            && latest.duration_since(earliest).expect("ordered") < Duration::from_secs(10),
        "denied together, spread over the refill interval: {untils:?}"
    );

    for _ in 0..10 {
        h.clock.advance(Duration::from_secs(10));
        h.drain(&worker).await;
    }
    assert_eq!(h.store.effects().len(), 7, "every job processed once");
    assert!(
        attempts
            .lock()
            .expect("not poisoned")
            .iter()
            .all(|a| *a == 1),
        "a deferral spent an attempt"
    );
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    assert!(letters.is_empty(), "a rate limit dead-lettered a job");
}

/// A limiter that refuses every bucket, as Redis refuses one whose interval is not whole
/// milliseconds: a configuration error no wait can fix.
struct Refuses;

#[async_trait]
impl jobs_core::RateLimiter for Refuses {
    async fn acquire(
        &self,
        _: &[(BucketKey, Bucket)],
        _: u32,
    ) -> Result<jobs_core::Acquired, jobs_core::RateLimitError> {
        Err(jobs_core::RateLimitError::InvalidBucket(
            "interval 1.5ms is not whole milliseconds".into(),
        ))
    }

    async fn drain_until(
        &self,
        _: &BucketKey,
        _: Bucket,
        _: std::time::SystemTime,
    ) -> Result<(), jobs_core::RateLimitError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_bucket_the_limiter_refuses_dead_letters_instead_of_deferring_forever() {
    let h = Harness::new();
    let bucket = Bucket::new(1, 1, Duration::from_secs(1)).expect("valid");
    let handler = on_resend(Arc::new(Refuses), bucket, &Arc::default());
    let worker = sender(&h, handler);
    h.publish(1).await;
    let outcomes = h.drain(&worker).await;
    assert!(
        matches!(
            outcomes[..],
            [Outcome::DeadLettered {
                reason: jobs_consumers::DeadReason::Permanent,
                ..
            }]
        ),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn short_waits_for_tokens_are_waited_before_the_job_runs_not_requeued() {
    let h = Harness::new();
    // Real time for the limiter, so that its tokens come back while the jobs wait for them.
    let limiter = Arc::new(MemoryRateLimiter::new(Arc::new(jobs_core::SystemClock)));
    let provider = Bucket::new(1, 1, Duration::from_millis(40)).expect("valid");
    let attempts = Arc::new(Mutex::new(vec![]));
    let handler = on_resend(limiter, provider, &attempts);
    let worker = sender(&h, handler);
    for n in 0..6 {
        h.publish(n).await;
    }

    // Six jobs for one token every 40 ms: each waits its turn (well under the longest wait)
    // instead of going back through the transport.
    let outcomes = worker.run_once().await.expect("receive");
    assert_eq!(outcomes, vec![Outcome::Processed; 6]);
    assert_eq!(h.store.effects().len(), 6);
    assert_eq!(attempts.lock().expect("not poisoned").len(), 6);
}

/// Records whether a work transaction was open while the job got ready, and when it ran.
#[derive(Clone, Default)]
struct Watched {
    store: jobs_adapter_memory::MemoryStore,
    open_when_ready: Arc<Mutex<Vec<usize>>>,
}

#[async_trait]
impl Handler<MemoryWorkTx> for Watched {
    type Data = TestData;

    async fn ready(&self, _: &Job<TestData>) -> Result<(), JobError> {
        let open = self.store.open_transactions();
        self.open_when_ready
            .lock()
            .expect("not poisoned")
            .push(open);
        Ok(())
    }

    async fn handle(&self, job: Job<TestData>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
        assert!(self.store.open_transactions() >= 1, "the job's own");
        tx.record_effect(job.envelope.data.n.to_string());
        Ok(())
    }
}

#[tokio::test]
async fn a_job_gets_ready_before_its_work_transaction_opens() {
    let h = Harness::new();
    let watched = Watched {
        store: h.store.clone(),
        ..Watched::default()
    };
    let worker = Worker::builder(
        ConsumerName::try_from("test.sender").expect("valid"),
        h.name.clone(),
        Arc::new(h.queue.clone()),
        Arc::new(h.store.clone()),
        Arc::new(h.store.clone()),
    )
    .handler(KIND.parse().expect("valid"), watched.clone())
    .concurrency(1)
    .build()
    .expect("valid");
    for n in 0..3 {
        h.publish(n).await;
    }
    h.drain(&worker).await;
    assert_eq!(h.store.effects().len(), 3);
    assert_eq!(
        *watched.open_when_ready.lock().expect("not poisoned"),
        [0, 0, 0]
    );
}

/// A limiter that answers every request the same way: denied until `retry_in` from now on
/// `clock`, or unavailable when `retry_in` is `None`.
struct Answers {
    clock: jobs_core::ManualClock,
    retry_in: Option<Duration>,
}

#[async_trait]
impl jobs_core::RateLimiter for Answers {
    async fn acquire(
        &self,
        _: &[(BucketKey, Bucket)],
        _: u32,
    ) -> Result<jobs_core::Acquired, jobs_core::RateLimitError> {
        match self.retry_in {
            Some(wait) => Ok(jobs_core::Acquired::Denied {
                retry_at: jobs_core::Clock::now(&self.clock) + wait,
            }),
            None => Err(jobs_core::RateLimitError::Unavailable {
                message: "connection refused".into(),
                source: None,
            }),
        }
    }

    async fn drain_until(
        &self,
        _: &BucketKey,
        _: Bucket,
        _: std::time::SystemTime,
    ) -> Result<(), jobs_core::RateLimitError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_the_most_a_job_waits_is_a_deferral_at_once() {
    let h = Harness::new();
    let limiter = Answers {
        clock: h.clock.clone(),
        retry_in: Some(Duration::from_secs(3600)),
    };
    let bucket = Bucket::new(1, 1, Duration::from_secs(1)).expect("valid");
    let handler =
        on_resend(Arc::new(limiter), bucket, &Arc::default()).clock(Arc::new(h.clock.clone()));
    let worker = sender(&h, handler);
    h.publish(1).await;
    let now = jobs_core::Clock::now(&h.clock);
    // Virtual time: a worker that slept out the hour would still be asleep at the timeout.
    let outcomes = tokio::time::timeout(Duration::from_secs(10), worker.run_once())
        .await
        .expect("deferred without waiting out the hour")
        .expect("receive");
    match outcomes[..] {
        [Outcome::Deferred { until }] => assert!(
            until >= now + Duration::from_secs(3600),
            "deferred to when the tokens are back: {until:?}"
        ),
        _ => panic!("{outcomes:?}"),
    }
}

#[tokio::test]
async fn an_unavailable_limiter_defers_the_job_a_few_seconds_without_spending_an_attempt() {
    let h = Harness::new();
    let limiter = Answers {
        clock: h.clock.clone(),
        retry_in: None,
    };
    let attempts = Arc::new(Mutex::new(vec![]));
    let bucket = Bucket::new(1, 1, Duration::from_secs(1)).expect("valid");
    let handler = on_resend(Arc::new(limiter), bucket, &attempts).clock(Arc::new(h.clock.clone()));
    let worker = sender(&h, handler);
    h.publish(1).await;
    let now = jobs_core::Clock::now(&h.clock);
    let outcomes = worker.run_once().await.expect("receive");
    assert_eq!(
        outcomes,
        [Outcome::Deferred {
            until: now + Duration::from_secs(5)
        }]
    );
    assert!(
        attempts.lock().expect("not poisoned").is_empty(),
        "the handler did not run"
    );
}

//! The runtime's contract, one behaviour per test.

use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_memory::MemoryStore;
use jobs_consumers::{DeadLetters, DeadReason, JobError, Outcome, Replayed};
use jobs_core::{
    ConsumerName, DeadLetterFilter, DeadLetterStatus, DeadLetterStore, ProcessedJobs,
    PublishOptions, QueueDepth, QueuePort, Transition,
};
use jobs_testkit::mock::MockDeadLetterStore;

use crate::harness::{Harness, KIND};

fn ok(_: u32) -> Result<(), JobError> {
    Ok(())
}

fn always_retry(_: u32) -> Result<(), JobError> {
    Err(JobError::retry("the payment provider timed out"))
}

fn succeed_on_third(attempt: u32) -> Result<(), JobError> {
    if attempt < 3 {
        Err(JobError::retry("flaky"))
    } else {
        Ok(())
    }
}

fn permanent(_: u32) -> Result<(), JobError> {
    Err(JobError::permanent("invoice 42 does not exist"))
}

fn panics(attempt: u32) -> Result<(), JobError> {
    assert!(attempt > 1, "boom on the first attempt");
    Ok(())
}

async fn depth(h: &Harness) -> u64 {
    h.queue.depth(&h.name).await.expect("depth").total()
}

#[tokio::test]
async fn each_job_runs_once_and_commits_its_effect_with_the_claim() {
    let h = Harness::new();
    let worker = h.worker(ok);
    for n in 0..5 {
        h.publish(n).await;
    }
    let outcomes = h.drain(&worker).await;
    assert_eq!(outcomes, vec![Outcome::Processed; 5]);
    let mut effects = h.store.effects();
    effects.sort();
    assert_eq!(effects, ["n=0", "n=1", "n=2", "n=3", "n=4"]);
    assert_eq!(depth(&h).await, 0, "every message acked");
}

#[tokio::test]
async fn a_duplicate_delivery_is_acked_without_running_the_handler() {
    let h = Harness::new();
    let worker = h.worker(ok);
    let envelope = h.publish(1).await;
    // The same job published again under another dedup key: the transport delivers it twice.
    let other_key = PublishOptions::default().dedup_key("retry-of-a-timeout");
    h.queue
        .publish(&h.name, &envelope, other_key)
        .await
        .expect("publish");
    let outcomes = h.drain(&worker).await;
    assert_eq!(outcomes, [Outcome::Processed, Outcome::Duplicate]);
    assert_eq!(h.calls(1), 1);
    assert_eq!(h.store.effects(), ["n=1"]);
    assert_eq!(depth(&h).await, 0);
}

#[tokio::test]
async fn a_crash_between_commit_and_ack_is_skipped_on_redelivery() {
    let h = Harness::new();
    let worker = h.worker(ok);
    h.publish(7).await;
    h.transport.lose_next(1);
    let first = h.drain(&worker).await;
    assert!(
        matches!(first[..], [Outcome::Unsettled { .. }]),
        "{first:?}"
    );
    assert_eq!(depth(&h).await, 1, "the message is still there");
    h.clock.advance(Duration::from_secs(61));
    let second = h.drain(&worker).await;
    assert_eq!(second, [Outcome::Duplicate]);
    assert_eq!(h.calls(7), 1, "the handler ran once");
    assert_eq!(h.store.effects(), ["n=7"]);
}

#[tokio::test]
async fn retries_back_off_within_the_jitter_bounds_and_then_succeed() {
    let h = Harness::new();
    let worker = h.worker(succeed_on_third);
    h.publish(1).await;
    for (attempt, ceiling) in [(1u64, 30u64), (2, 60)] {
        let start = jobs_core::Clock::now(&h.clock);
        let outcomes = h.drain(&worker).await;
        let [Outcome::Retrying { at }] = outcomes[..] else {
            panic!("attempt {attempt}: {outcomes:?}");
        };
        let delay = at.duration_since(start).expect("in the future");
        assert!(
            delay >= Duration::from_secs(ceiling / 2) && delay <= Duration::from_secs(ceiling),
            "attempt {attempt}: delay {delay:?} outside [{}s, {ceiling}s]",
            ceiling / 2
        );
        h.clock.advance(delay);
    }
    assert_eq!(h.drain(&worker).await, [Outcome::Processed]);
    assert_eq!(h.calls(1), 3);
    assert_eq!(h.store.effects(), ["n=1"], "failed attempts left no effect");
}

#[tokio::test]
async fn exhausted_jobs_are_dead_lettered_with_their_story_and_alerted_once() {
    let h = Harness::new();
    let worker = h.worker(always_retry);
    let envelope = h.publish(1).await;
    let mut outcomes = vec![];
    for _ in 0..10 {
        outcomes.extend(h.drain(&worker).await);
        h.clock.advance(Duration::from_secs(3600));
    }
    assert_eq!(h.calls(1), 5, "five attempts in total");
    let Some(Outcome::DeadLettered { id, reason }) = outcomes.last().cloned() else {
        panic!("{outcomes:?}");
    };
    assert_eq!(reason, DeadReason::Exhausted);
    let letter = h.store.get(id).await.expect("get").expect("recorded");
    assert_eq!(letter.status, DeadLetterStatus::PendingReview);
    assert_eq!(letter.letter.reason, Some(DeadReason::Exhausted), "kept");
    assert_eq!(letter.letter.attempts, 5);
    assert_eq!(letter.letter.job_id, Some(envelope.job_id));
    assert_eq!(letter.letter.correlation_id, Some(envelope.correlation_id));
    assert_eq!(letter.letter.queue, h.name);
    assert!(
        letter.letter.last_error.contains("timed out"),
        "{}",
        letter.letter.last_error
    );
    assert_eq!(
        letter.letter.payload,
        envelope.to_json_bytes().expect("encodes")
    );
    assert_eq!(depth(&h).await, 0, "acked after dead-lettering");
    let alerts = h.alerts().await;
    assert_eq!(alerts.len(), 1);
    assert!(
        alerts[0].title.contains("1 job dead-lettered on test.jobs"),
        "{:?}",
        alerts[0]
    );
}

#[tokio::test]
async fn a_permanent_failure_is_dead_lettered_at_once() {
    let h = Harness::new();
    let worker = h.worker(permanent);
    h.publish(1).await;
    let outcomes = h.drain(&worker).await;
    let [
        Outcome::DeadLettered {
            id,
            reason: DeadReason::Permanent,
        },
    ] = outcomes[..]
    else {
        panic!("{outcomes:?}");
    };
    assert_eq!(h.calls(1), 1);
    let letter = h.store.get(id).await.expect("get").expect("recorded");
    assert_eq!(letter.letter.reason, Some(DeadReason::Permanent), "kept");
    let filtered = |reason| {
        let store = h.store.clone();
        async move {
            let filter = DeadLetterFilter {
                reason: Some(reason),
                ..DeadLetterFilter::default()
            };
            store.list(&filter).await.expect("list").len()
        }
    };
    assert_eq!(filtered(DeadReason::Permanent).await, 1);
    assert_eq!(filtered(DeadReason::Exhausted).await, 0);
}

#[tokio::test]
async fn a_panicking_handler_is_retried_and_the_worker_goes_on() {
    let h = Harness::new();
    let worker = h.worker(panics);
    h.publish(1).await;
    h.publish(2).await;
    let outcomes = h.drain(&worker).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Retrying { .. })),
        "{outcomes:?}"
    );
    h.clock.advance(Duration::from_secs(31));
    assert_eq!(
        h.drain(&worker).await,
        [Outcome::Processed, Outcome::Processed]
    );
}

/// A valid job of `kind`, which no handler of the harness knows, published as bytes.
fn of_kind(h: &Harness, kind: &str) -> Vec<u8> {
    let mut job = serde_json::to_value(h.publish_unpublished(2)).expect("serialises");
    job["kind"] = serde_json::json!(kind);
    let bytes = serde_json::to_vec(&job).expect("serialises");
    h.queue
        .publish_bytes(&h.name, bytes.clone(), &PublishOptions::default());
    bytes
}

#[tokio::test]
async fn a_kind_no_handler_knows_is_retried_then_dead_lettered_as_unknown() {
    let h = Harness::new();
    let worker = h.worker(ok);
    let bytes = of_kind(&h, "billing.new_in_this_deploy");
    let mut outcomes = vec![];
    for _ in 0..10 {
        // Each retry falls due within the policy's cap.
        outcomes.extend(h.drain(&worker).await);
        h.clock.advance(Duration::from_secs(3_600));
    }
    let retries = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Retrying { .. }))
        .count();
    assert_eq!(retries, 4, "retried with the backoff: {outcomes:?}");
    assert!(matches!(
        outcomes.last(),
        Some(Outcome::DeadLettered {
            reason: DeadReason::UnknownKind,
            ..
        })
    ));
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    let [letter] = &letters[..] else {
        panic!("one dead letter: {letters:?}");
    };
    assert_eq!(letter.letter.payload, bytes, "its bytes intact");
    assert_eq!(letter.letter.attempts, 5);
    assert_eq!(letter.letter.reason, Some(DeadReason::UnknownKind), "kept");
    assert!(
        letter.letter.last_error.contains("`kind`"),
        "{}",
        letter.letter.last_error
    );
}

#[tokio::test]
async fn a_worker_may_keep_unknown_kinds_as_poison() {
    let h = Harness::new();
    let worker = h
        .builder()
        .handler(
            KIND.parse().expect("valid"),
            crate::harness::Scripted {
                script: ok,
                calls: h.calls.clone(),
            },
        )
        .unknown_kinds_are_poison()
        .build()
        .expect("valid");
    of_kind(&h, "nobody.handles_this");
    assert!(matches!(
        h.drain(&worker).await[..],
        [Outcome::DeadLettered {
            reason: DeadReason::Poison,
            ..
        }]
    ));
}

#[tokio::test]
async fn poison_goes_straight_to_dead_letters_with_the_raw_bytes_and_the_field_named() {
    let h = Harness::new();
    let worker = h.worker(ok);
    let good = h.publish(1).await;
    let mut broken_field = serde_json::to_value(&good).expect("serialises");
    broken_field["tenant_id"] = serde_json::json!("not-a-uuid");
    let mut wrong_data = serde_json::to_value(h.publish_unpublished(3)).expect("serialises");
    wrong_data["data"] = serde_json::json!({ "n": "three" });
    let cases: [(Vec<u8>, &str); 3] = [
        (vec![0xff, 0x00, 0x7b, 0x22], "not valid JSON"),
        (
            serde_json::to_vec(&broken_field).expect("serialises"),
            "`tenant_id`",
        ),
        (
            serde_json::to_vec(&wrong_data).expect("serialises"),
            "`data`",
        ),
    ];
    for (bytes, _) in &cases {
        h.queue
            .publish_bytes(&h.name, bytes.clone(), &PublishOptions::default());
    }
    let outcomes = h.drain(&worker).await;
    assert_eq!(outcomes.len(), 4);
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    assert_eq!(letters.len(), 3, "each poison message dead-lettered once");
    for (bytes, field) in &cases {
        let letter = letters
            .iter()
            .find(|l| &l.letter.payload == bytes)
            .unwrap_or_else(|| panic!("no dead letter holds {bytes:?} intact"));
        assert_eq!(letter.letter.attempts, 1, "poison is never retried");
        assert_eq!(letter.letter.reason, Some(DeadReason::Poison), "kept");
        assert!(
            letter.letter.last_error.contains(field),
            "{field}: {}",
            letter.letter.last_error
        );
    }
    // What a broken payload still holds is kept: the ids of the envelope whose tenant is bad.
    let salvaged = letters
        .iter()
        .find(|l| l.letter.last_error.contains("`tenant_id`"))
        .expect("present");
    assert_eq!(salvaged.letter.job_id, Some(good.job_id));
    assert_eq!(salvaged.letter.correlation_id, Some(good.correlation_id));
    assert_eq!(salvaged.letter.kind, Some(good.kind.clone()));
    assert_eq!(
        salvaged.letter.tenant_id, None,
        "the bad tenant is not kept"
    );
    let unreadable = letters
        .iter()
        .find(|l| l.letter.payload[0] == 0xff)
        .expect("present");
    assert_eq!(
        unreadable.letter.job_id, None,
        "a job id that cannot be read is NULL"
    );
    assert_eq!(
        h.calls(3),
        0,
        "data that does not fit never reaches the handler"
    );
    assert_eq!(depth(&h).await, 0);
}

#[tokio::test]
async fn a_failing_dead_letter_store_leaves_the_message_unacked() {
    let h = Harness::new();
    let mut broken = MockDeadLetterStore::new();
    broken
        .expect_record()
        .returning(|_| Err(jobs_core::StoreError::unavailable("disk full")));
    let worker = jobs_consumers::Worker::builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.transport.clone()),
        Arc::new(h.store.clone()),
        Arc::new(broken),
    )
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script: permanent,
            calls: h.calls.clone(),
        },
    )
    .clock(Arc::new(h.clock.clone()))
    .build()
    .expect("valid");
    // Poison without a readable job id is recorded outside a work transaction.
    h.queue
        .publish_bytes(&h.name, b"not json".to_vec(), &PublishOptions::default());
    let outcomes = h.drain(&worker).await;
    assert!(
        matches!(outcomes[..], [Outcome::Unsettled { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(depth(&h).await, 1, "nothing lost");
    h.clock.advance(Duration::from_secs(61));
    assert_eq!(
        h.drain(&worker).await.len(),
        1,
        "delivered again after the lease"
    );
}

#[tokio::test]
async fn a_deferral_does_not_spend_an_attempt() {
    fn defer_first(attempt: u32) -> Result<(), JobError> {
        assert_eq!(attempt, 1, "a deferral must not count as an attempt");
        Err(JobError::Defer {
            until: std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_610),
        })
    }
    let h = Harness::new();
    let worker = h.worker(defer_first);
    h.publish(1).await;
    let once = worker.run_once().await.expect("receive");
    assert!(matches!(once[..], [Outcome::Deferred { .. }]), "{once:?}");
    assert!(
        worker.run_once().await.expect("receive").is_empty(),
        "hidden until then"
    );
    h.clock.advance(Duration::from_secs(11));
    let again = worker.run_once().await.expect("receive");
    assert!(matches!(again[..], [Outcome::Deferred { .. }]), "{again:?}");
    assert_eq!(h.calls(1), 2);
}

#[tokio::test]
async fn replay_runs_the_job_again_exactly_once_and_is_idempotent() {
    let h = Harness::new();
    let failing = h.worker(permanent);
    let envelope = h.publish(1).await;
    let outcomes = h.drain(&failing).await;
    let [Outcome::DeadLettered { id, .. }] = outcomes[..] else {
        panic!("{outcomes:?}");
    };
    let ops = DeadLetters::new(Arc::new(h.store.clone()), Arc::new(h.queue.clone()));
    let other_tenant = jobs_testkit::fixtures::tenant(99);
    assert!(
        ops.replay(id, Some(other_tenant)).await.is_err(),
        "tenant-scoped"
    );
    assert_eq!(
        ops.replay(id, Some(envelope.tenant_id))
            .await
            .expect("replay"),
        Replayed::Done
    );
    assert_eq!(
        ops.replay(id, None).await.expect("replay"),
        Replayed::AlreadyDone
    );
    assert_eq!(
        ops.discard(id, None).await.expect("discard"),
        Transition::Conflict(DeadLetterStatus::Replayed)
    );

    let fixed = h.worker(ok);
    assert_eq!(
        h.drain(&fixed).await,
        [Outcome::Processed],
        "replayed exactly once"
    );
    assert_eq!(h.store.effects(), ["n=1"]);
    let consumer = ConsumerName::try_from("test.consumer").expect("valid");
    assert!(
        h.store
            .is_processed(envelope.job_id, &consumer)
            .await
            .expect("query")
    );
}

#[tokio::test]
async fn a_redelivered_copy_of_a_dead_lettered_job_is_not_run_again() {
    let h = Harness::new();
    let worker = h.worker(permanent);
    h.publish(1).await;
    // The dead letter is written, then the ack is lost.
    h.transport.lose_next(1);
    assert!(matches!(
        h.drain(&worker).await[..],
        [Outcome::Unsettled { .. }]
    ));
    h.clock.advance(Duration::from_secs(61));
    let outcomes = h.drain(&worker).await;
    assert_eq!(
        outcomes,
        [Outcome::Duplicate],
        "the pending dead letter blocks the claim"
    );
    assert_eq!(h.calls(1), 1, "the handler did not run on the redelivery");
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "one dead letter, not two");
}

#[tokio::test]
async fn alerts_are_coalesced_per_queue_per_window() {
    let h = Harness::new();
    let worker = h.worker(permanent);
    for n in 0..10 {
        h.publish(n).await;
    }
    h.drain(&worker).await;
    assert_eq!(h.alerts().await.len(), 1, "a storm raises one alert");
    h.clock.advance(Duration::from_secs(301));
    h.drain(&worker).await;
    let alerts = h.alerts().await;
    assert_eq!(
        alerts.len(),
        2,
        "the held-back count is reported after the window"
    );
    assert_eq!(alerts[1].count, 9);
}

#[tokio::test(start_paused = true)]
async fn long_handlers_keep_their_lease_and_shutdown_is_graceful() {
    struct Slow;
    #[async_trait::async_trait]
    impl jobs_consumers::Handler<jobs_adapter_memory::MemoryWorkTx> for Slow {
        type Data = serde_json::Value;
        async fn handle(
            &self,
            _: jobs_consumers::Job<serde_json::Value>,
            tx: &mut jobs_adapter_memory::MemoryWorkTx,
        ) -> Result<(), JobError> {
            tokio::time::sleep(Duration::from_secs(10)).await;
            tx.record_effect("slow");
            Ok(())
        }
    }
    let h = Harness::new();
    let worker = Arc::new(
        jobs_consumers::Worker::<MemoryStore>::builder(
            ConsumerName::try_from("test.consumer").expect("valid"),
            h.name.clone(),
            Arc::new(h.transport.clone()),
            Arc::new(h.store.clone()),
            Arc::new(h.store.clone()),
        )
        .handler(KIND.parse().expect("valid"), Slow)
        .clock(Arc::new(h.clock.clone()))
        .lease(Duration::from_secs(3))
        .build()
        .expect("valid"),
    );
    h.publish(1).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(()).expect("worker listening");
    running.await.expect("the worker stops");
    assert_eq!(
        h.store.effects(),
        ["slow"],
        "the in-flight job finished within the grace"
    );
    assert!(h.transport.extensions() >= 3, "the lease was extended");
    assert_eq!(depth(&h).await, 0);
}

#[tokio::test]
async fn the_cleanup_job_purges_old_processed_rows_in_batches() {
    use jobs_consumers::{CLEANUP_KIND, ProcessedCleanup};
    let h = Harness::new();
    let worker = h.worker(ok);
    let mut old = vec![];
    for n in 0..25 {
        old.push(h.publish(n).await);
    }
    h.drain(&worker).await;
    h.clock.advance(Duration::from_secs(2 * 24 * 3600));
    let recent = h.publish(100).await;
    h.drain(&worker).await;

    let cleanup = ProcessedCleanup::new(Arc::new(h.store.clone()))
        .clock(Arc::new(h.clock.clone()))
        .ttl(Duration::from_secs(24 * 3600))
        .below_floor()
        .batch(10);
    let (maintenance, cleaner) = h.cleaner(cleanup);
    let job = jobs_testkit::fixtures::envelope_with(1, CLEANUP_KIND, serde_json::json!({}));
    h.queue
        .publish(&maintenance, &job, PublishOptions::default())
        .await
        .expect("publish");
    assert_eq!(
        cleaner.run_once().await.expect("receive"),
        [Outcome::Processed]
    );

    let consumer = ConsumerName::try_from("test.consumer").expect("valid");
    for envelope in &old {
        assert!(
            !h.store
                .is_processed(envelope.job_id, &consumer)
                .await
                .expect("query"),
            "a row past the TTL survived"
        );
    }
    assert!(
        h.store
            .is_processed(recent.job_id, &consumer)
            .await
            .expect("query")
    );
    assert_eq!(
        h.store.effects().len(),
        26,
        "business effects are untouched"
    );
}

/// A consuming side that tells the test when the worker starts waiting for work.
struct Watched {
    inner: Arc<dyn jobs_core::ConsumerPort>,
    waiting: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl jobs_core::PullPort for Watched {
    async fn receive(
        &self,
        q: &jobs_core::QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        self.inner.receive(q, max, lease).await
    }

    async fn wait_for_work(&self, q: &jobs_core::QueueName) {
        self.waiting.notify_one();
        self.inner.wait_for_work(q).await;
    }
}

#[async_trait::async_trait]
impl jobs_core::SettlePort for Watched {
    async fn ack(&self, lease: &jobs_core::Lease) -> Result<(), jobs_core::QueueError> {
        self.inner.ack(lease).await
    }

    async fn retry_at(
        &self,
        lease: &jobs_core::Lease,
        at: std::time::SystemTime,
    ) -> Result<(), jobs_core::QueueError> {
        self.inner.retry_at(lease, at).await
    }

    async fn defer(
        &self,
        lease: &jobs_core::Lease,
        until: std::time::SystemTime,
    ) -> Result<(), jobs_core::QueueError> {
        self.inner.defer(lease, until).await
    }

    async fn extend(
        &self,
        lease: &jobs_core::Lease,
        by: Duration,
    ) -> Result<jobs_core::Lease, jobs_core::QueueError> {
        self.inner.extend(lease, by).await
    }
}

/// Runs a worker polling hourly over `inner`, publishes job 1 once the worker waits on an
/// empty queue, and says whether its effect shows within `limit`. Time is paused, so tokio
/// jumps to the next timer whenever every task is idle: a minute's limit can only be met by
/// a wake-up, never by the hourly poll, and no real time passes either way.
async fn effect_of_a_publish_to_an_idle_worker(
    h: &Harness,
    inner: Arc<dyn jobs_core::ConsumerPort>,
    limit: Duration,
) -> bool {
    let waiting = Arc::new(tokio::sync::Notify::new());
    let transport = Watched {
        inner,
        waiting: waiting.clone(),
    };
    let worker = Arc::new(
        jobs_consumers::Worker::<MemoryStore>::builder(
            ConsumerName::try_from("test.consumer").expect("valid"),
            h.name.clone(),
            Arc::new(transport),
            Arc::new(h.store.clone()),
            Arc::new(h.store.clone()),
        )
        .handler(
            KIND.parse().expect("valid"),
            crate::harness::Scripted {
                script: ok,
                calls: h.calls.clone(),
            },
        )
        .clock(Arc::new(h.clock.clone()))
        .poll_interval(Duration::from_secs(3600))
        .build()
        .expect("valid"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(limit, waiting.notified())
        .await
        .expect("the worker waits for work once the queue is empty");
    assert!(h.store.effects().is_empty(), "the queue was empty");
    h.publish(1).await;
    let started = tokio::time::Instant::now();
    let mut seen = false;
    while !seen && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_secs(1)).await;
        seen = h.store.effects() == ["n=1"];
    }
    stop.send(()).expect("worker listening");
    running.await.expect("the worker stops");
    seen
}

#[tokio::test(start_paused = true)]
async fn an_idle_worker_is_woken_by_a_publish_long_before_its_poll() {
    let h = Harness::new();
    assert!(
        effect_of_a_publish_to_an_idle_worker(
            &h,
            Arc::new(h.queue.clone()),
            Duration::from_secs(60)
        )
        .await,
        "the memory queue's wake-up did not start the job before the hourly poll"
    );
    assert_eq!(h.calls(1), 1);
}

#[tokio::test(start_paused = true)]
async fn without_wake_ups_only_the_poll_finds_the_job() {
    // `LosesAcks` keeps the port's default wait, which never resolves.
    let h = Harness::new();
    let silent = Arc::new(h.transport.clone());
    assert!(
        !effect_of_a_publish_to_an_idle_worker(&h, silent, Duration::from_secs(60)).await,
        "nothing but the poll can start the job here"
    );
    let h = Harness::new();
    let silent = Arc::new(h.transport.clone());
    assert!(
        effect_of_a_publish_to_an_idle_worker(&h, silent, Duration::from_secs(7200)).await,
        "the hourly poll found the job"
    );
}

/// A worker of the harness's queue and kind with `policy` as its queue's override.
fn worker_with_policy(
    h: &Harness,
    script: crate::harness::Script,
    policy: jobs_consumers::QueuePolicy,
) -> Result<jobs_consumers::Worker<MemoryStore>, jobs_consumers::WorkerError> {
    jobs_consumers::Worker::builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.transport.clone()),
        Arc::new(h.store.clone()),
        Arc::new(h.store.clone()),
    )
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script,
            calls: h.calls.clone(),
        },
    )
    .policy(policy)
    .clock(Arc::new(h.clock.clone()))
    .build()
}

#[tokio::test]
async fn a_per_queue_override_replaces_the_standard_policy() {
    let h = Harness::new();
    let fast = jobs_consumers::RetryPolicy::new(2, Duration::from_secs(1), Duration::from_secs(4))
        .expect("valid");
    let policy = jobs_consumers::QueuePolicy::new(h.name.clone(), fast, "the PSP retries itself")
        .expect("has a rationale");
    let worker = worker_with_policy(&h, always_retry, policy).expect("the worker's own queue");
    h.publish(1).await;
    let start = jobs_core::Clock::now(&h.clock);
    let [Outcome::Retrying { at }] = h.drain(&worker).await[..] else {
        panic!("the first failure is retried");
    };
    let delay = at.duration_since(start).expect("in the future");
    assert!(
        delay >= Duration::from_millis(500) && delay <= Duration::from_secs(1),
        "{delay:?}: the override's base is 1 s, the standard's 30 s"
    );
    h.clock.advance(delay);
    assert!(
        matches!(
            h.drain(&worker).await[..],
            [Outcome::DeadLettered {
                reason: DeadReason::Exhausted,
                ..
            }]
        ),
        "the override allows two attempts, the standard five"
    );
    assert_eq!(h.calls(1), 2);
}

#[tokio::test]
async fn an_override_for_another_queue_is_refused_at_build() {
    let h = Harness::new();
    let other: jobs_core::QueueName = "test.other".parse().expect("valid");
    let policy =
        jobs_consumers::QueuePolicy::new(other.clone(), Default::default(), "for another queue")
            .expect("has a rationale");
    match worker_with_policy(&h, ok, policy) {
        Err(jobs_consumers::WorkerError::PolicyForOtherQueue { queue, policy }) => {
            assert_eq!((queue, policy), (h.name.clone(), other));
        }
        other => panic!("{other:?}"),
    }
}

/// A store that cannot open a transaction.
struct DownStore;

#[async_trait::async_trait]
impl jobs_core::WorkStore for DownStore {
    type Tx = jobs_adapter_memory::MemoryWorkTx;

    async fn begin(&self) -> Result<Self::Tx, jobs_core::StoreError> {
        Err(jobs_core::StoreError::unavailable("the database restarts"))
    }
}

#[tokio::test]
async fn a_store_outage_defers_the_job_into_the_future_without_spending_an_attempt() {
    let h = Harness::new();
    let worker = jobs_consumers::Worker::builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.transport.clone()),
        Arc::new(DownStore),
        Arc::new(h.store.clone()),
    )
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script: ok,
            calls: h.calls.clone(),
        },
    )
    .clock(Arc::new(h.clock.clone()))
    .build()
    .expect("valid");
    h.publish(1).await;
    let now = jobs_core::Clock::now(&h.clock);
    let [Outcome::Deferred { until }] = worker.run_once().await.expect("receive")[..] else {
        panic!("a store outage defers");
    };
    assert_eq!(
        until,
        now + Duration::from_secs(30),
        "the policy's first ceiling"
    );
    assert!(
        worker.run_once().await.expect("receive").is_empty(),
        "hidden until then"
    );
    h.clock.advance(Duration::from_secs(30));
    let again = jobs_core::PullPort::receive(&h.queue, &h.name, 1, Duration::from_secs(60))
        .await
        .expect("receive");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 1, "the outage spent no attempt");
    assert_eq!(h.calls(1), 0);
    // An outage that lasts backs off: twice as long for each failure in a row.
    let now = jobs_core::Clock::now(&h.clock);
    let delivery = again.into_iter().next().expect("one");
    let Outcome::Deferred { until } = worker.process(delivery).await else {
        panic!("deferred again");
    };
    assert_eq!(until, now + Duration::from_secs(60), "the second ceiling");
}

/// A worker of the harness's queue and kind built from `builder`'s first steps.
fn scripted(
    h: &Harness,
    builder: jobs_consumers::WorkerBuilder<MemoryStore>,
) -> jobs_consumers::Worker<MemoryStore> {
    build_scripted(h, builder).expect("valid")
}

/// [`scripted`], or why the build refused.
fn build_scripted(
    h: &Harness,
    builder: jobs_consumers::WorkerBuilder<MemoryStore>,
) -> Result<jobs_consumers::Worker<MemoryStore>, jobs_consumers::WorkerError> {
    builder
        .handler(
            KIND.parse().expect("valid"),
            crate::harness::Scripted {
                script: ok,
                calls: h.calls.clone(),
            },
        )
        .clock(Arc::new(h.clock.clone()))
        .build()
}

#[tokio::test]
async fn a_push_worker_has_nothing_to_pull_and_settles_what_it_is_given() {
    let h = Harness::new();
    let worker = scripted(
        &h,
        jobs_consumers::Worker::push_builder(
            ConsumerName::try_from("test.consumer").expect("valid"),
            h.name.clone(),
            Arc::new(h.queue.clone()),
            Arc::new(h.store.clone()),
            Arc::new(h.store.clone()),
        ),
    );
    h.publish(1).await;
    let refused = worker.run_once().await.expect_err("nothing to pull");
    assert!(
        refused.to_string().contains("push_builder"),
        "says why: {refused}"
    );
    let worker = Arc::new(worker);
    tokio::time::timeout(
        Duration::from_secs(5),
        worker.clone().run(std::future::pending()),
    )
    .await
    .expect("run returns at once instead of polling nothing");
    assert_eq!(depth(&h).await, 1, "nothing was fetched");
    // Its transport hands it a delivery; it settles through the port it was built with.
    let delivery = jobs_core::PullPort::receive(&h.queue, &h.name, 1, Duration::from_secs(60))
        .await
        .expect("receive")
        .pop()
        .expect("one");
    assert_eq!(worker.process(delivery).await, Outcome::Processed);
    assert_eq!(depth(&h).await, 0, "acked through the settle side");
}

/// A pull side that counts its fetches and passes them on.
struct CountsFetches {
    inner: jobs_adapter_memory::MemoryQueue,
    fetches: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl jobs_core::PullPort for CountsFetches {
    async fn receive(
        &self,
        queue: &jobs_core::QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.receive(queue, max, lease).await
    }
}

#[tokio::test]
async fn a_pull_layer_fetches_and_the_transport_settles() {
    let h = Harness::new();
    let layer = Arc::new(CountsFetches {
        inner: h.queue.clone(),
        fetches: Default::default(),
    });
    let worker = scripted(
        &h,
        jobs_consumers::Worker::builder(
            ConsumerName::try_from("test.consumer").expect("valid"),
            h.name.clone(),
            Arc::new(h.transport.clone()),
            Arc::new(h.store.clone()),
            Arc::new(h.store.clone()),
        )
        .pull(layer.clone()),
    );
    for n in 0..3 {
        h.publish(n).await;
    }
    assert_eq!(h.drain(&worker).await, vec![Outcome::Processed; 3]);
    assert!(layer.fetches.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert_eq!(depth(&h).await, 0, "acked through the transport");
}

/// A kind bound to its data type once ([`jobs_core::JobKind`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct InvoiceIssued {
    invoice: i64,
}

impl jobs_core::JobKind for InvoiceIssued {
    const KIND: &'static str = "billing.invoice_issued";
}

/// Books the invoice in the work transaction.
struct BookInvoice;

#[async_trait::async_trait]
impl jobs_consumers::Handler<jobs_adapter_memory::MemoryWorkTx> for BookInvoice {
    type Data = InvoiceIssued;

    async fn handle(
        &self,
        job: jobs_consumers::Job<InvoiceIssued>,
        tx: &mut jobs_adapter_memory::MemoryWorkTx,
    ) -> Result<(), JobError> {
        tx.record_effect(format!("invoice {}", job.envelope.data.invoice));
        Ok(())
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct BadlyNamed;

impl jobs_core::JobKind for BadlyNamed {
    const KIND: &'static str = "Not A Kind";
}

struct Nothing;

#[async_trait::async_trait]
impl jobs_consumers::Handler<jobs_adapter_memory::MemoryWorkTx> for Nothing {
    type Data = BadlyNamed;

    async fn handle(
        &self,
        _: jobs_consumers::Job<BadlyNamed>,
        _: &mut jobs_adapter_memory::MemoryWorkTx,
    ) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test]
async fn typed_jobs_are_published_and_handled_by_their_data_type() {
    let h = Harness::new();
    let worker = h.builder().job(BookInvoice).build().expect("valid");
    let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
        .parse()
        .expect("a tenant");
    let job = jobs_core::Envelope::of(
        tenant,
        jobs_core::CorrelationId::generate(),
        &InvoiceIssued { invoice: 42 },
    )
    .expect("serialises");
    h.queue
        .publish(&h.name, &job, PublishOptions::default())
        .await
        .expect("publish");
    assert_eq!(h.drain(&worker).await, [Outcome::Processed]);
    assert_eq!(h.store.effects(), ["invoice 42"]);

    let refused = h
        .builder()
        .job(Nothing)
        .build()
        .expect_err("an invalid kind");
    assert!(
        refused
            .to_string()
            .contains("`Not A Kind`, the JobKind::KIND of"),
        "{refused}"
    );
}

/// Fairness is asked of the pull side when the worker is built: a transport that shares its
/// queue out gets it, and a layer or a push transport that cannot fails the build, naming the
/// setting, instead of serving one tenant's backlog first at run time.
#[tokio::test]
async fn fairness_is_granted_by_the_pull_side_or_the_build_fails() {
    let h = Harness::new();
    let fair = jobs_core::TenantFairness::round_robin();
    scripted(&h, h.builder().fair(fair));
    for n in 0..4 {
        h.publish(n).await;
    }
    let light = jobs_testkit::fixtures::envelope_with(2, KIND, serde_json::json!({ "n": 9 }));
    h.queue
        .publish(&h.name, &light, jobs_core::PublishOptions::default())
        .await
        .expect("publish");
    let first_two = jobs_core::PullPort::receive(&h.queue, &h.name, 2, Duration::from_secs(30))
        .await
        .expect("receive");
    let tenants: std::collections::HashSet<_> = first_two
        .iter()
        .map(|d| {
            jobs_core::Envelope::decode(&d.payload)
                .expect("an envelope")
                .tenant_id
        })
        .collect();
    assert_eq!(tenants.len(), 2, "the later tenant is served in turn");

    let layer = Arc::new(CountsFetches {
        inner: h.queue.clone(),
        fetches: Default::default(),
    });
    let refused = build_scripted(&h, h.builder().pull(layer).fair(fair))
        .map(|_| ())
        .expect_err("a layer that does not forward fairness is refused");
    let shown = refused.to_string();
    assert!(
        shown.contains("fairness") && shown.contains("oldest first only"),
        "{shown}"
    );

    let push = jobs_consumers::Worker::push_builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.queue.clone()),
        Arc::new(h.store.clone()),
        Arc::new(h.store.clone()),
    );
    let push = build_scripted(&h, push.fair(fair))
        .map(|_| ())
        .expect_err("a push transport is refused");
    assert!(push.to_string().contains("pull transport"), "{push}");
}

#[tokio::test]
async fn a_data_error_names_the_path_and_the_type_and_quotes_no_value_unless_asked() {
    let last_error = |error_values: bool| async move {
        let h = Harness::new();
        let mut config = jobs_consumers::WorkerConfig::default();
        config.error_values = error_values;
        let worker = h.worker_with(ok, config);
        let mut wrong = serde_json::to_value(h.publish_unpublished(1)).expect("serialises");
        wrong["data"] = serde_json::json!({ "n": "<script>alert(1)</script>" });
        let bytes = serde_json::to_vec(&wrong).expect("serialises");
        h.queue
            .publish_bytes(&h.name, bytes, &PublishOptions::default());
        h.drain(&worker).await;
        let letters = h
            .store
            .list(&DeadLetterFilter::default())
            .await
            .expect("list");
        assert_eq!(letters.len(), 1);
        letters[0].letter.last_error.clone()
    };
    let quiet = last_error(false).await;
    assert!(
        quiet.contains("invalid type: string, expected u64 at `data.n`"),
        "{quiet}"
    );
    assert!(!quiet.contains("script"), "a value leaked: {quiet}");
    let loud = last_error(true).await;
    assert!(loud.contains("<script>alert(1)</script>"), "{loud}");
}

/// The harness's memory queue, as a transport that stores a tenant beside each message (as
/// the PostgreSQL queue does for a row written by SQL): every delivery says `tenant`.
struct StoresTenant(jobs_adapter_memory::MemoryQueue, jobs_core::TenantId);

#[async_trait::async_trait]
impl jobs_core::PullPort for StoresTenant {
    async fn receive(
        &self,
        q: &jobs_core::QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        let got = self.0.receive(q, max, lease).await?;
        Ok(got
            .into_iter()
            .map(|d| d.with_tenant(Some(self.1)))
            .collect())
    }
}

#[async_trait::async_trait]
impl jobs_core::SettlePort for StoresTenant {
    async fn ack(&self, lease: &jobs_core::Lease) -> Result<(), jobs_core::QueueError> {
        self.0.ack(lease).await
    }
    async fn retry_at(
        &self,
        lease: &jobs_core::Lease,
        at: std::time::SystemTime,
    ) -> Result<(), jobs_core::QueueError> {
        self.0.retry_at(lease, at).await
    }
    async fn defer(
        &self,
        lease: &jobs_core::Lease,
        until: std::time::SystemTime,
    ) -> Result<(), jobs_core::QueueError> {
        self.0.defer(lease, until).await
    }
    async fn extend(
        &self,
        lease: &jobs_core::Lease,
        by: Duration,
    ) -> Result<jobs_core::Lease, jobs_core::QueueError> {
        self.0.extend(lease, by).await
    }
}

#[tokio::test]
async fn a_poison_letter_keeps_the_tenant_its_transport_stored_not_the_one_it_claims() {
    let h = Harness::new();
    let stored = jobs_testkit::fixtures::tenant(7);
    let worker = jobs_consumers::Worker::builder(
        ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(StoresTenant(h.queue.clone(), stored)),
        Arc::new(h.store.clone()),
        Arc::new(h.store.clone()),
    )
    .clock(Arc::new(h.clock.clone()))
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script: ok,
            calls: h.calls.clone(),
        },
    )
    .build()
    .expect("valid");
    let mut claims_another = serde_json::to_value(h.publish_unpublished(1)).expect("serialises");
    claims_another["tenant_id"] = serde_json::json!(jobs_testkit::fixtures::tenant(8).to_string());
    claims_another["job_id"] = serde_json::json!("not-a-uuid");
    for bytes in [
        b"not an envelope".to_vec(),
        serde_json::to_vec(&claims_another).expect("serialises"),
    ] {
        h.queue
            .publish_bytes(&h.name, bytes, &PublishOptions::default());
    }
    h.drain(&worker).await;
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    assert_eq!(letters.len(), 2);
    assert!(
        letters.iter().all(|l| l.letter.tenant_id == Some(stored)),
        "{:?}",
        letters
            .iter()
            .map(|l| l.letter.tenant_id)
            .collect::<Vec<_>>()
    );
}

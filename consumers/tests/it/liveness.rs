//! A worker stays alive whatever its handlers do: a hung handler is stopped at its time limit,
//! a handler whose lease is lost is stopped.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryStore, MemoryWorkTx};
use jobs_consumers::{
    DeadReason, Handler, Job, JobError, Outcome, QueuePolicy, RetryPolicy, Worker, WorkerConfig,
};
use jobs_core::{DeadLetterFilter, DeadLetterStore};

use crate::harness::{Harness, KIND};

/// Never finishes (it awaits forever), like a handler stuck on a call without a timeout.
struct Hangs;

#[async_trait]
impl Handler<MemoryWorkTx> for Hangs {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        _: Job<serde_json::Value>,
        _: &mut MemoryWorkTx,
    ) -> Result<(), JobError> {
        std::future::pending().await
    }
}

/// A worker of the harness's queue running [`Hangs`], two attempts per job.
fn hanging(h: &Harness, config: WorkerConfig, per_kind: Option<Duration>) -> Worker<MemoryStore> {
    let policy = QueuePolicy::new(
        h.name.clone(),
        RetryPolicy::new(2, Duration::from_secs(1), Duration::from_secs(1)).expect("valid"),
        "two attempts are enough to see a timeout retried and then dead-lettered",
    )
    .expect("valid");
    let mut builder = h
        .builder()
        .handler(KIND.parse().expect("valid"), Hangs)
        .policy(policy)
        .config(config);
    if let Some(limit) = per_kind {
        builder = builder.timeout(KIND.parse().expect("valid"), limit);
    }
    builder.build().expect("valid")
}

async fn last_errors(h: &Harness) -> Vec<String> {
    h.store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list")
        .into_iter()
        .map(|letter| letter.letter.last_error)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_hung_handler_is_stopped_at_its_time_limit_retried_then_dead_lettered() {
    let h = Harness::new();
    let mut config = WorkerConfig::default();
    config.handler_timeout = Duration::from_secs(2);
    let worker = hanging(&h, config, None);
    h.publish(1).await;
    let started = tokio::time::Instant::now();
    let [Outcome::Retrying { at }] = h.drain(&worker).await[..] else {
        panic!("the timed-out job is retried");
    };
    assert!(
        started.elapsed() >= Duration::from_secs(2) && started.elapsed() < Duration::from_secs(20),
        "stopped at its limit, well before the lease's first extension: {:?}",
        started.elapsed()
    );
    h.clock.advance(
        at.duration_since(jobs_core::Clock::now(&h.clock))
            .unwrap_or_default(),
    );
    let outcomes = h.drain(&worker).await;
    assert!(
        matches!(
            outcomes[..],
            [Outcome::DeadLettered {
                reason: DeadReason::Exhausted,
                ..
            }]
        ),
        "{outcomes:?}"
    );
    let errors = last_errors(&h).await;
    assert!(
        errors.len() == 1 && errors[0].contains("timed out after 2s"),
        "the dead letter says it timed out: {errors:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_kind_s_own_time_limit_replaces_the_worker_s() {
    let h = Harness::new();
    let worker = hanging(
        &h,
        WorkerConfig::default(),
        Some(Duration::from_millis(300)),
    );
    h.publish(1).await;
    let started = tokio::time::Instant::now();
    assert!(matches!(
        h.drain(&worker).await[..],
        [Outcome::Retrying { .. }]
    ));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the kind's 300 ms, not the default minute: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_whose_lease_is_lost_is_stopped_and_settles_nothing() {
    let h = Harness::new();
    let mut config = WorkerConfig::default();
    config.lease = Duration::from_secs(3);
    config.handler_timeout = Duration::from_secs(3_600);
    let worker = Arc::new(hanging(&h, config, None));
    h.publish(1).await;
    let running = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await.expect("receive") }
    });
    tokio::task::yield_now().await;
    // The lease expires (the worker froze, say) and another worker takes the job over.
    h.clock.advance(Duration::from_secs(10));
    let taken = jobs_core::PullPort::receive(&h.queue, &h.name, 1, Duration::from_secs(60))
        .await
        .expect("receive");
    assert_eq!(taken.len(), 1, "the other worker has it");
    let outcomes = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the next extension stops the handler")
        .expect("no panic");
    let [Outcome::Unsettled { error }] = &outcomes[..] else {
        panic!("{outcomes:?}");
    };
    assert!(error.contains("lease was lost"), "{error}");
    jobs_core::SettlePort::ack(&h.queue, &taken[0].lease)
        .await
        .expect("the new holder still settles it");
}

/// Waits for its cancellation, then asks to be retried; counts the cancellations its task saw
/// by polling [`Cancellation::is_cancelled`](jobs_consumers::Cancellation::is_cancelled),
/// after seeing it clear when the job began.
struct Heeds(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Handler<MemoryWorkTx> for Heeds {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: Job<serde_json::Value>,
        _: &mut MemoryWorkTx,
    ) -> Result<(), JobError> {
        // A task of its own, as handlers start for work elsewhere: it sees the signal even
        // when the handler itself is dropped.
        let (seen, cancellation) = (self.0.clone(), job.cancellation.clone());
        if cancellation.is_cancelled() {
            return Err(JobError::permanent("cancelled before it began"));
        }
        tokio::spawn(async move {
            while !cancellation.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        job.cancellation.cancelled().await;
        Err(JobError::retry("stopped when told to"))
    }
}

fn heeding(
    h: &Harness,
    config: WorkerConfig,
    seen: &Arc<std::sync::atomic::AtomicUsize>,
) -> Arc<Worker<MemoryStore>> {
    Arc::new(
        h.builder()
            .handler(KIND.parse().expect("valid"), Heeds(seen.clone()))
            .config(config)
            .build()
            .expect("valid"),
    )
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_tells_handlers_to_stop_before_it_abandons_them() {
    let h = Harness::new();
    let seen = Arc::default();
    let mut config = WorkerConfig::default();
    config.shutdown_grace = Duration::from_secs(8);
    let worker = heeding(&h, config, &seen);
    h.publish(1).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = tokio::time::Instant::now();
    stop.send(()).expect("running");
    running.await.expect("stops");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(8),
        "told a quarter of the grace before its end, and settled before it: {took:?}"
    );
    let depth = jobs_core::QueueDepth::depth(&h.queue, &h.name)
        .await
        .expect("depth");
    assert_eq!(
        (depth.in_flight, depth.delayed),
        (0, 1),
        "the stopped job was retried, not left leased: {depth:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_handler_s_tasks_are_told_to_stop() {
    let h = Harness::new();
    let seen = Arc::default();
    let mut config = WorkerConfig::default();
    config.handler_timeout = Duration::from_secs(2);
    let worker = heeding(&h, config, &seen);
    h.publish(1).await;
    // Nothing cancels this handler but its time limit.
    assert!(matches!(
        h.drain(&worker).await[..],
        [Outcome::Retrying { .. }]
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An alerting service that never answers (down, behind a firewall that drops packets).
struct NeverAnswers;

#[async_trait]
impl jobs_core::Alerter for NeverAnswers {
    async fn alert(&self, _: &jobs_core::Alert) -> Result<(), jobs_core::AlertError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn an_alerter_that_never_answers_holds_up_no_ack_and_no_receive() {
    let h = Harness::new();
    let alerts = jobs_consumers::CoalescingAlerter::new(
        Arc::new(NeverAnswers),
        Arc::new(h.clock.clone()),
        Duration::from_secs(300),
    );
    let worker = h
        .builder()
        .handler(
            KIND.parse().expect("valid"),
            crate::harness::Scripted {
                script: |_| Err(JobError::permanent("invoice 42 does not exist")),
                calls: h.calls.clone(),
            },
        )
        .alerts(alerts)
        .build()
        .expect("valid");
    // More windows than the alert buffer holds: every one of them has an alert due, and the
    // sending task is stuck on the first.
    let windows = jobs_consumers::ALERT_BUFFER + 5;
    for n in 0..windows {
        h.publish(n as u64).await;
        h.publish(1_000 + n as u64).await;
        let outcomes = tokio::time::timeout(Duration::from_secs(60), h.drain(&worker))
            .await
            .expect("nothing waits for the alerter");
        assert_eq!(outcomes.len(), 2);
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, Outcome::DeadLettered { .. })),
            "{outcomes:?}"
        );
        h.clock.advance(Duration::from_secs(301));
    }
    let depth = jobs_core::QueueDepth::depth(&h.queue, &h.name)
        .await
        .expect("depth");
    assert_eq!(depth.total(), 0, "every dead letter acked");
    let all = DeadLetterFilter {
        limit: 1_000,
        ..Default::default()
    };
    let letters = h.store.list(&all).await.expect("list");
    assert_eq!(letters.len(), 2 * windows);
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_by_name() {
    let h = Harness::new();
    let build = |config: WorkerConfig, per_kind: Option<Duration>| {
        let mut builder = h
            .builder()
            .handler(KIND.parse().expect("valid"), Hangs)
            .config(config);
        if let Some(limit) = per_kind {
            builder = builder.timeout(KIND.parse().expect("valid"), limit);
        }
        builder.build().map(|_| ())
    };
    type Breaks = fn(&mut WorkerConfig);
    let cases: [(&str, Breaks); 4] = [
        ("concurrency", |c| c.concurrency = 0),
        ("lease", |c| c.lease = Duration::from_nanos(3)),
        ("handler_timeout", |c| c.handler_timeout = Duration::ZERO),
        ("poll_interval", |c| c.poll_interval = Duration::ZERO),
    ];
    for (field, break_it) in cases {
        let mut config = WorkerConfig::default();
        break_it(&mut config);
        match build(config, None) {
            Err(e @ jobs_consumers::WorkerError::Config { .. }) => {
                assert!(e.to_string().starts_with(field), "{field}: {e}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    let zero = build(WorkerConfig::default(), Some(Duration::ZERO));
    assert!(
        matches!(&zero, Err(e) if e.to_string().contains("timeout of `test.job`")),
        "{zero:?}"
    );
    assert!(build(WorkerConfig::default(), Some(Duration::from_secs(5))).is_ok());
}

#[test]
fn the_lease_may_be_one_second_to_a_day_and_a_pool_is_sized_from_the_concurrency() {
    let h = Harness::new();
    for (lease, accepted) in [
        (Duration::from_millis(999), false),
        (Duration::from_secs(1), true),
        (Duration::from_secs(86_400), true),
        (Duration::from_secs(86_401), false),
    ] {
        let mut config = WorkerConfig::default();
        config.lease = lease;
        let built = h
            .builder()
            .handler(KIND.parse().expect("valid"), Hangs)
            .config(config)
            .build();
        assert_eq!(built.is_ok(), accepted, "a lease of {lease:?}");
    }
    let mut config = WorkerConfig::default();
    config.concurrency = 7;
    // One connection per job, one for fetching, one for settlements, one for wake-ups.
    assert_eq!(config.connections(), 10);
    let builder = h.builder().config(config);
    assert_eq!(builder.settings().concurrency, 7, "what was set so far");
    let worker = builder
        .handler(KIND.parse().expect("valid"), Hangs)
        .build()
        .expect("valid");
    assert!(worker.pulls(), "built with a transport to pull from");
    let shown = format!("{worker:?}");
    assert!(
        shown.contains("Worker") && shown.contains("test.jobs") && shown.contains("test.consumer"),
        "{shown}"
    );
    let pushed = jobs_consumers::Worker::push_builder(
        jobs_core::ConsumerName::try_from("test.pushed").expect("valid"),
        h.name.clone(),
        Arc::new(h.queue.clone()),
        Arc::new(h.store.clone()),
        Arc::new(h.store),
    )
    .handler(KIND.parse().expect("valid"), Hangs)
    .build()
    .expect("valid");
    assert!(!pushed.pulls(), "deliveries are pushed to it");
}

#[tokio::test]
async fn absurd_times_are_refused_by_name_never_overflowed() {
    let h = Harness::new();
    let publish = jobs_core::QueuePort::publish(
        &h.queue,
        &h.name,
        &h.publish_unpublished(1),
        jobs_core::PublishOptions::default().delay(Duration::MAX),
    )
    .await;
    assert!(
        matches!(&publish, Err(e @ jobs_core::QueueError::Rejected { .. }) if e.to_string().contains("delay")),
        "{publish:?}"
    );
    let receive = jobs_core::PullPort::receive(&h.queue, &h.name, 1, Duration::MAX).await;
    assert!(
        matches!(&receive, Err(e) if e.to_string().contains("lease")),
        "{receive:?}"
    );
    assert!(matches!(
        RetryPolicy::new(3, Duration::from_secs(1), Duration::MAX),
        Err(jobs_consumers::PolicyError::CapTooLong { .. })
    ));
    let built = h
        .builder()
        .handler(KIND.parse().expect("valid"), Hangs)
        .lease(Duration::MAX)
        .build();
    assert!(
        matches!(&built, Err(e) if e.to_string().starts_with("lease")),
        "{built:?}"
    );
}

#[tokio::test]
async fn a_delivery_of_another_queue_is_refused_unsettled() {
    let h = Harness::new();
    let worker = hanging(&h, WorkerConfig::default(), None);
    let other: jobs_core::QueueName = "test.other".parse().expect("valid");
    let envelope = h.publish_unpublished(1);
    jobs_core::QueuePort::publish(&h.queue, &other, &envelope, Default::default())
        .await
        .expect("publish");
    let delivery = jobs_core::PullPort::receive(&h.queue, &other, 1, Duration::from_secs(60))
        .await
        .expect("receive")
        .pop()
        .expect("one");
    let Outcome::Unsettled { error } = worker.process(delivery).await else {
        panic!("refused");
    };
    assert!(error.contains("`test.other`"), "{error}");
    let depth = jobs_core::QueueDepth::depth(&h.queue, &other)
        .await
        .expect("depth");
    assert_eq!(
        depth.in_flight, 1,
        "left leased, to come back to its own worker"
    );
}

#[tokio::test]
async fn a_cleanup_job_s_ttl_is_bounded_both_ways() {
    use jobs_consumers::{CLEANUP_KIND, ProcessedCleanup};
    let h = Harness::new();
    let cleanup = ProcessedCleanup::new(Arc::new(h.store.clone())).clock(Arc::new(h.clock.clone()));
    let (maintenance, cleaner) = h.cleaner(cleanup);
    for ttl in [0, u64::MAX] {
        let job = jobs_testkit::fixtures::envelope_with(
            1,
            CLEANUP_KIND,
            serde_json::json!({ "ttl_secs": ttl }),
        );
        jobs_core::QueuePort::publish(&h.queue, &maintenance, &job, Default::default())
            .await
            .expect("publish");
        let outcomes = cleaner.run_once().await.expect("receive");
        match ttl {
            0 => assert!(
                matches!(
                    outcomes[..],
                    [Outcome::DeadLettered {
                        reason: DeadReason::Permanent,
                        ..
                    }]
                ),
                "a zero TTL would purge every row: {outcomes:?}"
            ),
            _ => assert_eq!(outcomes, [Outcome::Processed], "a huge TTL purges nothing"),
        }
    }
    let errors = last_errors(&h).await;
    assert!(errors[0].contains("`ttl_secs`"), "{errors:?}");
}

/// The memory store, ten seconds slow to begin a transaction, like a pool with no connection
/// free.
struct SlowBegin(MemoryStore);

#[async_trait]
impl jobs_core::WorkStore for SlowBegin {
    type Tx = MemoryWorkTx;

    async fn begin(&self) -> Result<MemoryWorkTx, jobs_core::StoreError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        self.0.begin().await
    }
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_kept_while_the_job_waits_for_a_connection() {
    let h = Harness::new();
    let worker = Worker::builder(
        jobs_core::ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.transport.clone()),
        Arc::new(SlowBegin(h.store.clone())),
        Arc::new(h.store.clone()),
    )
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script: |_| Ok(()),
            calls: h.calls.clone(),
        },
    )
    .clock(Arc::new(h.clock.clone()))
    .lease(Duration::from_secs(3))
    .build()
    .expect("valid");
    h.publish(1).await;
    assert_eq!(
        worker.run_once().await.expect("receive"),
        [Outcome::Processed]
    );
    assert!(
        h.transport.extensions() >= 3,
        "extended every second of the ten the begin took: {}",
        h.transport.extensions()
    );
}

/// The memory store, failing to begin while `down` is set, as a database that went away.
struct Outage {
    store: MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl jobs_core::WorkStore for Outage {
    type Tx = MemoryWorkTx;

    async fn begin(&self) -> Result<MemoryWorkTx, jobs_core::StoreError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(jobs_core::StoreError::unavailable("connection refused"));
        }
        self.store.begin().await
    }
}

#[tokio::test]
async fn store_outages_back_off_longer_each_time_and_start_over_once_it_works() {
    let h = Harness::new();
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let worker = Worker::builder(
        jobs_core::ConsumerName::try_from("test.consumer").expect("valid"),
        h.name.clone(),
        Arc::new(h.queue.clone()),
        Arc::new(Outage {
            store: h.store.clone(),
            down: down.clone(),
        }),
        Arc::new(h.store.clone()),
    )
    .handler(
        KIND.parse().expect("valid"),
        crate::harness::Scripted {
            script: |_| Ok(()),
            calls: h.calls.clone(),
        },
    )
    .clock(Arc::new(h.clock.clone()))
    .build()
    .expect("valid");
    let deferred_for = |outcomes: Vec<Outcome>| match outcomes[..] {
        [Outcome::Deferred { until }] => until
            .duration_since(jobs_core::Clock::now(&h.clock))
            .expect("ahead"),
        _ => panic!("{outcomes:?}"),
    };
    h.publish(1).await;
    let first = deferred_for(worker.run_once().await.expect("receive"));
    h.clock.advance(first);
    let second = deferred_for(worker.run_once().await.expect("receive"));
    // The retry policy's ceilings, without jitter: 30 s, then 60 s.
    assert_eq!(
        (first, second),
        (Duration::from_secs(30), Duration::from_secs(60))
    );
    h.clock.advance(second);
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        worker.run_once().await.expect("receive"),
        [Outcome::Processed]
    );
    // A commit went through: the next outage waits the least again.
    down.store(true, std::sync::atomic::Ordering::SeqCst);
    h.publish(2).await;
    let after = deferred_for(worker.run_once().await.expect("receive"));
    assert_eq!(after, Duration::from_secs(30));
}

/// The harness's queue as a transport that can hold a delivery only as long as `limits` say.
struct Limited {
    inner: jobs_adapter_memory::MemoryQueue,
    limits: jobs_core::LeaseLimits,
}

#[async_trait]
impl jobs_core::SettlePort for Limited {
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
    fn lease_limits(&self) -> jobs_core::LeaseLimits {
        self.limits
    }
}

#[tokio::test]
async fn a_lease_or_time_limit_the_transport_cannot_hold_is_refused_by_name() {
    let h = Harness::new();
    let minute = Duration::from_secs(60);
    let build = |limits, config: WorkerConfig, per_kind: Option<Duration>| {
        let transport = Arc::new(Limited {
            inner: h.queue.clone(),
            limits,
        });
        let mut builder = Worker::push_builder(
            jobs_core::ConsumerName::try_from("test.consumer").expect("valid"),
            h.name.clone(),
            transport,
            Arc::new(h.store.clone()),
            Arc::new(h.store.clone()),
        )
        .handler(KIND.parse().expect("valid"), Hangs)
        .config(config);
        if let Some(limit) = per_kind {
            builder = builder.timeout(KIND.parse().expect("valid"), limit);
        }
        builder.build().map(|_| ()).map_err(|e| e.to_string())
    };
    let hour_lease = jobs_core::LeaseLimits::per_lease(Duration::from_secs(3_600));
    let mut long_lease = WorkerConfig::default();
    long_lease.lease = Duration::from_secs(7_200);
    let refused = build(hour_lease, long_lease, None).expect_err("a two-hour lease");
    assert!(refused.starts_with("lease = 7200s"), "{refused}");
    assert!(build(hour_lease, WorkerConfig::default(), None).is_ok());

    let minute_push = jobs_core::LeaseLimits::per_delivery(minute);
    let mut slow = WorkerConfig::default();
    slow.handler_timeout = 2 * minute;
    let refused = build(minute_push, slow, None).expect_err("a two-minute limit");
    assert!(refused.starts_with("handler_timeout = 120s"), "{refused}");
    let refused = build(minute_push, WorkerConfig::default(), Some(3 * minute))
        .expect_err("a three-minute limit for one kind");
    assert!(
        refused.starts_with("the timeout of `test.job`"),
        "{refused}"
    );
    assert!(build(minute_push, WorkerConfig::default(), Some(minute / 2)).is_ok());
}

/// A transport whose receive never answers (a connection that hangs without a timeout).
struct HangingPull;

#[async_trait]
impl jobs_core::PullPort for HangingPull {
    async fn receive(
        &self,
        _: &jobs_core::QueueName,
        _: usize,
        _: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_loop_stuck_on_a_call_that_never_returns_is_reported_stuck() {
    let h = Harness::new();
    let turning = Arc::new(
        h.builder()
            .handler(KIND.parse().expect("valid"), Hangs)
            .build()
            .expect("valid"),
    );
    let stuck = Arc::new(
        h.builder()
            .handler(KIND.parse().expect("valid"), Hangs)
            .pull(Arc::new(HangingPull))
            .build()
            .expect("valid"),
    );
    assert_eq!(stuck.stuck(), None, "not started");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for worker in [&turning, &stuck] {
        let mut stopped = stopped.clone();
        tokio::spawn(worker.clone().run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        (turning.stuck(), stuck.stuck()),
        (None, None),
        "within its waits"
    );
    // Past twice the poll interval, the longest time limit (60 s) and 10 s of slack.
    tokio::time::sleep(Duration::from_secs(80)).await;
    assert_eq!(turning.stuck(), None, "an idle loop turns at every poll");
    let since = stuck.stuck().expect("the hung loop is stuck");
    assert!(since >= Duration::from_secs(80), "{since:?}");
    stop.send_replace(true);
}

/// The harness's queue, answering each receive only after a while (a slow network).
struct SlowPull(jobs_adapter_memory::MemoryQueue);

#[async_trait]
impl jobs_core::PullPort for SlowPull {
    async fn receive(
        &self,
        queue: &jobs_core::QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        let leased = self.0.receive(queue, max, lease).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        leased
    }
}

#[tokio::test(start_paused = true)]
async fn a_receive_under_way_at_shutdown_finishes_and_what_it_leased_is_given_back() {
    let h = Harness::new();
    h.publish(1).await;
    let worker = Arc::new(
        h.builder()
            .handler(KIND.parse().expect("valid"), Hangs)
            .pull(Arc::new(SlowPull(h.queue.clone())))
            .concurrency(1)
            .build()
            .expect("valid"),
    );
    let running = tokio::spawn(
        worker
            .clone()
            .run(tokio::time::sleep(Duration::from_millis(100))),
    );
    let drained = running.await.expect("stops");
    assert_eq!(drained.given_back, 1, "{drained:?}");
    // Given back at once, its attempt unspent: the next delivery is its first attempt.
    let again = jobs_core::PullPort::receive(&h.queue, &h.name, 1, Duration::from_secs(60))
        .await
        .expect("receive");
    assert_eq!(again.len(), 1, "the job is ready again");
    assert_eq!(again[0].attempt, 1);
}

/// The harness's queue, whose acks panic: a transport bug inside the runtime's task.
struct PanicsOnAck(jobs_adapter_memory::MemoryQueue);

#[async_trait]
impl jobs_core::PullPort for PanicsOnAck {
    async fn receive(
        &self,
        queue: &jobs_core::QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<jobs_core::Delivery>, jobs_core::QueueError> {
        self.0.receive(queue, max, lease).await
    }
}

#[async_trait]
impl jobs_core::SettlePort for PanicsOnAck {
    async fn ack(&self, _: &jobs_core::Lease) -> Result<(), jobs_core::QueueError> {
        panic!("the transport's ack is broken");
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

#[test]
fn a_task_that_panics_outside_the_handler_is_counted_and_its_job_comes_back() {
    // The worker's tasks run on this thread, so their panics count here.
    let counted = crate::harness::counters("jobs_task_panics_total", async {
        let h = Harness::new();
        let worker = Arc::new(
            Worker::builder(
                jobs_core::ConsumerName::try_from("test.consumer").expect("valid"),
                h.name.clone(),
                Arc::new(PanicsOnAck(h.queue.clone())),
                Arc::new(h.store.clone()),
                Arc::new(h.store.clone()),
            )
            .handler(
                KIND.parse().expect("valid"),
                crate::harness::Scripted {
                    script: |_| Ok(()),
                    calls: h.calls.clone(),
                },
            )
            .clock(Arc::new(h.clock.clone()))
            .build()
            .expect("valid"),
        );
        h.publish(1).await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(worker.clone().run(async {
            let _ = stopped.await;
        }));
        let ran = || async { !h.store.effects().is_empty() };
        jobs_testkit::eventually("the job ran", Duration::from_secs(5), ran).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).expect("running");
        running.await.expect("the loop itself survives");
        let depth = jobs_core::QueueDepth::depth(&h.queue, &h.name)
            .await
            .expect("depth");
        assert_eq!(depth.in_flight, 1, "unacked: back after its lease");
    });
    assert_eq!(counted, [(vec!["test.jobs".to_owned()], 1)]);
}

//! The queue contract: [`QueuePort`] and [`ConsumerPort`] together, and [`QueueDepth`] where
//! the transport has it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jobs_core::{
    ConsumerPort, DEFAULT_MAX_ENVELOPE_BYTES, Delivery, Depth, DepthCounts, Envelope, JobId,
    PublishOptions, QueueDepth, QueueError, QueueName, QueuePort, TenantFairness,
};

use crate::TimeTravel;
use crate::fixtures;

/// One instance of a transport under test.
pub struct QueueUnderTest {
    /// The publishing side.
    pub publisher: Arc<dyn QueuePort>,
    /// The consuming side, over the same queues.
    pub consumer: Arc<dyn ConsumerPort>,
    /// The depth capability, when the transport has it.
    pub depth: Option<Arc<dyn QueueDepth>>,
    /// The transport's time.
    pub time: Arc<dyn TimeTravel>,
}

impl QueueUnderTest {
    /// A transport that is all of publisher, consumer and depth, on `clock`.
    pub fn of<Q>(queue: Q, clock: jobs_core::ManualClock) -> Self
    where
        Q: QueuePort + ConsumerPort + QueueDepth + Clone + 'static,
    {
        QueueUnderTest {
            publisher: Arc::new(queue.clone()),
            consumer: Arc::new(queue.clone()),
            depth: Some(Arc::new(queue)),
            time: Arc::new(clock),
        }
    }
}

const LEASE: Duration = Duration::from_secs(30);

/// What a transport promises about duplicates beyond the contract's core (a second publish
/// under the same key is never delivered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dedup {
    /// The receipt of a dropped publish says [`Receipt::duplicate`](jobs_core::Receipt).
    /// Vercel Queues drops duplicates out of band and cannot.
    pub reports_duplicates: bool,
    /// A key deduplicates publishes whatever their payloads. Vercel's emulator keys on the
    /// key *and* the payload, so only identical copies are dropped there.
    pub by_key_alone: bool,
}

impl Dedup {
    /// Everything: the transport's own bookkeeping decides by key and says so.
    pub const FULL: Dedup = Dedup {
        reports_duplicates: true,
        by_key_alone: true,
    };
}

/// Everything a transport promises beyond the contract's core, for [`run_with_capabilities`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// What it promises about duplicates.
    pub dedup: Dedup,
    /// Its depth tells ready, delayed and in-flight messages apart. QStash's queue `lag` is one
    /// number for all three, so only [`Depth::total`](jobs_core::Depth::total) is checked there.
    pub depth_by_state: bool,
}

impl Capabilities {
    /// Everything: [`Dedup::FULL`] and a depth split by state.
    pub const FULL: Capabilities = Capabilities {
        dedup: Dedup::FULL,
        depth_by_state: true,
    };
}

/// Runs every check of the queue contract, each on a fresh instance from `make`.
pub async fn run<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = QueueUnderTest>,
{
    run_with_capabilities(Capabilities::FULL, make).await;
}

/// [`run`] for a transport whose deduplication promises less than [`Dedup::FULL`].
pub async fn run_with<F, Fut>(dedup: Dedup, make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = QueueUnderTest>,
{
    let capabilities = Capabilities {
        dedup,
        ..Capabilities::FULL
    };
    run_with_capabilities(capabilities, make).await;
}

/// [`run`] for a transport promising less than [`Capabilities::FULL`]: each check a
/// capability weakens is run in its weaker form, never skipped.
pub async fn run_with_capabilities<F, Fut>(capabilities: Capabilities, make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = QueueUnderTest>,
{
    let Capabilities {
        dedup,
        depth_by_state,
    } = capabilities;
    delivers_every_message_once_until_acked(make().await).await;
    honours_delay(make().await).await;
    honours_schedule(make().await).await;
    redelivers_after_lease_expiry(make().await).await;
    ack_is_final(make().await).await;
    retry_at_spends_an_attempt(make().await).await;
    defer_does_not_spend_an_attempt(make().await).await;
    extend_keeps_the_message_leased(make().await).await;
    deduplicates_by_key(make().await, dedup).await;
    respects_max_and_queue_boundaries(make().await).await;
    refuses_an_envelope_over_the_limit(make().await).await;
    if depth_by_state {
        reports_depth(make().await).await;
    } else {
        reports_total_depth(make().await).await;
    }
}

/// The queues the checks use, under `contract.`.
const QUEUES: &[&str] = &[
    "deliver", "delay", "schedule", "expiry", "ack", "retry", "defer", "extend", "dedup",
    "bounds.a", "bounds.b", "depth", "limit",
];

/// [`run`] with every queue of the contract fetched as `fairness` says
/// ([`PullPort::share_by_tenant`](jobs_core::PullPort::share_by_tenant)): fair dequeue keeps
/// every promise of oldest first but the order. A per-tenant limit changes what a receive
/// brings by design; the fairness contract checks it.
pub async fn run_fair<F, Fut>(fairness: TenantFairness, make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = QueueUnderTest>,
{
    run(|| async {
        let t = make().await;
        for name in QUEUES {
            let q = queue(name);
            t.consumer
                .share_by_tenant(&q, fairness)
                .unwrap_or_else(|e| panic!("{q}: share_by_tenant refused: {e}"));
        }
        t
    })
    .await;
}

fn queue(name: &str) -> QueueName {
    format!("contract.{name}")
        .parse()
        .expect("a valid queue name")
}

async fn publish(t: &QueueUnderTest, q: &QueueName, envelope: &Envelope, opts: PublishOptions) {
    t.publisher
        .publish(q, envelope, opts)
        .await
        .unwrap_or_else(|e| panic!("publish to {q} failed: {e}"));
}

async fn receive(t: &QueueUnderTest, q: &QueueName, max: usize) -> Vec<Delivery> {
    t.consumer
        .receive(q, max, LEASE)
        .await
        .unwrap_or_else(|e| panic!("receive from {q} failed: {e}"))
}

/// Receives until nothing is ready, in batches of 10.
async fn drain(t: &QueueUnderTest, q: &QueueName) -> Vec<Delivery> {
    let mut all = vec![];
    loop {
        let batch = receive(t, q, 10).await;
        if batch.is_empty() {
            return all;
        }
        all.extend(batch);
    }
}

fn job_id(delivery: &Delivery) -> JobId {
    Envelope::decode(&delivery.payload)
        .expect("the payload is the envelope as published")
        .job_id
}

fn assert_lease_lost(check: &str, result: Result<(), QueueError>) {
    assert!(
        matches!(result, Err(QueueError::LeaseLost { .. })),
        "{check}: expected LeaseLost, got {result:?}"
    );
}

/// Every published message is delivered with attempt 1 and its exact bytes; once acked, none
/// comes back.
pub async fn delivers_every_message_once_until_acked(t: QueueUnderTest) {
    let check = "delivers_every_message_once_until_acked";
    let q = queue("deliver");
    let sent: Vec<Envelope> = (0..25).map(|n| fixtures::envelope(1, n)).collect();
    for envelope in &sent {
        publish(&t, &q, envelope, PublishOptions::default()).await;
    }
    let got = drain(&t, &q).await;
    assert_eq!(got.len(), sent.len(), "{check}: delivered count");
    for delivery in &got {
        assert_eq!(
            delivery.attempt, 1,
            "{check}: first delivery must be attempt 1"
        );
        assert_eq!(delivery.queue(), &q, "{check}: lease names the queue");
        let decoded = Envelope::decode(&delivery.payload).expect("payload decodes");
        assert!(
            sent.contains(&decoded),
            "{check}: payload changed in transit"
        );
    }
    let ids: HashSet<JobId> = got.iter().map(job_id).collect();
    assert_eq!(
        ids.len(),
        sent.len(),
        "{check}: a message was delivered twice"
    );
    for delivery in &got {
        t.consumer
            .ack(&delivery.lease)
            .await
            .unwrap_or_else(|e| panic!("{check}: ack: {e}"));
    }
    t.time.advance(LEASE * 4).await;
    assert!(
        drain(&t, &q).await.is_empty(),
        "{check}: an acked message came back"
    );
}

/// An envelope over the default limit ([`DEFAULT_MAX_ENVELOPE_BYTES`], the one the consumers
/// decode with) is refused at publish with [`QueueError::TooLarge`] naming the queue, the
/// size and the limit, and nothing is queued; an envelope under it, published after, is.
pub async fn refuses_an_envelope_over_the_limit(t: QueueUnderTest) {
    let check = "refuses_an_envelope_over_the_limit";
    let q = queue("limit");
    let big = fixtures::envelope_with(
        1,
        "test.job",
        serde_json::json!({ "blob": "x".repeat(5 << 20) }),
    );
    let size = big.to_json_bytes().expect("it encodes").len();
    match t
        .publisher
        .publish(&q, &big, PublishOptions::default())
        .await
    {
        Err(QueueError::TooLarge {
            queue,
            size: said,
            limit,
        }) => assert_eq!(
            (queue, said, limit),
            (q.clone(), size, DEFAULT_MAX_ENVELOPE_BYTES),
            "{check}: the error names the queue, the size and the limit"
        ),
        other => panic!("{check}: expected TooLarge, got {other:?}"),
    }
    let small = fixtures::envelope(1, 1);
    publish(&t, &q, &small, PublishOptions::default()).await;
    let got = drain(&t, &q).await;
    assert_eq!(
        got.iter().map(job_id).collect::<Vec<_>>(),
        vec![small.job_id],
        "{check}: only the envelope under the limit was queued"
    );
}

/// A delayed message is invisible until its delay has passed.
pub async fn honours_delay(t: QueueUnderTest) {
    let check = "honours_delay";
    let q = queue("delay");
    let opts = PublishOptions::default().delay(Duration::from_secs(60));
    publish(&t, &q, &fixtures::envelope(1, 1), opts).await;
    assert!(
        receive(&t, &q, 10).await.is_empty(),
        "{check}: delivered before its delay"
    );
    t.time.advance(Duration::from_secs(45)).await;
    assert!(
        receive(&t, &q, 10).await.is_empty(),
        "{check}: delivered before its delay"
    );
    t.time.advance(Duration::from_secs(16)).await;
    assert_eq!(
        receive(&t, &q, 10).await.len(),
        1,
        "{check}: not delivered after its delay"
    );
}

/// A scheduled message waits for its time; one scheduled in the past is ready now.
pub async fn honours_schedule(t: QueueUnderTest) {
    let check = "honours_schedule";
    let q = queue("schedule");
    let now = t.time.now();
    let later = fixtures::envelope(1, 1);
    let past = fixtures::envelope(1, 2);
    for (envelope, at) in [
        (&later, now + Duration::from_secs(120)),
        (&past, now - Duration::from_secs(5)),
    ] {
        t.publisher
            .schedule(&q, envelope, at)
            .await
            .unwrap_or_else(|e| panic!("{check}: schedule: {e}"));
    }
    let first = receive(&t, &q, 10).await;
    assert_eq!(
        first.len(),
        1,
        "{check}: only the past-due message is ready"
    );
    assert_eq!(
        job_id(&first[0]),
        past.job_id,
        "{check}: wrong message ready"
    );
    t.consumer
        .ack(&first[0].lease)
        .await
        .unwrap_or_else(|e| panic!("{check}: ack: {e}"));
    t.time.advance(Duration::from_secs(121)).await;
    let second = receive(&t, &q, 10).await;
    assert_eq!(
        second.len(),
        1,
        "{check}: scheduled message not delivered at its time"
    );
    assert_eq!(job_id(&second[0]), later.job_id, "{check}: wrong message");
}

/// An unsettled lease expires: the message comes back with the next attempt number, and the
/// stale lease can no longer settle it.
pub async fn redelivers_after_lease_expiry(t: QueueUnderTest) {
    let check = "redelivers_after_lease_expiry";
    let q = queue("expiry");
    let envelope = fixtures::envelope(1, 1);
    publish(&t, &q, &envelope, PublishOptions::default()).await;
    let first = receive(&t, &q, 10).await;
    assert_eq!(first.len(), 1, "{check}: first delivery");
    t.time.advance(LEASE / 2).await;
    assert!(
        receive(&t, &q, 10).await.is_empty(),
        "{check}: redelivered while leased"
    );
    t.time.advance(LEASE).await;
    let second = receive(&t, &q, 10).await;
    assert_eq!(
        second.len(),
        1,
        "{check}: not redelivered after the lease expired"
    );
    assert_eq!(
        job_id(&second[0]),
        envelope.job_id,
        "{check}: another message came back"
    );
    assert_eq!(
        second[0].attempt, 2,
        "{check}: redelivery must count an attempt"
    );
    assert_lease_lost(check, t.consumer.ack(&first[0].lease).await);
    t.consumer
        .ack(&second[0].lease)
        .await
        .unwrap_or_else(|e| panic!("{check}: the current lease must ack: {e}"));
}

/// An ack cannot be repeated, and settles for good.
pub async fn ack_is_final(t: QueueUnderTest) {
    let check = "ack_is_final";
    let q = queue("ack");
    publish(&t, &q, &fixtures::envelope(1, 1), PublishOptions::default()).await;
    let got = receive(&t, &q, 1).await;
    t.consumer
        .ack(&got[0].lease)
        .await
        .unwrap_or_else(|e| panic!("{check}: ack: {e}"));
    assert_lease_lost(check, t.consumer.ack(&got[0].lease).await);
    let retry = t.consumer.retry_at(&got[0].lease, t.time.now()).await;
    assert_lease_lost(check, retry);
    t.time.advance(LEASE * 10).await;
    assert!(
        receive(&t, &q, 10).await.is_empty(),
        "{check}: acked message came back"
    );
}

/// `retry_at` hides the message until the given time; the next delivery is the next attempt.
pub async fn retry_at_spends_an_attempt(t: QueueUnderTest) {
    let check = "retry_at_spends_an_attempt";
    let q = queue("retry");
    publish(&t, &q, &fixtures::envelope(1, 1), PublishOptions::default()).await;
    let got = receive(&t, &q, 1).await;
    let at = t.time.now() + Duration::from_secs(10);
    t.consumer
        .retry_at(&got[0].lease, at)
        .await
        .unwrap_or_else(|e| panic!("{check}: {e}"));
    t.time.advance(Duration::from_secs(5)).await;
    assert!(
        receive(&t, &q, 1).await.is_empty(),
        "{check}: retried before its time"
    );
    t.time.advance(Duration::from_secs(6)).await;
    let again = receive(&t, &q, 1).await;
    assert_eq!(again.len(), 1, "{check}: not retried at its time");
    assert_eq!(again[0].attempt, 2, "{check}: retry must count an attempt");
}

/// `defer` hides the message like `retry_at` but the next delivery keeps its attempt number.
pub async fn defer_does_not_spend_an_attempt(t: QueueUnderTest) {
    let check = "defer_does_not_spend_an_attempt";
    let q = queue("defer");
    publish(&t, &q, &fixtures::envelope(1, 1), PublishOptions::default()).await;
    let got = receive(&t, &q, 1).await;
    let until = t.time.now() + Duration::from_secs(10);
    t.consumer
        .defer(&got[0].lease, until)
        .await
        .unwrap_or_else(|e| panic!("{check}: {e}"));
    assert!(
        receive(&t, &q, 1).await.is_empty(),
        "{check}: deferred message still visible"
    );
    t.time.advance(Duration::from_secs(11)).await;
    let again = receive(&t, &q, 1).await;
    assert_eq!(again.len(), 1, "{check}: not delivered after the deferral");
    assert_eq!(
        again[0].attempt, got[0].attempt,
        "{check}: a deferral spent an attempt"
    );
}

/// An extended lease keeps the message from other workers past the original expiry, and the
/// extended lease still settles it.
pub async fn extend_keeps_the_message_leased(t: QueueUnderTest) {
    let check = "extend_keeps_the_message_leased";
    let q = queue("extend");
    publish(&t, &q, &fixtures::envelope(1, 1), PublishOptions::default()).await;
    let got = receive(&t, &q, 1).await;
    t.time.advance(LEASE / 2).await;
    let extended = t
        .consumer
        .extend(&got[0].lease, LEASE * 2)
        .await
        .unwrap_or_else(|e| panic!("{check}: extend: {e}"));
    assert!(
        extended.expires_at() > got[0].lease.expires_at(),
        "{check}: expiry not moved"
    );
    t.time.advance(LEASE).await;
    assert!(
        receive(&t, &q, 1).await.is_empty(),
        "{check}: redelivered despite extension"
    );
    t.consumer
        .ack(&extended)
        .await
        .unwrap_or_else(|e| panic!("{check}: ack after extend: {e}"));
}

/// A second publish with the same key is delivered once, and answered as a duplicate where
/// the transport can tell.
pub async fn deduplicates_by_key(t: QueueUnderTest, dedup: Dedup) {
    let check = "deduplicates_by_key";
    let q = queue("dedup");
    let envelope = fixtures::envelope(1, 1);
    let first = t
        .publisher
        .publish(&q, &envelope, PublishOptions::default())
        .await;
    let second = t
        .publisher
        .publish(&q, &envelope, PublishOptions::default())
        .await;
    let (first, second) = (
        first.expect("first publish"),
        second.expect("second publish"),
    );
    assert!(!first.duplicate, "{check}: first is not a duplicate");
    if dedup.reports_duplicates {
        assert!(
            second.duplicate,
            "{check}: same job id not reported as a duplicate"
        );
    }
    assert_eq!(
        drain(&t, &q).await.len(),
        1,
        "{check}: the same job id was delivered twice"
    );
    let keyed = PublishOptions::default().dedup_key("same-business-key");
    let keyed_envelope = fixtures::envelope(1, 2);
    publish(&t, &q, &keyed_envelope, keyed.clone()).await;
    publish(&t, &q, &keyed_envelope, keyed.clone()).await;
    if dedup.by_key_alone {
        publish(&t, &q, &fixtures::envelope(1, 3), keyed).await;
    }
    assert_eq!(
        drain(&t, &q).await.len(),
        1,
        "{check}: duplicates under one dedup key were delivered"
    );
}

/// `receive` returns at most `max`, and only from the queue asked for.
pub async fn respects_max_and_queue_boundaries(t: QueueUnderTest) {
    let check = "respects_max_and_queue_boundaries";
    let a = queue("bounds.a");
    let b = queue("bounds.b");
    for n in 0..5 {
        publish(&t, &a, &fixtures::envelope(1, n), PublishOptions::default()).await;
    }
    assert!(
        receive(&t, &b, 10).await.is_empty(),
        "{check}: leaked across queues"
    );
    assert_eq!(
        receive(&t, &a, 2).await.len(),
        2,
        "{check}: max not respected"
    );
    assert_eq!(
        receive(&t, &a, 10).await.len(),
        3,
        "{check}: the rest not delivered"
    );
}

/// Depth counts ready, delayed and in-flight messages, and forgets acked ones.
pub async fn reports_depth(t: QueueUnderTest) {
    check_depth(t, true).await;
}

/// [`reports_depth`] for a transport whose depth is one number: the total counts ready,
/// delayed and in-flight messages, and forgets acked ones.
pub async fn reports_total_depth(t: QueueUnderTest) {
    check_depth(t, false).await;
}

async fn check_depth(t: QueueUnderTest, by_state: bool) {
    let check = if by_state {
        "reports_depth"
    } else {
        "reports_total_depth"
    };
    let Some(depth) = t.depth.clone() else {
        return;
    };
    let q = queue("depth");
    let read = || async {
        depth
            .depth(&q)
            .await
            .unwrap_or_else(|e| panic!("{check}: {e}"))
    };
    // (ready, delayed, in flight) where the transport tells them apart, else the total.
    let seen = |d: Depth| {
        if by_state {
            (d.ready, d.delayed, d.in_flight)
        } else {
            (d.total(), 0, 0)
        }
    };
    let expect = |ready: u64, delayed: u64, in_flight: u64| {
        if by_state {
            (ready, delayed, in_flight)
        } else {
            (ready + delayed + in_flight, 0, 0)
        }
    };
    assert_eq!(
        read().await.total(),
        0,
        "{check}: unknown queue must be empty"
    );
    // Where the transport tells states apart it also dates the oldest ready message: how
    // long it has waited at the transport's time, `None` where it cannot tell.
    let waited = |d: Depth| d.waited(t.time.now());
    let dated = |secs: u64| by_state.then_some(Duration::from_secs(secs));
    let published = t.time.now();
    for n in 0..3 {
        publish(&t, &q, &fixtures::envelope(1, n), PublishOptions::default()).await;
    }
    let delay = PublishOptions::default().delay(Duration::from_secs(60));
    publish(&t, &q, &fixtures::envelope(1, 9), delay).await;
    let d = read().await;
    assert_eq!(seen(d), expect(3, 1, 0), "{check}: after publish");
    if by_state {
        assert_eq!(d.counts, DepthCounts::Apart, "{check}: counted apart");
        assert_eq!(d.oldest_ready, Some(published), "{check}: oldest ready");
    }
    t.time.advance(Duration::from_secs(5)).await;
    assert_eq!(waited(read().await), dated(5), "{check}: waited after 5 s");
    let got = receive(&t, &q, 1).await;
    assert_eq!(got.len(), 1, "{check}: one delivery");
    let d = read().await;
    assert_eq!(seen(d), expect(2, 1, 1), "{check}: after receive");
    assert_eq!(waited(d), dated(5), "{check}: the two left still wait");
    t.consumer
        .ack(&got[0].lease)
        .await
        .unwrap_or_else(|e| panic!("{check}: ack: {e}"));
    let d = read().await;
    assert_eq!(seen(d), expect(2, 1, 0), "{check}: after ack");
    if by_state {
        assert_eq!(d.pending(), 2, "{check}: pending after ack");
    }
    let rest = receive(&t, &q, 2).await;
    assert_eq!(rest.len(), 2, "{check}: the rest delivered");
    assert_eq!(
        waited(read().await),
        dated(0),
        "{check}: nothing ready waits"
    );
}

//! The push receiver end to end: `FakeQStash` delivers signed requests to a local axum endpoint
//! mounting the [`Receiver`]; a scripted stand-in for the runtime settles each delivery through
//! the [`PushConsumer`] (the worker itself runs in `testkit/tests/qstash_runtime.rs`, since an
//! adapter's tests may not use `jobs-consumers`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jobs_adapter_qstash::{
    Destination, Processed, PushConsumer, PushRequest, PushResponse, QStashConfig, QStashQueue,
    Receiver, SigningKeys,
};
use jobs_core::{Envelope, PublishOptions, QueueDepth, QueueName, QueuePort, SettlePort};
use jobs_testkit::fakes::qstash::{DEV_CURRENT_KEY, DEV_NEXT_KEY, FakeQStash};
use jobs_testkit::fixtures;

const WAIT: Duration = Duration::from_secs(20);

/// What the stand-in runtime does with a delivery.
#[derive(Debug, Clone, Copy)]
enum Step {
    Ack,
    DeadLetter,
    RetryIn(u64),
    DeferFor(u64),
    /// Settles nothing, as when the ack after a commit failed.
    Nothing,
    /// Acks, then tries to settle again (recorded in `refusals`).
    AckTwice,
}

#[derive(Debug, Clone)]
struct Seen {
    attempt: u32,
    message_id: Option<String>,
    payload: Vec<u8>,
}

struct Endpoint {
    receiver: Receiver,
    consumer: Arc<PushConsumer>,
    script: Mutex<VecDeque<Step>>,
    seen: Mutex<Vec<Seen>>,
    refusals: Mutex<Vec<&'static str>>,
    last_lease: Mutex<Option<jobs_core::Lease>>,
}

/// The receiver's clock, moved with the fake's so that signatures issued "later" verify.
#[derive(Debug, Default)]
struct FollowsFake(Mutex<Duration>);

impl jobs_core::Clock for FollowsFake {
    fn now(&self) -> SystemTime {
        SystemTime::now() + *self.0.lock().unwrap()
    }
}

struct Harness {
    clock: Arc<FollowsFake>,
    fake: FakeQStash,
    publisher: QStashQueue,
    endpoint: Arc<Endpoint>,
    queue: QueueName,
}

impl Harness {
    fn seen(&self) -> Vec<Seen> {
        self.endpoint.seen.lock().unwrap().clone()
    }

    async fn publish(&self, envelope: &Envelope) -> String {
        self.publisher
            .publish(&self.queue, envelope, PublishOptions::default())
            .await
            .expect("published")
            .message_id
            .expect("an id")
    }

    fn advance(&self, by: Duration) {
        *self.clock.0.lock().unwrap() += by;
        self.fake.advance(by);
    }

    async fn settle(&self) {
        assert!(self.fake.wait_idle(WAIT).await, "the fake did not go idle");
    }
}

async fn deliver(State(ep): State<Arc<Endpoint>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = PushRequest::from_headers(&headers, body.to_vec());
    let answer = ep
        .receiver
        .handle(request, |delivery| {
            let ep = Arc::clone(&ep);
            async move {
                ep.seen.lock().unwrap().push(Seen {
                    attempt: delivery.attempt,
                    message_id: delivery.message_id.clone(),
                    payload: delivery.payload.clone(),
                });
                let step = ep.script.lock().unwrap().pop_front().unwrap_or(Step::Ack);
                let lease = &delivery.lease;
                let now = SystemTime::now();
                match step {
                    Step::Ack => ep.consumer.ack(lease).await.unwrap(),
                    Step::DeadLetter => {
                        ep.consumer.ack(lease).await.unwrap();
                        return Processed::DeadLettered;
                    }
                    Step::RetryIn(s) => ep
                        .consumer
                        .retry_at(lease, now + Duration::from_secs(s))
                        .await
                        .unwrap(),
                    Step::DeferFor(s) => ep
                        .consumer
                        .defer(lease, now + Duration::from_secs(s))
                        .await
                        .unwrap(),
                    Step::Nothing => {}
                    Step::AckTwice => {
                        ep.consumer.ack(lease).await.unwrap();
                        if let Err(jobs_core::QueueError::LeaseLost { .. }) =
                            ep.consumer.ack(lease).await
                        {
                            ep.refusals.lock().unwrap().push("ack: lease lost");
                        }
                        if let Err(jobs_core::QueueError::LeaseLost { .. }) =
                            ep.consumer.extend(lease, Duration::from_secs(5)).await
                        {
                            ep.refusals.lock().unwrap().push("extend: lease lost");
                        }
                        *ep.last_lease.lock().unwrap() = Some(lease.clone());
                    }
                }
                Processed::Settled
            }
        })
        .await;
    let stale = ep.last_lease.lock().unwrap().take();
    if let Some(lease) = stale
        && let Err(jobs_core::QueueError::LeaseLost { .. }) = ep.consumer.ack(&lease).await
    {
        ep.refusals
            .lock()
            .unwrap()
            .push("ack after the answer: lease lost");
    }
    into_response(answer)
}

fn into_response(answer: PushResponse) -> Response {
    let mut response = (
        StatusCode::from_u16(answer.status).expect("a status"),
        answer.body,
    )
        .into_response();
    for (name, value) in answer.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).expect("a header value"),
        );
    }
    response
}

/// A fake, a publisher, and an endpoint on `127.0.0.1` whose receiver knows `keys`; the
/// destination is the endpoint's URL plus `sub_suffix` (to make `sub` differ).
async fn harness(
    script: Vec<Step>,
    keys: SigningKeys,
    via_queue: bool,
    sub_suffix: &str,
) -> Harness {
    let fake = FakeQStash::start().await.expect("fake starts");
    fake.set_retry_scale(0.0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/qstash/jobs", listener.local_addr().unwrap());
    let queue: QueueName = "jobs.push".parse().unwrap();
    let mut destination = Destination::new(format!("{url}{sub_suffix}"));
    if via_queue {
        destination = destination.via_queue("jobs.push");
    }
    let publisher = QStashQueue::new(
        QStashConfig::new(fake.token())
            .with_base_url(fake.base_url())
            .with_destination(queue.clone(), destination),
    )
    .unwrap();
    let clock = Arc::new(FollowsFake::default());
    let consumer = Arc::new(PushConsumer::new(clock.clone()));
    let receiver = Receiver::new(queue.clone(), url, keys, Arc::clone(&consumer))
        .with_republisher(publisher.clone())
        .with_clock(clock.clone());
    let endpoint = Arc::new(Endpoint {
        receiver,
        consumer,
        script: Mutex::new(script.into()),
        seen: Mutex::default(),
        refusals: Mutex::default(),
        last_lease: Mutex::default(),
    });
    let app = Router::new()
        .route("/qstash/jobs", post(deliver))
        .route("/qstash/jobs/other", post(deliver))
        .with_state(Arc::clone(&endpoint));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Harness {
        clock,
        fake,
        publisher,
        endpoint,
        queue,
    }
}

fn dev_keys() -> SigningKeys {
    SigningKeys::new(DEV_CURRENT_KEY, DEV_NEXT_KEY)
}

#[tokio::test]
async fn a_processed_delivery_is_answered_200_once() {
    let h = harness(vec![Step::Ack], dev_keys(), false, "").await;
    let envelope = fixtures::envelope(1, 1);
    let id = h.publish(&envelope).await;
    h.settle().await;
    let seen = h.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].attempt, 1);
    assert_eq!(seen[0].message_id.as_deref(), Some(id.as_str()));
    assert_eq!(
        Envelope::decode(&seen[0].payload).unwrap(),
        envelope,
        "the bytes as published"
    );
    let attempts = h.fake.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status, Some(200));
}

#[tokio::test]
async fn retry_at_is_answered_500_with_retry_after_which_qstash_honours() {
    let h = harness(vec![Step::RetryIn(7), Step::Ack], dev_keys(), false, "").await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    let attempts = h.fake.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].status, Some(500));
    // 7 s from the worker's clock, rounded up to whole seconds by the receiver.
    let retry_after: u64 = attempts[0].retry_after.as_deref().unwrap().parse().unwrap();
    assert!((7..=8).contains(&retry_after), "{retry_after}");
    assert_eq!(
        attempts[0].next_delay,
        Some(Duration::from_secs(retry_after))
    );
    assert_eq!(attempts[1].status, Some(200));
    let attempts_seen: Vec<u32> = h.seen().iter().map(|s| s.attempt).collect();
    assert_eq!(attempts_seen, vec![1, 2], "Upstash-Retried + 1");
}

#[tokio::test]
async fn an_unsettled_delivery_is_answered_500_and_retried_on_the_queue_schedule() {
    let h = harness(vec![Step::Nothing, Step::Ack], dev_keys(), false, "").await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    let attempts = h.fake.attempts();
    assert_eq!(attempts[0].status, Some(500));
    assert_eq!(attempts[0].retry_after, None);
    assert_eq!(
        attempts[0].next_delay,
        Some(Duration::from_secs(30)),
        "Upstash-Retry-Delay for retried = 0: the standard's 30 s ceiling"
    );
    assert_eq!(h.seen().len(), 2);
}

#[tokio::test]
async fn a_dead_letter_is_answered_489_and_lands_in_qstash_dlq_without_retries() {
    let h = harness(vec![Step::DeadLetter], dev_keys(), false, "").await;
    let id = h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    let attempts = h.fake.attempts();
    assert_eq!(attempts.len(), 1, "no retry after 489");
    assert_eq!(attempts[0].status, Some(489));
    assert_eq!(h.fake.dlq_message_ids(), vec![id.clone()]);

    let page = h.publisher.dlq_list(None, 10).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(page.messages[0].message_id, id);
    assert_eq!(page.messages[0].response_status, Some(489));
    assert_eq!(page.cursor, None);
    // An operator retries it from QStash's DLQ: delivered again, then acked.
    let retried = h
        .publisher
        .dlq_retry(&page.messages[0].dlq_id)
        .await
        .unwrap();
    h.settle().await;
    assert_ne!(retried, id);
    assert_eq!(h.fake.attempts().last().unwrap().status, Some(200));
    assert!(
        h.publisher
            .dlq_list(None, 10)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
}

#[tokio::test]
async fn dlq_entries_can_be_deleted() {
    let h = harness(vec![Step::DeadLetter], dev_keys(), false, "").await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    let page = h.publisher.dlq_list(None, 10).await.unwrap();
    h.publisher
        .dlq_delete(&page.messages[0].dlq_id)
        .await
        .unwrap();
    assert!(
        h.publisher
            .dlq_list(None, 10)
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    assert!(
        h.publisher
            .dlq_delete(&page.messages[0].dlq_id)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_deferral_republishes_and_keeps_the_attempt_number() {
    let h = harness(
        vec![Step::RetryIn(1), Step::DeferFor(120), Step::Ack],
        dev_keys(),
        false,
        "",
    )
    .await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    // Attempt 1 failed, attempt 2 was deferred: answered 200, republished for later.
    let attempts = h.fake.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].status, Some(200));
    let messages = h.fake.messages();
    assert_eq!(messages.len(), 2, "the deferral is a new message");
    let republished = &messages[1];
    let header = |name: &str| {
        republished
            .publish_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("upstash-forward-jobs-attempts-spent").as_deref(),
        Some("1")
    );
    assert_eq!(header("upstash-retries").as_deref(), Some("3"), "5 - 2");
    assert_eq!(header("upstash-deduplication-id"), None);
    assert_eq!(h.seen().len(), 2, "not before its time");
    h.advance(Duration::from_secs(121));
    h.settle().await;
    let seen = h.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].attempt, 2, "the deferral did not spend an attempt");
    assert_eq!(seen[2].payload, seen[0].payload);
}

#[tokio::test]
async fn the_next_key_is_accepted_after_a_rotation() {
    let h = harness(vec![Step::Ack], dev_keys(), false, "").await;
    h.fake.sign_with_next_key(true);
    h.fake.pad_body_hash(false);
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    assert_eq!(h.fake.attempts()[0].status, Some(200));
}

#[tokio::test]
async fn bad_signatures_are_answered_401_and_never_reach_the_runtime() {
    // Keys the fake does not sign with.
    let h = harness(
        vec![],
        SigningKeys::new("sig_not_the_current", "sig_not_the_next"),
        false,
        "",
    )
    .await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    let attempts = h.fake.attempts();
    assert_eq!(attempts.len(), 5, "QStash retries a 401 like any failure");
    assert!(attempts.iter().all(|a| a.status == Some(401)));
    assert!(h.seen().is_empty());

    // A signature for another URL (`sub`) is refused too.
    let h = harness(vec![], dev_keys(), false, "/other").await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    assert!(h.fake.attempts().iter().all(|a| a.status == Some(401)));
    assert!(h.seen().is_empty());

    // No signature at all.
    let answer = h
        .endpoint
        .receiver
        .handle(PushRequest::new(b"{}".to_vec()), |_| async {
            panic!("an unsigned request must not reach the runtime")
        })
        .await;
    assert_eq!(answer.status, 401);
    assert!(
        answer.body.contains("missing Upstash-Signature"),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn a_qstash_queue_delivers_in_order_and_reports_lag() {
    let h = harness(vec![], dev_keys(), true, "").await;
    h.fake.pause_deliveries(true);
    let envelopes: Vec<Envelope> = (0..5).map(|n| fixtures::envelope(1, n)).collect();
    for e in &envelopes {
        h.publish(e).await;
    }
    assert_eq!(h.publisher.depth(&h.queue).await.unwrap().ready, 5);
    h.fake.pause_deliveries(false);
    h.settle().await;
    let order: Vec<Envelope> = h
        .seen()
        .iter()
        .map(|s| Envelope::decode(&s.payload).unwrap())
        .collect();
    assert_eq!(order, envelopes, "parallelism 1 is FIFO");
    assert_eq!(h.publisher.depth(&h.queue).await.unwrap().ready, 0);
}

#[tokio::test]
async fn a_lease_settles_once_and_receive_is_always_empty() {
    let h = harness(vec![Step::AckTwice], dev_keys(), false, "").await;
    h.publish(&fixtures::envelope(1, 1)).await;
    h.settle().await;
    assert_eq!(
        h.fake.attempts()[0].status,
        Some(200),
        "the first ack counts"
    );
    assert_eq!(
        *h.endpoint.refusals.lock().unwrap(),
        vec![
            "ack: lease lost",
            "extend: lease lost",
            "ack after the answer: lease lost"
        ]
    );
}

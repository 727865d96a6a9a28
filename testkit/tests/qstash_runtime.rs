//! The worker runtime end to end through QStash: `FakeQStash` pushes signed deliveries to an
//! axum endpoint mounting `jobs-adapter-qstash`'s `Receiver`, whose `PushConsumer` is the
//! worker's transport, on the in-memory store.
//!
//! These tests live here rather than in the adapter because an adapter's tests may not use
//! `jobs-consumers` (ADR 0001); testkit may dev-depend on adapters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jobs_adapter_memory::{MemoryStore, MemoryWorkTx};
use jobs_adapter_qstash::{
    Destination, Processed, PushConsumer, PushRequest, QStashConfig, QStashQueue, Receiver,
    SigningKeys,
};
use jobs_consumers::{DeadReason, Handler, Job, JobError, Outcome, Worker};
use jobs_core::{
    Clock, ConsumerName, DeadLetterFilter, DeadLetterStore, Envelope, PublishOptions, QueueName,
    QueuePort,
};
use jobs_testkit::fakes::qstash::{DEV_CURRENT_KEY, DEV_NEXT_KEY, FakeQStash};
use jobs_testkit::faults::LosesAcks;
use serde::Deserialize;
use serde_json::json;

const KIND: &str = "test.job";
const WAIT: Duration = Duration::from_secs(20);

/// What the handler does on attempt `n`.
type Script = fn(attempt: u32) -> Result<(), JobError>;

#[derive(Deserialize)]
struct Data {
    n: u64,
}

struct Scripted {
    script: Script,
    calls: Arc<Mutex<HashMap<u64, u32>>>,
}

#[async_trait]
impl Handler<MemoryWorkTx> for Scripted {
    type Data = Data;

    async fn handle(&self, job: Job<Data>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(job.envelope.data.n)
            .or_default() += 1;
        (self.script)(job.attempt)?;
        tx.record_effect(format!("n={}", job.envelope.data.n));
        Ok(())
    }
}

/// The receiver's clock, moved with the fake's so that signatures issued "later" verify.
#[derive(Debug, Default)]
struct FollowsFake(Mutex<Duration>);

impl Clock for FollowsFake {
    fn now(&self) -> SystemTime {
        SystemTime::now() + *self.0.lock().unwrap()
    }
}

struct App {
    receiver: Receiver,
    worker: Worker<MemoryStore>,
    outcomes: Mutex<Vec<(u32, Outcome)>>,
}

struct Harness {
    fake: FakeQStash,
    publisher: QStashQueue,
    app: Arc<App>,
    store: MemoryStore,
    transport: LosesAcks<PushConsumer>,
    calls: Arc<Mutex<HashMap<u64, u32>>>,
    clock: Arc<FollowsFake>,
    queue: QueueName,
}

/// The axum route: the request, verified, processed by the worker, answered.
async fn qstash_route(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = PushRequest::from_headers(&headers, body.to_vec());
    let answer = app
        .receiver
        .handle(request, |delivery| {
            let app = Arc::clone(&app);
            async move {
                let attempt = delivery.attempt;
                let outcome = app.worker.process(delivery).await;
                let processed = match outcome {
                    Outcome::DeadLettered { .. } => Processed::DeadLettered,
                    _ => Processed::Settled,
                };
                app.outcomes.lock().unwrap().push((attempt, outcome));
                processed
            }
        })
        .await;
    let mut response = (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
    for (name, value) in answer.headers {
        response.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

async fn harness(script: Script) -> Harness {
    let fake = FakeQStash::start().await.expect("fake starts");
    fake.set_retry_scale(0.0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/qstash/jobs", listener.local_addr().unwrap());
    let queue: QueueName = "jobs.push".parse().unwrap();
    let publisher = QStashQueue::new(
        QStashConfig::new(fake.token())
            .with_base_url(fake.base_url())
            .with_destination(queue.clone(), Destination::new(url.clone())),
    )
    .unwrap();
    let clock = Arc::new(FollowsFake::default());
    let consumer = Arc::new(PushConsumer::new(clock.clone()));
    let transport = LosesAcks::new(consumer.clone());
    let store = MemoryStore::default();
    let calls = Arc::default();
    let worker = Worker::push_builder(
        ConsumerName::try_from("test.consumer").unwrap(),
        queue.clone(),
        Arc::new(transport.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(
        KIND.parse().unwrap(),
        Scripted {
            script,
            calls: Arc::clone(&calls),
        },
    )
    .clock(clock.clone())
    .build()
    .unwrap();
    let receiver = Receiver::new(
        queue.clone(),
        url,
        SigningKeys::new(DEV_CURRENT_KEY, DEV_NEXT_KEY),
        consumer,
    )
    .with_republisher(publisher.clone())
    .with_clock(clock.clone());
    let app = Arc::new(App {
        receiver,
        worker,
        outcomes: Mutex::default(),
    });
    let router = Router::new()
        .route("/qstash/jobs", post(qstash_route))
        .with_state(Arc::clone(&app));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Harness {
        fake,
        publisher,
        app,
        store,
        transport,
        calls,
        clock,
        queue,
    }
}

impl Harness {
    async fn publish(&self, n: u64) -> Envelope {
        let envelope = jobs_testkit::fixtures::envelope_with(1, KIND, json!({ "n": n }));
        self.publisher
            .publish(&self.queue, &envelope, PublishOptions::default())
            .await
            .expect("published");
        envelope
    }

    async fn settle(&self) {
        assert!(self.fake.wait_idle(WAIT).await, "the fake did not go idle");
    }

    fn outcomes(&self) -> Vec<(u32, Outcome)> {
        self.app.outcomes.lock().unwrap().clone()
    }

    fn statuses(&self) -> Vec<Option<u16>> {
        self.fake.attempts().iter().map(|a| a.status).collect()
    }

    fn calls(&self, n: u64) -> u32 {
        self.calls.lock().unwrap().get(&n).copied().unwrap_or(0)
    }

    fn advance(&self, by: Duration) {
        *self.clock.0.lock().unwrap() += by;
        self.fake.advance(by);
    }
}

#[tokio::test]
async fn a_job_is_processed_once_and_answered_200() {
    let h = harness(|_| Ok(())).await;
    h.publish(1).await;
    h.settle().await;
    assert_eq!(h.outcomes(), vec![(1, Outcome::Processed)]);
    assert_eq!(h.statuses(), vec![Some(200)]);
    assert_eq!(h.store.effects(), vec!["n=1"]);
}

#[tokio::test]
async fn a_crash_between_commit_and_ack_is_redelivered_and_skipped_as_a_duplicate() {
    let h = harness(|_| Ok(())).await;
    h.transport.lose_next(1);
    h.publish(1).await;
    h.settle().await;
    let outcomes = h.outcomes();
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(
        matches!(outcomes[0], (1, Outcome::Unsettled { .. })),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes[1],
        (2, Outcome::Duplicate),
        "QStash's redelivery counts an attempt and is skipped"
    );
    assert_eq!(h.statuses(), vec![Some(500), Some(200)]);
    assert_eq!(
        h.fake.attempts()[0].retry_after,
        None,
        "no Retry-After: QStash's own schedule"
    );
    assert_eq!(h.calls(1), 1, "the handler ran once");
    assert_eq!(h.store.effects(), vec!["n=1"], "the effect committed once");
}

#[tokio::test]
async fn a_failed_attempt_is_retried_at_the_runtime_backoff() {
    let h = harness(|attempt| {
        if attempt == 1 {
            Err(JobError::retry("flaky"))
        } else {
            Ok(())
        }
    })
    .await;
    h.publish(1).await;
    h.settle().await;
    let outcomes = h.outcomes();
    assert!(matches!(outcomes[0], (1, Outcome::Retrying { .. })));
    assert_eq!(outcomes[1], (2, Outcome::Processed));
    let first = &h.fake.attempts()[0];
    assert_eq!(first.status, Some(500));
    // The standard's first backoff, [15 s, 30 s] with jitter, rounded up to whole seconds.
    let delay = first.next_delay.expect("a retry");
    assert!(
        delay >= Duration::from_secs(15) && delay <= Duration::from_secs(31),
        "{delay:?}"
    );
    assert_eq!(h.store.effects(), vec!["n=1"]);
}

#[tokio::test]
async fn exhausted_jobs_are_dead_lettered_and_answered_489() {
    let h = harness(|_| Err(JobError::retry("always failing"))).await;
    let envelope = h.publish(1).await;
    h.settle().await;
    let outcomes = h.outcomes();
    let attempts: Vec<u32> = outcomes.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3, 4, 5]);
    assert!(
        outcomes[..4]
            .iter()
            .all(|(_, o)| matches!(o, Outcome::Retrying { .. }))
    );
    assert!(matches!(
        outcomes[4].1,
        Outcome::DeadLettered {
            reason: DeadReason::Exhausted,
            ..
        }
    ));
    assert_eq!(
        h.statuses(),
        vec![Some(500), Some(500), Some(500), Some(500), Some(489)]
    );
    assert_eq!(h.fake.dlq_message_ids().len(), 1, "QStash stops retrying");
    let letters = h
        .store
        .list(&DeadLetterFilter::default())
        .await
        .expect("listed");
    assert_eq!(letters.len(), 1, "our dead letters are the source of truth");
    assert_eq!(letters[0].letter.job_id, Some(envelope.job_id));
    assert_eq!(letters[0].letter.attempts, 5);
    assert!(h.store.effects().is_empty());
}

#[tokio::test]
async fn a_permanent_failure_is_dead_lettered_at_once() {
    let h = harness(|_| Err(JobError::permanent("bad invoice"))).await;
    h.publish(1).await;
    h.settle().await;
    assert!(matches!(
        h.outcomes()[..],
        [(
            1,
            Outcome::DeadLettered {
                reason: DeadReason::Permanent,
                ..
            }
        )]
    ));
    assert_eq!(h.statuses(), vec![Some(489)]);
}

#[tokio::test]
async fn a_deferral_does_not_spend_an_attempt() {
    static DEFERRED: AtomicBool = AtomicBool::new(false);
    let h = harness(|_| {
        if DEFERRED.swap(true, Ordering::SeqCst) {
            Ok(())
        } else {
            Err(JobError::Defer {
                until: SystemTime::now() + Duration::from_secs(90),
            })
        }
    })
    .await;
    h.publish(1).await;
    h.settle().await;
    assert!(matches!(h.outcomes()[..], [(1, Outcome::Deferred { .. })]));
    assert_eq!(
        h.statuses(),
        vec![Some(200)],
        "deferred: republished, answered 200"
    );
    assert_eq!(h.fake.messages().len(), 2, "the republished copy waits");
    h.advance(Duration::from_secs(91));
    h.settle().await;
    let outcomes = h.outcomes();
    assert_eq!(
        outcomes.get(1),
        Some(&(1, Outcome::Processed)),
        "the deferral kept the attempt number: {outcomes:?}"
    );
    assert_eq!(h.store.effects(), vec!["n=1"]);
}

#[tokio::test]
async fn a_push_worker_refuses_a_time_limit_longer_than_qstash_waits_for_the_answer() {
    let store = MemoryStore::default();
    let build = |timeout: Duration, limit: Duration| {
        let consumer = PushConsumer::default().with_delivery_timeout(timeout);
        Worker::push_builder(
            ConsumerName::try_from("test.consumer").unwrap(),
            "jobs.push".parse().unwrap(),
            Arc::new(consumer),
            Arc::new(store.clone()),
            Arc::new(store.clone()),
        )
        .handler(
            KIND.parse().unwrap(),
            Scripted {
                script: |_| Ok(()),
                calls: Arc::default(),
            },
        )
        .handler_timeout(limit)
        .build()
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let minute = Duration::from_secs(60);
    let refused = build(minute, 5 * minute).expect_err("five minutes in a one-minute request");
    assert!(refused.starts_with("handler_timeout = 300s"), "{refused}");
    assert!(
        build(5 * minute, 5 * minute).is_ok(),
        "a longer Upstash-Timeout"
    );
}

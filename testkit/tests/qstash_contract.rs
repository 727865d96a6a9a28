//! The queue contract through QStash: `FakeQStash` pushes signed deliveries to a local endpoint
//! mounting `jobs-adapter-qstash`'s `Receiver`, and a pull bridge turns the requests held open
//! there into the contract's `receive`.
//!
//! The bridge is test-only. Each verified delivery goes through the adapter's real `Receiver`
//! (signature, attempt from `Upstash-Retried` and `Jobs-Attempts-Spent`, lease in its
//! `PushConsumer`) and waits, its HTTP request open, until the contract settles it:
//!
//! - `receive(queue, max, lease)` returns the deliveries held open and not yet handed out,
//!   leased for `lease` (the `PushConsumer`'s `extend`); it first waits, bounded, until every
//!   message the fake has due now is held at the endpoint, so "nothing is ready" is exact;
//! - `ack`, `retry_at`, `defer` settle through the `PushConsumer`, which makes the receiver's
//!   HTTP answer (200, 500 with `Retry-After`, a republish then 200), and wait until the fake
//!   has recorded it;
//! - time is the fake's clock. `advance` steps it from event to event: a message becoming due
//!   is delivered at its time, and a held request whose lease expires unsettled is answered
//!   then (500, no `Retry-After`: QStash's own retry schedule), as is one reaching
//!   `Upstash-Timeout` (QStash gives up on the request whatever the lease says).
//!
//! The contract's destinations use a retry schedule with a 5 s base (the standard's is 30 s):
//! QStash redelivers a timed-out request after its retry delay, and the contract's lease check
//! allows 15 s between the expiry and the next `receive`. ADR 0010 lists the deviations.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jobs_adapter_qstash::{
    Destination, Processed, PushConsumer, PushRequest, QStashConfig, QStashQueue,
    QUEUE_PLACEHOLDER, Receiver, RetrySchedule, SigningKeys,
};
use jobs_core::{
    Clock, Delivery, Envelope, Lease, PublishOptions, PullPort, QueueError, QueueName, QueuePort,
    Receipt, SettlePort,
};
use jobs_testkit::TimeTravel;
use jobs_testkit::contract::queue::{self, Capabilities, Dedup, QueueUnderTest};
use jobs_testkit::fakes::qstash::{FakeQStash, MessageState};
use jobs_testkit::fixtures;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long the bridge waits for the fake to deliver what is due, or to record an answer.
const WAIT: Duration = Duration::from_secs(10);
/// How often it looks.
const POLL: Duration = Duration::from_millis(2);
/// The most events one `advance` may step through before the bridge calls it a runaway.
const MAX_STEPS: usize = 10_000;
/// The parallelism of the QStash queues the bridge provisions: above any check's backlog, so
/// no message waits for its turn (parallelism 1 is FIFO, tested in the adapter's push tests).
const PARALLELISM: u32 = 100;

/// The fake's clock, for the receiver (signatures) and the `PushConsumer` (leases).
#[derive(Debug)]
struct FakeTime(Arc<FakeQStash>);

impl Clock for FakeTime {
    fn now(&self) -> SystemTime {
        self.0.now()
    }
}

/// One push request held open at the endpoint.
struct Held {
    seq: u64,
    queue: QueueName,
    delivery: Delivery,
    message_id: String,
    /// Arrival plus `Upstash-Timeout`: QStash gives up on the request then.
    deadline: SystemTime,
    /// The lease's expiry, once `receive` handed the delivery out.
    lease_expiry: Option<SystemTime>,
    release: oneshot::Sender<()>,
}

impl Held {
    /// When the request ends unless settled first.
    fn ends_at(&self) -> SystemTime {
        self.lease_expiry
            .map_or(self.deadline, |expiry| expiry.min(self.deadline))
    }
}

struct Inner {
    fake: Arc<FakeQStash>,
    clock: Arc<FakeTime>,
    push: Arc<PushConsumer>,
    publisher: QStashQueue,
    endpoint: String,
    delivery_timeout: Duration,
    held: Mutex<BTreeMap<String, Held>>,
    /// Answers refusing a delivery (a bad signature or header): the contract must fail.
    refused: Mutex<Vec<String>>,
    seq: AtomicU64,
}

impl Inner {
    fn held(&self) -> MutexGuard<'_, BTreeMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `delivery`'s request open until the bridge releases it (a settlement, or the
    /// request's end), then lets the receiver answer with whatever the `PushConsumer` records.
    async fn hold(&self, delivery: Delivery) -> Processed {
        let token = delivery.lease.token().to_owned();
        let (release, released) = oneshot::channel();
        self.held().insert(
            token.clone(),
            Held {
                seq: self.seq.fetch_add(1, Ordering::Relaxed),
                queue: delivery.queue().clone(),
                message_id: delivery.message_id.clone().unwrap_or_default(),
                deadline: self.clock.now() + self.delivery_timeout,
                lease_expiry: None,
                delivery,
                release,
            },
        );
        // Dropped with the request (QStash hung up): forget the delivery.
        let _unhold = Unhold(self, token);
        let _ = released.await;
        Processed::Settled
    }

    fn attempts_of(&self, message_id: &str) -> usize {
        self.fake
            .attempts()
            .iter()
            .filter(|a| a.message_id == message_id)
            .count()
    }

    /// Ends the held request `token` and waits until the fake has recorded its answer.
    async fn release(&self, token: &str) -> bool {
        let Some(held) = self.held().remove(token) else {
            return true;
        };
        let before = self.attempts_of(&held.message_id);
        let _ = held.release.send(());
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.attempts_of(&held.message_id) <= before {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
        true
    }

    /// Waits until every message the fake has due now is held at the endpoint, and no answer
    /// is on its way back; `false` if that does not happen within [`WAIT`].
    async fn quiesce(&self) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let held: HashSet<String> =
                self.held().values().map(|h| h.message_id.clone()).collect();
            let now = self.fake.now();
            let busy = self.fake.messages().iter().any(|m| match m.state {
                MessageState::InFlight => !held.contains(&m.message_id),
                MessageState::Pending => m.not_before <= now,
                _ => false,
            });
            if !busy {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn refusals(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Unhold<'a>(&'a Inner, String);

impl Drop for Unhold<'_> {
    fn drop(&mut self) {
        self.0.held().remove(&self.1);
    }
}

/// The endpoint: `POST /q/{queue}`, the destination of every contract queue.
async fn deliver_route(
    State(inner): State<Arc<Inner>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(name) = queue.parse::<QueueName>() else {
        return (StatusCode::NOT_FOUND, "no such queue").into_response();
    };
    let receiver = Receiver::new(
        name,
        format!("{}/q/{queue}", inner.endpoint),
        SigningKeys::new(
            inner.fake.current_signing_key(),
            inner.fake.next_signing_key(),
        ),
        Arc::clone(&inner.push),
    )
    .with_clock(inner.clock.clone())
    .with_lease(inner.delivery_timeout)
    .with_republisher(inner.publisher.clone());
    let request = PushRequest::from_headers(&headers, body.to_vec());
    let answer = receiver
        .handle(request, |delivery| {
            let inner = Arc::clone(&inner);
            async move { inner.hold(delivery).await }
        })
        .await;
    if matches!(answer.status, 400 | 401) {
        inner
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("{}: {}", answer.status, answer.body));
    }
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    response
}

/// Aborts the endpoint's server when the last side of the bridge is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The contract's consumer and time: the pull face of the push endpoint.
#[derive(Clone)]
struct Bridge {
    inner: Arc<Inner>,
    _server: Arc<AbortOnDrop>,
}

impl Bridge {
    fn unavailable(&self, queue: &QueueName, message: String) -> QueueError {
        QueueError::Unavailable {
            queue: queue.clone(),
            message,
            source: None,
        }
    }

    /// Settles `lease` through `settle` (the `PushConsumer`), then ends its request.
    async fn settle(
        &self,
        lease: &Lease,
        settled: Result<(), QueueError>,
    ) -> Result<(), QueueError> {
        settled?;
        if self.inner.release(lease.token()).await {
            Ok(())
        } else {
            Err(self.unavailable(
                lease.queue(),
                "the fake did not record the endpoint's answer".into(),
            ))
        }
    }
}

#[async_trait]
impl PullPort for Bridge {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let settled = self.inner.quiesce().await;
        let refused = self.inner.refusals();
        if !refused.is_empty() {
            return Err(QueueError::Rejected {
                queue: queue.clone(),
                reason: format!("the receiver refused deliveries: {refused:?}"),
            });
        }
        if !settled {
            return Err(self.unavailable(
                queue,
                "the fake did not deliver what is due within the wait".into(),
            ));
        }
        let picked: Vec<Delivery> = {
            let mut held = self.inner.held();
            let mut open: Vec<&mut Held> = held
                .values_mut()
                .filter(|h| &h.queue == queue && h.lease_expiry.is_none())
                .collect();
            open.sort_by_key(|h| h.seq);
            open.into_iter()
                .take(max)
                .map(|h| {
                    // Handed out: leased from now on (the expiry is set below).
                    h.lease_expiry = Some(h.deadline);
                    h.delivery.clone()
                })
                .collect()
        };
        let mut out = Vec::with_capacity(picked.len());
        for delivery in picked {
            let leased = self.inner.push.extend(&delivery.lease, lease).await?;
            if let Some(h) = self.inner.held().get_mut(leased.token()) {
                h.lease_expiry = Some(leased.expires_at());
            }
            out.push(Delivery::new(
                delivery.payload,
                delivery.attempt,
                delivery.message_id,
                leased,
            ));
        }
        Ok(out)
    }
}

#[async_trait]
impl SettlePort for Bridge {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        let settled = self.inner.push.ack(lease).await;
        self.settle(lease, settled).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        let settled = self.inner.push.retry_at(lease, at).await;
        self.settle(lease, settled).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        let settled = self.inner.push.defer(lease, until).await;
        self.settle(lease, settled).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let extended = self.inner.push.extend(lease, by).await?;
        if let Some(h) = self.inner.held().get_mut(extended.token()) {
            h.lease_expiry = Some(extended.expires_at());
        }
        Ok(extended)
    }
}

#[async_trait]
impl TimeTravel for Bridge {
    fn now(&self) -> SystemTime {
        self.inner.fake.now()
    }

    /// Steps the fake's clock from event to event up to `now + by`: what becomes due is
    /// delivered at its time, and a held request ends at its lease's expiry or its
    /// `Upstash-Timeout`, answered then.
    async fn advance(&self, by: Duration) {
        let inner = &self.inner;
        let target = inner.fake.now() + by;
        for _ in 0..MAX_STEPS {
            assert!(inner.quiesce().await, "advance: the fake did not settle");
            let now = inner.fake.now();
            let ended: Vec<String> = inner
                .held()
                .iter()
                .filter(|(_, h)| h.ends_at() <= now)
                .map(|(token, _)| token.clone())
                .collect();
            if !ended.is_empty() {
                for token in ended {
                    assert!(
                        inner.release(&token).await,
                        "advance: the fake did not record an ended request"
                    );
                }
                continue;
            }
            if now >= target {
                return;
            }
            let next_held = inner.held().values().map(Held::ends_at).min();
            let next_due = inner
                .fake
                .messages()
                .iter()
                .filter(|m| m.state == MessageState::Pending && m.not_before > now)
                .map(|m| m.not_before)
                .min();
            let next = [next_held, next_due]
                .into_iter()
                .flatten()
                .filter(|at| *at > now)
                .fold(target, SystemTime::min);
            inner
                .fake
                .advance(next.duration_since(now).unwrap_or_default());
        }
        panic!("advance: more than {MAX_STEPS} events");
    }
}

/// The publisher of the run through QStash queues: creates each QStash queue with
/// [`PARALLELISM`] before its first message, as an operator would before deploying.
struct Provisioned {
    queue: QStashQueue,
    done: Mutex<HashSet<QueueName>>,
}

impl Provisioned {
    async fn ensure(&self, queue: &QueueName) -> Result<(), QueueError> {
        if self
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(queue)
        {
            return Ok(());
        }
        let name = self
            .queue
            .config()
            .destination(queue)
            .and_then(|d| d.qstash_queue().map(str::to_owned))
            .expect("the run through QStash queues configures one for every queue");
        self.queue
            .upsert_queue(&name, PARALLELISM)
            .await
            .map_err(|e| QueueError::Unavailable {
                queue: queue.clone(),
                message: format!("creating the QStash queue: {e}"),
                source: None,
            })?;
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(queue.clone());
        Ok(())
    }
}

#[async_trait]
impl QueuePort for Provisioned {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        self.ensure(queue).await?;
        self.queue.publish(queue, envelope, opts).await
    }
}

/// How the contract's queues reach QStash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `POST /v2/publish/{url}`: no depth.
    Publish,
    /// `POST /v2/enqueue/{queue}/{url}`: depth from the queue's `lag`.
    QStashQueues,
}

/// A fresh fake, endpoint and bridge.
async fn qstash(route: Route) -> (QueueUnderTest, Bridge) {
    let fake = Arc::new(FakeQStash::start().await.expect("the fake starts"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("the endpoint binds");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let retry = RetrySchedule::new(5, Duration::from_secs(5), Duration::from_secs(60))
        .expect("a valid schedule");
    let mut template =
        Destination::new(format!("{endpoint}/q/{QUEUE_PLACEHOLDER}")).with_retry(retry);
    if route == Route::QStashQueues {
        template = template.via_queue(QUEUE_PLACEHOLDER);
    }
    let config = QStashConfig::new(fake.token())
        .with_base_url(fake.base_url())
        .with_destination_template(template)
        .expect("the template names the queue");
    let delivery_timeout = config.delivery_timeout();
    let publisher = QStashQueue::new(config).expect("the adapter is configured");
    let clock = Arc::new(FakeTime(Arc::clone(&fake)));
    let inner = Arc::new(Inner {
        push: Arc::new(PushConsumer::new(clock.clone())),
        clock,
        fake,
        publisher: publisher.clone(),
        endpoint,
        delivery_timeout,
        held: Mutex::default(),
        refused: Mutex::default(),
        seq: AtomicU64::new(0),
    });
    let router = Router::new()
        .route("/q/{queue}", post(deliver_route))
        .with_state(Arc::clone(&inner));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let bridge = Bridge {
        inner,
        _server: Arc::new(AbortOnDrop(server)),
    };
    let (publisher, depth): (Arc<dyn QueuePort>, _) = match route {
        Route::Publish => (Arc::new(publisher), None),
        Route::QStashQueues => (
            Arc::new(Provisioned {
                queue: publisher.clone(),
                done: Mutex::default(),
            }),
            Some(Arc::new(publisher) as Arc<dyn jobs_core::QueueDepth>),
        ),
    };
    let under_test = QueueUnderTest {
        publisher,
        consumer: Arc::new(bridge.clone()),
        depth,
        time: Arc::new(bridge.clone()),
    };
    (under_test, bridge)
}

/// QStash deduplicates by `Upstash-Deduplication-Id` alone and answers a duplicate 202; its
/// queue `lag` is one number.
const QSTASH: Capabilities = Capabilities {
    dedup: Dedup::FULL,
    depth_by_state: false,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_queue_contract_through_publish() {
    queue::run_with_capabilities(QSTASH, || async { qstash(Route::Publish).await.0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_queue_contract_through_qstash_queues() {
    queue::run_with_capabilities(QSTASH, || async { qstash(Route::QStashQueues).await.0 }).await;
}

/// The bridge settles over the wire: what the fake recorded is the receiver's answer to each
/// settlement, and a lease that ends unsettled leaves the retry to QStash's schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_reach_qstash_as_the_receivers_answers() {
    let (t, bridge) = qstash(Route::Publish).await;
    let fake = Arc::clone(&bridge.inner.fake);
    let q: QueueName = "contract.wire".parse().unwrap();
    t.publisher
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let first = t.consumer.receive(&q, 1, lease).await.unwrap();
    let at = t.time.now() + Duration::from_secs(10);
    t.consumer.retry_at(&first[0].lease, at).await.unwrap();
    let attempts = fake.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status, Some(500));
    assert_eq!(attempts[0].retry_after.as_deref(), Some("10"));
    assert_eq!(attempts[0].next_delay, Some(Duration::from_secs(10)));

    t.time.advance(Duration::from_secs(11)).await;
    let second = t.consumer.receive(&q, 1, lease).await.unwrap();
    assert_eq!(second[0].attempt, 2, "Upstash-Retried 1 is attempt 2");
    // Unsettled at its expiry: answered 500 without Retry-After, so QStash's own schedule
    // (5 s base after one retry: 10 s) brings it back.
    t.time.advance(lease + Duration::from_secs(1)).await;
    let attempts = fake.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].status, Some(500));
    assert_eq!(attempts[1].retry_after, None);
    assert_eq!(attempts[1].next_delay, Some(Duration::from_secs(10)));
    t.time.advance(Duration::from_secs(10)).await;
    let third = t.consumer.receive(&q, 1, lease).await.unwrap();
    assert_eq!(third[0].attempt, 3);
    t.consumer.ack(&third[0].lease).await.unwrap();
    let attempts = fake.attempts();
    assert_eq!(attempts.last().map(|a| a.status), Some(Some(200)));
    assert_eq!(
        fake.messages()[0].state,
        MessageState::Delivered,
        "an ack is QStash's success"
    );
}

/// QStash gives up on a request at `Upstash-Timeout` whatever the lease says: a lease extended
/// beyond it is lost there, and QStash redelivers on its schedule. The contract's extension
/// check stays within the timeout (60 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_cannot_outlive_upstash_timeout() {
    let (t, bridge) = qstash(Route::Publish).await;
    let q: QueueName = "contract.timeout".parse().unwrap();
    t.publisher
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    let got = t
        .consumer
        .receive(&q, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let extended = t
        .consumer
        .extend(&got[0].lease, Duration::from_secs(600))
        .await
        .unwrap();
    let timeout = bridge.inner.delivery_timeout;
    t.time.advance(timeout + Duration::from_secs(1)).await;
    assert!(
        matches!(
            t.consumer.ack(&extended).await,
            Err(QueueError::LeaseLost { .. })
        ),
        "QStash timed the request out"
    );
    t.time.advance(Duration::from_secs(5)).await;
    let again = t
        .consumer
        .receive(&q, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "redelivered after the timeout");
    assert_eq!(again[0].attempt, 2);
}

//! The consuming side: QStash's push deliveries, verified, fed to the worker runtime, and
//! answered with what the runtime decided.
//!
//! A request becomes one [`Delivery`] whose lease is registered with a [`PushConsumer`], the
//! [`SettlePort`] the worker is built with (`Worker::push_builder`). The caller runs the worker on the delivery; the
//! settlement the worker makes through the port becomes the HTTP answer (see [`Receiver::handle`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    Clock, Delivery, Lease, LeaseLimits, QueueError, QueueName, SettlePort, SystemClock,
};
use reqwest::header::HeaderMap;
use serde_json::json;

use crate::client::{ATTEMPTS_SPENT, QStashQueue};
use crate::config::DEFAULT_DELIVERY_TIMEOUT;
use crate::signature::{DEFAULT_CLOCK_TOLERANCE, SignatureError, SigningKeys, verify_signature};

/// The status QStash reads as "do not retry" when `Upstash-NonRetryable-Error: true` comes
/// with it.
pub const NON_RETRYABLE_STATUS: u16 = 489;

/// The facts of one push request the receiver needs: a few headers and the raw body.
///
/// Framework-neutral: build it with [`PushRequest::from_headers`] from an `http::HeaderMap`
/// (axum, hyper, reqwest all use it), or field by field with [`PushRequest::new`].
#[derive(Debug, Clone, Default)]
pub struct PushRequest {
    signature: Option<String>,
    retried: Option<String>,
    message_id: Option<String>,
    attempts_spent: Option<String>,
    body: Vec<u8>,
}

impl PushRequest {
    /// A request with `body` and no headers yet.
    pub fn new(body: impl Into<Vec<u8>>) -> Self {
        PushRequest {
            body: body.into(),
            ..PushRequest::default()
        }
    }

    /// Reads `Upstash-Signature`, `Upstash-Retried`, `Upstash-Message-Id` and
    /// `Jobs-Attempts-Spent` from `headers`.
    pub fn from_headers(headers: &HeaderMap, body: impl Into<Vec<u8>>) -> Self {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        };
        PushRequest {
            signature: text("upstash-signature"),
            retried: text("upstash-retried"),
            message_id: text("upstash-message-id"),
            attempts_spent: text(ATTEMPTS_SPENT),
            body: body.into(),
        }
    }

    /// Sets `Upstash-Signature`.
    pub fn signature(mut self, jwt: impl Into<String>) -> Self {
        self.signature = Some(jwt.into());
        self
    }

    /// Sets `Upstash-Retried`.
    pub fn retried(mut self, retried: impl Into<String>) -> Self {
        self.retried = Some(retried.into());
        self
    }

    /// Sets `Upstash-Message-Id`.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Sets `Jobs-Attempts-Spent` (forwarded by a deferral's republish).
    pub fn attempts_spent(mut self, spent: impl Into<String>) -> Self {
        self.attempts_spent = Some(spent.into());
        self
    }
}

/// The HTTP answer to give QStash.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PushResponse {
    /// The status code.
    pub status: u16,
    /// Headers to set (`Retry-After`, `Upstash-NonRetryable-Error`, `Content-Type`).
    pub headers: Vec<(&'static str, String)>,
    /// A short JSON body, for QStash's logs and the DLQ's `responseBody`.
    pub body: String,
}

impl PushResponse {
    fn new(status: u16, body: serde_json::Value) -> Self {
        PushResponse {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: body.to_string(),
        }
    }

    fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The value of header `name`, if set.
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the runtime reported besides its settlement, for the answer: whether the delivery was
/// dead-lettered (in our `core.dead_letters`) rather than processed.
///
/// With `jobs-consumers`: `Processed::DeadLettered` when `Worker::process` returned
/// `Outcome::DeadLettered`, else `Processed::Settled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// Processed, duplicate, retrying, deferred, or unsettled: the port's settlement says which.
    Settled,
    /// Recorded in the dead letters and acked: QStash must not retry (489).
    DeadLettered,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Open { expires_at: SystemTime },
    Acked,
    RetryAt(SystemTime),
    Deferred(SystemTime),
}

/// The [`SettlePort`] of push deliveries: it settles the one delivery each request carries,
/// recording the settlement for the [`Receiver`] to answer with.
///
/// It has no pull side (QStash pushes; nothing can be pulled): its worker is built with
/// `Worker::push_builder` in `jobs-consumers`. `extend` moves only the local expiry: QStash cannot extend a request beyond `Upstash-Timeout`. A lease settled
/// already, expired, or unknown is refused with [`QueueError::LeaseLost`].
#[derive(Debug)]
pub struct PushConsumer {
    slots: Mutex<HashMap<String, Slot>>,
    seq: AtomicU64,
    clock: Arc<dyn Clock>,
    delivery_timeout: Duration,
}

impl Default for PushConsumer {
    fn default() -> Self {
        PushConsumer::new(Arc::new(SystemClock))
    }
}

impl PushConsumer {
    /// A consumer on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        PushConsumer {
            slots: Mutex::default(),
            seq: AtomicU64::new(0),
            clock,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
        }
    }

    /// Says that QStash waits `timeout` for each delivery's answer (the `Upstash-Timeout`
    /// messages are published with; default [`DEFAULT_DELIVERY_TIMEOUT`]): no handler time
    /// limit may be longer ([`SettlePort::lease_limits`]), and a [`Receiver`] leases each
    /// delivery for it unless told otherwise.
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// [`PushConsumer::with_delivery_timeout`].
    pub fn delivery_timeout(&self) -> Duration {
        self.delivery_timeout
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a delivery of `message_id`, leased for `lease`.
    fn open(&self, queue: &QueueName, message_id: &str, lease: Duration) -> Lease {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let token = format!("{message_id}#{n}");
        let now = self.clock.now();
        // The lease comes from the request (its timeout): an absurd one is clamped.
        let expires_at = now
            .checked_add(lease.min(jobs_core::MAX_WAIT))
            .unwrap_or(now);
        self.slots()
            .insert(token.clone(), Slot::Open { expires_at });
        Lease::new(queue.clone(), token, expires_at)
    }

    fn take(&self, token: &str) -> Option<Slot> {
        self.slots().remove(token)
    }

    fn settle(&self, lease: &Lease, to: Slot) -> Result<(), QueueError> {
        let now = self.clock.now();
        let mut slots = self.slots();
        match slots.get_mut(lease.token()) {
            Some(slot) if matches!(*slot, Slot::Open { expires_at } if expires_at >= now) => {
                *slot = to;
                Ok(())
            }
            _ => Err(QueueError::LeaseLost {
                queue: lease.queue().clone(),
            }),
        }
    }
}

#[async_trait]
impl SettlePort for PushConsumer {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.settle(lease, Slot::Acked)
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.settle(lease, Slot::RetryAt(at))
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.settle(lease, Slot::Deferred(until))
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let now = self.clock.now();
        let extended = jobs_core::later(lease.queue(), now, by, "lease extension")?;
        let mut slots = self.slots();
        match slots.get_mut(lease.token()) {
            Some(Slot::Open { expires_at }) if *expires_at >= now => {
                *expires_at = extended;
                Ok(Lease::new(
                    lease.queue().clone(),
                    lease.token(),
                    *expires_at,
                ))
            }
            _ => Err(QueueError::LeaseLost {
                queue: lease.queue().clone(),
            }),
        }
    }

    /// A delivery is held at most the delivery timeout: past it QStash gives up on the
    /// answer and delivers again.
    fn lease_limits(&self) -> LeaseLimits {
        LeaseLimits::per_delivery(self.delivery_timeout)
    }
}

/// Removes a delivery's slot if the request is dropped before it is answered.
struct SlotGuard<'a> {
    consumer: &'a PushConsumer,
    token: String,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.consumer.take(&self.token);
    }
}

/// The endpoint of one queue: verifies QStash's requests and answers them with the runtime's
/// decision.
///
/// ```no_run
/// use std::sync::Arc;
/// use jobs_adapter_qstash::{Processed, PushConsumer, PushRequest, Receiver, SigningKeys};
///
/// # async fn example(headers: reqwest::header::HeaderMap, body: Vec<u8>) {
/// let consumer = Arc::new(PushConsumer::default());
/// // Build the worker with `consumer.clone()` as its transport, then for each request:
/// let receiver = Receiver::new(
///     "billing.invoices".parse().unwrap(),
///     "https://app.example.com/qstash/invoices",
///     SigningKeys::new("sig_current", "sig_next"),
///     consumer,
/// );
/// let answer = receiver
///     .handle(PushRequest::from_headers(&headers, body), |delivery| async move {
///         // worker.process(delivery).await, mapped to Processed
///         let _ = delivery;
///         Processed::Settled
///     })
///     .await;
/// assert!(answer.status >= 200);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Receiver {
    queue: QueueName,
    url: String,
    keys: SigningKeys,
    tolerance: Duration,
    lease: Duration,
    consumer: Arc<PushConsumer>,
    republisher: Option<QStashQueue>,
    last_attempt: Option<u32>,
    clock: Arc<dyn Clock>,
}

impl Receiver {
    /// The endpoint of `queue` served at `url` (the `sub` QStash signs), verifying with `keys`
    /// and settling through `consumer` (the worker's transport).
    pub fn new(
        queue: QueueName,
        url: impl Into<String>,
        keys: SigningKeys,
        consumer: Arc<PushConsumer>,
    ) -> Self {
        Receiver {
            queue,
            url: url.into(),
            keys,
            tolerance: DEFAULT_CLOCK_TOLERANCE,
            lease: consumer.delivery_timeout(),
            consumer,
            republisher: None,
            last_attempt: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Allows `tolerance` of clock skew on `exp` and `nbf` (default 5 s).
    pub fn with_clock_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Leases each delivery for `lease` (default: the consumer's delivery timeout,
    /// [`PushConsumer::with_delivery_timeout`]); keep it at or below the `Upstash-Timeout`
    /// messages are published with.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Defers by republishing through `queue` (see ADR 0010); without it a deferral is answered
    /// 503 with `Retry-After`, which spends a QStash retry.
    pub fn with_republisher(mut self, queue: QStashQueue) -> Self {
        self.republisher = Some(queue);
        self
    }

    /// Reports no delivery beyond attempt `last` (the destination's retries plus one), so that
    /// a replayed signed request with a forged attempt count cannot skip its handler (ADR
    /// 0010). A republisher's destination says it already; without one, say it here.
    pub fn with_last_attempt(mut self, last: u32) -> Self {
        self.last_attempt = Some(last.max(1));
        self
    }

    /// Checks signatures and computes `Retry-After` on `clock` (default: the system clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The destination's last attempt, as [`Receiver::with_last_attempt`] or the
    /// republisher's configuration says.
    fn last_attempt(&self) -> Option<u32> {
        if self.last_attempt.is_some() {
            return self.last_attempt;
        }
        let destination = self
            .republisher
            .as_ref()?
            .config()
            .destination(&self.queue)?;
        Some(destination.retry().max_attempts())
    }

    /// Verifies the request and turns it into a leased [`Delivery`], or the answer refusing it
    /// (401 for a bad signature, 400 for malformed delivery headers). The body is not parsed.
    fn accept(&self, request: &PushRequest) -> Result<Delivery, Box<PushResponse>> {
        let Some(signature) = &request.signature else {
            return Err(Box::new(unauthorised(&SignatureError::Missing)));
        };
        if let Err(e) = verify_signature(
            signature,
            Some(&self.url),
            &request.body,
            self.clock.now(),
            &self.keys,
            self.tolerance,
        ) {
            tracing::warn!(queue = %self.queue, reason = %e, "QStash delivery refused");
            return Err(Box::new(unauthorised(&e)));
        }
        let number = |value: &Option<String>, name: &str| -> Result<u32, Box<PushResponse>> {
            value.as_deref().map_or(Ok(0), |v| {
                v.parse::<u32>().map_err(|_| {
                    Box::new(PushResponse::new(
                        400,
                        json!({ "error": format!("{name} is not a number: `{v}`") }),
                    ))
                })
            })
        };
        let retried = number(&request.retried, "Upstash-Retried")?;
        let spent = number(&request.attempts_spent, "Jobs-Attempts-Spent")?;
        let message_id = request.message_id.clone().unwrap_or_default();
        let lease = self.consumer.open(&self.queue, &message_id, self.lease);
        let mut attempt = spent.saturating_add(retried).saturating_add(1);
        // Neither count is covered by the signature, so a signed request replayed with a
        // forged one must not take a job past its last attempt: it is at most the last, its
        // handler still runs, and only its failure dead-letters it.
        if let Some(last) = self.last_attempt() {
            attempt = attempt.min(last);
        }
        Ok(Delivery::new(
            request.body.clone(),
            attempt,
            (!message_id.is_empty()).then_some(message_id),
            lease,
        ))
    }

    /// Verifies `request`, runs `run` on its delivery (the worker: `worker.process(delivery)`,
    /// reporting whether it dead-lettered), and answers with the settlement made through the
    /// [`PushConsumer`]:
    ///
    /// - ack → 200; ack of a dead letter → 489 with `Upstash-NonRetryable-Error: true`;
    /// - `retry_at(T)` → 500 with `Retry-After` (seconds to `T`, rounded up);
    /// - `defer(T)` → republished for `T` with the attempts carried, then 200 (503 with
    ///   `Retry-After` if that fails or no republisher is configured);
    /// - no settlement (the ack or the dead letter failed) → 500 without `Retry-After`: QStash
    ///   redelivers on its own schedule, and the processed row makes it a duplicate.
    pub async fn handle<F, Fut>(&self, request: PushRequest, run: F) -> PushResponse
    where
        F: FnOnce(Delivery) -> Fut,
        Fut: Future<Output = Processed>,
    {
        let delivery = match self.accept(&request) {
            Ok(delivery) => delivery,
            Err(answer) => return *answer,
        };
        let attempt = delivery.attempt;
        let message_id = delivery.message_id.clone().unwrap_or_default();
        let guard = SlotGuard {
            consumer: &self.consumer,
            token: delivery.lease.token().to_owned(),
        };
        let span = tracing::info_span!(
            "qstash_delivery",
            queue = %self.queue,
            message_id = %message_id,
            attempt,
        );
        let processed = tracing::Instrument::instrument(run(delivery), span).await;
        let settled = self.consumer.take(&guard.token);
        drop(guard);
        self.answer(settled, processed, request.body, attempt).await
    }

    async fn answer(
        &self,
        settled: Option<Slot>,
        processed: Processed,
        body: Vec<u8>,
        attempt: u32,
    ) -> PushResponse {
        let now = self.clock.now();
        match settled {
            Some(Slot::Acked) if processed == Processed::DeadLettered => {
                PushResponse::new(NON_RETRYABLE_STATUS, json!({ "status": "dead_lettered" }))
                    .header("upstash-nonretryable-error", "true".to_owned())
            }
            Some(Slot::Acked) => PushResponse::new(200, json!({ "status": "processed" })),
            Some(Slot::RetryAt(at)) => PushResponse::new(500, json!({ "status": "retry" }))
                .header("retry-after", seconds_until(now, at)),
            Some(Slot::Deferred(until)) => self.defer(body, until, attempt, now).await,
            Some(Slot::Open { .. }) | None => {
                PushResponse::new(500, json!({ "status": "unsettled" }))
            }
        }
    }

    async fn defer(
        &self,
        body: Vec<u8>,
        until: SystemTime,
        attempt: u32,
        now: SystemTime,
    ) -> PushResponse {
        let retry_later = || {
            PushResponse::new(503, json!({ "status": "deferred" }))
                .header("retry-after", seconds_until(now, until))
        };
        let Some(publisher) = &self.republisher else {
            return retry_later();
        };
        let max_attempts = publisher
            .config()
            .destination(&self.queue)
            .map_or(1, |d| d.retry().max_attempts());
        let retries = max_attempts.saturating_sub(attempt);
        match publisher
            .republish_deferred(&self.queue, body, until, attempt.saturating_sub(1), retries)
            .await
        {
            Ok(receipt) => PushResponse::new(
                200,
                json!({ "status": "deferred", "messageId": receipt.message_id }),
            ),
            Err(e) => {
                tracing::warn!(queue = %self.queue, error = %e, "republishing a deferral failed; QStash will retry");
                retry_later()
            }
        }
    }
}

fn unauthorised(e: &SignatureError) -> PushResponse {
    PushResponse::new(401, json!({ "error": e.to_string() }))
}

/// Whole seconds from `now` to `at`, rounded up; 0 when past.
fn seconds_until(now: SystemTime, at: SystemTime) -> String {
    let d = at.duration_since(now).unwrap_or_default();
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::{body_hash, sign_for_tests};
    use crate::{Destination, QStashConfig};
    use jobs_core::ManualClock;
    use std::time::UNIX_EPOCH;

    const CURRENT: &str = "sig_7kYjw48mhY7kAjqNGcy6cr29RJ6r";
    const NEXT: &str = "sig_5ZB6DVzB1wjE8S6rZ7eenA8Pdnhs";
    const URL: &str = "https://example.com/qstash/jobs";

    /// A request QStash signed, replayed with `Upstash-Retried` forged to `retried`.
    fn replayed(retried: &str) -> PushRequest {
        let body = b"{}".to_vec();
        let jwt = sign_for_tests(
            CURRENT,
            &serde_json::json!({
                "iss": "Upstash", "sub": URL, "exp": 1_000_300u64, "nbf": 1_000_000u64,
                "iat": 1_000_000u64, "jti": "jwt_x", "body": body_hash(&body),
            }),
        );
        PushRequest::new(body)
            .signature(jwt)
            .retried(retried)
            .message_id("msg_1")
    }

    #[tokio::test]
    async fn a_forged_attempt_count_stops_at_the_destination_s_last_attempt() {
        let queue: QueueName = "jobs.push".parse().expect("valid");
        let clock = ManualClock::default();
        clock.set(UNIX_EPOCH + Duration::from_secs(1_000_100));
        let publisher = QStashQueue::new(
            QStashConfig::new("token").with_destination(queue.clone(), Destination::new(URL)),
        )
        .expect("valid");
        let last = publisher
            .config()
            .destination(&queue)
            .expect("configured")
            .retry()
            .max_attempts();
        let receiver = Receiver::new(
            queue,
            URL,
            SigningKeys::new(CURRENT, NEXT),
            Arc::new(PushConsumer::new(Arc::new(clock.clone()))),
        )
        .with_clock(Arc::new(clock))
        .with_republisher(publisher);
        for (retried, attempt) in [("0", 1), ("2", 3), ("999", last)] {
            let delivery = receiver.accept(&replayed(retried)).expect("verified");
            assert_eq!(delivery.attempt, attempt, "Upstash-Retried: {retried}");
        }
        // Without a republisher, the last attempt given to the receiver bounds it.
        let told = Receiver::new(
            "jobs.push".parse().expect("valid"),
            URL,
            SigningKeys::new(CURRENT, NEXT),
            Arc::new(PushConsumer::new(receiver.clock.clone())),
        )
        .with_clock(receiver.clock.clone())
        .with_last_attempt(4);
        for (retried, attempt) in [("1", 2), ("3", 4), ("999", 4)] {
            let delivery = told.accept(&replayed(retried)).expect("verified");
            assert_eq!(
                delivery.attempt, attempt,
                "told, Upstash-Retried: {retried}"
            );
        }
    }
}

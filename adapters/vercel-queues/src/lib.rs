//! Vercel Queues as the default production queue of softcrum-jobs.
//!
//! [`VercelQueues`] implements [`QueuePort`], [`PullPort`] and [`SettlePort`] over Vercel's HTTP API
//! (`https://{region}.vercel-queue.com/api/v3/topic/…`):
//!
//! - **publish** is `POST /{topic}` with the envelope as the JSON body, the dedup key as
//!   `Vqs-Idempotency-Key`, delays and [`schedule`](QueuePort::schedule) as
//!   `Vqs-Delay-Seconds` (refused locally beyond the retention), and a 202 "deferred" answer
//!   taken as success without a message id; [`VercelQueues::publish_batch`] uses the
//!   `multipart/mixed` `/batch` endpoint, 100 messages a request;
//! - **pull** consumption leases up to 10 messages per request from a consumer group, acks
//!   with `DELETE …/lease/{receipt handle}`, and retries and extends with `PATCH` on the lease;
//! - **push** consumption ([`push`]) turns Vercel's binary-mode callback into a [`Delivery`]
//!   for the same runtime and answers as Vercel expects.
//!
//! Queue names map to topics one to one ([`topic_of`]). The delivery count is the attempt
//! number. Vercel counts every lease as a delivery, so a deferral ([`SettlePort::defer`]),
//! which must not spend an attempt, requeues a copy of the message that carries the attempts
//! already spent in its `Content-Type` (`application/json; softcrum-attempts=N`) and acks the
//! original; so does a retry later than one lease can reach (1 h).
//!
//! Vercel Queues has no dead-letter queue and no depth API: the runtime's dead letters are the
//! only ones (exhausted messages are dead-lettered, then acked), and this adapter does not
//! implement [`QueueDepth`](jobs_core::QueueDepth). A publish answered as a duplicate is not
//! reported ([`Receipt::duplicate`] stays `false`): Vercel drops duplicates out of band.
//!
//! Nor can it share a queue out among tenants: a consumer group leases in Vercel's order,
//! and nothing in the API selects by tenant or counts a tenant's leases. A worker asked to be
//! fair over it (`WorkerBuilder::fair` in `jobs-consumers`) fails to build, saying so.
//!
//! See `docs/adr/0009-vercel-queues-adapter.md` for the wire facts and their sources.

mod config;
mod http;
mod multipart;
pub mod push;
mod topic;

pub use config::{
    AccessToken, ConfigError, DEFAULT_CONSUMER_GROUP, DEFAULT_RETENTION, MAX_IDEMPOTENCY_KEY,
    MAX_RECEIVE, MAX_RETENTION, MAX_VISIBILITY, MIN_RETENTION, Region, StaticToken, TokenError,
    TokenSource, VercelQueuesConfig,
};
pub use topic::{NameError, TopicError, queue_of_topic, topic_of};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    Clock, DecodeLimits, Delivery, Envelope, JobId, Lease, PublishOptions, PullPort, QueueError,
    QueueName, QueuePort, Receipt, SettlePort, SystemClock,
};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use crate::http::{Answer, Call, Http, value};

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("vqs-idempotency-key");
const DELAY_SECONDS: HeaderName = HeaderName::from_static("vqs-delay-seconds");
const RETENTION_SECONDS: HeaderName = HeaderName::from_static("vqs-retention-seconds");
const MAX_MESSAGES: HeaderName = HeaderName::from_static("vqs-max-messages");
const VISIBILITY_TIMEOUT: HeaderName = HeaderName::from_static("vqs-visibility-timeout-seconds");
const MESSAGE_ID: &str = "vqs-message-id";
const RECEIPT_HANDLE: &str = "vqs-receipt-handle";
const DELIVERY_COUNT: &str = "vqs-delivery-count";

/// The content type of a published envelope.
const JSON: &str = "application/json";
/// The `Content-Type` parameter carrying the attempts a requeued copy has already spent.
const ATTEMPTS_PARAM: &str = "softcrum-attempts";
/// The most parts one `/batch` request may carry.
pub const MAX_BATCH: usize = 100;
/// How long past its lease the adapter remembers a delivery it may have to requeue.
const IN_FLIGHT_GRACE: Duration = Duration::from_secs(300);

/// Vercel Queues, both publishing and consuming. Cheap to clone: clones share the HTTP
/// client, the token cache and the deliveries in flight.
#[derive(Clone)]
pub struct VercelQueues {
    http: Arc<Http>,
    clock: Arc<dyn Clock>,
    in_flight: Arc<Mutex<HashMap<String, InFlight>>>,
    limits: DecodeLimits,
}

/// What a requeue needs of a delivery this adapter handed out.
struct InFlight {
    payload: Vec<u8>,
    attempt: u32,
    message_id: String,
    delivery_count: u32,
    lease_expires: SystemTime,
}

impl std::fmt::Debug for VercelQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VercelQueues")
            .field("config", &self.http.config)
            .finish_non_exhaustive()
    }
}

impl VercelQueues {
    /// An adapter for `config`, on the system clock.
    pub fn new(config: VercelQueuesConfig) -> Result<VercelQueues, ConfigError> {
        VercelQueues::with_clock(config, Arc::new(SystemClock))
    }

    /// An adapter whose delays, schedules and leases are computed on `clock` (which must agree
    /// with the server's; tests pair a manual clock with an emulator's).
    pub fn with_clock(
        config: VercelQueuesConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<VercelQueues, ConfigError> {
        Ok(VercelQueues {
            http: Arc::new(Http::new(config, clock.clone())?),
            clock,
            in_flight: Arc::default(),
            limits: DecodeLimits::default(),
        })
    }

    /// Refuses at publish, with [`QueueError::TooLarge`] and nothing sent, envelopes longer
    /// than `limits` allow: the limits the consumers decode with (the default matches theirs).
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The configuration in use.
    pub fn config(&self) -> &VercelQueuesConfig {
        &self.http.config
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<String, InFlight>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes many envelopes to `queue` through the `/batch` endpoint, [`MAX_BATCH`] per
    /// request, and answers one result per envelope, in order.
    ///
    /// An item Vercel refuses fails alone; a request that fails as a whole fails each of its
    /// items with the same error. Retrying a failed item is safe: its dedup key goes with it.
    pub async fn publish_batch(
        &self,
        queue: &QueueName,
        items: &[(Envelope, PublishOptions)],
    ) -> Vec<Result<Receipt, QueueError>> {
        let topic = topic_of(queue);
        let mut results = Vec::with_capacity(items.len());
        for chunk in items.chunks(MAX_BATCH) {
            let mut encoded = Vec::with_capacity(chunk.len());
            let mut slots: Vec<Option<Result<Receipt, QueueError>>> = Vec::new();
            for (envelope, opts) in chunk {
                match self.message(queue, envelope, opts) {
                    Ok(message) => {
                        encoded.push(message);
                        slots.push(None);
                    }
                    Err(e) => slots.push(Some(Err(e))),
                }
            }
            let mut answers = if encoded.is_empty() {
                Vec::new()
            } else {
                self.send_batch(queue, &topic, &encoded).await
            }
            .into_iter();
            for slot in slots {
                results.push(match slot {
                    Some(refused) => refused,
                    None => answers.next().expect("one answer per encoded message"),
                });
            }
        }
        results
    }

    async fn send_batch(
        &self,
        queue: &QueueName,
        topic: &str,
        messages: &[Message],
    ) -> Vec<Result<Receipt, QueueError>> {
        let boundary = format!("vqs-{}", JobId::generate());
        let parts: Vec<_> = messages
            .iter()
            .map(|m| (m.part_headers(), m.body.as_slice()))
            .collect();
        let body = multipart::write(&boundary, &parts);
        let path = [topic, "batch"];
        let call = Call::new(Method::POST, &path).body(body);
        let content_type = match value(&format!("multipart/mixed; boundary={boundary}")) {
            Ok(v) => v,
            Err(reason) => return each(messages.len(), || rejected(queue, &reason)),
        };
        let answer = match self
            .http
            .send(queue, call.header(CONTENT_TYPE, content_type))
            .await
        {
            Ok(answer) if answer.status.is_success() => answer,
            Ok(answer) => return each(messages.len(), || answer.rejected(queue)),
            Err(e) => return each(messages.len(), || same_error(&e, queue)),
        };
        #[derive(Deserialize)]
        struct Results {
            results: Vec<ItemResult>,
        }
        #[derive(Deserialize)]
        #[serde(tag = "status", rename_all = "lowercase")]
        enum ItemResult {
            Sent {
                #[serde(rename = "messageId")]
                message_id: Option<String>,
            },
            Deferred,
            Failed {
                #[serde(rename = "statusCode")]
                status_code: Option<u16>,
                error: Option<String>,
                #[serde(default)]
                retryable: bool,
            },
        }
        let results = match serde_json::from_slice::<Results>(&answer.body) {
            Ok(parsed) if parsed.results.len() == messages.len() => parsed.results,
            _ => {
                let message = format!(
                    "Vercel Queues answered a batch of {} without one result per message: {}",
                    messages.len(),
                    answer.message()
                );
                return each(messages.len(), || unavailable(queue, message.clone()));
            }
        };
        results
            .into_iter()
            .map(|result| match result {
                ItemResult::Sent { message_id } => Ok(Receipt::queued(message_id)),
                ItemResult::Deferred => Ok(Receipt::queued(None)),
                ItemResult::Failed {
                    status_code,
                    error,
                    retryable,
                } => {
                    let reason = format!(
                        "HTTP {}: {}",
                        status_code.map_or("?".to_owned(), |s| s.to_string()),
                        error.unwrap_or_default()
                    );
                    Err(match (retryable, status_code) {
                        (true, Some(429)) => QueueError::RateLimited {
                            queue: queue.clone(),
                            retry_after: None,
                        },
                        (true, _) => unavailable(queue, reason),
                        (false, _) => rejected(queue, &reason),
                    })
                }
            })
            .collect()
    }

    /// The envelope as Vercel will store it, or why it cannot be sent.
    fn message(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: &PublishOptions,
    ) -> Result<Message, QueueError> {
        let body = envelope.encode_for(queue, &self.limits)?;
        let key = opts.dedup_key_for(envelope).into_owned();
        Message::new(
            self.config(),
            queue,
            body,
            JSON.to_owned(),
            Some(key),
            opts.delay_from(queue, self.clock.now())?,
        )
    }

    async fn send(&self, queue: &QueueName, message: Message) -> Result<Receipt, QueueError> {
        let topic = topic_of(queue);
        let path = [topic.as_str()];
        let mut call = Call::new(Method::POST, &path).body(message.body);
        call.headers = message.headers;
        let answer = self.http.send(queue, call).await?;
        match answer.status {
            StatusCode::ACCEPTED => Ok(Receipt::queued(None)),
            status if status.is_success() => Ok(Receipt::queued(message_id(&answer))),
            _ => Err(answer.rejected(queue)),
        }
    }
}

/// One message ready to send: body and `Vqs-*` headers.
struct Message {
    body: Vec<u8>,
    headers: HeaderMap,
}

impl Message {
    fn new(
        config: &VercelQueuesConfig,
        queue: &QueueName,
        body: Vec<u8>,
        content_type: String,
        key: Option<String>,
        delay: Option<Duration>,
    ) -> Result<Message, QueueError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            value(&content_type).map_err(|r| rejected(queue, &r))?,
        );
        if let Some(key) = key {
            if key.len() > MAX_IDEMPOTENCY_KEY {
                return Err(rejected(
                    queue,
                    &format!(
                        "dedup key is {} bytes, over Vercel's {MAX_IDEMPOTENCY_KEY}",
                        key.len()
                    ),
                ));
            }
            let key = value(&key).map_err(|r| rejected(queue, &format!("dedup key: {r}")))?;
            headers.insert(IDEMPOTENCY_KEY, key);
        }
        let retention = config.effective_retention();
        if let Some(delay) = delay.filter(|d| !d.is_zero()) {
            if delay > retention {
                return Err(rejected(
                    queue,
                    &format!(
                        "a delay of {}s is beyond the retention of {}s: Vercel would drop the \
                         message before it is due (raise the retention, up to 7 days)",
                        delay.as_secs_f64().ceil(),
                        retention.as_secs()
                    ),
                ));
            }
            headers.insert(DELAY_SECONDS, seconds(delay).into());
        }
        if let Some(retention) = config.retention {
            headers.insert(RETENTION_SECONDS, retention.as_secs().into());
        }
        Ok(Message { body, headers })
    }

    fn part_headers(&self) -> Vec<(&str, String)> {
        self.headers
            .iter()
            .filter_map(|(name, v)| Some((name.as_str(), v.to_str().ok()?.to_owned())))
            .collect()
    }
}

/// Whole seconds, rounded up: a message is never delivered early.
fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn message_id(answer: &Answer) -> Option<String> {
    #[derive(Deserialize)]
    struct Sent {
        #[serde(rename = "messageId")]
        message_id: Option<String>,
    }
    serde_json::from_slice::<Sent>(&answer.body)
        .ok()
        .and_then(|s| s.message_id)
        .or_else(|| answer.header(MESSAGE_ID).map(str::to_owned))
}

fn rejected(queue: &QueueName, reason: &str) -> QueueError {
    QueueError::Rejected {
        queue: queue.clone(),
        reason: reason.to_owned(),
    }
}

fn unavailable(queue: &QueueName, message: String) -> QueueError {
    QueueError::Unavailable {
        queue: queue.clone(),
        message,
        source: None,
    }
}

/// The same failure again, for each item of a batch that failed as a whole.
fn same_error(e: &QueueError, queue: &QueueName) -> QueueError {
    match e {
        QueueError::RateLimited { queue, retry_after } => QueueError::RateLimited {
            queue: queue.clone(),
            retry_after: *retry_after,
        },
        QueueError::LeaseLost { queue } => QueueError::LeaseLost {
            queue: queue.clone(),
        },
        QueueError::Rejected { queue, reason } => rejected(queue, reason),
        QueueError::Unavailable { queue, message, .. } => unavailable(queue, message.clone()),
        other => unavailable(queue, other.to_string()),
    }
}

fn each<T>(n: usize, mut make: impl FnMut() -> QueueError) -> Vec<Result<T, QueueError>> {
    (0..n).map(|_| Err(make())).collect()
}

#[async_trait]
impl QueuePort for VercelQueues {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let message = self.message(queue, envelope, &opts)?;
        self.send(queue, message).await
    }
}

/// A lease token: the consumer group and Vercel's receipt handle. Group names never hold `/`,
/// so the first `/` separates them.
fn lease_token(group: &str, receipt_handle: &str) -> String {
    format!("{group}/{receipt_handle}")
}

fn split_token(lease: &Lease) -> Result<(&str, &str), QueueError> {
    lease
        .token()
        .split_once('/')
        .ok_or_else(|| rejected(lease.queue(), "the lease was not issued by Vercel Queues"))
}

/// The attempts a message spent before this copy was published.
fn attempts_spent(content_type: Option<&str>) -> u32 {
    content_type
        .into_iter()
        .flat_map(|ct| ct.split(';').skip(1))
        .find_map(|param| {
            let (name, value) = param.split_once('=')?;
            (name.trim() == ATTEMPTS_PARAM).then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

impl VercelQueues {
    /// Turns one received message into a delivery and remembers it for a requeue.
    fn deliver(
        &self,
        queue: &QueueName,
        group: &str,
        part: multipart::Part,
        lease_expires: SystemTime,
    ) -> Result<Delivery, QueueError> {
        let header = |name: &str| {
            part.header(name).ok_or_else(|| {
                unavailable(
                    queue,
                    format!("Vercel Queues sent a message without `{name}`"),
                )
            })
        };
        let message_id = header(MESSAGE_ID)?.to_owned();
        let receipt_handle = header(RECEIPT_HANDLE)?.to_owned();
        let delivery_count: u32 = header(DELIVERY_COUNT)?
            .parse()
            .map_err(|_| unavailable(queue, format!("`{DELIVERY_COUNT}` is not a number")))?;
        let attempt = attempts_spent(part.header("content-type")) + delivery_count.max(1);
        Ok(self.track(
            queue,
            group,
            &receipt_handle,
            message_id,
            delivery_count,
            attempt,
            part.body,
            lease_expires,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn track(
        &self,
        queue: &QueueName,
        group: &str,
        receipt_handle: &str,
        message_id: String,
        delivery_count: u32,
        attempt: u32,
        payload: Vec<u8>,
        lease_expires: SystemTime,
    ) -> Delivery {
        let token = lease_token(group, receipt_handle);
        self.in_flight().insert(
            token.clone(),
            InFlight {
                payload: payload.clone(),
                attempt,
                message_id: message_id.clone(),
                delivery_count,
                lease_expires,
            },
        );
        let lease = Lease::new(queue.clone(), token, lease_expires);
        Delivery::new(payload, attempt, Some(message_id), lease)
    }

    /// Forgets deliveries whose lease ran out long ago (their worker is gone).
    fn prune(&self, now: SystemTime) {
        self.in_flight()
            .retain(|_, f| f.lease_expires + IN_FLIGHT_GRACE > now);
    }

    async fn lease_call(
        &self,
        lease: &Lease,
        method: Method,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, QueueError> {
        let queue = lease.queue();
        let topic = topic_of(queue);
        let (group, receipt_handle) = split_token(lease)?;
        let path = [topic.as_str(), "consumer", group, "lease", receipt_handle];
        let mut call = Call::new(method, &path);
        if let Some(body) = body {
            call = call
                .header(
                    CONTENT_TYPE,
                    reqwest::header::HeaderValue::from_static(JSON),
                )
                .body(body);
        }
        let answer = self.http.send(queue, call).await?;
        match answer.status {
            s if s.is_success() => Ok(answer),
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => {
                self.in_flight().remove(lease.token());
                tracing::debug!(%queue, answer = %answer.message(), "lease no longer held");
                Err(QueueError::LeaseLost {
                    queue: queue.clone(),
                })
            }
            _ => Err(answer.rejected(queue)),
        }
    }

    /// Makes the message invisible for `secs` from now (Vercel's visibility `PATCH`).
    /// Sets the visibility of a pushed delivery's lease, which answers `LeaseLost` unless the
    /// receipt handle is a live lease of our consumer group.
    pub(crate) async fn confirm_lease(&self, lease: &Lease, secs: u64) -> Result<(), QueueError> {
        self.set_visibility(lease, secs).await.map(drop)
    }

    async fn set_visibility(&self, lease: &Lease, secs: u64) -> Result<Answer, QueueError> {
        let body = serde_json::to_vec(&serde_json::json!({ "visibilityTimeoutSeconds": secs }))?;
        self.lease_call(lease, Method::PATCH, Some(body)).await
    }

    /// Publishes a copy of the leased message, due at `at`, that carries `spent` attempts,
    /// then acks the original. A crash in between leaves both; the runtime's processed_jobs
    /// makes the second one a no-op.
    async fn requeue(
        &self,
        lease: &Lease,
        at: SystemTime,
        spent: impl Fn(u32) -> u32,
    ) -> Result<(), QueueError> {
        let queue = lease.queue();
        let (payload, key, spent) = {
            let in_flight = self.in_flight();
            let f = in_flight.get(lease.token()).ok_or_else(|| {
                rejected(
                    queue,
                    "cannot requeue: the delivery was not received through this adapter instance",
                )
            })?;
            let key = format!("requeued-{}-{}", f.message_id, f.delivery_count);
            (f.payload.clone(), key, spent(f.attempt))
        };
        let delay = at.duration_since(self.clock.now()).unwrap_or_default();
        let content_type = format!("{JSON}; {ATTEMPTS_PARAM}={spent}");
        let key = (key.len() <= MAX_IDEMPOTENCY_KEY).then_some(key);
        let copy = Message::new(
            self.config(),
            queue,
            payload,
            content_type,
            key,
            Some(delay),
        )?;
        self.send(queue, copy).await?;
        self.ack(lease).await
    }
}

#[async_trait]
impl PullPort for VercelQueues {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        self.prune(now);
        let topic = topic_of(queue);
        let group = self.config().consumer_group.clone();
        let secs = seconds(lease).clamp(1, MAX_VISIBILITY.as_secs());
        let path = [topic.as_str(), "consumer", &group];
        let call = Call::new(Method::POST, &path)
            .header(
                ACCEPT,
                reqwest::header::HeaderValue::from_static("multipart/mixed"),
            )
            .header(MAX_MESSAGES, max.min(MAX_RECEIVE).into())
            .header(VISIBILITY_TIMEOUT, secs.into());
        let answer = self.http.send(queue, call).await?;
        match answer.status {
            StatusCode::NO_CONTENT => return Ok(Vec::new()),
            StatusCode::OK => {}
            _ => return Err(answer.rejected(queue)),
        }
        let parts = parse_parts(queue, &answer)?;
        let expires = now + Duration::from_secs(secs);
        parts
            .into_iter()
            .map(|part| self.deliver(queue, &group, part, expires))
            .collect()
    }
}

#[async_trait]
impl SettlePort for VercelQueues {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.lease_call(lease, Method::DELETE, None).await?;
        self.in_flight().remove(lease.token());
        Ok(())
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        let wait = seconds(at.duration_since(self.clock.now()).unwrap_or_default());
        if wait <= MAX_VISIBILITY.as_secs() {
            match self.set_visibility(lease, wait).await {
                Ok(_) => {
                    self.in_flight().remove(lease.token());
                    return Ok(());
                }
                // Beyond the message's expiry: only a fresh copy can wait that long.
                Err(QueueError::Rejected { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.requeue(lease, at, |attempt| attempt).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.requeue(lease, until, |attempt| attempt.saturating_sub(1))
            .await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let secs = seconds(by).clamp(1, MAX_VISIBILITY.as_secs());
        self.set_visibility(lease, secs).await?;
        let expires = self.clock.now() + Duration::from_secs(secs);
        if let Some(f) = self.in_flight().get_mut(lease.token()) {
            f.lease_expires = expires;
        }
        Ok(Lease::new(lease.queue().clone(), lease.token(), expires))
    }

    /// One visibility timeout is at most [`MAX_VISIBILITY`]; extensions go on until the
    /// message expires.
    fn lease_limits(&self) -> jobs_core::LeaseLimits {
        jobs_core::LeaseLimits::per_lease(MAX_VISIBILITY)
    }
}

/// The parts of a `multipart/mixed` receive answer.
fn parse_parts(queue: &QueueName, answer: &Answer) -> Result<Vec<multipart::Part>, QueueError> {
    let content_type = answer.header("content-type").unwrap_or_default();
    let boundary = multipart::boundary(content_type).ok_or_else(|| {
        unavailable(
            queue,
            format!("Vercel Queues answered a receive with `{content_type}`, not multipart/mixed"),
        )
    })?;
    multipart::parse(&answer.body, boundary)
        .map_err(|e| unavailable(queue, format!("malformed multipart answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_spent_reads_our_parameter_only() {
        assert_eq!(attempts_spent(None), 0);
        assert_eq!(attempts_spent(Some("application/json")), 0);
        assert_eq!(
            attempts_spent(Some("application/json; softcrum-attempts=3")),
            3
        );
        assert_eq!(
            attempts_spent(Some("application/json;charset=utf-8; softcrum-attempts=2")),
            2
        );
        assert_eq!(
            attempts_spent(Some("application/json; softcrum-attempts=x")),
            0
        );
    }

    #[test]
    fn delays_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::ZERO), 0);
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(2000)), 2);
        assert_eq!(seconds(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn lease_tokens_split_at_the_first_slash() {
        let queue: QueueName = "a.b".parse().unwrap();
        let token = lease_token("workers", "rh_1:msg_1:workers /needs encoding");
        let lease = Lease::new(queue, token, SystemTime::UNIX_EPOCH);
        assert_eq!(
            split_token(&lease).unwrap(),
            ("workers", "rh_1:msg_1:workers /needs encoding")
        );
    }
}

//! A local fake of the Vercel Queues HTTP API (v3), with fault hooks.
//!
//! Vercel's own offline emulator (PyPI `vercel-queue`, `vercel/queue/_internal/embedded.py`) is
//! the oracle for the basics; this fake reproduces its wire behaviour and adds what the emulator
//! lacks: `/batch`, `202` deferred sends, injected errors with `Retry-After`, slow answers,
//! leases that expire on demand and push callbacks. Wire facts (docs/adr/0009 and the vendor
//! notes it cites):
//!
//! - every route is under `/api/v3/topic/{topic}`, each path segment percent-decoded; topic and
//!   consumer-group names match `^[A-Za-z0-9_-]+$`, else `400`; requests need
//!   `Authorization: Bearer <token>`, else `401`; errors are `{"error": "…"}`;
//! - `POST /api/v3/topic/{topic}` sends the raw body with its `Content-Type` (default
//!   `application/octet-stream`), `Vqs-Retention-Seconds` (60 to 604 800, default 86 400),
//!   `Vqs-Delay-Seconds` (at most the retention) and `Vqs-Idempotency-Key` (at most 256
//!   characters, else `400`, which the emulator does not check): `201`
//!   `{"messageId"}` with a `Vqs-Message-Id` header. A send with the key, topic, deployment and
//!   payload of an
//!   earlier one within `min(retention, 24 h)` gets a new id but is never delivered (as the
//!   emulator; receiving it by id is `409` with `originalMessageId`);
//! - `POST …/{topic}/batch`: `multipart/mixed` with 1 to 100 parts, each with its own
//!   `Content-Type` and `Vqs-*` headers, answered `200` `{"results": […]}` in input order,
//!   each `{"status": "sent", "messageId"}`, `{"status": "deferred", "messageId": null}` or
//!   `{"status": "failed", "statusCode", "error", "retryable"}`;
//! - `POST …/consumer/{group}` with `Accept: multipart/mixed` (else `400`),
//!   `Vqs-Max-Messages` (1 to 10, default 1) and `Vqs-Visibility-Timeout-Seconds` (0 to 3 600,
//!   default 60): `204` when nothing is visible, else `200` `multipart/mixed`, one part per
//!   message with `Content-Type`, `Vqs-Message-Id`, `Vqs-Receipt-Handle`,
//!   `Vqs-Delivery-Count` (per message and group, from 1), `Vqs-Timestamp` and
//!   `Vqs-Expires-At`, the payload as body;
//! - `POST …/consumer/{group}/id/{messageId}`: one part as above; `404` unknown or expired,
//!   `409` + `Retry-After` while leased, `409` + `originalMessageId` for a duplicate, `410`
//!   once acked by the group;
//! - `DELETE …/consumer/{group}/lease/{receiptHandle}` acks (`204`); `PATCH` with
//!   `{"visibilityTimeoutSeconds": n}` moves the lease deadline (`200` `{"success": true}`, `400`
//!   beyond the message's expiry); both answer `404` for an unknown handle and `409` for a
//!   lease that has expired or is no longer the message's current one. A trailing
//!   `/visibility` is accepted on `PATCH`, as the emulator does.
//!
//! Receipt handles look like the emulator's, `rh_<n>:<message id>:<group> /lease`: a client
//! that does not percent-encode them fails. A `Vqs-Deployment-Id` must match the name pattern
//! (else `400`) and partitions as in the emulator: a send with it belongs to that deployment,
//! one without to none; a consumer with it receives (by id too) and settles only that
//! deployment's messages (another's are `404`), one without receives them all; idempotency
//! keys are per deployment. The `application/x-ndjson` receive format is not served, and there
//! is no background push dispatcher: a test pushes with [`FakeVercelQueues::push_next`]
//! (unpinned). Times are real
//! (`SystemTime`); the texts of the error messages are the fake's own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Server, error, fresh_secret, json_response};

/// The path prefix of every route.
const PREFIX: &str = "/api/v3/topic/";
/// Retention when `Vqs-Retention-Seconds` is absent: 24 hours.
const DEFAULT_RETENTION_SECS: u64 = 86_400;
/// The shortest retention accepted.
const MIN_RETENTION_SECS: u64 = 60;
/// The longest retention accepted: 7 days.
const MAX_RETENTION_SECS: u64 = 604_800;
/// The longest idempotency key, in characters.
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 256;
/// The longest idempotency window: 24 hours (shorter if the retention is).
const MAX_DEDUP_WINDOW_SECS: u64 = 86_400;
/// Lease of a pull receive without `Vqs-Visibility-Timeout-Seconds`.
const DEFAULT_VISIBILITY_SECS: u64 = 60;
/// The longest lease a receive or a visibility change may ask for.
const MAX_VISIBILITY_SECS: u64 = 3_600;
/// Lease of a pushed message, as the emulator's push dispatcher.
const PUSH_LEASE_SECS: u64 = 300;
/// The most messages one receive may ask for.
const MAX_RECEIVE: u64 = 10;
/// The most parts in one batch send.
const MAX_BATCH: usize = 100;
/// The boundary of the multipart receive answers.
const BOUNDARY: &str = "vqs-fake-boundary";
/// The region named in push callbacks.
const REGION: &str = "iad1";

/// A Vercel Queues API on `127.0.0.1`, for tests.
///
/// Accepts only the token it was started with, stores messages per topic with leases and acks
/// per consumer group, records every request ([`FakeVercelQueues::requests`]), accepted send
/// ([`FakeVercelQueues::sent`]) and ack ([`FakeVercelQueues::acked`]), and has fault hooks:
/// [`FakeVercelQueues::fail_next`], [`FakeVercelQueues::defer_next_sends`],
/// [`FakeVercelQueues::fail_batch_items`], [`FakeVercelQueues::defer_batch_items`],
/// [`FakeVercelQueues::delay_next`] and [`FakeVercelQueues::expire_leases`]. The server stops
/// when the value is dropped (or, awaiting the end, with [`FakeVercelQueues::shutdown`]).
///
/// ```no_run
/// use jobs_testkit::fakes::FakeVercelQueues;
///
/// # async fn example() {
/// let fake = FakeVercelQueues::start().await;
/// fake.fail_next(1, 429, Some(3));
/// // configure the adapter with fake.base_url() and fake.token(), send, then:
/// assert!(fake.sent().is_empty());
/// # }
/// ```
#[derive(Debug)]
pub struct FakeVercelQueues {
    server: Server,
    shared: Arc<Shared>,
}

/// One send the fake accepted: a single send or one part of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// The topic sent to.
    pub topic: String,
    /// The id answered; `None` when the send was answered as deferred.
    pub message_id: Option<String>,
    /// The payload, as sent.
    pub body: Vec<u8>,
    /// The `Content-Type` of the request (or of the batch part), if any.
    pub content_type: Option<String>,
    /// The `Vqs-Idempotency-Key` header, if any.
    pub idempotency_key: Option<String>,
    /// The `Vqs-Delay-Seconds` header, if any.
    pub delay_seconds: Option<u64>,
    /// The `Vqs-Retention-Seconds` header, if any.
    pub retention_seconds: Option<u64>,
}

/// One request the fake received, whatever its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// The HTTP method, upper case.
    pub method: String,
    /// The path as received (still percent-encoded), with `?query` if there was one.
    pub path: String,
}

/// What a push callback answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushAnswer {
    /// The HTTP status code of the callback's answer.
    pub status: u16,
    /// The body of the callback's answer, as text (lossily decoded).
    pub body: String,
}

#[derive(Debug)]
struct Shared {
    token: String,
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    messages: Vec<Message>,
    by_id: HashMap<String, usize>,
    /// Every receipt handle ever issued: the message index and the group.
    receipts: HashMap<String, (usize, String)>,
    /// (topic, deployment, idempotency key, payload) → the first message id and when its
    /// window ends.
    idempotency: HashMap<IdempotencyKey, (String, SystemTime)>,
    sent: Vec<SentMessage>,
    requests: Vec<RecordedRequest>,
    acked: Vec<String>,
    last_id: u64,
    last_receipt: u64,
    fault: Option<Fault>,
    defer_sends: usize,
    delay: Option<(usize, Duration)>,
    batch_failures: Vec<(usize, u16)>,
    batch_deferrals: Vec<usize>,
}

/// What makes two sends duplicates: topic, deployment, idempotency key and payload.
type IdempotencyKey = (String, Option<String>, String, Vec<u8>);

#[derive(Debug)]
struct Fault {
    status: StatusCode,
    retry_after: Option<u64>,
    remaining: usize,
}

#[derive(Debug)]
struct Message {
    topic: String,
    id: String,
    body: Vec<u8>,
    content_type: String,
    created_at: SystemTime,
    available_at: SystemTime,
    expires_at: SystemTime,
    duplicate_of: Option<String>,
    /// The `Vqs-Deployment-Id` it was sent with; `None` for a deploymentless message.
    deployment: Option<String>,
    groups: HashMap<String, GroupState>,
}

/// A message as one consumer group sees it.
#[derive(Debug, Default)]
struct GroupState {
    delivery_count: u64,
    lease: Option<Lease>,
    acked: bool,
}

#[derive(Debug)]
struct Lease {
    receipt_handle: String,
    deadline: SystemTime,
}

/// The validated headers of one send.
struct SendRequest {
    content_type: Option<String>,
    idempotency_key: Option<String>,
    delay_seconds: Option<u64>,
    retention_seconds: Option<u64>,
}

/// An answer that is not a success, with its status and message.
struct Refusal(StatusCode, String);

impl Shared {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test thread must not hide what was recorded from the others.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeVercelQueues {
    /// Starts a fake on any free port of `127.0.0.1` with a fresh token, read back with
    /// [`FakeVercelQueues::token`].
    ///
    /// # Panics
    ///
    /// If the loopback interface cannot be bound: the test cannot run at all.
    pub async fn start() -> FakeVercelQueues {
        match Self::start_on(0).await {
            Ok(fake) => fake,
            Err(e) => panic!("FakeVercelQueues: cannot bind 127.0.0.1: {e}"),
        }
    }

    /// Starts a fake on `127.0.0.1:port` (`0` for any free port) with a fresh token: for a
    /// local development stack, where the port is configured.
    pub async fn start_on(port: u16) -> std::io::Result<FakeVercelQueues> {
        Self::start_with_token(port, fresh_secret("vq-fake-oidc-")).await
    }

    /// Starts a fake on `127.0.0.1:port` (`0` for any free port) that accepts only
    /// `Bearer <token>`.
    pub async fn start_with_token(
        port: u16,
        token: impl Into<String>,
    ) -> std::io::Result<FakeVercelQueues> {
        let shared = Arc::new(Shared {
            token: token.into(),
            state: Mutex::default(),
        });
        // Everything goes through one handler so that every request is recorded and the path
        // segments are decoded here, receipt handles with `/` in them included.
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        Ok(FakeVercelQueues {
            server: Server::start(port, app).await?,
            shared,
        })
    }

    /// `http://127.0.0.1:<port>`: the base URL to configure the adapter with; the routes are
    /// under `/api/v3/topic/`.
    pub fn base_url(&self) -> &str {
        self.server.base_url()
    }

    /// The only bearer token this fake accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Makes the next `n` requests, whatever their route, answer `status` with
    /// `{"error": "…"}` (and `Retry-After: <secs>` if given) before any check, storing nothing;
    /// replaces a previous fault. `n = 0` clears it.
    ///
    /// # Panics
    ///
    /// If `status` is not an HTTP status code (100 to 999): a mistake in the test itself.
    pub fn fail_next(&self, n: usize, status: u16, retry_after: Option<u64>) {
        let Ok(status) = StatusCode::from_u16(status) else {
            panic!("fail_next: {status} is not an HTTP status code");
        };
        self.shared.state().fault = (n > 0).then_some(Fault {
            status,
            retry_after,
            remaining: n,
        });
    }

    /// Makes the next `n` valid single sends answer `202` with an empty body and no message id.
    /// The message is stored all the same and becomes deliverable, as a deferred send does;
    /// [`FakeVercelQueues::sent`] records it with `message_id: None`.
    pub fn defer_next_sends(&self, n: usize) {
        self.shared.state().defer_sends = n;
    }

    /// Makes the parts at `indices` (0-based) of the next batch send fail with `status`
    /// (`retryable` when it is `408`, `429` or a `5xx`); those parts are not stored.
    pub fn fail_batch_items(&self, indices: &[usize], status: u16) {
        let mut state = self.shared.state();
        state
            .batch_failures
            .extend(indices.iter().map(|&index| (index, status)));
    }

    /// Makes the parts at `indices` (0-based) of the next batch send answer `deferred`: they
    /// are stored and delivered but get no id in the answer.
    pub fn defer_batch_items(&self, indices: &[usize]) {
        self.shared
            .state()
            .batch_deferrals
            .extend_from_slice(indices);
    }

    /// Delays the next `n` answers by `by`, whatever their route: the request takes effect at
    /// once, only its answer is late (a client that times out has still sent, acked, …).
    pub fn delay_next(&self, n: usize, by: Duration) {
        self.shared.state().delay = (n > 0).then_some((n, by));
    }

    /// Expires every current lease now: the messages are visible again, and `DELETE` or
    /// `PATCH` on their receipt handles answer `409` `Message lease has expired`.
    pub fn expire_leases(&self) {
        let now = SystemTime::now();
        let mut state = self.shared.state();
        for message in &mut state.messages {
            for group in message.groups.values_mut() {
                if let Some(lease) = &mut group.lease
                    && lease.deadline > now
                {
                    lease.deadline = now;
                }
            }
        }
    }

    /// Every accepted send (a single send or a batch part), in order; duplicates included.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.state().sent.clone()
    }

    /// Method and path (with query) of every request received, in order, whatever its answer.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.state().requests.clone()
    }

    /// The id of the message of every successful ack (`DELETE` answered `204`), in order.
    pub fn acked(&self) -> Vec<String> {
        self.shared.state().acked.clone()
    }

    /// Pushes the next visible message of `topic` for `group` to `callback_url` as a
    /// binary-mode (`com.vercel.queue.v2beta`) CloudEvent, as Vercel invokes a consumer
    /// function, and returns the callback's answer; `None` if no message is visible.
    ///
    /// The headers are `ce-type`, `ce-vqsqueuename`, `ce-vqsconsumergroup`, `ce-vqsmessageid`
    /// and `ce-vqsregion: iad1`. With `with_payload`, the message is leased for 300 s first and
    /// the request also carries `ce-vqsreceipthandle`, `ce-vqsdeliverycount`,
    /// `ce-vqscreatedat`, `ce-vqsexpiresat`, `ce-vqsvisibilitydeadline`, `content-type` and the
    /// payload as body. Without it, the message is *not* leased (the consumer receives it by
    /// id, which leases it) and the body is empty. The callback's answer changes nothing here:
    /// the lease, if any, stays until it is acked, changed or expires.
    ///
    /// # Panics
    ///
    /// If `callback_url` is not an `http://host:port/path` URL or the callback cannot be
    /// reached or answers no HTTP: a mistake in the test itself.
    pub async fn push_next(
        &self,
        callback_url: &str,
        topic: &str,
        group: &str,
        with_payload: bool,
    ) -> Option<PushAnswer> {
        let (headers, body) = {
            let now = SystemTime::now();
            let mut state = self.shared.state();
            let index = state.visible(topic, group, None, now).into_iter().next()?;
            let id = state.messages[index].id.clone();
            let mut headers = vec![
                ("ce-type", "com.vercel.queue.v2beta".to_owned()),
                ("ce-vqsqueuename", topic.to_owned()),
                ("ce-vqsconsumergroup", group.to_owned()),
                ("ce-vqsmessageid", id),
                ("ce-vqsregion", REGION.to_owned()),
            ];
            let mut body = Vec::new();
            if with_payload {
                let receipt_handle = state.lease(index, group, PUSH_LEASE_SECS, now);
                let message = &state.messages[index];
                let count = message.groups[group].delivery_count;
                headers.extend([
                    ("ce-vqsreceipthandle", receipt_handle),
                    ("ce-vqsdeliverycount", count.to_string()),
                    ("ce-vqscreatedat", iso(message.created_at)),
                    ("ce-vqsexpiresat", iso(message.expires_at)),
                    (
                        "ce-vqsvisibilitydeadline",
                        iso(now + Duration::from_secs(PUSH_LEASE_SECS)),
                    ),
                    ("content-type", message.content_type.clone()),
                ]);
                body.clone_from(&message.body);
            }
            (headers, body)
        };
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        match http_request("POST", callback_url, &headers, &body).await {
            Ok((status, _, body)) => Some(PushAnswer {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            }),
            Err(e) => panic!("push_next: POST {callback_url} failed: {e}"),
        }
    }

    /// Stops the server and waits until it has closed its connections.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

impl Message {
    /// Whether a consumer of `deployment` may see this message: one without a deployment sees
    /// every message, one of a deployment only the messages sent by it (as Vercel's emulator).
    fn sees(&self, deployment: Option<&str>) -> bool {
        deployment.is_none_or(|d| self.deployment.as_deref() == Some(d))
    }
}

impl FakeState {
    /// Whether `handle` leases a message that a consumer of `deployment` may not see.
    fn receipt_of_other_deployment(&self, handle: &str, deployment: Option<&str>) -> bool {
        self.receipts
            .get(handle)
            .is_some_and(|(index, _)| !self.messages[*index].sees(deployment))
    }

    /// Indices of the messages of `topic` that `group` may receive now, oldest first; a
    /// consumer of `deployment` sees only the messages sent by that deployment, one without a
    /// deployment sees them all.
    fn visible(
        &self,
        topic: &str,
        group: &str,
        deployment: Option<&str>,
        now: SystemTime,
    ) -> Vec<usize> {
        self.messages
            .iter()
            .enumerate()
            .filter(|(_, message)| {
                message.topic == topic
                    && message.sees(deployment)
                    && message.duplicate_of.is_none()
                    && message.available_at <= now
                    && message.expires_at > now
                    && message.groups.get(group).is_none_or(|seen| {
                        !seen.acked && seen.lease.as_ref().is_none_or(|l| l.deadline <= now)
                    })
            })
            .map(|(index, _)| index)
            .collect()
    }

    /// Leases message `index` to `group` for `seconds`: a new receipt handle, one more
    /// delivery; the previous handle of the group is no longer current.
    fn lease(&mut self, index: usize, group: &str, seconds: u64, now: SystemTime) -> String {
        self.last_receipt += 1;
        let message = &mut self.messages[index];
        let receipt_handle = format!("rh_{}:{}:{group} /lease", self.last_receipt, message.id);
        let seen = message.groups.entry(group.to_owned()).or_default();
        seen.delivery_count += 1;
        seen.lease = Some(Lease {
            receipt_handle: receipt_handle.clone(),
            deadline: now + Duration::from_secs(seconds),
        });
        self.receipts
            .insert(receipt_handle.clone(), (index, group.to_owned()));
        receipt_handle
    }

    /// Stores a validated send from `deployment` (a duplicate is stored but never delivered);
    /// its message id.
    fn store(
        &mut self,
        topic: &str,
        body: &[u8],
        request: &SendRequest,
        deployment: Option<String>,
        now: SystemTime,
    ) -> String {
        self.last_id += 1;
        let id = format!("msg_{}", self.last_id);
        let retention = request.retention_seconds.unwrap_or(DEFAULT_RETENTION_SECS);
        let mut duplicate_of = None;
        if let Some(key) = &request.idempotency_key {
            let dedup = (
                topic.to_owned(),
                deployment.clone(),
                key.clone(),
                body.to_vec(),
            );
            match self.idempotency.get(&dedup) {
                Some((original, until)) if *until > now => duplicate_of = Some(original.clone()),
                _ => {
                    let window = Duration::from_secs(retention.min(MAX_DEDUP_WINDOW_SECS));
                    self.idempotency.insert(dedup, (id.clone(), now + window));
                }
            }
        }
        self.by_id.insert(id.clone(), self.messages.len());
        self.messages.push(Message {
            topic: topic.to_owned(),
            id: id.clone(),
            body: body.to_vec(),
            content_type: request
                .content_type
                .clone()
                .unwrap_or_else(|| "application/octet-stream".to_owned()),
            created_at: now,
            available_at: now + Duration::from_secs(request.delay_seconds.unwrap_or(0)),
            expires_at: now + Duration::from_secs(retention),
            duplicate_of,
            deployment,
            groups: HashMap::new(),
        });
        id
    }

    fn record_sent(&mut self, topic: &str, id: Option<String>, body: &[u8], request: SendRequest) {
        self.sent.push(SentMessage {
            topic: topic.to_owned(),
            message_id: id,
            body: body.to_vec(),
            content_type: request.content_type,
            idempotency_key: request.idempotency_key,
            delay_seconds: request.delay_seconds,
            retention_seconds: request.retention_seconds,
        });
    }
}

/// The route a request path names, its segments decoded.
#[derive(Debug, PartialEq)]
enum Route {
    Send(String),
    Batch(String),
    Receive(String, String),
    ById(String, String, String),
    Lease(String, String, String),
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let rest = path.strip_prefix(PREFIX)?;
        let segments: Vec<String> = rest
            .trim_end_matches('/')
            .split('/')
            .map(percent_decode)
            .collect::<Option<_>>()?;
        let topic = segments.first()?.clone();
        let tail: Vec<&str> = segments[1..].iter().map(String::as_str).collect();
        match tail.as_slice() {
            [] => Some(Route::Send(topic)),
            ["batch"] => Some(Route::Batch(topic)),
            ["consumer", group] => Some(Route::Receive(topic, (*group).to_owned())),
            ["consumer", group, "id", id] => {
                Some(Route::ById(topic, (*group).to_owned(), (*id).to_owned()))
            }
            ["consumer", group, "lease", handle @ ..] => {
                let handle = match handle {
                    [parts @ .., "visibility"] if !parts.is_empty() => parts,
                    parts => parts,
                };
                (!handle.is_empty())
                    .then(|| Route::Lease(topic, (*group).to_owned(), handle.join("/")))
            }
            _ => None,
        }
    }

    fn names(&self) -> (&str, Option<&str>) {
        match self {
            Route::Send(topic) | Route::Batch(topic) => (topic, None),
            Route::Receive(topic, group)
            | Route::ById(topic, group, _)
            | Route::Lease(topic, group, _) => (topic, Some(group)),
        }
    }
}

/// Every request: records it, applies the fault hooks, checks the token, then routes.
async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (response, delay) = {
        let mut state = shared.state();
        state.requests.push(RecordedRequest {
            method: method.as_str().to_owned(),
            path: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        });
        let delay = match &mut state.delay {
            Some((remaining, by)) => {
                let by = *by;
                *remaining -= 1;
                if *remaining == 0 {
                    state.delay = None;
                }
                Some(by)
            }
            None => None,
        };
        let response = answer(
            &shared.token,
            &mut state,
            &method,
            uri.path(),
            &headers,
            &body,
        );
        (response, delay)
    };
    if let Some(by) = delay {
        tokio::time::sleep(by).await;
    }
    response
}

fn answer(
    token: &str,
    state: &mut FakeState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if let Some(fault) = state.fault.as_mut() {
        let (status, retry_after) = (fault.status, fault.retry_after);
        fault.remaining -= 1;
        if fault.remaining == 0 {
            state.fault = None;
        }
        let reason = status.canonical_reason().unwrap_or("Injected failure");
        let mut response = error(status, &format!("{reason} (injected by FakeVercelQueues)"));
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        return response;
    }
    if bearer(headers).as_deref() != Some(token) {
        return error(StatusCode::UNAUTHORIZED, "Missing or invalid bearer token");
    }
    let Some(route) = Route::parse(path) else {
        return error(StatusCode::NOT_FOUND, "Not found");
    };
    let (topic, group) = route.names();
    if !valid_name(topic) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("Invalid queue topic: {topic:?}; must match ^[A-Za-z0-9_-]+$"),
        );
    }
    if let Some(group) = group
        && !valid_name(group)
    {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("Invalid queue consumer_group: {group:?}; must match ^[A-Za-z0-9_-]+$"),
        );
    }
    if let Some(deployment) = text_header(headers, "vqs-deployment-id")
        && !valid_name(&deployment)
    {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("Invalid deployment id: {deployment:?}; must match ^[A-Za-z0-9_-]+$"),
        );
    }
    let now = SystemTime::now();
    let result = match (&route, method.clone()) {
        (Route::Send(topic), Method::POST) => send(state, topic, headers, body, now),
        (Route::Batch(topic), Method::POST) => send_batch(state, topic, headers, body, now),
        (Route::Receive(topic, group), Method::POST) => receive(state, topic, group, headers, now),
        (Route::ById(topic, group, id), Method::POST) => {
            receive_by_id(state, topic, group, id, headers, now)
        }
        (Route::Lease(topic, group, handle), m) if m == Method::DELETE || m == Method::PATCH => {
            if state.receipt_of_other_deployment(handle, deployment(headers).as_deref()) {
                // As the emulator: another deployment's lease is not found at all.
                Err(Refusal(
                    StatusCode::NOT_FOUND,
                    "Message not found".to_owned(),
                ))
            } else {
                lease_op(state, topic, group, handle, &m, body, now)
            }
        }
        _ => Err(Refusal(StatusCode::NOT_FOUND, "Not found".to_owned())),
    };
    result.unwrap_or_else(|Refusal(status, message)| error(status, &message))
}

/// `POST /api/v3/topic/{topic}`.
fn send(
    state: &mut FakeState,
    topic: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Response, Refusal> {
    let request = send_request(|name| text_header(headers, name))?;
    let id = state.store(topic, body, &request, deployment(headers), now);
    if state.defer_sends > 0 {
        state.defer_sends -= 1;
        state.record_sent(topic, None, body, request);
        return Ok(StatusCode::ACCEPTED.into_response());
    }
    state.record_sent(topic, Some(id.clone()), body, request);
    let mut response = json_response(StatusCode::CREATED, &json!({ "messageId": id }));
    if let Ok(value) = HeaderValue::from_str(&id) {
        response
            .headers_mut()
            .insert(HeaderName::from_static("vqs-message-id"), value);
    }
    Ok(response)
}

/// Validates the headers of one send (a request or a batch part).
fn send_request(header: impl Fn(&str) -> Option<String>) -> Result<SendRequest, Refusal> {
    let retention_seconds = int_header(&header, "vqs-retention-seconds")?;
    if let Some(retention) = retention_seconds
        && !(MIN_RETENTION_SECS..=MAX_RETENTION_SECS).contains(&retention)
    {
        return Err(bad_request(format!(
            "Vqs-Retention-Seconds must be between {MIN_RETENTION_SECS} and {MAX_RETENTION_SECS}"
        )));
    }
    let delay_seconds = int_header(&header, "vqs-delay-seconds")?;
    if delay_seconds.unwrap_or(0) > retention_seconds.unwrap_or(DEFAULT_RETENTION_SECS) {
        return Err(bad_request(
            "Vqs-Delay-Seconds cannot exceed retention time".to_owned(),
        ));
    }
    let idempotency_key = header("vqs-idempotency-key").filter(|key| !key.is_empty());
    // "Must be at most 256 characters. Longer keys are rejected with a 400" (the SDK's
    // `SendOptions.idempotencyKey`); Vercel's emulator does not check it.
    if idempotency_key
        .as_ref()
        .is_some_and(|key| key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS)
    {
        return Err(bad_request(format!(
            "Vqs-Idempotency-Key must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"
        )));
    }
    Ok(SendRequest {
        content_type: header("content-type"),
        idempotency_key,
        delay_seconds,
        retention_seconds,
    })
}

/// `POST /api/v3/topic/{topic}/batch`.
fn send_batch(
    state: &mut FakeState,
    topic: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<Response, Refusal> {
    let content_type = text_header(headers, "content-type").unwrap_or_default();
    let Some(boundary) = multipart_boundary(&content_type) else {
        return Err(bad_request(
            "Content-Type must be multipart/mixed with a boundary".to_owned(),
        ));
    };
    let Some(parts) = parse_multipart(body, &boundary) else {
        return Err(bad_request("Malformed multipart body".to_owned()));
    };
    if !(1..=MAX_BATCH).contains(&parts.len()) {
        return Err(bad_request(format!(
            "A batch must contain between 1 and {MAX_BATCH} messages, got {}",
            parts.len()
        )));
    }
    let failures = std::mem::take(&mut state.batch_failures);
    let deferrals = std::mem::take(&mut state.batch_deferrals);
    let mut results = Vec::with_capacity(parts.len());
    for (index, part) in parts.iter().enumerate() {
        if let Some(&(_, status)) = failures.iter().find(|(at, _)| *at == index) {
            let reason = StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Injected failure");
            results.push(json!({
                "status": "failed",
                "statusCode": status,
                "error": format!("{reason} (injected by FakeVercelQueues)"),
                "retryable": status == 408 || status == 429 || status >= 500,
            }));
            continue;
        }
        let request = match send_request(|name| part.header(name)) {
            Ok(request) => request,
            Err(Refusal(status, message)) => {
                results.push(json!({
                    "status": "failed",
                    "statusCode": status.as_u16(),
                    "error": message,
                    "retryable": false,
                }));
                continue;
            }
        };
        let id = state.store(topic, &part.body, &request, deployment(headers), now);
        if deferrals.contains(&index) {
            state.record_sent(topic, None, &part.body, request);
            results.push(json!({ "status": "deferred", "messageId": null }));
        } else {
            state.record_sent(topic, Some(id.clone()), &part.body, request);
            results.push(json!({ "status": "sent", "messageId": id }));
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({ "results": results }),
    ))
}

/// `POST /api/v3/topic/{topic}/consumer/{group}`.
fn receive(
    state: &mut FakeState,
    topic: &str,
    group: &str,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<Response, Refusal> {
    check_accept(headers)?;
    let header = |name: &str| text_header(headers, name);
    let limit = int_header(&header, "vqs-max-messages")?.unwrap_or(1);
    if !(1..=MAX_RECEIVE).contains(&limit) {
        return Err(bad_request(format!(
            "Vqs-Max-Messages must be between 1 and {MAX_RECEIVE}"
        )));
    }
    let seconds = visibility_header(&header)?;
    let visible = state.visible(topic, group, deployment(headers).as_deref(), now);
    if visible.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let limit = usize::try_from(limit).unwrap_or(1);
    let parts: Vec<(usize, String)> = visible
        .into_iter()
        .take(limit)
        .map(|index| (index, state.lease(index, group, seconds, now)))
        .collect();
    Ok(multipart_response(state, group, &parts))
}

/// `POST /api/v3/topic/{topic}/consumer/{group}/id/{messageId}`.
fn receive_by_id(
    state: &mut FakeState,
    topic: &str,
    group: &str,
    id: &str,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<Response, Refusal> {
    check_accept(headers)?;
    let seconds = visibility_header(&|name: &str| text_header(headers, name))?;
    let not_found = || Refusal(StatusCode::NOT_FOUND, "Message not found".to_owned());
    let index = *state.by_id.get(id).ok_or_else(not_found)?;
    let message = &state.messages[index];
    if message.topic != topic
        || message.expires_at <= now
        || !message.sees(deployment(headers).as_deref())
    {
        return Err(not_found());
    }
    if let Some(original) = &message.duplicate_of {
        return Ok(json_response(
            StatusCode::CONFLICT,
            &json!({
                "error": "This messageId was a duplicate - use originalMessageId instead",
                "originalMessageId": original,
            }),
        ));
    }
    if let Some(seen) = message.groups.get(group) {
        if seen.acked {
            return Ok(StatusCode::GONE.into_response());
        }
        if let Some(lease) = &seen.lease
            && lease.deadline > now
        {
            let left = lease.deadline.duration_since(now).unwrap_or_default();
            let mut response = error(
                StatusCode::CONFLICT,
                "Message is locked by another consumer",
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(left.as_secs().max(1)),
            );
            return Ok(response);
        }
    }
    let handle = state.lease(index, group, seconds, now);
    Ok(multipart_response(state, group, &[(index, handle)]))
}

/// `DELETE` (ack) and `PATCH` (visibility) of `…/consumer/{group}/lease/{receiptHandle}`.
fn lease_op(
    state: &mut FakeState,
    topic: &str,
    group: &str,
    handle: &str,
    method: &Method,
    body: &[u8],
    now: SystemTime,
) -> Result<Response, Refusal> {
    let not_found = || Refusal(StatusCode::NOT_FOUND, "Message not found".to_owned());
    let not_in_flight = || {
        Refusal(
            StatusCode::CONFLICT,
            "Message is not currently in-flight".to_owned(),
        )
    };
    let (index, leased_to) = state.receipts.get(handle).cloned().ok_or_else(not_found)?;
    let message = &mut state.messages[index];
    if message.topic != topic || message.expires_at <= now {
        return Err(not_found());
    }
    if leased_to != group {
        return Err(not_in_flight());
    }
    let seen = message.groups.entry(leased_to).or_default();
    if seen.acked {
        return Err(not_in_flight());
    }
    let Some(lease) = seen
        .lease
        .as_mut()
        .filter(|lease| lease.receipt_handle == handle)
    else {
        return Err(not_in_flight());
    };
    if lease.deadline <= now {
        return Err(Refusal(
            StatusCode::CONFLICT,
            "Message lease has expired".to_owned(),
        ));
    }
    if *method == Method::DELETE {
        seen.acked = true;
        seen.lease = None;
        let id = message.id.clone();
        state.acked.push(id);
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let request: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|_| bad_request("The body must be a JSON object".to_owned()))?
    };
    let Some(seconds) = request
        .get("visibilityTimeoutSeconds")
        .and_then(Value::as_u64)
        .filter(|seconds| *seconds <= MAX_VISIBILITY_SECS)
    else {
        return Err(bad_request(format!(
            "Invalid visibilityTimeoutSeconds - must be an integer between 0 and {MAX_VISIBILITY_SECS}"
        )));
    };
    let deadline = now + Duration::from_secs(seconds);
    if deadline > message.expires_at {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            &json!({
                "error": "Visibility timeout cannot extend beyond message expiration",
                "messageExpiresAt": iso(message.expires_at),
                "requestedExpiresAt": iso(deadline),
            }),
        ));
    }
    lease.deadline = deadline;
    Ok(json_response(StatusCode::OK, &json!({ "success": true })))
}

/// A receive may only ask for `multipart/mixed`.
fn check_accept(headers: &HeaderMap) -> Result<(), Refusal> {
    let accept = text_header(headers, "accept").unwrap_or_default();
    let accepted = accept
        .split(',')
        .any(|value| media_type(value) == "multipart/mixed");
    if accepted {
        Ok(())
    } else {
        Err(bad_request(
            "Accept header required. Supported: multipart/mixed".to_owned(),
        ))
    }
}

fn visibility_header(header: &impl Fn(&str) -> Option<String>) -> Result<u64, Refusal> {
    let seconds =
        int_header(header, "vqs-visibility-timeout-seconds")?.unwrap_or(DEFAULT_VISIBILITY_SECS);
    if seconds > MAX_VISIBILITY_SECS {
        return Err(bad_request(format!(
            "Vqs-Visibility-Timeout-Seconds must be between 0 and {MAX_VISIBILITY_SECS}"
        )));
    }
    Ok(seconds)
}

/// A non-negative integer header (`"5"` or `"5.0"`, as the emulator accepts), if present.
fn int_header(
    header: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<u64>, Refusal> {
    let Some(text) = header(name) else {
        return Ok(None);
    };
    let parsed = text.parse::<u64>().ok().or_else(|| {
        let float = text.parse::<f64>().ok()?;
        // Integral, non-negative and in range: the cast is exact.
        (float.is_finite() && float.fract() == 0.0 && (0.0..9.0e15).contains(&float))
            .then_some(float as u64)
    });
    parsed
        .map(Some)
        .ok_or_else(|| bad_request(format!("{name} must be a non-negative integer")))
}

/// `200 multipart/mixed`, one part per leased message.
fn multipart_response(state: &FakeState, group: &str, parts: &[(usize, String)]) -> Response {
    let mut body = Vec::new();
    for (index, handle) in parts {
        let message = &state.messages[*index];
        let count = message
            .groups
            .get(group)
            .map_or(0, |seen| seen.delivery_count);
        let mut head = String::new();
        let _ = write!(
            head,
            "--{BOUNDARY}\r\nContent-Type: {}\r\nVqs-Message-Id: {}\r\nVqs-Receipt-Handle: {handle}\r\nVqs-Delivery-Count: {count}\r\nVqs-Timestamp: {}\r\nVqs-Expires-At: {}\r\n\r\n",
            message.content_type,
            message.id,
            iso(message.created_at),
            iso(message.expires_at),
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(&message.body);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    let mut response = (StatusCode::OK, Body::from(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("multipart/mixed; boundary={BOUNDARY}")) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// One part of a multipart body.
#[derive(Debug, PartialEq)]
struct Part {
    /// Header names lower-cased, values trimmed.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Part {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
    }
}

/// The boundary of a `multipart/mixed` content type, unquoted.
fn multipart_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';');
    if media_type(params.next()?) != "multipart/mixed" {
        return None;
    }
    params.find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
            .filter(|boundary| !boundary.is_empty())
    })
}

/// Splits a multipart body (RFC 2046, CRLF line ends) into its parts; `None` if malformed.
fn parse_multipart(body: &[u8], boundary: &str) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}").into_bytes();
    let next_delimiter = format!("\r\n--{boundary}").into_bytes();
    // The first delimiter is at the start or after a preamble line.
    let mut at = if body.starts_with(&delimiter) {
        0
    } else {
        find(body, &next_delimiter)? + 2
    };
    let mut parts = Vec::new();
    loop {
        at += delimiter.len();
        if body[at..].starts_with(b"--") {
            return Some(parts);
        }
        // The rest of the delimiter line (transport padding) is ignored.
        at += find(&body[at..], b"\r\n")? + 2;
        let end = at + find(&body[at..], &next_delimiter)?;
        let part = &body[at..end];
        let (head, content) = if part.starts_with(b"\r\n") {
            (&part[..0], &part[2..])
        } else {
            let split = find(part, b"\r\n\r\n")?;
            (&part[..split], &part[split + 4..])
        };
        let headers = String::from_utf8_lossy(head)
            .split("\r\n")
            .filter_map(|line| {
                let (name, value) = line.split_once(':')?;
                Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
            })
            .collect();
        parts.push(Part {
            headers,
            body: content.to_vec(),
        });
        at = end + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn media_type(value: &str) -> String {
    value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Topic and consumer-group names: `^[A-Za-z0-9_-]+$`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Decodes `%XX` escapes of one path segment; `None` if an escape is malformed or the result
/// is not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

/// The bearer credentials, the scheme matched case-insensitively as HTTP allows.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = text_header(headers, "authorization")?;
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim().to_owned())
}

/// The request's `Vqs-Deployment-Id`, if any (its shape was checked by [`answer`]).
fn deployment(headers: &HeaderMap) -> Option<String> {
    text_header(headers, "vqs-deployment-id")
}

fn text_header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_owned())
}

/// An instant as ISO 8601 UTC with milliseconds, as `Date.toISOString`.
fn iso(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or_default();
    let of_day = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60,
        since.subsec_millis()
    )
}

fn bad_request(message: String) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message)
}

/// One HTTP exchange, for push callbacks and tests: the status, the headers (names
/// lower-cased) and the body of the answer.
async fn http_request(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let failed = |e: reqwest::Error| std::io::Error::other(e.to_string());
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let mut request = reqwest::Client::new()
        .request(method, url)
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let answer = request.send().await.map_err(failed)?;
    let status = answer.status().as_u16();
    let headers = answer
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    let body = answer.bytes().await.map_err(failed)?.to_vec();
    Ok((status, headers, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::routing::post;

    /// A test client of the fake: bearer token, one request per connection.
    struct Client<'a> {
        fake: &'a FakeVercelQueues,
    }

    struct Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }

        fn json(&self) -> Value {
            serde_json::from_slice(&self.body).expect("a JSON body")
        }

        /// The parts of a multipart receive answer.
        fn parts(&self) -> Vec<Part> {
            let content_type = self.header("content-type").expect("a content type");
            let boundary = multipart_boundary(content_type).expect("multipart/mixed");
            parse_multipart(&self.body, &boundary).expect("a well-formed multipart body")
        }
    }

    impl Client<'_> {
        async fn call(
            &self,
            method: &str,
            path: &str,
            headers: &[(&str, &str)],
            body: &[u8],
        ) -> Answer {
            let mut all = vec![(
                "Authorization".to_owned(),
                format!("Bearer {}", self.fake.token()),
            )];
            all.extend(
                headers
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned())),
            );
            let url = format!("{}{path}", self.fake.base_url());
            let (status, headers, body) = http_request(method, &url, &all, body)
                .await
                .expect("the fake answers");
            Answer {
                status,
                headers,
                body,
            }
        }

        async fn send(&self, topic: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
            self.call("POST", &format!("{PREFIX}{topic}"), headers, body)
                .await
        }

        async fn receive(&self, topic: &str, group: &str, max: u8) -> Answer {
            let max = max.to_string();
            self.call(
                "POST",
                &format!("{PREFIX}{topic}/consumer/{group}"),
                &[
                    ("Accept", "multipart/mixed"),
                    ("Vqs-Max-Messages", &max),
                    ("Vqs-Visibility-Timeout-Seconds", "30"),
                ],
                b"",
            )
            .await
        }

        async fn lease(
            &self,
            method: &str,
            topic: &str,
            group: &str,
            handle: &str,
            body: &[u8],
        ) -> Answer {
            let path = format!("{PREFIX}{topic}/consumer/{group}/lease/{}", encode(handle));
            self.call(method, &path, &[("Content-Type", "application/json")], body)
                .await
        }
    }

    /// Percent-encodes everything but unreserved characters, as the SDK does for segments.
    fn encode(segment: &str) -> String {
        segment
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// One batch part: content type, `Vqs-*` headers, payload.
    type BatchPart<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

    fn batch_body(boundary: &str, parts: &[BatchPart<'_>]) -> Vec<u8> {
        let mut body = String::new();
        for (content_type, headers, payload) in parts {
            let _ = write!(body, "--{boundary}\r\nContent-Type: {content_type}\r\n");
            for (name, value) in *headers {
                let _ = write!(body, "{name}: {value}\r\n");
            }
            let _ = write!(body, "\r\n{payload}\r\n");
        }
        let _ = write!(body, "--{boundary}--\r\n");
        body.into_bytes()
    }

    #[tokio::test]
    async fn send_receive_ack_round_trip() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };

        let sent = client
            .send(
                "jobs",
                &[
                    ("Content-Type", "application/json"),
                    ("Vqs-Idempotency-Key", "job-1"),
                    ("Vqs-Retention-Seconds", "3600"),
                ],
                br#"{"n":1}"#,
            )
            .await;
        assert_eq!(sent.status, 201);
        let id = sent.json()["messageId"].as_str().expect("an id").to_owned();
        assert_eq!(sent.header("vqs-message-id"), Some(id.as_str()));

        let received = client.receive("jobs", "workers", 10).await;
        assert_eq!(received.status, 200);
        let parts = received.parts();
        assert_eq!(parts.len(), 1);
        let part = &parts[0];
        assert_eq!(part.body, br#"{"n":1}"#);
        assert_eq!(
            part.header("content-type").as_deref(),
            Some("application/json")
        );
        assert_eq!(part.header("vqs-message-id"), Some(id.clone()));
        assert_eq!(part.header("vqs-delivery-count").as_deref(), Some("1"));
        assert!(
            part.header("vqs-timestamp")
                .is_some_and(|t| t.ends_with('Z'))
        );
        assert!(part.header("vqs-expires-at").is_some());
        let handle = part.header("vqs-receipt-handle").expect("a receipt handle");
        assert!(handle.contains(' ') && handle.contains('/'), "{handle}");

        // Leased: invisible to the same group, visible to another one.
        assert_eq!(client.receive("jobs", "workers", 10).await.status, 204);
        let other = client.receive("jobs", "auditors", 10).await;
        assert_eq!(
            other.parts()[0].header("vqs-delivery-count").as_deref(),
            Some("1")
        );

        let extended = client
            .lease(
                "PATCH",
                "jobs",
                "workers",
                &handle,
                br#"{"visibilityTimeoutSeconds":120}"#,
            )
            .await;
        assert_eq!(
            (extended.status, extended.json()),
            (200, json!({"success": true}))
        );
        let too_far = client
            .lease(
                "PATCH",
                "jobs",
                "workers",
                &handle,
                br#"{"visibilityTimeoutSeconds":3600}"#,
            )
            .await;
        assert_eq!(
            too_far.status, 400,
            "retention is 3600 s, the lease would outlive it"
        );

        assert_eq!(
            client
                .lease("DELETE", "jobs", "workers", &handle, b"")
                .await
                .status,
            204
        );
        assert_eq!(fake.acked(), vec![id.clone()]);
        let again = client
            .lease("DELETE", "jobs", "workers", &handle, b"")
            .await;
        assert_eq!(again.status, 409);
        let unknown = client
            .lease("DELETE", "jobs", "workers", "rh_99:msg_99:workers /x", b"")
            .await;
        assert_eq!(unknown.status, 404);
        assert_eq!(client.receive("jobs", "workers", 10).await.status, 204);

        let recorded = fake.sent();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].message_id.as_deref(), Some(id.as_str()));
        assert_eq!(recorded[0].idempotency_key.as_deref(), Some("job-1"));
        assert_eq!(recorded[0].retention_seconds, Some(3600));
        assert_eq!(
            recorded[0].content_type.as_deref(),
            Some("application/json")
        );
        assert_eq!(
            fake.requests()[0],
            RecordedRequest {
                method: "POST".into(),
                path: "/api/v3/topic/jobs".into(),
            }
        );
    }

    #[tokio::test]
    async fn requests_are_checked() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        let url = format!("{}{PREFIX}jobs", fake.base_url());
        let (status, _, body) = http_request("POST", &url, &[], b"x").await.unwrap();
        assert_eq!(status, 401);
        assert!(serde_json::from_slice::<Value>(&body).unwrap()["error"].is_string());

        assert_eq!(client.send("bad.topic", &[], b"x").await.status, 400);
        let deployment = client
            .send("jobs", &[("Vqs-Deployment-Id", "dpl bad")], b"x")
            .await;
        assert_eq!(deployment.status, 400);
        let deployment = client
            .send("jobs", &[("Vqs-Deployment-Id", "dpl_ok")], b"x")
            .await;
        assert_eq!(deployment.status, 201);
        let late = client
            .send(
                "jobs",
                &[("Vqs-Retention-Seconds", "60"), ("Vqs-Delay-Seconds", "61")],
                b"x",
            )
            .await;
        assert_eq!(late.status, 400);
        assert_eq!(
            client
                .send("jobs", &[("Vqs-Retention-Seconds", "59")], b"x")
                .await
                .status,
            400
        );
        let no_accept = client
            .call("POST", "/api/v3/topic/jobs/consumer/g", &[], b"")
            .await;
        assert_eq!(no_accept.status, 400);
        let long_key = "k".repeat(257);
        let long = client
            .send("jobs", &[("Vqs-Idempotency-Key", long_key.as_str())], b"x")
            .await;
        assert_eq!(long.status, 400);
        let longest = "k".repeat(256);
        let at_limit = client
            .send("jobs", &[("Vqs-Idempotency-Key", longest.as_str())], b"x")
            .await;
        assert_eq!(at_limit.status, 201);
        let too_many = client.receive("jobs", "g", 11).await;
        assert_eq!(too_many.status, 400);
        assert_eq!(fake.sent().len(), 2, "only the valid sends are recorded");
        assert_eq!(client.receive("jobs", "g", 10).await.status, 200);

        // A delayed message is not visible yet.
        assert_eq!(
            client
                .send("jobs", &[("Vqs-Delay-Seconds", "600")], b"later")
                .await
                .status,
            201
        );
        assert_eq!(client.receive("jobs", "g", 10).await.status, 204);
    }

    #[tokio::test]
    async fn receive_by_id_locks_gones_and_redirects_duplicates() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        let key = [("Vqs-Idempotency-Key", "k")];
        let first = client.send("jobs", &key, b"same").await.json()["messageId"].clone();
        let second = client.send("jobs", &key, b"same").await.json()["messageId"].clone();
        assert_ne!(first, second, "a duplicate still gets its own id");
        let first = first.as_str().unwrap();
        let second = second.as_str().unwrap();
        let by_id = |id: &str| format!("{PREFIX}jobs/consumer/g/id/{id}");
        let accept = [("Accept", "multipart/mixed")];

        let duplicate = client.call("POST", &by_id(second), &accept, b"").await;
        assert_eq!(duplicate.status, 409);
        assert_eq!(duplicate.json()["originalMessageId"], json!(first));

        let got = client.call("POST", &by_id(first), &accept, b"").await;
        assert_eq!(got.status, 200);
        let handle = got.parts()[0].header("vqs-receipt-handle").unwrap();
        let locked = client.call("POST", &by_id(first), &accept, b"").await;
        assert_eq!(locked.status, 409);
        assert!(locked.header("retry-after").is_some());
        assert_eq!(
            client
                .lease("DELETE", "jobs", "g", &handle, b"")
                .await
                .status,
            204
        );
        assert_eq!(
            client
                .call("POST", &by_id(first), &accept, b"")
                .await
                .status,
            410
        );
        assert_eq!(
            client
                .call("POST", &by_id("msg_404"), &accept, b"")
                .await
                .status,
            404
        );
        // The duplicate is never delivered.
        assert_eq!(client.receive("jobs", "g", 10).await.status, 204);
        assert_eq!(fake.sent().len(), 2);
    }

    #[tokio::test]
    async fn deployments_partition_messages_as_the_emulator() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        let pinned = |deployment: &'static str| {
            [
                ("Vqs-Deployment-Id", deployment),
                ("Vqs-Idempotency-Key", "k"),
            ]
        };
        let id = |answer: Answer| answer.json()["messageId"].as_str().unwrap().to_owned();
        let from_a = id(client.send("jobs", &pinned("dpl_a"), b"same").await);
        let from_b = id(client.send("jobs", &pinned("dpl_b"), b"same").await);
        let client = &client;
        let receive_as = |deployment: &'static str| async move {
            let headers = [
                ("Accept", "multipart/mixed"),
                ("Vqs-Max-Messages", "10"),
                ("Vqs-Deployment-Id", deployment),
            ];
            client
                .call("POST", "/api/v3/topic/jobs/consumer/g", &headers, b"")
                .await
        };

        // Each deployment sees its own message: the same key is no duplicate across them.
        let as_b = receive_as("dpl_b").await;
        assert_eq!(as_b.status, 200);
        let parts = as_b.parts();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].header("vqs-message-id"), Some(from_b.clone()));
        let handle_b = parts[0].header("vqs-receipt-handle").unwrap();
        // Deployment A can neither receive B's message by id nor settle B's lease.
        let by_id = client
            .call(
                "POST",
                &format!("{PREFIX}jobs/consumer/g/id/{from_b}"),
                &[
                    ("Accept", "multipart/mixed"),
                    ("Vqs-Deployment-Id", "dpl_a"),
                ],
                b"",
            )
            .await;
        assert_eq!(by_id.status, 404);
        let path = format!("{PREFIX}jobs/consumer/g/lease/{}", encode(&handle_b));
        let settle = client
            .call("DELETE", &path, &[("Vqs-Deployment-Id", "dpl_a")], b"")
            .await;
        assert_eq!(settle.status, 404);
        let settle = client
            .call("DELETE", &path, &[("Vqs-Deployment-Id", "dpl_b")], b"")
            .await;
        assert_eq!(settle.status, 204);

        let as_a = receive_as("dpl_a").await.parts();
        assert_eq!(as_a.len(), 1);
        assert_eq!(as_a[0].header("vqs-message-id"), Some(from_a.clone()));

        // A deploymentless message is received only without a deployment, which sees them all.
        let unpinned = id(client.send("jobs", &[], b"any").await);
        assert_eq!(receive_as("dpl_a").await.status, 204);
        let all = client.receive("jobs", "h", 10).await.parts();
        let ids: Vec<_> = all
            .iter()
            .filter_map(|p| p.header("vqs-message-id"))
            .collect();
        assert_eq!(ids, [from_a, from_b, unpinned]);
    }

    #[tokio::test]
    async fn batch_results_follow_the_input_order() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        fake.fail_batch_items(&[1], 503);
        fake.defer_batch_items(&[3]);
        let body = batch_body(
            "vqs-b1",
            &[
                ("text/plain", &[("Vqs-Idempotency-Key", "a")], "zero"),
                ("text/plain", &[], "one"),
                ("text/plain", &[("Vqs-Delay-Seconds", "999999999")], "two"),
                ("application/json", &[], "\"three\""),
                ("text/plain", &[], "four"),
            ],
        );
        let answer = client
            .call(
                "POST",
                "/api/v3/topic/jobs/batch",
                &[("Content-Type", "multipart/mixed; boundary=\"vqs-b1\"")],
                &body,
            )
            .await;
        assert_eq!(answer.status, 200);
        let results = answer.json()["results"].as_array().unwrap().clone();
        let statuses: Vec<&str> = results
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, ["sent", "failed", "failed", "deferred", "sent"]);
        assert_eq!(results[1]["statusCode"], json!(503));
        assert_eq!(results[1]["retryable"], json!(true));
        assert_eq!(results[2]["statusCode"], json!(400));
        assert_eq!(results[2]["retryable"], json!(false));
        assert_eq!(results[3]["messageId"], Value::Null);

        let sent = fake.sent();
        let bodies: Vec<&[u8]> = sent.iter().map(|m| m.body.as_slice()).collect();
        assert_eq!(bodies, [&b"zero"[..], b"\"three\"", b"four"]);
        assert_eq!(
            sent[0].message_id.as_deref(),
            results[0]["messageId"].as_str()
        );
        assert_eq!(sent[0].idempotency_key.as_deref(), Some("a"));
        assert_eq!(sent[1].message_id, None);
        assert_eq!(sent[1].content_type.as_deref(), Some("application/json"));

        // The deferred part is delivered; the failed ones are not.
        let received = client.receive("jobs", "g", 10).await.parts();
        let bodies: Vec<&[u8]> = received.iter().map(|p| p.body.as_slice()).collect();
        assert_eq!(bodies, [&b"zero"[..], b"\"three\"", b"four"]);

        // The hooks were for one batch only; an empty batch is refused.
        let again = batch_body("b2", &[("text/plain", &[], "five")]);
        let content_type = [("Content-Type", "multipart/mixed; boundary=b2")];
        let answer = client
            .call("POST", "/api/v3/topic/jobs/batch", &content_type, &again)
            .await;
        assert_eq!(answer.json()["results"][0]["status"], json!("sent"));
        let empty = client
            .call(
                "POST",
                "/api/v3/topic/jobs/batch",
                &content_type,
                b"--b2--\r\n",
            )
            .await;
        assert_eq!(empty.status, 400);
        let not_multipart = client
            .call(
                "POST",
                "/api/v3/topic/jobs/batch",
                &[("Content-Type", "application/json")],
                b"[]",
            )
            .await;
        assert_eq!(not_multipart.status, 400);
    }

    #[tokio::test]
    async fn a_deferred_send_is_stored_and_delivered() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        fake.defer_next_sends(1);
        let deferred = client.send("jobs", &[], b"later").await;
        assert_eq!(deferred.status, 202);
        assert_eq!(deferred.header("vqs-message-id"), None);
        assert_eq!(fake.sent()[0].message_id, None);
        assert_eq!(client.send("jobs", &[], b"now").await.status, 201);

        let received = client.receive("jobs", "g", 10).await.parts();
        let bodies: Vec<&[u8]> = received.iter().map(|p| p.body.as_slice()).collect();
        assert_eq!(bodies, [&b"later"[..], b"now"]);
    }

    #[tokio::test]
    async fn injected_failures_carry_retry_after_then_stop() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        fake.fail_next(2, 429, Some(7));
        for _ in 0..2 {
            let refused = client.send("jobs", &[], b"x").await;
            assert_eq!(refused.status, 429);
            assert_eq!(refused.header("retry-after"), Some("7"));
            assert!(refused.json()["error"].is_string());
        }
        assert!(fake.sent().is_empty(), "a failed request stores nothing");
        fake.fail_next(1, 503, None);
        let unavailable = client.receive("jobs", "g", 1).await;
        assert_eq!(unavailable.status, 503);
        assert_eq!(unavailable.header("retry-after"), None);
        assert_eq!(client.send("jobs", &[], b"x").await.status, 201);
        assert_eq!(fake.requests().len(), 4);
    }

    #[tokio::test]
    async fn a_slow_answer_still_takes_effect() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        fake.delay_next(1, Duration::from_secs(60));
        let timed_out =
            tokio::time::timeout(Duration::from_secs(2), client.send("jobs", &[], b"x")).await;
        assert!(timed_out.is_err(), "the answer is held back");
        assert_eq!(fake.sent().len(), 1, "the send was accepted all the same");
        assert_eq!(client.receive("jobs", "g", 1).await.status, 200);
    }

    #[tokio::test]
    async fn expired_leases_answer_409_and_redeliver() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        client.send("jobs", &[], b"x").await;
        let first = client.receive("jobs", "g", 1).await.parts();
        let handle = first[0].header("vqs-receipt-handle").unwrap();

        fake.expire_leases();
        let ack = client.lease("DELETE", "jobs", "g", &handle, b"").await;
        assert_eq!(ack.status, 409);
        assert_eq!(ack.json()["error"], json!("Message lease has expired"));
        let patch = client
            .lease(
                "PATCH",
                "jobs",
                "g",
                &handle,
                br#"{"visibilityTimeoutSeconds":10}"#,
            )
            .await;
        assert_eq!(patch.status, 409);

        let second = client.receive("jobs", "g", 1).await.parts();
        assert_eq!(
            second[0].header("vqs-message-id"),
            first[0].header("vqs-message-id")
        );
        assert_eq!(second[0].header("vqs-delivery-count").as_deref(), Some("2"));
        let new_handle = second[0].header("vqs-receipt-handle").unwrap();
        assert_ne!(new_handle, handle);
        // The old handle is no longer the current lease, even though a new one is live.
        assert_eq!(
            client
                .lease("DELETE", "jobs", "g", &handle, b"")
                .await
                .status,
            409
        );
        assert_eq!(
            client
                .lease("DELETE", "jobs", "g", &new_handle, b"")
                .await
                .status,
            204
        );
        assert_eq!(fake.acked().len(), 1);
    }

    /// A consumer function: records each callback, answers `200 {"status":"success"}`.
    async fn callback_server() -> (Server, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let app = Router::new().route(
            "/api/queue",
            post(move |headers: HeaderMap, body: Bytes| async move {
                record.lock().unwrap().push((headers, body));
                json_response(StatusCode::OK, &json!({"status": "success"}))
            }),
        );
        (Server::start(0, app).await.unwrap(), seen)
    }

    fn header_of<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
        headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[tokio::test]
    async fn push_with_payload_leases_and_carries_the_message() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        let (server, seen) = callback_server().await;
        let url = format!("{}/api/queue", server.base_url());
        assert_eq!(fake.push_next(&url, "jobs", "fn", true).await, None);

        let id = client
            .send("jobs", &[("Content-Type", "application/json")], b"{}")
            .await
            .json()["messageId"]
            .as_str()
            .unwrap()
            .to_owned();
        let answer = fake.push_next(&url, "jobs", "fn", true).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&answer.body).unwrap(),
            json!({"status": "success"})
        );

        let (headers, body) = seen.lock().unwrap()[0].clone();
        assert_eq!(&body[..], b"{}");
        assert_eq!(
            header_of(&headers, "ce-type"),
            Some("com.vercel.queue.v2beta")
        );
        assert_eq!(header_of(&headers, "ce-vqsqueuename"), Some("jobs"));
        assert_eq!(header_of(&headers, "ce-vqsconsumergroup"), Some("fn"));
        assert_eq!(header_of(&headers, "ce-vqsmessageid"), Some(id.as_str()));
        assert_eq!(header_of(&headers, "ce-vqsregion"), Some("iad1"));
        assert_eq!(header_of(&headers, "ce-vqsdeliverycount"), Some("1"));
        assert_eq!(
            header_of(&headers, "content-type"),
            Some("application/json")
        );
        for name in [
            "ce-vqscreatedat",
            "ce-vqsexpiresat",
            "ce-vqsvisibilitydeadline",
        ] {
            assert!(
                header_of(&headers, name).is_some_and(|t| t.ends_with('Z')),
                "{name}"
            );
        }
        let handle = header_of(&headers, "ce-vqsreceipthandle")
            .unwrap()
            .to_owned();

        // Leased by the push: neither pushed again nor received, until acked.
        assert_eq!(fake.push_next(&url, "jobs", "fn", true).await, None);
        assert_eq!(client.receive("jobs", "fn", 1).await.status, 204);
        assert_eq!(
            client
                .lease("DELETE", "jobs", "fn", &handle, b"")
                .await
                .status,
            204
        );
        assert_eq!(fake.acked(), vec![id]);
    }

    #[tokio::test]
    async fn push_without_payload_leaves_the_message_to_receive_by_id() {
        let fake = FakeVercelQueues::start().await;
        let client = Client { fake: &fake };
        let (server, seen) = callback_server().await;
        let url = format!("{}/api/queue", server.base_url());
        let id = client.send("jobs", &[], b"payload").await.json()["messageId"]
            .as_str()
            .unwrap()
            .to_owned();

        let answer = fake.push_next(&url, "jobs", "fn", false).await.unwrap();
        assert_eq!(answer.status, 200);
        let (headers, body) = seen.lock().unwrap()[0].clone();
        assert!(body.is_empty());
        assert_eq!(header_of(&headers, "ce-vqsmessageid"), Some(id.as_str()));
        assert_eq!(
            header_of(&headers, "ce-type"),
            Some("com.vercel.queue.v2beta")
        );
        for name in [
            "ce-vqsreceipthandle",
            "ce-vqsdeliverycount",
            "ce-vqsvisibilitydeadline",
        ] {
            assert_eq!(header_of(&headers, name), None, "{name}");
        }

        let by_id = format!("{PREFIX}jobs/consumer/fn/id/{id}");
        let got = client
            .call("POST", &by_id, &[("Accept", "multipart/mixed")], b"")
            .await;
        assert_eq!(got.status, 200);
        let part = &got.parts()[0];
        assert_eq!(part.body, b"payload");
        assert_eq!(part.header("vqs-delivery-count").as_deref(), Some("1"));
    }

    #[test]
    fn routes_decode_their_segments() {
        assert_eq!(
            Route::parse("/api/v3/topic/t/consumer/g/lease/rh_1%3Amsg_1%3Ag%20%2Flease"),
            Some(Route::Lease(
                "t".into(),
                "g".into(),
                "rh_1:msg_1:g /lease".into()
            ))
        );
        assert_eq!(
            Route::parse("/api/v3/topic/t/consumer/g/lease/rh_1%3Amsg_1%3Ag%20/lease/visibility"),
            Some(Route::Lease(
                "t".into(),
                "g".into(),
                "rh_1:msg_1:g /lease".into()
            ))
        );
        assert_eq!(
            Route::parse("/api/v3/topic/t/batch"),
            Some(Route::Batch("t".into()))
        );
        assert_eq!(
            Route::parse("/api/v3/topic/t/consumer/g/id/msg_1"),
            Some(Route::ById("t".into(), "g".into(), "msg_1".into()))
        );
        assert_eq!(Route::parse("/api/v3/topic/t/other"), None);
        assert_eq!(Route::parse("/api/v3/topic/t%zz"), None);
        assert_eq!(Route::parse("/api/v2/topic/t"), None);
    }

    #[test]
    fn times_are_iso_utc_with_milliseconds() {
        assert_eq!(iso(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = UNIX_EPOCH + Duration::from_millis(1_796_081_400_123);
        assert_eq!(iso(at), "2026-11-30T23:30:00.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(iso(leap), "2000-02-29T00:00:00.000Z");
    }
}

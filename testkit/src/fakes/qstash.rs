//! A local fake of Upstash QStash (REST v2): publishing, signed push deliveries with retries,
//! queues, schedules and the DLQ.
//!
//! Wire facts reproduced (docs/adr/0010-qstash-adapter.md cites the sources):
//!
//! - `Authorization: Bearer <token>` or `?qstash_token=`, else `401` `{"error": "…"}`; the
//!   published local-development token ([`DEV_TOKEN`]) and signing keys ([`DEV_CURRENT_KEY`],
//!   [`DEV_NEXT_KEY`]) are the defaults of [`FakeQStash::start`];
//! - `POST /v2/publish/{destination}` (the URL appended unencoded) and
//!   `POST /v2/enqueue/{queue}/{destination}` → `200` `{"messageId": "msg_…", "url": …,
//!   "deduplicated": false}`; a repeated `Upstash-Deduplication-Id`, or with
//!   `Upstash-Content-Based-Deduplication: true` the same destination, body, `Content-Type` and
//!   forwarded headers, within 10 minutes → `202` with the first id and `"deduplicated": true`;
//!   `Upstash-Delay` (`1d2h3m4s`), `Upstash-Not-Before` (unix seconds, wins over the delay),
//!   `Upstash-Retries` (default 3), `Upstash-Retry-Delay` (an expression in ms over `retried`),
//!   `Upstash-Timeout`, `Upstash-Method`, `Upstash-Forward-*`;
//! - `POST /v2/batch`: a JSON array of `{destination, body, headers, queue}`, one answer each;
//! - delivery to the destination with `Upstash-Signature` (JWT HS256 keyed by the signing-key
//!   string; `iss`, `sub`, `exp` = `iat` + 300, `nbf`, `iat`, `jti`, `body` = base64url of the
//!   body's SHA-256, padded like the docs' example unless [`FakeQStash::pad_body_hash`] says
//!   otherwise), `Upstash-Retried`, `Upstash-Message-Id`, `Upstash-Schedule-Id`,
//!   `User-Agent: Upstash-QStash`, the original `Content-Type` and the forwarded headers;
//! - any 2xx settles; otherwise a retry after `Retry-After` (seconds, RFC 1123 or `6m5s`, at
//!   most a day), else the `Upstash-Retry-Delay` expression, else `min(86400, e^(2.5·n))` s with
//!   `n` the retries so far; `489` with `Upstash-NonRetryable-Error: true`, or no retry left,
//!   moves the message to the DLQ (`dlqId` = `"<ms>-<seq>"`);
//! - queues: `POST /v2/queues` (upsert; an optional `paused` sets the state, as QStash's SDK
//!   sends it), `GET /v2/queues`, `GET|DELETE /v2/queues/{name}` with `paused` and `lag`,
//!   `POST /v2/queues/{name}/pause|resume` (a paused queue accepts messages and delivers none
//!   until resumed); parallelism 1 delivers one message of the queue at a time, in order (FIFO);
//! - flow control: messages published with `Upstash-Flow-Control-Key` and
//!   `Upstash-Flow-Control-Value: parallelism=N` are delivered at most N of a key at a time,
//!   oldest first (the value's `rate` and `period` are not enforced);
//! - schedules: `POST /v2/schedules/{destination}` with `Upstash-Cron` and an optional
//!   `Upstash-Schedule-Id` (upsert) → `{"scheduleId"}`, `GET /v2/schedules`,
//!   `GET|DELETE /v2/schedules/{id}` (`createdAt`, `method`, `isPaused`, `header`, `body`,
//!   `retries`, …), `POST|PATCH /v2/schedules/{id}/pause|resume`; a schedule fires when a test
//!   calls [`FakeQStash::fire_schedule`] (the cron expression is stored, not interpreted), a
//!   paused one not at all;
//! - DLQ: `GET /v2/dlq?cursor=&count=` (filters `dlqIds`, `messageId`, `url`, `queueName`),
//!   `GET|DELETE /v2/dlq/{dlqId}` (`404` if unknown); each entry is a QStash message (`messageId`,
//!   `url`, `method`, `header` as `{name: [values]}`, `body` or `bodyBase64`, `maxRetries`,
//!   `retryDelayExpression`, `notBefore` and `createdAt` in ms, `queueName`, `scheduleId`) plus
//!   `dlqId` and the last answer (`responseStatus`, 0 when unreachable, `responseHeader`,
//!   `responseBody` or `responseBodyBase64`); absent values are left out, never `null`;
//!   `DELETE /v2/dlq?dlqIds=a&dlqIds=b` (or the body `{"dlqIds": […]}`) → `{"deleted": n}`,
//!   unknown ids not counted; `POST /v2/dlq/retry/{dlqId}` → `201` with the publish answer,
//!   `POST /v2/dlq/retry?dlqIds=a&dlqIds=b` → `201` `{"responses": [publish answer, …]}`, `404`
//!   retrying none if an id is unknown (both also take a comma-separated value); a retry takes
//!   the request's `Upstash-*` headers over the original ones. Filter-based bulk operations are
//!   not faked: without `dlqIds` they answer `400`.
//!
//! Time: the fake's clock is the system clock plus an offset moved by [`FakeQStash::advance`].
//! Retry delays are multiplied by a scale ([`FakeQStash::set_retry_scale`], default 1; 0 retries
//! at once) so tests need not wait, while [`FakeQStash::attempts`] records the unscaled delay
//! QStash would have used. The texts of error messages are the fake's own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::{Server, error, json_response};

/// The token of QStash's local development server (`qstash/howto/local-development.mdx`).
pub const DEV_TOKEN: &str =
    "eyJVc2VySUQiOiJkZWZhdWx0VXNlciIsIlBhc3N3b3JkIjoiZGVmYXVsdFBhc3N3b3JkIn0=";
/// The current signing key of QStash's local development server.
pub const DEV_CURRENT_KEY: &str = "sig_7kYjw48mhY7kAjqNGcy6cr29RJ6r";
/// The next signing key of QStash's local development server.
pub const DEV_NEXT_KEY: &str = "sig_5ZB6DVzB1wjE8S6rZ7eenA8Pdnhs";

/// How long a deduplication id is remembered, as QStash.
const DEDUP_WINDOW: Duration = Duration::from_secs(10 * 60);
/// A signature's lifetime, as QStash.
const SIGNATURE_LIFETIME: u64 = 300;
/// The longest `Retry-After` QStash honours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);
/// The default number of retries.
const DEFAULT_RETRIES: u32 = 3;
/// How long the fake waits for an endpoint without `Upstash-Timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the dispatcher looks for due messages when nothing wakes it.
const TICK: Duration = Duration::from_millis(5);

/// A QStash API on `127.0.0.1` that delivers to local endpoints, for tests.
///
/// ```no_run
/// use jobs_testkit::fakes::qstash::FakeQStash;
///
/// # async fn example() -> std::io::Result<()> {
/// let fake = FakeQStash::start().await?;
/// fake.set_retry_scale(0.0);
/// // publish to fake.base_url() with fake.token(), deliveries go to the destination URL.
/// assert!(fake.wait_idle(std::time::Duration::from_secs(5)).await);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FakeQStash {
    server: Server,
    shared: Arc<Shared>,
}

/// One message as the fake holds it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeMessage {
    /// `msg_…`.
    pub message_id: String,
    /// The destination URL.
    pub url: String,
    /// The QStash queue it was enqueued on, if any.
    pub queue: Option<String>,
    /// The body as published.
    pub body: Vec<u8>,
    /// Every request header of the publish (lowercase names), for assertions.
    pub publish_headers: Vec<(String, String)>,
    /// `Upstash-Retries`.
    pub max_retries: u32,
    /// Retries made so far.
    pub retried: u32,
    /// Not delivered before this time (the fake's clock); moved by each retry.
    pub not_before: SystemTime,
    /// When it was accepted (the fake's clock).
    pub created_at: SystemTime,
    /// The schedule that created it, if any.
    pub schedule_id: Option<String>,
    /// Where it stands.
    pub state: MessageState,
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Waiting for its time (or its turn in a FIFO queue).
    Pending,
    /// A delivery request is under way.
    InFlight,
    /// An endpoint answered 2xx.
    Delivered,
    /// Moved to the DLQ.
    Failed,
    /// Deleted from the DLQ.
    Deleted,
}

/// One delivery request the fake made.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeAttempt {
    /// The message delivered.
    pub message_id: String,
    /// `Upstash-Retried` as sent.
    pub retried: u32,
    /// The endpoint's status, or `None` when it could not be reached or timed out.
    pub status: Option<u16>,
    /// The endpoint's `Retry-After`, if any.
    pub retry_after: Option<String>,
    /// The unscaled delay QStash would wait before the next retry; `None` when settled.
    pub next_delay: Option<Duration>,
    /// The signature sent.
    pub signature: String,
}

#[derive(Debug)]
struct Shared {
    token: String,
    current_key: String,
    next_key: String,
    stopped: AtomicBool,
    wake: Notify,
    state: Mutex<FakeState>,
}

#[derive(Debug)]
struct FakeState {
    offset: Duration,
    retry_scale: f64,
    pad_body_hash: bool,
    sign_with_next: bool,
    seq: u64,
    messages: Vec<FakeMessage>,
    /// Per message: method, forwarded headers, content type, timeout.
    delivery: HashMap<String, DeliverySpec>,
    dedup: HashMap<String, (String, SystemTime)>,
    attempts: Vec<FakeAttempt>,
    queues: Vec<FakeQueue>,
    schedules: Vec<FakeSchedule>,
    dlq: Vec<DlqEntry>,
    fault: Option<(StatusCode, usize)>,
    paused: bool,
}

#[derive(Debug, Clone)]
struct DeliverySpec {
    method: Method,
    forward: Vec<(String, String)>,
    content_type: Option<String>,
    timeout: Duration,
    retry_delay: Option<String>,
    /// The first time it was due, which retries do not move (the DLQ's `notBefore`).
    first_not_before: SystemTime,
}

/// A message in the DLQ, with the last answer of its endpoint.
#[derive(Debug, Clone)]
struct DlqEntry {
    dlq_id: String,
    message_id: String,
    /// The endpoint's status, 0 when it could not be reached.
    status: u16,
    /// The endpoint's headers (lowercase names), in order.
    response_header: Vec<(String, String)>,
    response_body: Vec<u8>,
}

#[derive(Debug, Clone)]
struct FakeQueue {
    name: String,
    parallelism: u32,
    paused: bool,
    created_at: u64,
    updated_at: u64,
}

/// A schedule the fake holds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeSchedule {
    /// `scd_…` or the `Upstash-Schedule-Id` given.
    pub schedule_id: String,
    /// `Upstash-Cron`, as given.
    pub cron: String,
    /// The destination URL.
    pub destination: String,
    /// The body of every message it creates.
    pub body: Vec<u8>,
    /// The publish headers it copies onto every message.
    pub headers: Vec<(String, String)>,
    /// When it was first created (the fake's clock); an upsert keeps it.
    pub created_at: SystemTime,
    /// Whether it is paused: its cron trigger is then ignored ([`FakeQStash::fire_schedule`]
    /// creates nothing) until it is resumed.
    pub paused: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test thread must not hide what was recorded from the others.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeState {
    fn now(&self) -> SystemTime {
        SystemTime::now() + self.offset
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

impl FakeQStash {
    /// Starts a fake with the published local-development token and signing keys.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(0, DEV_TOKEN, DEV_CURRENT_KEY, DEV_NEXT_KEY).await
    }

    /// Starts a fake on `127.0.0.1:port` (`0` for any free port) accepting only `token` and
    /// signing deliveries with `current_key` (or `next_key`, see
    /// [`FakeQStash::sign_with_next_key`]).
    pub async fn start_on(
        port: u16,
        token: impl Into<String>,
        current_key: impl Into<String>,
        next_key: impl Into<String>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            token: token.into(),
            current_key: current_key.into(),
            next_key: next_key.into(),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
            state: Mutex::new(FakeState {
                offset: Duration::ZERO,
                retry_scale: 1.0,
                pad_body_hash: true,
                sign_with_next: false,
                seq: 0,
                messages: Vec::new(),
                delivery: HashMap::new(),
                dedup: HashMap::new(),
                attempts: Vec::new(),
                queues: Vec::new(),
                schedules: Vec::new(),
                dlq: Vec::new(),
                fault: None,
                paused: false,
            }),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = Server::start(port, app).await?;
        tokio::spawn(dispatch(Arc::downgrade(&shared)));
        Ok(FakeQStash { server, shared })
    }

    /// `http://127.0.0.1:<port>`: the base URL to configure the adapter with.
    pub fn base_url(&self) -> &str {
        self.server.base_url()
    }

    /// The only token this fake accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The current signing key.
    pub fn current_signing_key(&self) -> &str {
        &self.shared.current_key
    }

    /// The next signing key.
    pub fn next_signing_key(&self) -> &str {
        &self.shared.next_key
    }

    /// The fake's clock: the system clock plus every [`FakeQStash::advance`].
    pub fn now(&self) -> SystemTime {
        self.shared.state().now()
    }

    /// Moves the fake's clock forward by `by`, delivering what becomes due.
    pub fn advance(&self, by: Duration) {
        self.shared.state().offset += by;
        self.shared.wake.notify_one();
    }

    /// Multiplies every retry delay by `scale` before waiting it (0 retries at once); the
    /// attempts still record the unscaled delay.
    pub fn set_retry_scale(&self, scale: f64) {
        self.shared.state().retry_scale = scale.max(0.0);
    }

    /// Whether the `body` claim keeps its `=` padding (the default, as the docs' example).
    pub fn pad_body_hash(&self, pad: bool) {
        self.shared.state().pad_body_hash = pad;
    }

    /// Signs deliveries with the next key instead of the current one, as after a rotation.
    pub fn sign_with_next_key(&self, next: bool) {
        self.shared.state().sign_with_next = next;
    }

    /// Stops (`true`) or resumes delivering; publishing goes on.
    pub fn pause_deliveries(&self, paused: bool) {
        self.shared.state().paused = paused;
        self.shared.wake.notify_one();
    }

    /// Makes the next `n` API requests (not deliveries) answer `status` with an error body,
    /// before any check; `n = 0` clears it.
    ///
    /// # Panics
    ///
    /// If `status` is not an HTTP status code: a mistake in the test itself.
    pub fn fail_next(&self, status: u16, n: usize) {
        let Ok(status) = StatusCode::from_u16(status) else {
            panic!("fail_next: {status} is not an HTTP status code");
        };
        self.shared.state().fault = (n > 0).then_some((status, n));
    }

    /// Every message accepted so far (duplicates not included), oldest first.
    pub fn messages(&self) -> Vec<FakeMessage> {
        self.shared.state().messages.clone()
    }

    /// One message by id.
    pub fn message(&self, message_id: &str) -> Option<FakeMessage> {
        let state = self.shared.state();
        state
            .messages
            .iter()
            .find(|m| m.message_id == message_id)
            .cloned()
    }

    /// Every delivery request made so far, in the order their answers arrived.
    pub fn attempts(&self) -> Vec<FakeAttempt> {
        self.shared.state().attempts.clone()
    }

    /// The schedules held.
    pub fn schedules(&self) -> Vec<FakeSchedule> {
        self.shared.state().schedules.clone()
    }

    /// The ids of the messages in the DLQ, oldest first.
    pub fn dlq_message_ids(&self) -> Vec<String> {
        self.shared
            .state()
            .dlq
            .iter()
            .map(|e| e.message_id.clone())
            .collect()
    }

    /// Creates a message from schedule `schedule_id` now, as its cron would; `None` if there is
    /// no such schedule or it is paused ("the cron trigger will simply be ignored", QStash's
    /// pause-a-schedule page).
    pub fn fire_schedule(&self, schedule_id: &str) -> Option<String> {
        let id = {
            let mut state = self.shared.state();
            let schedule = state
                .schedules
                .iter()
                .find(|s| s.schedule_id == schedule_id && !s.paused)?
                .clone();
            let headers = to_header_map(&schedule.headers);
            match accept(
                &mut state,
                &schedule.destination,
                None,
                &headers,
                schedule.body.clone(),
                Some(schedule.schedule_id.clone()),
            ) {
                Ok(published) => published.message_id,
                Err(_) => return None,
            }
        };
        self.shared.wake.notify_one();
        Some(id)
    }

    /// Waits until no message is due now or in flight (those waiting for a later time do not
    /// count), or `timeout` passes; `true` when idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let busy = {
                let state = self.shared.state();
                let now = state.now();
                !state.paused
                    && state.messages.iter().any(|m| {
                        m.state == MessageState::InFlight
                            || (m.state == MessageState::Pending
                                && m.not_before <= now
                                && eligible(&state, m, now))
                    })
            };
            if !busy {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Stops the server and the deliveries, and waits until the server has closed.
    pub async fn shutdown(self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        self.server.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The API.

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    let response = {
        let mut state = shared.state();
        if let Some((status, remaining)) = state.fault.as_mut() {
            let status = *status;
            *remaining -= 1;
            if *remaining == 0 {
                state.fault = None;
            }
            return error(status, "injected by FakeQStash");
        }
        if !authorised(&shared.token, &headers, &query) {
            return error(StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        route(&mut state, &method, &path, &query, &headers, body.to_vec())
    };
    shared.wake.notify_one();
    response
}

fn route(
    state: &mut FakeState,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Response {
    // The destination keeps its query, minus our token.
    let destination_query = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("qstash_token="))
        .collect::<Vec<_>>()
        .join("&");
    let with_query = |dest: &str| {
        if destination_query.is_empty() {
            dest.to_owned()
        } else {
            format!("{dest}?{destination_query}")
        }
    };
    if let Some(dest) = path.strip_prefix("/v2/publish/") {
        if method != Method::POST {
            return not_allowed();
        }
        return publish_answer(accept(state, &with_query(dest), None, headers, body, None));
    }
    if let Some(rest) = path.strip_prefix("/v2/enqueue/") {
        if method != Method::POST {
            return not_allowed();
        }
        let Some((queue, dest)) = rest.split_once('/') else {
            return error(StatusCode::BAD_REQUEST, "destination missing");
        };
        if !valid_queue_name(queue) {
            return error(StatusCode::BAD_REQUEST, "invalid queue name");
        }
        ensure_queue(state, queue, None);
        return publish_answer(accept(
            state,
            &with_query(dest),
            Some(queue.to_owned()),
            headers,
            body,
            None,
        ));
    }
    match (method.clone(), path.trim_end_matches('/')) {
        (Method::POST, "/v2/batch") => batch(state, &body),
        (Method::POST, "/v2/queues") => upsert_queue(state, &body),
        (Method::GET, "/v2/queues") => {
            let list: Vec<Value> = state.queues.iter().map(|q| queue_json(state, q)).collect();
            json_response(StatusCode::OK, &Value::Array(list))
        }
        (Method::GET, "/v2/schedules") => {
            let list: Vec<Value> = state.schedules.iter().map(schedule_json).collect();
            json_response(StatusCode::OK, &Value::Array(list))
        }
        (Method::GET, "/v2/dlq") => list_dlq(state, query),
        (Method::DELETE, "/v2/dlq") => delete_dlq_many(state, query, &body),
        (Method::POST, "/v2/dlq/retry") => retry_dlq_many(state, query, headers),
        (m, p) => {
            if let Some(name) = p.strip_prefix("/v2/queues/") {
                return queue_item(state, &m, name);
            }
            if let Some(rest) = p.strip_prefix("/v2/schedules/") {
                return schedule_item(state, &m, &with_query(rest), headers, body);
            }
            if let Some(id) = p.strip_prefix("/v2/dlq/retry/") {
                return match m {
                    Method::POST => match retry_dlq(state, id, headers) {
                        Ok(published) => json_response(StatusCode::CREATED, &published.json()),
                        Err((status, message)) => error(status, &message),
                    },
                    _ => not_allowed(),
                };
            }
            if let Some(id) = p.strip_prefix("/v2/dlq/") {
                return dlq_item(state, &m, id);
            }
            error(StatusCode::NOT_FOUND, "not found")
        }
    }
}

/// What a publish answered.
#[derive(Debug)]
struct Published {
    /// The new message's id, or the first one's for a duplicate.
    message_id: String,
    /// The destination published to.
    url: String,
    deduplicated: bool,
}

impl Published {
    /// The answer's body, as QStash's SDK types it (`PublishToUrlResponse`).
    fn json(&self) -> Value {
        json!({
            "messageId": self.message_id,
            "url": self.url,
            "deduplicated": self.deduplicated,
        })
    }
}

/// A publish: what it answered, or why it was refused.
type Accepted = Result<Published, (StatusCode, String)>;

/// `200`, or `202` for a duplicate, with the publish answer.
fn publish_answer(accepted: Accepted) -> Response {
    match accepted {
        Ok(published) => {
            let status = if published.deduplicated {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            json_response(status, &published.json())
        }
        Err((status, message)) => error(status, &message),
    }
}

/// Validates the publish headers and stores the message (or finds its duplicate).
fn accept(
    state: &mut FakeState,
    destination: &str,
    queue: Option<String>,
    headers: &HeaderMap,
    body: Vec<u8>,
    schedule_id: Option<String>,
) -> Accepted {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    if !(destination.starts_with("http://") || destination.starts_with("https://")) {
        return Err(bad(format!(
            "invalid destination url `{destination}` (URL groups are not faked)"
        )));
    }
    let now = state.now();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let forward: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let rest = name.as_str().strip_prefix("upstash-forward-")?;
            Some((rest.to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    let content_type = text("content-type").map(str::to_owned);
    let content_based = match text("upstash-content-based-deduplication") {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            return Err(bad(format!(
                "invalid Upstash-Content-Based-Deduplication `{v}` (true or false)"
            )));
        }
    };
    // An explicit id wins; the content key is prefixed so the two kinds never collide.
    let dedup_key = match text("upstash-deduplication-id") {
        Some(id) => Some(format!("id:{id}")),
        None if content_based => Some(format!(
            "content:{}",
            content_hash(destination, &body, content_type.as_deref(), &forward)
        )),
        None => None,
    };
    if let Some(key) = &dedup_key {
        state
            .dedup
            .retain(|_, (_, at)| now.duration_since(*at).unwrap_or_default() < DEDUP_WINDOW);
        if let Some((id, _)) = state.dedup.get(key) {
            return Ok(Published {
                message_id: id.clone(),
                url: destination.to_owned(),
                deduplicated: true,
            });
        }
    }
    let not_before = match (text("upstash-not-before"), text("upstash-delay")) {
        (Some(nb), _) => {
            let secs: u64 = nb
                .parse()
                .map_err(|_| bad(format!("invalid Upstash-Not-Before `{nb}`")))?;
            UNIX_EPOCH + Duration::from_secs(secs)
        }
        (None, Some(delay)) => {
            now + parse_duration(delay).ok_or_else(|| bad(format!("invalid delay `{delay}`")))?
        }
        (None, None) => now,
    };
    let max_retries = match text("upstash-retries") {
        Some(r) => r
            .parse()
            .map_err(|_| bad(format!("invalid Upstash-Retries `{r}`")))?,
        None => DEFAULT_RETRIES,
    };
    let retry_delay = text("upstash-retry-delay").map(str::to_owned);
    if let Some(expr) = &retry_delay {
        eval_retry_delay(expr, 0).map_err(|e| bad(format!("invalid Upstash-Retry-Delay: {e}")))?;
    }
    let timeout = match text("upstash-timeout") {
        Some(t) => parse_duration(t).ok_or_else(|| bad(format!("invalid timeout `{t}`")))?,
        None => DEFAULT_TIMEOUT,
    };
    let method = match text("upstash-method") {
        Some(m) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| bad(format!("invalid method `{m}`")))?,
        None => Method::POST,
    };
    let seq = state.next_seq();
    let id = format!("msg_{:016x}{seq:08x}", millis(now));
    if let Some(key) = dedup_key {
        state.dedup.insert(key, (id.clone(), now));
    }
    state.delivery.insert(
        id.clone(),
        DeliverySpec {
            method,
            forward,
            content_type,
            timeout,
            retry_delay,
            first_not_before: not_before,
        },
    );
    state.messages.push(FakeMessage {
        message_id: id.clone(),
        url: destination.to_owned(),
        queue,
        body,
        publish_headers: headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        max_retries,
        retried: 0,
        not_before,
        created_at: now,
        schedule_id,
        state: MessageState::Pending,
    });
    Ok(Published {
        message_id: id,
        url: destination.to_owned(),
        deduplicated: false,
    })
}

/// The key of content-based deduplication: destination, body, `Content-Type` and forwarded
/// headers (sorted, so their order does not matter), each length-prefixed so no two different
/// inputs run together.
fn content_hash(
    destination: &str,
    body: &[u8],
    content_type: Option<&str>,
    forward: &[(String, String)],
) -> String {
    let mut forward = forward.to_vec();
    forward.sort();
    let mut hasher = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    part(destination.as_bytes());
    part(body);
    part(content_type.unwrap_or_default().as_bytes());
    for (name, value) in &forward {
        part(name.as_bytes());
        part(value.as_bytes());
    }
    URL_SAFE_NO_PAD.encode(hasher.finalize())
}

fn batch(state: &mut FakeState, body: &[u8]) -> Response {
    let Ok(Value::Array(entries)) = serde_json::from_slice::<Value>(body) else {
        return error(StatusCode::BAD_REQUEST, "the body must be a JSON array");
    };
    let answers: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let Some(destination) = entry.get("destination").and_then(Value::as_str) else {
                return json!({ "error": "destination is required" });
            };
            let mut headers = HeaderMap::new();
            if let Some(Value::Object(given)) = entry.get("headers") {
                for (name, value) in given {
                    if let (Ok(name), Some(Ok(value))) = (
                        name.to_ascii_lowercase().parse::<axum::http::HeaderName>(),
                        value.as_str().map(HeaderValue::from_str),
                    ) {
                        headers.insert(name, value);
                    }
                }
            }
            let body = entry
                .get("body")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .as_bytes()
                .to_vec();
            let queue = entry
                .get("queue")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if let Some(q) = &queue {
                ensure_queue(state, q, None);
            }
            match accept(state, destination, queue, &headers, body, None) {
                Ok(published) => published.json(),
                Err((_, message)) => json!({ "error": message }),
            }
        })
        .collect();
    json_response(StatusCode::OK, &Value::Array(answers))
}

fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

fn ensure_queue(state: &mut FakeState, name: &str, parallelism: Option<u32>) {
    let now = millis(state.now());
    match state.queues.iter_mut().find(|q| q.name == name) {
        Some(q) => {
            if let Some(p) = parallelism {
                q.parallelism = p;
                q.updated_at = now;
            }
        }
        None => state.queues.push(FakeQueue {
            name: name.to_owned(),
            parallelism: parallelism.unwrap_or(1),
            paused: false,
            created_at: now,
            updated_at: now,
        }),
    }
}

fn upsert_queue(state: &mut FakeState, body: &[u8]) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return error(StatusCode::BAD_REQUEST, "the body must be JSON");
    };
    let Some(name) = request.get("queueName").and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "queueName is required");
    };
    if !valid_queue_name(name) {
        return error(StatusCode::BAD_REQUEST, "invalid queue name");
    }
    let parallelism = request
        .get("parallelism")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    if parallelism == 0 {
        return error(StatusCode::BAD_REQUEST, "parallelism must be at least 1");
    }
    // `paused` is optional: QStash's SDK always sends it (`UpsertQueueRequest.paused`, "whether
    // to pause the queue or not", default false); a request without it leaves the state as is.
    let paused = match request.get("paused") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(paused)) => Some(*paused),
        Some(_) => return error(StatusCode::BAD_REQUEST, "paused must be a boolean"),
    };
    ensure_queue(
        state,
        name,
        Some(u32::try_from(parallelism).unwrap_or(u32::MAX)),
    );
    if let Some(paused) = paused {
        let now = millis(state.now());
        if let Some(queue) = state.queues.iter_mut().find(|q| q.name == name)
            && queue.paused != paused
        {
            queue.paused = paused;
            queue.updated_at = now;
        }
    }
    (StatusCode::OK, "").into_response()
}

fn queue_json(state: &FakeState, q: &FakeQueue) -> Value {
    let lag = state
        .messages
        .iter()
        .filter(|m| {
            m.queue.as_deref() == Some(q.name.as_str())
                && matches!(m.state, MessageState::Pending | MessageState::InFlight)
        })
        .count();
    json!({
        "name": q.name,
        "createdAt": q.created_at,
        "updatedAt": q.updated_at,
        "parallelism": q.parallelism,
        "paused": q.paused,
        "lag": lag,
    })
}

/// `GET|DELETE /v2/queues/{name}` and `POST /v2/queues/{name}/pause|resume` (`200`, no body;
/// pausing a paused queue, or resuming an active one, changes nothing).
fn queue_item(state: &mut FakeState, method: &Method, rest: &str) -> Response {
    let (name, action) = match rest.split_once('/') {
        Some((name, action)) => (name, Some(action)),
        None => (rest, None),
    };
    let Some(index) = state.queues.iter().position(|q| q.name == name) else {
        return error(StatusCode::NOT_FOUND, "queue not found");
    };
    match (action, method) {
        (None, &Method::GET) => {
            json_response(StatusCode::OK, &queue_json(state, &state.queues[index]))
        }
        (None, &Method::DELETE) => {
            state.queues.remove(index);
            (StatusCode::OK, "").into_response()
        }
        (Some(action @ ("pause" | "resume")), &Method::POST) => {
            let now = millis(state.now());
            let queue = &mut state.queues[index];
            let paused = action == "pause";
            if queue.paused != paused {
                queue.paused = paused;
                queue.updated_at = now;
            }
            (StatusCode::OK, "").into_response()
        }
        (None | Some("pause" | "resume"), _) => not_allowed(),
        (Some(_), _) => error(StatusCode::NOT_FOUND, "not found"),
    }
}

/// A schedule as QStash's API reference shows it (get-a-schedule, list-schedules):
/// `scheduleId`, `cron`, `destination`, `createdAt` (ms), `method` and `isPaused` always; the
/// message's `header` (its `Content-Type` and forwarded headers, `{name: [values]}`), `body`
/// (or `bodyBase64`) and `retries`; `delay` (seconds) and `retryDelayExpression` when given.
fn schedule_json(s: &FakeSchedule) -> Value {
    let given = |name: &str| {
        s.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    let mut out = serde_json::Map::new();
    out.insert("scheduleId".into(), json!(s.schedule_id));
    out.insert("cron".into(), json!(s.cron));
    out.insert("destination".into(), json!(s.destination));
    out.insert("createdAt".into(), json!(millis(s.created_at)));
    let method =
        given("upstash-method").map_or_else(|| "POST".to_owned(), |m| m.to_ascii_uppercase());
    out.insert("method".into(), json!(method));
    out.insert("isPaused".into(), json!(s.paused));
    let sent: Vec<(String, String)> = s
        .headers
        .iter()
        .filter_map(|(name, value)| {
            let name = if name == "content-type" {
                name.as_str()
            } else {
                name.strip_prefix("upstash-forward-")?
            };
            Some((name.to_owned(), value.clone()))
        })
        .collect();
    out.insert("header".into(), header_json(&sent));
    insert_body(&mut out, "body", "bodyBase64", &s.body);
    let retries = given("upstash-retries")
        .and_then(|r| r.parse::<u32>().ok())
        .unwrap_or(DEFAULT_RETRIES);
    out.insert("retries".into(), json!(retries));
    if let Some(delay) = given("upstash-delay").and_then(|d| parse_duration(&d)) {
        out.insert("delay".into(), json!(delay.as_secs()));
    }
    if let Some(expression) = given("upstash-retry-delay") {
        out.insert("retryDelayExpression".into(), json!(expression));
    }
    Value::Object(out)
}

/// `POST|PATCH /v2/schedules/{id}/pause|resume` (`200`, no body): the API reference says
/// `POST`, QStash's TypeScript SDK sends `PATCH`; pausing a paused schedule, or resuming an
/// active one, changes nothing. `None` when `rest` is not such a path.
fn schedule_action(state: &mut FakeState, method: &Method, rest: &str) -> Option<Response> {
    if rest.starts_with("http://") || rest.starts_with("https://") {
        return None;
    }
    let (id, action) = rest.split_once('/')?;
    if !matches!(action, "pause" | "resume") {
        return None;
    }
    if !matches!(*method, Method::POST | Method::PATCH) {
        return Some(not_allowed());
    }
    Some(
        match state.schedules.iter_mut().find(|s| s.schedule_id == id) {
            Some(schedule) => {
                schedule.paused = action == "pause";
                (StatusCode::OK, "").into_response()
            }
            None => error(StatusCode::NOT_FOUND, "schedule not found"),
        },
    )
}

fn schedule_item(
    state: &mut FakeState,
    method: &Method,
    rest: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Response {
    if let Some(answer) = schedule_action(state, method, rest) {
        return answer;
    }
    match *method {
        Method::POST => {
            let Some(cron) = headers
                .get("upstash-cron")
                .and_then(|v| v.to_str().ok())
                .filter(|c| !c.trim().is_empty())
            else {
                return error(StatusCode::BAD_REQUEST, "Upstash-Cron header is required");
            };
            if !(rest.starts_with("http://") || rest.starts_with("https://")) {
                return error(StatusCode::BAD_REQUEST, "invalid destination url");
            }
            let fields = cron
                .split_whitespace()
                .filter(|f| !f.starts_with("CRON_TZ="))
                .count();
            if fields != 5 {
                return error(StatusCode::BAD_REQUEST, "invalid cron expression");
            }
            let id = match headers
                .get("upstash-schedule-id")
                .and_then(|v| v.to_str().ok())
            {
                Some(id) => id.to_owned(),
                None => {
                    let seq = state.next_seq();
                    format!("scd_{:016x}{seq:08x}", millis(state.now()))
                }
            };
            let copied = headers
                .iter()
                .filter(|(n, _)| {
                    let n = n.as_str();
                    n != "upstash-cron" && n != "upstash-schedule-id" && n != "authorization"
                })
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect();
            let mut schedule = FakeSchedule {
                schedule_id: id.clone(),
                cron: cron.to_owned(),
                destination: rest.to_owned(),
                body,
                headers: copied,
                created_at: state.now(),
                paused: false,
            };
            // An upsert replaces what the request says; it keeps when the schedule was created
            // and whether it is paused, which the request does not say.
            match state.schedules.iter_mut().find(|s| s.schedule_id == id) {
                Some(existing) => {
                    schedule.created_at = existing.created_at;
                    schedule.paused = existing.paused;
                    *existing = schedule;
                }
                None => state.schedules.push(schedule),
            }
            json_response(StatusCode::OK, &json!({ "scheduleId": id }))
        }
        Method::GET => match state.schedules.iter().find(|s| s.schedule_id == rest) {
            Some(s) => json_response(StatusCode::OK, &schedule_json(s)),
            None => error(StatusCode::NOT_FOUND, "schedule not found"),
        },
        Method::DELETE => {
            state.schedules.retain(|s| s.schedule_id != rest);
            (StatusCode::OK, "").into_response()
        }
        _ => not_allowed(),
    }
}

/// A DLQ entry as QStash lists it: the message (`Message` in QStash's API) plus `dlqId` and the
/// endpoint's last answer. Values the message lacks are left out rather than `null`.
fn dlq_entry(state: &FakeState, entry: &DlqEntry) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("dlqId".into(), json!(entry.dlq_id));
    out.insert("messageId".into(), json!(entry.message_id));
    if let Some(m) = state
        .messages
        .iter()
        .find(|m| m.message_id == entry.message_id)
    {
        let spec = state.delivery.get(&m.message_id);
        out.insert("url".into(), json!(m.url));
        let method = spec.map_or("POST", |s| s.method.as_str());
        out.insert("method".into(), json!(method));
        let mut sent = Vec::new();
        if let Some(ct) = spec.and_then(|s| s.content_type.clone()) {
            sent.push(("content-type".to_owned(), ct));
        }
        sent.extend(spec.map(|s| s.forward.clone()).unwrap_or_default());
        out.insert("header".into(), header_json(&sent));
        insert_body(&mut out, "body", "bodyBase64", &m.body);
        out.insert("maxRetries".into(), json!(m.max_retries));
        let not_before = spec.map_or(m.created_at, |s| s.first_not_before);
        out.insert("notBefore".into(), json!(millis(not_before)));
        out.insert("createdAt".into(), json!(millis(m.created_at)));
        if let Some(queue) = &m.queue {
            out.insert("queueName".into(), json!(queue));
        }
        if let Some(schedule) = &m.schedule_id {
            out.insert("scheduleId".into(), json!(schedule));
        }
        let published = |name: &str| {
            m.publish_headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        if let Some(key) = published("upstash-flow-control-key") {
            out.insert("flowControlKey".into(), json!(key));
        }
        if let Some(label) = published("upstash-label") {
            out.insert("label".into(), json!(label));
        }
        if let Some(expression) = spec.and_then(|s| s.retry_delay.clone()) {
            out.insert("retryDelayExpression".into(), json!(expression));
        }
    }
    out.insert("responseStatus".into(), json!(entry.status));
    out.insert("responseHeader".into(), header_json(&entry.response_header));
    insert_body(
        &mut out,
        "responseBody",
        "responseBodyBase64",
        &entry.response_body,
    );
    Value::Object(out)
}

/// Headers as QStash's API shows them: `{"Name": ["value", …]}` with Go's canonical names.
fn header_json(pairs: &[(String, String)]) -> Value {
    let mut map = serde_json::Map::new();
    for (name, value) in pairs {
        let entry = map
            .entry(canonical_header_name(name))
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(values) = entry {
            values.push(json!(value));
        }
    }
    Value::Object(map)
}

/// `content-type` → `Content-Type`.
fn canonical_header_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + &chars.as_str().to_ascii_lowercase()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// A body under `text` when it is UTF-8, else base64 under `base64`, as QStash.
fn insert_body(out: &mut serde_json::Map<String, Value>, text: &str, base64: &str, body: &[u8]) {
    match std::str::from_utf8(body) {
        Ok(body) => out.insert(text.into(), json!(body)),
        Err(_) => out.insert(base64.into(), json!(STANDARD.encode(body))),
    };
}

/// Every value of the query parameter `name`, repeated (`a=1&a=2`) or comma-separated
/// (`a=1,2`), percent-decoded, empty ones dropped, first occurrence kept.
fn query_list(query: &str, name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for pair in query.split('&') {
        let Some(value) = pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) else {
            continue;
        };
        for item in percent_decode(value).split(',') {
            let item = item.trim();
            if !item.is_empty() && !out.iter().any(|o| o == item) {
                out.push(item.to_owned());
            }
        }
    }
    out
}

/// The first value of the query parameter `name`, percent-decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        pair.strip_prefix(name)
            .and_then(|v| v.strip_prefix('='))
            .map(percent_decode)
    })
}

fn list_dlq(state: &FakeState, query: &str) -> Response {
    let count = query_param(query, "count")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 100);
    let start = query_param(query, "cursor")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0);
    let ids = query_list(query, "dlqIds");
    let message_id = query_param(query, "messageId");
    let url = query_param(query, "url");
    let queue = query_param(query, "queueName");
    let matching: Vec<&DlqEntry> = state
        .dlq
        .iter()
        .filter(|e| ids.is_empty() || ids.contains(&e.dlq_id))
        .filter(|e| message_id.as_ref().is_none_or(|id| *id == e.message_id))
        .filter(|e| {
            if url.is_none() && queue.is_none() {
                return true;
            }
            let m = state.messages.iter().find(|m| m.message_id == e.message_id);
            url.as_ref().is_none_or(|u| m.is_some_and(|m| m.url == *u))
                && queue
                    .as_ref()
                    .is_none_or(|q| m.is_some_and(|m| m.queue.as_ref() == Some(q)))
        })
        .collect();
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(count)
        .map(|e| dlq_entry(state, e))
        .collect();
    let mut body = json!({ "messages": page });
    if start.saturating_add(count) < matching.len() {
        body["cursor"] = json!((start + count).to_string());
    }
    json_response(StatusCode::OK, &body)
}

fn dlq_item(state: &mut FakeState, method: &Method, dlq_id: &str) -> Response {
    let Some(index) = state.dlq.iter().position(|e| e.dlq_id == dlq_id) else {
        return error(StatusCode::NOT_FOUND, "dlq message not found");
    };
    match *method {
        Method::GET => json_response(StatusCode::OK, &dlq_entry(state, &state.dlq[index])),
        Method::DELETE => {
            let entry = state.dlq.remove(index);
            set_state(state, &entry.message_id, MessageState::Deleted);
            (StatusCode::OK, "").into_response()
        }
        _ => not_allowed(),
    }
}

/// `DELETE /v2/dlq`: the ids from the query (as QStash's SDK sends them) or, as older clients
/// do, from a JSON body `{"dlqIds": […]}`; unknown ids are not counted.
fn delete_dlq_many(state: &mut FakeState, query: &str, body: &[u8]) -> Response {
    let mut ids = query_list(query, "dlqIds");
    if ids.is_empty() && !body.iter().all(u8::is_ascii_whitespace) {
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return error(StatusCode::BAD_REQUEST, "the body must be JSON");
        };
        ids = request
            .get("dlqIds")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
    }
    if ids.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "dlqIds is required (the fake does not delete by filter)",
        );
    }
    let mut deleted = 0;
    for id in ids {
        if let Some(index) = state.dlq.iter().position(|e| e.dlq_id == id) {
            let entry = state.dlq.remove(index);
            set_state(state, &entry.message_id, MessageState::Deleted);
            deleted += 1;
        }
    }
    json_response(StatusCode::OK, &json!({ "deleted": deleted }))
}

/// `POST /v2/dlq/retry?dlqIds=…`: every id must be in the DLQ, else `404` and nothing is
/// retried; `201` `{"responses": [publish answer, …]}` in the order given.
fn retry_dlq_many(state: &mut FakeState, query: &str, headers: &HeaderMap) -> Response {
    let ids = query_list(query, "dlqIds");
    if ids.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "dlqIds is required (the fake does not retry by filter)",
        );
    }
    if let Some(missing) = ids
        .iter()
        .find(|id| !state.dlq.iter().any(|e| e.dlq_id == **id))
    {
        return error(
            StatusCode::NOT_FOUND,
            &format!("dlq message {missing} not found"),
        );
    }
    let mut responses = Vec::with_capacity(ids.len());
    for id in &ids {
        match retry_dlq(state, id, headers) {
            Ok(published) => responses.push(published.json()),
            Err((status, message)) => return error(status, &message),
        }
    }
    json_response(StatusCode::CREATED, &json!({ "responses": responses }))
}

/// Publishes DLQ entry `dlq_id` again with its body and publish headers, the request's
/// `Upstash-*` headers taking precedence, then removes it from the DLQ. A refused publish
/// leaves the entry where it was.
fn retry_dlq(state: &mut FakeState, dlq_id: &str, headers: &HeaderMap) -> Accepted {
    let not_found = || (StatusCode::NOT_FOUND, "dlq message not found".to_owned());
    let index = state
        .dlq
        .iter()
        .position(|e| e.dlq_id == dlq_id)
        .ok_or_else(not_found)?;
    let message_id = state.dlq[index].message_id.clone();
    let old = state
        .messages
        .iter()
        .find(|m| m.message_id == message_id)
        .cloned()
        .ok_or_else(not_found)?;
    // The original publish headers, overridden by the retry request's. Deduplication would
    // only find the original message again, and the delay was spent.
    let mut merged = to_header_map(&old.publish_headers);
    for spent in [
        "upstash-deduplication-id",
        "upstash-content-based-deduplication",
        "upstash-delay",
        "upstash-not-before",
    ] {
        merged.remove(spent);
    }
    for (name, value) in headers {
        if name.as_str().starts_with("upstash-") {
            merged.insert(name.clone(), value.clone());
        }
    }
    let published = accept(
        state,
        &old.url,
        old.queue.clone(),
        &merged,
        old.body,
        old.schedule_id,
    )?;
    if let Some(index) = state.dlq.iter().position(|e| e.dlq_id == dlq_id) {
        state.dlq.remove(index);
    }
    set_state(state, &message_id, MessageState::Deleted);
    Ok(published)
}

fn set_state(state: &mut FakeState, message_id: &str, to: MessageState) {
    if let Some(m) = state
        .messages
        .iter_mut()
        .find(|m| m.message_id == message_id)
    {
        m.state = to;
    }
}

fn to_header_map(pairs: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            name.parse::<axum::http::HeaderName>(),
            HeaderValue::from_str(value),
        ) {
            map.append(name, value);
        }
    }
    map
}

fn authorised(token: &str, headers: &HeaderMap, query: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credentials)| credentials.trim().to_owned());
    let from_query = query
        .split('&')
        .find_map(|p| p.strip_prefix("qstash_token="))
        .map(percent_decode);
    bearer.as_deref() == Some(token) || from_query.as_deref() == Some(token)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len() + 1
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn not_allowed() -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

// ---------------------------------------------------------------------------------------------
// Delivery.

/// The flow-control key of a message and its parallelism (`Upstash-Flow-Control-Key`, and
/// `parallelism=N` in `Upstash-Flow-Control-Value`), when it was published with both.
fn flow_control(message: &FakeMessage) -> Option<(&str, usize)> {
    let header = |name: &str| {
        message
            .publish_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let key = header("upstash-flow-control-key")?;
    let parallelism = header("upstash-flow-control-value")?
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("parallelism="))
        .find_map(|n| n.trim().parse().ok())?;
    Some((key, parallelism))
}

/// Whether a pending message may go now: within its flow-control key's parallelism (only
/// that many of the key's due or under-way messages, oldest first, may be delivered at
/// once: QStash holds the rest back), and as far as its queue is concerned, none of a paused
/// queue, and in a queue of parallelism `p`, only the `p` oldest unsettled messages may be
/// under way.
fn eligible(state: &FakeState, message: &FakeMessage, now: SystemTime) -> bool {
    if let Some((key, parallelism)) = flow_control(message) {
        let ahead = state
            .messages
            .iter()
            .take_while(|m| m.message_id != message.message_id)
            .filter(|m| {
                flow_control(m).is_some_and(|(k, _)| k == key)
                    && (m.state == MessageState::InFlight
                        || (m.state == MessageState::Pending && m.not_before <= now))
            })
            .count();
        if ahead >= parallelism {
            return false;
        }
    }
    let Some(queue) = &message.queue else {
        return true;
    };
    let found = state.queues.iter().find(|q| &q.name == queue);
    if found.is_some_and(|q| q.paused) {
        return false;
    }
    let parallelism = found.map_or(1, |q| q.parallelism as usize);
    let ahead = state
        .messages
        .iter()
        .take_while(|m| m.message_id != message.message_id)
        .filter(|m| {
            m.queue.as_ref() == Some(queue)
                && matches!(m.state, MessageState::Pending | MessageState::InFlight)
        })
        .count();
    ahead < parallelism
}

/// The dispatcher: delivers due messages until the fake is dropped.
async fn dispatch(shared: Weak<Shared>) {
    let client = reqwest::Client::new();
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if strong.stopped.load(Ordering::SeqCst) {
            return;
        }
        let due: Vec<(FakeMessage, DeliverySpec)> = {
            let mut state = strong.state();
            let now = state.now();
            if state.paused {
                Vec::new()
            } else {
                let ids: Vec<String> = state
                    .messages
                    .iter()
                    .filter(|m| {
                        m.state == MessageState::Pending
                            && m.not_before <= now
                            && eligible(&state, m, now)
                    })
                    .map(|m| m.message_id.clone())
                    .collect();
                ids.iter()
                    .filter_map(|id| {
                        let spec = state.delivery.get(id)?.clone();
                        let m = state.messages.iter_mut().find(|m| &m.message_id == id)?;
                        m.state = MessageState::InFlight;
                        Some((m.clone(), spec))
                    })
                    .collect()
            }
        };
        for (message, spec) in due {
            tokio::spawn(deliver(Arc::clone(&strong), client.clone(), message, spec));
        }
        // Held only while waiting a tick: once the fake and its server are gone, the next
        // upgrade fails and the dispatcher ends.
        let _ = tokio::time::timeout(TICK, strong.wake.notified()).await;
    }
}

async fn deliver(
    shared: Arc<Shared>,
    client: reqwest::Client,
    message: FakeMessage,
    spec: DeliverySpec,
) {
    let (signature, now) = {
        let state = shared.state();
        let key = if state.sign_with_next {
            &shared.next_key
        } else {
            &shared.current_key
        };
        let now = state.now();
        (
            sign(
                key,
                &message.url,
                &message.body,
                now,
                state.pad_body_hash,
                &message.message_id,
            ),
            now,
        )
    };
    let mut request = client
        .request(spec.method.clone(), &message.url)
        .timeout(spec.timeout)
        .header("user-agent", "Upstash-QStash")
        .header("upstash-signature", &signature)
        .header("upstash-retried", message.retried.to_string())
        .header("upstash-message-id", &message.message_id)
        .body(message.body.clone());
    if let Some(ct) = &spec.content_type {
        request = request.header("content-type", ct);
    }
    if let Some(schedule) = &message.schedule_id {
        request = request.header("upstash-schedule-id", schedule);
    }
    if let Some(queue) = &message.queue {
        request = request.header("upstash-queue-name", queue);
    }
    for (name, value) in &spec.forward {
        request = request.header(name.as_str(), value.as_str());
    }
    // The status, headers and body of the answer; `None` when there was none in time. The
    // DLQ shows the last answer, so the body is read even when it fails.
    let answer = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let headers: Vec<(String, String)> = response
                .headers()
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect();
            let body = response
                .bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            Some((status, headers, body))
        }
        Err(_) => None,
    };
    let answered = |name: &str| {
        answer.as_ref().and_then(|(_, headers, _)| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        })
    };
    let status = answer.as_ref().map(|(status, _, _)| *status);
    let retry_after = answered("retry-after");
    let non_retryable = answered("upstash-nonretryable-error")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let mut state = shared.state();
    let succeeded = status.is_some_and(|s| (200..300).contains(&s));
    let to_dlq = !succeeded
        && ((status == Some(489) && non_retryable) || message.retried >= message.max_retries);
    let next_delay = (!succeeded && !to_dlq).then(|| {
        retry_after
            .as_deref()
            .and_then(|r| parse_retry_after(r, now))
            .map(|d| d.min(MAX_RETRY_AFTER))
            .or_else(|| {
                spec.retry_delay
                    .as_deref()
                    .and_then(|e| eval_retry_delay(e, message.retried).ok())
                    .map(|ms| Duration::from_millis(ms.max(0.0) as u64))
            })
            .unwrap_or_else(|| default_backoff(message.retried + 1))
    });
    state.attempts.push(FakeAttempt {
        message_id: message.message_id.clone(),
        retried: message.retried,
        status,
        retry_after,
        next_delay,
        signature,
    });
    let scale = state.retry_scale;
    let now = state.now();
    let seq = state.next_seq();
    let Some(stored) = state
        .messages
        .iter_mut()
        .find(|m| m.message_id == message.message_id)
    else {
        return;
    };
    if succeeded {
        stored.state = MessageState::Delivered;
    } else if to_dlq {
        stored.state = MessageState::Failed;
        let (response_header, response_body) = answer
            .map(|(_, headers, body)| (headers, body))
            .unwrap_or_default();
        state.dlq.push(DlqEntry {
            dlq_id: format!("{}-{seq}", millis(now)),
            message_id: message.message_id,
            status: status.unwrap_or(0),
            response_header,
            response_body,
        });
    } else {
        stored.retried += 1;
        stored.state = MessageState::Pending;
        stored.not_before = now + next_delay.unwrap_or_default().mul_f64(scale);
    }
    drop(state);
    shared.wake.notify_one();
}

/// QStash's default backoff after `n` retries so far: `min(86400, e^(2.5·n))` seconds.
pub fn default_backoff(n: u32) -> Duration {
    Duration::from_secs_f64((2.5 * f64::from(n)).exp().min(86_400.0))
}

/// `Retry-After` as QStash reads it: seconds, an RFC 1123 date, or a duration like `6m5s`.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Some(d) = parse_duration(value) {
        return Some(d);
    }
    httpdate_to_system(value).map(|at| at.duration_since(now).unwrap_or_default())
}

/// An RFC 1123 date (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn httpdate_to_system(value: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').filter_map(|p| p.parse().ok()).collect();
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// A duration like `1d10h30m5s` (each unit at most once, in any order QStash accepts).
fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut number = String::new();
    let mut any = false;
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        total += n * match c {
            'd' => 86_400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        any = true;
    }
    (number.is_empty() && any).then(|| Duration::from_secs(total))
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// The `Upstash-Signature` QStash would send: a JWT HS256 keyed by the UTF-8 bytes of `key`.
fn sign(key: &str, url: &str, body: &[u8], now: SystemTime, pad: bool, message_id: &str) -> String {
    let iat = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let digest = Sha256::digest(body);
    let body_hash = if pad {
        URL_SAFE.encode(digest)
    } else {
        URL_SAFE_NO_PAD.encode(digest)
    };
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = json!({
        "iss": "Upstash",
        "sub": url,
        "exp": iat + SIGNATURE_LIFETIME,
        "nbf": iat,
        "iat": iat,
        "jti": format!("jwt_{message_id}_{iat:x}"),
        "body": body_hash,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{claims}");
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(signing_input.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing_input}.{signature}")
}

// ---------------------------------------------------------------------------------------------
// `Upstash-Retry-Delay` expressions.

/// Evaluates an `Upstash-Retry-Delay` expression (milliseconds) for `retried`: numbers,
/// `retried`, `+ - * /`, parentheses and `pow exp sqrt abs floor ceil round min max`.
pub fn eval_retry_delay(expr: &str, retried: u32) -> Result<f64, String> {
    let tokens = tokenize(expr)?;
    let mut parser = Parser {
        tokens,
        at: 0,
        retried: f64::from(retried),
    };
    let value = parser.expr()?;
    if parser.at != parser.tokens.len() {
        return Err(format!("unexpected `{:?}`", parser.tokens[parser.at]));
    }
    if value.is_finite() {
        Ok(value)
    } else {
        Err("the expression is not a finite number".to_owned())
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Num(f64),
    Ident(String),
    Op(char),
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            tokens.push(Token::Num(
                text.parse().map_err(|_| format!("bad number `{text}`"))?,
            ));
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if "+-*/(),".contains(c) {
            tokens.push(Token::Op(c));
            i += 1;
        } else {
            return Err(format!("unexpected character `{c}`"));
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    retried: f64,
}

impl Parser {
    fn peek_op(&self) -> Option<char> {
        match self.tokens.get(self.at) {
            Some(Token::Op(c)) => Some(*c),
            _ => None,
        }
    }

    fn expect(&mut self, op: char) -> Result<(), String> {
        if self.peek_op() == Some(op) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected `{op}`"))
        }
    }

    fn expr(&mut self) -> Result<f64, String> {
        let mut value = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek_op() {
            self.at += 1;
            let rhs = self.term()?;
            value = if op == '+' { value + rhs } else { value - rhs };
        }
        Ok(value)
    }

    fn term(&mut self) -> Result<f64, String> {
        let mut value = self.unary()?;
        while let Some(op @ ('*' | '/')) = self.peek_op() {
            self.at += 1;
            let rhs = self.unary()?;
            value = if op == '*' { value * rhs } else { value / rhs };
        }
        Ok(value)
    }

    fn unary(&mut self) -> Result<f64, String> {
        if self.peek_op() == Some('-') {
            self.at += 1;
            return Ok(-self.unary()?);
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<f64, String> {
        let token = self.tokens.get(self.at).cloned().ok_or("unexpected end")?;
        self.at += 1;
        match token {
            Token::Num(n) => Ok(n),
            Token::Op('(') => {
                let value = self.expr()?;
                self.expect(')')?;
                Ok(value)
            }
            Token::Ident(name) if name == "retried" => Ok(self.retried),
            Token::Ident(name) => {
                self.expect('(')?;
                let mut args = vec![self.expr()?];
                while self.peek_op() == Some(',') {
                    self.at += 1;
                    args.push(self.expr()?);
                }
                self.expect(')')?;
                let one = |f: fn(f64) -> f64| match args.as_slice() {
                    [x] => Ok(f(*x)),
                    _ => Err(format!("{name} takes one argument")),
                };
                let two = |f: fn(f64, f64) -> f64| match args.as_slice() {
                    [x, y] => Ok(f(*x, *y)),
                    _ => Err(format!("{name} takes two arguments")),
                };
                match name.as_str() {
                    "pow" => two(f64::powf),
                    "min" => two(f64::min),
                    "max" => two(f64::max),
                    "exp" => one(f64::exp),
                    "sqrt" => one(f64::sqrt),
                    "abs" => one(f64::abs),
                    "floor" => one(f64::floor),
                    "ceil" => one(f64::ceil),
                    "round" => one(f64::round),
                    _ => Err(format!("unknown function `{name}`")),
                }
            }
            Token::Op(c) => Err(format!("unexpected `{c}`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_expressions_evaluate_like_qstash() {
        let standard = "min(3600000, 30000 * pow(2, retried))";
        assert_eq!(eval_retry_delay(standard, 0), Ok(30_000.0));
        assert_eq!(eval_retry_delay(standard, 3), Ok(240_000.0));
        assert_eq!(eval_retry_delay(standard, 10), Ok(3_600_000.0));
        assert_eq!(eval_retry_delay("1000 * (1 + retried)", 2), Ok(3000.0));
        assert_eq!(eval_retry_delay("-2 + 5", 0), Ok(3.0));
        assert_eq!(eval_retry_delay("max(floor(2.7), ceil(1.2))", 0), Ok(2.0));
        assert!(eval_retry_delay("rand()", 0).is_err());
        assert!(eval_retry_delay("1 +", 0).is_err());
        assert!(eval_retry_delay("pow(2)", 0).is_err());
    }

    #[test]
    fn default_backoff_matches_the_documented_steps() {
        let secs: Vec<u64> = (1..=5).map(|n| default_backoff(n).as_secs()).collect();
        // 12 s, 2m28s, 30m8s, 6h7m6s, 24h.
        assert_eq!(secs, vec![12, 148, 1808, 22_026, 86_400]);
    }

    #[test]
    fn durations_and_retry_after_parse() {
        assert_eq!(
            parse_duration("1d10h30m5s"),
            Some(Duration::from_secs(86_400 + 36_000 + 1800 + 5))
        );
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("5x"), None);
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770);
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after("6m5s", now),
            Some(Duration::from_secs(365))
        );
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
    }
}

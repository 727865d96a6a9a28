//! A local fake of Resend's batch email endpoint.
//!
//! Wire facts reproduced (docs/adr/0008-resend-email.md cites the sources):
//!
//! - `POST /emails/batch` with `Authorization: Bearer <api key>`: none is `401`
//!   `missing_api_key`, another key is `403` `invalid_api_key`;
//! - a `User-Agent` is required, else `403` `validation_error`;
//! - a JSON array body of 1 to 100 emails, else `422` `validation_error`; `from`, `to` (a
//!   string or a non-empty array of at most 50) and `subject` are required in each, else `422`
//!   `missing_required_field`;
//! - `from` and every entry of `to`, `cc`, `bcc` and `reply_to` must be an email address,
//!   `a@b.example` or `Name <a@b.example>`, else `422` `validation_error` naming the email's
//!   index and the field. The check is deliberately simple (exactly one `@`, a non-empty local
//!   part, a dotted domain, no whitespace outside the display name): it refuses what is
//!   certainly wrong, not everything Resend would;
//! - `attachments` and `scheduled_at` are not supported by the batch endpoint: `422`
//!   `validation_error`;
//! - `x-batch-validation: strict` (the default, also when the header is absent) refuses the
//!   whole batch on its first invalid email; `permissive` sends the valid ones and answers the
//!   others in an `errors` array; any other value is `422` `validation_error`;
//! - `Idempotency-Key` (at most 256 characters, else `400` `invalid_idempotency_key`): the same
//!   key with the same body answers the same as the first time without sending again; the same
//!   key with another body is `409` `invalid_idempotent_request`;
//! - `200` with `{"data": [{"id": "<uuid>"}, …]}`, the ids in the order of the emails sent; in
//!   permissive mode also `"errors": [{"index": n, "message": "…"}, …]` (`index` is the email's
//!   place in the request, `data` holds the sent emails only);
//! - errors are `{"statusCode": n, "message": "…", "name": "…"}`; every answer carries
//!   `ratelimit-limit`, `ratelimit-remaining` and `ratelimit-reset` (whole seconds), counted
//!   over a sliding window ([`FakeResend::limit_rate`]), and a `429` `rate_limit_exceeded` also
//!   `retry-after`.
//!
//! Requests to any other path, `/audiences` and `/contacts` included, are answered `404`
//! `not_found` but recorded in [`FakeResend::paths`], so that tests can assert that none was
//! made. The exact texts of the error messages are the fake's own.
//!
//! A fake served to another process (the `jobs-fakes resend` development stack) also answers
//! control endpoints under `/_fake/`, a prefix Resend never uses, once
//! [`FakeResend::enable_control`] is called: see there.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::{Server, fresh_secret};

/// The most emails the fake accepts in one batch, as Resend.
const MAX_BATCH: usize = 100;
/// The most recipients of one email, as Resend.
const MAX_RECIPIENTS: usize = 50;
/// The longest idempotency key, as Resend.
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 256;
/// Fields Resend's batch endpoint refuses.
const UNSUPPORTED_FIELDS: [&str; 2] = ["attachments", "scheduled_at"];
/// Optional fields holding addresses: a string or an array of strings.
const OPTIONAL_ADDRESS_FIELDS: [&str; 3] = ["cc", "bcc", "reply_to"];
/// Where the control endpoints live: a prefix no Resend path starts with.
const CONTROL_PREFIX: &str = "/_fake/";

/// Resend's current per-team limit, in requests per second: what the fake advertises by
/// default, and what the `jobs-fakes resend` development stack enforces by default.
pub const RATE_LIMIT_PER_SECOND: usize = 5;

/// A Resend batch email API on `127.0.0.1`, for tests.
///
/// Accepts only the API key it was started with, records every email it accepts
/// ([`FakeResend::sent`]), every accepted batch with its headers ([`FakeResend::batches`]) and
/// every request path ([`FakeResend::paths`]) and when each batch request arrived
/// ([`FakeResend::batch_request_times`]), and has fault hooks: [`FakeResend::fail_next`],
/// [`FakeResend::rate_limit_next`], [`FakeResend::lose_answer_next`],
/// [`FakeResend::drop_answer_next`] and an enforced rate ([`FakeResend::limit_rate`]). The
/// server stops when the value is dropped (or, awaiting the end, with
/// [`FakeResend::shutdown`]).
///
/// ```no_run
/// use jobs_testkit::fakes::resend::FakeResend;
///
/// # async fn example() -> std::io::Result<()> {
/// let fake = FakeResend::start().await?;
/// // configure the provider with fake.base_url() and fake.api_key(), send a batch, then:
/// assert!(fake.paths().iter().all(|path| !path.contains("audiences")));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FakeResend {
    server: Server,
    shared: Arc<Shared>,
    // Declared after `server`: dropping the fake first stops the server, then answers the held
    // requests so that its connections can close.
    _release: ReleaseHeld,
}

/// One batch the fake accepted (not counting idempotent replays).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeBatch {
    /// The `Idempotency-Key` header, if any.
    pub idempotency_key: Option<String>,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// The `x-batch-validation` header, if any.
    pub batch_validation: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The emails sent, as in the body: all of them, or in permissive mode the valid ones.
    pub emails: Vec<Value>,
    /// The ids answered, one per email of [`FakeBatch::emails`], in order.
    pub ids: Vec<String>,
    /// In permissive mode, the emails refused: their index in the request and why.
    pub refused: Vec<(usize, String)>,
    /// When the request arrived.
    pub received_at: Instant,
}

#[derive(Debug)]
struct Shared {
    api_key: String,
    state: Mutex<FakeState>,
    /// Becomes `true` when the fake stops: requests held by
    /// [`FakeResend::drop_answer_next`] are then answered, so that the server can close.
    release: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct FakeState {
    batches: Vec<FakeBatch>,
    paths: Vec<String>,
    /// Per idempotency key: the request body and the answer body it got.
    idempotent: HashMap<String, (Value, Value)>,
    last_id: u64,
    fault: Option<Fault>,
    rate_limit: Option<RateLimit>,
    lose_answers: usize,
    drop_answers: usize,
    window: Window,
    batch_requests: Vec<Instant>,
    rate_limited: usize,
    control: bool,
}

/// The batch requests admitted in the last `per`, for the `ratelimit-*` headers and, when
/// `enforced`, for refusing those beyond `limit`.
#[derive(Debug)]
struct Window {
    limit: usize,
    per: Duration,
    enforced: bool,
    admitted: VecDeque<Instant>,
}

impl Default for Window {
    /// Resend's limit, counted in the headers but not enforced: a test opts in with
    /// [`FakeResend::limit_rate`].
    fn default() -> Self {
        Window {
            limit: RATE_LIMIT_PER_SECOND,
            per: Duration::from_secs(1),
            enforced: false,
            admitted: VecDeque::new(),
        }
    }
}

/// What the `ratelimit-*` headers of one answer say.
#[derive(Debug, Clone, Copy)]
struct RateHeaders {
    limit: usize,
    remaining: usize,
    reset_secs: u64,
}

impl Window {
    fn forget_before(&mut self, now: Instant) {
        while self
            .admitted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= self.per)
        {
            self.admitted.pop_front();
        }
    }

    /// Counts the request at `now`, or, when enforced and full, says how many seconds to wait.
    fn admit(&mut self, now: Instant) -> Result<(), u64> {
        self.forget_before(now);
        if self.enforced && self.admitted.len() >= self.limit {
            return Err(self.seconds_until_a_slot(now));
        }
        self.admitted.push_back(now);
        Ok(())
    }

    /// Whole seconds (at least 1) until the oldest admitted request leaves the window.
    fn seconds_until_a_slot(&self, now: Instant) -> u64 {
        let wait = match self.admitted.front() {
            Some(oldest) => self.per.saturating_sub(now.duration_since(*oldest)),
            None => self.per,
        };
        // Whole seconds, rounded up so that a client waiting that long finds a free slot.
        wait.as_secs_f64().ceil().max(1.0) as u64
    }

    fn headers(&mut self, now: Instant) -> RateHeaders {
        self.forget_before(now);
        RateHeaders {
            limit: self.limit,
            remaining: self.limit.saturating_sub(self.admitted.len()),
            reset_secs: self.seconds_until_a_slot(now),
        }
    }

    fn describe(&self) -> String {
        if self.per == Duration::from_secs(1) {
            format!("{} requests per second", self.limit)
        } else {
            format!("{} requests per {} ms", self.limit, self.per.as_millis())
        }
    }
}

#[derive(Debug)]
struct Fault {
    status: StatusCode,
    remaining: usize,
}

#[derive(Debug)]
struct RateLimit {
    retry_after_secs: u64,
    remaining: usize,
}

/// Answers the held requests when the fake is dropped.
#[derive(Debug)]
struct ReleaseHeld(Arc<Shared>);

impl Drop for ReleaseHeld {
    fn drop(&mut self) {
        self.0.release.send_replace(true);
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test thread must not hide what was recorded from the others.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeResend {
    /// Starts a fake that accepts a fresh API key, read back with [`FakeResend::api_key`].
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with_key(fresh_secret("re_fake_")).await
    }

    /// Starts a fake on an ephemeral port that accepts only `Bearer <api_key>`.
    pub async fn start_with_key(api_key: impl Into<String>) -> std::io::Result<Self> {
        Self::start_on(0, api_key).await
    }

    /// Starts a fake on `127.0.0.1:port` (`0` for any free port) that accepts only
    /// `Bearer <api_key>`: for a local development stack, where the port is configured.
    pub async fn start_on(port: u16, api_key: impl Into<String>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            api_key: api_key.into(),
            state: Mutex::default(),
            release: watch::Sender::new(false),
        });
        // Everything goes through one handler so that every path is recorded.
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        Ok(FakeResend {
            server: Server::start(port, app).await?,
            _release: ReleaseHeld(Arc::clone(&shared)),
            shared,
        })
    }

    /// `http://127.0.0.1:<port>`: the base URL to configure the provider with.
    pub fn base_url(&self) -> &str {
        self.server.base_url()
    }

    /// The only API key this fake accepts.
    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// Every email accepted so far, in order, as JSON; an idempotent replay adds nothing.
    pub fn sent(&self) -> Vec<Value> {
        self.shared
            .state()
            .batches
            .iter()
            .flat_map(|batch| batch.emails.iter().cloned())
            .collect()
    }

    /// Every batch accepted so far, oldest first, with its headers and ids.
    pub fn batches(&self) -> Vec<FakeBatch> {
        self.shared.state().batches.clone()
    }

    /// The path of every request received so far, in order, whatever its answer; control
    /// requests (under `/_fake/`) are not recorded.
    pub fn paths(&self) -> Vec<String> {
        self.shared.state().paths.clone()
    }

    /// Makes the next `n` batch requests answer `status` with a Resend error body, before any
    /// check and recording no email; replaces a previous fault. `n = 0` clears it.
    ///
    /// # Panics
    ///
    /// If `status` is not an HTTP status code (100 to 999): a mistake in the test itself.
    pub fn fail_next(&self, status: u16, n: usize) {
        let Ok(status) = StatusCode::from_u16(status) else {
            panic!("fail_next: {status} is not an HTTP status code");
        };
        self.shared.state().fault = (n > 0).then_some(Fault {
            status,
            remaining: n,
        });
    }

    /// Makes the next `n` batch requests answer `429` `rate_limit_exceeded` with
    /// `retry-after: <retry_after_secs>`, before any other check (and before
    /// [`FakeResend::fail_next`]); `n = 0` clears it.
    pub fn rate_limit_next(&self, n: usize, retry_after_secs: u64) {
        self.shared.state().rate_limit = (n > 0).then_some(RateLimit {
            retry_after_secs,
            remaining: n,
        });
    }

    /// Makes the next `n` batches that would be accepted be accepted and recorded, but answered
    /// `500` `internal_server_error`, as when the answer is lost after the provider sent the
    /// emails; `n = 0` clears it. A retry with the same idempotency key is then answered with
    /// the same ids, sending nothing again.
    pub fn lose_answer_next(&self, n: usize) {
        self.shared.state().lose_answers = n;
    }

    /// Makes the next `n` batches that would be accepted be accepted and recorded, but never
    /// answered, as when the provider sent the emails and the connection then hung: the request
    /// waits until the client gives up (its timeout closes the connection) or the fake stops.
    /// `n = 0` clears it; checked before [`FakeResend::lose_answer_next`].
    pub fn drop_answer_next(&self, n: usize) {
        self.shared.state().drop_answers = n;
    }

    /// Enforces Resend's per-team limit: a batch request beyond `limit` (at least 1) in any
    /// window of `per` is answered `429` `rate_limit_exceeded` with `retry-after` (whole
    /// seconds, at least 1) until the oldest request of the window leaves it. Requests answered
    /// 429 do not count. The `ratelimit-*` headers then advertise `limit`.
    ///
    /// Without it the fake counts the requests of the last second against
    /// [`RATE_LIMIT_PER_SECOND`] in its headers but refuses none.
    pub fn limit_rate(&self, limit: usize, per: Duration) {
        self.shared.state().window = Window {
            limit: limit.max(1),
            per,
            enforced: true,
            admitted: VecDeque::new(),
        };
    }

    /// Answers the control endpoints, for a fake served to another process whose tests cannot
    /// call the hooks. They need no API key, are not recorded in [`FakeResend::paths`] and do
    /// not count against the rate; their bodies are JSON, `count` defaults to 1 and 0 clears:
    ///
    /// - `POST /_fake/fail-next` `{"status": 400..=599, "count": n}`: the next `n` batch
    ///   requests answer `status` with a Resend error body ([`FakeResend::fail_next`]); `429`
    ///   is [`FakeResend::rate_limit_next`] with `retry-after: <retry_after>` (an optional
    ///   field, default 1);
    /// - `POST /_fake/drop-next` `{"count": n}`: [`FakeResend::drop_answer_next`];
    /// - `POST /_fake/lose-answer-next` `{"count": n}`: [`FakeResend::lose_answer_next`];
    /// - `GET /_fake/sent`: `{"data": [email, …]}`, [`FakeResend::sent`].
    ///
    /// A body that is not JSON is `400`, a field of the wrong type or range `422`, both
    /// `validation_error`; another path under `/_fake/` is `404`.
    pub fn enable_control(&self) {
        self.shared.state().control = true;
    }

    /// When each `POST /emails/batch` arrived, in order, whatever its answer.
    pub fn batch_request_times(&self) -> Vec<Instant> {
        self.shared.state().batch_requests.clone()
    }

    /// How many batch requests were answered `429` so far.
    pub fn rate_limited(&self) -> usize {
        self.shared.state().rate_limited
    }

    /// Stops the server and waits until it has closed its connections, answering the requests
    /// held by [`FakeResend::drop_answer_next`] first.
    pub async fn shutdown(self) {
        self.shared.release.send_replace(true);
        self.server.shutdown().await;
    }
}

/// What a batch request gets: an answer now, or none until the fake stops.
enum Reply {
    Answer(Response),
    Hold,
}

/// Every request: records the path, then routes.
async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let control = shared.state().control;
    if control && path.starts_with(CONTROL_PREFIX) {
        return control_request(&shared, &method, &path, &body);
    }
    shared.state().paths.push(path.clone());
    let mut response = match (path.trim_end_matches('/'), method) {
        ("/emails/batch", Method::POST) => match send_batch(&shared, &headers, &body) {
            Reply::Answer(response) => return response,
            Reply::Hold => return hold(&shared).await,
        },
        ("/emails/batch", _) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "Method is not allowed for the requested path.",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "The requested endpoint does not exist.",
        ),
    };
    let rate = shared.state().window.headers(Instant::now());
    stamp(&mut response, rate);
    response
}

/// Waits, answering nothing, until the fake stops; the client giving up first closes the
/// connection, which drops this future.
async fn hold(shared: &Shared) -> Response {
    let mut released = shared.release.subscribe();
    // An error means the sender is gone, so the fake has stopped too.
    let _ = released.wait_for(|released| *released).await;
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "internal_server_error",
        "The fake stopped before answering (held by FakeResend).",
    )
}

/// `POST /emails/batch`: the rate first, then everything else, then the `ratelimit-*` headers.
fn send_batch(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Reply {
    let mut state = shared.state();
    let now = Instant::now();
    state.batch_requests.push(now);
    if let Some(retry_after_secs) =
        take_rate_limit(&mut state).or_else(|| state.window.admit(now).err())
    {
        state.rate_limited += 1;
        let mut response = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            &format!(
                "Too many requests. You can only make {}. See rate limit response headers for more information.",
                state.window.describe()
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        let limit = state.window.limit;
        stamp(
            &mut response,
            RateHeaders {
                limit,
                remaining: 0,
                reset_secs: retry_after_secs,
            },
        );
        return Reply::Answer(response);
    }
    let reply = admitted_batch(shared, &mut state, headers, body, now);
    let rate = state.window.headers(now);
    match reply {
        Reply::Answer(mut response) => {
            stamp(&mut response, rate);
            Reply::Answer(response)
        }
        Reply::Hold => Reply::Hold,
    }
}

/// A batch request within the rate: injected faults, then Resend's checks in order.
fn admitted_batch(
    shared: &Shared,
    state: &mut FakeState,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Reply {
    let answer = Reply::Answer;
    if let Some(status) = take_fault(state) {
        let reason = status.canonical_reason().unwrap_or("Injected failure");
        return answer(error(
            status,
            &injected_name(status),
            &format!("{reason} (injected by FakeResend)"),
        ));
    }
    match bearer(headers) {
        None => {
            return answer(error(
                StatusCode::UNAUTHORIZED,
                "missing_api_key",
                "Missing API key in the authorization header. Include the following header in the request: Authorization: Bearer YOUR_API_KEY",
            ));
        }
        Some(key) if key != shared.api_key => {
            return answer(error(
                StatusCode::FORBIDDEN,
                "invalid_api_key",
                "API key is invalid",
            ));
        }
        Some(_) => {}
    }
    let Some(user_agent) = text_header(headers, header::USER_AGENT).filter(|ua| !ua.is_empty())
    else {
        return answer(error(
            StatusCode::FORBIDDEN,
            "validation_error",
            "The request must include a User-Agent header (error code: 1010).",
        ));
    };
    let idempotency_key = text_header(headers, HeaderName::from_static("idempotency-key"));
    if let Some(key) = &idempotency_key
        && (key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS)
    {
        return answer(error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "The key must be between 1-256 chars.",
        ));
    }
    let batch_validation = text_header(headers, HeaderName::from_static("x-batch-validation"));
    let permissive = match batch_validation.as_deref() {
        None => false,
        Some(mode) if mode.eq_ignore_ascii_case("strict") => false,
        Some(mode) if mode.eq_ignore_ascii_case("permissive") => true,
        Some(_) => {
            return answer(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                "The `x-batch-validation` header must be `strict` or `permissive`.",
            ));
        }
    };
    let request = match serde_json::from_slice::<Value>(body) {
        Ok(request) => request,
        Err(_) => {
            return answer(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                "The body must be a JSON array of emails.",
            ));
        }
    };
    let emails = match &request {
        Value::Array(emails) if (1..=MAX_BATCH).contains(&emails.len()) => emails,
        Value::Array(emails) => {
            return answer(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                &format!(
                    "A batch must contain between 1 and {MAX_BATCH} emails, got {}.",
                    emails.len()
                ),
            ));
        }
        _ => {
            return answer(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                "The body must be a JSON array of emails.",
            ));
        }
    };
    let mut valid = Vec::with_capacity(emails.len());
    let mut refused = Vec::new();
    for (index, email) in emails.iter().enumerate() {
        match email_problem(email) {
            None => valid.push(email.clone()),
            Some(problem) if permissive => refused.push((index, problem.message)),
            Some(problem) => {
                // Strict: the first invalid email refuses the batch, naming where it is.
                return answer(error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    problem.name,
                    &format!("emails[{index}]: {}", problem.message),
                ));
            }
        }
    }
    if let Some(key) = &idempotency_key
        && let Some((previous, answered)) = state.idempotent.get(key)
    {
        if *previous == request {
            return answer(json_answer(StatusCode::OK, answered));
        }
        return answer(error(
            StatusCode::CONFLICT,
            "invalid_idempotent_request",
            "Same idempotency key used with a different request payload. Change your idempotency key or payload.",
        ));
    }

    let ids: Vec<String> = valid
        .iter()
        .map(|_| {
            state.last_id += 1;
            fake_uuid(state.last_id)
        })
        .collect();
    let data: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
    let answered = if permissive {
        let errors: Vec<Value> = refused
            .iter()
            .map(|(index, message)| json!({ "index": index, "message": message }))
            .collect();
        json!({ "data": data, "errors": errors })
    } else {
        json!({ "data": data })
    };
    if let Some(key) = &idempotency_key {
        state
            .idempotent
            .insert(key.clone(), (request, answered.clone()));
    }
    state.batches.push(FakeBatch {
        idempotency_key,
        user_agent,
        batch_validation,
        content_type: text_header(headers, header::CONTENT_TYPE),
        emails: valid,
        ids,
        refused,
        received_at: now,
    });
    if state.drop_answers > 0 {
        state.drop_answers -= 1;
        return Reply::Hold;
    }
    if state.lose_answers > 0 {
        state.lose_answers -= 1;
        return answer(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            "The answer was lost after sending (injected by FakeResend).",
        ));
    }
    answer(json_answer(StatusCode::OK, &answered))
}

/// Why Resend would refuse one email: the error name and the message.
#[derive(Debug, PartialEq)]
struct Problem {
    name: &'static str,
    message: String,
}

impl Problem {
    fn missing(field: &str) -> Problem {
        Problem {
            name: "missing_required_field",
            message: format!("The `{field}` field is missing."),
        }
    }

    fn invalid(message: String) -> Problem {
        Problem {
            name: "validation_error",
            message,
        }
    }

    fn bad_address(field: &str) -> Problem {
        Problem::invalid(format!(
            "Invalid `{field}` field. The email address needs to follow the `email@example.com` or `Name <email@example.com>` format."
        ))
    }
}

/// Why an email would be refused, if it would: its shape, the unsupported fields, the
/// required fields, then every address.
fn email_problem(email: &Value) -> Option<Problem> {
    let Value::Object(fields) = email else {
        return Some(Problem::invalid(
            "An email must be a JSON object.".to_owned(),
        ));
    };
    if let Some(field) = UNSUPPORTED_FIELDS
        .iter()
        .find(|field| fields.get(**field).is_some_and(|value| !value.is_null()))
    {
        return Some(Problem::invalid(format!(
            "The `{field}` field is not supported by the batch endpoint."
        )));
    }
    match fields.get("from") {
        Some(Value::String(from)) if !from.trim().is_empty() => {
            if !is_address(from) {
                return Some(Problem::bad_address("from"));
            }
        }
        _ => return Some(Problem::missing("from")),
    }
    let present = |value: &Value| match value {
        Value::Null => false,
        Value::String(text) => !text.trim().is_empty(),
        Value::Array(list) => !list.is_empty(),
        _ => true,
    };
    match fields.get("to").filter(|to| present(to)) {
        None => return Some(Problem::missing("to")),
        Some(Value::Array(to)) if to.len() > MAX_RECIPIENTS => {
            return Some(Problem::invalid(format!(
                "The `to` field must have at most {MAX_RECIPIENTS} recipients."
            )));
        }
        Some(_) => {}
    }
    if let Some(problem) = addresses_problem(fields, "to") {
        return Some(problem);
    }
    if fields
        .get("subject")
        .and_then(Value::as_str)
        .is_none_or(|subject| subject.trim().is_empty())
    {
        return Some(Problem::missing("subject"));
    }
    OPTIONAL_ADDRESS_FIELDS
        .iter()
        .find_map(|field| addresses_problem(fields, field))
}

/// Whether `field`, when present, is an address or an array of addresses; an entry of an
/// array is named with its index (`to[1]`).
fn addresses_problem(fields: &Map<String, Value>, field: &str) -> Option<Problem> {
    match fields.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(address)) => (!is_address(address)).then(|| Problem::bad_address(field)),
        Some(Value::Array(list)) => list.iter().enumerate().find_map(|(index, entry)| {
            (!entry.as_str().is_some_and(is_address))
                .then(|| Problem::bad_address(&format!("{field}[{index}]")))
        }),
        Some(_) => Some(Problem::invalid(format!(
            "The `{field}` field must be a string or an array of strings."
        ))),
    }
}

/// Whether `text` is an email address as Resend expects, `a@b.example` or
/// `Name <a@b.example>`, checked simply so that the fake refuses what is certainly wrong and
/// nothing a real address could be: exactly one `@`, a non-empty local part, a domain of at
/// least two non-empty dot-separated labels, and no whitespace or angle bracket in the
/// address. The display name (everything before the last `<`) may hold anything but angle
/// brackets, spaces included; nothing may follow the closing `>`.
fn is_address(text: &str) -> bool {
    let address = match text.strip_suffix('>') {
        Some(named) => match named.rsplit_once('<') {
            Some((name, address)) if !name.contains(['<', '>']) => address,
            _ => return false,
        },
        None => text,
    };
    let Some((local, domain)) = address.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.contains('@')
        && domain.contains('.')
        && domain.split('.').all(|label| !label.is_empty())
        && !address.contains(|c: char| c.is_whitespace() || c == '<' || c == '>')
}

/// A request under `/_fake/` (see [`FakeResend::enable_control`]).
fn control_request(shared: &Shared, method: &Method, path: &str, body: &[u8]) -> Response {
    let endpoint = path[CONTROL_PREFIX.len()..].trim_end_matches('/');
    let known = ["fail-next", "drop-next", "lose-answer-next", "sent"];
    if !known.contains(&endpoint) {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "No control endpoint `{path}`; there are {}.",
                known
                    .map(|name| format!("{CONTROL_PREFIX}{name}"))
                    .join(", ")
            ),
        );
    }
    let expected = if endpoint == "sent" {
        Method::GET
    } else {
        Method::POST
    };
    if *method != expected {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &format!("`{path}` answers {expected} only."),
        );
    }
    if endpoint == "sent" {
        let sent = shared
            .state()
            .batches
            .iter()
            .flat_map(|batch| batch.emails.iter().cloned())
            .collect::<Vec<_>>();
        return json_answer(StatusCode::OK, &json!({ "data": sent }));
    }
    let Some(fields) = control_body(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "validation_error",
            "A control request's body must be a JSON object.",
        );
    };
    let count = match number_field(&fields, "count", 1) {
        Ok(count) => usize::try_from(count).unwrap_or(usize::MAX),
        Err(message) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                &message,
            );
        }
    };
    let mut state = shared.state();
    match endpoint {
        "fail-next" => {
            let status = match fields.get("status").and_then(Value::as_u64) {
                Some(status @ 400..=599) => status,
                _ => {
                    return error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "validation_error",
                        "`status` must be an HTTP error status, 400 to 599.",
                    );
                }
            };
            let retry_after = match number_field(&fields, "retry_after", 1) {
                Ok(seconds) => seconds,
                Err(message) => {
                    return error(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "validation_error",
                        &message,
                    );
                }
            };
            if status == 429 {
                state.rate_limit = (count > 0).then_some(RateLimit {
                    retry_after_secs: retry_after,
                    remaining: count,
                });
            } else {
                // 400..=599 is always a valid status code.
                let status = StatusCode::from_u16(status as u16)
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                state.fault = (count > 0).then_some(Fault {
                    status,
                    remaining: count,
                });
            }
            json_answer(
                StatusCode::OK,
                &json!({ "status": status, "count": count, "retry_after": retry_after }),
            )
        }
        "drop-next" => {
            state.drop_answers = count;
            json_answer(StatusCode::OK, &json!({ "count": count }))
        }
        _ => {
            state.lose_answers = count;
            json_answer(StatusCode::OK, &json!({ "count": count }))
        }
    }
}

/// A control request's body: a JSON object, or nothing (every field then takes its default);
/// `None` for anything else.
fn control_body(body: &[u8]) -> Option<Map<String, Value>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => Some(fields),
        _ => None,
    }
}

/// A non-negative integer field of a control request, `default` when absent or null; else
/// the message to answer.
fn number_field(fields: &Map<String, Value>, name: &str, default: u64) -> Result<u64, String> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_u64()
            .ok_or_else(|| format!("`{name}` must be a non-negative integer.")),
    }
}

fn take_fault(state: &mut FakeState) -> Option<StatusCode> {
    let fault = state.fault.as_mut()?;
    let status = fault.status;
    fault.remaining -= 1;
    if fault.remaining == 0 {
        state.fault = None;
    }
    Some(status)
}

fn take_rate_limit(state: &mut FakeState) -> Option<u64> {
    let limit = state.rate_limit.as_mut()?;
    let seconds = limit.retry_after_secs;
    limit.remaining -= 1;
    if limit.remaining == 0 {
        state.rate_limit = None;
    }
    Some(seconds)
}

/// The error name Resend uses for an injected status.
fn injected_name(status: StatusCode) -> String {
    match status.as_u16() {
        400 | 403 | 422 => "validation_error",
        401 => "missing_api_key",
        404 => "not_found",
        405 => "method_not_allowed",
        409 => "invalid_idempotent_request",
        429 => "rate_limit_exceeded",
        451 => "security_error",
        _ if status.is_server_error() => "internal_server_error",
        _ => "application_error",
    }
    .to_owned()
}

/// The bearer credentials, the scheme matched case-insensitively as HTTP allows.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = text_header(headers, header::AUTHORIZATION)?;
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim().to_owned())
        .filter(|credentials| !credentials.is_empty())
}

fn text_header(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.trim().to_owned())
}

/// A version-4-shaped UUID made of a counter, so that ids are distinct and readable.
fn fake_uuid(n: u64) -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        n >> 48,
        n & 0xffff_ffff_ffff
    )
}

/// A Resend-style error: `{"statusCode": n, "message": "…", "name": "…"}`.
fn error(status: StatusCode, name: &str, message: &str) -> Response {
    json_answer(
        status,
        &json!({ "statusCode": status.as_u16(), "message": message, "name": name }),
    )
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

/// Adds the `ratelimit-*` headers Resend puts on every API answer.
fn stamp(response: &mut Response, rate: RateHeaders) {
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static("ratelimit-limit"),
        HeaderValue::from(rate.limit),
    );
    headers.insert(
        HeaderName::from_static("ratelimit-remaining"),
        HeaderValue::from(rate.remaining),
    );
    headers.insert(
        HeaderName::from_static("ratelimit-reset"),
        HeaderValue::from(rate.reset_secs),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(email: &Value) -> Option<&'static str> {
        email_problem(email).map(|problem| problem.name)
    }

    #[test]
    fn required_fields_are_checked() {
        assert_eq!(
            email_problem(&json!({"from": "a@x.test", "to": "b@x.test", "subject": "s"})),
            None
        );
        assert_eq!(
            email_problem(&json!({"from": "a@x.test", "to": ["b@x.test"], "subject": "s"})),
            None
        );
        let missing = Some("missing_required_field");
        assert_eq!(
            name(&json!({"from": "a@x.test", "to": [], "subject": "s"})),
            missing
        );
        assert_eq!(name(&json!({"to": "b@x.test", "subject": "s"})), missing);
        assert_eq!(
            name(&json!({"from": "a@x.test", "to": "b@x.test"})),
            missing
        );
        assert_eq!(name(&json!("nope")), Some("validation_error"));
    }

    #[test]
    fn addresses_are_plain_or_named() {
        for good in [
            "a@b.example",
            "Acme <billing@acme.test>",
            "\"Acme, Inc.\" <billing@acme.test>",
            "<a@b.example>",
            "first.last+tag@mail.b.example",
        ] {
            assert!(is_address(good), "{good}");
        }
        for bad in [
            "",
            "a",
            "a@b",
            "@b.example",
            "a@",
            "a@@b.example",
            "a@b@c.example",
            "a@b..example",
            "a@.example",
            "a @b.example",
            "a@b.example ",
            "Name a@b.example",
            "Name <a@b.example",
            "Name <a@b.example> x",
            "Name <a b@c.example>",
            "Name <>",
        ] {
            assert!(!is_address(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_window_counts_down_and_frees_slots() {
        let start = Instant::now();
        let mut window = Window {
            limit: 2,
            per: Duration::from_secs(1),
            enforced: true,
            admitted: VecDeque::new(),
        };
        assert_eq!(window.headers(start).remaining, 2);
        assert_eq!(window.admit(start), Ok(()));
        assert_eq!(window.headers(start).remaining, 1);
        assert_eq!(window.admit(start), Ok(()));
        assert_eq!(window.headers(start).remaining, 0);
        assert_eq!(window.admit(start), Err(1));
        let later = start + Duration::from_secs(1);
        assert_eq!(window.headers(later).remaining, 2);
        assert_eq!(window.admit(later), Ok(()));
    }

    #[test]
    fn ids_are_distinct() {
        assert_ne!(fake_uuid(1), fake_uuid(2));
        assert_eq!(fake_uuid(1).len(), 36);
    }
}

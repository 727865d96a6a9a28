//! A local fake of Resend's batch email endpoint.
//!
//! Wire facts reproduced (docs/adr/0008-resend-email.md cites the sources):
//!
//! - `POST /emails/batch` with `Authorization: Bearer <api key>`: none is `401`
//!   `missing_api_key`, another key is `403` `invalid_api_key`;
//! - a `User-Agent` is required, else `403` `validation_error`;
//! - a JSON array body of 1 to 100 emails, else `422` `validation_error`; `from`, `to` (a
//!   string or a non-empty array of at most 50) and `subject` are required in each, else `422`
//!   `missing_required_field` (strict validation: the whole batch fails);
//! - `Idempotency-Key` (at most 256 characters, else `400` `invalid_idempotency_key`): the same
//!   key with the same body answers the same ids without sending again; the same key with another
//!   body is `409` `invalid_idempotent_request`;
//! - `200` with `{"data": [{"id": "<uuid>"}, …]}`, the ids in the order of the emails;
//! - errors are `{"statusCode": n, "message": "…", "name": "…"}`; every answer carries
//!   `ratelimit-limit`, `ratelimit-remaining` and `ratelimit-reset`, and a `429`
//!   `rate_limit_exceeded` also `retry-after`.
//!
//! Requests to any other path, `/audiences` and `/contacts` included, are answered `404`
//! `not_found` but recorded in [`FakeResend::paths`], so that tests can assert that none was
//! made. The exact texts of the error messages are the fake's own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Server, fresh_secret};

/// The most emails the fake accepts in one batch, as Resend.
const MAX_BATCH: usize = 100;
/// The most recipients of one email, as Resend.
const MAX_RECIPIENTS: usize = 50;
/// The longest idempotency key, as Resend.
const MAX_IDEMPOTENCY_KEY_CHARS: usize = 256;
/// The rate limit the fake advertises: 5 requests per second, Resend's current default.
const RATE_LIMIT: &str = "5";

/// A Resend batch email API on `127.0.0.1`, for tests.
///
/// Accepts only the API key it was started with, records every email it accepts
/// ([`FakeResend::sent`]), every accepted batch with its headers ([`FakeResend::batches`]) and
/// every request path ([`FakeResend::paths`]) and when each batch request arrived
/// ([`FakeResend::batch_request_times`]), and has fault hooks: [`FakeResend::fail_next`],
/// [`FakeResend::rate_limit_next`], [`FakeResend::lose_answer_next`] and an enforced rate
/// ([`FakeResend::limit_rate`]). The server stops when the value is dropped (or,
/// awaiting the end, with [`FakeResend::shutdown`]).
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
    /// The emails of the body, as sent.
    pub emails: Vec<Value>,
    /// The ids answered, in order.
    pub ids: Vec<String>,
    /// When the request arrived.
    pub received_at: Instant,
}

#[derive(Debug)]
struct Shared {
    api_key: String,
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    batches: Vec<FakeBatch>,
    paths: Vec<String>,
    idempotent: HashMap<String, (Value, Vec<String>)>,
    last_id: u64,
    fault: Option<Fault>,
    rate_limit: Option<RateLimit>,
    lose_answers: usize,
    window: Option<Window>,
    batch_requests: Vec<Instant>,
    rate_limited: usize,
}

/// At most `limit` admitted batch requests in any `per`.
#[derive(Debug)]
struct Window {
    limit: usize,
    per: Duration,
    admitted: VecDeque<Instant>,
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
        });
        // Everything goes through one handler so that every path is recorded.
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        Ok(FakeResend {
            server: Server::start(port, app).await?,
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

    /// The path of every request received so far, in order, whatever its answer.
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

    /// Enforces Resend's per-team limit: a batch request beyond `limit` in any window of `per`
    /// is answered `429` `rate_limit_exceeded` with `retry-after` (whole seconds, at least 1)
    /// until the oldest request of the window leaves it. Requests answered 429 do not count.
    pub fn limit_rate(&self, limit: usize, per: Duration) {
        self.shared.state().window = Some(Window {
            limit: limit.max(1),
            per,
            admitted: VecDeque::new(),
        });
    }

    /// When each `POST /emails/batch` arrived, in order, whatever its answer.
    pub fn batch_request_times(&self) -> Vec<Instant> {
        self.shared.state().batch_requests.clone()
    }

    /// How many batch requests were answered `429` so far.
    pub fn rate_limited(&self) -> usize {
        self.shared.state().rate_limited
    }

    /// Stops the server and waits until it has closed its connections.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
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
    shared.state().paths.push(path.clone());
    match (path.trim_end_matches('/'), method) {
        ("/emails/batch", Method::POST) => send_batch(&shared, &headers, &body),
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
    }
}

/// `POST /emails/batch`.
fn send_batch(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> Response {
    let mut state = shared.state();
    let now = Instant::now();
    state.batch_requests.push(now);
    if let Some(retry_after_secs) =
        take_rate_limit(&mut state).or_else(|| over_rate(&mut state, now))
    {
        state.rate_limited += 1;
        let mut response = error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "Too many requests. You can only make 5 requests per second. See rate limit response headers for more information.",
        );
        let headers = response.headers_mut();
        let seconds = HeaderValue::from(retry_after_secs);
        headers.insert(header::RETRY_AFTER, seconds.clone());
        headers.insert(
            HeaderName::from_static("ratelimit-remaining"),
            HeaderValue::from_static("0"),
        );
        headers.insert(HeaderName::from_static("ratelimit-reset"), seconds);
        return response;
    }
    if let Some(status) = take_fault(&mut state) {
        let reason = status.canonical_reason().unwrap_or("Injected failure");
        return error(
            status,
            &injected_name(status),
            &format!("{reason} (injected by FakeResend)"),
        );
    }
    match bearer(headers) {
        None => {
            return error(
                StatusCode::UNAUTHORIZED,
                "missing_api_key",
                "Missing API key in the authorization header. Include the following header in the request: Authorization: Bearer YOUR_API_KEY",
            );
        }
        Some(key) if key != shared.api_key => {
            return error(
                StatusCode::FORBIDDEN,
                "invalid_api_key",
                "API key is invalid",
            );
        }
        Some(_) => {}
    }
    let Some(user_agent) = text_header(headers, header::USER_AGENT).filter(|ua| !ua.is_empty())
    else {
        return error(
            StatusCode::FORBIDDEN,
            "validation_error",
            "The request must include a User-Agent header (error code: 1010).",
        );
    };
    let idempotency_key = text_header(headers, HeaderName::from_static("idempotency-key"));
    if let Some(key) = &idempotency_key
        && (key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS)
    {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "The key must be between 1-256 chars.",
        );
    }
    let request = match serde_json::from_slice::<Value>(body) {
        Ok(request) => request,
        Err(_) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                "The body must be a JSON array of emails.",
            );
        }
    };
    let emails = match &request {
        Value::Array(emails) if (1..=MAX_BATCH).contains(&emails.len()) => emails.clone(),
        Value::Array(emails) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                &format!(
                    "A batch must contain between 1 and {MAX_BATCH} emails, got {}.",
                    emails.len()
                ),
            );
        }
        _ => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation_error",
                "The body must be a JSON array of emails.",
            );
        }
    };
    for (index, email) in emails.iter().enumerate() {
        if let Some(problem) = email_problem(email) {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "missing_required_field",
                &format!("emails[{index}]: {problem}"),
            );
        }
    }
    if let Some(key) = &idempotency_key
        && let Some((previous, ids)) = state.idempotent.get(key)
    {
        if *previous == request {
            return ok(ids);
        }
        return error(
            StatusCode::CONFLICT,
            "invalid_idempotent_request",
            "Same idempotency key used with a different request payload. Change your idempotency key or payload.",
        );
    }

    let ids: Vec<String> = emails
        .iter()
        .map(|_| {
            state.last_id += 1;
            fake_uuid(state.last_id)
        })
        .collect();
    if let Some(key) = &idempotency_key {
        state.idempotent.insert(key.clone(), (request, ids.clone()));
    }
    state.batches.push(FakeBatch {
        idempotency_key,
        user_agent,
        batch_validation: text_header(headers, HeaderName::from_static("x-batch-validation")),
        content_type: text_header(headers, header::CONTENT_TYPE),
        emails,
        ids: ids.clone(),
        received_at: now,
    });
    if state.lose_answers > 0 {
        state.lose_answers -= 1;
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            "The answer was lost after sending (injected by FakeResend).",
        );
    }
    ok(&ids)
}

/// With an enforced rate, admits the request at `now` or says how many seconds to wait.
fn over_rate(state: &mut FakeState, now: Instant) -> Option<u64> {
    let window = state.window.as_mut()?;
    while window
        .admitted
        .front()
        .is_some_and(|at| now.duration_since(*at) >= window.per)
    {
        window.admitted.pop_front();
    }
    if window.admitted.len() < window.limit {
        window.admitted.push_back(now);
        return None;
    }
    let oldest = *window.admitted.front()?;
    let wait = window.per.saturating_sub(now.duration_since(oldest));
    Some(wait.as_secs_f64().ceil().max(1.0) as u64)
}

/// Why an email misses a required field, if it does.
fn email_problem(email: &Value) -> Option<String> {
    let Value::Object(fields) = email else {
        return Some("an email must be a JSON object".to_owned());
    };
    let present = |name: &str| {
        fields
            .get(name)
            .and_then(Value::as_str)
            .is_some_and(|text| !text.trim().is_empty())
    };
    if !present("from") {
        return Some("The `from` field is missing.".to_owned());
    }
    let recipients = match fields.get("to") {
        Some(Value::String(to)) if !to.trim().is_empty() => 1,
        Some(Value::Array(to))
            if to
                .iter()
                .all(|one| one.as_str().is_some_and(|s| !s.trim().is_empty())) =>
        {
            to.len()
        }
        _ => 0,
    };
    if recipients == 0 {
        return Some("The `to` field is missing.".to_owned());
    }
    if recipients > MAX_RECIPIENTS {
        return Some(format!(
            "The `to` field must have at most {MAX_RECIPIENTS} recipients."
        ));
    }
    if !present("subject") {
        return Some("The `subject` field is missing.".to_owned());
    }
    None
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

fn ok(ids: &[String]) -> Response {
    let data: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
    with_rate_headers(StatusCode::OK, &json!({ "data": data }))
}

/// A Resend-style error: `{"statusCode": n, "message": "…", "name": "…"}`.
fn error(status: StatusCode, name: &str, message: &str) -> Response {
    with_rate_headers(
        status,
        &json!({ "statusCode": status.as_u16(), "message": message, "name": name }),
    )
}

fn with_rate_headers(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    headers.insert(
        HeaderName::from_static("ratelimit-limit"),
        HeaderValue::from_static(RATE_LIMIT),
    );
    headers.insert(
        HeaderName::from_static("ratelimit-remaining"),
        HeaderValue::from_static("4"),
    );
    headers.insert(
        HeaderName::from_static("ratelimit-reset"),
        HeaderValue::from_static("1"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(email_problem(&json!({"from": "a@x.test", "to": [], "subject": "s"})).is_some());
        assert!(email_problem(&json!({"to": "b@x.test", "subject": "s"})).is_some());
        assert!(email_problem(&json!({"from": "a@x.test", "to": "b@x.test"})).is_some());
        assert!(email_problem(&json!("nope")).is_some());
    }

    #[test]
    fn ids_are_distinct() {
        assert_ne!(fake_uuid(1), fake_uuid(2));
        assert_eq!(fake_uuid(1).len(), 36);
    }
}

//! A local fake of BetterStack Uptime's create-incident endpoint.
//!
//! Wire facts reproduced (docs/adr/0006-betterstack-alerts.md cites the sources):
//!
//! - `POST /api/v3/incidents`, and the older `POST /api/v2/incidents`;
//! - `Authorization: Bearer <team token>`, else `401` with `{"errors": "…"}`;
//! - a JSON object body in which `summary` and `requester_email` are non-empty strings, else
//!   `422` with `{"errors": "…"}` (a body that is not a JSON object is a `400`);
//! - `201` with a JSON:API body `{"data": {"id": "<n>", "type": "incident", "attributes": {…}}}`.
//!
//! The exact texts of the error bodies are the fake's own; adapters should not match on them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::{Server, fresh_secret};

/// A BetterStack Uptime incidents API on `127.0.0.1`, for tests.
///
/// Accepts only the token it was started with, records every incident it creates, and can be
/// told to fail the next requests with [`FakeBetterStack::fail_next`]. The server stops when
/// the value is dropped (or, awaiting the end, with [`FakeBetterStack::shutdown`]).
///
/// ```no_run
/// use jobs_testkit::fakes::FakeBetterStack;
///
/// # async fn example() -> std::io::Result<()> {
/// let fake = FakeBetterStack::start().await?;
/// // configure the adapter with fake.base_url() and fake.token(), raise an alert, then:
/// assert_eq!(fake.incidents().len(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FakeBetterStack {
    server: Server,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    token: String,
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    incidents: Vec<Value>,
    last_id: u64,
    fault: Option<Fault>,
}

#[derive(Debug)]
struct Fault {
    status: StatusCode,
    remaining: usize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test thread must not hide the recorded incidents from the others.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeBetterStack {
    /// Starts a fake that accepts a fresh token, read back with [`FakeBetterStack::token`].
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with_token(fresh_secret("fake-betterstack-token-")).await
    }

    /// Starts a fake that accepts only `Bearer <token>`.
    ///
    /// Binds `127.0.0.1:0`, so parallel tests never collide on a port; fails only if the
    /// loopback interface cannot be bound.
    pub async fn start_with_token(token: impl Into<String>) -> std::io::Result<Self> {
        Self::start_on(0, token).await
    }

    /// Starts a fake on `127.0.0.1:port` (`0` for any free port) that accepts only
    /// `Bearer <token>`: for a local development stack, where the port is configured.
    pub async fn start_on(port: u16, token: impl Into<String>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            token: token.into(),
            state: Mutex::default(),
        });
        let app = Router::new()
            .route("/api/v3/incidents", post(create_incident))
            .route("/api/v2/incidents", post(create_incident))
            .with_state(Arc::clone(&shared));
        Ok(FakeBetterStack {
            server: Server::start(port, app).await?,
            shared,
        })
    }

    /// `http://127.0.0.1:<port>`: the base URL to configure the adapter with.
    pub fn base_url(&self) -> &str {
        self.server.base_url()
    }

    /// The only token this fake accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The JSON bodies of the incidents created so far, oldest first.
    pub fn incidents(&self) -> Vec<Value> {
        self.shared.state().incidents.clone()
    }

    /// Makes the next `n` requests answer `status` (with `Retry-After: 1` for a 429) before any
    /// check, recording nothing; replaces a previous fault. `n = 0` clears it.
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

    /// Stops the server and waits until it has closed its connections.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

/// `POST /api/v{2,3}/incidents`.
async fn create_incident(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut state = shared.state();
    if let Some(status) = take_fault(&mut state) {
        return injected(status);
    }
    if !authorized(&headers, &shared.token) {
        return errors(
            StatusCode::UNAUTHORIZED,
            "Invalid Team API token. See https://betterstack.com/docs/uptime/api/getting-started-with-uptime-api/",
        );
    }
    let request = match serde_json::from_slice::<Value>(&body) {
        Ok(request @ Value::Object(_)) => request,
        _ => return errors(StatusCode::BAD_REQUEST, "The body must be a JSON object"),
    };
    let blank: Vec<&str> = ["summary", "requester_email"]
        .into_iter()
        .filter(|field| !is_present(request.get(*field)))
        .collect();
    if !blank.is_empty() {
        let problems: Vec<String> = blank
            .iter()
            .map(|field| format!("{field} can't be blank"))
            .collect();
        return errors(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Validation failed: {}", problems.join(", ")),
        );
    }

    state.last_id += 1;
    let id = state.last_id.to_string();
    let field = |name: &str| request.get(name).cloned().unwrap_or(Value::Null);
    let flag = |name: &str| request.get(name).and_then(Value::as_bool).unwrap_or(false);
    let summary = field("summary");
    let name = match request.get("name") {
        Some(name @ Value::String(_)) => name.clone(),
        _ => summary.clone(),
    };
    let incident = json!({
        "data": {
            "id": id,
            "type": "incident",
            "attributes": {
                "name": name,
                "summary": summary,
                "cause": summary,
                "description": field("description"),
                "url": null,
                "http_method": null,
                "incident_group_id": null,
                "started_at": rfc3339_millis(SystemTime::now()),
                "acknowledged_at": null,
                "acknowledged_by": null,
                "resolved_at": null,
                "resolved_by": null,
                "status": "Started",
                "team_name": field("team_name"),
                "response_content": null,
                "response_options": null,
                "regions": null,
                "response_url": null,
                "screenshot_url": null,
                "origin_url": null,
                "escalation_policy_id": field("policy_id"),
                "call": flag("call"),
                "sms": flag("sms"),
                "email": flag("email"),
                "push": flag("push"),
                "critical_alert": flag("critical_alert"),
                "metadata": field("metadata"),
            },
        },
    });
    state.incidents.push(request);
    (StatusCode::CREATED, json_body(&incident)).into_response()
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

fn injected(status: StatusCode) -> Response {
    let reason = status.canonical_reason().unwrap_or("Injected failure");
    let mut response = errors(status, &format!("{reason} (injected by FakeBetterStack)"));
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// `Authorization: Bearer <token>`, the scheme matched case-insensitively as HTTP allows.
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    match value.split_once(' ') {
        Some((scheme, credentials)) => {
            scheme.eq_ignore_ascii_case("bearer") && credentials.trim() == token
        }
        None => false,
    }
}

fn is_present(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|text| !text.trim().is_empty())
}

/// A BetterStack-style error: `{"errors": "<message>"}`.
fn errors(status: StatusCode, message: &str) -> Response {
    (status, json_body(&json!({ "errors": message }))).into_response()
}

fn json_body(value: &Value) -> ([(header::HeaderName, HeaderValue); 1], String) {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )],
        value.to_string(),
    )
}

/// `2020-03-09T17:37:56.662Z`, the form BetterStack uses for `started_at`.
fn rfc3339_millis(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_with_milliseconds() {
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let docs_example = UNIX_EPOCH + Duration::from_millis(1_583_775_476_662);
        assert_eq!(rfc3339_millis(docs_example), "2020-03-09T17:37:56.662Z");
        let leap_day = UNIX_EPOCH + Duration::from_secs(1_709_164_800);
        assert_eq!(rfc3339_millis(leap_day), "2024-02-29T00:00:00.000Z");
    }

    #[test]
    fn only_the_bearer_token_is_authorized() {
        let mut headers = HeaderMap::new();
        assert!(!authorized(&headers, "t0k"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t0k"),
        );
        assert!(authorized(&headers, "t0k"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer t0k"),
        );
        assert!(authorized(&headers, "t0k"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer other"),
        );
        assert!(!authorized(&headers, "t0k"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic t0k"));
        assert!(!authorized(&headers, "t0k"));
    }

    #[test]
    fn a_fault_lasts_for_n_requests() {
        let mut state = FakeState {
            fault: Some(Fault {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                remaining: 2,
            }),
            ..FakeState::default()
        };
        assert_eq!(
            take_fault(&mut state),
            Some(StatusCode::INTERNAL_SERVER_ERROR)
        );
        assert_eq!(
            take_fault(&mut state),
            Some(StatusCode::INTERNAL_SERVER_ERROR)
        );
        assert_eq!(take_fault(&mut state), None);
    }
}

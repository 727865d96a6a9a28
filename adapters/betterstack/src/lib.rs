//! BetterStack Uptime incidents as the [`Alerter`] of softcrum-jobs.
//!
//! When jobs are dead-lettered, the runtime raises a (coalesced) [`Alert`]; the
//! [`BetterStackAlerter`] turns it into a BetterStack Uptime incident, which pages the current
//! on-call person directly:
//!
//! - `POST {base_url}/api/v3/incidents` with `Authorization: Bearer <team token>` and a JSON body
//!   `{requester_email, summary, name, description, call, sms, email, push, critical_alert,
//!   team_wait?, policy_id?, team_name?, metadata}`;
//! - success is `201` with a JSON:API `{"data":{"id":…,"type":"incident",…}}` body;
//! - failures become a typed [`BetterStackError`] (401/403/422 marked as configuration
//!   problems), converted into [`AlertError`] for the port. The token never appears in `Debug`
//!   output or in error messages.
//!
//! See `docs/adr/0006-betterstack-alerts.md` for why incidents rather than heartbeats or logs.

mod config;
mod error;

pub use config::{BetterStackConfig, DEFAULT_BASE_URL, DEFAULT_TIMEOUT};
pub use error::BetterStackError;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use jobs_core::{Alert, AlertError, Alerter};
use reqwest::header::{AUTHORIZATION, DATE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};

/// Path of the create-incident endpoint under the base URL.
const INCIDENTS_PATH: [&str; 3] = ["api", "v3", "incidents"];

/// How much of an unparsed response body an error keeps.
const MAX_DETAIL_CHARS: usize = 500;

const USER_AGENT: &str = concat!("softcrum-jobs/", env!("CARGO_PKG_VERSION"));

/// An [`Alerter`] that creates one BetterStack Uptime incident per alert.
///
/// It sends exactly one request per alert and never retries: alerts are already coalesced by
/// the runtime, and a retry after a timeout could page twice. Cheap to share behind an `Arc`;
/// the HTTP client pools connections.
///
/// ```no_run
/// use jobs_adapter_betterstack::{BetterStackAlerter, BetterStackConfig};
///
/// let alerter = BetterStackAlerter::new(
///     BetterStackConfig::new("team-token", "oncall@example.com").with_sms(true),
/// )?;
/// # Ok::<(), jobs_adapter_betterstack::BetterStackError>(())
/// ```
pub struct BetterStackAlerter {
    client: reqwest::Client,
    incidents_url: Url,
    authorization: HeaderValue,
    config: BetterStackConfig,
}

impl BetterStackAlerter {
    /// Checks `config` and builds the HTTP client with its timeout.
    ///
    /// Fails with a configuration error for an empty requester e-mail, a base URL that is not
    /// absolute `http(s)`, or a token that is empty or not a header value, so that a broken
    /// deployment is noticed at startup rather than at the first dead letter.
    pub fn new(config: BetterStackConfig) -> Result<Self, BetterStackError> {
        if config.requester_email.trim().is_empty() {
            return Err(BetterStackError::MissingRequesterEmail);
        }
        let incidents_url = incidents_url(&config.base_url)?;
        if config.token.trim().is_empty() {
            return Err(BetterStackError::InvalidToken);
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", config.token))
            .map_err(|_| BetterStackError::InvalidToken)?;
        authorization.set_sensitive(true);
        // Mozilla's roots, built in (reqwest 0.12's `rustls-tls` had them): the host needs no
        // certificate store, and its store is not read.
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(BetterStackError::Client)?;
        let client = reqwest::Client::builder()
            .tls_certs_only(roots)
            .timeout(config.timeout)
            .user_agent(USER_AGENT)
            .build()
            .map_err(BetterStackError::Client)?;
        Ok(BetterStackAlerter {
            client,
            incidents_url,
            authorization,
            config,
        })
    }

    /// Creates the incident for `alert` and returns BetterStack's id for it.
    ///
    /// The incident's `summary` is the alert title, its `name` is `softcrum-jobs: <queue>`, its
    /// `description` the detail followed by the count, and its `metadata` carries the queue and
    /// the count. Any status other than 2xx with a JSON:API incident body is an error.
    pub async fn create_incident(&self, alert: &Alert) -> Result<String, BetterStackError> {
        let body = IncidentRequest::new(&self.config, alert);
        let response = self
            .client
            .post(self.incidents_url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .json(&body)
            .send()
            .await
            .map_err(BetterStackError::Transport)?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(BetterStackError::Transport)?;
        let text = redact(&text, &self.config.token);

        if !status.is_success() {
            return Err(failure(status, retry_after, &text));
        }
        let incident: IncidentResponse =
            serde_json::from_str(&text).map_err(|err| BetterStackError::UnexpectedResponse {
                status: status.as_u16(),
                detail: format!("{err}; body: {}", truncate(&text)),
            })?;
        if incident.data.kind != "incident" {
            return Err(BetterStackError::UnexpectedResponse {
                status: status.as_u16(),
                detail: format!("resource type {:?}, not \"incident\"", incident.data.kind),
            });
        }
        tracing::info!(
            incident = %incident.data.id,
            queue = %alert.queue,
            count = alert.count,
            "BetterStack incident created"
        );
        Ok(incident.data.id)
    }
}

#[async_trait]
impl Alerter for BetterStackAlerter {
    /// Creates one incident; see [`BetterStackAlerter::create_incident`].
    async fn alert(&self, alert: &Alert) -> Result<(), AlertError> {
        self.create_incident(alert)
            .await
            .map(drop)
            .map_err(AlertError::from)
    }
}

impl fmt::Debug for BetterStackAlerter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BetterStackAlerter")
            .field("incidents_url", &self.incidents_url.as_str())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The create-incident body, field for field as BetterStack documents it.
#[derive(Debug, Serialize)]
struct IncidentRequest<'a> {
    requester_email: &'a str,
    summary: &'a str,
    name: String,
    description: String,
    call: bool,
    sms: bool,
    email: bool,
    push: bool,
    critical_alert: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    team_wait: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    team_name: Option<&'a str>,
    metadata: IncidentMetadata<'a>,
}

/// Key-value metadata on the incident, so that incidents can be filtered by queue.
#[derive(Debug, Serialize)]
struct IncidentMetadata<'a> {
    queue: &'a str,
    count: String,
}

impl<'a> IncidentRequest<'a> {
    fn new(config: &'a BetterStackConfig, alert: &'a Alert) -> Self {
        IncidentRequest {
            requester_email: &config.requester_email,
            summary: &alert.title,
            name: format!("softcrum-jobs: {}", alert.queue),
            description: format!(
                "{}\n\nDead-letter events in this alert: {} (queue {}).",
                alert.detail, alert.count, alert.queue
            ),
            call: config.call,
            sms: config.sms,
            email: config.email,
            push: config.push,
            critical_alert: config.critical_alert,
            team_wait: config.team_wait.map(|wait| wait.as_secs()),
            policy_id: config.policy_id.as_deref(),
            team_name: config.team_name.as_deref(),
            metadata: IncidentMetadata {
                queue: alert.queue.as_str(),
                count: alert.count.to_string(),
            },
        }
    }
}

/// The part of the JSON:API answer we rely on.
#[derive(Debug, Deserialize)]
struct IncidentResponse {
    data: IncidentData,
}

#[derive(Debug, Deserialize)]
struct IncidentData {
    id: String,
    #[serde(rename = "type")]
    kind: String,
}

/// `{base_url}/api/v3/incidents`, keeping any path prefix of the base URL.
fn incidents_url(base_url: &str) -> Result<Url, BetterStackError> {
    let invalid = |reason: String| BetterStackError::InvalidBaseUrl {
        url: base_url.to_owned(),
        reason,
    };
    let mut url = Url::parse(base_url).map_err(|err| invalid(err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?} is not http or https",
            url.scheme()
        )));
    }
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|()| invalid("cannot be a base URL".to_owned()))?
        .pop_if_empty()
        .extend(INCIDENTS_PATH);
    Ok(url)
}

/// Classifies a non-success answer.
fn failure(status: StatusCode, retry_after: Option<Duration>, body: &str) -> BetterStackError {
    let detail = error_detail(body);
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => BetterStackError::Unauthorized {
            status: status.as_u16(),
            detail,
        },
        StatusCode::UNPROCESSABLE_ENTITY => BetterStackError::Invalid { detail },
        StatusCode::TOO_MANY_REQUESTS => BetterStackError::RateLimited {
            retry_after,
            detail,
        },
        _ => BetterStackError::Status {
            status: status.as_u16(),
            detail,
        },
    }
}

/// The error text of a BetterStack error body: `{"errors": "…"}`, `{"errors": ["…"]}` or
/// `{"errors": {"field": ["…"]}}` (also `error` or `message`); otherwise the body's start.
fn error_detail(body: &str) -> String {
    if body.trim().is_empty() {
        return "(empty body)".to_owned();
    }
    let Ok(serde_json::Value::Object(object)) = serde_json::from_str::<serde_json::Value>(body)
    else {
        return truncate(body);
    };
    ["errors", "error", "message"]
        .iter()
        .find_map(|key| object.get(*key))
        .map(|value| truncate(&render(value)))
        .unwrap_or_else(|| truncate(body))
}

/// A JSON error value as one line of text.
fn render(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Array(items) => items.iter().map(render).collect::<Vec<_>>().join("; "),
        serde_json::Value::Object(fields) => fields
            .iter()
            .map(|(field, problems)| format!("{field}: {}", render(problems)))
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    }
}

fn truncate(text: &str) -> String {
    let mut chars = text.trim().chars();
    let kept: String = chars.by_ref().take(MAX_DETAIL_CHARS).collect();
    if chars.next().is_some() {
        format!("{kept}…")
    } else {
        kept
    }
}

/// Removes the token from text that may echo request headers back.
fn redact(text: &str, token: &str) -> String {
    if token.is_empty() {
        text.to_owned()
    } else {
        text.replace(token, "<redacted>")
    }
}

/// `Retry-After`, bounded ([`jobs_core::parse_retry_after`]; a date is measured from the
/// response's `Date`).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let date = header(DATE).and_then(jobs_core::parse_http_date);
    jobs_core::parse_retry_after(header(RETRY_AFTER)?, date)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incidents_url_keeps_prefixes_and_drops_trailing_slashes() {
        let url = |base: &str| incidents_url(base).map(|url| url.to_string());
        assert_eq!(
            url("https://uptime.betterstack.com").ok().as_deref(),
            Some("https://uptime.betterstack.com/api/v3/incidents")
        );
        assert_eq!(
            url("http://127.0.0.1:8080/").ok().as_deref(),
            Some("http://127.0.0.1:8080/api/v3/incidents")
        );
        assert_eq!(
            url("http://proxy.local/betterstack/").ok().as_deref(),
            Some("http://proxy.local/betterstack/api/v3/incidents")
        );
        assert!(matches!(
            url("uptime.betterstack.com"),
            Err(BetterStackError::InvalidBaseUrl { .. })
        ));
        assert!(matches!(
            url("ftp://uptime.betterstack.com"),
            Err(BetterStackError::InvalidBaseUrl { .. })
        ));
    }

    #[test]
    fn error_detail_reads_the_shapes_betterstack_uses() {
        assert_eq!(
            error_detail(r#"{"errors":"Invalid Team API token"}"#),
            "Invalid Team API token"
        );
        assert_eq!(error_detail(r#"{"errors":["a","b"]}"#), "a; b");
        assert_eq!(
            error_detail(r#"{"errors":{"summary":["can't be blank"]}}"#),
            "summary: can't be blank"
        );
        assert_eq!(
            error_detail("<html>Bad gateway</html>"),
            "<html>Bad gateway</html>"
        );
        assert_eq!(error_detail(""), "(empty body)");
        let long = "x".repeat(MAX_DETAIL_CHARS + 10);
        assert_eq!(error_detail(&long).chars().count(), MAX_DETAIL_CHARS + 1);
    }

    #[test]
    fn redact_removes_every_occurrence_of_the_token() {
        assert_eq!(redact("a tok b tok", "tok"), "a <redacted> b <redacted>");
        assert_eq!(redact("nothing", ""), "nothing");
    }
}

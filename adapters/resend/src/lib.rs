//! Resend batch emails as the [`EmailProvider`] of softcrum-jobs.
//!
//! Email blasts go through Resend's batch endpoint only, at most [`MAX_BATCH`] emails per
//! request, each batch with its own idempotency key:
//!
//! - `POST {base_url}/emails/batch` with `Authorization: Bearer <api key>`, a `User-Agent`
//!   (Resend requires one), `Idempotency-Key` and `x-batch-validation: strict`, and a JSON array
//!   body of `{from, to, subject, html?, text?, reply_to?, tags?: [{name, value}]}`;
//! - success is `200` with `{"data": [{"id": …}, …]}`, the ids in the order of the emails;
//! - failures map onto [`EmailError`]: 429 is [`EmailError::RateLimited`] (back off, never
//!   drop), validation and credential errors are [`EmailError::Rejected`] with Resend's
//!   message, and 5xx, timeouts, connection errors and an idempotent request still in flight
//!   are [`EmailError::Unavailable`].
//!
//! Splitting a blast into chunks, each its own job with its own key, is the caller's
//! (`jobs_notifications::chunk_emails`).
//!
//! Our store is the source of truth for recipients: this crate has no code path to Resend
//! Audiences or contacts, by design. The API key never appears in `Debug` output or in errors.
//!
//! See `docs/adr/0008-resend-email.md`.

mod config;
mod error;

pub use config::{
    BatchValidation, DEFAULT_BASE_URL, DEFAULT_TIMEOUT, DEFAULT_USER_AGENT, ResendConfig,
};
pub use error::ResendError;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use jobs_core::{Email, EmailError, EmailProvider};
use reqwest::header::{AUTHORIZATION, DATE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};

/// The most emails Resend accepts in one batch request.
pub const MAX_BATCH: usize = 100;

/// The longest idempotency key Resend accepts.
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 256;

/// The `status` of an [`EmailError::Rejected`] raised locally, before any request was made
/// (an empty or oversized batch, a bad idempotency key): there was no HTTP exchange.
pub const LOCAL_REJECTION_STATUS: u16 = 0;

/// Path of the batch endpoint under the base URL.
const BATCH_PATH: [&str; 2] = ["emails", "batch"];

/// How much of an unparsed response body an error keeps.
const MAX_DETAIL_CHARS: usize = 500;

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const BATCH_VALIDATION: HeaderName = HeaderName::from_static("x-batch-validation");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// An [`EmailProvider`] that sends each batch with one request to Resend's batch endpoint.
///
/// It never retries by itself: the caller's job retries, with the same idempotency key, after
/// [`EmailError::RateLimited`] or [`EmailError::Unavailable`]. Cheap to share behind an `Arc`;
/// the HTTP client pools connections.
///
/// ```no_run
/// use jobs_adapter_resend::{ResendConfig, ResendProvider};
///
/// let provider = ResendProvider::new(ResendConfig::new("re_123"))?;
/// # Ok::<(), jobs_adapter_resend::ResendError>(())
/// ```
pub struct ResendProvider {
    client: reqwest::Client,
    batch_url: Url,
    authorization: HeaderValue,
    config: ResendConfig,
}

impl ResendProvider {
    /// Checks `config` and builds the HTTP client with its timeout and user agent.
    ///
    /// Fails for a base URL that is not absolute `http(s)`, an API key or a user agent that is
    /// empty or not a header value, so that a broken deployment is noticed at startup.
    pub fn new(config: ResendConfig) -> Result<Self, ResendError> {
        let batch_url = batch_url(&config.base_url)?;
        if config.api_key.trim().is_empty() {
            return Err(ResendError::InvalidApiKey);
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", config.api_key))
            .map_err(|_| ResendError::InvalidApiKey)?;
        authorization.set_sensitive(true);
        if config.user_agent.trim().is_empty() {
            return Err(ResendError::InvalidUserAgent);
        }
        let user_agent =
            HeaderValue::from_str(&config.user_agent).map_err(|_| ResendError::InvalidUserAgent)?;
        // Mozilla's roots, built in (reqwest 0.12's `rustls-tls` had them): the host needs no
        // certificate store, and its store is not read.
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ResendError::Client)?;
        let client = reqwest::Client::builder()
            .tls_certs_only(roots)
            .timeout(config.timeout)
            .user_agent(user_agent)
            .build()
            .map_err(ResendError::Client)?;
        Ok(ResendProvider {
            client,
            batch_url,
            authorization,
            config,
        })
    }

    fn redact(&self, text: &str) -> String {
        redact(text, &self.config.api_key)
    }

    fn unavailable(&self, message: String, source: Option<reqwest::Error>) -> EmailError {
        EmailError::Unavailable {
            message: self.redact(&message),
            source: source.map(|err| Box::new(err) as Box<dyn std::error::Error + Send + Sync>),
        }
    }
}

#[async_trait]
impl EmailProvider for ResendProvider {
    /// [`MAX_BATCH`]: 100.
    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    /// One `POST /emails/batch`; see the crate documentation for the mapping of answers.
    ///
    /// An empty batch, one of more than [`MAX_BATCH`] emails, or an idempotency key that is
    /// empty, longer than [`MAX_IDEMPOTENCY_KEY_CHARS`] or not a header value is refused with
    /// [`EmailError::Rejected`] (status [`LOCAL_REJECTION_STATUS`]) without any request.
    async fn send_batch(
        &self,
        emails: &[Email],
        idempotency_key: &str,
    ) -> Result<Vec<String>, EmailError> {
        if emails.is_empty() || emails.len() > MAX_BATCH {
            return Err(local_rejection(format!(
                "a Resend batch carries 1 to {MAX_BATCH} emails, this one has {}; nothing was sent (split blasts into jobs of at most {MAX_BATCH})",
                emails.len()
            )));
        }
        let key = idempotency_key.trim();
        if key.is_empty() || key.chars().count() > MAX_IDEMPOTENCY_KEY_CHARS {
            return Err(local_rejection(format!(
                "the idempotency key must have 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters; nothing was sent"
            )));
        }
        let key = HeaderValue::from_str(key).map_err(|_| {
            local_rejection(
                "the idempotency key is not a valid header value; nothing was sent".to_owned(),
            )
        })?;
        let body: Vec<WireEmail<'_>> = emails.iter().map(WireEmail::from).collect();

        let response = self
            .client
            .post(self.batch_url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(IDEMPOTENCY_KEY, key)
            .header(
                BATCH_VALIDATION,
                HeaderValue::from_static(self.config.validation.as_str()),
            )
            .json(&body)
            .send()
            .await
            .map_err(|err| {
                self.unavailable(format!("request to Resend failed: {err}"), Some(err))
            })?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(|err| {
            self.unavailable(
                format!("reading Resend's answer (HTTP {status}) failed: {err}"),
                Some(err),
            )
        })?;
        let text = self.redact(&text);

        if !status.is_success() {
            let err = failure(status, retry_after, &text);
            tracing::warn!(%status, error = %err, "Resend refused a batch");
            return Err(err);
        }
        let answer: BatchResponse = serde_json::from_str(&text).map_err(|err| {
            self.unavailable(
                format!(
                    "Resend answered HTTP {status} without ids: {err}; body: {}",
                    truncate(&text)
                ),
                None,
            )
        })?;
        if answer.data.len() != emails.len() {
            return Err(self.unavailable(
                format!(
                    "Resend answered {} ids for {} emails",
                    answer.data.len(),
                    emails.len()
                ),
                None,
            ));
        }
        tracing::debug!(emails = emails.len(), "Resend accepted a batch");
        Ok(answer.data.into_iter().map(|sent| sent.id).collect())
    }
}

impl fmt::Debug for ResendProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResendProvider")
            .field("batch_url", &self.batch_url.as_str())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One email of the batch body, field for field as Resend documents it.
#[derive(Debug, Serialize)]
struct WireEmail<'a> {
    from: &'a str,
    to: &'a [String],
    subject: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_to: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tags: Vec<WireTag<'a>>,
}

#[derive(Debug, Serialize)]
struct WireTag<'a> {
    name: &'a str,
    value: &'a str,
}

impl<'a> From<&'a Email> for WireEmail<'a> {
    fn from(email: &'a Email) -> Self {
        WireEmail {
            from: &email.from,
            to: &email.to,
            subject: &email.subject,
            html: email.html.as_deref(),
            text: email.text.as_deref(),
            reply_to: email.reply_to.as_deref(),
            tags: email
                .tags
                .iter()
                .map(|(name, value)| WireTag { name, value })
                .collect(),
        }
    }
}

/// `{"data": [{"id": …}, …]}`.
#[derive(Debug, Deserialize)]
struct BatchResponse {
    data: Vec<SentEmail>,
}

#[derive(Debug, Deserialize)]
struct SentEmail {
    id: String,
}

/// Resend's error body: `{"statusCode": 422, "message": "…", "name": "validation_error"}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

fn local_rejection(message: String) -> EmailError {
    EmailError::Rejected {
        status: LOCAL_REJECTION_STATUS,
        message,
    }
}

/// `{base_url}/emails/batch`, keeping any path prefix of the base URL.
fn batch_url(base_url: &str) -> Result<Url, ResendError> {
    let invalid = |reason: String| ResendError::InvalidBaseUrl {
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
        .extend(BATCH_PATH);
    Ok(url)
}

/// Classifies a non-success answer.
fn failure(status: StatusCode, retry_after: Option<Duration>, body: &str) -> EmailError {
    let error = serde_json::from_str::<ErrorBody>(body).unwrap_or_default();
    let name = error.name.as_deref().unwrap_or("");
    let message = match (&error.message, name) {
        (Some(message), "") => truncate(message),
        (Some(message), name) => truncate(&format!("{message} ({name})")),
        (None, _) if body.trim().is_empty() => "(empty body)".to_owned(),
        (None, _) => truncate(body),
    };
    if status == StatusCode::TOO_MANY_REQUESTS {
        return EmailError::RateLimited { retry_after };
    }
    if status == StatusCode::CONFLICT && name == "concurrent_idempotent_requests" {
        return EmailError::Unavailable {
            message: format!(
                "Resend is still processing a request with this idempotency key (HTTP 409): {message}"
            ),
            source: None,
        };
    }
    if status.is_client_error() {
        return EmailError::Rejected {
            status: status.as_u16(),
            message,
        };
    }
    EmailError::Unavailable {
        message: format!("Resend answered HTTP {status}: {message}"),
        source: None,
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

/// Removes the API key from text that may echo request headers back.
fn redact(text: &str, api_key: &str) -> String {
    if api_key.is_empty() {
        text.to_owned()
    } else {
        text.replace(api_key, "<redacted>")
    }
}

/// `retry-after`, else `ratelimit-reset` (seconds), bounded ([`jobs_core::parse_retry_after`];
/// a date is measured from the response's `Date`).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let date = header(&DATE).and_then(jobs_core::parse_http_date);
    let wait = |name: &HeaderName| jobs_core::parse_retry_after(header(name)?, date);
    wait(&RETRY_AFTER).or_else(|| wait(&RATELIMIT_RESET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_url_keeps_prefixes_and_drops_trailing_slashes() {
        let url = |base: &str| batch_url(base).map(|url| url.to_string());
        assert_eq!(
            url("https://api.resend.com").ok().as_deref(),
            Some("https://api.resend.com/emails/batch")
        );
        assert_eq!(
            url("http://127.0.0.1:8080/proxy/").ok().as_deref(),
            Some("http://127.0.0.1:8080/proxy/emails/batch")
        );
        assert!(matches!(
            url("api.resend.com"),
            Err(ResendError::InvalidBaseUrl { .. })
        ));
    }

    #[test]
    fn failures_are_classified_by_status_and_name() {
        let conflict = |name: &str| {
            failure(
                StatusCode::CONFLICT,
                None,
                &format!(r#"{{"statusCode":409,"message":"m","name":"{name}"}}"#),
            )
        };
        assert!(matches!(
            conflict("concurrent_idempotent_requests"),
            EmailError::Unavailable { .. }
        ));
        assert!(matches!(
            conflict("invalid_idempotent_request"),
            EmailError::Rejected { status: 409, .. }
        ));
        assert!(matches!(
            failure(StatusCode::UNAUTHORIZED, None, ""),
            EmailError::Rejected { status: 401, .. }
        ));
        assert!(matches!(
            failure(StatusCode::BAD_GATEWAY, None, "<html>"),
            EmailError::Unavailable { .. }
        ));
    }

    #[test]
    fn retry_after_falls_back_to_ratelimit_reset() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RATELIMIT_RESET, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
    }

    #[test]
    fn a_hostile_retry_after_is_bounded_and_a_date_is_read_against_the_response_s() {
        let mut headers = HeaderMap::new();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("200000000000000000000000"),
        );
        assert_eq!(retry_after(&headers), Some(jobs_core::MAX_RETRY_AFTER));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:30 GMT"),
        );
        headers.insert(
            DATE,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(30)));
    }
}

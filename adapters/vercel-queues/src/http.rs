//! One HTTP exchange with Vercel Queues: the token, the retries, and what a status means.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use jobs_core::{Clock, QueueError, QueueName};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use tokio::sync::Mutex;

use crate::config::{AccessToken, VercelQueuesConfig};

/// Asks the token source again this long before the cached token expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// The first backoff when the server gave no `Retry-After`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How much of an error body an error message keeps.
const MAX_DETAIL_CHARS: usize = 300;

pub(crate) const DEPLOYMENT_ID: HeaderName = HeaderName::from_static("vqs-deployment-id");

/// What the server answered, whatever the status.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The server's explanation: the `error` field of a JSON body, or the body itself.
    pub(crate) fn message(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let message = serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(MAX_DETAIL_CHARS).collect());
        format!("HTTP {}: {message}", self.status.as_u16())
    }

    /// A refusal that will not change on retry (400, 401, 403, 413, …) as an error.
    pub(crate) fn rejected(&self, queue: &QueueName) -> QueueError {
        QueueError::Rejected {
            queue: queue.clone(),
            reason: self.message(),
        }
    }

    /// A header as text.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A request, rebuilt for each retry.
pub(crate) struct Call<'a> {
    pub(crate) method: Method,
    pub(crate) path: &'a [&'a str],
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Bytes>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(method: Method, path: &'a [&'a str]) -> Call<'a> {
        Call {
            method,
            path,
            headers: HeaderMap::new(),
            body: None,
        }
    }

    pub(crate) fn header(
        mut self,
        name: impl reqwest::header::IntoHeaderName,
        value: HeaderValue,
    ) -> Self {
        self.headers.insert(name, value);
        self
    }

    pub(crate) fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }
}

/// The HTTP side of the adapter: shared by the publishing and consuming halves.
pub(crate) struct Http {
    client: reqwest::Client,
    pub(crate) config: VercelQueuesConfig,
    token: Mutex<Option<AccessToken>>,
    /// The adapter's clock, for the token's expiry.
    clock: Arc<dyn Clock>,
}

impl Http {
    pub(crate) fn new(
        config: VercelQueuesConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Http, crate::ConfigError> {
        // Mozilla's roots, built in (reqwest 0.12's `rustls-tls` had them): the host needs no
        // certificate store, and its store is not read.
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(crate::ConfigError::Http)?;
        let client = reqwest::Client::builder()
            .tls_certs_only(roots)
            .timeout(config.timeout)
            .user_agent(concat!("softcrum-jobs/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(crate::ConfigError::Http)?;
        Ok(Http {
            client,
            config,
            token: Mutex::new(None),
            clock,
        })
    }

    /// `{base_url}/api/v3/topic/{segments…}`, each segment percent-encoded (receipt handles
    /// are opaque and hold `/`, `:` and spaces).
    pub(crate) fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.config.base_url.clone();
        url.path_segments_mut()
            .expect("the base URL was checked to take path segments")
            .pop_if_empty()
            .extend(["api", "v3", "topic"])
            .extend(segments);
        url
    }

    async fn bearer(&self) -> Result<HeaderValue, String> {
        let mut cached = self.token.lock().await;
        let soon = self.clock.now().checked_add(TOKEN_MARGIN);
        let fresh = cached.as_ref().is_some_and(|token| {
            token
                .expires_at()
                .is_none_or(|at| soon.is_some_and(|soon| at > soon))
        });
        if !fresh {
            *cached = Some(
                self.config
                    .tokens
                    .token()
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let token = cached.as_ref().expect("filled above");
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.secret()))
            .map_err(|_| "the OIDC token holds characters not allowed in a header".to_owned())?;
        value.set_sensitive(true);
        Ok(value)
    }

    async fn forget_token(&self) {
        *self.token.lock().await = None;
    }

    /// Sends `call`, retrying what may succeed later (429, 5xx, timeouts, connection errors,
    /// one 401 with a refreshed token) within the configured budget. Any other answer is
    /// returned for the caller to interpret; so is the last retryable one once the budget is
    /// spent, except that a `Retry-After` longer than the longest backoff is returned at once
    /// as [`QueueError::RateLimited`].
    pub(crate) async fn send(
        &self,
        queue: &QueueName,
        call: Call<'_>,
    ) -> Result<Answer, QueueError> {
        let url = self.url(call.path);
        let mut refreshed = false;
        let mut attempt = 0;
        loop {
            let bearer = self
                .bearer()
                .await
                .map_err(|message| QueueError::Unavailable {
                    queue: queue.clone(),
                    message,
                    source: None,
                })?;
            let mut request = self
                .client
                .request(call.method.clone(), url.clone())
                .headers(call.headers.clone())
                .header(AUTHORIZATION, bearer);
            if let Some(deployment) = &self.config.deployment_id {
                request = request.header(DEPLOYMENT_ID, deployment);
            }
            if let Some(body) = &call.body {
                request = request.body(body.clone());
            }
            let failure = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let headers = response.headers().clone();
                    match response.bytes().await {
                        Ok(body) => {
                            let answer = Answer {
                                status,
                                headers,
                                body,
                            };
                            if status == StatusCode::UNAUTHORIZED && !refreshed {
                                refreshed = true;
                                self.forget_token().await;
                                continue;
                            }
                            if !retryable(status) {
                                return Ok(answer);
                            }
                            Failure::Status(answer)
                        }
                        Err(e) => Failure::Transport(e),
                    }
                }
                Err(e) => Failure::Transport(e),
            };
            let wait = match &failure {
                Failure::Status(answer) => retry_after(&answer.headers),
                Failure::Transport(_) => None,
            };
            if let Some(wait) = wait.filter(|w| *w > self.config.max_backoff) {
                return Err(QueueError::RateLimited {
                    queue: queue.clone(),
                    retry_after: Some(wait),
                });
            }
            if attempt >= self.config.max_retries {
                return Err(exhausted(queue, failure));
            }
            let backoff = wait.unwrap_or(FIRST_BACKOFF * 2u32.saturating_pow(attempt));
            tracing::debug!(%queue, attempt, ?backoff, "retrying a Vercel Queues request");
            tokio::time::sleep(backoff.min(self.config.max_backoff)).await;
            attempt += 1;
        }
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// A failure worth retrying: the exchange broke, or the server said to come back.
enum Failure {
    Transport(reqwest::Error),
    Status(Answer),
}

/// The error for a retryable failure once the retries are spent.
fn exhausted(queue: &QueueName, failure: Failure) -> QueueError {
    match failure {
        Failure::Status(answer) if answer.status == StatusCode::TOO_MANY_REQUESTS => {
            QueueError::RateLimited {
                queue: queue.clone(),
                retry_after: retry_after(&answer.headers),
            }
        }
        Failure::Status(answer) => QueueError::Unavailable {
            queue: queue.clone(),
            message: format!("Vercel Queues answered {}", answer.message()),
            source: None,
        },
        Failure::Transport(error) => QueueError::Unavailable {
            queue: queue.clone(),
            message: if error.is_timeout() {
                "the request to Vercel Queues timed out".to_owned()
            } else {
                "the request to Vercel Queues failed".to_owned()
            },
            source: Some(Box::new(error)),
        },
    }
}

/// `Retry-After`, bounded ([`jobs_core::parse_retry_after`]; a date is measured from the
/// response's `Date`).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let date = header(reqwest::header::DATE).and_then(jobs_core::parse_http_date);
    jobs_core::parse_retry_after(header(RETRY_AFTER)?, date)
}

/// A header value from text we produced (numbers, keys we validated).
pub(crate) fn value(text: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(text).map_err(|_| format!("{text:?} cannot be sent as a header value"))
}

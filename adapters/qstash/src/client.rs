//! The publishing side and QStash's operator endpoints.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use jobs_core::{
    DecodeLimits, Depth, Envelope, PublishOptions, QueueDepth, QueueError, QueueName, QueuePort,
    Receipt, TenantId,
};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{Destination, QStashConfig};
use crate::error::QStashError;

/// The header a deferral's republish forwards, carrying the attempts already spent.
pub(crate) const ATTEMPTS_SPENT: &str = "jobs-attempts-spent";

/// How much of an unparsed error body an error keeps.
const MAX_DETAIL_CHARS: usize = 300;

/// QStash as a [`QueuePort`] (publish, schedule, batch) and [`QueueDepth`] (queue `lag`),
/// with its DLQ and schedules as extra operations.
///
/// Cheap to clone; share it as `Arc<dyn QueuePort>`. The adapter never retries by itself.
#[derive(Clone)]
pub struct QStashQueue {
    http: reqwest::Client,
    config: Arc<QStashConfig>,
    auth: HeaderValue,
    limits: DecodeLimits,
}

impl fmt::Debug for QStashQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QStashQueue")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A message to publish in a batch.
#[derive(Debug, Clone)]
pub struct BatchItem {
    /// The queue.
    pub queue: QueueName,
    /// The job.
    pub envelope: Envelope,
    /// Delay and deduplication key.
    pub opts: PublishOptions,
}

/// One message of QStash's DLQ.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DlqMessage {
    /// The DLQ entry's id (for retry and delete).
    pub dlq_id: String,
    /// The original message id.
    pub message_id: String,
    /// The destination URL.
    #[serde(default)]
    pub url: Option<String>,
    /// The QStash queue, if any.
    #[serde(default)]
    pub queue_name: Option<String>,
    /// The body, when it is text.
    #[serde(default)]
    pub body: Option<String>,
    /// The last status our endpoint answered.
    #[serde(default)]
    pub response_status: Option<u16>,
}

/// A page of QStash's DLQ.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct DlqPage {
    /// The messages.
    pub messages: Vec<DlqMessage>,
    /// Where the next page starts; `None` at the end.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// A QStash schedule.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Schedule {
    /// Its id.
    pub schedule_id: String,
    /// The cron expression.
    pub cron: String,
    /// The destination URL.
    pub destination: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublishAnswer {
    message_id: Option<String>,
    #[serde(default)]
    deduplicated: bool,
    #[serde(default)]
    error: Option<String>,
}

impl QStashQueue {
    /// A client for `config`; fails on a bad base URL, token or destination URL.
    pub fn new(config: QStashConfig) -> Result<Self, QStashError> {
        let base =
            reqwest::Url::parse(&config.base_url).map_err(|e| QStashError::InvalidBaseUrl {
                url: config.base_url.clone(),
                reason: e.to_string(),
            })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(QStashError::InvalidBaseUrl {
                url: config.base_url,
                reason: "not http or https".into(),
            });
        }
        for destination in config.destinations.values().chain(&config.template) {
            if !(destination.url.starts_with("http://") || destination.url.starts_with("https://"))
            {
                return Err(QStashError::InvalidDestination(destination.url.clone()));
            }
        }
        if config.token.trim().is_empty() {
            return Err(QStashError::InvalidToken);
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", config.token))
            .map_err(|_| QStashError::InvalidToken)?;
        auth.set_sensitive(true);
        // Mozilla's roots, built in (reqwest 0.12's `rustls-tls` had them): the host needs no
        // certificate store, and its store is not read.
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(QStashError::Client)?;
        let http = reqwest::Client::builder()
            .tls_certs_only(roots)
            .timeout(config.timeout)
            .build()
            .map_err(QStashError::Client)?;
        Ok(QStashQueue {
            http,
            config: Arc::new(config),
            auth,
            limits: DecodeLimits::default(),
        })
    }

    /// Refuses at publish, with [`QueueError::TooLarge`] and nothing sent, envelopes longer
    /// than `limits` allow: the limits the consumers decode with (the default matches theirs).
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &QStashConfig {
        &self.config
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.base_url.trim_end_matches('/'))
    }

    fn destination(&self, queue: &QueueName) -> Result<Cow<'_, Destination>, QueueError> {
        self.config
            .destination(queue)
            .ok_or_else(|| QueueError::Rejected {
                queue: queue.clone(),
                reason: format!("no QStash destination configured for `{queue}`; nothing was sent"),
            })
    }

    /// The path publishing to `destination` goes to.
    fn publish_path(destination: &Destination) -> String {
        match &destination.qstash_queue {
            Some(q) => format!("/v2/enqueue/{q}/{}", destination.url),
            None => format!("/v2/publish/{}", destination.url),
        }
    }

    /// The publish headers of one message, as `(name, value)`.
    fn publish_headers(
        &self,
        queue: &QueueName,
        destination: &Destination,
        dedup_key: Option<&str>,
        when: When,
        retries: Option<u32>,
        tenant: Option<TenantId>,
    ) -> Result<Vec<(&'static str, String)>, QueueError> {
        let mut headers = vec![("content-type", "application/json".to_owned())];
        if let (Some(parallelism), Some(tenant)) = (destination.tenant_parallelism, tenant) {
            headers.push(("upstash-flow-control-key", flow_control_key(queue, tenant)));
            headers.push((
                "upstash-flow-control-value",
                format!("parallelism={parallelism}"),
            ));
        }
        if let Some(key) = dedup_key {
            if key.is_empty() || HeaderValue::from_str(key).is_err() {
                return Err(QueueError::Rejected {
                    queue: queue.clone(),
                    reason: "the deduplication key is empty or not a valid header value; nothing was sent".into(),
                });
            }
            headers.push(("upstash-deduplication-id", key.to_owned()));
        }
        match when {
            When::Now => {}
            When::Delay(delay) if delay.is_zero() => {}
            When::Delay(delay) => {
                // Whole seconds, rounded up: never earlier than asked.
                let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
                headers.push(("upstash-delay", format!("{secs}s")));
            }
            When::At(at) => {
                let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
                let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
                headers.push(("upstash-not-before", secs.to_string()));
            }
        }
        let retry = destination.retry;
        headers.push((
            "upstash-retries",
            retries.map_or_else(|| retry.retries_header(), |r| r.to_string()),
        ));
        headers.push(("upstash-retry-delay", retry.retry_delay_expression()));
        headers.push((
            "upstash-timeout",
            format!("{}s", self.config.delivery_timeout.as_secs().max(1)),
        ));
        Ok(headers)
    }

    async fn send_publish(
        &self,
        queue: &QueueName,
        body: Vec<u8>,
        dedup_key: Option<&str>,
        when: When,
        extra: &[(&'static str, String)],
        retries: Option<u32>,
    ) -> Result<Receipt, QueueError> {
        let destination = self.destination(queue)?;
        // The tenant, for flow control: the envelope's, when the payload is one.
        let tenant = destination
            .tenant_parallelism
            .and_then(|_| Envelope::decode(&body).ok())
            .map(|envelope| envelope.tenant_id);
        let headers =
            self.publish_headers(queue, &destination, dedup_key, when, retries, tenant)?;
        let mut request = self
            .http
            .post(self.url(&Self::publish_path(&destination)))
            .header(AUTHORIZATION, self.auth.clone())
            .body(body);
        for (name, value) in headers.iter().chain(extra) {
            request = request.header(*name, value);
        }
        let response = request.send().await.map_err(|e| unavailable(queue, e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(|e| unavailable(queue, e))?;
        if status == StatusCode::OK || status == StatusCode::ACCEPTED {
            let answer: PublishAnswer =
                serde_json::from_str(&text).map_err(|e| QueueError::Unavailable {
                    queue: queue.clone(),
                    message: format!("QStash answered {status} with an unexpected body"),
                    source: Some(Box::new(e)),
                })?;
            let id = answer.message_id;
            return Ok(if status == StatusCode::ACCEPTED || answer.deduplicated {
                Receipt::duplicate_of(id)
            } else {
                Receipt::queued(id)
            });
        }
        Err(status_error(queue, status, retry_after, &text))
    }

    /// Publishes several messages in one `POST /v2/batch`; one answer per item, in order (a
    /// failed item does not stop the others). The outer error is the request's own failure.
    pub async fn publish_batch(
        &self,
        items: &[BatchItem],
    ) -> Result<Vec<Result<Receipt, QueueError>>, QueueError> {
        let Some(first) = items.first() else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::with_capacity(items.len());
        for item in items {
            let destination = self.destination(&item.queue)?;
            let dedup = item.opts.dedup_key_for(&item.envelope);
            let when = When::of(&item.queue, &item.opts)?;
            let headers: serde_json::Map<String, Value> = self
                .publish_headers(
                    &item.queue,
                    &destination,
                    Some(&dedup),
                    when,
                    None,
                    Some(item.envelope.tenant_id),
                )?
                .into_iter()
                .map(|(n, v)| (n.to_owned(), Value::String(v)))
                .collect();
            let bytes = item.envelope.encode_for(&item.queue, &self.limits)?;
            let body = String::from_utf8(bytes).map_err(|_| QueueError::Rejected {
                queue: item.queue.clone(),
                reason: "the envelope is not UTF-8".into(),
            })?;
            let mut entry = json!({
                "destination": &destination.url,
                "body": body,
                "headers": headers,
            });
            if let Some(q) = &destination.qstash_queue {
                entry["queue"] = json!(q);
            }
            entries.push(entry);
        }
        let queue = &first.queue;
        let response = self
            .http
            .post(self.url("/v2/batch"))
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Value::Array(entries).to_string())
            .send()
            .await
            .map_err(|e| unavailable(queue, e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(|e| unavailable(queue, e))?;
        if !status.is_success() {
            return Err(status_error(queue, status, retry_after, &text));
        }
        let answers: Vec<PublishAnswer> =
            serde_json::from_str(&text).map_err(|e| QueueError::Unavailable {
                queue: queue.clone(),
                message: "QStash answered the batch with an unexpected body".into(),
                source: Some(Box::new(e)),
            })?;
        if answers.len() != items.len() {
            return Err(QueueError::Unavailable {
                queue: queue.clone(),
                message: format!(
                    "QStash answered {} results for {} messages",
                    answers.len(),
                    items.len()
                ),
                source: None,
            });
        }
        Ok(answers
            .into_iter()
            .zip(items)
            .map(|(answer, item)| match (answer.error, answer.message_id) {
                (Some(error), _) => Err(QueueError::Rejected {
                    queue: item.queue.clone(),
                    reason: format!("QStash refused the message: {error}"),
                }),
                (None, None) => Err(QueueError::Unavailable {
                    queue: item.queue.clone(),
                    message: "QStash answered no message id".into(),
                    source: None,
                }),
                (None, Some(id)) if answer.deduplicated => Ok(Receipt::duplicate_of(Some(id))),
                (None, Some(id)) => Ok(Receipt::queued(Some(id))),
            })
            .collect())
    }

    /// Publishes `payload` again for delivery at `until`, carrying the attempts already spent,
    /// with `retries` retries: how a push delivery is deferred without QStash counting a retry.
    pub(crate) async fn republish_deferred(
        &self,
        queue: &QueueName,
        payload: Vec<u8>,
        until: SystemTime,
        attempts_spent: u32,
        retries: u32,
    ) -> Result<Receipt, QueueError> {
        let forward = [(
            "upstash-forward-jobs-attempts-spent",
            attempts_spent.to_string(),
        )];
        self.send_publish(
            queue,
            payload,
            None,
            When::At(until),
            &forward,
            Some(retries),
        )
        .await
    }

    /// Creates or updates (`POST /v2/queues`) the QStash queue `name` with `parallelism`
    /// (1 = FIFO).
    pub async fn upsert_queue(&self, name: &str, parallelism: u32) -> Result<(), QStashError> {
        let body = json!({ "queueName": name, "parallelism": parallelism });
        self.call(Method::POST, "/v2/queues", Some(body)).await?;
        Ok(())
    }

    /// One page of QStash's DLQ (at most `count`, capped at 100), from `cursor`.
    pub async fn dlq_list(&self, cursor: Option<&str>, count: u32) -> Result<DlqPage, QStashError> {
        let mut path = format!("/v2/dlq?count={}", count.clamp(1, 100));
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={}", encode_query(cursor)));
        }
        let text = self.call(Method::GET, &path, None).await?;
        serde_json::from_str(&text).map_err(|e| QStashError::Api {
            status: 200,
            message: format!("unexpected DLQ body: {e}"),
        })
    }

    /// Retries DLQ message `dlq_id` now; returns the new message id.
    pub async fn dlq_retry(&self, dlq_id: &str) -> Result<String, QStashError> {
        let text = self
            .call(Method::POST, &format!("/v2/dlq/retry/{dlq_id}"), None)
            .await?;
        let answer: PublishAnswer = serde_json::from_str(&text).map_err(|e| QStashError::Api {
            status: 201,
            message: format!("unexpected body: {e}"),
        })?;
        answer.message_id.ok_or_else(|| QStashError::Api {
            status: 201,
            message: "no messageId in the answer".into(),
        })
    }

    /// Deletes DLQ message `dlq_id`.
    pub async fn dlq_delete(&self, dlq_id: &str) -> Result<(), QStashError> {
        self.call(Method::DELETE, &format!("/v2/dlq/{dlq_id}"), None)
            .await?;
        Ok(())
    }

    /// Creates or replaces (`Upstash-Schedule-Id`) a schedule publishing `body` to the
    /// destination of `queue` on `cron` (five fields, UTC unless `CRON_TZ=` prefixes it);
    /// returns its id.
    pub async fn schedule_upsert(
        &self,
        queue: &QueueName,
        schedule_id: &str,
        cron: &str,
        body: Vec<u8>,
    ) -> Result<String, QStashError> {
        let destination = self.config.destination(queue).ok_or_else(|| {
            QStashError::InvalidDestination(format!("no destination for `{queue}`"))
        })?;
        let retry = destination.retry;
        let response = self
            .http
            .post(self.url(&format!("/v2/schedules/{}", destination.url)))
            .header(AUTHORIZATION, self.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("upstash-cron", cron)
            .header("upstash-schedule-id", schedule_id)
            .header("upstash-retries", retry.retries_header())
            .header("upstash-retry-delay", retry.retry_delay_expression())
            .body(body)
            .send()
            .await
            .map_err(QStashError::Unreachable)?;
        let text = api_text(response).await?;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Created {
            schedule_id: String,
        }
        let created: Created = serde_json::from_str(&text).map_err(|e| QStashError::Api {
            status: 200,
            message: format!("unexpected body: {e}"),
        })?;
        Ok(created.schedule_id)
    }

    /// Every schedule of the account.
    pub async fn schedules(&self) -> Result<Vec<Schedule>, QStashError> {
        let text = self.call(Method::GET, "/v2/schedules", None).await?;
        serde_json::from_str(&text).map_err(|e| QStashError::Api {
            status: 200,
            message: format!("unexpected body: {e}"),
        })
    }

    /// Deletes schedule `schedule_id`.
    pub async fn schedule_delete(&self, schedule_id: &str) -> Result<(), QStashError> {
        self.call(
            Method::DELETE,
            &format!("/v2/schedules/{schedule_id}"),
            None,
        )
        .await?;
        Ok(())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<String, QStashError> {
        let mut request = self
            .http
            .request(method, self.url(path))
            .header(AUTHORIZATION, self.auth.clone());
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(QStashError::Unreachable)?;
        api_text(response).await
    }
}

async fn api_text(response: reqwest::Response) -> Result<String, QStashError> {
    let status = response.status();
    let text = response.text().await.map_err(QStashError::Unreachable)?;
    if status.is_success() {
        Ok(text)
    } else {
        Err(QStashError::Api {
            status: status.as_u16(),
            message: error_message(&text),
        })
    }
}

/// When a message should be delivered.
#[derive(Debug, Clone, Copy)]
enum When {
    Now,
    Delay(Duration),
    At(SystemTime),
}

impl When {
    /// When `opts` ask for: a delay (`Upstash-Delay`), a time (`Upstash-Not-Before`, so no
    /// clock of ours turns it into a delay), or at once; both at once refused.
    fn of(queue: &QueueName, opts: &PublishOptions) -> Result<When, QueueError> {
        match (opts.delay_value(), opts.run_at_value()) {
            (Some(_), Some(_)) => Err(QueueError::Rejected {
                queue: queue.clone(),
                reason: "a publish takes a delay or a run_at, not both".to_owned(),
            }),
            (Some(delay), None) => Ok(When::Delay(delay)),
            (None, Some(at)) => Ok(When::At(at)),
            (None, None) => Ok(When::Now),
        }
    }
}

#[async_trait]
impl QueuePort for QStashQueue {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let body = envelope.encode_for(queue, &self.limits)?;
        let key = opts.dedup_key_for(envelope);
        let when = When::of(queue, &opts)?;
        let receipt = self
            .send_publish(queue, body, Some(&key), when, &[], None)
            .await?;
        tracing::debug!(
            queue = %queue,
            job_id = %envelope.job_id,
            tenant_id = %envelope.tenant_id,
            correlation_id = %envelope.correlation_id,
            kind = %envelope.kind,
            duplicate = receipt.duplicate,
            "published to QStash"
        );
        Ok(receipt)
    }
}

impl QStashQueue {
    /// Whether QStash answers an authenticated call (`GET /v2/queues`), whatever the
    /// destinations: what a worker's readiness means on QStash, which reports depth only for
    /// its own queues. `Rejected` for a token QStash refuses, `Unavailable` when it does not
    /// answer.
    pub async fn ping(&self) -> Result<(), QueueError> {
        let any: QueueName = "qstash".parse().expect("a valid name");
        let response = self
            .http
            .get(self.url("/v2/queues"))
            .header(AUTHORIZATION, self.auth.clone())
            .send()
            .await
            .map_err(|e| unavailable(&any, e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = retry_after(response.headers());
        let text = response.text().await.unwrap_or_default();
        Err(status_error(&any, status, retry_after, &text))
    }
}

#[async_trait]
impl QueueDepth for QStashQueue {
    /// `lag` of the queue's QStash queue as `ready` (QStash does not split delayed from ready
    /// or in flight); 0 for a QStash queue that does not exist yet. A queue not published
    /// through a QStash queue has no depth: `Rejected`.
    async fn depth(&self, queue: &QueueName) -> Result<Depth, QueueError> {
        let destination = self.destination(queue)?;
        let Some(name) = &destination.qstash_queue else {
            return Err(QueueError::Rejected {
                queue: queue.clone(),
                reason: "QStash reports depth only for QStash queues; configure one with Destination::via_queue".into(),
            });
        };
        let response = self
            .http
            .get(self.url(&format!("/v2/queues/{name}")))
            .header(AUTHORIZATION, self.auth.clone())
            .send()
            .await
            .map_err(|e| unavailable(queue, e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(|e| unavailable(queue, e))?;
        if status == StatusCode::NOT_FOUND {
            return Ok(Depth::ready_only(0));
        }
        if !status.is_success() {
            return Err(status_error(queue, status, retry_after, &text));
        }
        let body: Value = serde_json::from_str(&text).map_err(|e| QueueError::Unavailable {
            queue: queue.clone(),
            message: "unexpected queue body".into(),
            source: Some(Box::new(e)),
        })?;
        let lag = body.get("lag").and_then(Value::as_u64).unwrap_or(0);
        Ok(Depth::ready_only(lag))
    }
}

/// The flow-control key of `tenant`'s messages on `queue`: per queue, so that a tenant's cap
/// on one queue does not hold back its messages on another.
fn flow_control_key(queue: &QueueName, tenant: TenantId) -> String {
    format!("{}-{tenant}", queue.as_str().replace('.', "_"))
}

fn unavailable(queue: &QueueName, e: reqwest::Error) -> QueueError {
    QueueError::Unavailable {
        queue: queue.clone(),
        message: if e.is_timeout() {
            "QStash timed out".into()
        } else {
            "QStash is unreachable".into()
        },
        source: Some(Box::new(e)),
    }
}

/// `Retry-After`, else `Burst-RateLimit-Reset` (seconds), bounded
/// ([`jobs_core::parse_retry_after`]; a date is measured from the response's `Date`).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(HeaderName::from_bytes(name.as_bytes()).ok()?)
            .and_then(|v| v.to_str().ok())
    };
    let date = header("date").and_then(jobs_core::parse_http_date);
    let wait = |name| jobs_core::parse_retry_after(header(name)?, date);
    wait("retry-after").or_else(|| wait("burst-ratelimit-reset"))
}

fn status_error(
    queue: &QueueName,
    status: StatusCode,
    retry_after: Option<Duration>,
    text: &str,
) -> QueueError {
    let message = error_message(text);
    if status == StatusCode::TOO_MANY_REQUESTS {
        QueueError::RateLimited {
            queue: queue.clone(),
            retry_after,
        }
    } else if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
        QueueError::Unavailable {
            queue: queue.clone(),
            message: format!("QStash answered {status}: {message}"),
            source: None,
        }
    } else {
        QueueError::Rejected {
            queue: queue.clone(),
            reason: format!("QStash answered {status}: {message}"),
        }
    }
}

/// QStash's `error`, or the start of the body.
fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| text.chars().take(MAX_DETAIL_CHARS).collect())
}

fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

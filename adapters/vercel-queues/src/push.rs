//! Push consumption: Vercel calls an HTTP route of ours once per message.
//!
//! The callback is binary mode (`ce-type: com.vercel.queue.v2beta`): `ce-vqsqueuename`,
//! `ce-vqsconsumergroup` and `ce-vqsmessageid` always; when the payload is pushed too,
//! `ce-vqsreceipthandle`, `ce-vqsdeliverycount`, `ce-vqsvisibilitydeadline` and the payload as
//! the body. Without a receipt handle the message is received by id. Either way the result is
//! a [`Delivery`] for the same runtime as pull consumption, settled through the same lease
//! calls; the HTTP answer only tells Vercel whether the callback worked:
//!
//! | [`PushReply`] | status | body |
//! |---|---|---|
//! | `Success` | 200 | `{"status":"success"}` |
//! | `Skipped` | 200 | `{"status":"skipped","reason":…,"messageId":…}` |
//! | `BadRequest` | 400 | `{"error":…}` |
//! | `Failed` | 500 | `{"error":"Failed to process queue message"}` |
//!
//! Nothing here depends on a web framework: give [`VercelQueues::handle_push`] the request's
//! headers and body, and turn the reply into your framework's response.
//!
//! Callbacks carry no signature, so a pushed payload runs only after its receipt handle is
//! confirmed as a live lease of ours (a visibility change with our credentials), unless the
//! configuration trusts pushed payloads (`VercelQueuesConfig::trust_pushed_payload`).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobs_core::{Delivery, Lease, QueueError, QueueName};
use reqwest::header::{ACCEPT, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use thiserror::Error;

use crate::http::Call;
use crate::topic::{TopicError, check_vercel_name, queue_of_topic};
use crate::{MAX_VISIBILITY, VercelQueues, parse_parts, seconds};

/// The lease a pushed message gets when the callback does not say (Vercel's push default).
pub const DEFAULT_PUSH_LEASE: Duration = Duration::from_secs(300);

/// The message a callback announces, and the message itself when it was pushed along.
#[derive(Debug, Clone)]
pub struct PushCallback {
    queue: QueueName,
    topic: String,
    consumer_group: String,
    message_id: String,
    pushed: Option<Pushed>,
}

#[derive(Debug, Clone)]
struct Pushed {
    receipt_handle: String,
    delivery_count: u32,
    visibility_deadline: Option<SystemTime>,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// A callback that is not a Vercel Queues binary-mode callback for one of our queues.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PushError {
    /// A header Vercel always sends is missing.
    #[error("missing header `{0}`")]
    Missing(&'static str),
    /// A header holds something Vercel never sends.
    #[error("header `{name}` is invalid: {reason}")]
    Invalid {
        /// The header.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The topic is not one of our queues.
    #[error("header `ce-vqsqueuename`: {0}")]
    Topic(#[from] TopicError),
}

impl PushCallback {
    /// Reads a callback from its headers and body.
    pub fn parse(headers: &HeaderMap, body: Vec<u8>) -> Result<PushCallback, PushError> {
        let text = |name: &'static str| -> Result<Option<&str>, PushError> {
            headers
                .get(name)
                .map(|v| {
                    v.to_str().map_err(|_| PushError::Invalid {
                        name,
                        reason: "not visible ASCII".into(),
                    })
                })
                .transpose()
        };
        let required = |name: &'static str| text(name)?.ok_or(PushError::Missing(name));
        if let Some(kind) = text("ce-type")?
            && kind != "com.vercel.queue.v2beta"
        {
            return Err(PushError::Invalid {
                name: "ce-type",
                reason: format!("`{kind}` is not com.vercel.queue.v2beta (binary mode)"),
            });
        }
        let topic = required("ce-vqsqueuename")?.to_owned();
        let queue = queue_of_topic(&topic)?;
        let consumer_group = required("ce-vqsconsumergroup")?.to_owned();
        check_vercel_name("consumer group", &consumer_group).map_err(|e| PushError::Invalid {
            name: "ce-vqsconsumergroup",
            reason: e.to_string(),
        })?;
        let message_id = required("ce-vqsmessageid")?.to_owned();
        let pushed = match text("ce-vqsreceipthandle")? {
            None => None,
            Some(receipt_handle) => {
                let count = required("ce-vqsdeliverycount")?;
                let delivery_count = count.parse().map_err(|_| PushError::Invalid {
                    name: "ce-vqsdeliverycount",
                    reason: format!("`{count}` is not a count"),
                })?;
                Some(Pushed {
                    receipt_handle: receipt_handle.to_owned(),
                    delivery_count,
                    visibility_deadline: text("ce-vqsvisibilitydeadline")?.and_then(parse_utc),
                    content_type: text("content-type")?.map(str::to_owned),
                    body,
                })
            }
        };
        Ok(PushCallback {
            queue,
            topic,
            consumer_group,
            message_id,
            pushed,
        })
    }

    /// The queue the message belongs to.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// Vercel's message id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Whether the payload came with the callback (else it is received by id).
    pub fn has_payload(&self) -> bool {
        self.pushed.is_some()
    }
}

/// Why a callback's message was not handed to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Vercel says it was acked already (410).
    AlreadyProcessed,
    /// It is leased to someone else, expired, or a duplicate (404, 409).
    NotAvailable,
}

impl SkipReason {
    fn as_str(self) -> &'static str {
        match self {
            SkipReason::AlreadyProcessed => "already_processed",
            SkipReason::NotAvailable => "not_available",
        }
    }
}

/// What to answer Vercel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushReply {
    /// The runtime settled the delivery (processed, retried, deferred or dead-lettered).
    Success,
    /// There was nothing to do for this callback.
    Skipped {
        /// Why.
        reason: SkipReason,
        /// The message named by the callback.
        message_id: String,
    },
    /// The request is not a callback we understand.
    BadRequest(String),
    /// Nothing could be settled; Vercel delivers the message again after its lease.
    Failed,
}

impl PushReply {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            PushReply::Success | PushReply::Skipped { .. } => 200,
            PushReply::BadRequest(_) => 400,
            PushReply::Failed => 500,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let value = match self {
            PushReply::Success => serde_json::json!({ "status": "success" }),
            PushReply::Skipped { reason, message_id } => serde_json::json!({
                "status": "skipped",
                "reason": reason.as_str(),
                "messageId": message_id,
            }),
            PushReply::BadRequest(error) => serde_json::json!({ "error": error }),
            PushReply::Failed => serde_json::json!({ "error": "Failed to process queue message" }),
        };
        value.to_string()
    }
}

/// The message of a callback, ready for the runtime, or why there is none.
#[derive(Debug)]
pub enum PushTake {
    /// Process it.
    Delivery(Delivery),
    /// Answer this without processing.
    Skipped(PushReply),
}

impl VercelQueues {
    /// The delivery a callback carries, received by id when it came without the payload.
    pub async fn take_push(&self, callback: PushCallback) -> Result<PushTake, QueueError> {
        let now = self.clock.now();
        let PushCallback {
            queue,
            topic,
            consumer_group,
            message_id,
            pushed,
        } = callback;
        // A callback for another consumer group would take its message from that group's own
        // consumers: refused before any call to Vercel.
        let ours = &self.config().consumer_group;
        if consumer_group != *ours {
            tracing::warn!(%queue, %message_id, group = %consumer_group, "a callback named another consumer group; refused");
            return Ok(PushTake::Skipped(PushReply::BadRequest(format!(
                "this process consumes as consumer group `{ours}`, not `{consumer_group}`"
            ))));
        }
        if let Some(p) = pushed {
            let attempt =
                crate::attempts_spent(p.content_type.as_deref()) + p.delivery_count.max(1);
            let expires = p.visibility_deadline.unwrap_or(now + DEFAULT_PUSH_LEASE);
            if !self.config().trust_pushed_payload {
                // The message is leased to this callback, so receiving it by id would be
                // refused (409): the lease itself is what can be checked.
                let lease = Lease::new(
                    queue.clone(),
                    crate::lease_token(&consumer_group, &p.receipt_handle),
                    expires,
                );
                let secs = seconds(expires.duration_since(now).unwrap_or_default())
                    .clamp(1, MAX_VISIBILITY.as_secs());
                match self.confirm_lease(&lease, secs).await {
                    Ok(()) => {}
                    Err(QueueError::LeaseLost { .. }) => {
                        tracing::warn!(%queue, %message_id, "a pushed callback's receipt handle is no lease of ours; nothing runs");
                        return Ok(PushTake::Skipped(PushReply::Skipped {
                            reason: SkipReason::NotAvailable,
                            message_id,
                        }));
                    }
                    Err(e) => return Err(e),
                }
            }
            return Ok(PushTake::Delivery(self.track(
                &queue,
                &consumer_group,
                &p.receipt_handle,
                message_id,
                p.delivery_count,
                attempt,
                p.body,
                expires,
            )));
        }
        let secs = seconds(DEFAULT_PUSH_LEASE).min(MAX_VISIBILITY.as_secs());
        let path = [
            topic.as_str(),
            "consumer",
            &consumer_group,
            "id",
            &message_id,
        ];
        let call = Call::new(Method::POST, &path)
            .header(ACCEPT, HeaderValue::from_static("multipart/mixed"))
            .header(crate::VISIBILITY_TIMEOUT, secs.into());
        let answer = self.http.send(&queue, call).await?;
        let skipped = |reason| {
            Ok(PushTake::Skipped(PushReply::Skipped {
                reason,
                message_id: message_id.clone(),
            }))
        };
        match answer.status {
            StatusCode::OK => {}
            StatusCode::GONE => return skipped(SkipReason::AlreadyProcessed),
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => {
                return skipped(SkipReason::NotAvailable);
            }
            _ => return Err(answer.rejected(&queue)),
        }
        let part = parse_parts(&queue, &answer)?
            .into_iter()
            .next()
            .ok_or_else(|| {
                crate::unavailable(&queue, "receive by id answered no message".into())
            })?;
        let expires = now + Duration::from_secs(secs);
        self.deliver(&queue, &consumer_group, part, expires)
            .map(PushTake::Delivery)
    }

    /// Handles one callback end to end: parses it, refuses one naming another consumer group
    /// than this adapter's (400, before any call to Vercel), takes its delivery within
    /// [`TAKE_WITHIN`] (else 500: Vercel delivers again), lets `process` run it through the
    /// runtime (returning whether the runtime settled it), and says what to answer.
    ///
    /// ```no_run
    /// # async fn route(queues: jobs_adapter_vercel_queues::VercelQueues,
    /// #     headers: reqwest::header::HeaderMap, body: Vec<u8>) -> (u16, String) {
    /// let reply = queues
    ///     .handle_push(&headers, body, |delivery| async move {
    ///         // worker.process(delivery).await is not Outcome::Unsettled
    ///         # let _ = delivery;
    ///         true
    ///     })
    ///     .await;
    /// (reply.status(), reply.body())
    /// # }
    /// ```
    pub async fn handle_push<F, Fut>(
        &self,
        headers: &HeaderMap,
        body: Vec<u8>,
        process: F,
    ) -> PushReply
    where
        F: FnOnce(Delivery) -> Fut,
        Fut: Future<Output = bool>,
    {
        let callback = match PushCallback::parse(headers, body) {
            Ok(callback) => callback,
            Err(e) => return PushReply::BadRequest(e.to_string()),
        };
        let message_id = callback.message_id.clone();
        // However Vercel answers (or not), taking the message costs at most this long: its
        // retries are cut off with it, and Vercel delivers again after the lease.
        let taken = tokio::time::timeout(TAKE_WITHIN, self.take_push(callback)).await;
        let Ok(taken) = taken else {
            tracing::warn!(%message_id, within = ?TAKE_WITHIN, "Vercel did not confirm a pushed message in time");
            return PushReply::Failed;
        };
        match taken {
            Ok(PushTake::Delivery(delivery)) => {
                if process(delivery).await {
                    PushReply::Success
                } else {
                    PushReply::Failed
                }
            }
            Ok(PushTake::Skipped(reply)) => reply,
            Err(error) => {
                tracing::warn!(%message_id, %error, "taking a pushed message failed");
                PushReply::Failed
            }
        }
    }
}

/// The longest a callback waits for Vercel to confirm or hand over its message, retries
/// included: a callback Vercel does not answer holds its connection this long, not minutes.
pub const TAKE_WITHIN: Duration = Duration::from_secs(10);

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, the form Vercel writes its timestamps in.
fn parse_utc(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(str::parse::<u64>);
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction.chars().take(9).collect();
        digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32)
    };
    // Days since the epoch of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(UNIX_EPOCH + Duration::new(days * 86_400 + h * 3600 + min * 60 + s, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vercels_timestamps() {
        let t = |s| parse_utc(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64());
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(t("2026-01-01T00:00:30Z"), Some(1_767_225_630.0));
        assert_eq!(t("2024-02-29T12:00:00.5Z"), Some(1_709_208_000.5));
        assert_eq!(t("2026-13-01T00:00:00Z"), None);
        assert_eq!(t("2026-01-01T00:00:00+01:00"), None);
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    reqwest::header::HeaderName::from_static(k),
                    v.parse().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn callbacks_name_what_is_wrong() {
        let err = PushCallback::parse(&headers(&[]), vec![]).unwrap_err();
        assert_eq!(err.to_string(), "missing header `ce-vqsqueuename`");
        let err = PushCallback::parse(
            &headers(&[
                ("ce-vqsqueuename", "Not.Ours"),
                ("ce-vqsconsumergroup", "g"),
            ]),
            vec![],
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("header `ce-vqsqueuename`"),
            "{err}"
        );
        let err = PushCallback::parse(
            &headers(&[
                ("ce-vqsqueuename", "jobs-email"),
                ("ce-vqsconsumergroup", "g"),
                ("ce-vqsmessageid", "m1"),
                ("ce-vqsreceipthandle", "rh"),
                ("ce-vqsdeliverycount", "two"),
            ]),
            vec![],
        )
        .unwrap_err();
        assert!(err.to_string().contains("ce-vqsdeliverycount"), "{err}");
        let ok = PushCallback::parse(
            &headers(&[
                ("ce-type", "com.vercel.queue.v2beta"),
                ("ce-vqsqueuename", "jobs-email"),
                ("ce-vqsconsumergroup", "g"),
                ("ce-vqsmessageid", "m1"),
            ]),
            vec![],
        )
        .unwrap();
        assert_eq!(ok.queue().as_str(), "jobs.email");
        assert!(!ok.has_payload());
    }

    #[test]
    fn replies_are_what_vercel_expects() {
        assert_eq!(PushReply::Success.status(), 200);
        assert_eq!(PushReply::Success.body(), r#"{"status":"success"}"#);
        let skipped = PushReply::Skipped {
            reason: SkipReason::AlreadyProcessed,
            message_id: "m".into(),
        };
        assert_eq!(skipped.status(), 200);
        assert!(skipped.body().contains(r#""reason":"already_processed""#));
        assert_eq!(PushReply::Failed.status(), 500);
        assert_eq!(PushReply::BadRequest("x".into()).status(), 400);
    }
}

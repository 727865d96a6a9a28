//! Sending email through a provider, as the notification rails need it.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::error::ErrorClass;

/// One email of a batch.
///
/// Serialisable so that a chunk of a blast can travel as a job's data; absent optional fields
/// are left out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Email {
    /// The sender, e.g. `Acme <billing@acme.test>`.
    pub from: String,
    /// The recipients.
    pub to: Vec<String>,
    /// The subject line.
    pub subject: String,
    /// The HTML body, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// The plain-text body, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Where replies go, if not to the sender.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Provider tags (name, value), for analytics.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<(String, String)>,
}

impl Email {
    /// An email from `from` to `to` with `subject`; bodies and the rest are set on the fields.
    pub fn new(from: impl Into<String>, to: Vec<String>, subject: impl Into<String>) -> Self {
        Email {
            from: from.into(),
            to,
            subject: subject.into(),
            ..Email::default()
        }
    }
}

/// A provider that sends emails in batches.
///
/// Blasts go through batches only: one request per batch of at most
/// [`EmailProvider::max_batch`] emails, with an idempotency key so that a retried batch is
/// never sent twice.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait EmailProvider: Send + Sync {
    /// The most emails one request may carry.
    fn max_batch(&self) -> usize;

    /// Sends `emails` (1 to [`EmailProvider::max_batch`]) in one request; a repeat with the same
    /// `idempotency_key` and the same emails is answered without sending again. Returns the
    /// provider's message ids, in order.
    async fn send_batch(
        &self,
        emails: &[Email],
        idempotency_key: &str,
    ) -> Result<Vec<String>, EmailError>;
}

/// A failed send.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EmailError {
    /// The provider said 429: back off until `retry_after` (or a default), never drop. Not a
    /// failed attempt.
    #[error("the email provider is rate limiting{}", retry_after.map(|d| format!("; retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        /// When the provider said to come back.
        retry_after: Option<Duration>,
    },
    /// The provider refused the request and will refuse it again (validation, credentials).
    #[error("the email provider refused the batch ({status}): {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The provider could not be reached or failed transiently (timeouts, 5xx).
    #[error("the email provider is unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl EmailError {
    /// Whether a later try may succeed (a rate limit is retryable, and is a deferral).
    pub fn class(&self) -> ErrorClass {
        match self {
            EmailError::Rejected { .. } => ErrorClass::Permanent,
            EmailError::RateLimited { .. } | EmailError::Unavailable { .. } => {
                ErrorClass::Retryable
            }
        }
    }
}

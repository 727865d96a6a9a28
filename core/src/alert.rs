//! Telling a human that jobs are being dead-lettered.

use async_trait::async_trait;
use thiserror::Error;

use crate::name::QueueName;

/// Something an operator must look at: dead letters piling up on a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// The queue concerned.
    pub queue: QueueName,
    /// A one-line summary, e.g. `3 jobs dead-lettered on billing.invoices`.
    pub title: String,
    /// The latest error and where to look.
    pub detail: String,
    /// How many events this alert stands for (alerts are coalesced).
    pub count: u32,
}

/// Where alerts go (BetterStack in production, the console in the demo).
///
/// A failing alerter never blocks dead-lettering: the dead letter is already recorded when the
/// alert is raised, and the runtime logs the failure.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Alerter: Send + Sync {
    /// Raises `alert`.
    async fn alert(&self, alert: &Alert) -> Result<(), AlertError>;
}

/// An alert could not be delivered.
#[derive(Debug, Error)]
#[error("alert not delivered: {message}")]
pub struct AlertError {
    /// What failed.
    pub message: String,
    /// The underlying error.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

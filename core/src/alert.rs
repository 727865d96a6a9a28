//! Telling a human that jobs are being dead-lettered.

use async_trait::async_trait;

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

crate::error::port_error! {
    /// An alert could not be delivered.
    pub enum AlertError {
        /// The alerting service could not be reached or failed transiently (a timeout, a 5xx,
        /// a rate limit): a later alert may go through.
        Unavailable => "alert not delivered: {message}", Retryable;
        /// The alerting service refused it and will again (credentials, a field it rejects):
        /// the configuration needs fixing.
        Refused => "alert refused: {message}", Permanent;
    }
}

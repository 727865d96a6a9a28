//! Why the adapter could not be built, and failures of QStash's operator endpoints. Publishing
//! failures are the port's [`jobs_core::QueueError`].

use std::time::Duration;

use thiserror::Error;

/// A configuration mistake, or a failed call to one of QStash's operator endpoints (DLQ,
/// schedules, queues). No variant ever carries the token.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QStashError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("configuration problem: invalid QStash base URL {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token is empty or cannot be sent in an HTTP header (its value is not repeated).
    #[error("configuration problem: the QStash token is empty or not a valid header value")]
    InvalidToken,
    /// A destination URL is not an absolute `http` or `https` URL.
    #[error("configuration problem: invalid destination URL {0:?}")]
    InvalidDestination(String),
    /// A retry schedule that makes no sense.
    #[error(
        "configuration problem: retry schedule of {max_attempts} attempts, base {base:?}, cap {cap:?} (needs at least 1 attempt, a base of at least 1 ms, and cap >= base)"
    )]
    InvalidRetrySchedule {
        /// Attempts in total.
        max_attempts: u32,
        /// The base delay.
        base: Duration,
        /// The cap.
        cap: Duration,
    },
    /// The HTTP client could not be built (TLS set-up).
    #[error("could not build the HTTP client for QStash")]
    Client(#[source] reqwest::Error),
    /// QStash could not be reached or timed out.
    #[error("QStash is unreachable: {0}")]
    Unreachable(#[source] reqwest::Error),
    /// QStash answered an error.
    #[error("QStash answered {status}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// QStash's `error`, or the start of the body.
        message: String,
    },
}

//! Why the provider could not be built. Sending failures are the port's [`jobs_core::EmailError`].

use thiserror::Error;

/// The provider could not be built from its configuration.
///
/// No variant ever carries the API key.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ResendError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("configuration problem: invalid Resend base URL {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The API key is empty or cannot be sent in an HTTP header (its value is not repeated).
    #[error("configuration problem: the Resend API key is empty or not a valid header value")]
    InvalidApiKey,
    /// The user agent is empty or not a valid header value; Resend requires one.
    #[error(
        "configuration problem: the Resend user agent is empty or not a valid header value (Resend requires one)"
    )]
    InvalidUserAgent,
    /// The HTTP client could not be built (TLS set-up).
    #[error("could not build the HTTP client for Resend")]
    Client(#[source] reqwest::Error),
}

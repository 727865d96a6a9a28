//! Why an incident was not created, typed so that the caller can tell a misconfiguration (fix
//! the deployment) from a passing fault (the next alert may get through).

use std::time::Duration;

use jobs_core::AlertError;
use reqwest::StatusCode;
use thiserror::Error;

/// An incident could not be created, or the alerter could not be built.
///
/// No variant ever carries the team token: response bodies are scrubbed of it before they are
/// kept. Converts into [`AlertError`] with the whole cause chain in its message.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BetterStackError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("configuration problem: invalid BetterStack base URL {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token is empty or cannot be sent in an HTTP header (its value is not repeated).
    #[error(
        "configuration problem: the BetterStack team token is empty or not a valid header value"
    )]
    InvalidToken,
    /// No requester e-mail is configured; BetterStack requires one to create an incident.
    #[error("configuration problem: the BetterStack requester e-mail is empty")]
    MissingRequesterEmail,
    /// The HTTP client could not be built (TLS set-up).
    #[error("could not build the HTTP client for BetterStack")]
    Client(#[source] reqwest::Error),
    /// The request did not complete: connection refused or reset, DNS, TLS, or the timeout.
    #[error("request to BetterStack failed")]
    Transport(#[source] reqwest::Error),
    /// 401 or 403: the token is wrong, revoked, or not allowed on this team.
    #[error(
        "configuration problem: unauthorized, BetterStack answered HTTP {}: {detail}; check the Uptime team API token (and team_name for a global token)",
        status_text(*.status)
    )]
    Unauthorized {
        /// The HTTP status, 401 or 403.
        status: u16,
        /// BetterStack's error text.
        detail: String,
    },
    /// 422: BetterStack refused the incident's fields.
    #[error(
        "configuration problem: BetterStack rejected the incident, HTTP {}: {detail}; check requester_email (a user of the team), policy_id and team_name",
        status_text(422)
    )]
    Invalid {
        /// BetterStack's error text.
        detail: String,
    },
    /// 429: too many requests; `retry_after` is BetterStack's `Retry-After`, when given.
    #[error("rate limited, BetterStack answered HTTP {}{}: {detail}", status_text(429), retry_hint(*.retry_after))]
    RateLimited {
        /// How long BetterStack asks us to wait.
        retry_after: Option<Duration>,
        /// BetterStack's error text.
        detail: String,
    },
    /// Any other non-success status, typically a 5xx outage.
    #[error("BetterStack answered HTTP {}: {detail}", status_text(*.status))]
    Status {
        /// The HTTP status.
        status: u16,
        /// BetterStack's error text, or the start of the body.
        detail: String,
    },
    /// A success status without a JSON:API incident in the body (a proxy or a wrong base URL).
    #[error("BetterStack answered HTTP {} without an incident in the body: {detail}", status_text(*.status))]
    UnexpectedResponse {
        /// The HTTP status.
        status: u16,
        /// Why the body is not an incident, and its start.
        detail: String,
    },
}

impl BetterStackError {
    /// Whether retrying cannot help until the configuration changes (bad token, URL, requester,
    /// policy or team): operators should be told about these at startup or loudly.
    pub fn is_configuration_problem(&self) -> bool {
        matches!(
            self,
            BetterStackError::InvalidBaseUrl { .. }
                | BetterStackError::InvalidToken
                | BetterStackError::MissingRequesterEmail
                | BetterStackError::Unauthorized { .. }
                | BetterStackError::Invalid { .. }
        )
    }
}

impl From<BetterStackError> for AlertError {
    /// The message is the error and its causes joined by `: `, so that one log line says it
    /// all; a configuration problem is `Refused`, the rest `Unavailable`.
    fn from(err: BetterStackError) -> Self {
        let mut message = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(inner) = cause {
            message.push_str(": ");
            message.push_str(&inner.to_string());
            cause = inner.source();
        }
        let refused = err.is_configuration_problem();
        let source = Some(Box::new(err) as Box<dyn std::error::Error + Send + Sync>);
        if refused {
            AlertError::Refused { message, source }
        } else {
            AlertError::Unavailable { message, source }
        }
    }
}

/// `401 Unauthorized`: the code with its reason phrase when it has one.
fn status_text(status: u16) -> String {
    match StatusCode::from_u16(status)
        .ok()
        .and_then(|code| code.canonical_reason())
    {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

fn retry_hint(retry_after: Option<Duration>) -> String {
    retry_after
        .map(|wait| format!(" (retry after {} s)", wait.as_secs()))
        .unwrap_or_default()
}

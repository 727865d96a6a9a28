//! What the provider needs to know: where Resend is, the API key, who we are, and how long to wait.

use std::fmt;
use std::time::Duration;

/// The Resend API, the default [`ResendConfig`] base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.resend.com";

/// How long one batch request may take, connection included, by default.
///
/// A batch of 100 emails is one small POST; thirty seconds leaves room for Resend to validate
/// all of them while bounding how long an outage can hold a worker.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The `User-Agent` sent by default: `softcrum-jobs/<version>`. Resend refuses requests
/// without one (403).
pub const DEFAULT_USER_AGENT: &str = concat!("softcrum-jobs/", env!("CARGO_PKG_VERSION"));

/// How Resend validates a batch (`x-batch-validation`).
///
/// Only strict validation is offered: the whole batch is refused when one email is invalid, so
/// a batch is either sent entirely or not at all, and the ids answered match the emails one for
/// one. Resend's permissive mode (sending the valid emails and reporting the others) would break
/// that, and is deliberately not supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BatchValidation {
    /// `x-batch-validation: strict`: one invalid email fails the whole batch.
    #[default]
    Strict,
}

impl BatchValidation {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchValidation::Strict => "strict",
        }
    }
}

/// How batches are sent: the endpoint, the API key, the user agent, the timeout and the
/// validation mode.
///
/// Built with [`ResendConfig::new`] and the `with_*` methods. Defaults: [`DEFAULT_BASE_URL`],
/// [`DEFAULT_USER_AGENT`], [`DEFAULT_TIMEOUT`] and [`BatchValidation::Strict`].
///
/// The API key is a secret: `Debug` prints `<redacted>` in its place.
///
/// ```
/// use jobs_adapter_resend::ResendConfig;
///
/// let config = ResendConfig::new("re_secret").with_base_url("http://127.0.0.1:8080");
/// assert!(!format!("{config:?}").contains("re_secret"));
/// ```
#[derive(Clone)]
pub struct ResendConfig {
    pub(crate) base_url: String,
    pub(crate) api_key: String,
    pub(crate) user_agent: String,
    pub(crate) timeout: Duration,
    pub(crate) validation: BatchValidation,
}

impl ResendConfig {
    /// A configuration sending with the API key `api_key` (`re_…`), with the defaults above.
    pub fn new(api_key: impl Into<String>) -> Self {
        ResendConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: api_key.into(),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            validation: BatchValidation::Strict,
        }
    }

    /// Sends requests to `base_url` (scheme, host and optional path prefix) instead of
    /// [`DEFAULT_BASE_URL`]: for a local fake in tests, or a proxy.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Sends `user_agent` instead of [`DEFAULT_USER_AGENT`]; it must not be empty.
    pub fn with_user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Bounds each request, connection included, to `timeout` instead of [`DEFAULT_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the batch validation mode (only [`BatchValidation::Strict`] exists).
    pub fn with_validation(mut self, validation: BatchValidation) -> Self {
        self.validation = validation;
        self
    }
}

impl fmt::Debug for ResendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResendConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("user_agent", &self.user_agent)
            .field("timeout", &self.timeout)
            .field("validation", &self.validation)
            .finish()
    }
}

//! Where the adapter sends, as whom, and with which limits.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::Url;
use thiserror::Error;

use crate::topic::{NameError, check_vercel_name};

/// The longest retention Vercel Queues keeps a message: 7 days.
pub const MAX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest retention Vercel Queues accepts: 60 s.
pub const MIN_RETENTION: Duration = Duration::from_secs(60);
/// The retention Vercel applies when none is sent: 24 h.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The longest visibility timeout (lease) one request can set: 1 h.
pub const MAX_VISIBILITY: Duration = Duration::from_secs(3600);
/// The most messages one receive returns.
pub const MAX_RECEIVE: usize = 10;
/// The longest idempotency key Vercel accepts, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// A Vercel region such as `iad1`: `^[a-z]{2,5}[0-9]{1,2}$`. Messages are consumable only in
/// the region they were sent to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region(String);

impl Region {
    /// Validates `region`.
    pub fn new(region: &str) -> Result<Region, ConfigError> {
        let letters = region.bytes().take_while(u8::is_ascii_lowercase).count();
        let digits = region.len() - letters;
        let valid = (2..=5).contains(&letters)
            && (1..=2).contains(&digits)
            && region.bytes().skip(letters).all(|b| b.is_ascii_digit());
        if valid {
            Ok(Region(region.to_owned()))
        } else {
            Err(ConfigError::Region(region.to_owned()))
        }
    }

    /// The region's API base URL, `https://{region}.vercel-queue.com`.
    pub fn base_url(&self) -> Url {
        Url::parse(&format!("https://{}.vercel-queue.com", self.0))
            .expect("a validated region makes a valid host")
    }

    /// The region's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A bearer token and when it stops being valid.
#[derive(Clone)]
pub struct AccessToken {
    secret: String,
    expires_at: Option<SystemTime>,
}

impl AccessToken {
    /// A token valid until `expires_at` (`None`: until the server refuses it).
    pub fn new(secret: impl Into<String>, expires_at: Option<SystemTime>) -> AccessToken {
        AccessToken {
            secret: secret.into(),
            expires_at,
        }
    }

    /// The bearer secret.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// When it expires, when known.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessToken")
            .field("secret", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where OIDC tokens come from (Vercel's runtime, a secret store, a test).
///
/// The adapter caches the token it gets and asks again shortly before it expires, or after the
/// server refused it with 401.
#[async_trait]
pub trait TokenSource: Send + Sync {
    /// A currently valid token.
    async fn token(&self) -> Result<AccessToken, TokenError>;
}

/// A token source that could not produce a token.
#[derive(Debug, Error)]
#[error("getting a Vercel OIDC token failed: {message}")]
pub struct TokenError {
    message: String,
}

impl TokenError {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> TokenError {
        TokenError {
            message: message.into(),
        }
    }
}

/// A fixed token from configuration, with no known expiry.
#[derive(Clone)]
pub struct StaticToken(AccessToken);

impl StaticToken {
    /// The token `secret`.
    pub fn new(secret: impl Into<String>) -> StaticToken {
        StaticToken(AccessToken::new(secret, None))
    }
}

impl fmt::Debug for StaticToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StaticToken(<redacted>)")
    }
}

#[async_trait]
impl TokenSource for StaticToken {
    async fn token(&self) -> Result<AccessToken, TokenError> {
        Ok(self.0.clone())
    }
}

/// A configuration the adapter refuses.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not a Vercel region.
    #[error(
        "region `{0}` is not a Vercel region (expected 2-5 lowercase letters then 1-2 digits, e.g. `iad1`)"
    )]
    Region(String),
    /// A base URL that does not parse or cannot take path segments.
    #[error("base_url `{0}` is not an http(s) URL")]
    BaseUrl(String),
    /// A consumer group name Vercel would refuse.
    #[error("consumer_group: {0}")]
    ConsumerGroup(#[from] NameError),
    /// A retention outside 60 s – 7 days.
    #[error("retention of {0:?} is outside Vercel's 60 s – 7 days")]
    Retention(Duration),
    /// Building the HTTP client failed.
    #[error("building the HTTP client failed: {0}")]
    Http(#[source] reqwest::Error),
}

/// How the adapter talks to Vercel Queues.
///
/// ```
/// use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueuesConfig};
///
/// let config = VercelQueuesConfig::new(Region::new("iad1").unwrap(), StaticToken::new("oidc"))
///     .consumer_group("workers")
///     .unwrap();
/// assert_eq!(config.base_url().as_str(), "https://iad1.vercel-queue.com/");
/// ```
#[derive(Clone)]
pub struct VercelQueuesConfig {
    pub(crate) base_url: Url,
    pub(crate) region: Region,
    pub(crate) tokens: Arc<dyn TokenSource>,
    pub(crate) consumer_group: String,
    pub(crate) retention: Option<Duration>,
    pub(crate) deployment_id: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) max_backoff: Duration,
    pub(crate) trust_pushed_payload: bool,
}

/// The consumer group used unless configured: one group, every worker sharing its messages.
pub const DEFAULT_CONSUMER_GROUP: &str = "workers";

impl VercelQueuesConfig {
    /// Sends to `region`'s endpoint with tokens from `tokens`; consumer group
    /// [`DEFAULT_CONSUMER_GROUP`], Vercel's default retention, 30 s request timeout, up to
    /// 3 retries of 429/5xx/timeouts within 10 s of backoff.
    pub fn new(region: Region, tokens: impl TokenSource + 'static) -> VercelQueuesConfig {
        VercelQueuesConfig {
            base_url: region.base_url(),
            region,
            tokens: Arc::new(tokens),
            consumer_group: DEFAULT_CONSUMER_GROUP.to_owned(),
            retention: None,
            deployment_id: None,
            timeout: Duration::from_secs(30),
            max_retries: 3,
            max_backoff: Duration::from_secs(10),
            trust_pushed_payload: false,
        }
    }

    /// Sends to `base_url` instead of the region's endpoint (an emulator, a proxy, a test).
    pub fn base_url_override(mut self, base_url: &str) -> Result<VercelQueuesConfig, ConfigError> {
        let url = Url::parse(base_url).map_err(|_| ConfigError::BaseUrl(base_url.to_owned()))?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(ConfigError::BaseUrl(base_url.to_owned()));
        }
        self.base_url = url;
        Ok(self)
    }

    /// Consumes as `group` (Vercel's consumer group: each group receives every message once).
    pub fn consumer_group(mut self, group: &str) -> Result<VercelQueuesConfig, ConfigError> {
        check_vercel_name("consumer group", group)?;
        self.consumer_group = group.to_owned();
        Ok(self)
    }

    /// Keeps messages for `retention` (60 s – 7 days) instead of Vercel's default 24 h; delays
    /// and schedules must fall within it.
    pub fn retention(mut self, retention: Duration) -> Result<VercelQueuesConfig, ConfigError> {
        if !(MIN_RETENTION..=MAX_RETENTION).contains(&retention) {
            return Err(ConfigError::Retention(retention));
        }
        self.retention = Some(retention);
        Ok(self)
    }

    /// Isolates messages per deployment (`Vqs-Deployment-Id`); by default they are shared.
    pub fn deployment_id(mut self, id: impl Into<String>) -> VercelQueuesConfig {
        self.deployment_id = Some(id.into());
        self
    }

    /// Runs a callback's pushed payload without first confirming its receipt handle with
    /// Vercel. Binary-mode callbacks carry no signature: by default a pushed payload runs only
    /// once a visibility change on its receipt handle, made with this adapter's credentials,
    /// shows the lease is real (one extra round trip), so a forged callback with a made-up
    /// handle runs nothing. Trust it only on a route that only the platform can reach.
    pub fn trust_pushed_payload(mut self) -> VercelQueuesConfig {
        self.trust_pushed_payload = true;
        self
    }

    /// Gives up on one HTTP exchange after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> VercelQueuesConfig {
        self.timeout = timeout;
        self
    }

    /// Retries 429, 5xx and timeouts up to `retries` times, backing off exponentially from
    /// 100 ms or as `Retry-After` says, but never waiting longer than `max_backoff` at once:
    /// a longer `Retry-After` is returned to the caller as
    /// [`QueueError::RateLimited`](jobs_core::QueueError::RateLimited).
    pub fn retries(mut self, retries: u32, max_backoff: Duration) -> VercelQueuesConfig {
        self.max_retries = retries;
        self.max_backoff = max_backoff;
        self
    }

    /// The API base URL requests go to.
    pub fn base_url(&self) -> &Url {
        &self.base_url
    }

    /// The region messages are sent to.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The retention messages get: the configured one or Vercel's default.
    pub fn effective_retention(&self) -> Duration {
        self.retention.unwrap_or(DEFAULT_RETENTION)
    }
}

impl fmt::Debug for VercelQueuesConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VercelQueuesConfig")
            .field("base_url", &self.base_url.as_str())
            .field("region", &self.region.as_str())
            .field("consumer_group", &self.consumer_group)
            .field("retention", &self.retention)
            .field("deployment_id", &self.deployment_id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_follow_vercels_pattern() {
        for ok in ["iad1", "fra1", "sfo1", "hnd1", "abcde12", "gru1"] {
            Region::new(ok).unwrap();
        }
        for bad in [
            "", "IAD1", "i1", "iad", "iad123", "abcdef1", "iad1.", "ia-d1",
        ] {
            let err = Region::new(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let base = VercelQueuesConfig::new(Region::new("iad1").unwrap(), StaticToken::new("t"));
        let err = base.clone().consumer_group("a.b").unwrap_err();
        assert!(err.to_string().starts_with("consumer_group:"), "{err}");
        let err = base
            .clone()
            .retention(Duration::from_secs(8 * 86400))
            .unwrap_err();
        assert!(err.to_string().contains("retention"), "{err}");
        let err = base.clone().base_url_override("mailto:x@y").unwrap_err();
        assert!(err.to_string().contains("base_url"), "{err}");
        let ok = base.base_url_override("http://127.0.0.1:9/").unwrap();
        assert_eq!(ok.base_url().as_str(), "http://127.0.0.1:9/");
        assert!(!format!("{:?}", StaticToken::new("secret")).contains("secret"));
    }
}

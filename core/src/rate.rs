//! Rate limiting as a port: token buckets per provider (global) and per tenant (fair use).

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use thiserror::Error;

use crate::error::ErrorClass;

/// A token bucket: `capacity` tokens at most, `refill` tokens added every `interval`.
///
/// Resend's 5 requests/s per team, with no burst beyond it, is `Bucket::new(5, 5,
/// Duration::from_secs(1))`. Only [`Bucket::new`] makes one, so every bucket is valid and
/// limiters need not check again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bucket {
    capacity: u32,
    refill: u32,
    interval: Duration,
}

impl Bucket {
    /// A bucket; `capacity`, `refill` and `interval` must all be positive.
    pub fn new(capacity: u32, refill: u32, interval: Duration) -> Result<Bucket, RateLimitError> {
        if capacity == 0 || refill == 0 || interval.is_zero() {
            return Err(RateLimitError::InvalidBucket(format!(
                "capacity {capacity}, refill {refill} per {interval:?}: all must be positive"
            )));
        }
        Ok(Bucket {
            capacity,
            refill,
            interval,
        })
    }

    /// The most tokens the bucket holds (the burst).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Tokens added per interval.
    pub fn refill(&self) -> u32 {
        self.refill
    }

    /// How often tokens are added.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

/// The name of one bucket, e.g. `provider:resend` or `tenant:<uuid>:resend`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey(String);

impl BucketKey {
    /// The global bucket of a provider, shared by every tenant.
    pub fn provider(provider: &str) -> BucketKey {
        BucketKey(format!("provider:{provider}"))
    }

    /// A tenant's own bucket for a provider.
    pub fn tenant(tenant: crate::TenantId, provider: &str) -> BucketKey {
        BucketKey(format!("tenant:{tenant}:{provider}"))
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The answer to an acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Every bucket gave its tokens.
    Granted,
    /// At least one bucket is short; none was charged. Try again at `retry_at`, when the
    /// shortest bucket will have the tokens (a deferral, not a failed attempt).
    Denied {
        /// When to come back.
        retry_at: SystemTime,
    },
}

/// Token buckets shared by every worker (Redis in production, in-process for the embedded
/// default).
///
/// Implementations use one clock for all callers (the server's, not each worker's), and let
/// idle buckets expire.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait RateLimiter: Send + Sync {
    /// Takes `cost` tokens from every bucket in `buckets`, atomically: all of them or none, so
    /// a tenant that is denied never burns its provider's capacity.
    async fn acquire(
        &self,
        buckets: &[(BucketKey, Bucket)],
        cost: u32,
    ) -> Result<Acquired, RateLimitError>;

    /// Empties `key` until `until`: after a provider's 429 with `Retry-After`, every worker
    /// backs off, not just the one that was told.
    async fn drain_until(
        &self,
        key: &BucketKey,
        bucket: Bucket,
        until: SystemTime,
    ) -> Result<(), RateLimitError>;
}

/// A rate limiter failure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// A bucket that cannot work (zero capacity, refill or interval).
    #[error("invalid bucket: {0}")]
    InvalidBucket(String),
    /// The limiter's store could not be reached.
    #[error("rate limiter unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl RateLimitError {
    /// Whether the same call may succeed later.
    pub fn class(&self) -> ErrorClass {
        match self {
            RateLimitError::InvalidBucket(_) => ErrorClass::Permanent,
            RateLimitError::Unavailable { .. } => ErrorClass::Retryable,
        }
    }
}

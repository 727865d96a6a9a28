//! Redis token buckets for softcrum-jobs: [`RedisRateLimiter`], the [`RateLimiter`] every worker
//! shares, with Upstash Redis in production (ADR 0007); and [`CountedQueue`], an approximate
//! queue depth for transports that report none (see its module).
//!
//! The standard asks for a token bucket per provider (global: Resend's limit is per team, across
//! every tenant) and per tenant (fair use), and for a 429 to mean backing off, never dropping.
//! The buckets live in Redis so that every worker of every process draws from the same ones.
//!
//! # The script
//!
//! Each call is **one** Lua script (`src/buckets.lua`), which Redis runs atomically:
//!
//! 1. `now` is the server's clock (`redis.call('TIME')`, in milliseconds), never a worker's, so
//!    workers with skewed clocks agree on every bucket.
//! 2. Each bucket is a hash `{tokens, refilled_at}` under `<prefix>:<bucket key>`. A missing
//!    bucket starts full (`tokens = capacity`, `refilled_at = now`); otherwise `refill` tokens
//!    are added for each whole `interval` elapsed since `refilled_at`, capped at `capacity`, and
//!    `refilled_at` advances by those whole intervals.
//! 3. `acquire`: if any bucket holds fewer than `cost` tokens, nothing is written and the call is
//!    denied with `retry_at` = the latest time at which a short bucket will hold `cost` tokens
//!    (`refilled_at + ceil(missing / refill) × interval`). Otherwise every bucket is charged.
//! 4. `drain_until`: the bucket is set to 0 tokens and `refilled_at` to `until − interval` (or
//!    kept, if a hold already reaches further), so that its next tokens appear at `until`.
//! 5. Every written bucket gets `PEXPIRE` = the time until it would be full again, so an idle
//!    bucket vanishes exactly when it would be indistinguishable from a missing one.
//!
//! The script is sent with `EVALSHA`; on `NOSCRIPT` (a restarted server, `SCRIPT FLUSH`) the
//! [`redis::Script`] type loads it with `SCRIPT LOAD` and calls `EVALSHA` again.
//!
//! # Upstash compatibility
//!
//! The script calls only `TIME`, `HMGET`, `HSET` (several fields), `PEXPIRE` and
//! `redis.error_reply`, touches only the keys passed in `KEYS`, and has no shebang line (Redis
//! before 7 and Upstash both run it as plain `EVAL`). Upstash runs a script under its global
//! lock unless the script's shebang sets `allow-key-locking`, a flag open-source Redis rejects,
//! so the script stays portable and takes the global lock there; it does a few hash reads and
//! writes per bucket. With Redis Cluster, the keys of one call must share a hash slot: put a
//! hash tag in the prefix (`{rate}`).
//!
//! # Errors
//!
//! Everything Redis answers with an error, and every connection failure, is
//! [`RateLimitError::Unavailable`] (retryable): the caller defers its send, it never drops it.
//! The connection is made on first use and re-made in the background after an I/O error, so a
//! limiter built while Redis is down starts working when Redis comes back.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use jobs_core::{Acquired, Bucket, BucketKey, RateLimitError, RateLimiter};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, Script};
use thiserror::Error;
use tokio::sync::OnceCell;

mod depth;

pub use depth::{CountedQueue, DEFAULT_HORIZON, DEPTH_SCRIPT};

/// The `redis` crate this adapter is built on, so callers build a [`redis::Client`] of the same
/// version.
pub use redis;

/// The Lua source of the script every call runs.
pub const SCRIPT: &str = include_str!("buckets.lua");

/// The most milliseconds a time in the script may reach: Lua numbers are doubles, exact up to
/// 2^53, and a bucket's times stay well below with this bound (about the year 73 000).
const MAX_MS: u128 = 1 << 51;

/// How long connecting, and then each call, may take by default before the call is
/// [`RateLimitError::Unavailable`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The connection target could not be understood (not a `redis://` or `rediss://` URL, or a
/// scheme whose support is not compiled in).
#[derive(Debug, Error)]
#[error("invalid Redis connection target")]
pub struct InvalidTarget(#[source] pub redis::RedisError);

/// Token buckets in Redis, shared by every worker that uses the same server and prefix.
///
/// Calls need a Tokio runtime. The connection is one multiplexed connection, opened on the
/// first call and re-opened after an I/O error; concurrent calls share it.
pub struct RedisRateLimiter {
    client: redis::Client,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    connection: OnceCell<ConnectionManager>,
    script: Script,
}

impl fmt::Debug for RedisRateLimiter {
    // The client's connection info may hold a password: show only where it points.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field(
                "addr",
                &self.client.get_connection_info().addr().to_string(),
            )
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisRateLimiter {
    /// A limiter on `target` (a URL such as `redis://127.0.0.1:6379`, or any
    /// [`IntoConnectionInfo`]), keeping its buckets under `prefix`. Connects on first use, so
    /// this succeeds while Redis is down.
    pub fn new(
        target: impl IntoConnectionInfo,
        prefix: impl Into<String>,
    ) -> Result<Self, InvalidTarget> {
        let client = redis::Client::open(target).map_err(InvalidTarget)?;
        Ok(Self::from_client(client, prefix))
    }

    /// A limiter on an existing `client`, keeping its buckets under `prefix`.
    pub fn from_client(client: redis::Client, prefix: impl Into<String>) -> Self {
        RedisRateLimiter {
            client,
            prefix: prefix.into(),
            connect_timeout: DEFAULT_TIMEOUT,
            response_timeout: DEFAULT_TIMEOUT,
            connection: OnceCell::new(),
            script: Script::new(SCRIPT),
        }
    }

    /// Sets how long connecting and each call may take (default [`DEFAULT_TIMEOUT`] each);
    /// past it, the call is [`RateLimitError::Unavailable`] and the caller defers.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// The prefix of every key this limiter writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of `key`: `<prefix>:<key>`, or `key` alone with an empty prefix.
    pub fn redis_key(&self, key: &BucketKey) -> String {
        if self.prefix.is_empty() {
            key.as_str().to_owned()
        } else {
            format!("{}:{key}", self.prefix)
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, RateLimitError> {
        self.connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout))
                    // One attempt per call: while Redis is down, callers defer at once
                    // instead of waiting through a backoff.
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .await
            .cloned()
            .map_err(unavailable)
    }

    /// Runs the script over `buckets` and returns its `{granted, ms}` answer.
    async fn run(
        &self,
        mode: &str,
        buckets: &[(BucketKey, Bucket)],
        argument: u128,
    ) -> Result<(bool, SystemTime), RateLimitError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(mode).arg(argument.to_string());
        for (key, bucket) in buckets {
            invocation
                .key(self.redis_key(key))
                .arg(bucket.capacity)
                .arg(bucket.refill)
                .arg(millis(bucket.interval).to_string());
        }
        let mut connection = self.connection().await?;
        let reply: Vec<i64> = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let [granted, ms] = reply[..] else {
            return Err(malformed(&reply));
        };
        let at = u64::try_from(ms).map_err(|_| malformed(&reply))?;
        Ok((granted == 1, UNIX_EPOCH + Duration::from_millis(at)))
    }
}

fn millis(d: Duration) -> u128 {
    d.as_millis()
}

fn unavailable(e: redis::RedisError) -> RateLimitError {
    RateLimitError::Unavailable {
        message: format!("redis: {e}"),
        source: Some(Box::new(e)),
    }
}

fn malformed(reply: &[i64]) -> RateLimitError {
    RateLimitError::Unavailable {
        message: format!("redis: unexpected reply from the bucket script: {reply:?}"),
        source: None,
    }
}

fn invalid(key: &BucketKey, why: String) -> RateLimitError {
    RateLimitError::InvalidBucket(format!("{key}: {why}"))
}

/// Rejects what [`Bucket::new`] rejects (the fields are public), intervals that are not whole
/// milliseconds (the script's unit), times too far out for the script's numbers, a key listed
/// twice, and a cost no bucket can ever hold.
fn validate(buckets: &[(BucketKey, Bucket)], cost: u32) -> Result<(), RateLimitError> {
    for (n, (key, bucket)) in buckets.iter().enumerate() {
        Bucket::new(bucket.capacity, bucket.refill, bucket.interval)?;
        if bucket.interval.subsec_nanos() % 1_000_000 != 0 {
            return Err(invalid(
                key,
                format!("interval {:?} is not whole milliseconds", bucket.interval),
            ));
        }
        if millis(bucket.interval) * (u128::from(bucket.capacity) + 1) > MAX_MS {
            return Err(invalid(
                key,
                format!(
                    "capacity {} per {:?} takes too long to refill",
                    bucket.capacity, bucket.interval
                ),
            ));
        }
        if buckets[..n].iter().any(|(other, _)| other == key) {
            return Err(invalid(key, "listed twice in one call".to_owned()));
        }
        if cost > bucket.capacity {
            return Err(invalid(
                key,
                format!(
                    "a cost of {cost} exceeds the capacity {}, so it could never be granted",
                    bucket.capacity
                ),
            ));
        }
    }
    Ok(())
}

#[async_trait]
impl RateLimiter for RedisRateLimiter {
    async fn acquire(
        &self,
        buckets: &[(BucketKey, Bucket)],
        cost: u32,
    ) -> Result<Acquired, RateLimitError> {
        validate(buckets, cost)?;
        if buckets.is_empty() {
            return Ok(Acquired::Granted);
        }
        let (granted, retry_at) = self.run("acquire", buckets, u128::from(cost)).await?;
        Ok(if granted {
            Acquired::Granted
        } else {
            Acquired::Denied { retry_at }
        })
    }

    async fn drain_until(
        &self,
        key: &BucketKey,
        bucket: Bucket,
        until: SystemTime,
    ) -> Result<(), RateLimitError> {
        let buckets = [(key.clone(), bucket)];
        validate(&buckets, 0)?;
        // Rounded up, so that no token appears before `until`.
        let since = until.duration_since(UNIX_EPOCH).unwrap_or_default();
        let until_ms = since.as_nanos().div_ceil(1_000_000);
        if until_ms > MAX_MS {
            return Err(invalid(key, format!("until {until:?} is too far away")));
        }
        self.run("drain", &buckets, until_ms).await.map(|_| ())
    }
}

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
//! 2. Each bucket is a string `"<tokens>:<refilled_at>"` under `<prefix>:<bucket key>`, all of a
//!    call's buckets read with one `MGET`. A missing bucket starts full (`tokens = capacity`,
//!    `refilled_at = now`); otherwise `refill` tokens are added for each whole `interval`
//!    elapsed since `refilled_at`, capped at `capacity`, and `refilled_at` advances by those
//!    whole intervals.
//! 3. `acquire`: if any bucket holds fewer than `cost` tokens, nothing is charged and the
//!    acquisition is denied with `retry_at` = the latest time at which a short bucket will hold
//!    `cost` tokens (`refilled_at + ceil(missing / refill) × interval`). Otherwise every bucket
//!    is charged.
//! 4. `drain_until`: the bucket is set to 0 tokens and `refilled_at` to `until − interval` (or
//!    kept, if a hold already reaches further), so that its next tokens appear at `until`.
//! 5. Every charged bucket is written with `SET … PX` = the time until it would be full again,
//!    so an idle bucket vanishes exactly when it would be indistinguishable from a missing one.
//!
//! # Coalescing
//!
//! A limiter with no call in flight runs an acquisition as its own script call. While one is in
//! flight, further acquisitions of the same limiter queue up and go together, up to
//! [`MAX_COALESCED`] per call, in one script call that decides them one after another in
//! arrival order, each all or none exactly as if it had been called alone at that server time
//! (and charges each bucket with one write); at most two such calls are in flight at once.
//! A call names each distinct bucket and each distinct request (cost and buckets) once, and
//! each acquisition with one byte naming its request, since the script's work per argument is
//! what a batch pays per acquisition.
//! Under concurrency this replaces many round trips and script runs with a few; a single
//! caller sees one call, as before.
//!
//! The script is sent with `EVALSHA`; on `NOSCRIPT` (a restarted server, `SCRIPT FLUSH`) the
//! [`redis::Script`] type loads it with `SCRIPT LOAD` and calls `EVALSHA` again.
//!
//! # Upstash compatibility
//!
//! The script calls only `TIME`, `MGET`, `SET` with `PX` and `redis.error_reply`, touches only
//! the keys passed in `KEYS`, and has no shebang line (Redis before 7 and Upstash both run it
//! as plain `EVAL`). Upstash runs a script under its global lock unless the script's shebang
//! sets `allow-key-locking`, a flag open-source Redis rejects, so the script stays portable and
//! takes the global lock there; it does one read and at most one write per bucket. With Redis
//! Cluster, the keys of one call (and so of one limiter, since calls coalesce) must share a
//! hash slot: put a hash tag in the prefix (`{rate}`).
//!
//! # Errors
//!
//! Everything Redis answers with an error, and every connection failure, is
//! [`RateLimitError::Unavailable`] (retryable): the caller defers its send, it never drops it.
//! The connection is made on first use and re-made in the background after an I/O error, so a
//! limiter built while Redis is down starts working when Redis comes back.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use jobs_core::{Acquired, Bucket, BucketKey, RateLimitError, RateLimiter};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, Script};
use thiserror::Error;
use tokio::sync::{OnceCell, oneshot};

mod depth;

pub use depth::{CountedQueue, DEFAULT_HORIZON, DEPTH_SCRIPT};

/// The `redis` crate this adapter is built on, so callers build a [`redis::Client`] of the same
/// version.
pub use redis;

/// The Lua source of the script every call runs.
pub const SCRIPT: &str = include_str!("buckets.lua");

/// The most acquisitions one script call decides when concurrent calls coalesce: enough to
/// amortise a round trip over many callers, few enough to keep one script run short (Redis,
/// and Upstash's global lock, serve nothing else meanwhile).
pub const MAX_COALESCED: usize = 128;

// The script names each acquisition's request with one byte.
const _: () = assert!(MAX_COALESCED < 256);

/// The most script calls of one limiter in flight at once: acquisitions gather while they run
/// and go together in the next (group commit). Two keep the connection busy while one answer
/// travels back: on an idle 2-core machine they gave 0.61 / 0.78 of raw `EVALSHA` at 16 / 64
/// callers against 0.52 / 0.54 with one; three or four no more than two (ADR 0007).
const MAX_IN_FLIGHT: usize = 2;

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
/// first call and re-opened after an I/O error; concurrent calls share it, and concurrent
/// acquisitions coalesce into one script call (see the crate docs).
pub struct RedisRateLimiter {
    inner: Arc<Inner>,
}

/// What the limiter and its coalescing driver share.
struct Inner {
    client: redis::Client,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    connection: OnceCell<ConnectionManager>,
    script: Script,
    queue: Mutex<Queue>,
}

/// Acquisitions waiting for a script call, and how many calls are in flight.
#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Waiting>,
}

/// One acquisition: its buckets under their Redis keys, and its cost.
struct Request {
    buckets: Vec<(String, Bucket)>,
    cost: u32,
}

/// A queued acquisition and where its answer goes.
struct Waiting {
    request: Request,
    answer: oneshot::Sender<Result<Acquired, RateLimitError>>,
}

impl fmt::Debug for RedisRateLimiter {
    // The client's connection info may hold a password: show only where it points.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field(
                "addr",
                &self.inner.client.get_connection_info().addr().to_string(),
            )
            .field("prefix", &self.inner.prefix)
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
            inner: Arc::new(Inner {
                client,
                prefix: prefix.into(),
                connect_timeout: DEFAULT_TIMEOUT,
                response_timeout: DEFAULT_TIMEOUT,
                connection: OnceCell::new(),
                script: Script::new(SCRIPT),
                queue: Mutex::default(),
            }),
        }
    }

    /// Sets how long connecting and each call may take (default [`DEFAULT_TIMEOUT`] each);
    /// past it, the call is [`RateLimitError::Unavailable`] and the caller defers. Set it
    /// before the first call: the connection keeps the timeouts it was made with.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.connect_timeout = connect;
            inner.response_timeout = response;
        }
        self
    }

    /// The prefix of every key this limiter writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key of `key`: `<prefix>:<key>`, or `key` alone with an empty prefix.
    pub fn redis_key(&self, key: &BucketKey) -> String {
        self.inner.redis_key(key)
    }
}

impl Inner {
    fn redis_key(&self, key: &BucketKey) -> String {
        if self.prefix.is_empty() {
            key.as_str().to_owned()
        } else {
            format!("{}:{key}", self.prefix)
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Every change to the queue is a push or a drain without a fallible step.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Runs the script and returns its flat answer.
    async fn invoke(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Vec<i64>, RateLimitError> {
        let mut connection = self.connection().await?;
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)
    }

    /// Decides `batch` in one script call, in order; one answer per acquisition.
    async fn acquire_batch(&self, batch: &[&Request]) -> Result<Vec<Acquired>, RateLimitError> {
        // Every distinct bucket once, as a key of the call, and every distinct request (cost
        // and buckets) once; each acquisition is one byte naming its request.
        let mut keys: Vec<(&str, Bucket)> = Vec::new();
        let mut requests: Vec<(u32, Vec<usize>)> = Vec::new();
        let mut order: Vec<u8> = Vec::with_capacity(batch.len());
        for request in batch {
            let mut mine = Vec::with_capacity(request.buckets.len());
            for (key, bucket) in &request.buckets {
                let index = match keys.iter().position(|(k, _)| k == key) {
                    Some(index) => index,
                    None => {
                        keys.push((key, *bucket));
                        keys.len() - 1
                    }
                };
                mine.push(index + 1);
            }
            let same =
                |(cost, buckets): &(u32, Vec<usize>)| *cost == request.cost && *buckets == mine;
            let number = match requests.iter().position(same) {
                Some(number) => number,
                None => {
                    requests.push((request.cost, mine));
                    requests.len() - 1
                }
            };
            let number = u8::try_from(number + 1)
                .expect("a batch holds at most MAX_COALESCED (< 256) acquisitions");
            order.push(number);
        }
        let mut invocation = self.script.prepare_invoke();
        invocation.arg("acquire").arg(order);
        for (key, bucket) in &keys {
            invocation
                .key(*key)
                .arg(bucket.capacity())
                .arg(bucket.refill())
                .arg(millis(bucket.interval()).to_string());
        }
        for (cost, buckets) in &requests {
            invocation.arg(*cost).arg(buckets.len());
            for index in buckets {
                invocation.arg(*index);
            }
        }
        let reply = self.invoke(&invocation).await?;
        if reply.len() != batch.len() {
            return Err(malformed(&reply));
        }
        reply
            .iter()
            .map(|&at| match at {
                0 => Ok(Acquired::Granted),
                at => u64::try_from(at)
                    .map(|at| Acquired::Denied {
                        retry_at: UNIX_EPOCH + Duration::from_millis(at),
                    })
                    .map_err(|_| malformed(&reply)),
            })
            .collect()
    }

    /// Runs `batch` and hands each acquisition its answer (a caller that gave up is skipped).
    async fn settle(&self, batch: Vec<Waiting>) {
        let requests: Vec<&Request> = batch.iter().map(|w| &w.request).collect();
        let answers = self.acquire_batch(&requests).await;
        drop(requests);
        match answers {
            Ok(answers) => {
                for (waiting, answer) in batch.into_iter().zip(answers) {
                    let _ = waiting.answer.send(Ok(answer));
                }
            }
            Err(e) => {
                for waiting in batch {
                    let _ = waiting.answer.send(Err(copy(&e)));
                }
            }
        }
    }

    /// The next batch: waiting acquisitions in order, up to [`MAX_COALESCED`], stopping before
    /// one that gives a bucket of the batch other parameters (it goes in the next call).
    fn next_batch(queue: &mut Queue) -> Vec<Waiting> {
        let mut batch: Vec<Waiting> = Vec::new();
        while batch.len() < MAX_COALESCED {
            let Some(next) = queue.waiting.front() else {
                break;
            };
            let conflicts = next.request.buckets.iter().any(|(key, bucket)| {
                batch
                    .iter()
                    .flat_map(|w| &w.request.buckets)
                    .any(|(k, b)| k == key && b != bucket)
            });
            if conflicts {
                break;
            }
            batch.extend(queue.waiting.pop_front());
        }
        batch
    }

    /// Serves the queue until it is empty, one coalesced call at a time; one of at most
    /// [`MAX_IN_FLIGHT`] such drivers.
    async fn drive(self: Arc<Self>) {
        loop {
            let batch = {
                let mut queue = self.queue();
                let batch = Self::next_batch(&mut queue);
                if batch.is_empty() {
                    queue.in_flight -= 1;
                    return;
                }
                batch
            };
            self.settle(batch).await;
            // Let the callers just answered run first: those that acquire again join the next
            // call, instead of one of them leading a call of its own.
            tokio::task::yield_now().await;
        }
    }

    /// Starts a driver for the waiting acquisitions, holding the in-flight slot the caller
    /// reserved; without a runtime (shutting down) the slot is released and they wait on.
    fn spawn_driver(self: &Arc<Self>) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(Arc::clone(self).drive());
            }
            Err(_) => self.queue().in_flight -= 1,
        }
    }
}

/// Held by a caller running its own acquisition while nothing else was in flight: when it is
/// done (or dropped mid-call), its in-flight slot goes to a driver for the acquisitions that
/// queued meanwhile, or is released.
struct Lead(Arc<Inner>);

impl Drop for Lead {
    fn drop(&mut self) {
        let mut queue = self.0.queue();
        if queue.waiting.is_empty() {
            queue.in_flight -= 1;
            return;
        }
        drop(queue);
        self.0.spawn_driver();
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

/// The same error for every acquisition of a failed call.
fn copy(e: &RateLimitError) -> RateLimitError {
    match e {
        RateLimitError::InvalidBucket(why) => RateLimitError::InvalidBucket(why.clone()),
        other => RateLimitError::Unavailable {
            message: other.to_string(),
            source: None,
        },
    }
}

fn abandoned() -> RateLimitError {
    RateLimitError::Unavailable {
        message: "redis: the call carrying this acquisition was abandoned".into(),
        source: None,
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

/// Rejects intervals that are not whole
/// milliseconds (the script's unit), times too far out for the script's numbers, a key listed
/// twice, and a cost no bucket can ever hold.
fn validate(buckets: &[(BucketKey, Bucket)], cost: u32) -> Result<(), RateLimitError> {
    for (n, (key, bucket)) in buckets.iter().enumerate() {
        if bucket.interval().subsec_nanos() % 1_000_000 != 0 {
            return Err(invalid(
                key,
                format!("interval {:?} is not whole milliseconds", bucket.interval()),
            ));
        }
        if millis(bucket.interval()) * (u128::from(bucket.capacity()) + 1) > MAX_MS {
            return Err(invalid(
                key,
                format!(
                    "capacity {} per {:?} takes too long to refill",
                    bucket.capacity(),
                    bucket.interval()
                ),
            ));
        }
        if buckets[..n].iter().any(|(other, _)| other == key) {
            return Err(invalid(key, "listed twice in one call".to_owned()));
        }
        if cost > bucket.capacity() {
            return Err(invalid(
                key,
                format!(
                    "a cost of {cost} exceeds the capacity {}, so it could never be granted",
                    bucket.capacity()
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
        let buckets = buckets
            .iter()
            .map(|(key, bucket)| (self.inner.redis_key(key), *bucket))
            .collect();
        let request = Request { buckets, cost };
        let (lead, answered, drive) = {
            let mut queue = self.inner.queue();
            if queue.in_flight == 0 {
                // Nothing in flight: run this one alone, now, with no hop to another task.
                queue.in_flight = 1;
                (Some(request), None, false)
            } else {
                let (answer, answered) = oneshot::channel();
                queue.waiting.push_back(Waiting { request, answer });
                let drive = queue.in_flight < MAX_IN_FLIGHT;
                queue.in_flight += usize::from(drive);
                (None, Some(answered), drive)
            }
        };
        if drive {
            self.inner.spawn_driver();
        }
        if let Some(mine) = lead {
            let _lead = Lead(Arc::clone(&self.inner));
            let mut answers = self.inner.acquire_batch(&[&mine]).await?;
            return answers.pop().ok_or_else(|| malformed(&[]));
        }
        match answered {
            Some(answered) => answered.await.unwrap_or_else(|_| Err(abandoned())),
            None => Err(abandoned()),
        }
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
        let mut invocation = self.inner.script.prepare_invoke();
        invocation
            .key(self.inner.redis_key(key))
            .arg("drain")
            .arg(until_ms.to_string())
            .arg(bucket.capacity())
            .arg(bucket.refill())
            .arg(millis(bucket.interval()).to_string());
        let reply = self.inner.invoke(&invocation).await?;
        match reply[..] {
            [0, _] => Ok(()),
            _ => Err(malformed(&reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue of acquisitions, each of one cost over `(key, capacity)` buckets.
    fn queue_of(requests: &[&[(&str, u32)]]) -> Queue {
        let mut queue = Queue::default();
        for buckets in requests {
            let buckets = buckets
                .iter()
                .map(|&(key, capacity)| {
                    let bucket = Bucket::new(capacity, 1, Duration::from_secs(1)).expect("valid");
                    (key.to_owned(), bucket)
                })
                .collect();
            let (answer, _) = oneshot::channel();
            queue.waiting.push_back(Waiting {
                request: Request { buckets, cost: 1 },
                answer,
            });
        }
        queue
    }

    /// The first bucket key of each acquisition of `waiting`.
    fn keys<'a>(waiting: impl IntoIterator<Item = &'a Waiting>) -> Vec<&'a str> {
        (waiting.into_iter())
            .map(|w| w.request.buckets[0].0.as_str())
            .collect()
    }

    /// A limiter whose Redis cannot be reached: a call that gets as far as Redis fails as
    /// unavailable, one refused before fails as invalid.
    fn unreachable() -> RedisRateLimiter {
        RedisRateLimiter::new("redis://127.0.0.1:1/0", "jobs").expect("a URL")
    }

    #[test]
    fn a_batch_takes_acquisitions_in_order_until_one_gives_a_bucket_other_parameters() {
        // The third gives `t` another capacity than the first did: the batch stops before it,
        // even though the fourth would fit; the same bucket twice (`k`), or another key (`j`),
        // does not conflict.
        let mut queue = queue_of(&[
            &[("k", 5), ("t", 2)],
            &[("j", 9), ("k", 5)],
            &[("t", 3)],
            &[("k", 5)],
        ]);
        let batch = Inner::next_batch(&mut queue);
        assert_eq!(keys(&batch), ["k", "j"]);
        assert_eq!(
            keys(&queue.waiting),
            ["t", "k"],
            "the conflicting one leads the next batch"
        );
        let next = Inner::next_batch(&mut queue);
        assert_eq!(keys(&next), ["t", "k"]);
        assert!(Inner::next_batch(&mut queue).is_empty() && queue.waiting.is_empty());
    }

    #[test]
    fn a_lead_gives_its_slot_back_when_nothing_waits_or_no_runtime_can_drive_the_rest() {
        let limiter = unreachable();
        let inner = &limiter.inner;
        inner.queue().in_flight = 1;
        drop(Lead(Arc::clone(inner)));
        assert_eq!(
            inner.queue().in_flight,
            0,
            "nothing waited: the slot is free"
        );
        // Outside a runtime no driver can start: the slot is freed and the acquisitions wait
        // for the next caller to lead.
        *inner.queue() = queue_of(&[&[("k", 5)]]);
        inner.queue().in_flight = 1;
        drop(Lead(Arc::clone(inner)));
        let queue = inner.queue();
        assert_eq!((queue.in_flight, queue.waiting.len()), (0, 1));
    }

    #[test]
    fn a_bucket_whose_refill_outlasts_the_scripts_clock_is_refused() {
        let key = BucketKey::provider("test");
        // 2^31 ms per token times 2^20 tokens is the script's last representable time.
        let bucket = |ms: u64| Bucket::new((1 << 20) - 1, 1, Duration::from_millis(ms));
        let at_the_edge = bucket(1 << 31).expect("valid");
        assert!(validate(&[(key.clone(), at_the_edge)], 1).is_ok());
        let past_it = bucket((1 << 31) + 1).expect("valid");
        let refused = validate(&[(key, past_it)], 1).expect_err("past the script's clock");
        assert!(
            refused.to_string().contains("takes too long to refill"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn a_queued_acquisition_starts_a_driver_only_below_the_in_flight_limit() {
        let limiter = unreachable();
        let bucket = [(
            BucketKey::provider("test"),
            Bucket::new(5, 1, Duration::from_secs(1)).expect("valid"),
        )];
        for (before, after) in [
            (MAX_IN_FLIGHT - 1, MAX_IN_FLIGHT),
            (MAX_IN_FLIGHT, MAX_IN_FLIGHT),
        ] {
            *limiter.inner.queue() = Queue {
                in_flight: before,
                waiting: VecDeque::new(),
            };
            let mut acquiring = limiter.acquire(&bucket, 1);
            // Polled once, without yielding to the driver it may have spawned: it is queued.
            let polled =
                std::future::poll_fn(|cx| std::task::Poll::Ready(acquiring.as_mut().poll(cx)))
                    .await;
            assert!(polled.is_pending());
            let queue = limiter.inner.queue();
            assert_eq!(
                (queue.in_flight, queue.waiting.len()),
                (after, 1),
                "{before} in flight before"
            );
        }
    }

    #[tokio::test]
    async fn a_drain_until_past_the_scripts_clock_is_refused_and_one_at_its_edge_goes_on() {
        let limiter = unreachable().with_timeouts(Duration::from_secs(5), Duration::from_secs(5));
        let (key, bucket) = (
            BucketKey::provider("test"),
            Bucket::new(5, 1, Duration::from_secs(1)).expect("valid"),
        );
        let edge = UNIX_EPOCH + Duration::from_millis(u64::try_from(MAX_MS).expect("fits"));
        let past = edge + Duration::from_millis(1);
        let refused = limiter.drain_until(&key, bucket, past).await;
        assert!(
            matches!(&refused, Err(RateLimitError::InvalidBucket(e)) if e.contains("too far away")),
            "{refused:?}"
        );
        let tried = limiter.drain_until(&key, bucket, edge).await;
        assert!(
            matches!(tried, Err(RateLimitError::Unavailable { .. })),
            "{tried:?}"
        );
    }

    #[test]
    fn a_batch_holds_at_most_max_coalesced() {
        let requests: Vec<&[(&str, u32)]> = vec![&[("k", 5)]; MAX_COALESCED + 2];
        let mut queue = queue_of(&requests);
        assert_eq!(Inner::next_batch(&mut queue).len(), MAX_COALESCED);
        assert_eq!(Inner::next_batch(&mut queue).len(), 2);
    }

    #[test]
    fn a_limiter_shows_where_it_points_and_its_prefix_never_the_password() {
        let limiter = RedisRateLimiter::new("redis://:hunter2-secret@127.0.0.1:6390/0", "jobs")
            .expect("a valid URL");
        assert_eq!(limiter.prefix(), "jobs");
        let shown = format!("{limiter:?}");
        assert!(
            shown.contains("RedisRateLimiter")
                && shown.contains("127.0.0.1:6390")
                && shown.contains("\"jobs\""),
            "{shown}"
        );
        assert!(
            !shown.contains("hunter2"),
            "the password is not shown: {shown}"
        );
    }
}

//! In-process token buckets on the [`Clock`] port, with the semantics of the Redis script.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{Acquired, Bucket, BucketKey, Clock, RateLimitError, RateLimiter, SystemClock};

/// Token buckets held in this process; clones share the same buckets.
///
/// The semantics are those of `jobs-adapter-redis`, so that tests and the embedded default
/// behave like production:
///
/// - a bucket that is not held starts full;
/// - `refill` tokens are added for each whole `interval` elapsed since the last refill, up to
///   `capacity` (no fractional tokens in between);
/// - one [`acquire`](RateLimiter::acquire) charges every bucket of the call or none of them, and
///   a denial's `retry_at` is when the slowest short bucket will hold `cost` tokens;
/// - [`drain_until`](RateLimiter::drain_until) empties a bucket and holds its refill so that
///   its next tokens appear at `until` (a later hold is never shortened);
/// - a bucket is forgotten as soon as it would be full again, so memory is bounded by the
///   buckets in use, not by every key ever seen.
///
/// A cost above a bucket's capacity, or the same key twice in one call, is
/// [`RateLimitError::InvalidBucket`]: such a call could never be granted.
///
/// ```
/// use jobs_adapter_memory::MemoryRateLimiter;
/// use jobs_core::{Acquired, Bucket, BucketKey, ManualClock, RateLimiter};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let clock = ManualClock::default();
/// let limiter = MemoryRateLimiter::new(Arc::new(clock.clone()));
/// let resend = (BucketKey::provider("resend"), Bucket::new(5, 5, Duration::from_secs(1))?);
/// for _ in 0..5 {
///     assert_eq!(limiter.acquire(&[resend.clone()], 1).await?, Acquired::Granted);
/// }
/// let Acquired::Denied { retry_at } = limiter.acquire(&[resend.clone()], 1).await? else {
///     panic!("a sixth request within the second is denied");
/// };
/// clock.set(retry_at);
/// assert_eq!(limiter.acquire(&[resend], 1).await?, Acquired::Granted);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemoryRateLimiter {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryRateLimiter {
    /// On the system clock.
    fn default() -> Self {
        MemoryRateLimiter::new(Arc::new(SystemClock))
    }
}

impl MemoryRateLimiter {
    /// Buckets on `clock`: every refill and hold is measured on it.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryRateLimiter {
            state: Arc::default(),
            clock,
        }
    }

    /// How many buckets are held now: those that are not full. Full buckets are forgotten, so
    /// this is what the limiter's memory grows with.
    pub fn held(&self) -> usize {
        let now = self.clock.now();
        let mut state = self.lock();
        state.forget_full(now);
        state.buckets.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation is computed first and applied without a fallible step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
struct State {
    buckets: HashMap<BucketKey, Held>,
    /// Every held bucket by the time it is full again, when it is forgotten.
    full_at: BTreeSet<(SystemTime, BucketKey)>,
}

/// A bucket that is not full.
#[derive(Debug, Clone, Copy)]
struct Held {
    tokens: u32,
    /// The last refill; in the future while a drain holds the bucket.
    refilled_at: SystemTime,
    full_at: SystemTime,
}

/// A bucket's state at a given time, before it is stored again.
#[derive(Debug, Clone, Copy)]
struct Level {
    tokens: u32,
    refilled_at: SystemTime,
}

impl State {
    fn forget_full(&mut self, now: SystemTime) {
        while let Some((at, _)) = self.full_at.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.full_at.pop_first() {
                self.buckets.remove(&key);
            }
        }
    }

    /// The bucket at `now`, refilled by every whole interval since its last refill.
    fn level(&self, key: &BucketKey, bucket: Bucket, now: SystemTime) -> Level {
        let Some(held) = self.buckets.get(key) else {
            return Level {
                tokens: bucket.capacity(),
                refilled_at: now,
            };
        };
        let mut level = Level {
            tokens: held.tokens.min(bucket.capacity()),
            refilled_at: held.refilled_at,
        };
        if let Ok(elapsed) = now.duration_since(held.refilled_at) {
            let interval = bucket.interval().as_nanos();
            let whole = elapsed.as_nanos() / interval;
            if whole > 0 {
                let added = whole.saturating_mul(u128::from(bucket.refill()));
                let tokens = u128::from(level.tokens).saturating_add(added);
                level.tokens = u32::try_from(tokens.min(u128::from(bucket.capacity())))
                    .unwrap_or(bucket.capacity());
                // `whole` intervals fit in `elapsed`, so this never goes before the old refill.
                let rest = elapsed.as_nanos() % interval;
                level.refilled_at = now - nanos(rest);
            }
        }
        level
    }

    /// Stores `level` for `key` with the time it is full again, or forgets the bucket when it is
    /// full already.
    fn store(&mut self, key: &BucketKey, level: Level, capacity: u32, full_at: SystemTime) {
        if let Some(old) = self.buckets.remove(key) {
            self.full_at.remove(&(old.full_at, key.clone()));
        }
        if level.tokens < capacity {
            self.buckets.insert(
                key.clone(),
                Held {
                    tokens: level.tokens,
                    refilled_at: level.refilled_at,
                    full_at,
                },
            );
            self.full_at.insert((full_at, key.clone()));
        }
    }
}

/// When a bucket at `level` is full again.
fn full_at(bucket: Bucket, level: Level) -> Result<SystemTime, RateLimitError> {
    after_refills(bucket, level.refilled_at, bucket.capacity() - level.tokens)
}

/// When a bucket last refilled at `refilled_at` will have gained `missing` tokens.
fn after_refills(
    bucket: Bucket,
    refilled_at: SystemTime,
    missing: u32,
) -> Result<SystemTime, RateLimitError> {
    let refills = missing.div_ceil(bucket.refill());
    bucket
        .interval()
        .checked_mul(refills)
        .and_then(|wait| refilled_at.checked_add(wait))
        .ok_or_else(|| out_of_range(bucket))
}

fn nanos(n: u128) -> Duration {
    // `n` is below an interval, itself a `Duration`: it fits in seconds plus nanoseconds.
    Duration::new(
        u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX),
        u32::try_from(n % 1_000_000_000).unwrap_or(0),
    )
}

fn out_of_range(bucket: Bucket) -> RateLimitError {
    RateLimitError::InvalidBucket(format!(
        "capacity {}, refill {} per {:?}: the times it implies are out of range",
        bucket.capacity(),
        bucket.refill(),
        bucket.interval()
    ))
}

/// Rejects buckets whose refill times overflow, a key listed twice, and a cost no bucket can
/// ever hold.
fn validate(
    buckets: &[(BucketKey, Bucket)],
    cost: u32,
    now: SystemTime,
) -> Result<(), RateLimitError> {
    let mut seen = HashSet::with_capacity(buckets.len());
    for (key, bucket) in buckets {
        if !seen.insert(key) {
            return Err(RateLimitError::InvalidBucket(format!(
                "{key} is listed twice in one call"
            )));
        }
        if cost > bucket.capacity() {
            return Err(RateLimitError::InvalidBucket(format!(
                "{key}: a cost of {cost} exceeds the capacity {}, so it could never be granted",
                bucket.capacity()
            )));
        }
        after_refills(
            *bucket,
            now,
            bucket.capacity().saturating_add(bucket.refill()),
        )?;
    }
    Ok(())
}

#[async_trait]
impl RateLimiter for MemoryRateLimiter {
    async fn acquire(
        &self,
        buckets: &[(BucketKey, Bucket)],
        cost: u32,
    ) -> Result<Acquired, RateLimitError> {
        let now = self.clock.now();
        validate(buckets, cost, now)?;
        let mut state = self.lock();
        state.forget_full(now);
        let levels: Vec<Level> = buckets
            .iter()
            .map(|(key, bucket)| state.level(key, *bucket, now))
            .collect();
        let mut retry_at: Option<SystemTime> = None;
        for ((_, bucket), level) in buckets.iter().zip(&levels) {
            if level.tokens < cost {
                let ready = after_refills(*bucket, level.refilled_at, cost - level.tokens)?;
                retry_at = Some(retry_at.map_or(ready, |at| at.max(ready)));
            }
        }
        if let Some(retry_at) = retry_at {
            return Ok(Acquired::Denied { retry_at });
        }
        // Every fallible step comes before the first write: all buckets are charged, or none.
        let mut charged = Vec::with_capacity(buckets.len());
        for ((key, bucket), level) in buckets.iter().zip(levels) {
            let level = Level {
                tokens: level.tokens - cost,
                ..level
            };
            charged.push((key, bucket.capacity(), level, full_at(*bucket, level)?));
        }
        for (key, capacity, level, full_at) in charged {
            state.store(key, level, capacity, full_at);
        }
        Ok(Acquired::Granted)
    }

    async fn drain_until(
        &self,
        key: &BucketKey,
        bucket: Bucket,
        until: SystemTime,
    ) -> Result<(), RateLimitError> {
        let now = self.clock.now();
        validate(std::slice::from_ref(&(key.clone(), bucket)), 0, now)?;
        after_refills(
            bucket,
            until,
            bucket.capacity().saturating_add(bucket.refill()),
        )?;
        let mut state = self.lock();
        state.forget_full(now);
        let level = state.level(key, bucket, now);
        // The next refill comes one interval after `refilled_at`: hold it until `until`, or
        // keep a longer hold already in place.
        let hold = until
            .checked_sub(bucket.interval())
            .map_or(level.refilled_at, |hold| hold.max(level.refilled_at));
        let drained = Level {
            tokens: 0,
            refilled_at: hold,
        };
        let full_at = full_at(bucket, drained)?;
        state.store(key, drained, bucket.capacity(), full_at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use jobs_core::{Acquired, Bucket, BucketKey, ManualClock, RateLimitError, RateLimiter};
    use jobs_testkit::TimeTravel;
    use jobs_testkit::contract::rate;
    use proptest::prelude::*;

    use super::MemoryRateLimiter;

    fn limiter() -> (MemoryRateLimiter, ManualClock) {
        let clock = ManualClock::default();
        (MemoryRateLimiter::new(Arc::new(clock.clone())), clock)
    }

    #[tokio::test]
    async fn memory_rate_limiter_passes_the_rate_contract() {
        rate::run(|| async {
            let (limiter, clock) = limiter();
            (limiter, Arc::new(clock) as Arc<dyn TimeTravel>)
        })
        .await;
    }

    #[tokio::test]
    async fn buckets_are_forgotten_once_full_again() {
        let (limiter, clock) = limiter();
        let bucket = Bucket::new(4, 1, Duration::from_secs(1)).unwrap();
        for n in 0..100 {
            let key = (BucketKey::provider(&format!("p{n}")), bucket);
            let got = limiter.acquire(&[key], 2).await.unwrap();
            assert_eq!(got, Acquired::Granted);
        }
        assert_eq!(limiter.held(), 100);
        clock.advance(Duration::from_millis(1999));
        assert_eq!(limiter.held(), 100, "two tokens are missing until 2 s");
        clock.advance(Duration::from_millis(1));
        assert_eq!(limiter.held(), 0, "full buckets are forgotten");

        let key = BucketKey::provider("drained");
        let until = clock.now() + Duration::from_secs(10);
        limiter.drain_until(&key, bucket, until).await.unwrap();
        // Held until `until`, then one token per second: full 3 s after `until`.
        clock.set(until + Duration::from_millis(2999));
        assert_eq!(limiter.held(), 1);
        clock.advance(Duration::from_millis(1));
        assert_eq!(limiter.held(), 0);
    }

    #[tokio::test]
    async fn a_forgotten_bucket_comes_back_full() {
        let (limiter, clock) = limiter();
        let key = [(
            BucketKey::provider("p"),
            Bucket::new(3, 3, Duration::from_secs(1)).unwrap(),
        )];
        assert_eq!(limiter.acquire(&key, 3).await.unwrap(), Acquired::Granted);
        clock.advance(Duration::from_secs(60));
        assert_eq!(limiter.held(), 0);
        assert_eq!(limiter.acquire(&key, 3).await.unwrap(), Acquired::Granted);
        assert!(matches!(
            limiter.acquire(&key, 1).await.unwrap(),
            Acquired::Denied { .. }
        ));
    }

    #[tokio::test]
    async fn times_out_of_range_are_invalid_buckets_not_panics() {
        let (limiter, _clock) = limiter();
        let huge = Bucket::new(u32::MAX, 1, Duration::MAX).unwrap();
        let got = limiter
            .acquire(&[(BucketKey::provider("p"), huge)], 1)
            .await;
        assert!(
            matches!(got, Err(RateLimitError::InvalidBucket(_))),
            "{got:?}"
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        /// Which buckets (bit 0: provider, bit 1: tenant) and the cost.
        Acquire(u8, u32),
        /// Drains the provider (or the tenant) for so many milliseconds from now.
        Drain(bool, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..1_500).prop_map(Op::Advance),
            6 => (1u8..=3, 1u32..=3).prop_map(|(which, cost)| Op::Acquire(which, cost)),
            1 => (any::<bool>(), 0u64..2_000).prop_map(|(tenant, ms)| Op::Drain(tenant, ms)),
        ]
    }

    fn bucket() -> impl Strategy<Value = Bucket> {
        (1u32..=8, 1u32..=4, 1u64..=500)
            .prop_map(|(c, r, ms)| Bucket::new(c, r, Duration::from_millis(ms)).unwrap())
    }

    /// What one bucket has granted since it was first named, and the bound it must keep.
    #[derive(Default)]
    struct Seen {
        first: Option<std::time::SystemTime>,
        granted: u64,
        held_until: Option<std::time::SystemTime>,
    }

    impl Seen {
        fn touch(&mut self, now: std::time::SystemTime) {
            self.first.get_or_insert(now);
        }

        fn check(&self, bucket: Bucket, now: std::time::SystemTime) -> Result<(), TestCaseError> {
            let Some(first) = self.first else {
                return Ok(());
            };
            let elapsed = now.duration_since(first).unwrap().as_nanos();
            let whole = u64::try_from(elapsed / bucket.interval().as_nanos()).unwrap();
            let bound = u64::from(bucket.capacity()) + u64::from(bucket.refill()) * whole;
            prop_assert!(
                self.granted <= bound,
                "granted {} > capacity + refill × whole intervals = {bound}",
                self.granted
            );
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Whatever the calls and clock moves, a bucket never grants more than its capacity
        /// plus its refill for each whole interval since it was first named; a drained bucket
        /// grants nothing before `until`; and a denial is granted when retried at `retry_at`.
        #[test]
        fn grants_never_exceed_capacity_plus_refills(
            provider in bucket(),
            tenant in bucket(),
            ops in prop::collection::vec(op(), 1..60),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (limiter, clock) = limiter();
            let keys = [
                (BucketKey::provider("p"), provider),
                (BucketKey::provider("t"), tenant),
            ];
            let mut seen = [Seen::default(), Seen::default()];
            for op in ops {
                match op {
                    Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                    Op::Drain(is_tenant, ms) => {
                        let i = usize::from(is_tenant);
                        let until = clock.now() + Duration::from_millis(ms);
                        seen[i].touch(clock.now());
                        runtime.block_on(limiter.drain_until(&keys[i].0, keys[i].1, until)).unwrap();
                        seen[i].held_until = seen[i].held_until.max(Some(until));
                    }
                    Op::Acquire(which, cost) => {
                        let picked: Vec<usize> = (0..2).filter(|i| which & (1 << i) != 0).collect();
                        let call: Vec<_> = picked.iter().map(|&i| keys[i].clone()).collect();
                        for &i in &picked {
                            seen[i].touch(clock.now());
                        }
                        let got = runtime.block_on(limiter.acquire(&call, cost));
                        if picked.iter().any(|&i| cost > keys[i].1.capacity()) {
                            prop_assert!(matches!(got, Err(RateLimitError::InvalidBucket(_))));
                            continue;
                        }
                        let mut got = got.unwrap();
                        if let Acquired::Denied { retry_at } = got {
                            prop_assert!(retry_at > clock.now(), "retry_at is not in the future");
                            clock.set(retry_at);
                            got = runtime.block_on(limiter.acquire(&call, cost)).unwrap();
                            prop_assert_eq!(got, Acquired::Granted, "denied again at retry_at");
                        }
                        for &i in &picked {
                            if let Some(until) = seen[i].held_until {
                                prop_assert!(clock.now() >= until, "granted before drain's until");
                            }
                            seen[i].granted += u64::from(cost);
                        }
                    }
                }
                for (i, s) in seen.iter().enumerate() {
                    s.check(keys[i].1, clock.now())?;
                }
            }
        }
    }
}

//! The rate limiter contract: [`RateLimiter`] token buckets, as Redis and the in-memory double
//! must both provide them.
//!
//! A limiter on a real server keeps its own time, so its [`TimeTravel`] sleeps: every interval
//! that a check waits for is a few hundred milliseconds, and the checks that wait are few. Checks
//! compare times with the limiter's answers only through `retry_at`, never by measuring how long
//! a call took.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_core::{Acquired, Bucket, BucketKey, ErrorClass, RateLimitError, RateLimiter};

use crate::TimeTravel;
use crate::fixtures;

/// The interval of the buckets whose refill a check waits for.
const SHORT: Duration = Duration::from_millis(300);

const HOUR: Duration = Duration::from_secs(60 * 60);

/// Runs every check of the rate limiter contract, each on a fresh limiter from `make` with the
/// time of the store it uses.
pub async fn run<F, Fut, L>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = (L, Arc<dyn TimeTravel>)>,
    L: RateLimiter,
{
    grants_up_to_capacity_then_denies(make().await).await;
    tokens_come_back_after_the_interval(make().await).await;
    charges_all_buckets_or_none(make().await).await;
    drain_until_denies_until_then(make().await).await;
    rejects_invalid_buckets(make().await).await;
}

fn bucket(capacity: u32, refill: u32, interval: Duration) -> Bucket {
    Bucket::new(capacity, refill, interval).expect("a valid bucket")
}

async fn acquire<L: RateLimiter>(
    check: &str,
    limiter: &L,
    buckets: &[(BucketKey, Bucket)],
    cost: u32,
) -> Acquired {
    limiter
        .acquire(buckets, cost)
        .await
        .unwrap_or_else(|e| panic!("{check}: acquire failed: {e}"))
}

fn assert_granted(check: &str, what: &str, got: Acquired) {
    assert_eq!(got, Acquired::Granted, "{check}: {what}");
}

fn denied(check: &str, what: &str, got: Acquired) -> SystemTime {
    match got {
        Acquired::Denied { retry_at } => retry_at,
        Acquired::Granted => panic!("{check}: {what}: expected a denial, got Granted"),
    }
}

/// Lets time pass until `at` (nothing when it has passed already).
async fn advance_to(time: &dyn TimeTravel, at: SystemTime) {
    if let Ok(wait) = at.duration_since(time.now()) {
        time.advance(wait).await;
    }
}

fn assert_invalid(check: &str, what: &str, got: Result<impl std::fmt::Debug, RateLimitError>) {
    match got {
        Err(e @ RateLimitError::InvalidBucket(_)) => {
            assert_eq!(e.class(), ErrorClass::Permanent, "{check}: {what}: class");
        }
        other => panic!("{check}: {what}: expected InvalidBucket, got {other:?}"),
    }
}

/// A bucket that was never used starts full: it grants `capacity` tokens, then denies with a
/// `retry_at` in the future, no later than one interval away (when one refill comes). A call
/// with no buckets is granted.
pub async fn grants_up_to_capacity_then_denies<L: RateLimiter>(t: (L, Arc<dyn TimeTravel>)) {
    let check = "grants_up_to_capacity_then_denies";
    let (limiter, time) = t;
    let key = (
        BucketKey::provider("contract-capacity"),
        bucket(3, 1, SHORT),
    );
    for n in 1..=3 {
        let got = acquire(check, &limiter, std::slice::from_ref(&key), 1).await;
        assert_granted(check, &format!("token {n} of a full bucket of 3"), got);
    }
    let got = acquire(check, &limiter, std::slice::from_ref(&key), 1).await;
    let retry_at = denied(check, "a fourth token", got);
    let now = time.now();
    assert!(
        retry_at > now,
        "{check}: retry_at {retry_at:?} is not after {now:?}"
    );
    assert!(
        retry_at <= now + SHORT,
        "{check}: retry_at {retry_at:?} is more than one interval after {now:?}"
    );
    let got = acquire(check, &limiter, &[], 1).await;
    assert_granted(check, "a call with no buckets", got);
}

/// An empty bucket gets `refill` tokens back at `retry_at`, not before, and no more than its
/// capacity.
pub async fn tokens_come_back_after_the_interval<L: RateLimiter>(t: (L, Arc<dyn TimeTravel>)) {
    let check = "tokens_come_back_after_the_interval";
    let (limiter, time) = t;
    let key = [(BucketKey::provider("contract-refill"), bucket(2, 2, SHORT))];
    for _ in 0..2 {
        assert_granted(
            check,
            "a full bucket",
            acquire(check, &limiter, &key, 1).await,
        );
    }
    let retry_at = denied(
        check,
        "an empty bucket",
        acquire(check, &limiter, &key, 1).await,
    );
    let halfway = retry_at
        .duration_since(time.now())
        .unwrap_or_default()
        .checked_div(2)
        .unwrap_or_default();
    time.advance(halfway).await;
    denied(
        check,
        "halfway to retry_at",
        acquire(check, &limiter, &key, 1).await,
    );
    advance_to(time.as_ref(), retry_at).await;
    for n in 1..=2 {
        let got = acquire(check, &limiter, &key, 1).await;
        assert_granted(check, &format!("refilled token {n} of 2 at retry_at"), got);
    }
    denied(
        check,
        "a third token after a refill of 2",
        acquire(check, &limiter, &key, 1).await,
    );
}

/// A call is charged to every bucket or to none: a tenant denied by its own bucket leaves the
/// provider's tokens to other tenants, and a denial names the time of the slowest short bucket.
pub async fn charges_all_buckets_or_none<L: RateLimiter>(t: (L, Arc<dyn TimeTravel>)) {
    let check = "charges_all_buckets_or_none";
    let (limiter, time) = t;
    let provider = (BucketKey::provider("contract-all"), bucket(5, 1, HOUR));
    let tenant = (
        BucketKey::tenant(fixtures::tenant(1), "contract-all"),
        bucket(1, 1, 2 * HOUR),
    );
    let both = [provider.clone(), tenant];
    assert_granted(
        check,
        "provider and tenant both full",
        acquire(check, &limiter, &both, 1).await,
    );
    for _ in 0..3 {
        let retry_at = denied(
            check,
            "an empty tenant bucket",
            acquire(check, &limiter, &both, 1).await,
        );
        assert!(
            retry_at > time.now() + HOUR,
            "{check}: retry_at {retry_at:?} is not the tenant's refill, two hours away"
        );
    }
    let alone = std::slice::from_ref(&provider);
    assert_granted(
        check,
        "the provider's 4 remaining tokens: denied calls must not charge it",
        acquire(check, &limiter, alone, 4).await,
    );
    let retry_at = denied(
        check,
        "an empty provider bucket",
        acquire(check, &limiter, alone, 1).await,
    );
    let now = time.now();
    assert!(
        retry_at > now && retry_at <= now + HOUR,
        "{check}: the provider's retry_at {retry_at:?} is not within its hour"
    );
    let retry_at = denied(
        check,
        "both buckets empty",
        acquire(check, &limiter, &both, 1).await,
    );
    assert!(
        retry_at > time.now() + HOUR,
        "{check}: with both short, retry_at {retry_at:?} must be the slower bucket's"
    );
}

/// After `drain_until`, the bucket denies until `until` with a `retry_at` not before it, a
/// shorter drain does not cut the hold, and the tokens come back at `until`.
pub async fn drain_until_denies_until_then<L: RateLimiter>(t: (L, Arc<dyn TimeTravel>)) {
    let check = "drain_until_denies_until_then";
    let (limiter, time) = t;
    let (key, resend) = (BucketKey::provider("contract-drain"), bucket(2, 2, SHORT));
    let buckets = [(key.clone(), resend)];
    let until = time.now() + SHORT;
    limiter
        .drain_until(&key, resend, until)
        .await
        .unwrap_or_else(|e| panic!("{check}: drain_until failed: {e}"));
    let retry_at = denied(
        check,
        "a drained bucket",
        acquire(check, &limiter, &buckets, 1).await,
    );
    assert!(
        retry_at >= until && retry_at < until + SHORT,
        "{check}: retry_at {retry_at:?} is not at until {until:?}"
    );
    limiter
        .drain_until(&key, resend, time.now())
        .await
        .unwrap_or_else(|e| panic!("{check}: drain_until failed: {e}"));
    let retry_at = denied(
        check,
        "a bucket drained again with an earlier until",
        acquire(check, &limiter, &buckets, 1).await,
    );
    assert!(
        retry_at >= until,
        "{check}: an earlier until shortened the hold to {retry_at:?}"
    );
    let halfway = until
        .duration_since(time.now())
        .unwrap_or_default()
        .checked_div(2)
        .unwrap_or_default();
    time.advance(halfway).await;
    denied(
        check,
        "halfway to until",
        acquire(check, &limiter, &buckets, 1).await,
    );
    advance_to(time.as_ref(), retry_at).await;
    assert_granted(
        check,
        "at until",
        acquire(check, &limiter, &buckets, 2).await,
    );
}

/// Buckets that cannot work are refused by [`Bucket::new`] and by the limiter (the fields are
/// public), as are a cost above a capacity and a key listed twice; a refused call charges
/// nothing.
pub async fn rejects_invalid_buckets<L: RateLimiter>(t: (L, Arc<dyn TimeTravel>)) {
    let check = "rejects_invalid_buckets";
    let (limiter, _time) = t;
    let second = Duration::from_secs(1);
    assert_invalid(check, "zero capacity", Bucket::new(0, 1, second));
    assert_invalid(check, "zero refill", Bucket::new(1, 0, second));
    assert_invalid(check, "zero interval", Bucket::new(1, 1, Duration::ZERO));

    // A zero bucket cannot reach a limiter: only `Bucket::new` makes one.
    let valid = (BucketKey::provider("contract-valid"), bucket(2, 1, HOUR));
    assert_invalid(
        check,
        "a cost above the capacity",
        limiter.acquire(std::slice::from_ref(&valid), 3).await,
    );
    assert_invalid(
        check,
        "a key listed twice",
        limiter.acquire(&[valid.clone(), valid.clone()], 1).await,
    );
    assert_granted(
        check,
        "the whole capacity after refused calls",
        acquire(check, &limiter, std::slice::from_ref(&valid), 2).await,
    );
}

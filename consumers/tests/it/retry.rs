//! Properties of the retry policy: the standard's numbers, the jitter bounds, the cap, and a
//! ceiling that never shrinks.

use std::time::Duration;

use jobs_consumers::{Backoff, PolicyError, QueuePolicy, RetryPolicy};
use proptest::prelude::*;

#[test]
fn the_default_is_the_standards_policy() {
    let policy = RetryPolicy::default();
    assert_eq!(policy.max_attempts(), 5);
    let ceilings: Vec<u64> = (1..=6).map(|n| policy.ceiling(n).as_secs()).collect();
    assert_eq!(ceilings, [30, 60, 120, 240, 480, 960]);
    assert_eq!(policy.ceiling(8).as_secs(), 3600, "capped at one hour");
    for attempt in 1..5 {
        assert!(matches!(policy.after_failure(attempt), Backoff::RetryIn(_)));
    }
    assert_eq!(policy.after_failure(5), Backoff::Exhausted);
    assert_eq!(policy.after_failure(6), Backoff::Exhausted);
}

#[test]
fn nonsense_policies_are_refused() {
    let s = Duration::from_secs;
    assert_eq!(
        RetryPolicy::new(0, s(1), s(2)),
        Err(PolicyError::NoAttempts)
    );
    assert_eq!(RetryPolicy::new(3, s(0), s(2)), Err(PolicyError::ZeroBase));
    assert!(matches!(
        RetryPolicy::new(3, s(5), s(2)),
        Err(PolicyError::CapBelowBase { .. })
    ));
}

#[test]
fn a_cap_may_reach_thirty_days_and_no_further() {
    let day = Duration::from_secs(86_400);
    assert_eq!(jobs_consumers::MAX_BACKOFF, day * 30);
    let month = RetryPolicy::new(40, Duration::from_secs(1), day * 30).expect("thirty days");
    assert_eq!(month.ceiling(40), day * 30);
    let beyond = day * 30 + Duration::from_secs(1);
    assert_eq!(
        RetryPolicy::new(3, Duration::from_secs(1), beyond),
        Err(PolicyError::CapTooLong { cap: beyond })
    );
}

#[test]
fn an_override_needs_a_rationale() {
    let queue = "billing.invoices".parse().expect("valid");
    let policy = RetryPolicy::new(3, Duration::from_secs(1), Duration::from_secs(10)).expect("ok");
    assert!(matches!(
        QueuePolicy::new(queue, policy, "  "),
        Err(PolicyError::NoRationale { .. })
    ));
    let queue = "billing.invoices".parse().expect("valid");
    let ok = QueuePolicy::new(queue, policy, "the PSP retries on its side").expect("accepted");
    assert!(ok.to_string().contains("the PSP retries on its side"));
    assert_eq!(ok.rationale(), "the PSP retries on its side");
    assert_eq!(ok.queue().as_str(), "billing.invoices");
    assert_eq!(ok.policy(), policy);
}

fn policy() -> impl Strategy<Value = RetryPolicy> {
    (1u32..20, 1u64..120_000, 0u64..10_000_000).prop_map(|(max, base_ms, extra_ms)| {
        RetryPolicy::new(
            max,
            Duration::from_millis(base_ms),
            Duration::from_millis(base_ms + extra_ms),
        )
        .expect("valid by construction")
    })
}

proptest! {
    #[test]
    fn every_delay_lies_between_half_the_ceiling_and_the_ceiling(
        policy in policy(), attempt in 1u32..100, unit in 0.0f64..=1.0,
    ) {
        let d = policy.ceiling(attempt);
        let delay = policy.delay(attempt, unit);
        prop_assert!(delay >= d / 2 && delay <= d, "{delay:?} outside [{:?}, {d:?}]", d / 2);
    }

    #[test]
    fn the_ceiling_is_min_of_cap_and_doubling_base(policy in policy(), attempt in 1u32..100) {
        let base = policy.ceiling(1);
        let cap = policy.ceiling(200);
        let expected = if attempt > 32 {
            cap
        } else {
            base.checked_mul(1 << (attempt - 1)).map_or(cap, |d| d.min(cap))
        };
        prop_assert_eq!(policy.ceiling(attempt), expected);
    }

    #[test]
    fn the_ceiling_never_shrinks(policy in policy(), attempt in 1u32..100) {
        prop_assert!(policy.ceiling(attempt + 1) >= policy.ceiling(attempt));
    }

    #[test]
    fn attempts_stop_exactly_at_the_maximum(policy in policy(), attempt in 1u32..40) {
        let exhausted = policy.after_failure(attempt) == Backoff::Exhausted;
        prop_assert_eq!(exhausted, attempt >= policy.max_attempts());
        if let Backoff::RetryIn(delay) = policy.after_failure(attempt) {
            let d = policy.ceiling(attempt);
            prop_assert!(delay >= d / 2 && delay <= d);
        }
    }
}

/// The jitter is real: draws spread over the whole `[d/2, d]` window rather than sitting at one
/// end of it (a constant, or a broken draw clamped to 0 or 1, passes the bounds alone).
#[test]
fn retries_of_a_burst_spread_over_the_whole_jitter_window() {
    let policy = RetryPolicy::default();
    let (half, ceiling) = (15_000.0, 30_000.0);
    let delays: Vec<f64> = (0..2_000)
        .map(|_| match policy.after_failure(1) {
            Backoff::RetryIn(delay) => delay.as_secs_f64() * 1000.0,
            Backoff::Exhausted => unreachable!("attempt 1 of 5"),
        })
        .collect();
    assert!(delays.iter().all(|d| (half..=ceiling).contains(d)));
    let min = delays.iter().copied().fold(f64::INFINITY, f64::min);
    let max = delays.iter().copied().fold(0.0, f64::max);
    let mean = delays.iter().sum::<f64>() / delays.len() as f64;
    // For 2,000 uniform draws each of these fails with a probability below 1e-40.
    assert!(
        min < half + 0.1 * half,
        "lowest delay {min} ms: no draw near d/2"
    );
    assert!(
        max > ceiling - 0.1 * half,
        "highest delay {max} ms: no draw near d"
    );
    assert!(
        (21_500.0..23_500.0).contains(&mean),
        "mean delay {mean} ms, expected about 22,500"
    );
    let mut distinct = delays;
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    assert!(distinct.len() > 1_900, "{} distinct delays", distinct.len());
}

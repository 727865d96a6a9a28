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

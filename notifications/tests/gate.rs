//! The priority gate against a reference model over arbitrary depth sequences.

use jobs_notifications::{Gate, PriorityGate};
use proptest::prelude::*;

#[test]
fn thresholds_without_hysteresis_are_refused() {
    let refused = PriorityGate::new(10, 10).expect_err("no hysteresis");
    assert_eq!(
        refused.to_string(),
        "resume_at (10) must be below pause_above (10) for hysteresis"
    );
    assert!(PriorityGate::new(10, 11).is_err());
    assert!(PriorityGate::new(10, 9).is_ok());
}

proptest! {
    #[test]
    fn marketing_pauses_above_and_resumes_only_after_draining(
        pause in 1u64..500,
        gap in 1u64..500,
        depths in prop::collection::vec(0u64..1_000, 1..200),
    ) {
        let resume = pause.saturating_sub(gap);
        let mut gate = PriorityGate::new(pause, resume).expect("valid thresholds");
        let mut paused = false;
        for depth in depths {
            let state = gate.observe(depth);
            if depth > pause {
                prop_assert_eq!(state, Gate::Paused, "open while transactional depth {} > {}", depth, pause);
                paused = true;
            } else if depth <= resume {
                prop_assert_eq!(state, Gate::Open, "paused though drained to {}", depth);
                paused = false;
            } else {
                let expected = if paused { Gate::Paused } else { Gate::Open };
                prop_assert_eq!(state, expected, "flapped at depth {}", depth);
            }
        }
    }
}

//! What becomes of a delivery, decided in one place and without I/O.
//!
//! Whichever loop ran a job (per job, or in a group) reports how its try ended ([`Tried`]);
//! [`verdict`] turns that, the attempt, the queue's policy, the time and a jitter draw into
//! one [`Verdict`]; the loop then applies it: per job through the transport, grouped as a
//! settlement inside the group's transaction. So "retry, defer or dead-letter, and why" is
//! written once, and tested without a transport, a store or a clock.

use std::time::{Duration, SystemTime};

use jobs_core::ErrorClass;

use crate::handler::JobError;
use crate::retry::RetryPolicy;

/// What became of one delivery. Non-exhaustive, so that a new way for a delivery to end
/// breaks no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler's work committed and the message was acked.
    Processed,
    /// The job had been processed before: acked without running the handler.
    Duplicate,
    /// Released for another attempt at this time.
    Retrying {
        /// When the next attempt becomes due.
        at: SystemTime,
    },
    /// Released without spending an attempt (rate limited, store unavailable).
    Deferred {
        /// When it becomes due again.
        until: SystemTime,
    },
    /// Recorded in the dead letters and acked.
    DeadLettered {
        /// The dead letter.
        id: jobs_core::DeadLetterId,
        /// Why.
        reason: DeadReason,
    },
    /// Nothing could be settled (the transport or the dead-letter store failed): the lease
    /// will expire and the message come back. Nothing is lost.
    Unsettled {
        /// What failed.
        error: String,
    },
}

/// Why a job was dead-lettered: the store's [`DeadLetterReason`](jobs_core::DeadLetterReason),
/// kept with the letter, labelling `jobs_dead_lettered_total{reason}` and the logs. The
/// runtime gives the first four (`Poison`, `UnknownKind` after every attempt the policy allows
/// as ADR 0012 says, `Permanent`, `Exhausted`).
pub use jobs_core::DeadLetterReason as DeadReason;

/// How one try of a delivery ended, before anything is settled: what [`verdict`] decides on.
#[derive(Debug)]
pub(crate) enum Tried {
    /// The handler's work committed with the job's claim (grouped: it will, with its group).
    Committed,
    /// The job was settled before (processed, or dead-lettered): its handler did not run.
    Duplicate,
    /// The handler, or its wait to be ready, said why it did not finish.
    Failed(JobError),
    /// No handler runs it (poison, a kind no handler knows, an attempt beyond the policy's),
    /// as the triage found.
    Rejected {
        /// What it would be dead-lettered as.
        reason: DeadReason,
        /// Why, naming the field for poison.
        error: String,
    },
    /// The store failed (to begin, claim or commit): the `failures`-th time in a row.
    StoreFailed {
        /// Store failures in a row, this one included (at least 1).
        failures: u32,
        /// Whether the failure may pass ([`ErrorClass`]).
        class: ErrorClass,
        /// What failed.
        error: String,
    },
    /// The lease went to another worker while the job ran: nothing of it may be settled.
    LeaseLost,
}

/// What becomes of a delivery: every way one can end.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Done: ack it.
    Processed,
    /// Settled before: ack it.
    Duplicate,
    /// Another attempt at `at`, `delay` from now; once the attempts are spent, such a failure
    /// is dead-lettered as `cause` ([`DeadReason::Exhausted`] or [`DeadReason::UnknownKind`]).
    RetryAt {
        /// When the next attempt becomes due.
        at: SystemTime,
        /// The backoff drawn.
        delay: Duration,
        /// The dead letter's reason once no attempt is left.
        cause: DeadReason,
        /// Why this attempt failed.
        error: String,
    },
    /// Back at this time without spending an attempt: the handler asked for it.
    DeferUntil(SystemTime),
    /// The store failed: back after `wait` without spending an attempt, so an outage never
    /// exhausts a job's retries (the dead letters live in that store too).
    GiveBack {
        /// When it becomes due again.
        until: SystemTime,
        /// The wait, growing with the failures in a row as the retry policy's backoff does.
        wait: Duration,
        /// Whether the failure may pass: one that cannot (a missing table) is logged louder.
        class: ErrorClass,
        /// What failed.
        error: String,
    },
    /// Nothing may be settled (the lease is lost): the message comes back on its own.
    Unsettled,
    /// Record the dead letter, then ack it.
    DeadLetter {
        /// Why.
        reason: DeadReason,
        /// The last error, naming the field for poison.
        error: String,
    },
}

/// The verdict on a delivery at `attempt` (1 for the first) whose try ended as `tried`, by
/// `policy`, at `now`. `jitter` draws a number in `[0, 1]` for a retry's backoff; it is
/// called only when the verdict is a retry, so a job that succeeds draws nothing.
pub(crate) fn verdict(
    tried: Tried,
    attempt: u32,
    policy: &RetryPolicy,
    now: SystemTime,
    jitter: impl FnOnce() -> f64,
) -> Verdict {
    let retry = |cause: DeadReason, error: String| {
        if attempt >= policy.max_attempts() {
            return Verdict::DeadLetter {
                reason: cause,
                error,
            };
        }
        let delay = policy.delay(attempt, jitter());
        Verdict::RetryAt {
            at: after(now, delay),
            delay,
            cause,
            error,
        }
    };
    match tried {
        Tried::Committed => Verdict::Processed,
        Tried::Duplicate => Verdict::Duplicate,
        Tried::Failed(JobError::Defer { until }) => Verdict::DeferUntil(until),
        Tried::Failed(JobError::Permanent(e)) => Verdict::DeadLetter {
            reason: DeadReason::Permanent,
            error: e.to_string(),
        },
        Tried::Failed(JobError::Retry(e)) => retry(DeadReason::Exhausted, e.to_string()),
        Tried::Rejected {
            reason: DeadReason::UnknownKind,
            error,
        } => retry(DeadReason::UnknownKind, error),
        Tried::Rejected { reason, error } => Verdict::DeadLetter { reason, error },
        Tried::StoreFailed {
            failures,
            class,
            error,
        } => {
            let wait = policy.ceiling(failures);
            Verdict::GiveBack {
                until: after(now, wait),
                wait,
                class,
                error,
            }
        }
        Tried::LeaseLost => Verdict::Unsettled,
    }
}

/// `now + by`, or `now` itself should a clock set absurdly far overflow: a job comes back at
/// once rather than the worker panicking.
fn after(now: SystemTime, by: Duration) -> SystemTime {
    now.checked_add(by).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::new(3, Duration::from_secs(30), Duration::from_secs(3_600)).expect("valid")
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)
    }

    fn decide(tried: Tried, attempt: u32) -> Verdict {
        verdict(tried, attempt, &policy(), now(), || 1.0)
    }

    #[test]
    fn a_committed_or_settled_job_is_acked() {
        assert_eq!(decide(Tried::Committed, 1), Verdict::Processed);
        assert_eq!(decide(Tried::Duplicate, 3), Verdict::Duplicate);
        assert_eq!(decide(Tried::LeaseLost, 1), Verdict::Unsettled);
    }

    #[test]
    fn a_failure_is_retried_after_the_drawn_backoff_until_the_attempts_are_spent() {
        let failed = || Tried::Failed(JobError::retry("boom"));
        let drawn = |attempt, unit| verdict(failed(), attempt, &policy(), now(), || unit);
        assert_eq!(
            drawn(1, 0.0),
            Verdict::RetryAt {
                at: now() + Duration::from_secs(15),
                delay: Duration::from_secs(15),
                cause: DeadReason::Exhausted,
                error: "boom".to_owned(),
            },
            "half the ceiling at the lowest draw"
        );
        let Verdict::RetryAt { delay, .. } = drawn(2, 1.0) else {
            panic!("attempt 2 of 3 retries");
        };
        assert_eq!(
            delay,
            Duration::from_secs(60),
            "the whole ceiling at the highest"
        );
        assert_eq!(
            drawn(3, 0.5),
            Verdict::DeadLetter {
                reason: DeadReason::Exhausted,
                error: "boom".to_owned()
            },
            "the last attempt"
        );
        assert!(
            matches!(drawn(9, 0.5), Verdict::DeadLetter { .. }),
            "and beyond"
        );
    }

    #[test]
    fn the_jitter_is_drawn_only_for_a_retry() {
        let drawn = std::cell::Cell::new(0);
        let jitter = || {
            drawn.set(drawn.get() + 1);
            0.5
        };
        verdict(Tried::Committed, 1, &policy(), now(), jitter);
        verdict(
            Tried::Failed(JobError::retry("x")),
            3,
            &policy(),
            now(),
            jitter,
        );
        assert_eq!(drawn.get(), 0, "a success and a last attempt draw nothing");
        verdict(
            Tried::Failed(JobError::retry("x")),
            1,
            &policy(),
            now(),
            jitter,
        );
        assert_eq!(drawn.get(), 1);
    }

    #[test]
    fn a_permanent_failure_or_poison_is_dead_lettered_at_once() {
        assert_eq!(
            decide(Tried::Failed(JobError::permanent("refused")), 1),
            Verdict::DeadLetter {
                reason: DeadReason::Permanent,
                error: "refused".to_owned()
            }
        );
        for reason in [DeadReason::Poison, DeadReason::Exhausted] {
            let tried = Tried::Rejected {
                reason,
                error: "`kind`: bad".to_owned(),
            };
            assert_eq!(
                decide(tried, 1),
                Verdict::DeadLetter {
                    reason,
                    error: "`kind`: bad".to_owned()
                }
            );
        }
    }

    #[test]
    fn an_unknown_kind_is_retried_like_a_failure_then_dead_lettered_as_unknown() {
        let unknown = || Tried::Rejected {
            reason: DeadReason::UnknownKind,
            error: "no handler".to_owned(),
        };
        assert!(matches!(
            decide(unknown(), 1),
            Verdict::RetryAt {
                cause: DeadReason::UnknownKind,
                ..
            }
        ));
        assert_eq!(
            decide(unknown(), 3),
            Verdict::DeadLetter {
                reason: DeadReason::UnknownKind,
                error: "no handler".to_owned()
            }
        );
    }

    #[test]
    fn a_deferral_keeps_its_time_and_a_store_failure_gives_back_after_a_growing_wait() {
        let until = now() + Duration::from_secs(7);
        assert_eq!(
            decide(Tried::Failed(JobError::Defer { until }), 5),
            Verdict::DeferUntil(until),
            "whatever the attempt: a deferral spends none"
        );
        let failed = |failures| Tried::StoreFailed {
            failures,
            class: ErrorClass::Retryable,
            error: "down".to_owned(),
        };
        for (failures, wait) in [(1, 30), (2, 60), (3, 120), (40, 3_600)] {
            let Verdict::GiveBack { until, wait: w, .. } = decide(failed(failures), 3) else {
                panic!("a store failure gives back");
            };
            assert_eq!(w, Duration::from_secs(wait), "after {failures} failures");
            assert_eq!(until, now() + w);
        }
    }

    #[test]
    fn an_absurd_clock_never_overflows() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::MAX / 2);
        let retried = verdict(
            Tried::Failed(JobError::retry("x")),
            1,
            &policy(),
            end,
            || 1.0,
        );
        assert!(matches!(retried, Verdict::RetryAt { .. }), "{retried:?}");
    }
}

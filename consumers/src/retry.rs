//! When to try a failed job again, and when to give up.
//!
//! The standard's default: 5 attempts in total, exponential backoff with jitter, base 30 s,
//! cap 1 h. After failed attempt `n` the ceiling is `d = min(cap, base · 2^(n-1))` and the delay
//! is drawn uniformly from `[d/2, d]` ("equal jitter"): retries of a burst spread out, yet none
//! comes back sooner than half the ceiling.

use std::fmt;
use std::time::Duration;

use jobs_core::QueueName;
use thiserror::Error;

/// A retry policy: how many attempts in total, and the backoff between them.
///
/// ```
/// use jobs_consumers::{Backoff, RetryPolicy};
/// use std::time::Duration;
///
/// let policy = RetryPolicy::default();
/// assert_eq!(policy.ceiling(1), Duration::from_secs(30));
/// assert_eq!(policy.ceiling(3), Duration::from_secs(120));
/// assert_eq!(policy.ceiling(20), Duration::from_secs(3600));
/// match policy.after_failure(1) {
///     Backoff::RetryIn(delay) => assert!(delay >= Duration::from_secs(15) && delay <= Duration::from_secs(30)),
///     Backoff::Exhausted => unreachable!(),
/// }
/// assert_eq!(policy.after_failure(5), Backoff::Exhausted);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
}

impl Default for RetryPolicy {
    /// The standard's default: 5 attempts, base 30 s, cap 1 h.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(30),
            cap: Duration::from_secs(60 * 60),
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Try again after this delay.
    RetryIn(Duration),
    /// That was the last attempt: dead-letter the job.
    Exhausted,
}

/// A policy that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Fewer than one attempt.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// A zero base delay would retry in a hot loop.
    #[error("the base delay must be greater than zero")]
    ZeroBase,
    /// The cap is below the base.
    #[error("the cap ({cap:?}) must not be below the base ({base:?})")]
    CapBelowBase {
        /// The base delay.
        base: Duration,
        /// The cap.
        cap: Duration,
    },
    /// A cap beyond [`MAX_BACKOFF`]: a retry that far out is a dead letter in disguise.
    #[error("the cap ({cap:?}) must not be beyond {MAX_BACKOFF:?}")]
    CapTooLong {
        /// The cap.
        cap: Duration,
    },
    /// An override without a reason: the standard asks for a rationale.
    #[error("a per-queue override of the retry policy for `{queue}` needs a rationale")]
    NoRationale {
        /// The queue whose override lacks one.
        queue: QueueName,
    },
}

/// The longest backoff a policy may have: thirty days.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30 * 86_400);

impl RetryPolicy {
    /// A policy of `max_attempts` in total, backing off from `base` up to `cap`.
    pub fn new(max_attempts: u32, base: Duration, cap: Duration) -> Result<Self, PolicyError> {
        if max_attempts == 0 {
            return Err(PolicyError::NoAttempts);
        }
        if base.is_zero() {
            return Err(PolicyError::ZeroBase);
        }
        if cap < base {
            return Err(PolicyError::CapBelowBase { base, cap });
        }
        if cap > MAX_BACKOFF {
            return Err(PolicyError::CapTooLong { cap });
        }
        Ok(RetryPolicy {
            max_attempts,
            base,
            cap,
        })
    }

    /// Attempts in total, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The upper bound of the delay after failed attempt `attempt` (1-based):
    /// `min(cap, base · 2^(attempt-1))`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        self.base
            .checked_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The delay after failed attempt `attempt` for a jitter draw `unit` in `[0, 1]`:
    /// `d/2 + unit · d/2` with `d` the [ceiling](Self::ceiling). Pure, for tests and models.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(unit.clamp(0.0, 1.0))
    }

    /// What to do after failed attempt `attempt` (1-based), drawing the jitter at random.
    pub fn after_failure(&self, attempt: u32) -> Backoff {
        if attempt >= self.max_attempts {
            return Backoff::Exhausted;
        }
        Backoff::RetryIn(self.delay(attempt, random_unit()))
    }
}

/// A uniform draw from `[0, 1)`.
pub(crate) fn random_unit() -> f64 {
    unit_from(getrandom::u64().ok())
}

/// `random` bits as a draw from `[0, 1)`; the midpoint when the system's source failed, so a
/// retry still backs off by three quarters of its ceiling rather than not at all.
fn unit_from(random: Option<u64>) -> f64 {
    let Some(random) = random else {
        return 0.5;
    };
    // 53 random bits make every f64 in [0, 1) with that spacing equally likely.
    let bits = random >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// A queue's own retry policy, with the reason it departs from the default.
///
/// The standard allows overriding the policy per queue "with rationale in the module spec";
/// the rationale is mandatory here and logged when a worker starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePolicy {
    queue: QueueName,
    policy: RetryPolicy,
    rationale: String,
}

impl QueuePolicy {
    /// Overrides the policy of `queue`; refused without a non-blank `rationale`.
    pub fn new(
        queue: QueueName,
        policy: RetryPolicy,
        rationale: impl Into<String>,
    ) -> Result<Self, PolicyError> {
        let rationale = rationale.into();
        if rationale.trim().is_empty() {
            return Err(PolicyError::NoRationale { queue });
        }
        Ok(QueuePolicy {
            queue,
            policy,
            rationale,
        })
    }

    /// The queue it applies to.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The policy.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// Why the queue departs from the default.
    pub fn rationale(&self) -> &str {
        &self.rationale
    }
}

impl fmt::Display for QueuePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.policy;
        write!(
            f,
            "{}: {} attempts, base {:?}, cap {:?} ({})",
            self.queue, p.max_attempts, p.base, p.cap, self.rationale
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_take_the_top_53_bits_and_a_failed_source_gives_the_midpoint() {
        assert_eq!(unit_from(None), 0.5);
        assert_eq!(unit_from(Some(0)), 0.0);
        assert_eq!(unit_from(Some(1 << 63)), 0.5);
        assert_eq!(unit_from(Some(1 << 62)), 0.25);
        // The low 11 bits are dropped; all ones is the largest draw below 1.
        assert_eq!(unit_from(Some((1 << 11) - 1)), 0.0);
        assert_eq!(unit_from(Some(u64::MAX)), 1.0 - f64::EPSILON / 2.0);
    }
}

//! Time as a port, so that every time-dependent piece can be tested without sleeping.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
///
/// Adapters and runtimes take an `Arc<dyn Clock>` rather than calling [`SystemTime::now`], so
/// tests drive delays, leases and backoff with a [`ManualClock`] instead of real time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock: the production default.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use jobs_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now(), start + Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.lock() += by;
    }

    /// Sets the time to `to`, which may lie in the past (to test clock skew).
    pub fn set(&self, to: SystemTime) {
        *self.lock() = to;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SystemTime> {
        // A panic while holding the guard cannot leave a SystemTime half-written.
        self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for ManualClock {
    /// Starts at 2026-01-01T00:00:00Z, a fixed instant so that test output is reproducible.
    fn default() -> Self {
        ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_767_225_600))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.lock()
    }
}

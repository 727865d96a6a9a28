//! Test support for softcrum-jobs and for the modules built on it.
//!
//! - [`contract`]: suites of checks that every implementation of a port must pass. An adapter
//!   gets its coverage with one call from its own tests.
//! - [`mock`]: mockall mocks of the ports, for unit tests of code that publishes or consumes.
//! - [`TimeTravel`]: how a suite moves time, a manual clock for in-process transports.
//! - [`fixtures`]: envelopes and ids for tests.
//! - [`eventually`]: a wait for a condition that fails, rather than hangs, past its deadline.
//! - [`fakes`]: local servers that speak a vendor's HTTP API, with fault hooks.
//! - [`emulators`]: vendors' own local emulators (Vercel Queues), started per test.
//!
//! - [`faults`]: ports that fail on cue, e.g. a worker dying between commit and ack.
//! - [`model`]: model-based property tests of the worker runtime, for any store.
//! - [`grouped`]: the grouped runtime's behaviour suite, for any queue that settles inside
//!   its store's transactions.
//!
//! This crate depends on `jobs-core` and `jobs-consumers`, never on an adapter, so that an
//! adapter can dev-depend on it without two copies of its own types in one test build.

pub mod contract;
pub mod emulators;
pub mod fakes;
pub mod faults;
pub mod fixtures;
pub mod grouped;
pub mod model;

/// Waits until `done` holds, looking every 10 ms of the runtime's time, for at most `within`
/// of it (at once with time paused): a wait that would never end fails, saying `what`,
/// instead of hanging the run.
pub async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    within: std::time::Duration,
    mut done: impl FnMut() -> F,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// mockall mocks of the ports a module's code most often calls, re-exported from `jobs-core`'s
/// `mock` feature (which has the others too).
///
/// Set expectations on what a module publishes, then run it against the mock; the whole
/// example lives in `testkit/tests/mock_publisher.rs`.
///
/// ```no_run
/// use jobs_testkit::mock::MockQueuePort;
/// use jobs_core::Receipt;
///
/// let mut queue = MockQueuePort::new();
/// queue
///     .expect_publish()
///     .withf(|name, envelope, _| name.as_str() == "billing.invoices" && envelope.kind.as_str() == "billing.invoice_issued")
///     .times(1)
///     .returning(|_, _, _| Ok(Receipt::queued(None)));
/// ```
pub mod mock {
    pub use jobs_core::{
        MockAlerter, MockDeadLetterStore, MockProcessedJobs, MockPullPort, MockQueueDepth,
        MockQueuePort, MockSettlePort,
    };
}

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{Clock, ManualClock};

/// How a contract suite moves time forward for the transport under test.
///
/// In-process transports run on a [`ManualClock`], which jumps instantly. A transport that
/// keeps its own time (a real server) implements this by sleeping, with short leases.
#[async_trait]
pub trait TimeTravel: Send + Sync {
    /// The transport's current time.
    fn now(&self) -> SystemTime;

    /// Lets `by` pass for the transport.
    async fn advance(&self, by: Duration);
}

#[async_trait]
impl TimeTravel for ManualClock {
    fn now(&self) -> SystemTime {
        Clock::now(self)
    }

    async fn advance(&self, by: Duration) {
        ManualClock::advance(self, by);
    }
}

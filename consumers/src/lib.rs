//! The worker runtime of softcrum-jobs: idempotent, retrying, dead-lettering consumption over
//! the `jobs-core` ports.
//!
//! A [`Worker`] consumes one queue as one consumer. Every delivery is decoded (poison goes
//! straight to the dead letters), claimed in `processed_jobs` inside the store's work
//! transaction (a duplicate is acked and skipped), handled in that same transaction, committed
//! and only then acked. Failures are retried with the [`RetryPolicy`]'s backoff; exhausted and
//! permanent failures are dead-lettered, alerted (coalesced) and acked; a failure to record the
//! dead letter leaves the message unacked, so nothing is lost.
//!
//! This crate depends on `jobs-core` only: transports, stores and alerters are chosen by the
//! composition root.

mod alerts;
mod cleanup;
mod dead_letters;
mod group;
mod handler;
mod retry;
mod throttle;
mod worker;

pub use alerts::{ALERT_BUFFER, CoalescingAlerter, ConsoleAlerter};
pub use cleanup::{
    CLEANUP_KIND, CleanupRequest, DEFAULT_PROCESSED_TTL, MIN_JOB_TTL, ProcessedCleanup,
};
pub use dead_letters::{DeadLetters, ReplayError, Replayed};
pub use handler::{BoxError, Cancellation, Handler, Job, JobError};
pub use retry::{Backoff, MAX_BACKOFF, PolicyError, QueuePolicy, RetryPolicy};
pub use throttle::{MAX_TOKEN_WAIT, Throttled};
pub use worker::{
    DeadReason, Drained, MAX_GROUP_SIZE, Outcome, Worker, WorkerBuilder, WorkerConfig, WorkerError,
};

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
//! The crate's map: `worker` (the [`Worker`], its builder and configuration, the per-job loop)
//! and `grouped` (the grouped loop, for a queue in the store's own database) drive
//! deliveries; both borrow `delivery`'s context (triage, a handler within its time limit, one
//! job's work transaction, settlement through the transport, dead letters, metrics) and
//! `lifecycle` (heartbeat, reaping, the drain at shutdown), and apply the one decision of
//! `verdict` on what becomes of a delivery. `handler` is what users implement; `retry`,
//! `alerts`, `throttle`, `cleanup` and `dead_letters` are the policies and tools around it.
//!
//! This crate depends on `jobs-core` only: transports, stores and alerters are chosen by the
//! composition root.

mod alerts;
mod cleanup;
mod dead_letters;
mod delivery;
mod grouped;
mod handler;
mod lifecycle;
mod retry;
mod throttle;
mod verdict;
mod worker;

pub use alerts::{ALERT_BUFFER, CoalescingAlerter, ConsoleAlerter};
pub use cleanup::{
    CLEANUP_KIND, CleanupRequest, DEFAULT_PROCESSED_TTL, MIN_JOB_TTL, ProcessedCleanup, PurgeError,
};
pub use dead_letters::{DeadLetters, ReplayError, Replayed};
pub use handler::{BoxError, Cancellation, Handler, Job, JobError};
pub use lifecycle::Drained;
pub use retry::{Backoff, MAX_BACKOFF, PolicyError, QueuePolicy, RetryPolicy};
pub use throttle::{MAX_TOKEN_WAIT, Throttled};
pub use verdict::{DeadReason, Outcome};
pub use worker::{MAX_GROUP_SIZE, Worker, WorkerBuilder, WorkerConfig, WorkerError};

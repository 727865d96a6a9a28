//! Notification rails over the `jobs-core` ports: one queue per channel per rail
//! (`notif.{channel}.transactional` and `notif.{channel}.marketing`, see [`Rail::queue`]),
//! with transactional traffic always first.
//!
//! - The priority rule: [`PriorityGate`] decides, with hysteresis so workers do not flap, and
//!   [`TransactionalFirst`] applies it as a layer over a marketing queue's consuming side, so an
//!   unchanged worker stops fetching marketing while the transactional queue of its channel is
//!   deep.
//! - Email: [`publish_emails`] splits a blast into chunk jobs of at most the provider's batch
//!   size, each with an idempotency key derived from the blast's id and the chunk's index;
//!   [`EmailSender`] sends one chunk per job through the [`jobs_core::EmailProvider`] port and
//!   turns the answer into a [`SendError`] verdict: a 429 defers (and drains the provider's
//!   bucket so every worker backs off), 5xx and timeouts retry, 4xx are permanent.
//!
//! This crate depends on `jobs-core` only. A worker runtime composes the two halves: the
//! tokens of [`ProviderLimits::buckets`] taken first (both or neither), then
//! [`EmailSender::send`], its verdict mapped onto the runtime's defer, retry or dead letter
//! (`jobs_ops::notify` does this with `jobs-consumers`).

mod email;
mod priority;
mod rail;

pub use email::{
    Blast, DEFAULT_RATE_LIMIT_BACKOFF, EmailChunk, EmailSender, ProviderLimits, SEND_EMAIL_KIND,
    SendError, chunk_emails, publish_emails,
};
pub use priority::TransactionalFirst;
pub use rail::{Rail, marketing, transactional};

/// Whether marketing workers of a channel may fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Fetch marketing messages.
    Open,
    /// Stop fetching; let in-flight sends finish. Nothing is dropped: messages wait queued.
    Paused,
}

/// Pauses marketing when transactional depth rises above `pause_above`, and resumes only once
/// it falls to `resume_at` or below; depths in between keep the current state.
///
/// ```
/// use jobs_notifications::{Gate, PriorityGate};
///
/// let mut gate = PriorityGate::new(100, 20)?;
/// assert_eq!(gate.observe(150), Gate::Paused);
/// assert_eq!(gate.observe(50), Gate::Paused); // still draining: no flapping
/// assert_eq!(gate.observe(20), Gate::Open);
/// # Ok::<(), jobs_notifications::GateError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGate {
    pause_above: u64,
    resume_at: u64,
    state: Gate,
}

/// Thresholds that would flap or never resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateError {
    /// The pause threshold given.
    pub pause_above: u64,
    /// The resume threshold given.
    pub resume_at: u64,
}

impl std::fmt::Display for GateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "resume_at ({}) must be below pause_above ({}) for hysteresis",
            self.resume_at, self.pause_above
        )
    }
}

impl std::error::Error for GateError {}

impl PriorityGate {
    /// A gate, open, with the given thresholds; `resume_at` must be below `pause_above`.
    pub fn new(pause_above: u64, resume_at: u64) -> Result<Self, GateError> {
        if resume_at >= pause_above {
            return Err(GateError {
                pause_above,
                resume_at,
            });
        }
        Ok(PriorityGate {
            pause_above,
            resume_at,
            state: Gate::Open,
        })
    }

    /// Updates the gate with the transactional queue's current depth.
    pub fn observe(&mut self, transactional_depth: u64) -> Gate {
        self.state = match self.state {
            Gate::Open if transactional_depth > self.pause_above => Gate::Paused,
            Gate::Paused if transactional_depth <= self.resume_at => Gate::Open,
            unchanged => unchanged,
        };
        self.state
    }

    /// The current state.
    pub fn state(&self) -> Gate {
        self.state
    }
}

//! The worker runtime of softcrum-jobs: idempotent, retrying, dead-lettering consumption over
//! the `jobs-core` ports.
//!
//! It depends on `jobs-core` only; transports and stores are chosen by the composition root.
//! Today it holds the retry policy; the runtime that applies it is being built.

mod retry;

pub use retry::{Backoff, PolicyError, QueuePolicy, RetryPolicy};

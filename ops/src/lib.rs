//! The library a module binary depends on: [`process`], a production worker process in a few
//! lines; [`config`], every key and where its value comes from; [`compose`], the composition
//! root that builds the ports from configuration exactly as `jobsctl` does; [`console`], the
//! operations console's routes; [`standing`], the cron scheduler's and the outbox relay's
//! loops; [`notify`], the email handler composed for the runtime.
//!
//! Each adapter is a cargo feature (`postgres`, `sqlite`, `redis`, `vercel-queues`,
//! `qstash`, `resend`, `betterstack`), none on by default: with none, the library composes
//! only the in-process defaults, and refuses any other scheme naming the feature it needs.
//! `jobsctl` (its own crate) enables them all.

pub mod bulk;
pub mod compose;
pub mod config;
pub mod console;
pub mod hosts;
pub mod listen;
pub mod notify;
pub mod process;
pub mod standing;

//! The library a module binary depends on, and the half of `jobsctl` that is not its command
//! line: [`process`], a production worker process in a few lines; [`compose`], the
//! composition root that builds the ports from configuration exactly as `jobsctl` does;
//! [`console`], the operations console's routes;
//! [`standing`], the cron scheduler's and the outbox relay's loops; [`notify`], the email
//! handler composed for the runtime. Each adapter is a cargo feature; `jobsctl` (the
//! default) enables them all.

pub mod compose;
pub mod config;
pub mod console;
pub mod notify;
pub mod process;
pub mod standing;

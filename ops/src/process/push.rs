//! The routes of the push transports, on the worker process's address: QStash delivers each
//! queue's jobs to `POST` on its destination's path, each request verified by signature
//! before anything of it is read; Vercel Queues calls `POST` [`VERCEL_CALLBACK_PATH`] once per
//! message when `VERCEL_QUEUES_PUSH=on`, each pushed payload run only once its receipt handle
//! is confirmed. A delivery for a queue the process does not serve is refused.
//!
//! Each transport is a module of its own, built with its adapter's feature.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use futures_util::future::BoxFuture;
use jobs_consumers::Outcome;
use jobs_core::{Delivery, QueueName, SettlePort};

use super::ProcessError;
use super::endpoints::Ping;
use crate::compose::{Config, Queue};

#[cfg(feature = "qstash")]
mod qstash;
#[cfg(feature = "vercel-queues")]
mod vercel;

/// The push transports this build serves: each answers whether the configured queue is its
/// own, pushed to this process.
const SERVED: &[Serve] = &[
    #[cfg(feature = "qstash")]
    qstash::serve,
    #[cfg(feature = "vercel-queues")]
    vercel::serve,
];

/// The path Vercel Queues' callbacks are served on.
pub const VERCEL_CALLBACK_PATH: &str = "/vercel/queues";

/// The push side of `queue`, when it is a push transport this build serves.
type Serve = fn(&Config, &Queue) -> Result<Option<Push>, ProcessError>;

/// A push transport: its deliveries come to routes of the process's HTTP server, and each is
/// settled as the answer to its request.
pub(super) struct Push {
    /// What the workers settle through.
    pub(super) settle: Arc<dyn SettlePort>,
    /// What the workers consume, for the start line.
    pub(super) transport: String,
    /// The routes, once the workers are built.
    pub(super) routes: Routes,
    /// Whether the transport answers, for `/readyz`, when its depth cannot tell (QStash
    /// reports depth only for its own queues).
    pub(super) ready: Option<Ping>,
}

/// Makes the routes that run each served queue's deliveries.
pub(super) type Routes = Box<dyn FnOnce(&Served) -> Result<Router, ProcessError> + Send>;

/// Each queue this process serves, with what runs one of its deliveries (its worker's
/// `process`).
pub(super) type Served = HashMap<QueueName, Run>;

/// Runs one delivery through a queue's worker.
pub(super) type Run = Arc<dyn Fn(Delivery) -> BoxFuture<'static, Outcome> + Send + Sync>;

/// The push side of the configured `queue`, when this build serves it pushed; `None` for a
/// transport the workers pull from.
pub(super) fn push(config: &Config, queue: &Queue) -> Result<Option<Push>, ProcessError> {
    for serve in SERVED {
        if let Some(push) = serve(config, queue)? {
            return Ok(Some(push));
        }
    }
    Ok(None)
}

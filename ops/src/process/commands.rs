//! What a module binary runs besides its workers, from the configuration they use: its
//! `migrate` (the framework's tables, then the module's own, in one command) and a publisher
//! opened without starting a worker, for its `publish`. `ops/examples/module.rs` is a binary
//! with `run`, `migrate` and `publish`, [`ProcessFlags`](super::ProcessFlags) global on each.

use std::future::Future;
use std::sync::Arc;

use jobs_core::QueuePort;

use super::{ProcessError, ProcessStore, WorkerProcess, expect_engine, refused};
use crate::compose::{QUEUE_URL, Queue};

impl<S: ProcessStore> WorkerProcess<S>
where
    S::Tx: Send,
{
    /// Creates or updates the framework's tables in the store, then runs `own` on it (the
    /// module's own schema: `create table if not exists …`, or its sqlx migrator); both are
    /// idempotent, so a deploy runs it every time. Workers never migrate on their own. An
    /// error of `own` is returned as [`ProcessError::Migrate`], its message kept.
    pub async fn migrate<F, Fut, T, E>(self, own: F) -> Result<S, ProcessError>
    where
        F: FnOnce(S) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let config = self.config?;
        expect_engine::<S>(&config)?;
        let store = S::migrated(&config).await?;
        own(store.clone())
            .await
            .map_err(|e| ProcessError::Migrate(e.to_string()))?;
        Ok(store)
    }

    /// The queue this process's workers would consume, opened for publishing only (no worker,
    /// no endpoint): a module binary's `publish`, or a job sent from a one-shot command. With
    /// a PostgreSQL store and no `queue_url`, it is the store's own queue, which the workers
    /// run grouped. The in-process `memory:` queue is refused: what it holds would be lost
    /// when the command exits.
    pub async fn publisher(self) -> Result<Arc<dyn QueuePort>, ProcessError> {
        let config = self.config?;
        let queue = Queue::connect(&config).await?;
        if !queue.durable {
            return Err(refused(
                &QUEUE_URL,
                &format!(
                    "names the {}: queue, which lives in this process only: what a one-shot \
                     command publishes there is lost when it exits",
                    queue.scheme
                ),
            ));
        }
        Ok(queue.publisher)
    }
}

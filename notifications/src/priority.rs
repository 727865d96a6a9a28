//! Transactional first: a layer over the pull side of a marketing queue.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jobs_core::{Delivery, PullPort, QueueDepth, QueueError, QueueName, TenantFairness};

use crate::{Gate, PriorityGate};

/// Wraps the pull side of `notif.{channel}.marketing` so that `receive` hands out nothing
/// while `notif.{channel}.transactional` is deep (work waiting or under way, per
/// [`QueueDepth`]). It only decides what to fetch: deliveries are settled through the
/// transport itself, so in-flight marketing sends finish; nothing is dropped, messages simply
/// wait in their queue.
///
/// A worker takes it as its pull side (`WorkerBuilder::pull` in `jobs-consumers`) and the
/// marketing queue as its transport, so a grouped worker over a PostgreSQL queue stays
/// grouped behind the gate; the runtime polls as usual and sees an empty marketing queue
/// while paused.
pub struct TransactionalFirst<P: ?Sized = dyn PullPort> {
    inner: Arc<P>,
    depth: Arc<dyn QueueDepth>,
    transactional: QueueName,
    gate: Mutex<PriorityGate>,
}

impl<P: ?Sized> TransactionalFirst<P> {
    /// Pauses fetching from `inner` while `transactional`'s depth is above the gate's pause
    /// threshold, until it falls to its resume threshold.
    pub fn new(
        inner: Arc<P>,
        depth: Arc<dyn QueueDepth>,
        transactional: QueueName,
        gate: PriorityGate,
    ) -> Self {
        TransactionalFirst {
            inner,
            depth,
            transactional,
            gate: Mutex::new(gate),
        }
    }

    /// Whether marketing is paused, as of the last `receive`.
    pub fn paused(&self) -> bool {
        self.lock().state() == Gate::Paused
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PriorityGate> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl<P: PullPort + ?Sized> PullPort for TransactionalFirst<P> {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let depth = self.depth.depth(&self.transactional).await?.pending();
        if self.lock().observe(depth) == Gate::Paused {
            return Ok(vec![]);
        }
        self.inner.receive(queue, max, lease).await
    }

    /// The marketing queue's own hint. A gate reopening wakes nobody: the worker's poll finds
    /// it, which is soon enough for the rail that waits by design.
    async fn wait_for_work(&self, queue: &QueueName) {
        self.inner.wait_for_work(queue).await;
    }

    /// The marketing queue's transport shares it out; the gate only decides when to fetch.
    fn share_by_tenant(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), jobs_core::Unsupported> {
        self.inner.share_by_tenant(queue, fairness)
    }
}

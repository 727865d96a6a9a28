//! Transactional first: a layer over the consuming side of a marketing queue.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{ConsumerPort, Delivery, Lease, QueueDepth, QueueError, QueueName};

use crate::{Gate, PriorityGate};

/// Wraps the consuming side of `notif.{channel}.marketing` so that `receive` hands out nothing
/// while `notif.{channel}.transactional` is deep (work waiting or under way, per
/// [`QueueDepth`]). Settling calls pass through, so in-flight marketing sends finish; nothing is
/// dropped, messages simply wait in their queue.
///
/// Being a [`ConsumerPort`] itself, it composes with any worker: the runtime polls as usual and
/// sees an empty marketing queue while paused.
pub struct TransactionalFirst {
    inner: Arc<dyn ConsumerPort>,
    depth: Arc<dyn QueueDepth>,
    transactional: QueueName,
    gate: Mutex<PriorityGate>,
}

impl TransactionalFirst {
    /// Pauses fetching from `inner` while `transactional`'s depth is above the gate's pause
    /// threshold, until it falls to its resume threshold.
    pub fn new(
        inner: Arc<dyn ConsumerPort>,
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
impl ConsumerPort for TransactionalFirst {
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

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.inner.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.inner.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.inner.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.inner.extend(lease, by).await
    }

    /// The marketing queue's own hint. A gate reopening wakes nobody: the worker's poll finds
    /// it, which is soon enough for the rail that waits by design.
    async fn wait_for_work(&self, queue: &QueueName) {
        self.inner.wait_for_work(queue).await;
    }
}

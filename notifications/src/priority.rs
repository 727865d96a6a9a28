//! Transactional first: a layer over the consuming side of a marketing queue.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    ConsumerPort, Delivery, Lease, QueueDepth, QueueError, QueueName, SettleInTransaction,
    Settlement, StoreError, WorkStore,
};

use crate::{Gate, PriorityGate};

/// Wraps the consuming side of `notif.{channel}.marketing` so that `receive` hands out nothing
/// while `notif.{channel}.transactional` is deep (work waiting or under way, per
/// [`QueueDepth`]). Settling calls pass through, so in-flight marketing sends finish; nothing is
/// dropped, messages simply wait in their queue.
///
/// Being a [`ConsumerPort`] itself, it composes with any worker: the runtime polls as usual and
/// sees an empty marketing queue while paused. Over a queue that settles inside the work
/// transaction it forwards that capability too ([`SettleInTransaction`]), so a grouped worker
/// stays grouped behind the gate.
pub struct TransactionalFirst<C: ?Sized = dyn ConsumerPort> {
    inner: Arc<C>,
    depth: Arc<dyn QueueDepth>,
    transactional: QueueName,
    gate: Mutex<PriorityGate>,
}

impl<C: ?Sized> TransactionalFirst<C> {
    /// Pauses fetching from `inner` while `transactional`'s depth is above the gate's pause
    /// threshold, until it falls to its resume threshold.
    pub fn new(
        inner: Arc<C>,
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
impl<C: ConsumerPort + ?Sized> ConsumerPort for TransactionalFirst<C> {
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

/// The settling side passes through: a paused gate only stops fetching.
#[async_trait]
impl<S, C> SettleInTransaction<S> for TransactionalFirst<C>
where
    S: WorkStore,
    C: SettleInTransaction<S> + ?Sized,
{
    fn shares_transactions_with(&self, store: &S) -> Result<(), String> {
        self.inner.shares_transactions_with(store)
    }

    async fn hold(&self, tx: &mut S::Tx, leases: &[Lease]) -> Result<Vec<bool>, StoreError> {
        self.inner.hold(tx, leases).await
    }

    async fn settle(
        &self,
        tx: &mut S::Tx,
        settlements: &[(Lease, Settlement)],
    ) -> Result<(), StoreError> {
        self.inner.settle(tx, settlements).await
    }
}

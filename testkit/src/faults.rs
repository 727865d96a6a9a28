//! Faults injected at the ports, for tests of what the runtime does when a worker dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    ConsumerPort, Delivery, Lease, PullPort, QueueError, QueueName, SettlePort, TenantFairness,
};

/// A consuming side whose next acks fail, as if the worker died between its commit (or dead
/// letter) and the ack; it also counts lease extensions. Clones share the counters.
///
/// It keeps the port's default `wait_for_work`, which never resolves: a worker over it finds
/// work by polling only, which is what tests of the poll fallback need.
///
/// It wraps whichever sides its transport has: a push transport's settlement alone, or a pull
/// transport's both.
pub struct LosesAcks<C: ?Sized = dyn ConsumerPort> {
    inner: Arc<C>,
    fail_acks: Arc<AtomicUsize>,
    extends: Arc<AtomicUsize>,
}

impl<C: ?Sized> Clone for LosesAcks<C> {
    fn clone(&self) -> Self {
        LosesAcks {
            inner: self.inner.clone(),
            fail_acks: self.fail_acks.clone(),
            extends: self.extends.clone(),
        }
    }
}

impl<C: ?Sized> LosesAcks<C> {
    /// Wraps `inner`, failing no ack until [`LosesAcks::lose_next`] is called.
    pub fn new(inner: Arc<C>) -> Self {
        LosesAcks {
            inner,
            fail_acks: Arc::default(),
            extends: Arc::default(),
        }
    }

    /// Makes the next `n` acks fail with [`QueueError::Unavailable`] (the message stays leased
    /// and comes back when the lease expires).
    pub fn lose_next(&self, n: usize) {
        self.fail_acks.store(n, Ordering::SeqCst);
    }

    /// How many lease extensions were asked for.
    pub fn extensions(&self) -> usize {
        self.extends.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl<C: PullPort + ?Sized> PullPort for LosesAcks<C> {
    async fn receive(
        &self,
        q: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        self.inner.receive(q, max, lease).await
    }

    fn share_by_tenant(
        &self,
        q: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), jobs_core::Unsupported> {
        self.inner.share_by_tenant(q, fairness)
    }
}

#[async_trait]
impl<C: SettlePort + ?Sized> SettlePort for LosesAcks<C> {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        let failing = self
            .fail_acks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(QueueError::Unavailable {
                queue: lease.queue().clone(),
                message: "the worker died before the ack".into(),
                source: None,
            });
        }
        self.inner.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.inner.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.inner.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(lease, by).await
    }

    fn lease_limits(&self) -> jobs_core::LeaseLimits {
        self.inner.lease_limits()
    }
}

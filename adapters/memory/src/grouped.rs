//! The grouped capability in memory: a [`MemoryQueue`] holds and settles its deliveries inside
//! a [`MemoryStore`]'s work transactions, so that a grouped worker runs without a database.

use std::any::Any;

use async_trait::async_trait;
use jobs_core::{Delivery, Lease, QueueName, SettleInTransaction, Settlement, StoreError};

use crate::queue::{MemoryQueue, parse_token};
use crate::store::MemoryStore;
use crate::tx::{Hold, MemoryWorkTx};

/// A message of a memory queue held in a work transaction: its queue, name, id, and the
/// generation of the delivery whose lease took it.
#[derive(Debug)]
struct Held {
    queue: MemoryQueue,
    name: QueueName,
    id: u64,
    generation: u64,
}

impl Held {
    /// Whether it is the message of `lease`, taken by `queue` (or a clone of it).
    fn is(&self, queue: &MemoryQueue, lease: &Lease) -> bool {
        self.queue.same_queues(queue)
            && self.name == *lease.queue()
            && parse_token(lease.token()) == Some((self.id, self.generation))
    }
}

impl Hold for Held {
    fn settle(self: Box<Self>, settlement: Settlement) {
        match settlement {
            Settlement::Ack => self.queue.ack_held(&self.name, self.id),
            Settlement::RetryAt(at) => self.queue.release_held(&self.name, self.id, at, true),
            Settlement::Defer(until) => self.queue.release_held(&self.name, self.id, until, false),
            // Never recorded: `settle` refuses a settlement it does not know.
            _ => self.queue.give_back(&self.name, self.id),
        }
    }

    fn give_back(self: Box<Self>) {
        self.queue.give_back(&self.name, self.id);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl MemoryQueue {
    /// Where the message of `lease` is among those `tx` took from this queue, and whether it
    /// is settled.
    fn taken_in(&self, tx: &MemoryWorkTx, lease: &Lease) -> Option<(usize, bool)> {
        tx.find_taken(|hold| {
            hold.downcast_ref::<Held>()
                .is_some_and(|held| held.is(self, lease))
        })
    }
}

/// A memory queue settles inside a memory store's transactions: a hold keeps the message out
/// of every receive until the transaction ends, and the settlements apply when it commits.
#[async_trait]
impl SettleInTransaction<MemoryStore> for MemoryQueue {
    /// Always `Ok`: any memory queue and any memory store live in this process, where the
    /// transaction itself ends the messages it took, under the store's lock, so a settlement
    /// commits with the claim whichever instances they are.
    fn shares_transactions_with(&self, store: &MemoryStore) -> Result<(), jobs_core::Unsupported> {
        let _ = store;
        Ok(())
    }

    /// Holds when the lease is the message's latest delivery, unsettled and unexpired (as
    /// [`SettlePort`](jobs_core::SettlePort) checks it), or when `tx` holds it already. While
    /// `tx` is open, no receive delivers a message it holds, even past its lease's expiry, the
    /// settle port refuses its lease, and depth counts it in flight. If `tx` rolls back (or is
    /// dropped), or an undo takes the hold back, the message is leased again until its lease's
    /// expiry, after which it is delivered again, marked expired.
    async fn hold(
        &self,
        tx: &mut MemoryWorkTx,
        leases: &[&Lease],
    ) -> Result<Vec<bool>, StoreError> {
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            if self.taken_in(tx, lease).is_some() {
                held.push(true);
                continue;
            }
            let Some((id, generation)) = self.take_leased(lease) else {
                held.push(false);
                continue;
            };
            tx.keep(Box::new(Held {
                queue: self.clone(),
                name: lease.queue().clone(),
                id,
                generation,
            }));
            held.push(true);
        }
        Ok(held)
    }

    /// Records each settlement in `tx`; they apply if it commits. An ack removes the message;
    /// a retry makes it visible at its time, no longer leased, its attempt spent; a deferral
    /// likewise with the attempt given back. A message ready when the commit applies it wakes
    /// waiters as a publish does. A delivery `tx` did not take, or settled already, fails the
    /// whole call, which then records nothing.
    async fn settle(
        &self,
        tx: &mut MemoryWorkTx,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError> {
        let mut found: Vec<(usize, Settlement)> = Vec::with_capacity(settlements.len());
        for (delivery, settlement) in settlements {
            let queue = delivery.queue();
            if !matches!(
                settlement,
                Settlement::Ack | Settlement::RetryAt(_) | Settlement::Defer(_)
            ) {
                return Err(StoreError::failed(format!(
                    "a delivery of `{queue}` was given a settlement the memory queue does not \
                     know: {settlement:?}"
                )));
            }
            let Some((index, settled)) = self.taken_in(tx, &delivery.lease) else {
                return Err(StoreError::failed(format!(
                    "a delivery of `{queue}` was settled in a transaction that did not take it \
                     (its lease was not held); roll the transaction back"
                )));
            };
            if settled || found.iter().any(|(i, _)| *i == index) {
                return Err(StoreError::failed(format!(
                    "a delivery of `{queue}` was settled twice in one transaction"
                )));
            }
            found.push((index, *settlement));
        }
        for (index, settlement) in found {
            tx.settle_taken(index, settlement);
        }
        Ok(())
    }
}

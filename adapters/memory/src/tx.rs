//! The work transaction of the [`MemoryStore`]: what it changes is kept aside until it ends,
//! its checkpoints are undo logs, and the queue messages a grouped worker takes into it end
//! with it.
//!
//! Lock order: the store's lock before a queue's. A queue never takes the store's lock, so a
//! commit ends its messages under the store's lock, and nobody sees the claims committed with
//! their messages still held.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{
    Claim, ConsumerName, DeadLetterId, GroupTransaction, JobId, NewDeadLetter, Recorded,
    Settlement, StoreError, WorkStore, WorkTransaction,
};

use crate::store::{ClaimKey, MemoryStore};

/// A queue message taken into a work transaction
/// ([`SettleInTransaction::hold`](jobs_core::SettleInTransaction::hold)), as the transaction
/// sees it: something to end with it, whatever the queue.
pub(crate) trait Hold: Send + fmt::Debug {
    /// At commit: `settlement` applies to the message.
    fn settle(self: Box<Self>, settlement: Settlement);

    /// At rollback, or when an undo takes the hold back: the message returns to the state it
    /// had when taken.
    fn give_back(self: Box<Self>);

    /// The hold itself, for the queue that took it to recognise its own.
    fn as_any(&self) -> &dyn Any;
}

/// A message taken, with its settlement once one is recorded.
#[derive(Debug)]
struct Taken {
    hold: Box<dyn Hold>,
    settlement: Option<Settlement>,
}

/// One change made since the last checkpoint, as [`GroupTransaction::undo`] reverts it.
#[derive(Debug)]
enum Step {
    /// A claim reserved in the store.
    Claimed(ClaimKey),
    /// A claim this transaction had released, taken again.
    Reclaimed(ClaimKey),
    /// A claim released, and when it had been made.
    Unclaimed(ClaimKey, SystemTime),
    /// An effect recorded.
    Effect,
    /// A dead letter recorded.
    DeadLetter,
    /// So many processed rows marked for deletion.
    Purged(usize),
    /// A queue message taken.
    Took,
    /// The settlement of the message taken at this index.
    Settled(usize),
}

/// A work transaction of the [`MemoryStore`]. Dropping it without commit rolls it back.
///
/// As a [`GroupTransaction`], its checkpoint starts an undo log: every change made after it
/// (claims made or released, effects, dead letters, purges, queue messages taken or settled)
/// is logged, and an undo reverts them, newest first. A claim released with
/// [`unclaim`](GroupTransaction::unclaim) stays reserved against other transactions until this
/// one ends, as a row deleted in an open PostgreSQL transaction does; a claim an undo takes
/// back is released at once, as a savepoint rolled back releases it. It is touched
/// ([`take_touched`](GroupTransaction::take_touched)) by
/// [`record_effect`](MemoryWorkTx::record_effect), a handler's write; the runtime's claims,
/// releases and dead letters do not touch it.
#[derive(Debug)]
pub struct MemoryWorkTx {
    store: MemoryStore,
    /// Claims made and kept, with their time.
    claims: HashMap<ClaimKey, SystemTime>,
    /// Claims made and then released: still reserved in the store, never committed.
    released: HashSet<ClaimKey>,
    effects: Vec<String>,
    dead_letters: Vec<(DeadLetterId, NewDeadLetter)>,
    /// Processed rows this transaction deletes when it commits.
    purged: Vec<ClaimKey>,
    /// Queue messages taken, in the order taken.
    taken: Vec<Taken>,
    /// A handler recorded an effect since [`GroupTransaction::take_touched`] last asked.
    touched: bool,
    /// Checkpoints taken, against the store's budget.
    checkpoints: usize,
    /// The changes since the last checkpoint, oldest first; `None` before the first.
    log: Option<Vec<Step>>,
    open: bool,
}

impl MemoryWorkTx {
    /// Records a business effect, made visible by commit and discarded by rollback (or by an
    /// undo to a checkpoint taken before it). It is a handler's write: it touches the
    /// transaction.
    pub fn record_effect(&mut self, effect: impl Into<String>) {
        self.effects.push(effect.into());
        self.touched = true;
        self.log(Step::Effect);
    }

    /// The index of the message taken that `is` recognises, and whether it is settled.
    pub(crate) fn find_taken(&self, is: impl Fn(&dyn Any) -> bool) -> Option<(usize, bool)> {
        self.taken
            .iter()
            .position(|taken| is(taken.hold.as_any()))
            .map(|i| (i, self.taken[i].settlement.is_some()))
    }

    /// Keeps a message taken until the transaction ends: the commit is refused until it is
    /// settled, a rollback gives it back.
    pub(crate) fn keep(&mut self, hold: Box<dyn Hold>) {
        self.taken.push(Taken {
            hold,
            settlement: None,
        });
        self.log(Step::Took);
    }

    /// Records the settlement of the message taken at `index`, applied if the transaction
    /// commits.
    pub(crate) fn settle_taken(&mut self, index: usize, settlement: Settlement) {
        if let Some(taken) = self.taken.get_mut(index) {
            taken.settlement = Some(settlement);
            self.log(Step::Settled(index));
        }
    }

    fn log(&mut self, step: Step) {
        if let Some(log) = &mut self.log {
            log.push(step);
        }
    }

    /// Reverts `step`; answers the claim it released in the store, if any.
    fn revert(&mut self, step: Step) -> Option<ClaimKey> {
        match step {
            Step::Claimed(key) => {
                self.claims.remove(&key);
                return Some(key);
            }
            Step::Reclaimed(key) => {
                if self.claims.remove(&key).is_some() {
                    self.released.insert(key);
                }
            }
            Step::Unclaimed(key, at) => {
                if self.released.remove(&key) {
                    self.claims.insert(key, at);
                }
            }
            Step::Effect => {
                self.effects.pop();
            }
            Step::DeadLetter => {
                self.dead_letters.pop();
            }
            Step::Purged(n) => {
                let kept = self.purged.len().saturating_sub(n);
                self.purged.truncate(kept);
            }
            Step::Took => {
                if let Some(taken) = self.taken.pop() {
                    taken.hold.give_back();
                }
            }
            Step::Settled(index) => {
                if let Some(taken) = self.taken.get_mut(index) {
                    taken.settlement = None;
                }
            }
        }
        None
    }

    /// Ends the transaction once: committed, or rolled back.
    fn end(&mut self, commit: bool) {
        if !self.open {
            return;
        }
        self.open = false;
        let claims = std::mem::take(&mut self.claims);
        let released = std::mem::take(&mut self.released);
        let mut state = self.store.lock();
        for key in claims.keys().chain(&released) {
            state.pending.remove(key);
        }
        if commit {
            state.processed.extend(claims);
            state.effects.append(&mut self.effects);
            for (id, letter) in self.dead_letters.drain(..) {
                state.insert(id, letter);
            }
            for key in self.purged.drain(..) {
                state.processed.remove(&key);
            }
        }
        for taken in self.taken.drain(..) {
            match taken.settlement {
                Some(settlement) if commit => taken.hold.settle(settlement),
                _ => taken.hold.give_back(),
            }
        }
        drop(state);
        self.store.closed();
    }
}

impl Drop for MemoryWorkTx {
    fn drop(&mut self) {
        self.end(false);
    }
}

#[async_trait]
impl WorkTransaction for MemoryWorkTx {
    /// A claim this transaction released is taken again at once; a claim another open
    /// transaction holds (or released and still reserves) is waited for.
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        let key = (job_id, consumer.clone());
        if self.claims.contains_key(&key) {
            return Ok(Claim::AlreadyProcessed);
        }
        if self.released.remove(&key) {
            self.claims.insert(key.clone(), at);
            self.log(Step::Reclaimed(key));
            return Ok(Claim::Claimed);
        }
        let store = self.store.clone();
        loop {
            let released = store.claim_released();
            {
                let mut state = store.lock();
                if state.processed.contains_key(&key) {
                    return Ok(if state.dead_lettered(job_id, consumer) {
                        Claim::DeadLettered
                    } else {
                        Claim::AlreadyProcessed
                    });
                }
                if state.pending.insert(key.clone()) {
                    drop(state);
                    self.claims.insert(key.clone(), at);
                    self.log(Step::Claimed(key));
                    return Ok(Claim::Claimed);
                }
            }
            // Another open transaction holds the claim: wait for it to end.
            released.await;
        }
    }

    /// Deduplicated against the pending letters committed and against this transaction's own,
    /// which its later statements see in SQL.
    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        let mut state = self.store.lock();
        if let Some(key) = &letter.dedup_key {
            if let Some(id) = state.pending_with(&letter.queue, key) {
                return Ok(Recorded::Existing(id));
            }
            let own = self.dead_letters.iter().find(|(_, l)| {
                l.queue == letter.queue && l.dedup_key.as_deref() == Some(key.as_str())
            });
            if let Some((id, _)) = own {
                return Ok(Recorded::Existing(*id));
            }
        }
        let id = state.next_dead_letter_id();
        drop(state);
        self.dead_letters.push((id, letter));
        self.log(Step::DeadLetter);
        Ok(Recorded::New(id))
    }

    async fn purge_processed(
        &mut self,
        older_than: SystemTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let state = self.store.lock();
        let doomed: Vec<ClaimKey> = state
            .processed
            .iter()
            .filter(|(key, at)| {
                **at < older_than
                    && !self.purged.contains(key)
                    && !state.dead_lettered(key.0, &key.1)
            })
            .map(|(key, _)| key.clone())
            .take(usize::try_from(batch).unwrap_or(usize::MAX))
            .collect();
        drop(state);
        let n = doomed.len();
        self.purged.extend(doomed);
        self.log(Step::Purged(n));
        Ok(n as u64)
    }

    /// Refused, and rolled back, while a queue message taken in this transaction is
    /// unsettled, as on PostgreSQL: the caller lost track of it.
    async fn commit(mut self) -> Result<(), StoreError> {
        let unsettled = self
            .taken
            .iter()
            .filter(|taken| taken.settlement.is_none())
            .count();
        if unsettled > 0 {
            self.end(false);
            return Err(StoreError::failed(format!(
                "{unsettled} queue messages taken in this transaction were not settled; \
                 it was rolled back"
            )));
        }
        self.end(true);
        Ok(())
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        self.end(false);
        Ok(())
    }
}

#[async_trait]
impl GroupTransaction for MemoryWorkTx {
    /// [`claim`](WorkTransaction::claim) for each job in job id order, so that two
    /// transactions claiming the same jobs wait for each other in one order and never
    /// deadlock.
    async fn claim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Claim>, StoreError> {
        let mut order = job_ids.to_vec();
        order.sort_unstable();
        order.dedup();
        let mut claims = HashMap::with_capacity(order.len());
        for job_id in order {
            let claim = self.claim(job_id, consumer, at).await?;
            claims.insert(job_id, claim);
        }
        // The first occurrence of a job takes its answer; a repeat finds it claimed.
        Ok(job_ids
            .iter()
            .map(|id| claims.remove(id).unwrap_or(Claim::AlreadyProcessed))
            .collect())
    }

    fn take_touched(&mut self) -> bool {
        std::mem::take(&mut self.touched)
    }

    /// [`MemoryStore::with_checkpoint_budget`]'s, unbounded by default.
    fn checkpoint_budget(&self) -> usize {
        self.store.checkpoint_budget()
    }

    /// Starts a new undo log; past the budget it fails, and the last checkpoint stays.
    async fn checkpoint(&mut self) -> Result<(), StoreError> {
        let budget = self.store.checkpoint_budget();
        if self.checkpoints >= budget {
            return Err(StoreError::failed(format!(
                "a checkpoint past the budget of {budget} per transaction \
                 (MemoryStore::with_checkpoint_budget)"
            )));
        }
        self.checkpoints += 1;
        self.log = Some(Vec::new());
        Ok(())
    }

    /// Reverts the log newest first and keeps the checkpoint for the next undo. The claims
    /// made since the checkpoint are released at once, waking who waits for them.
    async fn undo(&mut self) -> Result<(), StoreError> {
        let Some(log) = self.log.as_mut() else {
            return Err(StoreError::failed(
                "undo without a checkpoint: there is nothing to go back to",
            ));
        };
        let steps = std::mem::take(log);
        let freed: Vec<ClaimKey> = steps
            .into_iter()
            .rev()
            .filter_map(|step| self.revert(step))
            .collect();
        if !freed.is_empty() {
            let mut state = self.store.lock();
            for key in &freed {
                state.pending.remove(key);
            }
            drop(state);
            self.store.released();
        }
        Ok(())
    }

    /// Releases a claim this transaction made: it is not committed, and stays reserved
    /// against other transactions until this one ends. A job this transaction did not claim
    /// is left as it is.
    async fn unclaim(&mut self, job_id: JobId, consumer: &ConsumerName) -> Result<(), StoreError> {
        let key = (job_id, consumer.clone());
        if let Some(at) = self.claims.remove(&key) {
            self.released.insert(key.clone());
            self.log(Step::Unclaimed(key, at));
        }
        Ok(())
    }
}

#[async_trait]
impl WorkStore for MemoryStore {
    type Tx = MemoryWorkTx;

    async fn begin(&self) -> Result<MemoryWorkTx, StoreError> {
        self.opened();
        Ok(MemoryWorkTx {
            store: self.clone(),
            claims: HashMap::new(),
            released: HashSet::new(),
            effects: Vec::new(),
            dead_letters: Vec::new(),
            purged: Vec::new(),
            taken: Vec::new(),
            touched: false,
            checkpoints: 0,
            log: None,
            open: true,
        })
    }
}

//! The in-memory store: `processed_jobs`, dead letters and bulk runs with the SQL stores'
//! semantics.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{
    BulkRun, BulkRunId, BulkRuns, Claim, ConsumerName, DeadLetter, DeadLetterEvent,
    DeadLetterFilter, DeadLetterId, DeadLetterStatus, DeadLetterStore, JobId, NewDeadLetter,
    ProcessedJobs, QueueName, Recorded, Resolution, StoreError, TenantId, Transition, WorkStore,
    WorkTransaction,
};
use tokio::sync::Notify;

type ClaimKey = (JobId, ConsumerName);

/// An in-process store; clones share the same data.
///
/// Work transactions behave like the SQL ones: a claim is invisible to others until commit,
/// and a second transaction claiming the same job waits for the first to commit (then sees
/// [`Claim::AlreadyProcessed`]) or roll back (then claims it). Handlers record their effects
/// with [`MemoryWorkTx::record_effect`]; they become visible in [`MemoryStore::effects`] only on
/// commit, which is how tests prove exactly-once effects.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    released: Notify,
    /// Work transactions begun and not yet committed or rolled back.
    open: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    processed: HashMap<ClaimKey, SystemTime>,
    /// Claims made by open transactions.
    pending: HashSet<ClaimKey>,
    effects: Vec<String>,
    dead_letters: BTreeMap<DeadLetterId, DeadLetter>,
    /// Each letter's status changes, oldest first, written under the same lock as the change.
    history: HashMap<DeadLetterId, Vec<DeadLetterEvent>>,
    next_dead_letter: i64,
    bulk_runs: BTreeMap<BulkRunId, BulkRun>,
    next_bulk_run: i64,
}

impl State {
    /// Whether a dead letter of `job_id` by `consumer` waits for review.
    fn dead_lettered(&self, job_id: JobId, consumer: &ConsumerName) -> bool {
        self.dead_letters.values().any(|d| {
            d.status == DeadLetterStatus::PendingReview
                && d.letter.job_id == Some(job_id)
                && d.letter.consumer.as_ref() == Some(consumer)
        })
    }

    fn record(&mut self, letter: NewDeadLetter) -> Recorded {
        if let Some(key) = &letter.dedup_key {
            if let Some(id) = pending_with(self, &letter.queue, key) {
                return Recorded::Existing(id);
            }
        }
        self.next_dead_letter += 1;
        let id = DeadLetterId(self.next_dead_letter);
        self.insert(id, letter);
        Recorded::New(id)
    }

    fn insert(&mut self, id: DeadLetterId, letter: NewDeadLetter) {
        let updated_at = letter.at;
        self.dead_letters.insert(
            id,
            DeadLetter {
                id,
                letter,
                status: DeadLetterStatus::PendingReview,
                updated_at,
            },
        );
    }
}

impl MemoryStore {
    /// Effects committed by handlers, in commit order.
    pub fn effects(&self) -> Vec<String> {
        self.lock().effects.clone()
    }

    /// Work transactions open now: tests show with it what runs outside a transaction.
    pub fn open_transactions(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation leaves the state consistent before it could panic.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A work transaction of the [`MemoryStore`]. Dropping it without commit rolls it back.
#[derive(Debug)]
pub struct MemoryWorkTx {
    store: MemoryStore,
    claims: Vec<(ClaimKey, SystemTime)>,
    effects: Vec<String>,
    dead_letters: Vec<(DeadLetterId, NewDeadLetter)>,
    /// Processed rows this transaction deletes when it commits.
    purged: Vec<ClaimKey>,
    open: bool,
}

impl MemoryWorkTx {
    /// Records a business effect, made visible by commit and discarded by rollback.
    pub fn record_effect(&mut self, effect: impl Into<String>) {
        self.effects.push(effect.into());
    }

    fn release(&mut self, commit: bool) {
        if !self.open {
            return;
        }
        self.open = false;
        let mut state = self.store.lock();
        for (key, at) in self.claims.drain(..) {
            state.pending.remove(&key);
            if commit {
                state.processed.insert(key, at);
            }
        }
        if commit {
            state.effects.append(&mut self.effects);
            for (id, letter) in self.dead_letters.drain(..) {
                state.insert(id, letter);
            }
            for key in self.purged.drain(..) {
                state.processed.remove(&key);
            }
        }
        drop(state);
        self.store.shared.open.fetch_sub(1, Ordering::SeqCst);
        self.store.shared.released.notify_waiters();
    }
}

impl Drop for MemoryWorkTx {
    fn drop(&mut self) {
        self.release(false);
    }
}

#[async_trait]
impl WorkTransaction for MemoryWorkTx {
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        let key = (job_id, consumer.clone());
        if self.claims.iter().any(|(k, _)| *k == key) {
            return Ok(Claim::AlreadyProcessed);
        }
        loop {
            let released = self.store.shared.released.notified();
            {
                let mut state = self.store.lock();
                if state.processed.contains_key(&key) {
                    return Ok(if state.dead_lettered(job_id, consumer) {
                        Claim::DeadLettered
                    } else {
                        Claim::AlreadyProcessed
                    });
                }
                if state.pending.insert(key.clone()) {
                    self.claims.push((key, at));
                    return Ok(Claim::Claimed);
                }
            }
            // Another open transaction holds the claim: wait for it to commit or roll back.
            released.await;
        }
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        let mut state = self.store.lock();
        if let Some(key) = &letter.dedup_key {
            if let Some(id) = pending_with(&state, &letter.queue, key) {
                return Ok(Recorded::Existing(id));
            }
        }
        // Like an identity column: the id is taken now, and lost if the transaction rolls back.
        state.next_dead_letter += 1;
        let id = DeadLetterId(state.next_dead_letter);
        self.dead_letters.push((id, letter));
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
            .filter(|(key, at)| **at < older_than && !self.purged.contains(key))
            .map(|(key, _)| key.clone())
            .take(usize::try_from(batch).unwrap_or(usize::MAX))
            .collect();
        drop(state);
        let n = doomed.len() as u64;
        self.purged.extend(doomed);
        Ok(n)
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        self.release(true);
        Ok(())
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        self.release(false);
        Ok(())
    }
}

#[async_trait]
impl WorkStore for MemoryStore {
    type Tx = MemoryWorkTx;

    async fn begin(&self) -> Result<MemoryWorkTx, StoreError> {
        self.shared.open.fetch_add(1, Ordering::SeqCst);
        Ok(MemoryWorkTx {
            store: self.clone(),
            claims: vec![],
            effects: vec![],
            dead_letters: vec![],
            purged: vec![],
            open: true,
        })
    }
}

#[async_trait]
impl ProcessedJobs for MemoryStore {
    async fn is_processed(
        &self,
        job_id: JobId,
        consumer: &ConsumerName,
    ) -> Result<bool, StoreError> {
        Ok(self
            .lock()
            .processed
            .contains_key(&(job_id, consumer.clone())))
    }

    async fn purge_processed(&self, older_than: SystemTime, batch: u32) -> Result<u64, StoreError> {
        let mut state = self.lock();
        let doomed: Vec<ClaimKey> = state
            .processed
            .iter()
            .filter(|(_, at)| **at < older_than)
            .map(|(key, _)| key.clone())
            .take(usize::try_from(batch).unwrap_or(usize::MAX))
            .collect();
        for key in &doomed {
            state.processed.remove(key);
        }
        Ok(doomed.len() as u64)
    }
}

fn matches(letter: &DeadLetter, filter: &DeadLetterFilter) -> bool {
    filter.status.is_none_or(|s| letter.status == s)
        && filter
            .queue
            .as_ref()
            .is_none_or(|q| letter.letter.queue == *q)
        && filter
            .tenant_id
            .is_none_or(|t| letter.letter.tenant_id == Some(t))
        && filter
            .kind
            .as_ref()
            .is_none_or(|k| letter.letter.kind.as_ref() == Some(k))
        && filter
            .job_id
            .is_none_or(|j| letter.letter.job_id == Some(j))
        && filter
            .correlation_id
            .is_none_or(|c| letter.letter.correlation_id == Some(c))
        && filter.after.is_none_or(|after| letter.id > after)
        && filter.before.is_none_or(|before| letter.id < before)
}

fn pending_with(state: &State, queue: &QueueName, key: &str) -> Option<DeadLetterId> {
    state
        .dead_letters
        .values()
        .find(|d| {
            d.status == DeadLetterStatus::PendingReview
                && d.letter.queue == *queue
                && d.letter.dedup_key.as_deref() == Some(key)
        })
        .map(|d| d.id)
}

#[async_trait]
impl DeadLetterStore for MemoryStore {
    async fn record(&self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        Ok(self.lock().record(letter))
    }

    async fn get(&self, id: DeadLetterId) -> Result<Option<DeadLetter>, StoreError> {
        Ok(self.lock().dead_letters.get(&id).cloned())
    }

    /// The map is keyed by id, so newest first is the same walk reversed.
    async fn list(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError> {
        let state = self.lock();
        let selected = state.dead_letters.values().filter(|d| matches(d, filter));
        let limit = usize::try_from(filter.limit).unwrap_or(usize::MAX);
        Ok(if filter.newest_first {
            selected.rev().take(limit).cloned().collect()
        } else {
            selected.take(limit).cloned().collect()
        })
    }

    async fn pending(
        &self,
        queue: &QueueName,
        dedup_key: &str,
    ) -> Result<Option<DeadLetterId>, StoreError> {
        Ok(pending_with(&self.lock(), queue, dedup_key))
    }

    async fn transition(
        &self,
        id: DeadLetterId,
        to: Resolution,
        tenant: Option<TenantId>,
        at: SystemTime,
        by: &str,
    ) -> Result<Transition, StoreError> {
        let to = to.status();
        let mut state = self.lock();
        let Some(letter) = state.dead_letters.get_mut(&id) else {
            return Ok(Transition::NotFound);
        };
        if tenant.is_some_and(|t| letter.letter.tenant_id != Some(t)) {
            return Ok(Transition::NotFound);
        }
        let released = match (to, &letter.letter.job_id, &letter.letter.consumer) {
            (DeadLetterStatus::Replayed, Some(job), Some(consumer)) => {
                Some((*job, consumer.clone()))
            }
            _ => None,
        };
        Ok(match letter.status {
            DeadLetterStatus::PendingReview => {
                letter.status = to;
                letter.updated_at = at;
                if let Some(key) = released {
                    state.processed.remove(&key);
                }
                state.history.entry(id).or_default().push(DeadLetterEvent {
                    at,
                    from: DeadLetterStatus::PendingReview,
                    to,
                    by: by.to_owned(),
                });
                Transition::Done
            }
            current if current == to => Transition::AlreadyDone,
            current => Transition::Conflict(current),
        })
    }

    async fn history(&self, id: DeadLetterId) -> Result<Vec<DeadLetterEvent>, StoreError> {
        Ok(self.lock().history.get(&id).cloned().unwrap_or_default())
    }
}

/// Runs live under the store's lock, so a start of a key with an unfinished run finds it as
/// the SQL stores' unique index of unfinished keys does.
#[async_trait]
impl BulkRuns for MemoryStore {
    async fn start_run(
        &self,
        key: &str,
        action: Resolution,
        ids: &[DeadLetterId],
        by: &str,
        at: SystemTime,
    ) -> Result<BulkRun, StoreError> {
        let mut state = self.lock();
        if let Some(run) = unfinished_of(&state, key) {
            return Ok(run.clone());
        }
        state.next_bulk_run += 1;
        let run = BulkRun {
            id: BulkRunId(state.next_bulk_run),
            key: key.to_owned(),
            action,
            ids: ids.to_vec(),
            settled: BTreeMap::new(),
            by: by.to_owned(),
            started_at: at,
            finished_at: None,
        };
        state.bulk_runs.insert(run.id, run.clone());
        Ok(run)
    }

    async fn unfinished(&self, key: &str) -> Result<Option<BulkRun>, StoreError> {
        Ok(unfinished_of(&self.lock(), key).cloned())
    }

    async fn record_settled(
        &self,
        run: BulkRunId,
        id: DeadLetterId,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let Some(found) = state.bulk_runs.get_mut(&run) else {
            return Err(StoreError::failed(format!("bulk run {run} not found")));
        };
        if !found.ids.contains(&id) {
            return Err(StoreError::failed(format!(
                "dead letter {id} is not in bulk run {run}"
            )));
        }
        found
            .settled
            .entry(id)
            .or_insert_with(|| outcome.to_owned());
        Ok(())
    }

    async fn finish_run(&self, run: BulkRunId, at: SystemTime) -> Result<(), StoreError> {
        let mut state = self.lock();
        let Some(found) = state.bulk_runs.get_mut(&run) else {
            return Err(StoreError::failed(format!("bulk run {run} not found")));
        };
        found.finished_at.get_or_insert(at);
        Ok(())
    }

    async fn run(&self, run: BulkRunId) -> Result<Option<BulkRun>, StoreError> {
        Ok(self.lock().bulk_runs.get(&run).cloned())
    }

    async fn runs(&self, limit: u32) -> Result<Vec<BulkRun>, StoreError> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(self
            .lock()
            .bulk_runs
            .values()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }
}

fn unfinished_of<'a>(state: &'a State, key: &str) -> Option<&'a BulkRun> {
    state
        .bulk_runs
        .values()
        .find(|run| run.key == key && !run.is_finished())
}

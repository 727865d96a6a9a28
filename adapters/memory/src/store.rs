//! The in-memory store: `processed_jobs`, dead letters and bulk runs with the SQL stores'
//! semantics.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{
    BulkRun, BulkRunId, BulkRuns, ConsumerName, DeadLetter, DeadLetterEvent, DeadLetterFilter,
    DeadLetterId, DeadLetterStatus, DeadLetterStore, JobId, NewDeadLetter, ProcessedJobs,
    QueueName, Recorded, Resolution, StoreError, TenantId, Transition,
};
use tokio::sync::Notify;

/// A row of `processed_jobs`: a job and the consumer that settled it.
pub(crate) type ClaimKey = (JobId, ConsumerName);

/// An in-process store; clones share the same data.
///
/// Its work transactions ([`WorkStore::begin`](jobs_core::WorkStore::begin)) behave like the
/// SQL ones: a claim is invisible to others until commit, and a second transaction claiming
/// the same job waits for the first to commit (then sees
/// [`Claim::AlreadyProcessed`](jobs_core::Claim::AlreadyProcessed)) or roll back (then claims
/// it). Handlers record their effects in the transaction (`MemoryWorkTx::record_effect`); they
/// become visible in [`MemoryStore::effects`] only on commit, which is how tests prove
/// exactly-once effects. The transactions hold several jobs with checkpoints as well
/// ([`GroupTransaction`](jobs_core::GroupTransaction)), so a grouped worker runs in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
    /// The most checkpoints one work transaction takes; `None` for no limit.
    checkpoint_budget: Option<usize>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    released: Notify,
    /// Work transactions begun and not yet committed or rolled back.
    open: AtomicUsize,
}

/// The tables, under the store's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Committed claims and when they were made.
    pub(crate) processed: HashMap<ClaimKey, SystemTime>,
    /// Claims reserved by open transactions, released when they end (or when an undo takes
    /// the claim back).
    pub(crate) pending: HashSet<ClaimKey>,
    /// Committed effects, in commit order.
    pub(crate) effects: Vec<String>,
    dead_letters: BTreeMap<DeadLetterId, DeadLetter>,
    /// Each letter's status changes, oldest first, written under the same lock as the change.
    history: HashMap<DeadLetterId, Vec<DeadLetterEvent>>,
    next_dead_letter: i64,
    bulk_runs: BTreeMap<BulkRunId, BulkRun>,
    next_bulk_run: i64,
}

impl State {
    /// Whether a dead letter of `job_id` by `consumer` waits for review.
    pub(crate) fn dead_lettered(&self, job_id: JobId, consumer: &ConsumerName) -> bool {
        self.dead_letters.values().any(|d| {
            d.status == DeadLetterStatus::PendingReview
                && d.letter.job_id == Some(job_id)
                && d.letter.consumer.as_ref() == Some(consumer)
        })
    }

    fn record(&mut self, letter: NewDeadLetter) -> Recorded {
        if let Some(key) = &letter.dedup_key
            && let Some(id) = self.pending_with(&letter.queue, key)
        {
            return Recorded::Existing(id);
        }
        let id = self.next_dead_letter_id();
        self.insert(id, letter);
        Recorded::New(id)
    }

    /// The id of the next dead letter, taken for good: like an identity column's, an id a
    /// rolled-back transaction took is never given again.
    pub(crate) fn next_dead_letter_id(&mut self) -> DeadLetterId {
        self.next_dead_letter += 1;
        DeadLetterId(self.next_dead_letter)
    }

    /// Adds a pending dead letter under `id`.
    pub(crate) fn insert(&mut self, id: DeadLetterId, letter: NewDeadLetter) {
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

    /// The pending dead letter of `queue` with `key` for dedup key, if any.
    pub(crate) fn pending_with(&self, queue: &QueueName, key: &str) -> Option<DeadLetterId> {
        self.dead_letters
            .values()
            .find(|d| {
                d.status == DeadLetterStatus::PendingReview
                    && d.letter.queue == *queue
                    && d.letter.dedup_key.as_deref() == Some(key)
            })
            .map(|d| d.id)
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

    /// The same store, whose work transactions take at most `budget` checkpoints each: their
    /// [`checkpoint_budget`](jobs_core::GroupTransaction::checkpoint_budget) answers it, and a
    /// checkpoint past it fails. Unbounded by default.
    ///
    /// A memory checkpoint costs nothing, but PostgreSQL's costs past 31 in one transaction (a
    /// grouped worker gives back the jobs it cannot run within them): a test sets 31 to rehearse
    /// that budget, or a few to reach it with a few jobs, without a database. Failing past the
    /// budget, where PostgreSQL would only slow down, makes a runtime that overruns it fail the
    /// test. Clones made from it share its data and keep the budget.
    ///
    /// ```
    /// use jobs_adapter_memory::MemoryStore;
    /// use jobs_core::{GroupTransaction, WorkStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let store = MemoryStore::default().with_checkpoint_budget(1);
    /// let mut tx = store.begin().await?;
    /// assert_eq!(tx.checkpoint_budget(), 1);
    /// tx.checkpoint().await?;
    /// assert!(tx.checkpoint().await.is_err(), "a second checkpoint is past the budget");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_checkpoint_budget(mut self, budget: usize) -> Self {
        self.checkpoint_budget = Some(budget);
        self
    }

    /// The checkpoint budget of this store's work transactions.
    pub(crate) fn checkpoint_budget(&self) -> usize {
        self.checkpoint_budget.unwrap_or(usize::MAX)
    }

    /// The tables. Lock order: the store's lock before a queue's, never the other way.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation leaves the state consistent before it could panic.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves once claims are released after this call: what a claim that found another
    /// transaction's waits for. Taken before the check it follows, so that a release in
    /// between is not missed.
    pub(crate) fn claim_released(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.released.notified()
    }

    /// Wakes every claim waiting for another transaction's: a transaction ended, or an undo
    /// released claims.
    pub(crate) fn released(&self) {
        self.shared.released.notify_waiters();
    }

    /// Counts a work transaction begun.
    pub(crate) fn opened(&self) {
        self.shared.open.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a work transaction ended, and wakes the claims waiting for it.
    pub(crate) fn closed(&self) {
        self.shared.open.fetch_sub(1, Ordering::SeqCst);
        self.released();
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
            .filter(|((job, consumer), at)| {
                **at < older_than && !state.dead_lettered(*job, consumer)
            })
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
        && filter
            .reason
            .is_none_or(|r| letter.letter.reason == Some(r))
        && filter.after.is_none_or(|after| letter.id > after)
        && filter.before.is_none_or(|before| letter.id < before)
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
        Ok(self.lock().pending_with(queue, dedup_key))
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

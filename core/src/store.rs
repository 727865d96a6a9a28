//! Stores: the work transaction that makes consumption idempotent, the dead letters, and the
//! journal of bulk runs over them.
//!
//! The worker runtime opens a [`WorkTransaction`], claims `(job_id, consumer)` in
//! `core.processed_jobs`, runs the handler with that same transaction so the handler's writes
//! commit atomically with the claim, then commits and only then acks. A claim that finds the row
//! already there means the job is settled for this consumer: its effect committed, or it was
//! dead-lettered (the dead letter is recorded in a work transaction holding the claim, so the
//! two are never both true). Replaying a dead letter releases the claim.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::id::{CorrelationId, JobId, TenantId};
use crate::name::{ConsumerName, Kind, QueueName};

/// The outcome of claiming a job inside a work transaction. Non-exhaustive: a runtime treats
/// a claim it does not know as not claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The row is new: run the handler in this transaction.
    Claimed,
    /// The job is settled for this consumer (processed, or dead-lettered and then discarded):
    /// skip the handler and ack.
    AlreadyProcessed,
    /// The job waits in the dead letters for an operator (or its replay is under way): skip
    /// the handler and come back later; only a replay runs it again.
    DeadLettered,
}

/// One unit of work: the processed-jobs claim and the handler's own writes, committed or
/// rolled back together.
///
/// An engine's transaction type implements this and exposes its connection (e.g. sqlx's) to
/// the handlers written for that engine, which receive `&mut` of it. Dropping a transaction
/// without committing it rolls it back.
#[async_trait]
pub trait WorkTransaction: Send + 'static {
    /// Inserts `(job_id, consumer, at)` into `core.processed_jobs`. When the row is there
    /// already, answers [`Claim::DeadLettered`] if a dead letter of this job and consumer is
    /// pending review, else [`Claim::AlreadyProcessed`]. If another open transaction holds the
    /// claim, waits for it to end.
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError>;

    /// Records a dead letter in this transaction, which holds the job's claim: committed
    /// together, the job is settled as dead-lettered, and no copy can run it until a replay
    /// releases the claim. Deduplicated like [`DeadLetterStore::record`].
    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError>;

    /// Deletes at most `batch` `processed_jobs` rows older than `older_than` in this
    /// transaction (the TTL cleanup as a job: on a store with one writer at a time, such as
    /// SQLite, a purge through the store would wait for this transaction's own lock), keeping
    /// the claims of jobs whose dead letters are pending review, as
    /// [`ProcessedJobs::purge_processed`] does. Returns how many; they are gone if and only if
    /// the transaction commits. The default refuses:
    /// a store that does not override it cleans through [`ProcessedJobs`] only.
    async fn purge_processed(
        &mut self,
        older_than: SystemTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let _ = (older_than, batch);
        Err(StoreError::failed(
            "this store cannot purge processed_jobs inside a work transaction",
        ))
    }

    /// Makes the claim and every write of the handler durable.
    async fn commit(self) -> Result<(), StoreError>
    where
        Self: Sized;

    /// Discards the claim and every write of the handler.
    async fn rollback(self) -> Result<(), StoreError>
    where
        Self: Sized;
}

/// A work transaction that holds several jobs at once, each of which can be undone alone: what
/// a grouped worker needs of its store (see [`SettleInTransaction`](crate::SettleInTransaction)).
///
/// The worker claims the whole group with [`claim_all`](Self::claim_all) and runs the jobs
/// one after another. Before a job whose failure must not take earlier writes with it, it takes
/// a [`checkpoint`](Self::checkpoint); a job that fails is [undone](Self::undo) back to it and
/// its claim [released](Self::unclaim), so its partial writes never commit and its neighbours'
/// are kept. [`take_touched`](Self::take_touched) tells the worker whether a handler wrote at
/// all, so that handlers that write nothing cost no checkpoint. Engines implement checkpoints
/// with savepoints.
#[async_trait]
pub trait GroupTransaction: WorkTransaction {
    /// [`WorkTransaction::claim`] for every job of `job_ids`, in one statement where the engine
    /// allows, answering in the same order. A job id repeated in `job_ids` is claimed by its
    /// first occurrence; the later ones answer [`Claim::AlreadyProcessed`].
    async fn claim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Claim>, StoreError>;

    /// Whether a handler reached the transaction's connection since the last call (or the
    /// start): the runtime's own statements do not count.
    fn take_touched(&mut self) -> bool;

    /// Keeps every write made so far: a later [`undo`](Self::undo) goes back to here and no
    /// further. Replaces the previous checkpoint.
    async fn checkpoint(&mut self) -> Result<(), StoreError>;

    /// The most [`checkpoint`](Self::checkpoint)s one transaction should take: an engine whose
    /// checkpoints cost past some count (PostgreSQL's savepoints) says so, and a group gives
    /// back the jobs it could not run within it. Unbounded by default.
    fn checkpoint_budget(&self) -> usize {
        usize::MAX
    }

    /// Discards every write since the last [`checkpoint`](Self::checkpoint), and recovers the
    /// transaction if one of those writes failed. Without a checkpoint it fails.
    async fn undo(&mut self) -> Result<(), StoreError>;

    /// Deletes the claim of `(job_id, consumer)` taken in this transaction, so that a job that
    /// failed and will be retried is not skipped as processed.
    async fn unclaim(&mut self, job_id: JobId, consumer: &ConsumerName) -> Result<(), StoreError>;

    /// [`unclaim`](Self::unclaim) for every job of `job_ids`, in one statement where the engine
    /// allows.
    async fn unclaim_all(
        &mut self,
        job_ids: &[JobId],
        consumer: &ConsumerName,
    ) -> Result<(), StoreError> {
        for &job_id in job_ids {
            self.unclaim(job_id, consumer).await?;
        }
        Ok(())
    }
}

/// Where work transactions come from.
#[async_trait]
pub trait WorkStore: Send + Sync + 'static {
    /// The engine's transaction, as handlers for this store receive it.
    type Tx: WorkTransaction;

    /// Opens a work transaction.
    async fn begin(&self) -> Result<Self::Tx, StoreError>;

    /// Opens a work transaction for work stopped after `limit` (a handler's time limit). A
    /// store whose engine can bound each statement of the transaction by it does so
    /// (PostgreSQL: `statement_timeout`, set in the same round trip as `BEGIN`), so that a
    /// handler stopped in the middle of a statement does not leave the statement running on
    /// the server, holding the transaction's locks. By default, [`begin`](Self::begin).
    async fn begin_within(&self, limit: Duration) -> Result<Self::Tx, StoreError> {
        let _ = limit;
        self.begin().await
    }
}

/// Housekeeping of `core.processed_jobs`.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait ProcessedJobs: Send + Sync {
    /// Whether `(job_id, consumer)` has a committed row: an operator's question (was this
    /// job done?), for tools and tests. The runtime never asks it: its claim inside the work
    /// transaction answers it atomically, which a separate read could not.
    async fn is_processed(
        &self,
        job_id: JobId,
        consumer: &ConsumerName,
    ) -> Result<bool, StoreError>;

    /// Deletes at most `batch` rows processed before `older_than`; returns how many it deleted,
    /// so a caller loops until fewer than `batch` come back, never holding a long lock.
    ///
    /// The claim of a job whose dead letter is pending review is kept however old: it is what
    /// refuses a republished or redelivered copy ([`Claim::DeadLettered`]) until an operator
    /// replays or discards the letter.
    async fn purge_processed(&self, older_than: SystemTime, batch: u32) -> Result<u64, StoreError>;

    /// Empties at once every slice of the table whose claims are all older than `older_than`
    /// but a few (kept, with those of pending dead letters), for a store that keeps its claims
    /// in slices (PostgreSQL, ADR 0014): a cost that does not grow with the table. Returns how
    /// many rows went, which such a store may take from its statistics rather than count (a
    /// count would read the slice); what it leaves goes through
    /// [`ProcessedJobs::purge_processed`]. Safe beside an open work transaction of the same
    /// store: it waits for a slice's lock only briefly and leaves a slice in use for a later
    /// run. The default, for a store without slices, removes nothing.
    async fn purge_expired_slices(&self, older_than: SystemTime) -> Result<u64, StoreError> {
        let _ = older_than;
        Ok(0)
    }

    /// How long after the TTL an expired claim may wait for its slice to be emptied whole
    /// rather than deleted row by row: a slice's span (a day on PostgreSQL, ADR 0014), zero for
    /// a store without slices. The cleanup's batches leave the claims that recent to the next
    /// run's [`ProcessedJobs::purge_expired_slices`]; a claim is only ever kept longer, never
    /// removed sooner.
    fn slice_span(&self) -> Duration {
        Duration::ZERO
    }
}

/// The review state of a dead letter. It only ever leaves `PendingReview`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterStatus {
    /// Waiting for an operator.
    PendingReview,
    /// Published again to its queue.
    Replayed,
    /// Given up for good.
    Discarded,
}

impl DeadLetterStatus {
    /// The value stored in `core.dead_letters.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterStatus::PendingReview => "pending_review",
            DeadLetterStatus::Replayed => "replayed",
            DeadLetterStatus::Discarded => "discarded",
        }
    }
}

impl fmt::Display for DeadLetterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadLetterStatus {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s {
            "pending_review" => Ok(DeadLetterStatus::PendingReview),
            "replayed" => Ok(DeadLetterStatus::Replayed),
            "discarded" => Ok(DeadLetterStatus::Discarded),
            other => Err(StoreError::failed(format!(
                "unknown dead-letter status `{other}` (expected pending_review, replayed or discarded)"
            ))),
        }
    }
}

/// Why a job became a dead letter, kept with it (`core.dead_letters.reason`), so that a review
/// tells "refused at once" from "ran out of retries". Rows written before the column existed
/// have none: "not recorded".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The payload is not a valid envelope, or its data does not fit the handler (or no
    /// handler knows its kind, when unknown kinds are poison). Never retried.
    Poison,
    /// No handler knows the job's kind, after every attempt the policy allows.
    UnknownKind,
    /// The handler said retrying cannot help.
    Permanent,
    /// Every attempt the policy allows failed.
    Exhausted,
    /// The envelope is over the payload limit: moved by the fetch without being read.
    TooLarge,
    /// The outbox relay cannot forward the row (over the limit, not an envelope, an invalid
    /// queue name).
    Unforwardable,
}

impl DeadLetterReason {
    /// Every reason, in the order a list of them reads.
    pub const ALL: [DeadLetterReason; 6] = [
        DeadLetterReason::Poison,
        DeadLetterReason::UnknownKind,
        DeadLetterReason::Permanent,
        DeadLetterReason::Exhausted,
        DeadLetterReason::TooLarge,
        DeadLetterReason::Unforwardable,
    ];

    /// The value stored in `core.dead_letters.reason`, and the label of
    /// `jobs_dead_lettered_total{reason}`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Poison => "poison",
            DeadLetterReason::UnknownKind => "unknown_kind",
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::TooLarge => "too_large",
            DeadLetterReason::Unforwardable => "unforwardable",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeadLetterReason {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        (DeadLetterReason::ALL.into_iter())
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect();
                StoreError::failed(format!(
                    "unknown dead-letter reason `{s}` (expected one of {})",
                    known.join(", ")
                ))
            })
    }
}

/// The id of a dead letter, increasing with insertion (the pagination cursor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadLetterId(pub i64);

impl fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A dead letter to record. Fields of the envelope are `None` when the payload is too broken
/// to yield them; the payload is always kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// The job id, when it could be read.
    pub job_id: Option<JobId>,
    /// The queue the message came from.
    pub queue: QueueName,
    /// The consumer that gave up on it, whose claim a replay releases.
    pub consumer: Option<ConsumerName>,
    /// The tenant, when it could be read.
    pub tenant_id: Option<TenantId>,
    /// The kind, when it could be read.
    pub kind: Option<Kind>,
    /// The correlation id, when it could be read.
    pub correlation_id: Option<CorrelationId>,
    /// The raw bytes as delivered.
    pub payload: Vec<u8>,
    /// Attempts made (1 for poison).
    pub attempts: u32,
    /// Why it was dead-lettered, naming the field for poison.
    pub last_error: String,
    /// Which kind of end it came to; `None` for a row written before reasons were kept.
    pub reason: Option<DeadLetterReason>,
    /// Keeps a redelivered copy from becoming a second pending dead letter: the job id when
    /// known, else the transport's message id. `None` disables the check.
    pub dedup_key: Option<String>,
    /// When it was dead-lettered.
    pub at: SystemTime,
}

/// A recorded dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its id.
    pub id: DeadLetterId,
    /// What was recorded.
    pub letter: NewDeadLetter,
    /// Its review state.
    pub status: DeadLetterStatus,
    /// When the status last changed.
    pub updated_at: SystemTime,
}

/// A dead letter the store holds but cannot read as a [`DeadLetter`] (a row written by direct
/// SQL or another version, whose queue, kind or consumer is no valid name, say): what a
/// listing for people shows in its place, so that one such row costs its line, not the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableLetter {
    /// Its id: the row is still there, to be looked at or removed by hand.
    pub id: DeadLetterId,
    /// Why it cannot be read, naming the column (never the payload).
    pub why: String,
}

/// One row of [`DeadLetterStore::listing`]: the letter, or why it cannot be read.
pub type ListedLetter = Result<DeadLetter, UnreadableLetter>;

/// The outcome of recording a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A new pending dead letter.
    New(DeadLetterId),
    /// A pending dead letter with the same queue and dedup key already existed.
    Existing(DeadLetterId),
}

impl Recorded {
    /// The id, new or existing.
    pub fn id(self) -> DeadLetterId {
        match self {
            Recorded::New(id) | Recorded::Existing(id) => id,
        }
    }
}

/// Which dead letters to list: all given criteria must hold. Results come in id order, or
/// newest first (descending id) with `newest_first`. The cursors `after` and `before` bound the
/// ids exclusively and may be combined; `limit` applies after ordering, so the next page starts
/// `after` the last id seen in id order and `before` it newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this status.
    pub status: Option<DeadLetterStatus>,
    /// Only this queue.
    pub queue: Option<QueueName>,
    /// Only this tenant.
    pub tenant_id: Option<TenantId>,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// Only ids greater than this (keyset pagination).
    pub after: Option<DeadLetterId>,
    /// Only ids less than this (keyset pagination, newest first).
    pub before: Option<DeadLetterId>,
    /// Newest first (descending id) instead of id order.
    pub newest_first: bool,
    /// Only the letters of this job.
    pub job_id: Option<JobId>,
    /// Only the letters of this correlation id.
    pub correlation_id: Option<CorrelationId>,
    /// Only the letters dead-lettered for this reason.
    pub reason: Option<DeadLetterReason>,
    /// At most this many.
    pub limit: u32,
}

impl Default for DeadLetterFilter {
    /// Everything, 100 at a time.
    fn default() -> Self {
        DeadLetterFilter {
            status: None,
            queue: None,
            tenant_id: None,
            kind: None,
            after: None,
            before: None,
            newest_first: false,
            job_id: None,
            correlation_id: None,
            reason: None,
            limit: 100,
        }
    }
}

/// Where an operator moves a dead letter: the only two ways out of `PendingReview`, so that no
/// call can ask for a move that a store would have to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Published again to its queue: [`DeadLetterStatus::Replayed`].
    Replay,
    /// Dropped for good: [`DeadLetterStatus::Discarded`].
    Discard,
}

impl Resolution {
    /// The status the letter ends in.
    pub fn status(self) -> DeadLetterStatus {
        match self {
            Resolution::Replay => DeadLetterStatus::Replayed,
            Resolution::Discard => DeadLetterStatus::Discarded,
        }
    }
}

/// A final status as the resolution that reaches it; `PendingReview` is none.
impl TryFrom<DeadLetterStatus> for Resolution {
    type Error = DeadLetterStatus;

    fn try_from(status: DeadLetterStatus) -> Result<Resolution, DeadLetterStatus> {
        match status {
            DeadLetterStatus::Replayed => Ok(Resolution::Replay),
            DeadLetterStatus::Discarded => Ok(Resolution::Discard),
            other => Err(other),
        }
    }
}

/// The outcome of a status change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Moved from `PendingReview` to the target.
    Done,
    /// It was in the target status already: nothing to do (a repeated command).
    AlreadyDone,
    /// It is in another final status, which is never left.
    Conflict(DeadLetterStatus),
    /// No such dead letter (or not the given tenant's).
    NotFound,
}

/// One status change of a dead letter, as the store recorded it: the audit trail an operator
/// reads to learn who replayed or discarded a letter, when, and from which tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterEvent {
    /// When the change was made: the `at` given to [`DeadLetterStore::transition`].
    pub at: SystemTime,
    /// The status it left (always `PendingReview` today, kept so the record stands alone).
    pub from: DeadLetterStatus,
    /// The status it reached.
    pub to: DeadLetterStatus,
    /// Who asked, as free text (`jobsctl (alice)`, `console (operator)`): recorded, never
    /// interpreted.
    pub by: String,
}

/// Dead letters: recorded by the runtime, reviewed, replayed or discarded by operators.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait DeadLetterStore: Send + Sync {
    /// Records a dead letter as `PendingReview`, unless a pending one with the same queue and
    /// dedup key exists.
    async fn record(&self, letter: NewDeadLetter) -> Result<Recorded, StoreError>;

    /// One dead letter.
    async fn get(&self, id: DeadLetterId) -> Result<Option<DeadLetter>, StoreError>;

    /// Dead letters matching `filter`, in the order it asks for: id order or newest first. A
    /// row that cannot be read fails the whole call (naming it); [`listing`](Self::listing)
    /// reads around it.
    async fn list(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError>;

    /// [`list`](Self::list), row by row: a row the store cannot read takes its place in the
    /// order as an [`UnreadableLetter`] rather than failing the call, so a listing for people
    /// (the console, `jobsctl dead-letters list`) shows the rest. The page is full when it
    /// holds `filter.limit` rows of either kind. A store whose rows are always readable (the
    /// memory store's are typed) keeps this default.
    async fn listing(&self, filter: &DeadLetterFilter) -> Result<Vec<ListedLetter>, StoreError> {
        Ok(self.list(filter).await?.into_iter().map(Ok).collect())
    }

    /// Whether a pending dead letter with this queue and dedup key exists.
    async fn pending(
        &self,
        queue: &QueueName,
        dedup_key: &str,
    ) -> Result<Option<DeadLetterId>, StoreError>;

    /// Moves a dead letter from `PendingReview` as `to` says; with `tenant`, only that
    /// tenant's. A letter never goes back to `PendingReview`. A replay also deletes the claim
    /// of the letter's job and consumer in `processed_jobs`, in the same transaction, so the
    /// replayed job can run.
    ///
    /// `by` says who asked (free text, such as `jobsctl (alice)` or `console (operator)`). A
    /// transition that changes the status ([`Transition::Done`]) records a [`DeadLetterEvent`]
    /// at `at` by `by`, atomically with the change, so the history never misses nor invents
    /// one; an `AlreadyDone`, `Conflict` or `NotFound` records nothing.
    async fn transition(
        &self,
        id: DeadLetterId,
        to: Resolution,
        tenant: Option<TenantId>,
        at: SystemTime,
        by: &str,
    ) -> Result<Transition, StoreError>;

    /// The status changes of a dead letter, oldest first; empty for an unknown id. Not
    /// tenant-scoped: a caller that serves one tenant checks the letter's tenant with
    /// [`get`](Self::get) first.
    async fn history(&self, id: DeadLetterId) -> Result<Vec<DeadLetterEvent>, StoreError>;
}

/// The id of a bulk run, increasing with each run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BulkRunId(pub i64);

impl fmt::Display for BulkRunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A bulk replay or discard of dead letters, as journaled by [`BulkRuns`]: the snapshot of
/// the ids it acts on, taken when it started, and the outcome of each letter settled so far.
///
/// The run works through the snapshot rather than a fresh query: a replay marks a letter
/// `replayed` before publishing it, so after an interruption between the two a new query over
/// `pending_review` would miss that letter, while the snapshot still holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkRun {
    /// Its id.
    pub id: BulkRunId,
    /// The action and filter as the caller described them; at most one unfinished run has it.
    pub key: String,
    /// What the run does to each letter.
    pub action: Resolution,
    /// The snapshot, in the order the run settles it.
    pub ids: Vec<DeadLetterId>,
    /// The outcome of each letter settled so far (free text, as recorded).
    pub settled: BTreeMap<DeadLetterId, String>,
    /// Who started it (free text, such as `jobsctl (alice)`).
    pub by: String,
    /// When it started.
    pub started_at: SystemTime,
    /// When it was closed, `None` while it may be resumed.
    pub finished_at: Option<SystemTime>,
}

impl BulkRun {
    /// How many letters the snapshot holds.
    pub fn total(&self) -> usize {
        self.ids.len()
    }

    /// How many letters are settled.
    pub fn done(&self) -> usize {
        self.settled.len()
    }

    /// Whether the run is closed: a new start of its key makes a new run.
    pub fn is_finished(&self) -> bool {
        self.finished_at.is_some()
    }

    /// The ids of the snapshot not settled yet, in order: what a resumed run still does.
    pub fn pending(&self) -> impl Iterator<Item = DeadLetterId> + '_ {
        self.ids
            .iter()
            .copied()
            .filter(|id| !self.settled.contains_key(id))
    }
}

/// Bulk dead-letter runs, journaled where every operator's tool sees them.
///
/// A run is resumable: the caller settles the pending letters one by one and records each
/// after it is done, so an interruption loses at most the record of the letter in hand, which
/// the resumed run does again (replay and discard are idempotent). Two callers starting the
/// same key at once get the same run.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait BulkRuns: Send + Sync {
    /// Starts a run of `action` over `ids` (in order) for `key` (the action and filter as the
    /// caller describes it, e.g. `"replay status=pending_review queue=billing.invoices"`), by
    /// `by`, at `at` — or answers the unfinished run of the same key, unchanged (resume), its
    /// own snapshot kept whatever `ids` says now.
    async fn start_run(
        &self,
        key: &str,
        action: Resolution,
        ids: &[DeadLetterId],
        by: &str,
        at: SystemTime,
    ) -> Result<BulkRun, StoreError>;

    /// The unfinished run of `key`, the one [`start_run`](Self::start_run) would resume, if
    /// any: lets a caller ask before starting whether it resumes. By default, found among
    /// every run; stores answer it from their index.
    async fn unfinished(&self, key: &str) -> Result<Option<BulkRun>, StoreError> {
        Ok(self
            .runs(u32::MAX)
            .await?
            .into_iter()
            .find(|run| run.key == key && !run.is_finished()))
    }

    /// Records `id` settled in `run` with `outcome` (free text: `"done"`, `"already done"`,
    /// `"conflict: discarded"`, `"not found"`, or an error), once; a second record of the same
    /// id is ignored, keeping the first outcome. An unknown run, or an id outside its snapshot,
    /// is [`StoreError::Failed`]: the caller mixed up its runs.
    async fn record_settled(
        &self,
        run: BulkRunId,
        id: DeadLetterId,
        outcome: &str,
    ) -> Result<(), StoreError>;

    /// Closes `run` at `at`: it is no longer resumed. Closing a closed run keeps its first
    /// time; an unknown run is [`StoreError::Failed`].
    async fn finish_run(&self, run: BulkRunId, at: SystemTime) -> Result<(), StoreError>;

    /// One run with its progress, `None` if unknown.
    async fn run(&self, run: BulkRunId) -> Result<Option<BulkRun>, StoreError>;

    /// The newest runs first, at most `limit`.
    async fn runs(&self, limit: u32) -> Result<Vec<BulkRun>, StoreError>;
}

crate::error::port_error! {
    /// A store failure, by its portable kind: what a caller can act on whatever the engine.
    pub enum StoreError {
        /// The store could not be reached or failed transiently (connection, timeout, the
        /// server shutting down): the same operation may succeed later.
        Unavailable => "store unavailable: {message}", Retryable;
        /// The transaction lost a conflict with a concurrent one (a deadlock, a serialization
        /// failure) and was aborted: running it again from the start may succeed.
        Conflict => "store conflict: {message}", Retryable;
        /// The store's schema is missing or behind this build (a table or column that does
        /// not exist): `jobsctl migrate` fixes it; retrying does not.
        SchemaMissing => "the store's schema is missing or behind: {message} (run `jobsctl migrate`)", Permanent;
        /// The store refused the operation and will refuse it again (constraint, corrupt row).
        Failed => "store operation failed: {message}", Permanent;
    }
}

impl StoreError {
    /// A transient failure with a message.
    pub fn unavailable(message: impl Into<String>) -> Self {
        StoreError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// A permanent failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        StoreError::Failed {
            message: message.into(),
            source: None,
        }
    }
}

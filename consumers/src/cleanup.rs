//! TTL cleanup of `core.processed_jobs`, as a job kind so that cron can schedule it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    Clock, Envelope, ProcessedJobs, PublishOptions, QueuePort, StoreError, SystemClock,
    WorkTransaction,
};
use serde::{Deserialize, Serialize};

use crate::handler::{Handler, Job, JobError};

/// The kind of the cleanup job ([`jobs_core::PROCESSED_JOBS_CLEANUP_KIND`]).
pub const CLEANUP_KIND: &str = jobs_core::PROCESSED_JOBS_CLEANUP_KIND;

/// How long processed rows are kept by default: well past the longest a message can live in a
/// transport (Vercel Queues retains at most 7 days), since a redelivery that finds no row runs
/// again.
pub const DEFAULT_PROCESSED_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The shortest TTL a cleanup keeps rows for: eight days, longer than any transport keeps a
/// message for redelivery (Vercel Queues, the longest, 7 days). A cleanup job's data can never
/// go below it; a configured or operator's TTL only when the cleanup is told to
/// ([`ProcessedCleanup::below_floor`]).
pub const MIN_JOB_TTL: Duration = Duration::from_secs(8 * 24 * 60 * 60);

/// Why a purge deleted nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PurgeError {
    /// The TTL is below [`MIN_JOB_TTL`] and the cleanup was not told to go below it.
    #[error(
        "a TTL of {}s is below the floor of {}s: a job redelivered after its processed row is \
         gone runs again; go below it only for a transport that cannot redeliver that late \
         (`ProcessedCleanup::below_floor`, `jobsctl cleanup processed --below-floor`)",
        ttl.as_secs(),
        MIN_JOB_TTL.as_secs()
    )]
    BelowFloor {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The cleanup job's data: an optional TTL overriding the handler's, at least
/// [`MIN_JOB_TTL`].
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupRequest {
    /// Keep rows processed within this many seconds.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// Deletes `processed_jobs` rows older than a TTL, in bounded batches so no statement holds
/// locks for long.
///
/// A store that keeps its claims in slices (PostgreSQL) first empties every expired slice at
/// once ([`ProcessedJobs::purge_expired_slices`]); the rest goes in batches.
///
/// As a job's handler it purges in the job's own work transaction (a store with one writer
/// at a time, such as SQLite, could not purge beside it), one batch per job when it is given
/// a queue for follow-ups ([`ProcessedCleanup::follow_ups`]): when the batch was full, it
/// publishes the same request again, so that no transaction outgrows a batch. Without one, it
/// purges batch after batch in the one transaction. [`ProcessedCleanup::purge`] is the same
/// cleanup through the store, for operators. Neither goes below [`MIN_JOB_TTL`] unless told
/// to ([`ProcessedCleanup::below_floor`]), and neither deletes the claim of a job whose dead
/// letter is pending review.
#[derive(Clone)]
pub struct ProcessedCleanup {
    store: Arc<dyn ProcessedJobs>,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    floor: Duration,
    batch: u32,
    follow_ups: Option<Arc<dyn QueuePort>>,
}

impl std::fmt::Debug for ProcessedCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedCleanup")
            .field("ttl", &self.ttl)
            .field("floor", &self.floor)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl ProcessedCleanup {
    /// Cleans `store` with [`DEFAULT_PROCESSED_TTL`] in batches of 1,000.
    pub fn new(store: Arc<dyn ProcessedJobs>) -> Self {
        ProcessedCleanup {
            store,
            clock: Arc::new(SystemClock),
            ttl: DEFAULT_PROCESSED_TTL,
            floor: MIN_JOB_TTL,
            batch: 1_000,
            follow_ups: None,
        }
    }

    /// Publishes the rest of a cleanup that filled its batch as a new job through `queue`, on
    /// the job's own queue.
    pub fn follow_ups(mut self, queue: Arc<dyn QueuePort>) -> Self {
        self.follow_ups = Some(queue);
        self
    }

    /// Keeps rows for `ttl`; below [`MIN_JOB_TTL`] only with [`ProcessedCleanup::below_floor`]
    /// (a purge refuses it, a cleanup job fails for good).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Lets the configured TTL and a purge's go below [`MIN_JOB_TTL`]. A job redelivered after
    /// its row is gone runs again: only for transports that cannot redeliver that late. A
    /// cleanup job's own data still may not go below the floor.
    pub fn below_floor(mut self) -> Self {
        self.floor = Duration::ZERO;
        self
    }

    /// Deletes at most `batch` rows per statement.
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Takes time from `clock`.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Deletes every row older than `ttl` (the configured one if `None`) but those a store
    /// with slices leaves for the next run ([`ProcessedJobs::slice_span`]); returns how many. A
    /// TTL below [`MIN_JOB_TTL`] is refused unless the cleanup was told
    /// ([`ProcessedCleanup::below_floor`]); one reaching back before the clock's epoch deletes
    /// nothing.
    pub async fn purge(&self, ttl: Option<Duration>) -> Result<u64, PurgeError> {
        let ttl = self.floored(ttl.unwrap_or(self.ttl))?;
        let Some(cutoff) = self.clock.now().checked_sub(ttl) else {
            return Ok(0);
        };
        let mut total = self.store.purge_expired_slices(cutoff).await?;
        if let Some(before) = self.batches_before(cutoff) {
            loop {
                let deleted = self.store.purge_processed(before, self.batch).await?;
                total += deleted;
                if deleted < u64::from(self.batch) {
                    break;
                }
            }
        }
        purged(total, "purged processed_jobs rows past their TTL");
        Ok(total)
    }

    /// Where the batches stop: the cutoff, less the store's slice span, so that a claim about
    /// to go with its slice is not deleted row by row first (ADR 0014). `None` before the epoch.
    fn batches_before(&self, cutoff: SystemTime) -> Option<SystemTime> {
        cutoff.checked_sub(self.store.slice_span())
    }

    /// `ttl`, unless it is below this cleanup's floor.
    fn floored(&self, ttl: Duration) -> Result<Duration, PurgeError> {
        if ttl < self.floor {
            return Err(PurgeError::BelowFloor { ttl });
        }
        Ok(ttl)
    }
}

#[async_trait]
impl<Tx: WorkTransaction> Handler<Tx> for ProcessedCleanup {
    type Data = CleanupRequest;

    async fn handle(&self, job: Job<CleanupRequest>, tx: &mut Tx) -> Result<(), JobError> {
        let ttl = job.envelope.data.ttl_secs.map(Duration::from_secs);
        if let Some(ttl) = ttl.filter(|ttl| *ttl < MIN_JOB_TTL) {
            return Err(JobError::permanent(format!(
                "`ttl_secs`: {} is below the floor of {} (a redelivered job must still find \
                 its processed row)",
                ttl.as_secs(),
                MIN_JOB_TTL.as_secs()
            )));
        }
        let ttl = match ttl {
            Some(ttl) => ttl,
            None => self.floored(self.ttl).map_err(JobError::permanent)?,
        };
        // A TTL reaching back before the clock's epoch deletes nothing.
        let Some(cutoff) = self.clock.now().checked_sub(ttl) else {
            return Ok(());
        };
        // Whole expired slices first, through the store: never waits on this transaction, and
        // removes only claims past the TTL, as the batches below do.
        let mut deleted = self
            .store
            .purge_expired_slices(cutoff)
            .await
            .map_err(|e| JobError::classed(e.class(), e))?;
        let Some(before) = self.batches_before(cutoff) else {
            purged(deleted, "purged processed_jobs rows past their TTL");
            return Ok(());
        };
        loop {
            let batch = tx
                .purge_processed(before, self.batch)
                .await
                .map_err(|e| JobError::classed(e.class(), e))?;
            deleted += batch;
            if batch < u64::from(self.batch) {
                break;
            }
            if let Some(queue) = &self.follow_ups {
                let request =
                    serde_json::to_value(&job.envelope.data).map_err(JobError::permanent)?;
                let next = Envelope::new(
                    job.envelope.tenant_id,
                    job.envelope.correlation_id,
                    job.envelope.kind.clone(),
                    request,
                );
                queue
                    .publish(&job.queue, &next, PublishOptions::default())
                    .await
                    .map_err(|e| JobError::classed(e.class(), e))?;
                purged(
                    deleted,
                    "purged a batch of processed_jobs; the rest follows",
                );
                return Ok(());
            }
        }
        purged(deleted, "purged processed_jobs rows past their TTL");
        Ok(())
    }
}

/// Logs `deleted` rows purged and counts them in `jobs_processed_purged_total`, the figure an
/// operator watches to see the table kept in bounds.
fn purged(deleted: u64, what: &'static str) {
    metrics::counter!("jobs_processed_purged_total").increment(deleted);
    tracing::info!(deleted, "{what}");
}

//! The `processed_jobs` TTL cleanup: what it deletes and keeps, batch by batch, the default
//! TTL, the floor a job's own TTL may not go below, and the floor a configured or operator's
//! TTL goes below only when the cleanup is told.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryStore, MemoryWorkTx};
use jobs_consumers::{CLEANUP_KIND, Handler, Job, JobError, Outcome, ProcessedCleanup, PurgeError};
use jobs_core::{
    Claim, ConsumerName, JobId, NewDeadLetter, ProcessedJobs, PublishOptions, QueuePort, Recorded,
    StoreError, WorkStore, WorkTransaction,
};

use crate::harness::Harness;

fn ok(_: u32) -> Result<(), JobError> {
    Ok(())
}

const DAY: Duration = Duration::from_secs(86_400);

/// A harness whose store holds `n` processed rows made now.
async fn processed(n: u64) -> Harness {
    let h = Harness::new();
    let worker = h.worker(ok);
    for i in 0..n {
        h.publish(i).await;
    }
    h.drain(&worker).await;
    h
}

fn cleanup(h: &Harness) -> ProcessedCleanup {
    ProcessedCleanup::new(Arc::new(Bounded::new(h.store.clone()))).clock(Arc::new(h.clock.clone()))
}

/// More purges than any test here needs: a cleanup that asks for another batch after a short
/// one fails at this many rather than asking forever.
const MOST_BATCHES: u32 = 100;

/// The harness's store, or a transaction of it, answering at most [`MOST_BATCHES`] purges.
struct Bounded<T> {
    inner: T,
    asked: AtomicU32,
}

impl<T> Bounded<T> {
    fn new(inner: T) -> Self {
        Bounded {
            inner,
            asked: AtomicU32::new(0),
        }
    }

    fn ask(&self) {
        let asked = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(
            asked <= MOST_BATCHES,
            "asked for {asked} batches: the cleanup did not stop at a short one"
        );
    }
}

#[async_trait]
impl ProcessedJobs for Bounded<MemoryStore> {
    async fn is_processed(
        &self,
        job_id: JobId,
        consumer: &ConsumerName,
    ) -> Result<bool, StoreError> {
        self.inner.is_processed(job_id, consumer).await
    }

    async fn purge_processed(&self, older_than: SystemTime, batch: u32) -> Result<u64, StoreError> {
        self.ask();
        self.inner.purge_processed(older_than, batch).await
    }
}

#[async_trait]
impl WorkTransaction for Bounded<MemoryWorkTx> {
    async fn claim(
        &mut self,
        job_id: JobId,
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Claim, StoreError> {
        self.inner.claim(job_id, consumer, at).await
    }

    async fn record_dead_letter(&mut self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        self.inner.record_dead_letter(letter).await
    }

    async fn purge_processed(
        &mut self,
        older_than: SystemTime,
        batch: u32,
    ) -> Result<u64, StoreError> {
        self.ask();
        self.inner.purge_processed(older_than, batch).await
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.inner.commit().await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.inner.rollback().await
    }
}

/// Runs `cleanup` as the handler of a cleanup job asking for `data`, in a transaction of the
/// harness's store (bounded, as above) that commits when it succeeds.
async fn handled(
    h: &Harness,
    cleanup: &ProcessedCleanup,
    data: serde_json::Value,
) -> Result<(), JobError> {
    let envelope = jobs_testkit::fixtures::envelope_with(1, CLEANUP_KIND, data);
    let job = Job::new(
        envelope.into_typed().expect("a cleanup request"),
        "core.maintenance".parse().expect("valid"),
        1,
    );
    let mut tx = Bounded::new(h.store.begin().await.expect("begin"));
    let handled = cleanup.handle(job, &mut tx).await;
    if handled.is_ok() {
        tx.commit().await.expect("commit");
    }
    handled
}

#[tokio::test]
async fn purge_deletes_every_row_past_the_ttl_batch_by_batch_and_says_how_many() {
    let h = processed(20).await;
    h.clock.advance(2 * DAY);
    let recent = h.publish(100).await;
    h.drain(&h.worker(ok)).await;
    let cleanup = cleanup(&h).ttl(DAY).below_floor().batch(10);
    // Two full batches, then an empty one: all twenty, not the first ten.
    assert_eq!(cleanup.purge(None).await.expect("purged"), 20);
    assert_eq!(cleanup.purge(None).await.expect("purged"), 0);
    h.clock.advance(Duration::from_secs(1));
    assert_eq!(
        cleanup.purge(Some(Duration::ZERO)).await.expect("purged"),
        1
    );
    let consumer = "test.consumer".try_into().expect("valid");
    assert!(
        !h.store
            .is_processed(recent.job_id, &consumer)
            .await
            .expect("query")
    );
    // A TTL reaching before the clock's epoch deletes nothing rather than everything.
    assert_eq!(cleanup.purge(Some(Duration::MAX)).await.expect("purged"), 0);
    let shown = format!("{cleanup:?}");
    assert!(
        shown.contains("ProcessedCleanup") && shown.contains("batch: 10"),
        "{shown}"
    );
}

#[tokio::test]
async fn rows_are_kept_thirty_days_by_default() {
    let h = processed(3).await;
    let cleanup = cleanup(&h);
    h.clock.advance(30 * DAY - Duration::from_secs(1));
    assert_eq!(
        cleanup.purge(None).await.expect("purged"),
        0,
        "29 days and change"
    );
    h.clock.advance(Duration::from_secs(2));
    assert_eq!(
        cleanup.purge(None).await.expect("purged"),
        3,
        "past thirty days"
    );
}

#[tokio::test]
async fn a_cleanup_job_may_ask_for_eight_days_and_not_less() {
    let h = processed(2).await;
    // Even a cleanup told to go below the floor keeps a job's data above it.
    let (maintenance, cleaner) = h.cleaner(cleanup(&h).ttl(DAY).below_floor());
    let job = |secs: u64| {
        jobs_testkit::fixtures::envelope_with(
            1,
            CLEANUP_KIND,
            serde_json::json!({ "ttl_secs": secs }),
        )
    };
    let eight_days = 8 * DAY.as_secs();
    h.clock.advance(8 * DAY + Duration::from_secs(1));
    h.queue
        .publish(
            &maintenance,
            &job(eight_days - 1),
            PublishOptions::default(),
        )
        .await
        .expect("publish");
    let refused = cleaner.run_once().await.expect("receive");
    assert!(
        matches!(refused.as_slice(), [Outcome::DeadLettered { .. }]),
        "a TTL below the floor is refused: {refused:?}"
    );
    assert_eq!(
        cleanup(&h).ttl(8 * DAY).purge(None).await.expect("purged"),
        2,
        "kept"
    );
}

#[tokio::test]
async fn a_cleanup_job_at_the_floor_purges_what_is_older() {
    let h = processed(2).await;
    h.clock.advance(8 * DAY + Duration::from_secs(1));
    let at_the_floor = serde_json::json!({ "ttl_secs": 8 * DAY.as_secs() });
    handled(&h, &cleanup(&h).ttl(DAY), at_the_floor)
        .await
        .expect("purged");
    assert_eq!(
        cleanup(&h)
            .below_floor()
            .purge(Some(Duration::ZERO))
            .await
            .expect("purged"),
        0,
        "all gone"
    );
}

#[tokio::test]
async fn a_ttl_below_the_floor_is_refused_unless_the_cleanup_is_told() {
    let h = processed(2).await;
    h.clock.advance(2 * DAY);
    let refused = cleanup(&h)
        .purge(Some(DAY))
        .await
        .expect_err("an operator's TTL below the floor");
    assert!(
        matches!(refused, PurgeError::BelowFloor { ttl } if ttl == DAY),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("--below-floor"),
        "the refusal says how to go below: {refused}"
    );
    let configured = cleanup(&h).ttl(DAY);
    assert!(
        matches!(
            configured.purge(None).await,
            Err(PurgeError::BelowFloor { .. })
        ),
        "a configured TTL below the floor"
    );
    let failed = handled(&h, &configured, serde_json::json!({}))
        .await
        .expect_err("a cleanup job with that configuration");
    assert!(matches!(failed, JobError::Permanent(_)), "{failed:?}");
    assert_eq!(
        configured.below_floor().purge(None).await.expect("purged"),
        2,
        "told, it purges; nothing was deleted before"
    );
}

#[test]
fn the_cleanup_job_counts_the_rows_it_purged() {
    // Counted on this thread only, whatever runs beside it.
    let counted = crate::harness::counters("jobs_processed_purged_total", async {
        let h = processed(7).await;
        h.clock.advance(2 * DAY);
        let cleanup = cleanup(&h).ttl(DAY).below_floor().batch(3);
        handled(&h, &cleanup, serde_json::json!({}))
            .await
            .expect("purged");
    });
    assert_eq!(
        counted,
        [(vec![], 7)],
        "batches of 3, 3 and 1 rows, counted once"
    );
}

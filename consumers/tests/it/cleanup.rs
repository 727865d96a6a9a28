//! The `processed_jobs` TTL cleanup: what it deletes and keeps, batch by batch, the default
//! TTL, and the floor a job's own TTL may not go below.

use std::sync::Arc;
use std::time::Duration;

use jobs_consumers::{CLEANUP_KIND, Outcome, ProcessedCleanup};
use jobs_core::{ProcessedJobs, PublishOptions, QueuePort};

use jobs_consumers::JobError;

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
    ProcessedCleanup::new(Arc::new(h.store.clone())).clock(Arc::new(h.clock.clone()))
}

#[tokio::test]
async fn purge_deletes_every_row_past_the_ttl_batch_by_batch_and_says_how_many() {
    let h = processed(20).await;
    h.clock.advance(2 * DAY);
    let recent = h.publish(100).await;
    h.drain(&h.worker(ok)).await;
    let cleanup = cleanup(&h).ttl(DAY).batch(10);
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
    let (maintenance, cleaner) = h.cleaner(cleanup(&h).ttl(DAY));
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
    let (maintenance, cleaner) = h.cleaner(cleanup(&h).ttl(DAY));
    h.clock.advance(8 * DAY + Duration::from_secs(1));
    let job = jobs_testkit::fixtures::envelope_with(
        1,
        CLEANUP_KIND,
        serde_json::json!({ "ttl_secs": 8 * DAY.as_secs() }),
    );
    h.queue
        .publish(&maintenance, &job, PublishOptions::default())
        .await
        .expect("publish");
    assert_eq!(
        cleaner.run_once().await.expect("receive"),
        [Outcome::Processed]
    );
    assert_eq!(
        cleanup(&h)
            .purge(Some(Duration::ZERO))
            .await
            .expect("purged"),
        0,
        "all gone"
    );
}

#[test]
fn the_cleanup_job_counts_the_rows_it_purged() {
    // Counted on this thread only, whatever runs beside it.
    let counted = crate::harness::counters("jobs_processed_purged_total", async {
        let h = processed(7).await;
        h.clock.advance(2 * DAY);
        let (maintenance, cleaner) = h.cleaner(cleanup(&h).ttl(DAY).batch(3));
        let job = jobs_testkit::fixtures::envelope_with(1, CLEANUP_KIND, serde_json::json!({}));
        h.queue
            .publish(&maintenance, &job, PublishOptions::default())
            .await
            .expect("publish");
        assert_eq!(
            cleaner.run_once().await.expect("receive"),
            [Outcome::Processed]
        );
    });
    assert_eq!(
        counted,
        [(vec![], 7)],
        "batches of 3, 3 and 1 rows, counted once"
    );
}

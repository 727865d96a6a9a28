//! Replay and discard scoped to a tenant, and a filter's snapshot read page by page, each page
//! once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_adapter_memory::{MemoryQueue, MemoryStore};
use jobs_consumers::{DeadLetters, ReplayError};
use jobs_core::{
    DeadLetter, DeadLetterFilter, DeadLetterId, DeadLetterStatus, DeadLetterStore, NewDeadLetter,
    PullPort, QueueName, Transition,
};
use jobs_testkit::fixtures;
use jobs_testkit::mock::MockDeadLetterStore;

fn queue() -> QueueName {
    "billing.invoices".parse().expect("a queue")
}

/// `n` letters of tenant 1 (ids ascending in order of recording).
async fn letters(store: &MemoryStore, n: u64) -> Vec<DeadLetterId> {
    let mut ids = vec![];
    for i in 0..n {
        let envelope =
            fixtures::envelope_with(1, "billing.invoice_issued", serde_json::json!({ "n": i }));
        let recorded = store
            .record(NewDeadLetter {
                job_id: Some(envelope.job_id),
                queue: queue(),
                consumer: None,
                tenant_id: Some(envelope.tenant_id),
                kind: Some(envelope.kind.clone()),
                correlation_id: Some(envelope.correlation_id),
                payload: envelope.to_json_bytes().expect("bytes"),
                attempts: 5,
                last_error: "customer not found".to_owned(),
                reason: None,
                dedup_key: None,
                at: SystemTime::now(),
            })
            .await
            .expect("recorded");
        ids.push(recorded.id());
    }
    ids
}

#[tokio::test]
async fn a_tenant_replays_and_discards_its_own_letters_only() {
    let (store, queue_) = (MemoryStore::default(), MemoryQueue::default());
    let ids = letters(&store, 2).await;
    let actions = DeadLetters::new(Arc::new(store.clone()), Arc::new(queue_.clone()));
    let other = Some(fixtures::tenant(2));
    assert!(matches!(
        actions.replay(ids[0], other).await,
        Err(ReplayError::NotFound(id)) if id == ids[0]
    ));
    assert_eq!(
        actions.discard(ids[1], other).await.expect("store"),
        Transition::NotFound
    );
    for id in &ids {
        let letter = store.get(*id).await.expect("store").expect("kept");
        assert_eq!(letter.status, DeadLetterStatus::PendingReview);
    }
    let nothing = queue_
        .receive(&queue(), 10, Duration::from_secs(30))
        .await
        .expect("receive");
    assert!(
        nothing.is_empty(),
        "another tenant's replay published nothing"
    );
    // Nor does an answer tell another tenant what a letter is: a discarded one is not found
    // (not a conflict), and neither is a poison message of bytes.
    actions.discard(ids[1], None).await.expect("store");
    assert!(matches!(
        actions.replay(ids[1], other).await,
        Err(ReplayError::NotFound(_))
    ));
    let poison = store
        .record(NewDeadLetter {
            job_id: None,
            queue: queue(),
            consumer: None,
            tenant_id: None,
            kind: None,
            correlation_id: None,
            payload: b"\xff not json".to_vec(),
            attempts: 1,
            last_error: "not an envelope".to_owned(),
            reason: None,
            dedup_key: None,
            at: SystemTime::now(),
        })
        .await
        .expect("recorded")
        .id();
    assert!(matches!(
        actions.replay(poison, other).await,
        Err(ReplayError::NotFound(_))
    ));
    let own = Some(fixtures::tenant(1));
    actions.replay(ids[0], own).await.expect("its own letter");
    assert_eq!(
        actions.discard(ids[0], own).await.expect("store"),
        Transition::Conflict(DeadLetterStatus::Replayed)
    );
}

#[tokio::test]
async fn a_filters_snapshot_reads_each_page_once_in_either_order() {
    let store = MemoryStore::default();
    let ids = letters(&store, 5).await;
    let all: Vec<DeadLetter> = store
        .list(&DeadLetterFilter {
            limit: 100,
            ..DeadLetterFilter::default()
        })
        .await
        .expect("list");
    for (limit, newest_first, pages) in [(2, false, 3), (2, true, 3), (5, false, 2), (7, true, 1)] {
        let mut paged = MockDeadLetterStore::new();
        let held = all.clone();
        paged.expect_list().times(pages).returning(move |f| {
            let mut page: Vec<DeadLetter> = held
                .iter()
                .filter(|l| f.after.is_none_or(|a| l.id > a))
                .filter(|l| f.before.is_none_or(|b| l.id < b))
                .cloned()
                .collect();
            if f.newest_first {
                page.reverse();
            }
            page.truncate(f.limit as usize);
            Ok(page)
        });
        let actions = DeadLetters::new(Arc::new(paged), Arc::new(MemoryQueue::default()));
        let filter = DeadLetterFilter {
            limit,
            newest_first,
            ..DeadLetterFilter::default()
        };
        let mut expected = ids.clone();
        if newest_first {
            expected.reverse();
        }
        assert_eq!(
            actions.matching(&filter).await.expect("matching"),
            expected,
            "pages of {limit}, newest first: {newest_first}"
        );
    }
}

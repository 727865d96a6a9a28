//! The memory store's work transaction as a group transaction: checkpoints and undo, released
//! claims, claims of a whole group, touches and the checkpoint budget.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use jobs_adapter_memory::MemoryStore;
use jobs_core::{
    Claim, Clock, ConsumerName, DeadLetterFilter, DeadLetterStore, GroupTransaction, JobId,
    ManualClock, NewDeadLetter, ProcessedJobs, WorkStore, WorkTransaction,
};
use jobs_testkit::fixtures;

fn consumer() -> ConsumerName {
    "billing.invoicer".parse().expect("a consumer")
}

/// `n` job ids in increasing order.
fn jobs(n: usize) -> Vec<JobId> {
    let mut ids: Vec<JobId> = (0..n)
        .map(|i| fixtures::envelope(1, i as u64).job_id)
        .collect();
    ids.sort_unstable();
    ids
}

fn letter(job_id: JobId, at: SystemTime) -> NewDeadLetter {
    NewDeadLetter {
        job_id: Some(job_id),
        queue: "billing.invoices".parse().expect("a queue"),
        consumer: Some(consumer()),
        tenant_id: None,
        kind: None,
        correlation_id: None,
        payload: b"{}".to_vec(),
        attempts: 3,
        last_error: "boom".to_owned(),
        reason: None,
        dedup_key: Some(job_id.to_string()),
        at,
    }
}

/// Polls `future` once, without a runtime's waker: whether it is ready now.
fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

async fn processed(store: &MemoryStore, job: JobId) -> bool {
    store
        .is_processed(job, &consumer())
        .await
        .expect("is_processed")
}

async fn pending_letters(store: &MemoryStore) -> usize {
    store
        .list(&DeadLetterFilter::default())
        .await
        .expect("list")
        .len()
}

#[tokio::test]
async fn an_undo_reverts_every_change_since_the_checkpoint_and_keeps_it() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let ids = jobs(5);
    let (kept, unclaimed, later, again, old) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    let long_ago = clock.now() - Duration::from_secs(86_400);
    let mut tx = store.begin().await.expect("begin");
    tx.claim(old, &consumer(), long_ago).await.expect("claim");
    tx.commit().await.expect("commit");

    let now = clock.now();
    let mut tx = store.begin().await.expect("begin");
    tx.claim_all(&[kept, unclaimed], &consumer(), now)
        .await
        .expect("claim");
    tx.record_effect("kept");
    tx.checkpoint().await.expect("checkpoint");
    tx.claim(later, &consumer(), now).await.expect("claim");
    tx.record_effect("undone");
    tx.record_dead_letter(letter(later, now))
        .await
        .expect("dead letter");
    tx.unclaim(unclaimed, &consumer()).await.expect("unclaim");
    assert_eq!(
        tx.purge_processed(now, 10).await.expect("purge"),
        1,
        "the old row is purged"
    );
    tx.undo().await.expect("undo");

    tx.claim(again, &consumer(), now).await.expect("claim");
    tx.record_effect("undone too");
    tx.undo()
        .await
        .expect("the checkpoint survives the first undo");
    tx.record_effect("after");
    tx.commit().await.expect("commit");

    assert_eq!(store.effects(), ["kept", "after"]);
    assert!(
        processed(&store, kept).await,
        "claimed before the checkpoint"
    );
    assert!(processed(&store, unclaimed).await, "its release was undone");
    assert!(!processed(&store, later).await, "its claim was undone");
    assert!(!processed(&store, again).await, "undone by the second undo");
    assert!(processed(&store, old).await, "the purge was undone");
    assert_eq!(
        pending_letters(&store).await,
        0,
        "the dead letter was undone"
    );
}

#[tokio::test]
async fn an_undo_without_a_checkpoint_fails_and_changes_nothing() {
    let store = MemoryStore::default();
    let mut tx = store.begin().await.expect("begin");
    tx.record_effect("kept");
    let refused = tx.undo().await.expect_err("nothing to go back to");
    assert!(
        refused.to_string().contains("without a checkpoint"),
        "says why: {refused}"
    );
    tx.commit().await.expect("commit");
    assert_eq!(store.effects(), ["kept"]);
}

#[tokio::test]
async fn a_released_claim_stays_reserved_until_its_transaction_ends() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let job = jobs(1)[0];
    let mut first = store.begin().await.expect("begin");
    assert_eq!(
        first
            .claim(job, &consumer(), clock.now())
            .await
            .expect("claim"),
        Claim::Claimed
    );
    first.unclaim(job, &consumer()).await.expect("unclaim");

    let mut second = store.begin().await.expect("begin");
    let consumer = consumer();
    let mut claim = pin!(second.claim(job, &consumer, clock.now()));
    assert!(
        poll_once(claim.as_mut()).is_pending(),
        "released, but reserved while its transaction is open"
    );
    first.commit().await.expect("commit");
    assert_eq!(
        poll_once(claim.as_mut()).map(|claim| claim.expect("claim")),
        Poll::Ready(Claim::Claimed),
        "the released claim was not committed: the job is free"
    );
}

#[tokio::test]
async fn a_released_claim_is_taken_again_by_its_own_transaction() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let job = jobs(1)[0];
    let mut tx = store.begin().await.expect("begin");
    tx.claim(job, &consumer(), clock.now())
        .await
        .expect("claim");
    tx.unclaim(job, &consumer()).await.expect("unclaim");
    {
        let consumer = consumer();
        let mut claim = pin!(tx.claim(job, &consumer, clock.now()));
        assert_eq!(
            poll_once(claim.as_mut()).map(|claim| claim.expect("claim")),
            Poll::Ready(Claim::Claimed),
            "its own released claim does not wait for itself"
        );
    }
    tx.commit().await.expect("commit");
    assert!(processed(&store, job).await);
}

#[tokio::test]
async fn an_undone_claim_is_released_at_once() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let job = jobs(1)[0];
    let mut first = store.begin().await.expect("begin");
    first.checkpoint().await.expect("checkpoint");
    first
        .claim(job, &consumer(), clock.now())
        .await
        .expect("claim");

    let mut second = store.begin().await.expect("begin");
    let consumer = consumer();
    let mut claim = pin!(second.claim(job, &consumer, clock.now()));
    assert!(poll_once(claim.as_mut()).is_pending(), "the first holds it");
    first.undo().await.expect("undo");
    assert_eq!(
        poll_once(claim.as_mut()).map(|claim| claim.expect("claim")),
        Poll::Ready(Claim::Claimed),
        "free while the first is still open"
    );
    assert_eq!(store.open_transactions(), 2);
}

#[tokio::test]
async fn claim_all_answers_in_order_and_a_repeat_finds_the_job_claimed() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let ids = jobs(4);
    let (new, other, done, dead) = (ids[0], ids[1], ids[2], ids[3]);
    let mut tx = store.begin().await.expect("begin");
    tx.claim_all(&[done, dead], &consumer(), clock.now())
        .await
        .expect("claim");
    tx.record_dead_letter(letter(dead, clock.now()))
        .await
        .expect("dead letter");
    tx.commit().await.expect("commit");

    let mut tx = store.begin().await.expect("begin");
    let claims = tx
        .claim_all(&[other, new, other, done, dead], &consumer(), clock.now())
        .await
        .expect("claim");
    assert_eq!(
        claims,
        [
            Claim::Claimed,
            Claim::Claimed,
            Claim::AlreadyProcessed,
            Claim::AlreadyProcessed,
            Claim::DeadLettered,
        ]
    );
    tx.commit().await.expect("commit");
    assert!(processed(&store, new).await && processed(&store, other).await);
}

#[tokio::test]
async fn claim_all_waits_in_job_id_order() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let ids = jobs(2);
    let (low, high) = (ids[0], ids[1]);
    let mut first = store.begin().await.expect("begin");
    first
        .claim(low, &consumer(), clock.now())
        .await
        .expect("claim");

    let mut second = store.begin().await.expect("begin");
    let consumer = consumer();
    let group = [high, low];
    let mut claims = pin!(second.claim_all(&group, &consumer, clock.now()));
    assert!(
        poll_once(claims.as_mut()).is_pending(),
        "waits for the first's claim"
    );
    let mut third = store.begin().await.expect("begin");
    {
        // Polled, not awaited: a group that took the higher id first would keep it waiting.
        let mut claim = pin!(third.claim(high, &consumer, clock.now()));
        assert_eq!(
            poll_once(claim.as_mut()).map(|claim| claim.expect("claim")),
            Poll::Ready(Claim::Claimed),
            "the waiting group took the lower id first, and nothing after it yet"
        );
    }
    third.rollback().await.expect("rollback");
    first.rollback().await.expect("rollback");
    assert_eq!(
        poll_once(claims.as_mut()).map(|claims| claims.expect("claim")),
        Poll::Ready(vec![Claim::Claimed, Claim::Claimed])
    );
}

#[tokio::test]
async fn only_a_handlers_write_touches_the_transaction() {
    let clock = ManualClock::default();
    let store = MemoryStore::default();
    let ids = jobs(2);
    let mut tx = store.begin().await.expect("begin");
    assert!(!tx.take_touched(), "untouched at the start");
    tx.claim_all(&ids, &consumer(), clock.now())
        .await
        .expect("claim");
    tx.record_dead_letter(letter(ids[0], clock.now()))
        .await
        .expect("dead letter");
    tx.unclaim(ids[1], &consumer()).await.expect("unclaim");
    tx.checkpoint().await.expect("checkpoint");
    assert!(!tx.take_touched(), "the runtime's own changes do not touch");
    tx.record_effect("written");
    assert!(tx.take_touched(), "a handler's write touches");
    assert!(!tx.take_touched(), "asking clears it");
}

#[tokio::test]
async fn the_checkpoint_budget_is_unbounded_by_default_and_can_be_set() {
    let store = MemoryStore::default();
    let mut tx = store.begin().await.expect("begin");
    assert_eq!(tx.checkpoint_budget(), usize::MAX);
    for _ in 0..100 {
        tx.checkpoint().await.expect("no limit");
    }
    tx.rollback().await.expect("rollback");

    let store = MemoryStore::default().with_checkpoint_budget(2);
    let mut tx = store.clone().begin().await.expect("begin");
    assert_eq!(tx.checkpoint_budget(), 2, "a clone keeps the budget");
    tx.checkpoint().await.expect("first");
    tx.record_effect("kept");
    tx.checkpoint().await.expect("second");
    tx.record_effect("undone");
    let refused = tx.checkpoint().await.expect_err("past the budget");
    assert!(
        refused.to_string().contains("budget of 2"),
        "names the budget: {refused}"
    );
    tx.undo()
        .await
        .expect("the last checkpoint stands after a refused one");
    tx.commit().await.expect("commit");
    assert_eq!(store.effects(), ["kept"]);

    let mut fresh = store.begin().await.expect("begin");
    fresh
        .checkpoint()
        .await
        .expect("the budget is per transaction");
}

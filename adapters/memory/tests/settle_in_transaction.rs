//! The memory queue holding and settling its deliveries inside a memory store's work
//! transactions, as a grouped worker drives it, without the worker.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
use jobs_core::{
    Clock, Delivery, Depth, GroupTransaction, Lease, ManualClock, ProcessedJobs, PublishOptions,
    PullPort, QueueDepth, QueueError, QueueName, QueuePort, SettleInTransaction, SettlePort,
    Settlement, TenantFairness, WorkStore, WorkTransaction,
};
use jobs_testkit::fixtures;

const LEASE: Duration = Duration::from_secs(30);

struct Setup {
    clock: ManualClock,
    queue: MemoryQueue,
    store: MemoryStore,
    name: QueueName,
}

fn setup() -> Setup {
    let clock = ManualClock::default();
    Setup {
        queue: MemoryQueue::new(Arc::new(clock.clone())),
        store: MemoryStore::default(),
        name: "billing.invoices".parse().expect("a queue name"),
        clock,
    }
}

impl Setup {
    /// Publishes `n` jobs of tenant 1 and leases them all.
    async fn leased(&self, n: u64) -> Vec<Delivery> {
        for i in 0..n {
            self.queue
                .publish(
                    &self.name,
                    &fixtures::envelope(1, i),
                    PublishOptions::default(),
                )
                .await
                .expect("publish");
        }
        let deliveries = self.receive().await;
        assert_eq!(deliveries.len() as u64, n, "every job published is leased");
        deliveries
    }

    async fn receive(&self) -> Vec<Delivery> {
        self.queue
            .receive(&self.name, 100, LEASE)
            .await
            .expect("receive")
    }

    async fn depth(&self) -> Depth {
        self.queue.depth(&self.name).await.expect("depth")
    }

    async fn hold(&self, tx: &mut MemoryWorkTx, deliveries: &[&Delivery]) -> Vec<bool> {
        let leases: Vec<&Lease> = deliveries.iter().map(|d| &d.lease).collect();
        self.queue.hold(tx, &leases).await.expect("hold")
    }
}

/// Polls `future` once, without a runtime's waker: whether it is ready now.
fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test]
async fn settlements_apply_at_commit_each_as_its_kind_says() {
    let s = setup();
    assert_eq!(
        s.queue.shares_transactions_with(&MemoryStore::default()),
        Ok(()),
        "any memory store will do"
    );
    let got = s.leased(3).await;
    let (acked, retried, deferred) = (&got[0], &got[1], &got[2]);
    let now = s.clock.now();
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(
        s.hold(&mut tx, &[acked, retried, deferred]).await,
        [true, true, true]
    );
    let retry_at = now + Duration::from_secs(60);
    let defer_until = now + Duration::from_secs(120);
    s.queue
        .settle(
            &mut tx,
            &[
                (acked, Settlement::Ack),
                (retried, Settlement::RetryAt(retry_at)),
                (deferred, Settlement::Defer(defer_until)),
            ],
        )
        .await
        .expect("settle");
    assert_eq!(
        s.depth().await,
        Depth::new(0, 0, 3),
        "settlements wait for the commit"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        s.depth().await,
        Depth::new(0, 2, 0),
        "the ack is gone, the others wait"
    );

    s.clock.advance(Duration::from_secs(60));
    let again = s.receive().await;
    assert_eq!(again.len(), 1, "the retry is visible at its time, alone");
    assert_eq!(again[0].message_id, retried.message_id);
    assert_eq!(again[0].attempt, 2, "a retry spends the attempt");
    assert!(!again[0].expired, "a retry is not a lease that ran out");
    s.queue.ack(&again[0].lease).await.expect("ack");

    s.clock.advance(Duration::from_secs(60));
    let later = s.receive().await;
    assert_eq!(later.len(), 1, "the deferral is visible at its time");
    assert_eq!(later[0].message_id, deferred.message_id);
    assert_eq!(later[0].attempt, 1, "a deferral gives its attempt back");
    assert_eq!(
        s.depth().await,
        Depth::new(0, 0, 1),
        "the message acked in the transaction never came back"
    );
}

#[tokio::test]
async fn a_retry_ready_at_commit_wakes_waiters_and_a_later_one_does_not() {
    let s = setup();
    let got = s.leased(2).await;
    // The publishes left a wake-up for the next waiter: spend it.
    s.queue.wait_for_work(&s.name).await;

    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    let later = s.clock.now() + Duration::from_secs(60);
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::RetryAt(later))])
        .await
        .expect("settle");
    tx.commit().await.expect("commit");
    let mut wait = pin!(s.queue.wait_for_work(&s.name));
    assert!(
        poll_once(wait.as_mut()).is_pending(),
        "a retry due later wakes nobody"
    );

    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[1]]).await, [true]);
    let now = s.clock.now();
    s.queue
        .settle(&mut tx, &[(&got[1], Settlement::RetryAt(now))])
        .await
        .expect("settle");
    assert!(
        poll_once(wait.as_mut()).is_pending(),
        "nothing is ready before the commit"
    );
    tx.commit().await.expect("commit");
    assert!(
        poll_once(wait.as_mut()).is_ready(),
        "a retry ready at commit wakes the waiter"
    );
}

#[tokio::test]
async fn a_rollback_gives_held_messages_back_leased_until_their_expiry() {
    let s = setup();
    let got = s.leased(2).await;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0], &got[1]]).await, [true, true]);
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect("settle");
    tx.rollback().await.expect("rollback");

    assert_eq!(
        s.depth().await,
        Depth::new(0, 0, 2),
        "even the acked one is back, leased"
    );
    assert!(
        s.receive().await.is_empty(),
        "nobody gets them while leased"
    );
    s.clock.advance(LEASE);
    let again = s.receive().await;
    assert_eq!(again.len(), 2, "both come back after their leases");
    assert!(
        again.iter().all(|d| d.expired && d.attempt == 2),
        "as deliveries after a lease that ran out: {again:?}"
    );
}

#[tokio::test]
async fn a_dropped_transaction_gives_its_lease_back_to_the_settle_port() {
    let s = setup();
    let got = s.leased(1).await;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    assert!(s.queue.ack(&got[0].lease).await.is_err(), "held");
    drop(tx);
    assert_eq!(s.store.open_transactions(), 0);
    s.queue
        .ack(&got[0].lease)
        .await
        .expect("the lease holds again once the transaction is gone");
    assert_eq!(s.depth().await, Depth::new(0, 0, 0));
}

#[tokio::test]
async fn a_held_message_is_out_of_reach_even_past_its_lease() {
    let s = setup();
    let got = s.leased(1).await;
    let lease = &got[0].lease;
    // The publish left a wake-up for the next waiter: spend it.
    s.queue.wait_for_work(&s.name).await;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    s.clock.advance(LEASE * 3);

    assert!(
        s.receive().await.is_empty(),
        "no other receiver gets a held message, even past its lease"
    );
    assert_eq!(
        s.depth().await,
        Depth::new(0, 0, 1),
        "held is in flight, expired lease or not"
    );
    let lost = |r: Result<(), QueueError>| matches!(r, Err(QueueError::LeaseLost { .. }));
    let now = s.clock.now();
    assert!(lost(s.queue.ack(lease).await), "ack refused");
    assert!(lost(s.queue.retry_at(lease, now).await), "retry refused");
    assert!(lost(s.queue.defer(lease, now).await), "defer refused");
    assert!(
        matches!(
            s.queue.extend(lease, LEASE).await,
            Err(QueueError::LeaseLost { .. })
        ),
        "extend refused"
    );

    let mut wait = pin!(s.queue.wait_for_work(&s.name));
    assert!(poll_once(wait.as_mut()).is_pending(), "nothing is ready");
    tx.rollback().await.expect("rollback");
    assert!(
        poll_once(wait.as_mut()).is_ready(),
        "given back with its lease run out, it is ready: waiters wake"
    );
    let again = s.receive().await;
    assert_eq!(again.len(), 1, "back at once: its lease ran out meanwhile");
    assert!(again[0].expired);
}

#[tokio::test]
async fn a_held_message_counts_against_its_tenants_limit() {
    let s = setup();
    let limit = NonZeroU32::new(1).expect("not zero");
    s.queue
        .share_by_tenant(&s.name, TenantFairness::round_robin().limit(limit))
        .expect("fair");
    for i in 0..2 {
        s.queue
            .publish(
                &s.name,
                &fixtures::envelope(1, i),
                PublishOptions::default(),
            )
            .await
            .expect("publish");
    }
    let got = s.receive().await;
    assert_eq!(got.len(), 1, "one in flight per tenant");
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    s.clock.advance(LEASE * 2);
    assert!(
        s.receive().await.is_empty(),
        "the held one is still in flight: the tenant is at its limit"
    );
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect("settle");
    tx.commit().await.expect("commit");
    assert_eq!(s.receive().await.len(), 1, "the limit frees at commit");
}

#[tokio::test]
async fn a_stale_a_spent_a_foreign_or_a_taken_lease_is_not_held() {
    let s = setup();
    let got = s.leased(3).await;
    let (stale, spent, taken) = (&got[0], &got[1], &got[2]);
    s.clock.advance(LEASE);
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(
        s.hold(&mut tx, &[stale]).await,
        [false],
        "a lease that ran out does not hold"
    );
    let fresh = s.receive().await;
    let redelivered = fresh
        .iter()
        .find(|d| d.message_id == stale.message_id)
        .expect("redelivered");
    let spent_again = fresh
        .iter()
        .find(|d| d.message_id == spent.message_id)
        .expect("redelivered");
    s.queue.ack(&spent_again.lease).await.expect("ack");
    let taken_again = fresh
        .iter()
        .find(|d| d.message_id == taken.message_id)
        .expect("redelivered");
    let mut other = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut other, &[taken_again]).await, [true]);

    let expiry = s.clock.now() + LEASE;
    let garbage = Lease::new(s.name.clone(), "not-a-token", expiry);
    let elsewhere = Lease::new(
        "billing.other".parse().expect("a queue name"),
        redelivered.lease.token(),
        expiry,
    );
    let held = s
        .queue
        .hold(
            &mut tx,
            &[
                &stale.lease,
                &spent_again.lease,
                &taken_again.lease,
                &garbage,
                &elsewhere,
                &redelivered.lease,
            ],
        )
        .await
        .expect("hold");
    assert_eq!(
        held,
        [false, false, false, false, false, true],
        "an earlier delivery's lease, an acked one's, one held by another transaction, a \
         token not this queue's, a lease naming another queue: only the latest lease holds"
    );
    other.rollback().await.expect("rollback");
    tx.rollback().await.expect("rollback");
}

#[tokio::test]
async fn holding_a_lease_twice_takes_its_message_once() {
    let s = setup();
    let got = s.leased(1).await;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0], &got[0]]).await, [true, true]);
    assert_eq!(
        s.hold(&mut tx, &[&got[0]]).await,
        [true],
        "this transaction holds it"
    );
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect("one settlement settles it");
    tx.commit().await.expect("nothing left unsettled");
    assert_eq!(s.depth().await, Depth::new(0, 0, 0));
}

#[tokio::test]
async fn a_commit_with_a_message_left_unsettled_is_refused_and_rolled_back() {
    let s = setup();
    let got = s.leased(3).await;
    let consumer = "billing.invoicer".parse().expect("a consumer");
    let job = fixtures::envelope(1, 99).job_id;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(
        s.hold(&mut tx, &[&got[0], &got[1], &got[2]]).await,
        [true, true, true]
    );
    tx.claim(job, &consumer, s.clock.now())
        .await
        .expect("claim");
    tx.record_effect("invoice 99");
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect("settle");

    let refused = tx.commit().await.expect_err("two are unsettled");
    assert!(
        refused.to_string().contains("2 queue messages"),
        "names how many: {refused}"
    );
    assert_eq!(s.store.open_transactions(), 0, "rolled back");
    assert!(
        !s.store
            .is_processed(job, &consumer)
            .await
            .expect("is_processed"),
        "the claim did not commit"
    );
    assert!(s.store.effects().is_empty(), "the effect did not commit");
    assert_eq!(
        s.depth().await,
        Depth::new(0, 0, 3),
        "the settled one is not acked: all are back, leased"
    );
}

#[tokio::test]
async fn settling_what_the_transaction_did_not_take_fails_and_records_nothing() {
    let s = setup();
    let got = s.leased(2).await;
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    let refused = s
        .queue
        .settle(
            &mut tx,
            &[(&got[0], Settlement::Ack), (&got[1], Settlement::Ack)],
        )
        .await
        .expect_err("the second was not taken");
    assert!(
        refused.to_string().contains("did not take"),
        "says why: {refused}"
    );
    assert!(
        tx.commit().await.is_err(),
        "the first settlement was not recorded either: it is still unsettled"
    );

    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[&got[0]]).await, [true]);
    s.queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect("settle");
    let twice = s
        .queue
        .settle(&mut tx, &[(&got[0], Settlement::Ack)])
        .await
        .expect_err("settled already");
    assert!(twice.to_string().contains("twice"), "says why: {twice}");
}

#[tokio::test]
async fn an_undo_takes_back_the_holds_and_settlements_since_the_checkpoint() {
    let s = setup();
    let got = s.leased(2).await;
    let (before, after) = (&got[0], &got[1]);
    let mut tx = s.store.begin().await.expect("begin");
    assert_eq!(s.hold(&mut tx, &[before]).await, [true]);
    tx.checkpoint().await.expect("checkpoint");
    assert_eq!(s.hold(&mut tx, &[after]).await, [true]);
    s.queue
        .settle(
            &mut tx,
            &[(before, Settlement::Ack), (after, Settlement::Ack)],
        )
        .await
        .expect("settle");
    tx.undo().await.expect("undo");

    s.queue
        .retry_at(&after.lease, s.clock.now())
        .await
        .expect("the hold undone, its lease is the settle port's again");
    assert!(
        s.queue.ack(&before.lease).await.is_err(),
        "the hold before the checkpoint stays"
    );
    s.queue
        .settle(&mut tx, &[(before, Settlement::Ack)])
        .await
        .expect("its settlement was undone: it settles again");
    tx.commit().await.expect("commit");
    let again = s.receive().await;
    assert_eq!(again.len(), 1, "only the retried one is left");
    assert_eq!(again[0].message_id, after.message_id);
}

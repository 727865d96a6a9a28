//! A marketing backlog and a transactional burst on one channel: marketing waits while the
//! transactional queue is deep, and every message of both rails is sent exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_memory::MemoryQueue;
use jobs_core::{
    Envelope, JobId, ManualClock, PublishOptions, PullPort, QueueDepth, QueueName, QueuePort,
    SettlePort,
};
use jobs_notifications::{PriorityGate, TransactionalFirst};
use jobs_testkit::fixtures;

const LEASE: Duration = Duration::from_secs(60);

/// Receives up to `max` through `pull` and "sends" them (acks them through `settle`), returning
/// the job ids sent.
async fn send(
    pull: &dyn PullPort,
    settle: &dyn SettlePort,
    queue: &QueueName,
    max: usize,
) -> Vec<JobId> {
    let mut sent = vec![];
    for delivery in pull.receive(queue, max, LEASE).await.expect("receive") {
        sent.push(Envelope::decode(&delivery.payload).expect("valid").job_id);
        settle.ack(&delivery.lease).await.expect("ack");
    }
    sent
}

/// The email rails on one memory queue, and the gate over its marketing rail (pausing above
/// 100 transactional jobs, resuming at 10).
fn gated() -> (
    MemoryQueue,
    QueueName,
    QueueName,
    TransactionalFirst<MemoryQueue>,
) {
    let queue = MemoryQueue::new(Arc::new(ManualClock::default()));
    let transactional = jobs_notifications::transactional("email").expect("valid");
    let marketing = jobs_notifications::marketing("email").expect("valid");
    let layered = TransactionalFirst::new(
        Arc::new(queue.clone()),
        Arc::new(queue.clone()),
        transactional.clone(),
        PriorityGate::new(100, 10).expect("hysteresis"),
    );
    (queue, transactional, marketing, layered)
}

#[tokio::test]
async fn marketing_waits_while_transactional_is_deep_and_nothing_is_lost() {
    let (queue, transactional, marketing, layered) = gated();
    let mut published: HashSet<JobId> = HashSet::new();
    let publish = async |name: &QueueName, n: u64| {
        let envelope = fixtures::envelope_with(1, "notif.email", serde_json::json!({ "n": n }));
        queue
            .publish(name, &envelope, PublishOptions::default())
            .await
            .expect("publish");
        envelope.job_id
    };
    for n in 0..3_000 {
        published.insert(publish(&marketing, n).await);
    }

    let mut sent: HashMap<JobId, u32> = HashMap::new();
    let record = |ids: Vec<JobId>, sent: &mut HashMap<JobId, u32>| {
        let count = ids.len();
        for id in ids {
            *sent.entry(id).or_default() += 1;
        }
        count
    };
    // Marketing flows while transactional is quiet.
    let early = send(&layered, &queue, &marketing, 50).await;
    assert_eq!(record(early, &mut sent), 50);

    // A transactional burst past the threshold.
    for n in 0..300 {
        published.insert(publish(&transactional, 10_000 + n).await);
    }
    assert!(
        send(&layered, &queue, &marketing, 50).await.is_empty() && layered.paused(),
        "the burst pauses marketing"
    );

    let mut marketing_while_deep = 0;
    loop {
        let depth = queue.depth(&transactional).await.expect("depth").pending();
        let got = send(&layered, &queue, &marketing, 50).await;
        if depth > 10 && !got.is_empty() {
            marketing_while_deep += got.len();
        }
        let moved = record(got, &mut sent);
        let urgent = send(&queue, &queue, &transactional, 8).await;
        let moved = moved + record(urgent, &mut sent);
        if moved == 0 {
            break;
        }
    }
    assert_eq!(
        marketing_while_deep, 0,
        "marketing sends started while the transactional queue was deep"
    );
    assert_eq!(
        sent.len(),
        published.len(),
        "every message of both rails was sent"
    );
    assert!(sent.values().all(|n| *n == 1), "a message was sent twice");
    assert!(
        !layered.paused(),
        "marketing resumed once transactional drained"
    );
}

/// The gate passes a fairness request on to the marketing queue's transport, so a fair
/// marketing worker behind it serves tenants in turn: one tenant's blast does not hold back
/// another's newsletter.
#[tokio::test]
async fn the_gate_forwards_fairness_to_the_transport() {
    let (queue, _, marketing, layered) = gated();
    layered
        .share_by_tenant(&marketing, jobs_core::TenantFairness::round_robin())
        .expect("the memory queue shares its queues out");
    for (tenant, n) in [(1, 0), (1, 1), (1, 2), (1, 3), (2, 4)] {
        let envelope =
            fixtures::envelope_with(tenant, "notif.email", serde_json::json!({ "n": n }));
        queue
            .publish(&marketing, &envelope, PublishOptions::default())
            .await
            .expect("publish");
    }
    let first_two: HashSet<_> = layered
        .receive(&marketing, 2, LEASE)
        .await
        .expect("receive")
        .iter()
        .map(|d| Envelope::decode(&d.payload).expect("valid").tenant_id)
        .collect();
    assert_eq!(first_two.len(), 2, "the second tenant is served in turn");
}

/// The gate waits on the marketing queue's own hint: nothing to fetch, nothing wakes it.
#[tokio::test(start_paused = true)]
async fn the_gate_waits_for_marketing_work_like_its_queue() {
    let (queue, _, marketing, layered) = gated();
    let idle = tokio::time::timeout(Duration::from_secs(3600), layered.wait_for_work(&marketing));
    assert!(idle.await.is_err(), "nothing published: the wait lasts");
    let envelope = fixtures::envelope_with(1, "notif.email", serde_json::json!({ "n": 1 }));
    let waiting = layered.wait_for_work(&marketing);
    queue
        .publish(&marketing, &envelope, PublishOptions::default())
        .await
        .expect("publish");
    tokio::time::timeout(Duration::from_secs(3600), waiting)
        .await
        .expect("a publish wakes it");
}

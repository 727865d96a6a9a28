//! The memory queue against the queue contract, and under concurrent load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobs_adapter_memory::MemoryQueue;
use jobs_core::{
    Envelope, JobId, ManualClock, PublishOptions, PullPort, QueueName, QueuePort, SettlePort,
    TenantFairness,
};
use jobs_testkit::contract::queue::{self, QueueUnderTest};
use jobs_testkit::fixtures;

#[tokio::test]
async fn memory_queue_passes_the_queue_contract() {
    queue::run(|| async {
        let clock = ManualClock::default();
        QueueUnderTest::of(MemoryQueue::new(Arc::new(clock.clone())), clock)
    })
    .await;
}

#[tokio::test]
async fn memory_queue_passes_the_queue_contract_when_fair() {
    queue::run_fair(TenantFairness::round_robin(), || async {
        let clock = ManualClock::default();
        QueueUnderTest::of(MemoryQueue::new(Arc::new(clock.clone())), clock)
    })
    .await;
}

#[tokio::test]
async fn dedup_keys_are_forgotten_after_the_window() {
    let clock = ManualClock::default();
    let memory =
        MemoryQueue::new(Arc::new(clock.clone())).with_dedup_window(Duration::from_secs(600));
    let q: QueueName = "dedup.window".parse().expect("valid");
    let envelope = fixtures::envelope(1, 1);
    let first = memory
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .expect("publish");
    clock.advance(Duration::from_secs(599));
    let within = memory
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .expect("publish");
    assert!(within.duplicate);
    assert_eq!(
        within.message_id, first.message_id,
        "a duplicate names the original"
    );
    clock.advance(Duration::from_secs(2));
    let after = memory
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .expect("publish");
    assert!(
        !after.duplicate,
        "the key must be forgotten after the window"
    );
}

#[tokio::test]
async fn raw_bytes_arrive_intact() {
    let memory = MemoryQueue::new(Arc::new(ManualClock::default()));
    let q: QueueName = "poison.bytes".parse().expect("valid");
    let poison = vec![0xff, 0x00, b'{', b'"'];
    memory.publish_bytes(&q, poison.clone(), &PublishOptions::default());
    let got = memory
        .receive(&q, 10, Duration::from_secs(30))
        .await
        .expect("receive");
    assert_eq!(got[0].payload, poison);
}

/// Eight producers and eight consumers on a multi-threaded runtime; consumers sometimes give a
/// message back for another try. Every message must be acked exactly once and none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_and_consumers_lose_and_double_nothing() {
    const PRODUCERS: u64 = 8;
    const PER_PRODUCER: u64 = 500;
    let memory = MemoryQueue::default();
    let q: QueueName = "load.test".parse().expect("valid");
    let acked: Arc<Mutex<HashMap<JobId, u32>>> = Arc::default();
    // Consumers stop once the producers are done and a poll finds the queue empty: stopping on
    // idleness alone would race slow producers on a loaded machine.
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(true));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (memory, q) = (memory.clone(), q.clone());
            tokio::spawn(async move {
                let mut ids = vec![];
                for n in 0..PER_PRODUCER {
                    let envelope = fixtures::envelope(u32::try_from(p).expect("small"), n);
                    memory
                        .publish(&q, &envelope, PublishOptions::default())
                        .await
                        .expect("publish");
                    ids.push(envelope.job_id);
                    tokio::task::yield_now().await;
                }
                ids
            })
        })
        .collect();
    let consumers: Vec<_> = (0..8)
        .map(|c| {
            let (memory, q, acked) = (memory.clone(), q.clone(), acked.clone());
            let producing = producing.clone();
            tokio::spawn(async move {
                let mut turn = 0u64;
                loop {
                    let done = !producing.load(std::sync::atomic::Ordering::SeqCst);
                    let batch = memory
                        .receive(&q, 7, Duration::from_secs(60))
                        .await
                        .expect("receive");
                    if batch.is_empty() {
                        if done {
                            break;
                        }
                        tokio::task::yield_now().await;
                        continue;
                    }
                    for delivery in batch {
                        turn += 1;
                        if (turn + c).is_multiple_of(5) {
                            let now = std::time::SystemTime::now();
                            memory.retry_at(&delivery.lease, now).await.expect("retry");
                            continue;
                        }
                        let id = Envelope::decode(&delivery.payload).expect("valid").job_id;
                        memory.ack(&delivery.lease).await.expect("ack while leased");
                        *acked.lock().expect("not poisoned").entry(id).or_default() += 1;
                    }
                }
            })
        })
        .collect();

    let mut published = vec![];
    for producer in producers {
        published.extend(producer.await.expect("producer"));
    }
    producing.store(false, std::sync::atomic::Ordering::SeqCst);
    for consumer in consumers {
        consumer.await.expect("consumer");
    }
    let acked = acked.lock().expect("not poisoned");
    assert_eq!(
        published.len(),
        usize::try_from(PRODUCERS * PER_PRODUCER).expect("fits")
    );
    for id in &published {
        assert_eq!(
            acked.get(id),
            Some(&1),
            "{id} acked {:?} times",
            acked.get(id)
        );
    }
    assert_eq!(
        acked.len(),
        published.len(),
        "acked something never published"
    );
}

#[tokio::test]
async fn memory_store_passes_the_store_contract() {
    jobs_testkit::contract::store::run(|| async { jobs_adapter_memory::MemoryStore::default() })
        .await;
}

#[tokio::test]
async fn memory_store_passes_the_bulk_runs_contract() {
    jobs_testkit::contract::store::run_bulk_runs(|| async {
        jobs_adapter_memory::MemoryStore::default()
    })
    .await;
}

/// Whether `wait` is resolved without waiting: polled once, at a deadline already past.
async fn resolved(wait: impl std::future::Future<Output = ()>) -> bool {
    tokio::time::timeout(Duration::ZERO, wait).await.is_ok()
}

#[tokio::test]
async fn wait_for_work_wakes_on_a_ready_publish_to_its_queue_only() {
    let clock = ManualClock::default();
    let memory = MemoryQueue::new(Arc::new(clock.clone()));
    let (a, b): (QueueName, QueueName) = (
        "wake.a".parse().expect("valid"),
        "wake.b".parse().expect("valid"),
    );
    assert!(
        !resolved(memory.wait_for_work(&a)).await,
        "nothing published yet"
    );

    // Two workers already waiting on `a` are both woken.
    let mut first = std::pin::pin!(memory.wait_for_work(&a));
    let mut second = std::pin::pin!(memory.wait_for_work(&a));
    assert!(!resolved(&mut first).await && !resolved(&mut second).await);
    memory
        .publish(&b, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .expect("publish");
    memory
        .publish(
            &a,
            &fixtures::envelope(1, 2),
            PublishOptions::default().delay(Duration::from_secs(60)),
        )
        .await
        .expect("publish");
    assert!(
        !resolved(&mut first).await,
        "a publish to another queue, or a delayed one, does not wake"
    );
    memory
        .publish(&a, &fixtures::envelope(1, 3), PublishOptions::default())
        .await
        .expect("publish");
    assert!(resolved(&mut first).await && resolved(&mut second).await);

    // A publish made while nobody waits is kept for the next wait, once.
    memory
        .publish(&b, &fixtures::envelope(1, 4), PublishOptions::default())
        .await
        .expect("publish");
    let _ = resolved(memory.wait_for_work(&a)).await; // the spare wake-up of the last publish
    assert!(
        resolved(memory.wait_for_work(&b)).await,
        "the earlier publish to `b` wakes"
    );
    assert!(!resolved(memory.wait_for_work(&b)).await, "and only once");
}

/// Fair dequeue across tenants, on random mixes of backlogs, weights, limits, holds and
/// retries (`PROPTEST_CASES` raises the count).
#[test]
fn memory_queue_keeps_the_fairness_contract() {
    jobs_testkit::contract::fairness::check(jobs_testkit::model::cases(128), || async {
        let clock = ManualClock::default();
        let memory = MemoryQueue::new(Arc::new(clock.clone()));
        jobs_testkit::contract::fairness::FairUnderTest {
            queue: QueueUnderTest::of(memory.clone(), clock),
            weights: Arc::new(memory),
        }
    });
}

//! `CountedQueue` against a real Redis: the depth follows publishes and acks, counts a job once
//! however often it is published, corrects a lost decrement after the horizon, and never fails
//! a publish or an ack because Redis is away.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use common::{unique_prefix, url};
use jobs_adapter_redis::CountedQueue;
use jobs_adapter_redis::redis;
use jobs_core::{
    Delivery, Depth, Envelope, Lease, PublishOptions, PullPort, QueueDepth, QueueError, QueueName,
    QueuePort, Receipt, SettlePort,
};
use jobs_testkit::fixtures;

/// The smallest transport: a list of payloads, every receive leasing from the front.
#[derive(Default)]
struct Line {
    ready: Mutex<VecDeque<Vec<u8>>>,
    leased: Mutex<u64>,
}

#[async_trait]
impl QueuePort for Line {
    async fn publish(
        &self,
        _: &QueueName,
        envelope: &Envelope,
        _: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        self.ready
            .lock()
            .unwrap()
            .push_back(envelope.to_json_bytes()?);
        Ok(Receipt::queued(None))
    }
}

#[async_trait]
impl PullPort for Line {
    async fn receive(
        &self,
        q: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let mut ready = self.ready.lock().unwrap();
        let mut leased = self.leased.lock().unwrap();
        let n = max.min(ready.len());
        Ok(ready
            .drain(..n)
            .map(|payload| {
                *leased += 1;
                let lease = Lease::new(
                    q.clone(),
                    format!("lease-{leased}"),
                    SystemTime::now() + lease,
                );
                Delivery::new(payload, 1, None, lease)
            })
            .collect())
    }
}

#[async_trait]
impl SettlePort for Line {
    async fn ack(&self, _: &Lease) -> Result<(), QueueError> {
        Ok(())
    }

    async fn retry_at(&self, _: &Lease, _: SystemTime) -> Result<(), QueueError> {
        Ok(())
    }

    async fn defer(&self, _: &Lease, _: SystemTime) -> Result<(), QueueError> {
        Ok(())
    }

    async fn extend(&self, lease: &Lease, _: Duration) -> Result<Lease, QueueError> {
        Ok(lease.clone())
    }
}

fn counted(redis_url: &str, prefix: &str, horizon: Duration) -> CountedQueue {
    let line = Arc::new(Line::default());
    let client = redis::Client::open(redis_url).unwrap();
    CountedQueue::new(line.clone(), line, client, prefix, horizon)
}

async fn cleanup(counted: &CountedQueue, q: &QueueName) {
    let mut admin = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("DEL")
        .arg(counted.redis_key(q))
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
}

fn queue() -> QueueName {
    "notif.email.transactional".parse().unwrap()
}

#[tokio::test]
async fn depth_follows_publishes_and_acks_and_counts_a_job_once() {
    let q = queue();
    let counted = counted(&url(), &unique_prefix("depth"), Duration::from_secs(3600));
    let envelopes: Vec<_> = (0..3).map(|n| fixtures::envelope(1, n)).collect();
    for envelope in &envelopes {
        counted
            .publish(&q, envelope, PublishOptions::default())
            .await
            .unwrap();
    }
    // A duplicate publish of the same job is the same member.
    counted
        .publish(&q, &envelopes[0], PublishOptions::default())
        .await
        .unwrap();
    counted
        .publish(
            &q,
            &fixtures::envelope(1, 9),
            PublishOptions::default().delay(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    assert_eq!(
        counted.depth(&q).await.unwrap(),
        Depth::in_flight_as_ready(3, 1)
    );

    let got = counted
        .receive(&q, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        counted.depth(&q).await.unwrap().ready,
        3,
        "leased still counts"
    );
    for delivery in &got {
        counted.ack(&delivery.lease).await.unwrap();
    }
    let after = counted.depth(&q).await.unwrap();
    assert_eq!((after.ready, after.delayed), (1, 1), "acks uncount");
    cleanup(&counted, &q).await;
}

#[tokio::test]
async fn a_lost_decrement_corrects_itself_after_the_horizon() {
    let q = queue();
    let counted = counted(
        &url(),
        &unique_prefix("depth-horizon"),
        Duration::from_millis(300),
    );
    counted
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    // Received, then the worker dies: no ack ever comes.
    let _lost = counted
        .receive(&q, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(counted.depth(&q).await.unwrap().ready, 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        counted.depth(&q).await.unwrap().ready,
        0,
        "dropped after the horizon"
    );
    cleanup(&counted, &q).await;
}

#[tokio::test]
async fn the_count_expires_with_its_last_member() {
    let q = queue();
    let counted = counted(&url(), &unique_prefix("depth-ttl"), Duration::from_secs(5));
    counted
        .publish(
            &q,
            &fixtures::envelope(1, 1),
            PublishOptions::default().delay(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let mut admin = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(counted.redis_key(&q))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        (60_000..=65_000).contains(&ttl),
        "delay + horizon, got {ttl} ms"
    );
    cleanup(&counted, &q).await;
}

#[tokio::test]
async fn redis_away_costs_the_count_not_the_publish_or_the_ack() {
    let q = queue();
    // Nothing listens on port 1.
    let counted = counted("redis://127.0.0.1:1", "away", Duration::from_secs(60));
    counted
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .expect("the publish goes through");
    let got = counted
        .receive(&q, 1, Duration::from_secs(30))
        .await
        .unwrap();
    counted
        .ack(&got[0].lease)
        .await
        .expect("the ack goes through");
    let err = counted.depth(&q).await.unwrap_err();
    assert!(err.to_string().contains("Redis"), "{err}");
}

#[tokio::test]
async fn leases_never_settled_are_forgotten_once_they_expire() {
    let q = queue();
    let clock = jobs_core::ManualClock::default();
    clock.set(SystemTime::now());
    let counted = counted(&url(), &unique_prefix("leases"), Duration::from_secs(3600))
        .with_clock(Arc::new(clock.clone()));
    for n in 0..5 {
        counted
            .publish(&q, &fixtures::envelope(1, n), PublishOptions::default())
            .await
            .unwrap();
    }
    // Leased and never settled here: the worker died, or its acks failed.
    let lost = counted
        .receive(&q, 3, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!((lost.len(), counted.tracked_leases()), (3, 3));
    clock.advance(Duration::from_secs(60));
    let next = counted
        .receive(&q, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(next.len(), 2);
    assert_eq!(
        counted.tracked_leases(),
        2,
        "the expired leases are gone, the live ones kept"
    );
    cleanup(&counted, &q).await;
}

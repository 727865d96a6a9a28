//! Against Vercel's emulator: the queue contract, and the wire details it checks for real.

use std::sync::Arc;
use std::time::Duration;

use jobs_adapter_vercel_queues::push::{PushReply, SkipReason};
use jobs_adapter_vercel_queues::{VercelQueues, topic_of};
use jobs_core::{
    PublishOptions, PullPort, QueueError, QueueName, QueuePort, SettlePort, SystemClock,
};
use jobs_testkit::contract::queue::{self, Dedup, QueueUnderTest};
use jobs_testkit::emulators::VercelQueuesEmulator;
use jobs_testkit::{TimeTravel, fixtures};
use reqwest::header::HeaderMap;

use crate::adapter;

async fn on_emulator(group: &str) -> (VercelQueues, Arc<VercelQueuesEmulator>) {
    let emulator = VercelQueuesEmulator::start().await;
    let clock = Arc::new(emulator.clock().expect("the wrapper runs a manual clock"));
    (
        adapter(emulator.base_url(), group, clock),
        Arc::new(emulator),
    )
}

fn queue(name: &str) -> QueueName {
    name.parse().unwrap()
}

#[tokio::test]
async fn passes_the_queue_contract_on_vercels_emulator() {
    // Vercel reports no duplicates on publish and keys its dedup on key and payload.
    let dedup = Dedup {
        reports_duplicates: false,
        by_key_alone: false,
    };
    queue::run_with(dedup, || async {
        let (vercel, emulator) = on_emulator("contract").await;
        QueueUnderTest {
            publisher: Arc::new(vercel.clone()),
            consumer: Arc::new(vercel),
            depth: None,
            time: emulator,
        }
    })
    .await;
}

#[tokio::test]
async fn runs_on_the_devserver_as_vercel_ships_it() {
    let emulator = VercelQueuesEmulator::start_devserver().await;
    let vercel = adapter(emulator.base_url(), "workers", Arc::new(SystemClock));
    let q = queue("jobs.devserver");
    let envelope = fixtures::envelope(1, 1);
    let receipt = vercel
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .unwrap();
    assert!(
        receipt.message_id.is_some(),
        "the emulator answers 201 with an id"
    );
    let got = vercel
        .receive(&q, 10, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, envelope.to_json_bytes().unwrap());
    assert_eq!(got[0].attempt, 1);
    // A lease of 1 s, for real: the message comes back with the delivery count as attempt.
    let extended = vercel
        .extend(&got[0].lease, Duration::from_secs(1))
        .await
        .unwrap();
    emulator.advance(Duration::from_millis(2100)).await;
    let again = vercel
        .receive(&q, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "redelivered after the lease expired");
    assert_eq!(again[0].attempt, 2);
    let stale = vercel.ack(&extended).await.unwrap_err();
    assert!(matches!(stale, QueueError::LeaseLost { .. }), "{stale}");
    vercel.ack(&again[0].lease).await.unwrap();
    assert!(
        vercel
            .receive(&q, 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn consumer_groups_each_get_every_message() {
    let emulator = VercelQueuesEmulator::start().await;
    let clock = Arc::new(emulator.clock().unwrap());
    let billing = adapter(emulator.base_url(), "billing", clock.clone());
    let audit = adapter(emulator.base_url(), "audit", clock);
    let q = queue("jobs.fanout");
    billing
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    for group in [&billing, &audit] {
        let got = group
            .receive(&q, 10, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        group.ack(&got[0].lease).await.unwrap();
    }
}

#[tokio::test]
async fn refuses_delays_beyond_retention_before_sending() {
    let (vercel, emulator) = on_emulator("workers").await;
    let q = queue("jobs.far");
    let far = emulator.now() + Duration::from_secs(25 * 3600);
    let err = vercel
        .schedule(&q, &fixtures::envelope(1, 1), far)
        .await
        .unwrap_err();
    let QueueError::Rejected { reason, .. } = &err else {
        panic!("expected a rejection, got {err}");
    };
    assert!(reason.contains("retention"), "{reason}");
    // Within the retention it is accepted and held back until due.
    let near = emulator.now() + Duration::from_secs(3600);
    vercel
        .schedule(&q, &fixtures::envelope(1, 1), near)
        .await
        .unwrap();
    assert!(
        vercel
            .receive(&q, 1, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );
    emulator.advance(Duration::from_secs(3600)).await;
    assert_eq!(
        vercel
            .receive(&q, 1, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn retries_later_than_one_lease_requeue_a_copy_that_keeps_the_attempt_count() {
    let (vercel, emulator) = on_emulator("workers").await;
    let q = queue("jobs.later");
    vercel
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    let first = vercel
        .receive(&q, 1, Duration::from_secs(30))
        .await
        .unwrap();
    // Two hours is beyond what a visibility change can reach (1 h).
    let at = emulator.now() + Duration::from_secs(2 * 3600);
    vercel.retry_at(&first[0].lease, at).await.unwrap();
    emulator.advance(Duration::from_secs(3600 + 60)).await;
    assert!(
        vercel
            .receive(&q, 1, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );
    emulator.advance(Duration::from_secs(3600)).await;
    let second = vercel
        .receive(&q, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "exactly one copy comes back");
    assert_eq!(second[0].attempt, 2, "the copy counts the attempt spent");
    assert_eq!(second[0].payload, first[0].payload);
    // Deferring the copy keeps its count too.
    vercel
        .defer(&second[0].lease, emulator.now() + Duration::from_secs(5))
        .await
        .unwrap();
    emulator.advance(Duration::from_secs(6)).await;
    let third = vercel
        .receive(&q, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].attempt, 2);
}

#[tokio::test]
async fn topics_are_the_dotted_names_with_dashes() {
    let (vercel, emulator) = on_emulator("workers").await;
    let q = queue("notif.email.transactional");
    vercel
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    // Another client of the same emulator sees the message under the mapped topic.
    let other = crate::adapter(
        emulator.base_url(),
        "workers",
        Arc::new(emulator.clock().unwrap()),
    );
    let by_topic = jobs_adapter_vercel_queues::queue_of_topic(&topic_of(&q)).unwrap();
    assert_eq!(
        other
            .receive(&by_topic, 1, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        1
    );
}

fn callback(q: &QueueName, group: &str, message_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("ce-type", "com.vercel.queue.v2beta".parse().unwrap());
    headers.insert("ce-vqsqueuename", topic_of(q).parse().unwrap());
    headers.insert("ce-vqsconsumergroup", group.parse().unwrap());
    headers.insert("ce-vqsmessageid", message_id.parse().unwrap());
    headers.insert("ce-vqsregion", "iad1".parse().unwrap());
    headers
}

#[tokio::test]
async fn a_callback_without_payload_receives_by_id_and_skips_what_is_done() {
    let (vercel, _emulator) = on_emulator("workers").await;
    let q = queue("jobs.pushed");
    let envelope = fixtures::envelope(1, 1);
    let receipt = vercel
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .unwrap();
    let id = receipt.message_id.unwrap();
    let headers = callback(&q, "workers", &id);
    let seen = std::sync::Mutex::new(None);
    let reply = vercel
        .handle_push(&headers, vec![], |delivery| {
            let vercel = vercel.clone();
            let seen = &seen;
            async move {
                *seen.lock().unwrap() = Some((delivery.payload.clone(), delivery.attempt));
                vercel.ack(&delivery.lease).await.is_ok()
            }
        })
        .await;
    assert_eq!(reply, PushReply::Success);
    assert_eq!(
        seen.into_inner().unwrap(),
        Some((envelope.to_json_bytes().unwrap(), 1))
    );
    // Vercel calling back again for an acked message: 410, answered as skipped.
    let again = vercel
        .handle_push(&headers, vec![], |_| async { panic!("must not run again") })
        .await;
    assert_eq!(
        again,
        PushReply::Skipped {
            reason: SkipReason::AlreadyProcessed,
            message_id: id,
        }
    );
    let bad = vercel
        .handle_push(&HeaderMap::new(), vec![], |_| async { true })
        .await;
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn a_callback_naming_another_consumer_group_is_refused_and_leaves_it_the_message() {
    let (vercel, emulator) = on_emulator("workers").await;
    let q = queue("jobs.pushed");
    let receipt = vercel
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    let id = receipt.message_id.unwrap();
    let reply = vercel
        .handle_push(&callback(&q, "billing-audit", &id), vec![], |_| async {
            panic!("another group's message must not run here")
        })
        .await;
    assert_eq!(reply.status(), 400, "{reply:?}");
    let clock = Arc::new(emulator.clock().expect("a manual clock"));
    let theirs = adapter(emulator.base_url(), "billing-audit", clock);
    let got = theirs
        .receive(&q, 10, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "still receivable in its own group");
}

/// `callback` headers with a pushed payload: a receipt handle, a delivery count, a body.
fn pushed(q: &QueueName, group: &str, message_id: &str, receipt_handle: &str) -> HeaderMap {
    let mut headers = callback(q, group, message_id);
    headers.insert("ce-vqsreceipthandle", receipt_handle.parse().unwrap());
    headers.insert("ce-vqsdeliverycount", "1".parse().unwrap());
    headers.insert("content-type", "application/json".parse().unwrap());
    headers
}

#[tokio::test]
async fn a_forged_callback_with_a_made_up_receipt_handle_runs_nothing() {
    let (vercel, _emulator) = on_emulator("workers").await;
    let q = queue("jobs.pushed");
    // A real message id, so only the receipt handle and the payload are made up.
    let receipt = vercel
        .publish(&q, &fixtures::envelope(1, 1), PublishOptions::default())
        .await
        .unwrap();
    let id = receipt.message_id.unwrap();
    let forged = fixtures::envelope(2, 2).to_json_bytes().unwrap();
    let headers = pushed(&q, "workers", &id, "made-up-receipt-handle");
    let reply = vercel
        .handle_push(&headers, forged, |_| async {
            panic!("a forged payload must not run")
        })
        .await;
    assert_eq!(
        reply,
        PushReply::Skipped {
            reason: SkipReason::NotAvailable,
            message_id: id,
        }
    );
}

#[tokio::test]
async fn a_pushed_payload_runs_once_its_receipt_handle_is_confirmed() {
    let (vercel, _emulator) = on_emulator("workers").await;
    let q = queue("jobs.pushed");
    let envelope = fixtures::envelope(1, 1);
    vercel
        .publish(&q, &envelope, PublishOptions::default())
        .await
        .unwrap();
    // What the platform does before it calls back: lease the message for the callback.
    let leased = vercel
        .receive(&q, 1, Duration::from_secs(60))
        .await
        .unwrap()
        .pop()
        .expect("the message");
    let (group, handle) = leased.lease.token().split_once('/').expect("group/handle");
    let id = leased.message_id.clone().expect("an id");
    let headers = pushed(&q, group, &id, handle);
    let reply = vercel
        .handle_push(&headers, leased.payload.clone(), |delivery| {
            let vercel = vercel.clone();
            async move { vercel.ack(&delivery.lease).await.is_ok() }
        })
        .await;
    assert_eq!(reply, PushReply::Success);
}

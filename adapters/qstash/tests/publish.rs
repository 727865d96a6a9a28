//! The publishing side against `jobs_testkit::fakes::qstash::FakeQStash` (deliveries paused:
//! these tests look at what QStash was asked to hold).

use std::time::{Duration, UNIX_EPOCH};

use jobs_adapter_qstash::{
    BatchItem, Destination, QStashConfig, QStashError, QStashQueue, RetrySchedule,
};
use jobs_core::{Depth, PublishOptions, QueueDepth, QueueError, QueueName, QueuePort};
use jobs_testkit::fakes::qstash::{DEV_TOKEN, FakeQStash};
use jobs_testkit::fixtures;

const ENDPOINT: &str = "http://127.0.0.1:9/qstash/jobs";

fn queue(name: &str) -> QueueName {
    name.parse().expect("valid queue name")
}

async fn paused_fake() -> FakeQStash {
    let fake = FakeQStash::start().await.expect("fake starts");
    fake.pause_deliveries(true);
    fake
}

fn client(fake: &FakeQStash, destinations: &[(&str, Destination)]) -> QStashQueue {
    let mut config = QStashConfig::new(fake.token()).with_base_url(fake.base_url());
    for (name, destination) in destinations {
        config = config.with_destination(queue(name), destination.clone());
    }
    QStashQueue::new(config).expect("valid config")
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn publish_sends_the_envelope_with_dedup_and_retry_headers() {
    let fake = paused_fake().await;
    let q = client(&fake, &[("jobs.a", Destination::new(ENDPOINT))]);
    let envelope = fixtures::envelope(1, 1);
    let receipt = q
        .publish(&queue("jobs.a"), &envelope, PublishOptions::default())
        .await
        .expect("published");
    assert!(!receipt.duplicate);
    let messages = fake.messages();
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(receipt.message_id.as_deref(), Some(m.message_id.as_str()));
    assert_eq!(m.url, ENDPOINT);
    assert_eq!(m.queue, None);
    assert_eq!(m.body, envelope.to_json_bytes().unwrap());
    assert_eq!(m.max_retries, 4, "5 attempts = 1 + 4 retries");
    let h = &m.publish_headers;
    assert_eq!(
        header(h, "upstash-deduplication-id"),
        Some(envelope.job_id.to_string().as_str())
    );
    assert_eq!(
        header(h, "upstash-retry-delay"),
        Some("min(3600000, 30000 * pow(2, retried))")
    );
    assert_eq!(header(h, "content-type"), Some("application/json"));
    assert_eq!(header(h, "upstash-timeout"), Some("60s"));
    assert_eq!(header(h, "upstash-delay"), None);
}

#[tokio::test]
async fn a_queue_specific_retry_schedule_sets_the_headers() {
    let fake = paused_fake().await;
    let retry = RetrySchedule::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    let q = client(
        &fake,
        &[("jobs.a", Destination::new(ENDPOINT).with_retry(retry))],
    );
    q.publish(
        &queue("jobs.a"),
        &fixtures::envelope(1, 1),
        PublishOptions::default(),
    )
    .await
    .unwrap();
    let m = &fake.messages()[0];
    assert_eq!(m.max_retries, 2);
    assert_eq!(
        header(&m.publish_headers, "upstash-retry-delay"),
        Some("min(60000, 10000 * pow(2, retried))")
    );
}

#[tokio::test]
async fn duplicates_are_answered_with_the_first_id() {
    let fake = paused_fake().await;
    let q = client(&fake, &[("jobs.a", Destination::new(ENDPOINT))]);
    let a = queue("jobs.a");
    let envelope = fixtures::envelope(1, 1);
    let first = q
        .publish(&a, &envelope, PublishOptions::default())
        .await
        .unwrap();
    let second = q
        .publish(&a, &envelope, PublishOptions::default())
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(first.message_id, second.message_id);
    let keyed = PublishOptions::default().dedup_key("invoice-42");
    let third = q
        .publish(&a, &fixtures::envelope(1, 2), keyed.clone())
        .await
        .unwrap();
    let fourth = q
        .publish(&a, &fixtures::envelope(1, 3), keyed)
        .await
        .unwrap();
    assert!(!third.duplicate && fourth.duplicate);
    assert_eq!(fake.messages().len(), 2);
    // After QStash's 10-minute window the key is free again.
    fake.advance(Duration::from_secs(601));
    let again = q
        .publish(&a, &envelope, PublishOptions::default())
        .await
        .unwrap();
    assert!(!again.duplicate);
}

#[tokio::test]
async fn delay_and_schedule_set_the_delivery_time() {
    let fake = paused_fake().await;
    let q = client(&fake, &[("jobs.a", Destination::new(ENDPOINT))]);
    let a = queue("jobs.a");
    let before = fake.now();
    q.publish(
        &a,
        &fixtures::envelope(1, 1),
        PublishOptions::default().delay(Duration::from_millis(60_500)),
    )
    .await
    .unwrap();
    let run_at = UNIX_EPOCH + Duration::from_secs(4_000_000_000);
    let envelope = fixtures::envelope(1, 2);
    q.schedule(&a, &envelope, run_at).await.unwrap();
    let messages = fake.messages();
    assert_eq!(
        header(&messages[0].publish_headers, "upstash-delay"),
        Some("61s"),
        "rounded up, never earlier"
    );
    assert!(messages[0].not_before >= before + Duration::from_secs(61));
    assert_eq!(
        header(&messages[1].publish_headers, "upstash-not-before"),
        Some("4000000000")
    );
    assert_eq!(messages[1].not_before, run_at);
    assert_eq!(
        header(&messages[1].publish_headers, "upstash-deduplication-id"),
        Some(envelope.job_id.to_string().as_str()),
        "schedule deduplicates by job id"
    );
}

#[tokio::test]
async fn qstash_queues_are_used_and_report_their_lag_as_depth() {
    let fake = paused_fake().await;
    let q = client(
        &fake,
        &[
            (
                "jobs.fifo",
                Destination::new(ENDPOINT).via_queue("jobs.fifo"),
            ),
            ("jobs.plain", Destination::new(ENDPOINT)),
        ],
    );
    let fifo = queue("jobs.fifo");
    assert_eq!(q.depth(&fifo).await.unwrap().total(), 0, "unknown queue");
    for n in 0..3 {
        q.publish(&fifo, &fixtures::envelope(1, n), PublishOptions::default())
            .await
            .unwrap();
    }
    assert!(
        fake.messages()
            .iter()
            .all(|m| m.queue.as_deref() == Some("jobs.fifo"))
    );
    let depth = q.depth(&fifo).await.unwrap();
    assert_eq!(
        depth,
        Depth::ready_only(3),
        "the lag, and nothing else known"
    );
    assert_eq!(
        (depth.delayed_known(), depth.in_flight_known()),
        (None, None)
    );
    assert!(matches!(
        q.depth(&queue("jobs.plain")).await,
        Err(QueueError::Rejected { .. })
    ));
}

#[tokio::test]
async fn a_batch_is_one_request_with_one_receipt_per_message() {
    let fake = paused_fake().await;
    let q = client(
        &fake,
        &[
            ("jobs.a", Destination::new(ENDPOINT)),
            ("jobs.b", Destination::new(ENDPOINT).via_queue("jobs.b")),
        ],
    );
    let first = fixtures::envelope(1, 1);
    let second = fixtures::envelope(1, 2);
    q.publish(&queue("jobs.a"), &first, PublishOptions::default())
        .await
        .unwrap();
    let items = vec![
        BatchItem {
            queue: queue("jobs.a"),
            envelope: first.clone(),
            opts: PublishOptions::default(),
        },
        BatchItem {
            queue: queue("jobs.b"),
            envelope: second.clone(),
            opts: PublishOptions::default().delay(Duration::from_secs(5)),
        },
    ];
    let receipts = q.publish_batch(&items).await.expect("batch sent");
    assert_eq!(receipts.len(), 2);
    assert!(receipts[0].as_ref().unwrap().duplicate, "same job id");
    assert!(!receipts[1].as_ref().unwrap().duplicate);
    let messages = fake.messages();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1].queue.as_deref(), Some("jobs.b"));
    assert_eq!(messages[1].body, second.to_json_bytes().unwrap());
    assert_eq!(
        header(&messages[1].publish_headers, "upstash-delay"),
        Some("5s")
    );
}

#[tokio::test]
async fn failures_map_onto_the_port_errors() {
    let fake = paused_fake().await;
    let q = client(&fake, &[("jobs.a", Destination::new(ENDPOINT))]);
    let a = queue("jobs.a");
    let envelope = fixtures::envelope(1, 1);
    let publish = || q.publish(&a, &envelope, PublishOptions::default());

    fake.fail_next(500, 1);
    assert!(matches!(
        publish().await,
        Err(QueueError::Unavailable { .. })
    ));
    fake.fail_next(429, 1);
    assert!(matches!(
        publish().await,
        Err(QueueError::RateLimited { .. })
    ));
    fake.fail_next(400, 1);
    assert!(matches!(publish().await, Err(QueueError::Rejected { .. })));

    let unmapped = q
        .publish(&queue("jobs.unknown"), &envelope, PublishOptions::default())
        .await;
    assert!(matches!(unmapped, Err(QueueError::Rejected { .. })));

    let wrong = QStashQueue::new(
        QStashConfig::new("not-the-token")
            .with_base_url(fake.base_url())
            .with_destination(a.clone(), Destination::new(ENDPOINT)),
    )
    .unwrap();
    let refused = wrong
        .publish(&a, &envelope, PublishOptions::default())
        .await;
    match refused {
        Err(QueueError::Rejected { reason, .. }) => {
            assert!(reason.contains("401"), "{reason}");
            assert!(!reason.contains("not-the-token"));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(fake.messages().is_empty(), "nothing was accepted");

    let closed = QStashQueue::new(
        QStashConfig::new(DEV_TOKEN)
            .with_base_url("http://127.0.0.1:9")
            .with_destination(a.clone(), Destination::new(ENDPOINT)),
    )
    .unwrap();
    assert!(matches!(
        closed
            .publish(&a, &envelope, PublishOptions::default())
            .await,
        Err(QueueError::Unavailable { .. })
    ));
}

#[tokio::test]
async fn schedules_are_upserted_listed_and_deleted() {
    let fake = paused_fake().await;
    let q = client(&fake, &[("jobs.a", Destination::new(ENDPOINT))]);
    let a = queue("jobs.a");
    let id = q
        .schedule_upsert(&a, "nightly-digest", "0 6 * * *", b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(id, "nightly-digest");
    q.schedule_upsert(&a, "nightly-digest", "30 6 * * *", b"{}".to_vec())
        .await
        .unwrap();
    let listed = q.schedules().await.unwrap();
    assert_eq!(listed.len(), 1, "same id is an upsert");
    assert_eq!(listed[0].cron, "30 6 * * *");
    assert_eq!(listed[0].destination, ENDPOINT);
    let fired = fake
        .fire_schedule("nightly-digest")
        .expect("schedule exists");
    let message = fake.message(&fired).unwrap();
    assert_eq!(message.schedule_id.as_deref(), Some("nightly-digest"));
    assert_eq!(message.max_retries, 4, "the retry headers are copied");
    q.schedule_delete("nightly-digest").await.unwrap();
    assert!(q.schedules().await.unwrap().is_empty());
    let bad = q.schedule_upsert(&a, "x", "not cron", Vec::new()).await;
    assert!(matches!(bad, Err(QStashError::Api { status: 400, .. })));
}

#[test]
fn configuration_mistakes_fail_at_startup_and_secrets_stay_hidden() {
    let a = queue("jobs.a");
    assert!(matches!(
        QStashQueue::new(QStashConfig::new("t").with_base_url("not a url")),
        Err(QStashError::InvalidBaseUrl { .. })
    ));
    assert!(matches!(
        QStashQueue::new(QStashConfig::new(" ")),
        Err(QStashError::InvalidToken)
    ));
    assert!(matches!(
        QStashQueue::new(QStashConfig::new("t").with_destination(a, Destination::new("/relative"))),
        Err(QStashError::InvalidDestination(_))
    ));
    assert!(RetrySchedule::new(0, Duration::from_secs(1), Duration::from_secs(2)).is_err());
    assert!(RetrySchedule::new(3, Duration::from_secs(5), Duration::from_secs(2)).is_err());
    let q = QStashQueue::new(QStashConfig::new("very-secret-token")).unwrap();
    assert!(!format!("{q:?}").contains("very-secret-token"));
}

#[tokio::test]
async fn a_destination_template_serves_every_queue_without_its_own_destination() {
    let fake = paused_fake().await;
    let config = QStashConfig::new(fake.token())
        .with_base_url(fake.base_url())
        .with_destination(queue("billing.invoices"), Destination::new(ENDPOINT))
        .with_destination_template(
            Destination::new("http://127.0.0.1:9/q/{queue}").via_queue("jobs-{queue}"),
        )
        .expect("a template with the placeholder");
    let client = QStashQueue::new(config).expect("valid config");
    for (n, name) in [(1, "billing.invoices"), (2, "notif.email.marketing")] {
        let envelope = fixtures::envelope(1, n);
        client
            .publish(&queue(name), &envelope, PublishOptions::default())
            .await
            .expect("publish");
    }
    let messages = fake.messages();
    assert_eq!(messages[0].url, ENDPOINT, "a queue's own destination wins");
    assert_eq!(messages[0].queue, None);
    assert_eq!(
        messages[1].url,
        "http://127.0.0.1:9/q/notif.email.marketing"
    );
    assert_eq!(
        messages[1].queue.as_deref(),
        Some("jobs-notif.email.marketing")
    );

    let refused = QStashConfig::new("t")
        .with_destination_template(Destination::new("http://127.0.0.1:9/all"))
        .expect_err("every queue on one endpoint is refused");
    assert!(matches!(refused, QStashError::InvalidDestination(_)));
    fake.shutdown().await;
}

/// A destination with a per-tenant parallelism publishes each job with its tenant's
/// flow-control key, and QStash (the fake) then has at most that many of one tenant's jobs
/// under way at a time, while other tenants' still flow.
#[tokio::test]
async fn a_tenant_parallelism_caps_one_tenants_deliveries_in_flight() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Slow {
        in_flight: Mutex<HashMap<String, usize>>,
        most: Mutex<HashMap<String, usize>>,
        done: Mutex<usize>,
    }
    async fn handle(
        axum::extract::State(slow): axum::extract::State<Arc<Slow>>,
        body: axum::body::Bytes,
    ) -> &'static str {
        let tenant = jobs_core::Envelope::decode(&body)
            .map(|e| e.tenant_id.to_string())
            .unwrap_or_default();
        {
            let mut in_flight = slow.in_flight.lock().expect("lock");
            let now = in_flight.entry(tenant.clone()).or_default();
            *now += 1;
            let mut most = slow.most.lock().expect("lock");
            let peak = most.entry(tenant.clone()).or_default();
            *peak = (*peak).max(*now);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        *slow
            .in_flight
            .lock()
            .expect("lock")
            .entry(tenant)
            .or_default() -= 1;
        *slow.done.lock().expect("lock") += 1;
        "ok"
    }
    let slow = Arc::new(Slow::default());
    let router = axum::Router::new()
        .route("/jobs", axum::routing::post(handle))
        .with_state(slow.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}/jobs", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let fake = FakeQStash::start().await.expect("fake starts");
    let cap = std::num::NonZeroU32::new(1).expect("not zero");
    let q = client(
        &fake,
        &[("jobs.fair", Destination::new(url).tenant_parallelism(cap))],
    );
    for n in 0..6u32 {
        let envelope = fixtures::envelope(1 + n % 2, u64::from(n));
        q.publish(&queue("jobs.fair"), &envelope, PublishOptions::default())
            .await
            .expect("published");
    }
    let first = &fake.messages()[0];
    assert_eq!(
        header(&first.publish_headers, "upstash-flow-control-key"),
        Some(format!("jobs_fair-{}", fixtures::tenant(1)).as_str())
    );
    assert_eq!(
        header(&first.publish_headers, "upstash-flow-control-value"),
        Some("parallelism=1")
    );
    assert!(
        fake.wait_idle(Duration::from_secs(10)).await,
        "all delivered"
    );
    assert_eq!(*slow.done.lock().expect("lock"), 6);
    let most = slow.most.lock().expect("lock").clone();
    assert_eq!(most.len(), 2, "both tenants delivered");
    assert!(
        most.values().all(|peak| *peak == 1),
        "one delivery of a tenant at a time: {most:?}"
    );
}

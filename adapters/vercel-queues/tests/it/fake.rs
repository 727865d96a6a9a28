//! Against the fault-injecting fake: what Vercel's emulator cannot show.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use jobs_adapter_vercel_queues::{
    AccessToken, Region, StaticToken, TokenError, TokenSource, VercelQueues, VercelQueuesConfig,
    topic_of,
};
use jobs_core::{PublishOptions, PullPort, QueueError, QueueName, QueuePort, Receipt, SettlePort};
use jobs_testkit::fakes::FakeVercelQueues;
use jobs_testkit::fixtures;

fn config(fake: &FakeVercelQueues, tokens: impl TokenSource + 'static) -> VercelQueuesConfig {
    VercelQueuesConfig::new(Region::new("iad1").unwrap(), tokens)
        .base_url_override(fake.base_url())
        .unwrap()
        .retries(3, Duration::from_secs(2))
}

fn on(fake: &FakeVercelQueues) -> VercelQueues {
    VercelQueues::new(config(fake, StaticToken::new(fake.token()))).unwrap()
}

fn queue() -> QueueName {
    "jobs.fake".parse().unwrap()
}

/// Publishes envelope `n` of tenant 1 on the test queue.
async fn publish_one(vercel: &VercelQueues, n: u64) -> Result<Receipt, QueueError> {
    vercel
        .publish(
            &queue(),
            &fixtures::envelope(1, n),
            PublishOptions::default(),
        )
        .await
}

#[tokio::test]
async fn batches_go_100_a_request_with_one_result_per_envelope_in_order() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    let items: Vec<_> = (0..150)
        .map(|n| (fixtures::envelope(1, n), PublishOptions::default()))
        .collect();
    fake.fail_batch_items(&[1], 400);
    fake.defer_batch_items(&[2]);
    let results = vercel.publish_batch(&queue(), &items).await;
    assert_eq!(results.len(), 150);
    assert!(
        matches!(&results[1], Err(QueueError::Rejected { .. })),
        "{:?}",
        results[1]
    );
    assert_eq!(
        results[2].as_ref().unwrap().message_id,
        None,
        "deferred: no id"
    );
    assert!(results.iter().enumerate().all(|(i, r)| i == 1 || r.is_ok()));
    let batches = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/batch"))
        .count();
    assert_eq!(batches, 2, "150 envelopes are two requests");
    // Every accepted part went to the mapped topic, in order, with its job id as key.
    let sent = fake.sent();
    assert_eq!(sent.len(), 149);
    assert!(sent.iter().all(|m| m.topic == topic_of(&queue())));
    let keys: Vec<_> = sent
        .iter()
        .map(|m| m.idempotency_key.clone().unwrap())
        .collect();
    let expected: Vec<_> = items
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, (e, _))| e.job_id.to_string())
        .collect();
    assert_eq!(keys, expected);
}

#[tokio::test]
async fn a_deferred_send_is_a_success_without_an_id_and_is_delivered() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    fake.defer_next_sends(1);
    let receipt = publish_one(&vercel, 1).await.unwrap();
    assert_eq!(receipt.message_id, None);
    assert_eq!(
        vercel
            .receive(&queue(), 10, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_honouring_retry_after() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    fake.fail_next(1, 429, Some(1));
    let started = std::time::Instant::now();
    publish_one(&vercel, 1)
        .await
        .expect("the retry after 1 s succeeds");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was honoured"
    );
    assert_eq!(fake.sent().len(), 1);

    fake.fail_next(2, 503, None);
    publish_one(&vercel, 2)
        .await
        .expect("two 503s are within the budget of three retries");

    fake.fail_next(4, 502, None);
    let err = publish_one(&vercel, 3).await.unwrap_err();
    assert!(matches!(err, QueueError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("502"), "{err}");
}

#[tokio::test]
async fn a_retry_after_longer_than_the_longest_backoff_is_returned_at_once() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    fake.fail_next(1, 429, Some(30));
    let err = publish_one(&vercel, 1).await.unwrap_err();
    match err {
        QueueError::RateLimited { retry_after, .. } => {
            assert_eq!(retry_after, Some(Duration::from_secs(30)));
        }
        other => panic!("expected RateLimited, got {other}"),
    }
    assert_eq!(fake.requests().len(), 1, "no retry within the call");
}

#[tokio::test]
async fn refusals_are_permanent_and_carry_the_servers_message() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    for status in [400, 403] {
        fake.fail_next(1, status, None);
        let err = publish_one(&vercel, 1).await.unwrap_err();
        assert!(
            matches!(err, QueueError::Rejected { .. }),
            "{status}: {err}"
        );
        assert!(err.to_string().contains(&status.to_string()), "{err}");
    }
    let wrong = VercelQueues::new(config(&fake, StaticToken::new("wrong"))).unwrap();
    let err = publish_one(&wrong, 1).await.unwrap_err();
    assert!(matches!(err, QueueError::Rejected { .. }), "{err}");
    assert!(err.to_string().contains("401"), "{err}");
    assert!(fake.sent().is_empty());
}

#[tokio::test]
async fn slow_answers_time_out_and_are_retried() {
    let fake = FakeVercelQueues::start().await;
    let vercel = VercelQueues::new(
        config(&fake, StaticToken::new(fake.token())).timeout(Duration::from_millis(300)),
    )
    .unwrap();
    fake.delay_next(1, Duration::from_secs(2));
    let received = vercel.receive(&queue(), 1, Duration::from_secs(30)).await;
    assert!(received.unwrap().is_empty(), "the retry answered 204");
    fake.delay_next(10, Duration::from_secs(2));
    let err = vercel
        .receive(&queue(), 1, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
}

#[tokio::test]
async fn expired_leases_answer_409_and_are_reported_lost() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    for n in 0..3 {
        publish_one(&vercel, n).await.unwrap();
    }
    let got = vercel
        .receive(&queue(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    // Receipt handles hold a space, `/` and `:`: settling works only if they are encoded.
    vercel.ack(&got[0].lease).await.unwrap();
    fake.expire_leases();
    let lost = vercel.ack(&got[1].lease).await.unwrap_err();
    assert!(matches!(lost, QueueError::LeaseLost { .. }), "{lost}");
    let lost = vercel
        .retry_at(&got[2].lease, SystemTime::now() + Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(lost, QueueError::LeaseLost { .. }), "{lost}");
    assert_eq!(fake.acked().len(), 1);
    let again = vercel
        .receive(&queue(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 2, "the expired ones come back");
    assert!(again.iter().all(|d| d.attempt == 2));
}

/// Tokens that expire at once, with a count of how often they were asked for.
struct Rotating {
    secret: String,
    calls: AtomicUsize,
    first_wrong: bool,
}

#[async_trait]
impl TokenSource for Rotating {
    async fn token(&self) -> Result<AccessToken, TokenError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let secret = if self.first_wrong && n == 0 {
            "stale".to_owned()
        } else {
            self.secret.clone()
        };
        // Within the refresh margin already: the next request asks again.
        Ok(AccessToken::new(
            secret,
            Some(SystemTime::now() + Duration::from_secs(30)),
        ))
    }
}

#[tokio::test]
async fn tokens_are_refreshed_when_they_expire_and_after_a_401() {
    let fake = FakeVercelQueues::start().await;
    let tokens = Arc::new(Rotating {
        secret: fake.token().to_owned(),
        calls: AtomicUsize::new(0),
        first_wrong: true,
    });
    struct Shared(Arc<Rotating>);
    #[async_trait]
    impl TokenSource for Shared {
        async fn token(&self) -> Result<AccessToken, TokenError> {
            self.0.token().await
        }
    }
    let vercel = VercelQueues::new(config(&fake, Shared(tokens.clone()))).unwrap();
    publish_one(&vercel, 1)
        .await
        .expect("the 401 for the stale token is followed by one refresh");
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 2);
    publish_one(&vercel, 2).await.unwrap();
    assert_eq!(
        tokens.calls.load(Ordering::SeqCst),
        3,
        "an expiring token is fetched again"
    );
}

/// Tokens valid for an hour of the system's time, counted.
struct Hourly {
    secret: String,
    calls: AtomicUsize,
}

#[async_trait]
impl TokenSource for Hourly {
    async fn token(&self) -> Result<AccessToken, TokenError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(AccessToken::new(
            self.secret.clone(),
            Some(SystemTime::now() + Duration::from_secs(3_600)),
        ))
    }
}

#[tokio::test]
async fn the_token_cache_reads_the_adapter_s_clock() {
    let fake = FakeVercelQueues::start().await;
    let tokens = Arc::new(Hourly {
        secret: fake.token().to_owned(),
        calls: AtomicUsize::new(0),
    });
    struct Shared(Arc<Hourly>);
    #[async_trait]
    impl TokenSource for Shared {
        async fn token(&self) -> Result<AccessToken, TokenError> {
            self.0.token().await
        }
    }
    let clock = jobs_core::ManualClock::default();
    clock.set(SystemTime::now());
    let vercel = VercelQueues::with_clock(
        config(&fake, Shared(tokens.clone())),
        Arc::new(clock.clone()),
    )
    .unwrap();
    publish_one(&vercel, 1).await.unwrap();
    publish_one(&vercel, 2).await.unwrap();
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 1, "cached");
    // Two hours later by the adapter's clock: the token has expired, whatever the system says.
    clock.advance(Duration::from_secs(7_200));
    publish_one(&vercel, 3).await.unwrap();
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 2, "fetched again");
}

/// A callback route as an application would mount it: the runtime's work is an ack here.
async fn callback(
    State(vercel): State<VercelQueues>,
    headers: HeaderMap,
    body: Bytes,
) -> (axum::http::StatusCode, String) {
    let reply = vercel
        .handle_push(&headers, body.to_vec(), |delivery| {
            let vercel = vercel.clone();
            async move { vercel.ack(&delivery.lease).await.is_ok() }
        })
        .await;
    (
        axum::http::StatusCode::from_u16(reply.status()).unwrap(),
        reply.body(),
    )
}

async fn serve(vercel: VercelQueues) -> String {
    let app = Router::new()
        .route("/api/queue", post(callback))
        .with_state(vercel);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/api/queue")
}

#[tokio::test]
async fn pushed_callbacks_with_and_without_payload_reach_the_runtime_and_settle() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    let url = serve(vercel.clone()).await;
    let topic = topic_of(&queue());
    for n in 0..2 {
        publish_one(&vercel, n).await.unwrap();
    }
    let with = fake.push_next(&url, &topic, "workers", true).await.unwrap();
    assert_eq!(
        (with.status, with.body.as_str()),
        (200, r#"{"status":"success"}"#)
    );
    let without = fake
        .push_next(&url, &topic, "workers", false)
        .await
        .unwrap();
    assert_eq!(without.status, 200, "{}", without.body);
    assert_eq!(fake.acked().len(), 2, "both settled through the lease API");
    assert!(
        fake.requests().iter().any(|r| r.path.contains("/id/")),
        "the callback without payload received by id"
    );
    assert!(
        fake.push_next(&url, &topic, "workers", true)
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_callback_whose_runtime_could_not_settle_answers_500() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    publish_one(&vercel, 1).await.unwrap();
    let app = Router::new().route(
        "/api/queue",
        post(
            |State(vercel): State<VercelQueues>, headers: HeaderMap, body: Bytes| async move {
                let reply = vercel
                    .handle_push(&headers, body.to_vec(), |_| async { false })
                    .await;
                (
                    axum::http::StatusCode::from_u16(reply.status()).unwrap(),
                    reply.body(),
                )
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app.with_state(vercel)).await.unwrap() });
    let answer = fake
        .push_next(
            &format!("http://{address}/api/queue"),
            &topic_of(&queue()),
            "workers",
            true,
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 500);
    assert!(answer.body.contains("Failed to process queue message"));
}

#[tokio::test]
async fn a_callback_naming_another_consumer_group_is_refused_before_calling_vercel() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    let url = serve(vercel.clone()).await;
    let topic = topic_of(&queue());
    publish_one(&vercel, 1).await.unwrap();
    let before = fake.requests().len();
    let forged = fake
        .push_next(&url, &topic, "billing-audit", false)
        .await
        .unwrap();
    assert_eq!(forged.status, 400, "{}", forged.body);
    assert!(forged.body.contains("billing-audit"), "{}", forged.body);
    assert_eq!(fake.requests().len(), before, "no call reached Vercel");
    // The message is still there for the group's own consumers.
    let theirs = VercelQueues::new(
        config(&fake, StaticToken::new(fake.token()))
            .consumer_group("billing-audit")
            .unwrap(),
    )
    .unwrap();
    let got = theirs
        .receive(&queue(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "still receivable in its own group");
}

#[tokio::test(start_paused = true)]
async fn a_callback_vercel_does_not_answer_gives_up_within_its_deadline() {
    let fake = FakeVercelQueues::start().await;
    let vercel = on(&fake);
    publish_one(&vercel, 1).await.unwrap();
    // Every answer from now on comes after an hour.
    fake.delay_next(100, Duration::from_secs(3_600));
    let headers = {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("ce-type", "com.vercel.queue.v2beta"),
            ("ce-vqsqueuename", topic_of(&queue()).as_str()),
            ("ce-vqsconsumergroup", "workers"),
            ("ce-vqsmessageid", "0-1"),
        ] {
            h.insert(
                axum::http::HeaderName::from_static(name),
                axum::http::HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    };
    let started = tokio::time::Instant::now();
    let reply = vercel
        .handle_push(&headers, vec![], |_| async { true })
        .await;
    assert_eq!(reply, jobs_adapter_vercel_queues::push::PushReply::Failed);
    assert!(
        started.elapsed() <= jobs_adapter_vercel_queues::push::TAKE_WITHIN + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

//! The QStash fake's own wire behaviour, with a plain HTTP client and a bare endpoint that
//! answers what it is told (no adapter code on the consuming side).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jobs_adapter_qstash::{SigningKeys, verify_signature};
use jobs_testkit::fakes::qstash::{DEV_CURRENT_KEY, DEV_NEXT_KEY, DEV_TOKEN, FakeQStash};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// A status and the headers to answer it with.
type Answer = (u16, Vec<(&'static str, String)>);

/// An endpoint answering `(status, headers)` in turn (then 200), recording each request's
/// headers and body.
#[derive(Default)]
struct Bare {
    answers: Mutex<Vec<Answer>>,
    requests: Mutex<Vec<(HeaderMap, Vec<u8>)>>,
}

async fn bare(State(b): State<Arc<Bare>>, headers: HeaderMap, body: Bytes) -> Response {
    b.requests.lock().unwrap().push((headers, body.to_vec()));
    let (status, extra) = {
        let mut answers = b.answers.lock().unwrap();
        if answers.is_empty() {
            (200, vec![])
        } else {
            answers.remove(0)
        }
    };
    let mut response =
        (axum::http::StatusCode::from_u16(status).unwrap(), "answer").into_response();
    for (name, value) in extra {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

async fn endpoint(answers: Vec<Answer>) -> (String, Arc<Bare>) {
    let b = Arc::new(Bare {
        answers: Mutex::new(answers),
        requests: Mutex::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/hook", post(bare))
        .with_state(Arc::clone(&b));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, b)
}

async fn fake() -> FakeQStash {
    let fake = FakeQStash::start().await.unwrap();
    fake.set_retry_scale(0.0);
    fake
}

#[tokio::test]
async fn authentication_by_bearer_or_query_token() {
    let fake = fake().await;
    fake.pause_deliveries(true);
    let http = reqwest::Client::new();
    let url = format!("{}/v2/publish/http://127.0.0.1:9/x", fake.base_url());
    let none = http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(none.status(), 401);
    let body: Value = none.json().await.unwrap();
    assert!(body["error"].is_string());
    let wrong = http.post(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let bearer = http.post(&url).bearer_auth(DEV_TOKEN).send().await.unwrap();
    assert_eq!(bearer.status(), 200);
    let encoded: String = DEV_TOKEN.replace('=', "%3D");
    let query = http
        .post(format!("{url}?qstash_token={encoded}"))
        .send()
        .await
        .unwrap();
    assert_eq!(query.status(), 200);
    let answer: Value = query.json().await.unwrap();
    assert!(answer["messageId"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        fake.messages()[1].url,
        "http://127.0.0.1:9/x",
        "token stripped"
    );
}

#[tokio::test]
async fn deliveries_carry_a_verifiable_signature_and_the_delivery_headers() {
    let fake = fake().await;
    let (url, bare) = endpoint(vec![]).await;
    let http = reqwest::Client::new();
    let body = r#"{"hello":"world"}"#;
    let published: Value = http
        .post(format!("{}/v2/publish/{url}", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .header("content-type", "application/json")
        .header("upstash-forward-x-tenant", "t-1")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(fake.wait_idle(WAIT).await);
    let requests = bare.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let (headers, got) = &requests[0];
    assert_eq!(got, body.as_bytes());
    let h = |n: &str| headers.get(n).unwrap().to_str().unwrap().to_owned();
    assert_eq!(h("user-agent"), "Upstash-QStash");
    assert_eq!(h("upstash-retried"), "0");
    assert_eq!(
        h("upstash-message-id"),
        published["messageId"].as_str().unwrap()
    );
    assert_eq!(h("content-type"), "application/json");
    assert_eq!(h("x-tenant"), "t-1", "Upstash-Forward- prefix stripped");
    let verified = verify_signature(
        &h("upstash-signature"),
        Some(&url),
        got,
        fake.now(),
        &SigningKeys::new(DEV_CURRENT_KEY, DEV_NEXT_KEY),
        Duration::ZERO,
    )
    .expect("the fake signs like QStash");
    assert_eq!(verified.claims.exp, verified.claims.iat + 300);
    assert!(verified.claims.body.ends_with('='), "padded like the docs");
}

#[tokio::test]
async fn retries_follow_retry_after_then_the_default_backoff_then_the_dlq() {
    let fake = fake().await;
    let (url, bare) = endpoint(vec![
        (
            503,
            vec![("retry-after", "Sun, 06 Nov 2101 08:49:37 GMT".into())],
        ),
        (500, vec![("retry-after", "6m5s".into())]),
        (500, vec![]),
        (502, vec![]),
    ])
    .await;
    let http = reqwest::Client::new();
    http.post(format!("{}/v2/publish/{url}", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(fake.wait_idle(WAIT).await);
    let attempts = fake.attempts();
    let retried: Vec<u32> = attempts.iter().map(|a| a.retried).collect();
    assert_eq!(retried, vec![0, 1, 2, 3], "1 + 3 retries by default");
    assert_eq!(
        attempts[0].next_delay,
        Some(Duration::from_secs(86_400)),
        "Retry-After is capped at a day"
    );
    assert_eq!(attempts[1].next_delay, Some(Duration::from_secs(365)));
    // No Retry-After: min(86400, e^(2.5·n)) with n = 3 retries so far.
    assert_eq!(attempts[2].next_delay.map(|d| d.as_secs()), Some(1808));
    assert_eq!(attempts[3].next_delay, None, "exhausted");
    assert_eq!(fake.dlq_message_ids().len(), 1);
    assert_eq!(bare.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn status_489_needs_its_header_to_skip_retries() {
    let fake = fake().await;
    let (url, _bare) = endpoint(vec![
        (489, vec![]),
        (489, vec![("upstash-nonretryable-error", "true".into())]),
    ])
    .await;
    let http = reqwest::Client::new();
    http.post(format!("{}/v2/publish/{url}", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .header("upstash-retries", "5")
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(fake.wait_idle(WAIT).await);
    let statuses: Vec<Option<u16>> = fake.attempts().iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![Some(489), Some(489)]);
    assert_eq!(fake.dlq_message_ids().len(), 1);
}

#[tokio::test]
async fn a_batch_answers_each_entry_and_a_bad_entry_does_not_stop_the_others() {
    let fake = fake().await;
    fake.pause_deliveries(true);
    let http = reqwest::Client::new();
    let answers: Vec<Value> = http
        .post(format!("{}/v2/batch", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .json(&json!([
            { "destination": "http://127.0.0.1:9/a", "body": "1" },
            { "body": "no destination" },
            { "destination": "http://127.0.0.1:9/b", "body": "2", "queue": "q1",
              "headers": { "Upstash-Delay": "2m" } },
        ]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answers.len(), 3);
    assert!(answers[0]["messageId"].is_string());
    assert!(answers[1]["error"].is_string());
    assert!(answers[2]["messageId"].is_string());
    let messages = fake.messages();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1].queue.as_deref(), Some("q1"));
    let queues: Value = http
        .get(format!("{}/v2/queues/q1", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(queues["lag"], 1);
    assert_eq!(queues["parallelism"], 1);
}

#[tokio::test]
async fn invalid_publish_headers_are_refused_with_400() {
    let fake = fake().await;
    let http = reqwest::Client::new();
    let url = format!("{}/v2/publish/http://127.0.0.1:9/x", fake.base_url());
    for (name, value) in [
        ("upstash-delay", "soon"),
        ("upstash-not-before", "tomorrow"),
        ("upstash-retries", "-1"),
        ("upstash-retry-delay", "rand() * 1000"),
    ] {
        let answer = http
            .post(&url)
            .bearer_auth(DEV_TOKEN)
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{name}: {value}");
    }
    let not_url = http
        .post(format!("{}/v2/publish/my-url-group", fake.base_url()))
        .bearer_auth(DEV_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(not_url.status(), 400);
    assert!(fake.messages().is_empty());
}

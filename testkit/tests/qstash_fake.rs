//! `FakeQStash` answers as QStash documents, so QStash's own SDK would accept it: the DLQ's
//! message fields, bulk DLQ retry and delete, content-based deduplication, queue pause and
//! resume, the publish answer, and what an adapter relies on in deliveries (a signature by the
//! next key, `Upstash-Retry-Delay`, non-retryable 489), a queue upsert's `paused`, and
//! schedules' fields, pause and resume. Plain HTTP on both sides: `reqwest` to the API, a bare
//! endpoint answering what the test sets.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use jobs_adapter_qstash::{DlqPage, KeyUsed, SignatureError, SigningKeys, verify_signature};
use jobs_testkit::fakes::qstash::{FakeQStash, MessageState};
use serde_json::{Value, json};

/// The bound on every wait for the fake to do something.
const WAIT: Duration = Duration::from_secs(10);
/// How often a wait looks.
const POLL: Duration = Duration::from_millis(2);

/// What the endpoint answers every request with.
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
}

impl Answer {
    fn status(status: u16) -> Self {
        Answer {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
}

/// One request the endpoint received.
#[derive(Clone)]
struct Seen {
    method: Method,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

struct EndpointState {
    answer: Mutex<Answer>,
    seen: Mutex<Vec<Seen>>,
}

/// A local endpoint on any method at `/hook`.
struct Endpoint {
    url: String,
    state: Arc<EndpointState>,
}

impl Endpoint {
    async fn start(answer: Answer) -> Endpoint {
        let state = Arc::new(EndpointState {
            answer: Mutex::new(answer),
            seen: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/hook", any(answer_request))
            .with_state(Arc::clone(&state));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Endpoint { url, state }
    }

    fn answer(&self, answer: Answer) {
        *lock(&self.state.answer) = answer;
    }

    fn seen(&self) -> Vec<Seen> {
        lock(&self.state.seen).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn answer_request(
    State(state): State<Arc<EndpointState>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lock(&state.seen).push(Seen {
        method,
        headers,
        body: body.to_vec(),
    });
    let answer = lock(&state.answer).clone();
    let mut response = (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
    for (name, value) in answer.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

/// A fake that retries at once.
async fn fake() -> FakeQStash {
    let fake = FakeQStash::start().await.unwrap();
    fake.set_retry_scale(0.0);
    fake
}

/// Polls `done` until it holds, or fails the test after [`WAIT`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The QStash API of one fake.
struct Api<'a> {
    fake: &'a FakeQStash,
    http: reqwest::Client,
}

impl<'a> Api<'a> {
    fn new(fake: &'a FakeQStash) -> Self {
        Api {
            fake,
            http: reqwest::Client::new(),
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.fake.base_url()))
            .bearer_auth(self.fake.token())
    }

    /// Sends `request`; the status and the body as JSON (`Null` when empty).
    async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        };
        (status, body)
    }

    async fn publish(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Value) {
        let mut request = self
            .request(Method::POST, &format!("/v2/publish/{destination}"))
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Self::send(request).await
    }

    async fn call(&self, method: Method, path: &str) -> (u16, Value) {
        Self::send(self.request(method, path)).await
    }

    /// The whole DLQ, oldest first.
    async fn dlq(&self) -> Vec<Value> {
        let (status, body) = self.call(Method::GET, "/v2/dlq").await;
        assert_eq!(status, 200);
        body["messages"].as_array().unwrap().clone()
    }
}

fn id_of(answer: &Value) -> String {
    answer["messageId"].as_str().unwrap().to_owned()
}

fn now_ms(fake: &FakeQStash) -> u64 {
    u64::try_from(fake.now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Publishes `n` messages with no retry to an endpoint failing them; their DLQ ids, oldest
/// first. The endpoint then answers 200.
async fn dead_letters(api: &Api<'_>, endpoint: &Endpoint, n: usize) -> Vec<String> {
    endpoint.answer(Answer::status(500));
    for i in 0..n {
        let (status, _) = api
            .publish(&endpoint.url, &[("upstash-retries", "0")], &format!("m{i}"))
            .await;
        assert_eq!(status, 200);
    }
    wait_until("every message dead-lettered", || {
        api.fake.dlq_message_ids().len() == n
    })
    .await;
    endpoint.answer(Answer::status(200));
    api.dlq()
        .await
        .iter()
        .map(|e| e["dlqId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn dlq_entries_carry_every_field_of_qstash_message_type() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer {
        status: 500,
        headers: vec![("x-reason", "boom")],
        body: b"nope".to_vec(),
    })
    .await;
    let before = now_ms(&fake);
    let (status, queued) = Api::send(
        api.request(Method::POST, &format!("/v2/enqueue/q-dlq/{}", endpoint.url))
            .header("content-type", "application/json")
            .header("upstash-forward-x-tenant", "t-1")
            .header("upstash-method", "PUT")
            .header("upstash-retries", "1")
            .body(r#"{"n":1}"#),
    )
    .await;
    assert_eq!(status, 200);
    let (_, direct) = api
        .publish(&endpoint.url, &[("upstash-retries", "0")], "plain")
        .await;
    wait_until("both messages dead-lettered", || {
        fake.dlq_message_ids().len() == 2
    })
    .await;
    let after = now_ms(&fake);
    let dlq = api.dlq().await;
    let entry = dlq
        .iter()
        .find(|e| e["messageId"] == queued["messageId"])
        .unwrap();
    assert!(entry["dlqId"].is_string());
    assert_eq!(entry["url"], json!(endpoint.url));
    assert_eq!(entry["method"], "PUT");
    assert_eq!(
        entry["header"],
        json!({ "Content-Type": ["application/json"], "X-Tenant": ["t-1"] }),
        "the headers sent to the endpoint, as {{name: [values]}}"
    );
    assert_eq!(entry["body"], r#"{"n":1}"#);
    assert_eq!(entry["maxRetries"], 1);
    let created = entry["createdAt"].as_u64().expect("createdAt in ms");
    assert!((before..=after).contains(&created), "{created} in ms");
    assert_eq!(entry["notBefore"], entry["createdAt"], "not delayed");
    assert_eq!(entry["queueName"], "q-dlq");
    assert_eq!(entry["responseStatus"], 500);
    assert_eq!(entry["responseHeader"]["X-Reason"], json!(["boom"]));
    assert_eq!(entry["responseBody"], "nope");
    assert_eq!(endpoint.seen()[0].method, Method::PUT);

    let plain = dlq
        .iter()
        .find(|e| e["messageId"] == direct["messageId"])
        .unwrap();
    assert_eq!(plain["method"], "POST");
    assert!(
        plain.get("queueName").is_none(),
        "no queue: the field is absent"
    );
    for e in &dlq {
        let nulls: Vec<&String> = e
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_null())
            .map(|(k, _)| k)
            .collect();
        assert!(nulls.is_empty(), "null fields {nulls:?}");
    }

    let dlq_id = entry["dlqId"].as_str().unwrap();
    let (status, one) = api.call(Method::GET, &format!("/v2/dlq/{dlq_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(&one, entry);
    // The adapter's reading of the same page.
    let page: DlqPage = serde_json::from_value(json!({ "messages": dlq })).unwrap();
    assert_eq!(page.messages.len(), 2);
}

#[tokio::test]
async fn dlq_entries_carry_binary_bodies_as_base64() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer {
        status: 500,
        headers: Vec::new(),
        body: vec![0xff, 0x00, 0xfe],
    })
    .await;
    let (status, _) = Api::send(
        api.request(Method::POST, &format!("/v2/publish/{}", endpoint.url))
            .header("upstash-retries", "0")
            .body(vec![0x80u8, 0x81]),
    )
    .await;
    assert_eq!(status, 200);
    wait_until("dead-lettered", || fake.dlq_message_ids().len() == 1).await;
    let entry = &api.dlq().await[0];
    assert_eq!(entry["bodyBase64"], "gIE=");
    assert!(entry.get("body").is_none());
    assert_eq!(entry["responseBodyBase64"], "/wD+");
    assert!(entry.get("responseBody").is_none());
}

#[tokio::test]
async fn bulk_dlq_retry_takes_repeated_or_comma_separated_ids() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    let ids = dead_letters(&api, &endpoint, 4).await;

    let (status, body) = api
        .call(
            Method::POST,
            &format!("/v2/dlq/retry?dlqIds={}&dlqIds=nope", ids[0]),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].is_string());
    assert_eq!(
        fake.dlq_message_ids().len(),
        4,
        "an unknown id retries none"
    );

    let (status, body) = api
        .call(
            Method::POST,
            &format!("/v2/dlq/retry?dlqIds={}&dlqIds={}", ids[0], ids[1]),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let responses = body["responses"].as_array().unwrap();
    assert_eq!(responses.len(), 2);
    for r in responses {
        assert!(r["messageId"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(r["url"], json!(endpoint.url));
        assert_eq!(r["deduplicated"], false);
    }
    assert_ne!(responses[0]["messageId"], responses[1]["messageId"]);

    let (status, body) = api
        .call(
            Method::POST,
            &format!("/v2/dlq/retry?dlqIds={},{}", ids[2], ids[3]),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["responses"].as_array().unwrap().len(), 2);
    assert!(fake.dlq_message_ids().is_empty());

    let retried: Vec<String> = fake
        .messages()
        .iter()
        .skip(4)
        .map(|m| m.message_id.clone())
        .collect();
    assert_eq!(retried.len(), 4);
    wait_until("every retry delivered", || {
        retried
            .iter()
            .all(|id| fake.message(id).unwrap().state == MessageState::Delivered)
    })
    .await;

    let (status, _) = api.call(Method::POST, "/v2/dlq/retry").await;
    assert_eq!(status, 400, "no ids: filters are not faked");
}

#[tokio::test]
async fn single_dlq_retry_answers_201_with_the_publish_answer() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    let ids = dead_letters(&api, &endpoint, 1).await;
    let (status, body) = api
        .call(Method::POST, &format!("/v2/dlq/retry/{}", ids[0]))
        .await;
    assert_eq!(status, 201);
    assert_eq!(body["url"], json!(endpoint.url));
    let id = id_of(&body);
    wait_until("the retry delivered", || {
        fake.message(&id).unwrap().state == MessageState::Delivered
    })
    .await;
    let (status, _) = api
        .call(Method::POST, &format!("/v2/dlq/retry/{}", ids[0]))
        .await;
    assert_eq!(status, 404, "gone from the DLQ");
}

#[tokio::test]
async fn bulk_dlq_delete_takes_ids_in_the_query_and_counts_what_it_deleted() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    let ids = dead_letters(&api, &endpoint, 3).await;

    let (status, body) = api
        .call(
            Method::DELETE,
            &format!("/v2/dlq?dlqIds={}&dlqIds={}&dlqIds=nope", ids[0], ids[1]),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({ "deleted": 2 }), "unknown ids are not counted");
    let (status, _) = api.call(Method::GET, &format!("/v2/dlq/{}", ids[0])).await;
    assert_eq!(status, 404);

    let (status, body) = Api::send(
        api.request(Method::DELETE, "/v2/dlq")
            .json(&json!({ "dlqIds": [ids[2]] })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({ "deleted": 1 }), "the older JSON body");
    assert!(fake.dlq_message_ids().is_empty());

    let (status, _) = api.call(Method::DELETE, "/v2/dlq").await;
    assert_eq!(status, 400, "no ids: filters are not faked");
}

#[tokio::test]
async fn content_based_deduplication_answers_like_id_based() {
    let fake = fake().await;
    fake.pause_deliveries(true);
    let api = Api::new(&fake);
    let dest = "http://127.0.0.1:9/hook";
    let content = [
        ("upstash-content-based-deduplication", "true"),
        ("content-type", "text/plain"),
    ];
    let (status, first) = api.publish(dest, &content, "same").await;
    assert_eq!(status, 200);
    assert_eq!(first["deduplicated"], false);
    let (status, again) = api.publish(dest, &content, "same").await;
    assert_eq!(status, 202);
    assert_eq!(again["messageId"], first["messageId"]);
    assert_eq!(again["deduplicated"], true);

    let (status, other_body) = api.publish(dest, &content, "other").await;
    assert_eq!(status, 200);
    assert_ne!(other_body["messageId"], first["messageId"]);
    let (status, _) = api
        .publish("http://127.0.0.1:9/elsewhere", &content, "same")
        .await;
    assert_eq!(status, 200, "another destination");
    let (status, _) = api
        .publish(dest, &[("content-type", "text/plain")], "same")
        .await;
    assert_eq!(status, 200, "without the header, no deduplication");
    let (status, _) = api
        .publish(
            dest,
            &[("upstash-content-based-deduplication", "maybe")],
            "same",
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(fake.messages().len(), 4);

    // The same answer as a repeated deduplication id.
    let by_id = [("upstash-deduplication-id", "k-1")];
    api.publish(dest, &by_id, "x").await;
    let (status, id_dup) = api.publish(dest, &by_id, "y").await;
    assert_eq!(status, 202);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&id_dup), keys(&again));
}

#[tokio::test]
async fn a_paused_queue_delivers_nothing_until_resumed() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    let (status, _) = Api::send(
        api.request(Method::POST, "/v2/queues")
            .json(&json!({ "queueName": "q-p", "parallelism": 1 })),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = api.call(Method::POST, "/v2/queues/q-p/pause").await;
    assert_eq!(status, 200);
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-p").await;
    assert_eq!(queue["paused"], true);

    for body in ["1", "2"] {
        let (status, _) = Api::send(
            api.request(Method::POST, &format!("/v2/enqueue/q-p/{}", endpoint.url))
                .body(body),
        )
        .await;
        assert_eq!(status, 200);
    }
    // A message outside the queue still goes: the dispatcher runs, the queue holds its own.
    api.publish(&endpoint.url, &[], "outside").await;
    wait_until("the message outside the queue", || {
        endpoint.seen().len() == 1
    })
    .await;
    assert!(fake.wait_idle(WAIT).await, "a paused queue is not due");
    assert_eq!(endpoint.seen().len(), 1);
    assert_eq!(endpoint.seen()[0].body, b"outside");
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-p").await;
    assert_eq!(queue["lag"], 2);
    let (_, list) = api.call(Method::GET, "/v2/queues").await;
    assert_eq!(list[0]["paused"], true);

    let (status, _) = api.call(Method::POST, "/v2/queues/q-p/resume").await;
    assert_eq!(status, 200);
    wait_until("the queue delivered", || endpoint.seen().len() == 3).await;
    let bodies: Vec<Vec<u8>> = endpoint.seen().iter().map(|s| s.body.clone()).collect();
    assert_eq!(bodies[1..], [b"1".to_vec(), b"2".to_vec()], "in order");
    assert!(fake.wait_idle(WAIT).await);
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-p").await;
    assert_eq!(queue["paused"], false);
    assert_eq!(queue["lag"], 0);

    let (status, _) = api.call(Method::POST, "/v2/queues/nope/pause").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_queue_upsert_sets_paused_when_it_says_so() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let upsert = |body: Value| Api::send(api.request(Method::POST, "/v2/queues").json(&body));
    // QStash's SDK sends `paused` on every upsert (`UpsertQueueRequest`).
    let (status, _) = upsert(json!({ "queueName": "q-u", "parallelism": 2, "paused": true })).await;
    assert_eq!(status, 200);
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-u").await;
    assert_eq!(
        (queue["paused"].clone(), queue["parallelism"].clone()),
        (json!(true), json!(2))
    );
    // Without `paused` (the REST reference's body) the state stays.
    upsert(json!({ "queueName": "q-u", "parallelism": 3 })).await;
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-u").await;
    assert_eq!(
        (queue["paused"].clone(), queue["parallelism"].clone()),
        (json!(true), json!(3))
    );
    upsert(json!({ "queueName": "q-u", "parallelism": 3, "paused": false })).await;
    let (_, queue) = api.call(Method::GET, "/v2/queues/q-u").await;
    assert_eq!(queue["paused"], false);
    let (status, _) = upsert(json!({ "queueName": "q-u", "paused": "yes" })).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn schedules_list_the_fields_of_qstash_schedule_type_and_pause() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    let before = now_ms(&fake);
    let (status, created) = Api::send(
        api.request(Method::POST, &format!("/v2/schedules/{}", endpoint.url))
            .header("upstash-cron", "*/5 * * * *")
            .header("upstash-schedule-id", "nightly")
            .header("content-type", "application/json")
            .header("upstash-method", "PUT")
            .header("upstash-retries", "2")
            .header("upstash-delay", "1m")
            .header("upstash-retry-delay", "1000 * retried")
            .header("upstash-forward-x-tenant", "acme")
            .body(r#"{"report":"daily"}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(created["scheduleId"], "nightly");

    let (status, schedule) = api.call(Method::GET, "/v2/schedules/nightly").await;
    assert_eq!(status, 200);
    let created_at = schedule["createdAt"].as_u64().expect("createdAt in ms");
    assert!(created_at >= before && created_at <= now_ms(&fake));
    assert_eq!(schedule["cron"], "*/5 * * * *");
    assert_eq!(schedule["destination"], json!(endpoint.url));
    assert_eq!(schedule["method"], "PUT");
    assert_eq!(schedule["isPaused"], false);
    assert_eq!(
        schedule["header"],
        json!({ "Content-Type": ["application/json"], "X-Tenant": ["acme"] })
    );
    assert_eq!(schedule["body"], r#"{"report":"daily"}"#);
    assert_eq!(schedule["retries"], 2);
    assert_eq!(schedule["delay"], 60);
    assert_eq!(schedule["retryDelayExpression"], "1000 * retried");
    let (_, list) = api.call(Method::GET, "/v2/schedules").await;
    assert_eq!(list, json!([schedule]));

    // The reference says POST, QStash's SDK sends PATCH: both pause and resume.
    let (status, _) = api.call(Method::PATCH, "/v2/schedules/nightly/pause").await;
    assert_eq!(status, 200);
    let (_, paused) = api.call(Method::GET, "/v2/schedules/nightly").await;
    assert_eq!(paused["isPaused"], true);
    assert_eq!(
        fake.fire_schedule("nightly"),
        None,
        "a paused cron is ignored"
    );
    // An upsert keeps the creation time and the pause.
    Api::send(
        api.request(Method::POST, &format!("/v2/schedules/{}", endpoint.url))
            .header("upstash-cron", "0 * * * *")
            .header("upstash-schedule-id", "nightly"),
    )
    .await;
    let (_, updated) = api.call(Method::GET, "/v2/schedules/nightly").await;
    assert_eq!(
        (
            updated["cron"].clone(),
            updated["isPaused"].clone(),
            updated["createdAt"].clone()
        ),
        (json!("0 * * * *"), json!(true), json!(created_at))
    );
    assert_eq!(
        (updated["method"].clone(), updated["retries"].clone()),
        (json!("POST"), json!(3))
    );
    let (status, _) = api.call(Method::POST, "/v2/schedules/nightly/resume").await;
    assert_eq!(status, 200);
    let (_, resumed) = api.call(Method::GET, "/v2/schedules/nightly").await;
    assert_eq!(resumed["isPaused"], false);
    assert!(fake.fire_schedule("nightly").is_some());

    let (status, _) = api.call(Method::POST, "/v2/schedules/nope/pause").await;
    assert_eq!(status, 404);
    let (status, _) = api.call(Method::GET, "/v2/schedules/nightly/pause").await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn the_publish_answer_names_the_destination() {
    let fake = fake().await;
    fake.pause_deliveries(true);
    let api = Api::new(&fake);
    let dest = "http://127.0.0.1:9/hook?tenant=t-1";
    let (status, published) = api.publish(dest, &[], "x").await;
    assert_eq!(status, 200);
    assert_eq!(published["url"], dest);
    assert!(id_of(&published).starts_with("msg_"));
    assert_eq!(published["deduplicated"], false);

    let (_, enqueued) = api
        .call(Method::POST, "/v2/enqueue/q-1/http://127.0.0.1:9/q")
        .await;
    assert_eq!(enqueued["url"], "http://127.0.0.1:9/q");

    let (_, batch) = Api::send(
        api.request(Method::POST, "/v2/batch")
            .json(&json!([{ "destination": "http://127.0.0.1:9/b", "body": "1" }])),
    )
    .await;
    assert_eq!(batch[0]["url"], "http://127.0.0.1:9/b");
}

#[tokio::test]
async fn a_delivery_signed_with_the_next_key_verifies_after_a_rotation() {
    let fake = fake().await;
    fake.sign_with_next_key(true);
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(200)).await;
    api.publish(&endpoint.url, &[], r#"{"rotated":true}"#).await;
    wait_until("delivered", || endpoint.seen().len() == 1).await;
    let seen = &endpoint.seen()[0];
    let signature = seen.header("upstash-signature");
    let keys = SigningKeys::new(fake.current_signing_key(), fake.next_signing_key());
    let verified = verify_signature(
        signature,
        Some(&endpoint.url),
        &seen.body,
        fake.now(),
        &keys,
        Duration::ZERO,
    )
    .expect("the next key verifies");
    assert_eq!(verified.key, KeyUsed::Next);
    let current_only = SigningKeys::new(fake.current_signing_key(), fake.current_signing_key());
    assert_eq!(
        verify_signature(
            signature,
            Some(&endpoint.url),
            &seen.body,
            fake.now(),
            &current_only,
            Duration::ZERO,
        ),
        Err(SignatureError::BadSignature),
        "signed by the next key, not the current one"
    );
}

#[tokio::test]
async fn retry_delay_expressions_decide_when_retries_come() {
    // Real delays on the fake's clock, moved by `advance`: nothing waits in real time.
    let fake = FakeQStash::start().await.unwrap();
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer::status(500)).await;
    let (_, with_expr) = api
        .publish(
            &endpoint.url,
            &[
                ("upstash-retries", "2"),
                ("upstash-retry-delay", "60000 * (1 + retried)"),
            ],
            "expr",
        )
        .await;
    let (_, default) = api
        .publish(&endpoint.url, &[("upstash-retries", "1")], "default")
        .await;
    let (with_expr, default) = (id_of(&with_expr), id_of(&default));
    let attempts_of = |id: &str| {
        fake.attempts()
            .into_iter()
            .filter(|a| a.message_id == id)
            .collect::<Vec<_>>()
    };
    wait_until("both first attempts", || {
        attempts_of(&with_expr).len() == 1 && attempts_of(&default).len() == 1
    })
    .await;
    assert_eq!(
        attempts_of(&with_expr)[0].next_delay,
        Some(Duration::from_secs(60)),
        "the expression at retried = 0"
    );
    assert_eq!(
        attempts_of(&default)[0].next_delay.map(|d| d.as_secs()),
        Some(12),
        "the default backoff, e^2.5 s"
    );

    fake.advance(Duration::from_secs(13));
    wait_until("the default retry", || attempts_of(&default).len() == 2).await;
    let waiting = fake.message(&with_expr).unwrap();
    assert_eq!(waiting.state, MessageState::Pending);
    assert!(waiting.not_before > fake.now(), "its retry is still ahead");
    assert_eq!(attempts_of(&with_expr).len(), 1);

    fake.advance(Duration::from_secs(60));
    wait_until("the expression's first retry", || {
        attempts_of(&with_expr).len() == 2
    })
    .await;
    assert_eq!(
        attempts_of(&with_expr)[1].next_delay,
        Some(Duration::from_secs(120)),
        "the expression at retried = 1"
    );
    fake.advance(Duration::from_secs(120));
    wait_until("the last retry", || {
        fake.message(&with_expr).unwrap().state == MessageState::Failed
    })
    .await;
    let retried: Vec<String> = endpoint
        .seen()
        .iter()
        .filter(|s| s.body == b"expr")
        .map(|s| s.header("upstash-retried").to_owned())
        .collect();
    assert_eq!(retried, ["0", "1", "2"]);
}

#[tokio::test]
async fn a_non_retryable_489_goes_straight_to_the_dlq() {
    let fake = fake().await;
    let api = Api::new(&fake);
    let endpoint = Endpoint::start(Answer {
        status: 489,
        headers: vec![("upstash-nonretryable-error", "true")],
        body: b"bad payload".to_vec(),
    })
    .await;
    let (_, published) = api
        .publish(&endpoint.url, &[("upstash-retries", "3")], "x")
        .await;
    let id = id_of(&published);
    wait_until("dead-lettered", || fake.dlq_message_ids() == [id.clone()]).await;
    assert_eq!(fake.message(&id).unwrap().state, MessageState::Failed);
    let attempts = fake.attempts();
    assert_eq!(attempts.len(), 1, "no retry");
    assert_eq!(attempts[0].next_delay, None);
    assert_eq!(endpoint.seen().len(), 1);
    let entry = &api.dlq().await[0];
    assert_eq!(entry["responseStatus"], 489);
    assert_eq!(
        entry["responseHeader"]["Upstash-Nonretryable-Error"],
        json!(["true"])
    );
    assert_eq!(entry["responseBody"], "bad payload");

    // Without the header a 489 is an ordinary failure.
    let plain = Endpoint::start(Answer::status(489)).await;
    let (_, published) = api
        .publish(&plain.url, &[("upstash-retries", "1")], "y")
        .await;
    let id = id_of(&published);
    wait_until("retried, then dead-lettered", || {
        fake.message(&id).unwrap().state == MessageState::Failed
    })
    .await;
    assert_eq!(plain.seen().len(), 2);
}

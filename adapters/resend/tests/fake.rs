//! The wire behaviour of `jobs_testkit::fakes::resend::FakeResend`, checked with a plain HTTP
//! client, so that the provider's tests rest on a fake that answers like Resend.

use jobs_testkit::fakes::resend::FakeResend;
use reqwest::StatusCode;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn email() -> Value {
    json!({"from": "a@acme.test", "to": "b@example.test", "subject": "Hi", "text": "Hello"})
}

async fn post(
    fake: &FakeResend,
    path: &str,
    key: Option<&str>,
    user_agent: Option<&str>,
    body: &Value,
) -> Result<(StatusCode, reqwest::header::HeaderMap, Value), reqwest::Error> {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", fake.base_url()))
        .json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(user_agent) = user_agent {
        request = request.header(reqwest::header::USER_AGENT, user_agent);
    }
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    Ok((status, headers, response.json().await?))
}

#[tokio::test]
async fn credentials_and_user_agent_are_required() -> TestResult {
    let fake = FakeResend::start().await?;
    let batch = json!([email()]);

    let (status, _, body) = post(&fake, "/emails/batch", None, Some("t/1"), &batch).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["name"], "missing_api_key");
    assert_eq!(body["statusCode"], 401);

    let (status, _, body) =
        post(&fake, "/emails/batch", Some("re_no"), Some("t/1"), &batch).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["name"], "invalid_api_key");

    let (status, _, body) =
        post(&fake, "/emails/batch", Some(fake.api_key()), None, &batch).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["name"], "validation_error");

    let (status, headers, body) = post(
        &fake,
        "/emails/batch",
        Some(fake.api_key()),
        Some("t/1"),
        &batch,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"].as_array().map(Vec::len), Some(1));
    assert!(headers.contains_key("ratelimit-limit"));
    assert_eq!(fake.sent(), [email()]);
    Ok(())
}

#[tokio::test]
async fn batches_hold_1_to_100_emails_with_the_required_fields() -> TestResult {
    let fake = FakeResend::start().await?;
    let key = Some(fake.api_key().to_owned());
    let key = key.as_deref();
    for body in [json!([]), json!(vec![email(); 101]), json!(email())] {
        let (status, _, answer) = post(&fake, "/emails/batch", key, Some("t/1"), &body).await?;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["name"], "validation_error");
    }
    let (status, _, answer) = post(
        &fake,
        "/emails/batch",
        key,
        Some("t/1"),
        &json!([email(), {"from": "a@acme.test", "to": "b@example.test"}]),
    )
    .await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer["name"], "missing_required_field");
    let (status, _, _) = post(
        &fake,
        "/emails/batch",
        key,
        Some("t/1"),
        &json!(vec![email(); 100]),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fake.sent().len(), 100);
    Ok(())
}

#[tokio::test]
async fn rate_limits_carry_retry_after_and_ratelimit_headers() -> TestResult {
    let fake = FakeResend::start().await?;
    fake.rate_limit_next(2, 3);
    let key = Some(fake.api_key().to_owned());
    for _ in 0..2 {
        let (status, headers, body) = post(
            &fake,
            "/emails/batch",
            key.as_deref(),
            Some("t/1"),
            &json!([email()]),
        )
        .await?;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body["name"], "rate_limit_exceeded");
        assert_eq!(
            headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("3")
        );
        assert_eq!(
            headers
                .get("ratelimit-remaining")
                .and_then(|v| v.to_str().ok()),
            Some("0")
        );
    }
    let (status, _, _) = post(
        &fake,
        "/emails/batch",
        key.as_deref(),
        Some("t/1"),
        &json!([email()]),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn audiences_and_contacts_are_404_but_recorded() -> TestResult {
    let fake = FakeResend::start().await?;
    let key = Some(fake.api_key().to_owned());
    for path in ["/audiences", "/audiences/a1/contacts", "/contacts"] {
        let (status, _, body) = post(&fake, path, key.as_deref(), Some("t/1"), &json!({})).await?;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["name"], "not_found");
    }
    assert_eq!(
        fake.paths(),
        ["/audiences", "/audiences/a1/contacts", "/contacts"]
    );
    assert!(fake.sent().is_empty());
    Ok(())
}

async fn post_keyed(fake: &FakeResend, key: &str) -> Result<(StatusCode, Value), reqwest::Error> {
    let response = reqwest::Client::new()
        .post(format!("{}/emails/batch", fake.base_url()))
        .bearer_auth(fake.api_key())
        .header(reqwest::header::USER_AGENT, "t/1")
        .header("idempotency-key", key)
        .json(&json!([email()]))
        .send()
        .await?;
    let status = response.status();
    Ok((status, response.json().await?))
}

#[tokio::test]
async fn a_lost_answer_has_sent_and_its_retry_is_a_replay() -> TestResult {
    let fake = FakeResend::start().await?;
    fake.lose_answer_next(1);
    let (status, body) = post_keyed(&fake, "blast-0").await?;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(
        fake.sent().len(),
        1,
        "the batch was sent before the answer was lost"
    );
    let (status, body) = post_keyed(&fake, "blast-0").await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(fake.sent().len(), 1, "the retry sent nothing again");
    assert_eq!(fake.batch_request_times().len(), 2);
    Ok(())
}

#[tokio::test]
async fn an_enforced_rate_answers_429_beyond_the_limit() -> TestResult {
    let fake = FakeResend::start().await?;
    fake.limit_rate(2, std::time::Duration::from_secs(3600));
    for key in ["a", "b"] {
        assert_eq!(post_keyed(&fake, key).await?.0, StatusCode::OK);
    }
    let (status, body) = post_keyed(&fake, "c").await?;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["name"], "rate_limit_exceeded");
    assert_eq!(fake.rate_limited(), 1);
    assert_eq!(fake.sent().len(), 2);
    Ok(())
}

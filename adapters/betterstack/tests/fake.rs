//! The wire behaviour of `jobs_testkit::fakes::FakeBetterStack`, checked with a plain HTTP
//! client, so that the alerter's tests rest on a fake that answers like BetterStack.

use jobs_testkit::fakes::FakeBetterStack;
use reqwest::StatusCode;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn incident() -> Value {
    json!({
        "requester_email": "oncall@example.com",
        "summary": "Test incident",
        "description": "No need to worry, this is a test.",
        "email": true,
        "metadata": {"queue": "billing.invoices"},
    })
}

async fn post(
    fake: &FakeBetterStack,
    path: &str,
    token: &str,
    body: &Value,
) -> Result<(StatusCode, Option<String>, Value), reqwest::Error> {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", fake.base_url()))
        .bearer_auth(token)
        .json(body)
        .send()
        .await?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    Ok((status, retry_after, response.json().await?))
}

#[tokio::test]
async fn creates_incidents_on_v3_and_v2_with_json_api_answers() -> TestResult {
    let fake = FakeBetterStack::start().await?;

    let (status, _, first) = post(&fake, "/api/v3/incidents", fake.token(), &incident()).await?;
    let (status_v2, _, second) =
        post(&fake, "/api/v2/incidents", fake.token(), &incident()).await?;

    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(status_v2, StatusCode::CREATED);
    assert_eq!(first["data"]["id"], "1");
    assert_eq!(second["data"]["id"], "2");
    assert_eq!(first["data"]["type"], "incident");
    let attributes = &first["data"]["attributes"];
    assert_eq!(
        attributes["name"], "Test incident",
        "name defaults to the summary"
    );
    assert_eq!(attributes["summary"], "Test incident");
    assert_eq!(
        attributes["description"],
        "No need to worry, this is a test."
    );
    assert_eq!(attributes["status"], "Started");
    assert_eq!(attributes["email"], true);
    assert_eq!(attributes["call"], false);
    assert_eq!(attributes["metadata"]["queue"], "billing.invoices");
    let started_at = attributes["started_at"].as_str().unwrap_or_default();
    assert_eq!(
        started_at.len(),
        "2020-03-09T17:37:56.662Z".len(),
        "{started_at}"
    );
    assert!(started_at.ends_with('Z'), "{started_at}");
    assert_eq!(fake.incidents(), vec![incident(), incident()]);
    Ok(())
}

#[tokio::test]
async fn refuses_a_wrong_or_missing_token() -> TestResult {
    let fake = FakeBetterStack::start_with_token("the-token").await?;
    assert_eq!(fake.token(), "the-token");

    let (status, _, body) = post(&fake, "/api/v3/incidents", "other", &incident()).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["errors"].is_string(), "{body}");

    let response = reqwest::Client::new()
        .post(format!("{}/api/v3/incidents", fake.base_url()))
        .json(&incident())
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(fake.incidents().is_empty());
    Ok(())
}

#[tokio::test]
async fn requires_summary_and_requester_email() -> TestResult {
    let fake = FakeBetterStack::start().await?;

    let (status, _, body) = post(&fake, "/api/v3/incidents", fake.token(), &json!({})).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let errors = body["errors"].as_str().unwrap_or_default();
    assert!(errors.contains("summary"), "{errors}");
    assert!(errors.contains("requester_email"), "{errors}");

    let blank = json!({"summary": " ", "requester_email": "oncall@example.com"});
    let (status, _, _) = post(&fake, "/api/v3/incidents", fake.token(), &blank).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let (status, _, _) = post(&fake, "/api/v3/incidents", fake.token(), &json!([1])).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(fake.incidents().is_empty());
    Ok(())
}

#[tokio::test]
async fn injected_faults_last_for_the_next_n_requests() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    fake.fail_next(429, 2);

    for _ in 0..2 {
        let (status, retry_after, body) =
            post(&fake, "/api/v3/incidents", fake.token(), &incident()).await?;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert!(body["errors"].is_string(), "{body}");
    }
    let (status, _, _) = post(&fake, "/api/v3/incidents", fake.token(), &incident()).await?;
    assert_eq!(status, StatusCode::CREATED);

    fake.fail_next(503, 1);
    fake.fail_next(503, 0);
    let (status, _, _) = post(&fake, "/api/v3/incidents", fake.token(), &incident()).await?;
    assert_eq!(status, StatusCode::CREATED, "n = 0 clears the fault");
    assert_eq!(fake.incidents().len(), 2);
    Ok(())
}

#[tokio::test]
async fn stops_serving_after_shutdown() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let url = format!("{}/api/v3/incidents", fake.base_url());
    let token = fake.token().to_owned();

    fake.shutdown().await;

    let result = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .json(&incident())
        .send()
        .await;
    assert!(result.is_err(), "{result:?}");
    Ok(())
}

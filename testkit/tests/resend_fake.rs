//! The Resend fake answers as Resend documents: address and attachment validation, the two
//! batch validation modes, the rate it advertises, and the served fake's control endpoints.
//! Every check talks HTTP to the fake, in process or served by `jobs-fakes resend`.

use std::process::Stdio;
use std::time::Duration;

use jobs_testkit::fakes::resend::FakeResend;
use reqwest::header::HeaderMap;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Only guards against a hang; no assertion depends on how long anything takes.
const HANG_GUARD: Duration = Duration::from_secs(30);

fn email(n: usize) -> Value {
    json!({
        "from": "Acme <billing@acme.test>",
        "to": [format!("customer{n}@example.test")],
        "subject": format!("Invoice {n}"),
        "text": "Hello",
    })
}

/// `email(n)` with `field` set to `value`.
fn email_with(n: usize, field: &str, value: Value) -> Value {
    let mut email = email(n);
    email[field] = value;
    email
}

/// Where a fake listens and the key it accepts.
struct Target {
    base_url: String,
    api_key: String,
}

impl From<&FakeResend> for Target {
    fn from(fake: &FakeResend) -> Self {
        Target {
            base_url: fake.base_url().to_owned(),
            api_key: fake.api_key().to_owned(),
        }
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// `POST /emails/batch` with the right key and a user agent, and `x-batch-validation: mode`
/// when given.
async fn post_batch(
    client: &Client,
    target: &Target,
    mode: Option<&str>,
    body: &Value,
) -> Result<Answer, reqwest::Error> {
    let mut request = client
        .post(format!("{}/emails/batch", target.base_url))
        .bearer_auth(&target.api_key)
        .header(reqwest::header::USER_AGENT, "resend-fake-test/1")
        .json(body);
    if let Some(mode) = mode {
        request = request.header("x-batch-validation", mode);
    }
    answer(request.send().await?).await
}

async fn answer(response: reqwest::Response) -> Result<Answer, reqwest::Error> {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// `POST <base>/_fake/<endpoint>` with a JSON body.
async fn control(
    client: &Client,
    target: &Target,
    endpoint: &str,
    body: &Value,
) -> Result<Answer, reqwest::Error> {
    let response = client
        .post(format!("{}/_fake/{endpoint}", target.base_url))
        .json(body)
        .send()
        .await?;
    answer(response).await
}

/// `jobs-fakes resend` with `args`, killed when dropped.
struct Served {
    target: Target,
    _child: Child,
}

/// Starts `jobs-fakes resend <args>` on a free port and reads the base URL and API key it
/// prints; its output is then drained until it exits, so that no print finds a closed pipe.
async fn serve(args: &[&str]) -> Result<Served, Box<dyn std::error::Error>> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_jobs-fakes"))
        .arg("resend")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let (mut base_url, mut api_key) = (None, None);
    let read = async {
        // The banner ends with "Ctrl-C to stop.", printed once the fake serves.
        while let Some(line) = lines.next_line().await? {
            let line = line.trim();
            if let Some(url) = line.strip_prefix("base URL:") {
                base_url = Some(url.trim().to_owned());
            } else if let Some(key) = line.strip_prefix("API key:") {
                api_key = Some(key.trim().to_owned());
            } else if line.starts_with("Ctrl-C") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(HANG_GUARD, read).await??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Served {
        target: Target {
            base_url: base_url.ok_or("the fake printed no base URL")?,
            api_key: api_key.ok_or("the fake printed no API key")?,
        },
        _child: child,
    })
}

#[tokio::test]
async fn bad_addresses_are_422_naming_the_email_and_the_field() -> TestResult {
    let fake = FakeResend::start().await?;
    let target = Target::from(&fake);
    let client = Client::new();
    let cases = [
        ("from", json!("billing.acme.test"), "`from`"),
        ("from", json!("Acme billing@acme.test"), "`from`"),
        ("to", json!("customer@example"), "`to`"),
        (
            "to",
            json!(["ok@example.test", "not an address"]),
            "`to[1]`",
        ),
        ("cc", json!(["a@@example.test"]), "`cc[0]`"),
        ("bcc", json!("Name <@example.test>"), "`bcc`"),
        (
            "reply_to",
            json!(["ok@example.test", "x@"]),
            "`reply_to[1]`",
        ),
        ("reply_to", json!(42), "`reply_to`"),
    ];
    for (field, value, named) in cases {
        let batch = json!([email(0), email_with(1, field, value.clone())]);
        let answer = post_batch(&client, &target, None, &batch).await?;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field} = {value}"
        );
        assert_eq!(answer.body["statusCode"], 422);
        assert_eq!(answer.body["name"], "validation_error", "{}", answer.body);
        let message = answer.message();
        assert!(message.contains("emails[1]"), "{message}");
        assert!(message.contains(named), "{message}");
    }
    assert!(fake.sent().is_empty(), "{:?}", fake.sent());

    let good = json!([{
        "from": "billing@acme.test",
        "to": "Customer <customer@example.test>",
        "cc": ["\"Doe, Jane\" <jane@example.test>", "ops@mail.acme.test"],
        "bcc": "audit@acme.test",
        "reply_to": ["Support <support@acme.test>"],
        "subject": "Hi",
    }]);
    let answer = post_batch(&client, &target, None, &good).await?;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(fake.sent().len(), 1);
    Ok(())
}

#[tokio::test]
async fn attachments_are_refused_by_the_batch_endpoint() -> TestResult {
    let fake = FakeResend::start().await?;
    let target = Target::from(&fake);
    let client = Client::new();
    let attachment = json!([{"filename": "invoice.pdf", "content": "JVBERi0="}]);
    let batch = json!([email(0), email_with(1, "attachments", attachment)]);

    let answer = post_batch(&client, &target, Some("strict"), &batch).await?;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer.body["name"], "validation_error");
    assert!(answer.message().contains("attachments"), "{}", answer.body);
    assert!(answer.message().contains("emails[1]"), "{}", answer.body);
    assert!(fake.sent().is_empty());

    // Permissive: the email with attachments is the one refused.
    let answer = post_batch(&client, &target, Some("permissive"), &batch).await?;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["errors"][0]["index"], 1);
    assert!(
        answer.body["errors"][0]["message"]
            .as_str()
            .is_some_and(|message| message.contains("attachments")),
        "{}",
        answer.body
    );
    assert_eq!(fake.sent(), [email(0)]);
    Ok(())
}

#[tokio::test]
async fn strict_mode_refuses_the_whole_batch_with_or_without_the_header() -> TestResult {
    let fake = FakeResend::start().await?;
    let target = Target::from(&fake);
    let client = Client::new();
    let batch = json!([email(0), email_with(1, "to", json!("nobody")), email(2)]);
    for mode in [None, Some("strict")] {
        let answer = post_batch(&client, &target, mode, &batch).await?;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{mode:?}");
        assert_eq!(answer.body["name"], "validation_error");
        assert!(answer.message().contains("emails[1]"), "{}", answer.body);
        assert!(answer.body.get("errors").is_none(), "{}", answer.body);
    }
    let answer = post_batch(&client, &target, Some("lenient"), &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        answer.message().contains("x-batch-validation"),
        "{}",
        answer.body
    );
    assert!(fake.sent().is_empty());

    let answer = post_batch(&client, &target, Some("strict"), &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.get("errors").is_none(), "{}", answer.body);
    Ok(())
}

#[tokio::test]
async fn permissive_mode_sends_the_valid_emails_and_lists_the_others() -> TestResult {
    let fake = FakeResend::start().await?;
    let target = Target::from(&fake);
    let client = Client::new();
    let mut no_subject = email(3);
    no_subject
        .as_object_mut()
        .ok_or("an object")?
        .remove("subject");
    let batch = json!([
        email(0),
        email_with(1, "cc", json!(["not-an-address"])),
        email(2),
        no_subject,
    ]);

    let answer = post_batch(&client, &target, Some("permissive"), &batch).await?;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let data = answer.body["data"].as_array().ok_or("data")?;
    let errors = answer.body["errors"].as_array().ok_or("errors")?;
    assert_eq!(data.len(), 2, "{}", answer.body);
    let indices: Vec<&Value> = errors.iter().map(|error| &error["index"]).collect();
    assert_eq!(indices, [&json!(1), &json!(3)]);
    assert!(
        errors[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`cc[0]`"))
    );
    assert!(
        errors[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("subject"))
    );
    assert_eq!(fake.sent(), [email(0), email(2)]);
    let batches = fake.batches();
    let ids: Vec<&str> = data.iter().filter_map(|d| d["id"].as_str()).collect();
    assert_eq!(ids, batches[0].ids);
    let refused: Vec<usize> = batches[0].refused.iter().map(|(index, _)| *index).collect();
    assert_eq!(refused, [1, 3]);

    // All valid: `errors` is present and empty.
    let answer = post_batch(&client, &target, Some("permissive"), &json!([email(4)])).await?;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["errors"], json!([]));
    Ok(())
}

#[tokio::test]
async fn a_permissive_replay_answers_the_same_data_and_errors() -> TestResult {
    let fake = FakeResend::start().await?;
    let client = Client::new();
    let batch = json!([email(0), email_with(1, "to", json!("nobody"))]);
    let send = || async {
        let response = client
            .post(format!("{}/emails/batch", fake.base_url()))
            .bearer_auth(fake.api_key())
            .header(reqwest::header::USER_AGENT, "resend-fake-test/1")
            .header("x-batch-validation", "permissive")
            .header("idempotency-key", "blast-1-0")
            .json(&batch)
            .send()
            .await?;
        answer(response).await
    };
    let first = send().await?;
    let second = send().await?;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(first.body, second.body);
    assert_eq!(fake.sent(), [email(0)]);
    Ok(())
}

#[tokio::test]
async fn ratelimit_headers_count_down_and_a_full_window_is_429() -> TestResult {
    let fake = FakeResend::start().await?;
    fake.limit_rate(3, Duration::from_secs(3600));
    let target = Target::from(&fake);
    let client = Client::new();
    for remaining in ["2", "1", "0"] {
        let answer = post_batch(&client, &target, None, &json!([email(0)])).await?;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.header("ratelimit-limit"), Some("3"));
        assert_eq!(answer.header("ratelimit-remaining"), Some(remaining));
        let reset: u64 = answer.header("ratelimit-reset").ok_or("reset")?.parse()?;
        assert!(reset >= 1);
    }
    let answer = post_batch(&client, &target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.body["name"], "rate_limit_exceeded");
    assert_eq!(answer.body["statusCode"], 429);
    assert_eq!(answer.header("ratelimit-remaining"), Some("0"));
    let retry_after: u64 = answer.header("retry-after").ok_or("retry-after")?.parse()?;
    assert!(retry_after >= 1);
    assert_eq!(fake.sent().len(), 3);

    // Unenforced (the default), the headers still count against Resend's 5 per second.
    let fake = FakeResend::start().await?;
    let answer = post_batch(&client, &Target::from(&fake), None, &json!([email(0)])).await?;
    assert_eq!(answer.header("ratelimit-limit"), Some("5"));
    assert!(answer.header("ratelimit-remaining").is_some());
    Ok(())
}

#[tokio::test]
async fn a_window_admits_again_once_its_requests_have_left_it() -> TestResult {
    let fake = FakeResend::start().await?;
    let window = Duration::from_millis(300);
    fake.limit_rate(1, window);
    let target = Target::from(&fake);
    let client = Client::new();
    let answer = post_batch(&client, &target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("ratelimit-remaining"), Some("0"));
    let answer = post_batch(&client, &target, None, &json!([email(1)])).await?;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);

    tokio::time::sleep(window + Duration::from_millis(50)).await;
    let answer = post_batch(&client, &target, None, &json!([email(2)])).await?;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(fake.sent(), [email(0), email(2)]);
    Ok(())
}

#[tokio::test]
async fn a_dropped_answer_is_recorded_and_the_fake_still_stops() -> TestResult {
    let fake = FakeResend::start().await?;
    let target = Target::from(&fake);
    fake.drop_answer_next(1);

    // A client that gives up: the emails were sent all the same.
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()?;
    let gave_up = post_batch(&impatient, &target, None, &json!([email(0)])).await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(fake.sent(), [email(0)]);
    let answer = post_batch(&impatient, &target, None, &json!([email(1)])).await?;
    assert_eq!(answer.status, StatusCode::OK);

    // A client that waits forever does not keep the fake from stopping.
    fake.drop_answer_next(1);
    let patient = Client::new();
    let waiting = tokio::spawn(async move {
        post_batch(&patient, &target, None, &json!([email(2)]))
            .await
            .map(|answer| answer.status)
    });
    tokio::time::timeout(HANG_GUARD, async {
        while fake.sent().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    assert!(!waiting.is_finished());
    tokio::time::timeout(HANG_GUARD, fake.shutdown()).await?;
    let outcome = tokio::time::timeout(HANG_GUARD, waiting).await??;
    assert!(
        outcome
            .as_ref()
            .map_or(true, |status| *status != StatusCode::OK),
        "{outcome:?}"
    );
    Ok(())
}

#[tokio::test]
async fn control_endpoints_are_off_unless_enabled() -> TestResult {
    let fake = FakeResend::start().await?;
    let client = Client::new();
    let target = Target::from(&fake);
    let answer = control(&client, &target, "fail-next", &json!({"status": 500})).await?;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(fake.paths(), ["/_fake/fail-next"]);
    let answer = post_batch(&client, &target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::OK);

    fake.enable_control();
    let answer = control(&client, &target, "fail-next", &json!({"status": 500})).await?;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(fake.paths().len(), 2, "control requests are not recorded");
    for (body, status) in [
        (json!({"status": 200}), StatusCode::UNPROCESSABLE_ENTITY),
        (json!({"status": "500"}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"status": 500, "count": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!([1]), StatusCode::BAD_REQUEST),
    ] {
        let answer = control(&client, &target, "fail-next", &body).await?;
        assert_eq!(answer.status, status, "{body}");
        assert_eq!(answer.body["name"], "validation_error");
    }
    let answer = control(&client, &target, "nothing-here", &json!({})).await?;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.body["name"], "not_found");
    Ok(())
}

#[tokio::test]
async fn the_served_fake_enforces_five_requests_per_second_by_default() -> TestResult {
    let served = serve(&[]).await?;
    let client = Client::new();
    for remaining in ["4", "3", "2", "1", "0"] {
        let answer = post_batch(&client, &served.target, None, &json!([email(0)])).await?;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        assert_eq!(answer.header("ratelimit-limit"), Some("5"));
        assert_eq!(answer.header("ratelimit-remaining"), Some(remaining));
        assert_eq!(answer.header("ratelimit-reset"), Some("1"));
    }
    let answer = post_batch(&client, &served.target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.body["name"], "rate_limit_exceeded");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.header("ratelimit-remaining"), Some("0"));
    Ok(())
}

#[tokio::test]
async fn the_served_rate_limit_can_be_changed_or_turned_off() -> TestResult {
    let client = Client::new();
    let off = serve(&["--rate-limit", "0"]).await?;
    for _ in 0..8 {
        let answer = post_batch(&client, &off.target, None, &json!([email(0)])).await?;
        assert_eq!(answer.status, StatusCode::OK);
    }

    let two = serve(&["--rate-limit", "2"]).await?;
    let statuses = [
        post_batch(&client, &two.target, None, &json!([email(0)])).await?,
        post_batch(&client, &two.target, None, &json!([email(1)])).await?,
        post_batch(&client, &two.target, None, &json!([email(2)])).await?,
    ]
    .map(|answer| {
        (
            answer.status,
            answer.header("ratelimit-limit").map(str::to_owned),
        )
    });
    let two_per_second = Some("2".to_owned());
    assert_eq!(
        statuses,
        [
            (StatusCode::OK, two_per_second.clone()),
            (StatusCode::OK, two_per_second.clone()),
            (StatusCode::TOO_MANY_REQUESTS, two_per_second),
        ]
    );

    for args in [
        &["--rate-limit", "many"][..],
        &["--rate-limit"][..],
        &["--port", "0", "--rate-limit", "-1"][..],
    ] {
        let status = Command::new(env!("CARGO_BIN_EXE_jobs-fakes"))
            .arg("resend")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await?;
        assert_eq!(status.code(), Some(2), "{args:?}");
    }
    let status = Command::new(env!("CARGO_BIN_EXE_jobs-fakes"))
        .args(["betterstack", "--rate-limit", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    assert_eq!(status.code(), Some(2));
    Ok(())
}

#[tokio::test]
async fn the_served_fake_fails_the_next_requests_on_request() -> TestResult {
    let served = serve(&["--rate-limit", "0"]).await?;
    let target = &served.target;
    let client = Client::new();

    let armed = control(
        &client,
        target,
        "fail-next",
        &json!({"status": 503, "count": 2}),
    )
    .await?;
    assert_eq!(armed.status, StatusCode::OK, "{}", armed.body);
    for _ in 0..2 {
        let answer = post_batch(&client, target, None, &json!([email(0)])).await?;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.body["statusCode"], 503);
        assert_eq!(answer.body["name"], "internal_server_error");
        assert!(answer.header("ratelimit-limit").is_some());
    }

    let armed = control(
        &client,
        target,
        "fail-next",
        &json!({"status": 429, "count": 1, "retry_after": 4}),
    )
    .await?;
    assert_eq!(armed.status, StatusCode::OK);
    let answer = post_batch(&client, target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.body["name"], "rate_limit_exceeded");
    assert_eq!(answer.header("retry-after"), Some("4"));

    control(&client, target, "fail-next", &json!({"status": 500})).await?;
    let answer = post_batch(&client, target, None, &json!([email(0)])).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.body["name"], "internal_server_error");

    let answer = post_batch(&client, target, None, &json!([email(1)])).await?;
    assert_eq!(answer.status, StatusCode::OK);
    let sent = client
        .get(format!("{}/_fake/sent", target.base_url))
        .send()
        .await?
        .json::<Value>()
        .await?;
    assert_eq!(sent, json!({"data": [email(1)]}));
    Ok(())
}

#[tokio::test]
async fn the_served_fake_records_but_never_answers_dropped_requests() -> TestResult {
    let served = serve(&["--rate-limit", "0"]).await?;
    let target = &served.target;
    let client = Client::new();

    let armed = control(&client, target, "drop-next", &json!({"count": 1})).await?;
    assert_eq!(armed.status, StatusCode::OK, "{}", armed.body);
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()?;
    let gave_up = post_batch(&impatient, target, None, &json!([email(0)])).await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));

    let answer = post_batch(&client, target, None, &json!([email(1)])).await?;
    assert_eq!(answer.status, StatusCode::OK);

    control(&client, target, "lose-answer-next", &json!({})).await?;
    let answer = post_batch(&client, target, None, &json!([email(2)])).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);

    let sent = client
        .get(format!("{}/_fake/sent", target.base_url))
        .send()
        .await?
        .json::<Value>()
        .await?;
    assert_eq!(sent, json!({"data": [email(0), email(1), email(2)]}));
    Ok(())
}

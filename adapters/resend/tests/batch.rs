//! The Resend provider against the wire-faithful fake in `jobs-testkit`.

use std::time::Duration;

use jobs_adapter_resend::{
    LOCAL_REJECTION_STATUS, MAX_BATCH, ResendConfig, ResendError, ResendProvider,
};
use jobs_core::{Email, EmailError, EmailProvider, JobId};
use jobs_testkit::fakes::resend::FakeResend;
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn email(n: usize) -> Email {
    let mut email = Email::new(
        "Acme <billing@acme.test>",
        vec![format!("customer{n}@example.test")],
        format!("Invoice {n}"),
    );
    email.html = Some(format!("<p>Invoice {n} is ready.</p>"));
    email.text = Some(format!("Invoice {n} is ready."));
    email.reply_to = Some("support@acme.test".to_owned());
    email.tags = vec![("campaign".to_owned(), "invoices".to_owned())];
    email
}

fn emails(count: usize) -> Vec<Email> {
    (0..count).map(email).collect()
}

fn config_for(fake: &FakeResend) -> ResendConfig {
    ResendConfig::new(fake.api_key()).with_base_url(fake.base_url())
}

fn provider_for(fake: &FakeResend) -> Result<ResendProvider, ResendError> {
    ResendProvider::new(config_for(fake))
}

#[tokio::test]
async fn a_batch_is_sent_with_the_documented_headers_and_body() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    assert_eq!(provider.max_batch(), 100);

    let ids = provider.send_batch(&emails(3), "job-1-0").await?;

    let batches = fake.batches();
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    assert_eq!(ids, batch.ids);
    assert_eq!(ids.len(), 3);
    assert_eq!(batch.idempotency_key.as_deref(), Some("job-1-0"));
    assert_eq!(batch.batch_validation.as_deref(), Some("strict"));
    assert!(
        batch.user_agent.starts_with("softcrum-jobs/"),
        "{}",
        batch.user_agent
    );
    assert!(
        batch
            .content_type
            .as_deref()
            .is_some_and(|ct| ct.starts_with("application/json"))
    );
    assert_eq!(
        batch.emails[1],
        json!({
            "from": "Acme <billing@acme.test>",
            "to": ["customer1@example.test"],
            "subject": "Invoice 1",
            "html": "<p>Invoice 1 is ready.</p>",
            "text": "Invoice 1 is ready.",
            "reply_to": "support@acme.test",
            "tags": [{"name": "campaign", "value": "invoices"}],
        })
    );
    let sent = fake.sent();
    let subjects: Vec<&str> = sent.iter().filter_map(|e| e["subject"].as_str()).collect();
    assert_eq!(subjects, ["Invoice 0", "Invoice 1", "Invoice 2"]);
    Ok(())
}

#[tokio::test]
async fn optional_fields_are_left_out_when_unset() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    let bare = Email::new("a@acme.test", vec!["b@example.test".to_owned()], "Hello");

    provider.send_batch(&[bare], "bare-0").await?;

    assert_eq!(
        fake.sent(),
        [json!({"from": "a@acme.test", "to": ["b@example.test"], "subject": "Hello"})]
    );
    Ok(())
}

#[tokio::test]
async fn empty_and_oversized_batches_are_refused_without_a_request() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;

    for count in [0, MAX_BATCH + 1] {
        match provider.send_batch(&emails(count), "too-many").await {
            Err(EmailError::Rejected { status, message }) => {
                assert_eq!(status, LOCAL_REJECTION_STATUS);
                assert!(message.contains(&count.to_string()), "{message}");
                assert!(message.contains("nothing was sent"), "{message}");
            }
            other => panic!("expected a local rejection, got {other:?}"),
        }
    }
    let long_key = "k".repeat(257);
    assert!(matches!(
        provider.send_batch(&emails(1), &long_key).await,
        Err(EmailError::Rejected { status: 0, .. })
    ));
    assert!(fake.paths().is_empty(), "{:?}", fake.paths());
    assert!(fake.sent().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_retried_batch_is_not_sent_twice_and_returns_the_same_ids() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    let batch = emails(3);

    let first = provider.send_batch(&batch, "job-7-0").await?;
    let second = provider.send_batch(&batch, "job-7-0").await?;

    assert_eq!(first, second);
    assert_eq!(fake.sent().len(), 3);
    assert_eq!(fake.batches().len(), 1);

    // The same key with other emails is a mistake Resend refuses.
    match provider.send_batch(&emails(2), "job-7-0").await {
        Err(EmailError::Rejected { status, message }) => {
            assert_eq!(status, 409);
            assert!(message.contains("invalid_idempotent_request"), "{message}");
        }
        other => panic!("expected a 409 rejection, got {other:?}"),
    }
    assert_eq!(fake.sent().len(), 3);
    Ok(())
}

#[tokio::test]
async fn a_full_blast_goes_through_the_batch_endpoint_only() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;

    let mut ids = Vec::new();
    let blast = JobId::generate();
    for (index, chunk) in emails(250).chunks(100).enumerate() {
        ids.extend(
            provider
                .send_batch(chunk, &format!("{blast}-{index}"))
                .await?,
        );
    }

    assert_eq!(ids.len(), 250);
    assert_eq!(fake.sent().len(), 250);
    let paths = fake.paths();
    assert_eq!(paths.len(), 3);
    assert!(
        paths.iter().all(|path| path == "/emails/batch"),
        "{paths:?}"
    );
    assert!(
        !paths
            .iter()
            .any(|path| path.contains("audiences") || path.contains("contacts")),
        "{paths:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_429_is_rate_limited_with_the_retry_after_duration() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    fake.rate_limit_next(1, 7);

    match provider.send_batch(&emails(2), "rl-0").await {
        Err(err @ EmailError::RateLimited { .. }) => {
            assert!(matches!(
                err,
                EmailError::RateLimited { retry_after: Some(wait) } if wait == Duration::from_secs(7)
            ));
            assert_eq!(err.class(), jobs_core::ErrorClass::Retryable);
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    assert!(fake.sent().is_empty());

    // Backing off and retrying with the same key sends the batch once.
    let ids = provider.send_batch(&emails(2), "rl-0").await?;
    assert_eq!(ids.len(), 2);
    assert_eq!(fake.sent().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_422_is_rejected_with_resends_message() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    let mut batch = emails(2);
    batch[1].subject = String::new();

    match provider.send_batch(&batch, "bad-0").await {
        Err(err @ EmailError::Rejected { .. }) => {
            let EmailError::Rejected { status, message } = &err else {
                unreachable!()
            };
            assert_eq!(*status, 422);
            assert!(message.contains("emails[1]"), "{message}");
            assert!(message.contains("subject"), "{message}");
            assert_eq!(err.class(), jobs_core::ErrorClass::Permanent);
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    // Strict validation: nothing of the batch was sent.
    assert!(fake.sent().is_empty());

    fake.fail_next(422, 1);
    assert!(matches!(
        provider.send_batch(&emails(1), "bad-1").await,
        Err(EmailError::Rejected { status: 422, message }) if message.contains("injected")
    ));
    Ok(())
}

#[tokio::test]
async fn a_500_is_unavailable_and_the_next_try_succeeds() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    fake.fail_next(500, 1);

    match provider.send_batch(&emails(1), "down-0").await {
        Err(EmailError::Unavailable { message, .. }) => {
            assert!(message.contains("500"), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(provider.send_batch(&emails(1), "down-0").await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn an_injected_409_is_an_invalid_idempotent_request() -> TestResult {
    let fake = FakeResend::start().await?;
    let provider = provider_for(&fake)?;
    // The fake has no in-flight window, so `concurrent_idempotent_requests` (Unavailable) is
    // covered by the crate's unit tests; an injected 409 is `invalid_idempotent_request`.
    fake.fail_next(409, 1);
    assert!(matches!(
        provider.send_batch(&emails(1), "c-0").await,
        Err(EmailError::Rejected { status: 409, .. })
    ));
    Ok(())
}

#[tokio::test]
async fn connection_errors_and_timeouts_are_unavailable() -> TestResult {
    // A port nobody listens on any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    drop(listener);
    let provider = ResendProvider::new(
        ResendConfig::new("re_key").with_base_url(format!("http://{address}")),
    )?;
    assert!(matches!(
        provider.send_batch(&emails(1), "k").await,
        Err(EmailError::Unavailable {
            source: Some(_),
            ..
        })
    ));

    // A server that accepts the connection and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = ResendProvider::new(
        ResendConfig::new("re_key")
            .with_base_url(format!("http://{}", silent.local_addr()?))
            .with_timeout(Duration::from_millis(200)),
    )?;
    let batch = emails(1);
    let (send, _accepted) = tokio::join!(provider.send_batch(&batch, "k"), silent.accept());
    assert!(matches!(send, Err(EmailError::Unavailable { .. })));
    Ok(())
}

#[tokio::test]
async fn the_api_key_never_appears_in_debug_output_or_errors() -> TestResult {
    let fake = FakeResend::start_with_key("re_top_secret_key").await?;
    let provider = provider_for(&fake)?;
    let wrong = ResendProvider::new(
        ResendConfig::new("re_wrong_secret_key").with_base_url(fake.base_url()),
    )?;

    for text in [format!("{provider:?}"), format!("{:?}", config_for(&fake))] {
        assert!(!text.contains("re_top_secret_key"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }
    let err = match wrong.send_batch(&emails(1), "k").await {
        Err(err) => err,
        Ok(ids) => panic!("a wrong key was accepted: {ids:?}"),
    };
    assert!(
        matches!(err, EmailError::Rejected { status: 403, .. }),
        "{err:?}"
    );
    for text in [err.to_string(), format!("{err:?}"), format!("{wrong:?}")] {
        assert!(!text.contains("re_wrong_secret_key"), "{text}");
    }

    fake.fail_next(500, 1);
    let err = match provider.send_batch(&emails(1), "k").await {
        Err(err) => err,
        Ok(ids) => panic!("the injected 500 was not answered: {ids:?}"),
    };
    assert!(!format!("{err} {err:?}").contains("re_top_secret_key"));
    Ok(())
}

#[test]
fn bad_configurations_are_refused_at_startup() {
    assert!(matches!(
        ResendProvider::new(ResendConfig::new("  ")),
        Err(ResendError::InvalidApiKey)
    ));
    assert!(matches!(
        ResendProvider::new(ResendConfig::new("re_x").with_user_agent("")),
        Err(ResendError::InvalidUserAgent)
    ));
    assert!(matches!(
        ResendProvider::new(ResendConfig::new("re_x").with_base_url("ftp://api.resend.com")),
        Err(ResendError::InvalidBaseUrl { .. })
    ));
    let err = ResendProvider::new(ResendConfig::new("re_se\ncret")).err();
    assert!(!format!("{err:?}").contains("re_se"));
}

//! The BetterStack alerter against the wire-faithful fake in `jobs-testkit`.

use std::time::Duration;

use jobs_adapter_betterstack::{BetterStackAlerter, BetterStackConfig, BetterStackError};
use jobs_core::{Alert, AlertError, Alerter};
use jobs_testkit::fakes::FakeBetterStack;
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn alert() -> Result<Alert, Box<dyn std::error::Error>> {
    Ok(Alert {
        queue: "billing.invoices".parse()?,
        title: "3 jobs dead-lettered on billing.invoices".to_owned(),
        detail: "latest: invoice 42 has no customer; see core.dead_letters".to_owned(),
        count: 3,
    })
}

fn config_for(fake: &FakeBetterStack) -> BetterStackConfig {
    BetterStackConfig::new(fake.token(), "oncall@example.com").with_base_url(fake.base_url())
}

fn alerter_for(fake: &FakeBetterStack) -> Result<BetterStackAlerter, BetterStackError> {
    BetterStackAlerter::new(config_for(fake))
}

/// The typed error behind an [`AlertError`].
fn cause(err: &AlertError) -> Option<&BetterStackError> {
    err.engine_error()?.downcast_ref::<BetterStackError>()
}

#[tokio::test]
async fn an_alert_creates_one_incident_with_the_documented_fields() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;

    alerter.alert(&alert()?).await?;

    let incidents = fake.incidents();
    assert_eq!(incidents.len(), 1);
    let incident = &incidents[0];
    assert_eq!(incident["requester_email"], "oncall@example.com");
    assert_eq!(
        incident["summary"],
        "3 jobs dead-lettered on billing.invoices"
    );
    assert_eq!(incident["name"], "softcrum-jobs: billing.invoices");
    let description = incident["description"].as_str().unwrap_or_default();
    assert!(description.contains("latest: invoice 42 has no customer; see core.dead_letters"));
    assert!(description.contains('3'), "{description}");
    assert_eq!(incident["call"], false);
    assert_eq!(incident["sms"], false);
    assert_eq!(incident["email"], true);
    assert_eq!(incident["push"], true);
    assert_eq!(incident["critical_alert"], false);
    assert_eq!(
        incident["metadata"],
        json!({"queue": "billing.invoices", "count": "3"})
    );
    for absent in ["policy_id", "team_name", "team_wait"] {
        assert!(incident.get(absent).is_none(), "{absent} sent unset");
    }
    Ok(())
}

#[tokio::test]
async fn configured_channels_policy_and_team_are_sent() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = BetterStackAlerter::new(
        config_for(&fake)
            .with_call(true)
            .with_sms(true)
            .with_email(false)
            .with_push(false)
            .with_critical_alert(true)
            .with_team_wait(Duration::from_secs(300))
            .with_policy_id("12345")
            .with_team_name("Platform"),
    )?;

    let id = alerter.create_incident(&alert()?).await?;

    assert_eq!(id, "1");
    let incidents = fake.incidents();
    assert_eq!(incidents.len(), 1);
    let incident = &incidents[0];
    for (flag, expected) in [
        ("call", true),
        ("sms", true),
        ("email", false),
        ("push", false),
        ("critical_alert", true),
    ] {
        assert_eq!(incident[flag], expected, "{flag}");
    }
    assert_eq!(incident["team_wait"], 300);
    assert_eq!(incident["policy_id"], "12345");
    assert_eq!(incident["team_name"], "Platform");
    Ok(())
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_the_token_is_not_repeated() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let wrong = "wrong-team-token-5f1c";
    let alerter = BetterStackAlerter::new(
        BetterStackConfig::new(wrong, "oncall@example.com").with_base_url(fake.base_url()),
    )?;

    let Err(err) = alerter.alert(&alert()?).await else {
        return Err("a wrong token was accepted".into());
    };

    let message = err.to_string();
    assert!(message.to_lowercase().contains("unauthorized"), "{message}");
    assert!(message.contains("401"), "{message}");
    assert!(message.contains("configuration problem"), "{message}");
    assert!(!message.contains(wrong), "{message}");
    assert!(!message.contains(fake.token()), "{message}");
    assert!(!format!("{err:?}").contains(wrong));
    let typed = cause(&err).ok_or("no BetterStackError behind the AlertError")?;
    assert!(matches!(
        typed,
        BetterStackError::Unauthorized { status: 401, .. }
    ));
    assert!(typed.is_configuration_problem());
    assert!(fake.incidents().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_server_error_is_an_error_that_names_the_status() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;
    fake.fail_next(500, 1);

    let Err(err) = alerter.alert(&alert()?).await else {
        return Err("a 500 was taken for success".into());
    };

    let message = err.to_string();
    assert!(message.contains("500"), "{message}");
    assert!(message.contains("Internal Server Error"), "{message}");
    let typed = cause(&err).ok_or("no BetterStackError behind the AlertError")?;
    assert!(matches!(
        typed,
        BetterStackError::Status { status: 500, .. }
    ));
    assert!(!typed.is_configuration_problem());
    assert!(fake.incidents().is_empty());
    Ok(())
}

#[tokio::test]
async fn after_one_injected_failure_the_next_alert_succeeds() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;
    fake.fail_next(500, 1);

    assert!(alerter.alert(&alert()?).await.is_err());
    alerter.alert(&alert()?).await?;

    assert_eq!(fake.incidents().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_rate_limit_reports_retry_after() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;
    fake.fail_next(429, 1);

    let Err(err) = alerter.alert(&alert()?).await else {
        return Err("a 429 was taken for success".into());
    };

    let message = err.to_string();
    assert!(message.contains("rate limited"), "{message}");
    assert!(message.contains("429"), "{message}");
    let typed = cause(&err).ok_or("no BetterStackError behind the AlertError")?;
    assert!(matches!(
        typed,
        BetterStackError::RateLimited { retry_after: Some(wait), .. } if *wait == Duration::from_secs(1)
    ));
    Ok(())
}

#[tokio::test]
async fn a_rejected_incident_is_a_configuration_problem() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;
    let untitled = Alert {
        title: String::new(),
        ..alert()?
    };

    let Err(err) = alerter.alert(&untitled).await else {
        return Err("an incident without summary was accepted".into());
    };

    let message = err.to_string();
    assert!(message.contains("configuration problem"), "{message}");
    assert!(message.contains("422"), "{message}");
    assert!(message.contains("summary can't be blank"), "{message}");
    assert!(fake.incidents().is_empty());
    Ok(())
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_error() -> TestResult {
    let fake = FakeBetterStack::start().await?;
    let alerter = alerter_for(&fake)?;
    fake.shutdown().await;

    let Err(err) = alerter.alert(&alert()?).await else {
        return Err("a stopped server created an incident".into());
    };

    let message = err.to_string();
    assert!(
        message.contains("request to BetterStack failed"),
        "{message}"
    );
    assert!(matches!(cause(&err), Some(BetterStackError::Transport(_))));
    Ok(())
}

#[tokio::test]
async fn a_silent_server_times_out() -> TestResult {
    // Accepts connections (the kernel completes the handshake) but never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let alerter = BetterStackAlerter::new(
        BetterStackConfig::new("team-token", "oncall@example.com")
            .with_base_url(format!("http://{}", listener.local_addr()?))
            .with_timeout(Duration::from_millis(200)),
    )?;

    let Err(err) = alerter.alert(&alert()?).await else {
        return Err("a silent server created an incident".into());
    };

    match cause(&err) {
        Some(BetterStackError::Transport(inner)) => assert!(inner.is_timeout(), "{err}"),
        _ => return Err(format!("not a transport error: {err}").into()),
    }
    Ok(())
}

#[test]
fn debug_output_hides_the_token() -> TestResult {
    let token = "secret-team-token-9a7e";
    let config = BetterStackConfig::new(token, "oncall@example.com").with_policy_id("12345");

    let debug = format!("{config:?}");
    assert!(!debug.contains(token), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(debug.contains("oncall@example.com"), "{debug}");

    let alerter = BetterStackAlerter::new(config)?;
    let debug = format!("{alerter:?}");
    assert!(!debug.contains(token), "{debug}");
    Ok(())
}

#[test]
fn invalid_configuration_is_refused_at_construction() {
    let invalid_token = BetterStackAlerter::new(BetterStackConfig::new(
        "line\nbreak-token",
        "oncall@example.com",
    ));
    match invalid_token {
        Err(err @ BetterStackError::InvalidToken) => {
            assert!(!err.to_string().contains("break-token"));
        }
        other => panic!("expected InvalidToken, got {other:?}"),
    }
    assert!(matches!(
        BetterStackAlerter::new(BetterStackConfig::new("", "oncall@example.com")),
        Err(BetterStackError::InvalidToken)
    ));
    assert!(matches!(
        BetterStackAlerter::new(BetterStackConfig::new("team-token", " ")),
        Err(BetterStackError::MissingRequesterEmail)
    ));
    let bad_url = BetterStackAlerter::new(
        BetterStackConfig::new("team-token", "oncall@example.com").with_base_url("not a url"),
    );
    match bad_url {
        Err(err) => assert!(err.is_configuration_problem(), "{err}"),
        Ok(alerter) => panic!("accepted a bad base URL: {alerter:?}"),
    }
}

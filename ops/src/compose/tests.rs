use std::collections::BTreeMap;

use super::*;

/// A configuration of `flags` and the environment `env`.
pub(super) fn with(flags: &[(&'static str, &str)], env: &[(&str, &str)]) -> Config {
    let flags = flags
        .iter()
        .map(|(flag, value)| (*flag, (*value).to_owned()))
        .collect();
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Config::resolve(&flags, &|name| env.get(name).cloned(), &ConfigFile::None).expect("resolves")
}

/// A configuration of `--queue-url` `url` and the environment `env`.
pub(super) fn with_queue_url(url: &str, env: &[(&str, &str)]) -> Config {
    with(&[("--queue-url", url)], env)
}

#[test]
fn the_public_scheme_lists_are_the_table_of_schemes() {
    let of = |port| -> Vec<&str> {
        SCHEMES
            .iter()
            .filter(|s| s.port == port)
            .map(|s| s.shown)
            .collect()
    };
    assert_eq!(of(Port::Queue), QUEUE_SCHEMES);
    assert_eq!(of(Port::Store), STORE_SCHEMES);
    assert_eq!(of(Port::RateLimiter), RATE_LIMIT_SCHEMES);
    assert_eq!(of(Port::Alerter), ALERTERS);
    for scheme in SCHEMES.iter().filter(|s| s.feature.is_some()) {
        let feature = scheme.feature.unwrap_or_default();
        assert!(
            include_str!("../../Cargo.toml").contains(&format!("\n{feature} = [")),
            "{} names `{feature}`, which is no feature of jobs-ops",
            scheme.shown
        );
    }
}

#[test]
fn a_scheme_whose_feature_is_not_built_is_refused_naming_the_feature() {
    let config = with(
        &[
            ("--queue-url", "postgres-queue://u@h/db"),
            ("--rate-limit-url", "redis://h:6379"),
        ],
        &[("JOBS_ALERTER", "betterstack")],
    );
    let queue = pick_among(&[], &config, &QUEUE_URL, Port::Queue, |a| a.queue)
        .expect_err("no adapter is built");
    assert_eq!(
        queue.to_string(),
        "--queue-url (JOBS_QUEUE_URL, queue_url in jobs.toml) names `postgres-queue:`, whose \
         adapter this build leaves out: build jobs-ops with its `postgres` feature"
    );
    assert!(queue.is_configuration());
    let limiter = pick_among(&[], &config, &RATE_LIMIT_URL, Port::RateLimiter, |a| {
        a.rate_limiter
    })
    .expect_err("no adapter is built");
    assert!(limiter.to_string().contains("`redis` feature"), "{limiter}");
    let alerter = pick_among(&[], &config, &ALERTER, Port::Alerter, |a| a.alerter)
        .expect_err("no adapter is built");
    assert!(
        alerter.to_string().contains("`betterstack` feature"),
        "{alerter}"
    );
    let memory = pick_among(&[], &with(&[], &[]), &QUEUE_URL, Port::Queue, |a| a.queue);
    assert!(
        matches!(memory, Ok(None)),
        "memory: needs no adapter, whatever the build"
    );
}

#[tokio::test]
async fn unsupported_schemes_name_the_flag_the_source_and_the_accepted_schemes() {
    let config = with(
        &[
            ("--queue-url", "kafka://broker:9092"),
            ("--database-url", "mysql://x"),
            ("--rate-limit-url", "memcached://x"),
        ],
        &[("JOBS_ALERTER", "pagerduty")],
    );
    let queue = Queue::connect(&config).await.expect_err("no kafka here");
    let built: Vec<&str> = SCHEMES
        .iter()
        .filter(|s| s.port == Port::Queue && s.is_built())
        .map(|s| s.shown)
        .collect();
    assert_eq!(
        queue.to_string(),
        format!(
            "unsupported --queue-url (JOBS_QUEUE_URL, queue_url in jobs.toml) scheme `kafka:` \
             (set by flag); accepted: {}",
            built.join(", ")
        )
    );
    assert!(queue.is_configuration());
    let store = Store::connect(&config).await.expect_err("no mysql");
    assert!(store.to_string().contains("--database-url"), "{store}");
    assert!(
        !store.to_string().contains("mysql://x"),
        "only the scheme is shown"
    );
    let limiter = rate_limiter(&config).err().expect("no memcached");
    assert!(limiter.to_string().contains("memory:"), "{limiter}");
    let alerter = alerter(&config).err().expect("no pagerduty");
    assert!(
        alerter.to_string().contains("`pagerduty:` (set by env)"),
        "{alerter}"
    );
}

#[tokio::test]
async fn the_defaults_compose_in_process_adapters() {
    let config = with(&[], &[]);
    let queue = Queue::connect(&config).await.expect("memory");
    assert!(!queue.durable && queue.depth.is_some() && queue.consumer.is_some());
    rate_limiter(&config).expect("memory limiter");
    alerter(&config).expect("console");
}

#[tokio::test]
async fn one_envelope_limit_holds_the_publish_and_refuses_values_out_of_bounds() {
    let config = with(&[], &[("JOBS_MAX_ENVELOPE_BYTES", "4096")]);
    assert_eq!(
        envelope_limits(&config)
            .expect("in bounds")
            .max_envelope_bytes(),
        4096
    );
    let queue = Queue::connect(&config).await.expect("memory");
    let name: jobs_core::QueueName = "billing.invoices".parse().expect("valid");
    let big = jobs_core::Envelope::new(
        "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
            .parse()
            .expect("valid"),
        jobs_core::CorrelationId::generate(),
        "billing.invoice_issued".parse().expect("valid"),
        serde_json::json!({ "blob": "x".repeat(5_000) }),
    );
    let refused = queue
        .publisher
        .publish(&name, &big, jobs_core::PublishOptions::default())
        .await;
    assert!(
        matches!(
            refused,
            Err(jobs_core::QueueError::TooLarge { limit: 4096, .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        envelope_limits(&with(&[], &[]))
            .expect("the default")
            .max_envelope_bytes(),
        jobs_core::DEFAULT_MAX_ENVELOPE_BYTES
    );
    for bad in ["0", "1023", "67108865", "4294967296000", "1MiB", "-1"] {
        let config = with(&[], &[("JOBS_MAX_ENVELOPE_BYTES", bad)]);
        let error = envelope_limits(&config).expect_err(bad).to_string();
        assert!(
            error.contains("max_envelope_bytes") && error.contains(bad),
            "{bad}: {error}"
        );
    }
}

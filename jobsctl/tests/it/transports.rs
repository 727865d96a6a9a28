//! The real `jobsctl` publishing through each durable transport it composes by URL scheme:
//! the PostgreSQL queue, Vercel Queues (Vercel's own emulator) and QStash (the wire-faithful
//! fake), and `jobsctl qstash verify` on a delivery QStash signed.

use std::process::Output;
use std::time::Duration;

use jobs_adapter_postgres::PgQueue;
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};
use jobs_core::{ConsumerPort, Envelope, JobId, QueueName};
use jobs_testkit::emulators::VercelQueuesEmulator;
use jobs_testkit::fakes::qstash::FakeQStash;

use crate::cli::jobsctl_with;

const TENANT: &str = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90";
const QUEUE: &str = "billing.invoices";

/// `jobsctl publish` of one invoice to `queue` through `queue_url`, configured by `env`.
fn publish_to(queue: &str, queue_url: &str, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let args = [
        &[
            "publish",
            "--queue",
            queue,
            "--kind",
            "billing.invoice_issued",
            "--tenant",
            TENANT,
            "--data",
            r#"{"invoice":42}"#,
            "--queue-url",
            queue_url,
        ][..],
        extra,
    ]
    .concat();
    jobsctl_with(&args, env)
}

/// [`publish_to`] the test queue, returning the printed job id.
fn publish(queue_url: &str, env: &[(&str, &str)], extra: &[&str]) -> JobId {
    let output = publish_to(QUEUE, queue_url, env, extra);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("prints the job id")
}

fn queue() -> QueueName {
    QUEUE.parse().expect("valid")
}

/// The envelope of the one message `consumer` holds ready on the queue, acked.
async fn take_one(consumer: &dyn ConsumerPort) -> Envelope {
    let deliveries = consumer
        .receive(&queue(), 10, Duration::from_secs(30))
        .await
        .expect("receive");
    assert_eq!(deliveries.len(), 1, "exactly the published message");
    consumer.ack(&deliveries[0].lease).await.expect("ack");
    Envelope::decode(&deliveries[0].payload).expect("a valid envelope")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn publish_and_queues_reach_the_postgres_queue() {
    let db = crate::pg::TestDb::create().await;
    let queue_url = db.url.replacen("postgres", "postgres-queue", 1);
    let unmigrated = publish_to(QUEUE, &queue_url, &[], &[]);
    assert_eq!(unmigrated.status.code(), Some(1), "{unmigrated:?}");
    assert!(
        String::from_utf8_lossy(&unmigrated.stderr).contains("jobsctl migrate"),
        "says what to do: {unmigrated:?}"
    );
    let migrated = jobsctl_with(&["migrate", "--database-url", &db.url], &[]);
    assert!(migrated.status.success(), "{migrated:?}");

    let now = publish(&queue_url, &[], &[]);
    let later = publish(&queue_url, &[], &["--delay", "1h"]);
    let depth = jobsctl_with(
        &[
            "queues",
            "--queue",
            QUEUE,
            "--json",
            "--queue-url",
            &queue_url,
        ],
        &[],
    );
    assert!(depth.status.success(), "{depth:?}");
    let depth: serde_json::Value = serde_json::from_slice(&depth.stdout).expect("JSON");
    assert_eq!(
        (depth["ready"].as_u64(), depth["delayed"].as_u64()),
        (Some(1), Some(1)),
        "{depth}"
    );
    let listed = jobsctl_with(&["queues", "--json", "--queue-url", &queue_url], &[]);
    assert!(listed.status.success(), "{listed:?}");
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON Lines"))
        .filter_map(|l| l["queue"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        names,
        [QUEUE],
        "without names, the queues the transport holds"
    );

    let pool = db.pool().await;
    let pg = PgQueue::new(pool.clone());
    let envelope = take_one(&pg).await;
    assert_eq!(
        envelope.job_id, now,
        "the job published now, not the delayed one"
    );
    assert_ne!(now, later);
    assert_eq!(envelope.data["invoice"], 42);
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn publish_reaches_vercel_queues() {
    let emulator = VercelQueuesEmulator::start().await;
    let env = [
        ("VERCEL_OIDC_TOKEN", "a-token"),
        ("VERCEL_QUEUES_BASE_URL", emulator.base_url()),
    ];
    let job = publish("vercel-queues://iad1", &env, &[]);

    let config = VercelQueuesConfig::new(Region::new("iad1").unwrap(), StaticToken::new("t"))
        .base_url_override(emulator.base_url())
        .unwrap();
    let vercel = VercelQueues::new(config).unwrap();
    assert_eq!(take_one(&vercel).await.job_id, job);

    // Vercel has no depth API; with depth_url the composition counts it in Redis.
    let no_depth = jobsctl_with(
        &[
            "queues",
            "--queue",
            QUEUE,
            "--queue-url",
            "vercel-queues://iad1",
        ],
        &env,
    );
    assert_eq!(no_depth.status.code(), Some(1), "{no_depth:?}");
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let counted_env = [&env[..], &[("JOBS_DEPTH_URL", redis.as_str())]].concat();
    let other = format!("ops.depth_{}", JobId::generate().as_uuid().simple());
    let publish_other = publish_to(
        &other,
        "vercel-queues://iad1",
        &counted_env,
        &["--delay", "1h"],
    );
    assert!(publish_other.status.success(), "{publish_other:?}");
    let depth = jobsctl_with(
        &[
            "queues",
            "--queue",
            &other,
            "--json",
            "--queue-url",
            "vercel-queues://iad1",
        ],
        &counted_env,
    );
    assert!(depth.status.success(), "{depth:?}");
    let depth: serde_json::Value = serde_json::from_slice(&depth.stdout).expect("JSON");
    assert_eq!(
        depth["delayed"], 1,
        "the delayed publish was counted: {depth}"
    );
    let client = jobs_adapter_redis::redis::Client::open(redis.as_str()).expect("a Redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis is running");
    let _: () = jobs_adapter_redis::redis::cmd("DEL")
        .arg(format!("jobs:depth:{other}"))
        .query_async(&mut connection)
        .await
        .expect("drop the test's key");

    let no_token = publish_to(QUEUE, "vercel-queues://iad1", &[], &[]);
    assert_eq!(no_token.status.code(), Some(2), "{no_token:?}");
    assert!(
        String::from_utf8_lossy(&no_token.stderr).contains("VERCEL_OIDC_TOKEN"),
        "names the setting: {no_token:?}"
    );
    let bad_region = jobsctl_with(&["queues", "--queue-url", "vercel-queues://Mars"], &env);
    assert_eq!(bad_region.status.code(), Some(2), "{bad_region:?}");
}

// The fake serves from this runtime while the test blocks on the binary: two threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_reaches_qstash_and_verify_explains_its_signature() {
    let fake = FakeQStash::start().await.expect("the fake starts");
    // Nothing listens there: QStash's delivery attempt is recorded with its signature.
    let destination = "http://127.0.0.1:9/qstash/{queue}";
    let env = [
        ("QSTASH_TOKEN", fake.token()),
        ("QSTASH_URL", fake.base_url()),
        ("QSTASH_DESTINATION", destination),
        ("QSTASH_CURRENT_SIGNING_KEY", fake.current_signing_key()),
        ("QSTASH_NEXT_SIGNING_KEY", fake.next_signing_key()),
    ];
    let job = publish("qstash:", &env, &[]);
    let messages = fake.messages();
    assert_eq!(messages.len(), 1);
    let url = format!("http://127.0.0.1:9/qstash/{QUEUE}");
    assert_eq!(messages[0].url, url, "the queue's destination");
    assert_eq!(
        Envelope::decode(&messages[0].body).expect("valid").job_id,
        job
    );

    let mut signature = None;
    for _ in 0..200 {
        signature = fake.attempts().first().map(|a| a.signature.clone());
        if signature.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let signature = signature.expect("QStash attempted the delivery");
    let dir = std::env::temp_dir().join(format!("jobsctl-qstash-{}-{job}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let body = dir.join("body.json");
    std::fs::write(&body, &messages[0].body).expect("write the body");
    let verify = |url: &str, body: &std::path::Path, extra: &[&str], env: &[(&str, &str)]| {
        let args = [
            &[
                "qstash",
                "verify",
                "--signature",
                &signature,
                "--url",
                url,
                "--body",
                body.to_str().unwrap(),
            ][..],
            extra,
        ]
        .concat();
        jobsctl_with(&args, env)
    };

    let valid = verify(&url, &body, &[], &env);
    assert!(valid.status.success(), "{valid:?}");
    assert!(
        stdout(&valid).starts_with("valid: signed with the current signing key"),
        "{valid:?}"
    );

    let tampered = dir.join("tampered.json");
    let mut bytes = messages[0].body.clone();
    bytes.push(b' ');
    std::fs::write(&tampered, bytes).expect("write");
    let refused = verify(&url, &tampered, &["--json"], &env);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let verdict: serde_json::Value = serde_json::from_slice(&refused.stdout).expect("JSON");
    assert_eq!(verdict["valid"], false);
    assert!(
        verdict["reason"].as_str().unwrap().contains("body"),
        "{verdict}"
    );

    let endless = verify(&url, std::path::Path::new("/dev/zero"), &[], &env);
    assert_eq!(endless.status.code(), Some(2), "{endless:?}");
    assert!(
        String::from_utf8_lossy(&endless.stderr)
            .contains("--body /dev/zero: longer than the limit of 67108864 bytes"),
        "{endless:?}"
    );

    let elsewhere = verify("https://app.example.com/other", &body, &[], &env);
    assert_eq!(elsewhere.status.code(), Some(1));
    assert!(stdout(&elsewhere).contains("subject is"), "{elsewhere:?}");

    let later = verify(&url, &body, &["--at", "2099-01-01T00:00:00Z"], &env);
    assert_eq!(later.status.code(), Some(1));
    assert!(stdout(&later).contains("expired"), "{later:?}");

    let swapped = [
        ("QSTASH_CURRENT_SIGNING_KEY", "sig_not_it"),
        ("QSTASH_NEXT_SIGNING_KEY", fake.current_signing_key()),
    ];
    let rotated = verify(&url, &body, &[], &swapped);
    assert!(stdout(&rotated).contains("next signing key"), "{rotated:?}");

    let no_keys = verify(&url, &body, &[], &[]);
    assert_eq!(no_keys.status.code(), Some(2), "{no_keys:?}");
    assert!(String::from_utf8_lossy(&no_keys.stderr).contains("QSTASH_CURRENT_SIGNING_KEY"));

    let no_destination = jobsctl_with(
        &["queues", "--queue-url", "qstash:"],
        &[
            ("QSTASH_TOKEN", fake.token()),
            ("QSTASH_DESTINATION", "http://127.0.0.1:9/all"),
        ],
    );
    assert_eq!(no_destination.status.code(), Some(2), "{no_destination:?}");
    assert!(
        String::from_utf8_lossy(&no_destination.stderr).contains("{queue}"),
        "{no_destination:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    fake.shutdown().await;
}

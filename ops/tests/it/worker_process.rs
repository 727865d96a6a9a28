//! The README's worker (`ops/examples/worker.rs`) as a user runs it: against PostgreSQL, its
//! jobs processed exactly once, its endpoints answering, SIGTERM ending it with status 0 and
//! nothing left leased; and the worker process's refusals at start.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use jobs_adapter_postgres::{PgStore, PgWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError};
use jobs_ops::compose::{Config, ConfigFile};
use jobs_ops::process::{ProcessError, WorkerProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::pg::{TestDb, into_the_outbox};
use crate::process::{Reaped, eventually, terminate, terminate_waited};
use crate::temp::TempDb;

/// The example's binary, built beside this test's (`cargo test` builds examples).
pub(crate) fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug/deps");
    let path = debug.join("examples").join(name);
    assert!(path.exists(), "{} is built with the tests", path.display());
    path
}

/// The README's worker on `database_url`, its endpoints on `port`, no configuration file, its
/// log piped for [`terminate`].
pub(crate) fn readme_worker(database_url: &str, port: u16) -> Command {
    let mut command = Command::new(example("worker"));
    command
        .env("DATABASE_URL", database_url)
        .env("JOBS_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("JOBS_CONFIG", "/dev/null")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET path` on `port`: the status and the body, or `None` while nothing answers.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    request(port, &format!("GET {path}"), &[], "").await
}

/// `line` (`POST /path`) on `port` with `headers` and `body`: the status and the body.
async fn request(
    port: u16,
    line: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{line} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{headers}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// A worker process over `db` on `port` with `settings` besides, whose one queue
/// (`billing.invoices`) counts its jobs in `handled`.
async fn counting(
    db: &TestDb,
    port: u16,
    settings: &[(&str, &str)],
    handled: &Counted,
) -> jobs_ops::process::Running<PgStore> {
    let addr = format!("127.0.0.1:{port}");
    let mut all = vec![("DATABASE_URL", db.url.as_str()), ("JOBS_HTTP_ADDR", &addr)];
    all.extend_from_slice(settings);
    let handled = handled.clone();
    WorkerProcess::<PgStore>::with_config(config(&all))
        .queue("billing.invoices", "billing.booker", |w| {
            w.handler("billing.invoice_issued".parse().expect("a kind"), handled)
        })
        .start()
        .await
        .expect("starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_worker_processes_its_jobs_once_answers_probes_and_stops_on_sigterm() {
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    // Trust authentication ignores the password; the log must not show it.
    let url = db.url.replacen("postgres@", "postgres:hunter2@", 1);
    assert_ne!(
        url, db.url,
        "the test database's URL names the postgres user"
    );
    let child = Reaped(
        readme_worker(&url, port)
            .env("RUST_LOG", "info")
            .spawn()
            .expect("the example starts"),
    );

    let booked = eventually("three invoices booked", async || {
        let rows: Vec<i64> = sqlx::query_scalar("select invoice from booked_invoices order by 1")
            .fetch_all(&pool)
            .await
            .ok()?;
        (rows.len() >= 3).then_some(rows)
    })
    .await;
    assert_eq!(booked, [1, 2, 3], "each job's effect exactly once");
    let ready = eventually("/readyz", async || {
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(ready.1, "ready\n");
    assert_eq!(
        get(port, "/healthz").await,
        Some((200, "alive\n".to_owned()))
    );
    let mut rebound = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: rebind.evil.example:{port}\r\nConnection: close\r\n\r\n"
    );
    rebound.write_all(head.as_bytes()).await.expect("write");
    let mut answer = String::new();
    rebound.read_to_string(&mut answer).await.expect("read");
    assert!(
        answer.starts_with("HTTP/1.1 421"),
        "another host is refused: {answer}"
    );
    let (status, metrics) = get(port, "/metrics").await.expect("metrics answer");
    assert_eq!(status, 200);
    assert!(
        metrics.contains(
            r#"jobs_processed_total{queue="billing.invoices",kind="billing.invoice_issued"} 3"#
        ),
        "{metrics}"
    );
    // The depth gauges, sampled beside the workers from the start: every state of the
    // PostgreSQL queue, and the age of its oldest ready job.
    let gauges = eventually("the depth gauges", async || {
        let (_, metrics) = get(port, "/metrics").await?;
        metrics
            .contains(r#"jobs_queue_oldest_ready_seconds{queue="billing.invoices"}"#)
            .then_some(metrics)
    })
    .await;
    for state in ["ready", "delayed", "in_flight"] {
        let series = format!(r#"jobs_queue_depth{{queue="billing.invoices",state="{state}"}}"#);
        assert!(gauges.contains(&series), "{series}: {gauges}");
    }

    let (exited, log) = terminate(child).await;
    assert!(exited.success(), "exit status {exited}: {log}");
    assert!(log.contains("worker process started"), "{log}");
    assert!(log.contains("worker process stopped"), "{log}");
    assert!(
        log.contains("postgres://postgres:…@") && !log.contains("hunter2"),
        "the start line shows the configuration, the password hidden: {log}"
    );
    let (jobs, processed): (i64, i64) = sqlx::query_as(
        "select (select count(*) from core.jobs), (select count(*) from core.processed_jobs)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        (jobs, processed),
        (0, 3),
        "every job settled, none left leased"
    );
    pool.close().await;
    db.drop_db().await;
}

struct Noop;

#[async_trait::async_trait]
impl Handler<PgWorkTx> for Noop {
    type Data = serde_json::Value;

    async fn handle(&self, _: Job<serde_json::Value>, _: &mut PgWorkTx) -> Result<(), JobError> {
        Ok(())
    }
}

fn config(pairs: &[(&str, &str)]) -> Config {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let env = move |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    Config::resolve(&Default::default(), &env, &ConfigFile::None).expect("resolves")
}

#[tokio::test]
async fn a_process_refuses_a_store_its_handlers_do_not_run_on_naming_the_key() {
    let refused = WorkerProcess::<PgStore>::with_config(config(&[(
        "DATABASE_URL",
        "sqlite://.jobs/other.db",
    )]))
    .queue("billing.invoices", "billing.booker", |w| {
        w.handler("billing.invoice_issued".parse().expect("a kind"), Noop)
    })
    .start()
    .await
    .err()
    .expect("refused");
    let message = refused.to_string();
    assert!(
        message.starts_with("--database-url (DATABASE_URL, database_url in jobs.toml): names a `sqlite:` store, but this process's handlers run on PostgreSQL"),
        "{message}"
    );
}

#[tokio::test]
async fn a_process_refuses_settings_that_cannot_work_by_name() {
    let db = TestDb::create().await;
    let cases: [(&str, &str, &str); 11] = [
        (
            "JOBS_FAIR",
            "billing.refunds",
            "JOBS_FAIR (fair in jobs.toml): names `billing.refunds`, which this process does not consume",
        ),
        (
            "JOBS_FAIR",
            "billing.invoices=0",
            "JOBS_FAIR (fair in jobs.toml): the limit of `billing.invoices`, `0`, is not a whole number",
        ),
        (
            "JOBS_FAIR",
            "billing.invoices, billing.invoices=2",
            "JOBS_FAIR (fair in jobs.toml): names `billing.invoices` twice",
        ),
        ("JOBS_CONCURRENCY", "0", "--concurrency (JOBS_CONCURRENCY"),
        (
            "JOBS_CONCURRENCY",
            "4294967296",
            "--concurrency (JOBS_CONCURRENCY",
        ),
        (
            "JOBS_MAX_ENVELOPE_BYTES",
            "1",
            "JOBS_MAX_ENVELOPE_BYTES (max_envelope_bytes in jobs.toml): `1` is not a whole number \
             of bytes from 1024 to 67108864",
        ),
        (
            "JOBS_MAX_ENVELOPE_BYTES",
            "huge",
            "JOBS_MAX_ENVELOPE_BYTES (max_envelope_bytes in jobs.toml)",
        ),
        (
            "JOBS_SHUTDOWN_GRACE",
            "soon",
            "shutdown_grace (from JOBS_SHUTDOWN_GRACE) must be a duration up to 1d: `soon` is not",
        ),
        (
            "JOBS_SHUTDOWN_GRACE",
            "30",
            "shutdown_grace (from JOBS_SHUTDOWN_GRACE) must be a duration up to 1d: `30` has a \
             number without a unit: add one",
        ),
        (
            "JOBS_HTTP_ADDR",
            "everywhere",
            "--http-addr (JOBS_HTTP_ADDR",
        ),
        ("JOBS_LOG_FORMAT", "xml", "--log-format (JOBS_LOG_FORMAT"),
    ];
    for (env, value, named) in cases {
        let refused = WorkerProcess::<PgStore>::with_config(config(&[
            ("DATABASE_URL", &db.url),
            (env, value),
        ]))
        .queue("billing.invoices", "billing.booker", |w| {
            w.handler("billing.invoice_issued".parse().expect("a kind"), Noop)
        })
        .start()
        .await
        .err()
        .unwrap_or_else(|| panic!("{env}={value} accepted"));
        assert!(refused.to_string().starts_with(named), "{env}: {refused}");
    }
    let unmigrated = WorkerProcess::<PgStore>::with_config(config(&[("DATABASE_URL", &db.url)]))
        .queue("billing.invoices", "billing.booker", |w| {
            w.handler("billing.invoice_issued".parse().expect("a kind"), Noop)
        })
        .start()
        .await
        .err()
        .expect("no schema");
    assert!(
        unmigrated.to_string().contains("run `jobsctl migrate`"),
        "{unmigrated}"
    );
    let nothing = WorkerProcess::<PgStore>::with_config(config(&[("DATABASE_URL", &db.url)]))
        .start()
        .await
        .err()
        .expect("no queues");
    assert!(matches!(nothing, ProcessError::NoQueues), "{nothing}");
    db.drop_db().await;
}

/// The workspace's root, where README.md is.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ops/ is in the workspace")
        .to_owned()
}

#[test]
fn the_readme_shows_the_example_as_it_is_and_lists_every_metric_the_runtime_emits() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let example =
        std::fs::read_to_string(root().join("ops/examples/worker.rs")).expect("the example");
    assert!(
        readme.contains(&format!("```rust,ignore\n{example}```")),
        "README's \"Write a worker\" is not ops/examples/worker.rs as it is"
    );
    let code_lines = example
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//"))
        .count();
    assert!(
        code_lines <= 40,
        "the example has {code_lines} lines of code"
    );

    let metric = regex::Regex::new(r#""(jobs_[a-z_]+_(?:total|seconds))""#).expect("a regex");
    let mut folders = vec![root().join("consumers/src")];
    let mut sources = Vec::new();
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a folder of consumers/src") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else {
                sources.push(path);
            }
        }
    }
    assert!(sources.len() > 10, "the runtime's sources: {sources:?}");
    for path in sources {
        let text = std::fs::read_to_string(&path).expect("a source file");
        for name in metric.captures_iter(&text) {
            let row = format!("| `{}` |", &name[1]);
            assert!(
                readme.contains(&row),
                "{} ({}) is not in the README",
                &name[1],
                path.display()
            );
        }
    }
}

/// Counts the jobs each run handles.
#[derive(Clone, Default)]
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[async_trait::async_trait]
impl<Tx: Send + 'static> Handler<Tx> for Counted {
    type Data = serde_json::Value;

    async fn handle(&self, _: Job<serde_json::Value>, _: &mut Tx) -> Result<(), JobError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_asked_to_relays_its_outbox_and_ticks_the_cron_scheduler() {
    let (db, pool) = TestDb::migrated().await;
    into_the_outbox(&pool).await;

    let handled = Counted::default();
    let port = free_port();
    let process = counting(
        &db,
        port,
        &[("JOBS_OUTBOX_RELAY", "on"), ("JOBS_CRON", "on")],
        &handled,
    )
    .await;
    eventually("the outbox's job relayed and handled", async || {
        (handled.0.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let cron_jobs = eventually("the cron scheduler's first tick", async || {
        let n: i64 = sqlx::query_scalar("select count(*) from core.jobs where queue like 'core.%'")
            .fetch_one(&pool)
            .await
            .ok()?;
        (n > 0).then_some(n)
    })
    .await;
    assert!(cron_jobs > 0);
    let outbox: i64 = sqlx::query_scalar("select count(*) from core.outbox")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(outbox, 0, "the outbox drained");
    process.stop().await;
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_process_refuses_cron_without_a_tenant_directory_naming_the_key() {
    let db = TempDb::new("process");
    let url = db.url();
    let refused = WorkerProcess::<jobs_adapter_sqlite::SqliteStore>::with_config(config(&[
        ("DATABASE_URL", &url),
        ("JOBS_QUEUE_URL", "memory:"),
        ("JOBS_CRON", "on"),
    ]))
    .queue("billing.invoices", "billing.booker", |w| {
        w.handler(
            "billing.invoice_issued".parse().expect("a kind"),
            Counted::default(),
        )
    })
    .start()
    .await
    .err()
    .expect("refused");
    assert!(
        refused
            .to_string()
            .starts_with("JOBS_CRON (cron in jobs.toml): the tenants live in PostgreSQL"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qstash_process_runs_what_qstash_delivers_to_its_routes_and_nothing_forged() {
    let fake = jobs_testkit::fakes::qstash::FakeQStash::start()
        .await
        .expect("the fake starts");
    fake.set_retry_scale(0.0);
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    let destination = format!("http://127.0.0.1:{port}/qstash/{{queue}}");
    let handled = Counted::default();
    let process = counting(
        &db,
        port,
        &[
            ("JOBS_QUEUE_URL", "qstash:"),
            ("QSTASH_TOKEN", fake.token()),
            ("QSTASH_URL", fake.base_url()),
            ("QSTASH_DESTINATION", &destination),
            ("QSTASH_CURRENT_SIGNING_KEY", fake.current_signing_key()),
            ("QSTASH_NEXT_SIGNING_KEY", fake.next_signing_key()),
        ],
        &handled,
    )
    .await;
    let queue: jobs_core::QueueName = "billing.invoices".parse().expect("a queue");
    let job =
        jobs_testkit::fixtures::envelope_with(1, "billing.invoice_issued", serde_json::json!({}));
    process
        .publisher()
        .publish(&queue, &job, Default::default())
        .await
        .expect("published to QStash");
    // The handler counts before its transaction commits: wait for the claim.
    eventually("QStash's delivery committed with its claim", async || {
        let processed: i64 = sqlx::query_scalar("select count(*) from core.processed_jobs")
            .fetch_one(&pool)
            .await
            .expect("count");
        (processed == 1).then_some(())
    })
    .await;
    assert_eq!(handled.0.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A request that QStash did not sign runs nothing, whatever it carries.
    let forged =
        jobs_testkit::fixtures::envelope_with(2, "billing.invoice_issued", serde_json::json!({}));
    let body = String::from_utf8(forged.to_json_bytes().expect("json")).expect("utf-8");
    let (status, _) = request(
        port,
        "POST /qstash/billing.invoices",
        &[
            ("upstash-signature", "forged.jwt.token"),
            ("content-type", "application/json"),
        ],
        &body,
    )
    .await
    .expect("an answer");
    assert_eq!(status, 401);
    let (status, _) = request(port, "POST /qstash/other.queue", &[], &body)
        .await
        .expect("an answer");
    assert_eq!(
        status, 404,
        "no route for a queue the process does not serve"
    );
    assert_eq!(handled.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        get(port, "/healthz").await,
        Some((200, "alive\n".to_owned()))
    );
    // A plain destination (no QStash queue) reports no depth, and the process is ready
    // because QStash answered an authenticated call.
    let ready = eventually("/readyz on a plain QStash destination", async || {
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(ready.1, "ready\n");
    process.stop().await;
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qstash_process_whose_token_qstash_refuses_is_not_ready() {
    let fake = jobs_testkit::fakes::qstash::FakeQStash::start()
        .await
        .expect("the fake starts");
    let (db, _pool) = TestDb::migrated().await;
    let port = free_port();
    let destination = format!("http://127.0.0.1:{port}/qstash/{{queue}}");
    let process = counting(
        &db,
        port,
        &[
            ("JOBS_QUEUE_URL", "qstash:"),
            ("QSTASH_TOKEN", "not-the-token"),
            ("QSTASH_URL", fake.base_url()),
            ("QSTASH_DESTINATION", &destination),
            ("QSTASH_CURRENT_SIGNING_KEY", fake.current_signing_key()),
            ("QSTASH_NEXT_SIGNING_KEY", fake.next_signing_key()),
        ],
        &Counted::default(),
    )
    .await;
    let (status, why) = eventually("/readyz has checked", async || {
        get(port, "/readyz")
            .await
            .filter(|(_, why)| !why.contains("not checked yet"))
    })
    .await;
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("QStash does not answer"), "{why}");
    process.stop().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vercel_push_process_runs_real_callbacks_and_nothing_forged() {
    let emulator = jobs_testkit::emulators::VercelQueuesEmulator::start().await;
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    let handled = Counted::default();
    let process = counting(
        &db,
        port,
        &[
            ("JOBS_QUEUE_URL", "vercel-queues://iad1"),
            ("VERCEL_OIDC_TOKEN", "a-token"),
            ("VERCEL_QUEUES_BASE_URL", emulator.base_url()),
            ("VERCEL_QUEUES_PUSH", "on"),
        ],
        &handled,
    )
    .await;
    let queue: jobs_core::QueueName = "billing.invoices".parse().expect("a queue");
    let topic = jobs_adapter_vercel_queues::topic_of(&queue);
    let job =
        jobs_testkit::fixtures::envelope_with(1, "billing.invoice_issued", serde_json::json!({}));
    let receipt = process
        .publisher()
        .publish(&queue, &job, Default::default())
        .await
        .expect("published");
    let id = receipt.message_id.expect("a message id");
    let callback = |message_id: &str, topic: &str| {
        vec![
            ("ce-type".to_owned(), "com.vercel.queue.v2beta".to_owned()),
            ("ce-vqsqueuename".to_owned(), topic.to_owned()),
            ("ce-vqsconsumergroup".to_owned(), "workers".to_owned()),
            ("ce-vqsmessageid".to_owned(), message_id.to_owned()),
        ]
    };
    let post = async |headers: Vec<(String, String)>, body: &str| {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        request(port, "POST /vercel/queues", &headers, body)
            .await
            .expect("an answer")
    };

    // A forged callback: a made-up receipt handle and an envelope of any tenant.
    let forged =
        jobs_testkit::fixtures::envelope_with(9, "billing.invoice_issued", serde_json::json!({}));
    let mut headers = callback(&id, &topic);
    headers.push(("ce-vqsreceipthandle".to_owned(), "made-up".to_owned()));
    headers.push(("ce-vqsdeliverycount".to_owned(), "1".to_owned()));
    headers.push(("content-type".to_owned(), "application/json".to_owned()));
    let body = String::from_utf8(forged.to_json_bytes().expect("json")).expect("utf-8");
    let (status, answer) = post(headers, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("skipped"), "{answer}");
    assert_eq!(
        handled.0.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing ran"
    );

    // A callback for a queue this process does not serve.
    let other = jobs_adapter_vercel_queues::topic_of(&"other.queue".parse().expect("a queue"));
    let (status, answer) = post(callback(&id, &other), "").await;
    assert_eq!(status, 400, "{answer}");

    // The platform's callback without payload: received by id, run, settled.
    let (status, answer) = post(callback(&id, &topic), "").await;
    assert_eq!((status, answer.as_str()), (200, r#"{"status":"success"}"#));
    assert_eq!(handled.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    process.stop().await;
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_turns_readyz_503_at_once_and_a_second_one_exits_at_once() {
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    let child = Reaped(
        readme_worker(&db.url, port)
            .spawn()
            .expect("the example starts"),
    );
    eventually("its own three jobs", async || {
        let n: i64 = sqlx::query_scalar("select count(*) from booked_invoices")
            .fetch_one(&pool)
            .await
            .ok()?;
        (n == 3).then_some(())
    })
    .await;
    eventually("/readyz", async || {
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    // A job whose handler waits on a lock this test holds: in flight when the stop comes.
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("lock table booked_invoices in access exclusive mode")
        .execute(&mut *lock)
        .await
        .expect("lock");
    let queue = jobs_adapter_postgres::PgQueue::new(pool.clone());
    let job = jobs_testkit::fixtures::envelope_with(
        4,
        "billing.invoice_issued",
        serde_json::json!({ "invoice": 4 }),
    );
    jobs_core::QueuePort::publish(
        &queue,
        &"billing.invoices".parse().expect("a queue"),
        &job,
        Default::default(),
    )
    .await
    .expect("publish");
    eventually("the job waiting on the lock", async || {
        let leased: i64 = sqlx::query_scalar("select count(*) from core.jobs where leased")
            .fetch_one(&pool)
            .await
            .ok()?;
        (leased == 1).then_some(())
    })
    .await;

    let pid = child.0.id().to_string();
    let signal = || {
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs")
    };
    assert!(signal().success());
    let mut child = child;
    let not_ready = eventually("/readyz refusing", async || {
        // A process gone already cannot answer: say how it ended rather than wait it out.
        if let Ok(Some(status)) = child.0.try_wait() {
            let mut log = String::new();
            if let Some(mut stderr) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            }
            panic!("the process ended at the first signal ({status}): {log}");
        }
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 503)
    })
    .await;
    assert_eq!(not_ready.1, "stopping\n");
    // Draining: the job cannot finish while the lock is held, so the process waits.
    assert!(signal().success(), "a second signal");
    let (exited, log) = terminate_waited(child).await;
    lock.rollback().await.expect("release the lock");
    assert_eq!(exited.code(), Some(130), "{log}");
    assert!(log.contains("second stop signal"), "{log}");
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_while_the_store_does_not() {
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    let process = counting(&db, port, &[], &Counted::default()).await;
    eventually("/readyz", async || {
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    // The store's schema goes away under the running process.
    sqlx::query("drop schema core cascade")
        .execute(&pool)
        .await
        .expect("drop the schema");
    let (_, why) = eventually("/readyz refusing", async || {
        get(port, "/readyz")
            .await
            .filter(|(status, _)| *status == 503)
    })
    .await;
    assert!(why.contains("run `jobsctl migrate`"), "{why}");
    assert_eq!(
        get(port, "/healthz").await.map(|(s, _)| s),
        Some(200),
        "alive all the same"
    );
    process.stop().await;
    pool.close().await;
    db.drop_db().await;
}

/// With `JOBS_CONSOLE_TOKENS`, the process serves the operations console on its address,
/// behind sign-in, beside its probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_with_console_tokens_serves_the_console_behind_sign_in() {
    let (db, pool) = TestDb::migrated().await;
    let port = free_port();
    let process = counting(
        &db,
        port,
        &[("JOBS_CONSOLE_TOKENS", "process-console-token-0123")],
        &Counted::default(),
    )
    .await;
    let (status, body) = eventually("the console's sign-in", async || get(port, "/").await).await;
    assert_eq!(status, 401, "no session: {body}");
    assert!(body.contains("Sign in"), "{body}");
    let (healthz, _) = eventually("/healthz", async || get(port, "/healthz").await).await;
    assert_eq!(healthz, 200, "the probes are still there");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let signed_in = client
        .post(format!("http://127.0.0.1:{port}/login"))
        .form(&[("token", "process-console-token-0123")])
        .send()
        .await
        .expect("an answer");
    assert_eq!(signed_in.status(), reqwest::StatusCode::SEE_OTHER);
    assert!(signed_in.headers().get("set-cookie").is_some());
    process.stop().await;
    pool.close().await;
    db.drop_db().await;
}

//! The real `jobsctl` binary: migrate, dead letters, cleanup and envelope validation.

use crate::temp::TempDb;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use jobs_adapter_sqlite::SqliteStore;
use jobs_core::DeadLetterStore;

pub(crate) fn jobsctl(args: &[&str]) -> Output {
    jobsctl_with(args, &[])
}

/// `jobsctl` with `args`, configured only by `env` (every other configuration variable
/// removed, so the machine's environment cannot leak in).
pub(crate) fn jobsctl_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobsctl"));
    command.args(args).env_remove(jobs_ops::compose::CONFIG_ENV);
    for key in jobs_ops::compose::KEYS {
        command.env_remove(key.env);
    }
    command
        .envs(env.iter().copied())
        .output()
        .expect("jobsctl runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn migrate_then_review_and_discard_dead_letters_on_sqlite() {
    let db = TempDb::new("review");
    let url = db.url();
    let migrated = jobsctl(&["migrate", "--database-url", &url]);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        jobsctl(&["migrate", "--database-url", &url])
            .status
            .success(),
        "idempotent"
    );

    let store = Arc::new(SqliteStore::open(&db.0).await.expect("open"));
    for (n, payload) in [&b"\xff\x00not json"[..], b"{\"kind\":\"x\"}"]
        .iter()
        .enumerate()
    {
        let letter = format!("poison number {n}");
        store
            .record(jobs_testkit::fixtures::raw_letter(
                "billing.invoices",
                payload,
                &letter,
            ))
            .await
            .expect("record");
    }
    store.pool().close().await;

    let list = jobsctl(&["dead-letters", "list", "--database-url", &url]);
    assert!(list.status.success(), "{list:?}");
    let table = stdout(&list);
    assert!(
        table.contains("poison number 0") && table.contains("poison number 1"),
        "{table}"
    );

    let json = shown_json(&url);
    assert_eq!(
        json["payload"]["hex"], "ff006e6f74206a736f6e",
        "raw bytes shown intact"
    );

    assert_eq!(json["history"], serde_json::json!([]), "no history yet");

    let discard = jobsctl_with(
        &["dead-letters", "discard", "1", "--database-url", &url],
        &[("USER", "alice")],
    );
    assert!(discard.status.success(), "{discard:?}");
    let again = jobsctl_with(
        &["dead-letters", "discard", "1", "--database-url", &url],
        &[("USER", "bob")],
    );
    assert!(
        again.status.success() && stdout(&again).contains("already discarded"),
        "{again:?}"
    );

    // the discard is in the letter's history, once, with who did it; the repeat is not
    let shown = jobsctl(&["dead-letters", "show", "1", "--database-url", &url]);
    assert!(shown.status.success(), "{shown:?}");
    let text = stdout(&shown);
    let events: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "history:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    assert!(
        events[0].ends_with("  pending_review -> discarded  jobsctl (alice)"),
        "{text}"
    );
    let json = shown_json(&url);
    let history = json["history"].as_array().expect("a history array");
    assert_eq!(history.len(), 1, "{json}");
    assert_eq!(
        (&history[0]["from"], &history[0]["to"], &history[0]["by"]),
        (
            &serde_json::json!("pending_review"),
            &serde_json::json!("discarded"),
            &serde_json::json!("jobsctl (alice)")
        ),
        "{json}"
    );
    assert!(
        history[0]["at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{json}"
    );
    let missing = jobsctl(&["dead-letters", "discard", "99", "--database-url", &url]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");

    let pending = jobsctl(&[
        "dead-letters",
        "list",
        "--status",
        "pending_review",
        "--json",
        "--database-url",
        &url,
    ]);
    let lines: Vec<serde_json::Value> = stdout(&pending)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON Lines"))
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["id"], 2);

    let cleanup = jobsctl(&[
        "cleanup",
        "processed",
        "--older-than",
        "30d",
        "--database-url",
        &url,
    ]);
    assert!(cleanup.status.success(), "{cleanup:?}");
    let below = |told: &[&str]| {
        let mut args = vec!["cleanup", "processed", "--older-than", "1h"];
        args.extend_from_slice(told);
        args.extend_from_slice(&["--database-url", url.as_str()]);
        jobsctl(&args)
    };
    let refused = below(&[]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--below-floor"),
        "the refusal names the override: {refused:?}"
    );
    let told = below(&["--below-floor"]);
    assert!(told.status.success(), "{told:?}");
    let bad = jobsctl(&[
        "cleanup",
        "processed",
        "--older-than",
        "30",
        "--database-url",
        &url,
    ]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "a duration without a unit is a usage error"
    );
}

#[test]
fn envelope_validate_names_the_field_of_each_invalid_envelope() {
    let valid = r#"{"job_id":"017f22e2-79b0-7cc3-98c4-dc0c0c07398f","tenant_id":"0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90","correlation_id":"0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19","kind":"billing.invoice_issued","data":{}}"#;
    let corpus = [
        (valid.to_owned(), None),
        (valid.replace("7cc3", "4cc3"), Some("job_id")),
        (valid.replace("0b6c5e5a", "0b6c5e5"), Some("tenant_id")),
        (
            valid.replace("0192f0a4-8d7e-7c3b", "0192f0a4-8d7e-0c3b"),
            Some("correlation_id"),
        ),
        (
            valid.replace("billing.invoice_issued", "Billing"),
            Some("kind"),
        ),
        (valid.replace(r#","data":{}"#, ""), Some("data")),
        (
            valid.replace(r#""data":{}"#, r#""data":{},"extra":1"#),
            Some("extra"),
        ),
    ];
    for (envelope, field) in &corpus {
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobsctl"))
            .args(["envelope", "validate", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("jobsctl runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(envelope.as_bytes())
            .expect("write");
        let output = child.wait_with_output().expect("finishes");
        match field {
            None => assert_eq!(output.status.code(), Some(0), "{}", stdout(&output)),
            Some(field) => {
                assert_eq!(output.status.code(), Some(1), "{envelope}");
                assert!(
                    stdout(&output).contains(&format!("invalid: {field}:")),
                    "{field} not named: {}",
                    stdout(&output)
                );
            }
        }
    }
    let usage = jobsctl(&["envelope", "validate", "/no/such/file.json"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[tokio::test]
async fn cron_tick_dry_run_plans_the_tenants_whose_tier_is_due() {
    let db = crate::pg::TestDb::create().await;
    assert!(
        jobsctl(&["migrate", "--database-url", &db.url])
            .status
            .success(),
        "migrate"
    );
    let pool = db.pool().await;
    for (tenant, tier) in [
        ("00000000-0000-4000-8000-000000000001", "1h"),
        ("00000000-0000-4000-8000-000000000002", "6h"),
        ("00000000-0000-4000-8000-000000000003", "12h"),
    ] {
        sqlx::query("insert into core.tenants (id, entitlements) values ($1::uuid, $2::jsonb)")
            .bind(tenant)
            .bind(format!(r#"{{"data_freshness":"{tier}"}}"#))
            .execute(&pool)
            .await
            .expect("insert a tenant");
    }
    pool.close().await;

    let at = "2026-12-01T06:00:00Z";
    let dry = jobsctl(&[
        "cron",
        "tick",
        "--at",
        at,
        "--dry-run",
        "--database-url",
        &db.url,
    ]);
    let text = stdout(&dry);
    assert!(dry.status.success(), "{dry:?}");
    let freshness = text
        .lines()
        .find(|l| l.trim_start().starts_with("core.data_freshness"))
        .unwrap_or_else(|| panic!("no data-freshness fan-out at 06:00:\n{text}"));
    assert!(
        freshness.contains("2 jobs"),
        "1h and 6h are due at 06:00, 12h is not: {freshness}"
    );
    assert!(
        text.contains("(tier 6h)") && !text.contains("(tier 12h)"),
        "{text}"
    );

    // Fired for real into the PostgreSQL queue, twice (a second operator, or a scheduler
    // that also fired the slot): the jobs derived from (task, tenant, slot) are queued once.
    // The first names no queue: with a PostgreSQL store, the queue is the store's own.
    let queue_url = db.url.replacen("postgres", "postgres-queue", 1);
    let fire = || {
        jobsctl(&[
            "cron",
            "tick",
            "--at",
            at,
            "--database-url",
            &db.url,
            "--queue-url",
            &queue_url,
        ])
    };
    let first = jobsctl(&["cron", "tick", "--at", at, "--database-url", &db.url]);
    assert!(first.status.success(), "{first:?}");
    assert!(
        stdout(&first).contains("published to postgres-queue:"),
        "{first:?}"
    );
    let again = fire();
    assert!(again.status.success(), "{again:?}");
    let pool = db.pool().await;
    let queued: Vec<(String, String, String)> = sqlx::query_as(
        "select queue, convert_from(payload, 'UTF8')::jsonb->>'kind', tenant_id::text \
         from core.jobs order by queue, tenant_id",
    )
    .fetch_all(&pool)
    .await
    .expect("read the queue");
    let freshness: Vec<&str> = queued
        .iter()
        .filter(|(_, kind, _)| kind == "core.data_freshness")
        .map(|(_, _, tenant)| tenant.as_str())
        .collect();
    assert_eq!(
        freshness,
        [
            "00000000-0000-4000-8000-000000000001",
            "00000000-0000-4000-8000-000000000002"
        ],
        "the tenants due at 06:00, once each: {queued:?}"
    );
    let mut distinct = queued.clone();
    distinct.dedup();
    assert_eq!(distinct, queued, "nothing doubled by the second tick");
    pool.close().await;
    db.drop_db().await;
}

#[test]
fn output_cut_short_by_its_reader_ends_quietly() {
    let valid = r#"{"job_id":"017f22e2-79b0-7cc3-98c4-dc0c0c07398f","tenant_id":"0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90","correlation_id":"0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19","kind":"billing.invoice_issued","data":{}}"#;
    let input = format!("{valid}\n").repeat(20_000);
    // `jobsctl envelope validate --lines --json | head -1`: the reader leaves after a line.
    let mut child = Command::new(env!("CARGO_BIN_EXE_jobsctl"))
        .args(["envelope", "validate", "--lines", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("jobsctl runs");
    let mut stdin = child.stdin.take().expect("stdin");
    // Once jobsctl has stopped, writing its input fails too: that is expected.
    let feeding = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut first = [0u8; 16];
    std::io::Read::read_exact(&mut out, &mut first).expect("some output");
    drop(out);
    feeding.join().expect("the feeder ends");
    let output = child.wait_with_output().expect("finishes");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn errors_name_what_to_do_and_say_their_cause_once() {
    let refused = jobsctl(&[
        "migrate",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/postgres",
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("connect to PostgreSQL at 127.0.0.1:1"),
        "names the host and port: {stderr}"
    );
    assert_eq!(
        stderr.matches("Connection refused").count(),
        1,
        "the cause once: {stderr}"
    );

    let status = jobsctl(&["dead-letters", "list", "--status", "pending"]);
    let stderr = String::from_utf8_lossy(&status.stderr).into_owned();
    assert_eq!(status.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("accepted values: pending_review, replayed, discarded"),
        "{stderr}"
    );
}

#[test]
fn the_console_refuses_to_serve_without_sign_in_beyond_loopback_or_without_tokens() {
    let open = jobsctl_with(
        &["console", "--listen", "0.0.0.0:0", "--no-auth"],
        &[("DATABASE_URL", "sqlite://.jobs/console-test.db")],
    );
    assert_eq!(open.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&open.stderr);
    assert!(stderr.contains("only on a loopback address"), "{stderr}");
    let tokenless = jobsctl_with(
        &["console", "--listen", "127.0.0.1:0"],
        &[("DATABASE_URL", "sqlite://.jobs/console-test.db")],
    );
    assert_eq!(tokenless.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&tokenless.stderr);
    assert!(stderr.contains("JOBS_CONSOLE_TOKENS"), "{stderr}");
    let short = jobsctl_with(
        &["console", "--listen", "127.0.0.1:0"],
        &[
            ("DATABASE_URL", "sqlite://.jobs/console-test.db"),
            ("JOBS_CONSOLE_TOKENS", "short"),
        ],
    );
    assert_eq!(short.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(stderr.contains("at least 16 characters"), "{stderr}");
}

/// `jobsctl dead-letters show 1 --json` on the store at `url`, parsed.
fn shown_json(url: &str) -> serde_json::Value {
    let shown = jobsctl(&["dead-letters", "show", "1", "--json", "--database-url", url]);
    serde_json::from_slice(&shown.stdout).expect("show prints JSON")
}

/// `GET /` on `port` with `host` in `Host`: the status line.
fn status_for_host(port: u16, host: &str) -> Option<String> {
    use std::io::{BufRead, BufReader};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    Some(line.trim_end().to_owned())
}

#[tokio::test]
async fn the_console_answers_the_hosts_allowed_host_names_and_refuses_others() {
    let db = TempDb::new("hosts");
    assert!(
        jobsctl(&["migrate", "--database-url", &db.url()])
            .status
            .success()
    );
    let refused = jobsctl_with(
        &[
            "console",
            "--no-auth",
            "--listen",
            "127.0.0.1:0",
            "--allowed-host",
            "not a host",
        ],
        &[("DATABASE_URL", &db.url()), ("JOBS_QUEUE_URL", "memory:")],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--allowed-host: `not a host`"), "{stderr}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobsctl"));
    command
        .args(["console", "--no-auth", "--listen", &listen])
        .args(["--allowed-host", "jobs.internal"])
        .env_remove(jobs_ops::compose::CONFIG_ENV);
    for key in jobs_ops::compose::KEYS {
        command.env_remove(key.env);
    }
    let child = crate::process::Reaped(
        command
            .env("DATABASE_URL", db.url())
            .env("JOBS_QUEUE_URL", "memory:")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the console starts"),
    );
    let named = crate::process::eventually("the console answers", async || {
        status_for_host(port, &format!("jobs.internal:{port}"))
    })
    .await;
    assert!(named.contains(" 200 "), "{named}");
    let other = status_for_host(port, &format!("rebind.evil.example:{port}")).expect("an answer");
    assert!(other.contains(" 421 "), "{other}");
    drop(child);
}

/// Who a change is recorded as: `--as NAME`, else `$USER`, else the uid's name (containers
/// and CI often set no `$USER`), never "unknown user" where the system knows the uid.
#[tokio::test]
async fn the_history_names_the_uids_user_without_user_and_the_given_name_with_as() {
    let db = TempDb::new("acting");
    let url = db.url();
    assert!(
        jobsctl(&["migrate", "--database-url", &url])
            .status
            .success()
    );
    let store = SqliteStore::open(&db.0).await.expect("open");
    for n in 0..2 {
        store
            .record(jobs_testkit::fixtures::raw_letter(
                "billing.invoices",
                b"{}",
                &format!("letter {n}"),
            ))
            .await
            .expect("record");
    }
    store.pool().close().await;
    let by = |id: &str| {
        let shown = jobsctl(&["dead-letters", "show", id, "--json", "--database-url", &url]);
        let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
        json["history"][0]["by"]
            .as_str()
            .expect("a change")
            .to_owned()
    };
    let mut no_user = Command::new(env!("CARGO_BIN_EXE_jobsctl"));
    no_user
        .args(["dead-letters", "discard", "1", "--database-url", &url])
        .env_remove("USER");
    assert!(no_user.output().expect("runs").status.success());
    let id = Command::new("id").arg("-un").output().expect("id runs");
    let name = String::from_utf8_lossy(&id.stdout).trim().to_owned();
    assert_eq!(by("1"), format!("jobsctl ({name})"));

    let given = jobsctl_with(
        &[
            "dead-letters",
            "discard",
            "2",
            "--as",
            "carol",
            "--database-url",
            &url,
        ],
        &[("USER", "alice")],
    );
    assert!(given.status.success(), "{given:?}");
    assert_eq!(by("2"), "jobsctl (carol)", "--as wins over $USER");
    let blank = jobsctl(&["dead-letters", "list", "--as", " ", "--database-url", &url]);
    assert_eq!(blank.status.code(), Some(2), "{blank:?}");
}

//! One `jobs.toml` for the worker process and `jobsctl`: with a PostgreSQL store, the queue is
//! the one in the store's database, which the worker runs grouped and `jobsctl` reaches.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::cli::jobsctl_with;
use crate::pg::TestDb;
use crate::process::{Reaped, eventually, terminate};

/// The README's worker (`ops/examples/worker.rs`), built with the workspace's tests.
fn readme_worker() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug/deps");
    let path = debug.join("examples").join("worker");
    assert!(
        path.exists(),
        "{} is built with the workspace's tests (cargo build -p jobs-ops --features postgres \
         --examples)",
        path.display()
    );
    path
}

async fn booked(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from booked_invoices")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

fn publish(env: &[(&str, &str)], invoice: u32, extra: &[&str]) -> std::process::Output {
    let data = format!("{{\"invoice\":{invoice}}}");
    let args = [
        &[
            "publish",
            "--queue",
            "billing.invoices",
            "--kind",
            "billing.invoice_issued",
            "--tenant",
            "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90",
            "--data",
            &data,
        ][..],
        extra,
    ]
    .concat();
    jobsctl_with(&args, env)
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_jobs_toml_runs_the_worker_grouped_and_lets_jobsctl_reach_its_jobs() {
    let db = TestDb::create().await;
    let dir = std::env::temp_dir().join(format!(
        "jobs-one-config-{}-{}",
        std::process::id(),
        jobs_core::JobId::generate()
    ));
    std::fs::create_dir_all(&dir).expect("a directory");
    let file = dir.join("jobs.toml");
    std::fs::write(
        &file,
        format!(
            "database_url = \"{}\"\nqueue_url = \"postgres-queue:\"\n",
            db.url
        ),
    )
    .expect("write jobs.toml");
    let file_str = file.to_str().expect("a UTF-8 path");
    let with_file = [("JOBS_CONFIG", file_str)];
    let migrated = jobsctl_with(&["migrate"], &with_file);
    assert!(migrated.status.success(), "{migrated:?}");
    let pool = db.pool().await;

    let port = free_port();
    let mut command = Command::new(readme_worker());
    command
        .env_remove("DATABASE_URL")
        .env_remove("JOBS_QUEUE_URL");
    let worker = Reaped(
        command
            .env("JOBS_CONFIG", &file)
            .env("JOBS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the worker starts"),
    );
    eventually("the worker's own three jobs", async || {
        (booked(&pool).await == 3).then_some(())
    })
    .await;

    let published = publish(&with_file, 4, &[]);
    assert!(published.status.success(), "{published:?}");
    eventually("the job jobsctl published, run by the worker", async || {
        (booked(&pool).await == 4).then_some(())
    })
    .await;
    // A job for later, so that the queue holds one when jobsctl looks.
    let later = publish(&with_file, 6, &["--delay", "1h"]);
    assert!(later.status.success(), "{later:?}");
    let queues = jobsctl_with(&["queues", "--json"], &with_file);
    let listed = String::from_utf8_lossy(&queues.stdout).into_owned();
    assert!(queues.status.success(), "{queues:?}");
    let row: serde_json::Value = listed
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON lines"))
        .find(|row: &serde_json::Value| row["queue"] == "billing.invoices")
        .unwrap_or_else(|| panic!("billing.invoices listed: {listed}"));
    assert_eq!(row["delayed"], 1, "{row}");
    assert!(
        !String::from_utf8_lossy(&queues.stderr).contains("process only"),
        "{queues:?}"
    );

    let (exited, log) = terminate(worker).await;
    assert!(exited.success(), "{log}");
    let started = log
        .lines()
        .find(|line| line.contains("worker process started"))
        .unwrap_or_else(|| panic!("no start line:\n{log}"));
    assert!(
        started.contains("the PostgreSQL queue in the store's database (grouped)"),
        "{started}"
    );
    assert!(!log.contains("run per job"), "{log}");

    // With only a PostgreSQL DATABASE_URL, the queue is that database's too.
    let only_database = publish(&[("DATABASE_URL", db.url.as_str())], 5, &[]);
    assert!(only_database.status.success(), "{only_database:?}");
    let queued: i64 = sqlx::query_scalar("select count(*) from core.jobs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(queued, 2, "the delayed job and this one are in core.jobs");
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_another_queue_says_at_start_that_it_runs_per_job() {
    let db = TestDb::create().await;
    let migrated = jobsctl_with(&["migrate", "--database-url", &db.url], &[]);
    assert!(migrated.status.success(), "{migrated:?}");
    let port = free_port();
    let worker = Reaped(
        Command::new(readme_worker())
            .env("DATABASE_URL", &db.url)
            .env("JOBS_QUEUE_URL", "memory:")
            .env("JOBS_CONFIG", "/dev/null")
            .env("JOBS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the worker starts"),
    );
    eventually("the worker serves", async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let (_, log) = terminate(worker).await;
    let warning = log
        .lines()
        .find(|line| line.contains("run per job, not grouped"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warning.contains("WARN") && warning.contains("JOBS_QUEUE_URL"),
        "{warning}"
    );
    db.drop_db().await;
}

//! `jobsctl outbox relay` and `jobsctl cron run`: the standing loops run alone, until
//! SIGTERM.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::pg::TestDb;

/// Polls `check` every 100 ms for up to 30 s.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30 s");
}

/// Commits one `billing.invoices` job into `core.outbox`, as an application's transaction does.
async fn into_the_outbox(pool: &sqlx::PgPool) {
    let queue: jobs_core::QueueName = "billing.invoices".parse().expect("a queue");
    let job =
        jobs_testkit::fixtures::envelope_with(1, "billing.invoice_issued", serde_json::json!({}));
    let mut tx = pool.begin().await.expect("begin");
    jobs_adapter_postgres::Outbox::new()
        .publish_in(&mut tx, &queue, &job, Default::default())
        .await
        .expect("into the outbox");
    tx.commit().await.expect("commit");
}

/// Kills the child if the test fails before it exits.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `child` and waits for it to exit, with its log.
async fn terminate(mut child: Reaped) -> (std::process::ExitStatus, String) {
    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.expect("kill runs").success());
    let exited = eventually("the process exits", async || child.0.try_wait().ok()?).await;
    let mut log = String::new();
    if let Some(mut stderr) = child.0.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut log).expect("its log");
    }
    (exited, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobsctl_runs_the_outbox_relay_and_the_cron_scheduler_until_sigterm() {
    let (db, pool) = TestDb::migrated().await;
    into_the_outbox(&pool).await;
    let queue_url = db.url.replacen("postgres://", "postgres-queue://", 1);
    let jobsctl = |command: &[&str]| {
        Reaped(
            Command::new(env!("CARGO_BIN_EXE_jobsctl"))
                .args(command)
                .args(["--database-url", &db.url, "--queue-url", &queue_url])
                .env("JOBS_CONFIG", "/dev/null")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("jobsctl starts"),
        )
    };
    let count = async |sql: &str| -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&pool)
            .await
            .expect("count")
    };

    let relay = jobsctl(&["outbox", "relay"]);
    eventually("the row relayed", async || {
        let moved = count("select count(*) from core.jobs where queue = 'billing.invoices'").await;
        let left = count("select count(*) from core.outbox").await;
        (moved == 1 && left == 0).then_some(())
    })
    .await;
    let (exited, log) = terminate(relay).await;
    assert!(exited.success(), "{exited}: {log}");
    assert!(log.contains("outbox relay stopped"), "{log}");

    let cron = jobsctl(&["cron", "run"]);
    eventually("the first tick's jobs", async || {
        (count("select count(*) from core.jobs where queue like 'core.%'").await > 0).then_some(())
    })
    .await;
    let (exited, log) = terminate(cron).await;
    assert!(exited.success(), "{exited}: {log}");
    assert!(log.contains("cron scheduler stopped"), "{log}");
    pool.close().await;
    db.drop_db().await;
}

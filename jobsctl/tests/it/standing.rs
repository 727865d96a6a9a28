//! `jobsctl outbox relay` and `jobsctl cron run`: the standing loops run alone, until
//! SIGTERM.

use std::process::{Command, Stdio};

use crate::pg::{TestDb, into_the_outbox};
use crate::process::{Reaped, eventually, terminate};

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
    let count = async |sql: &'static str| -> i64 {
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

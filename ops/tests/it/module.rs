//! The module binary example (`ops/examples/module.rs`) as a deploy runs it: `migrate` twice
//! (the second changes nothing), `publish` without a worker, then `run` drains and stops on
//! SIGTERM; the process's flags after the subcommand.

use std::process::{Command, Stdio};

use crate::pg::TestDb;
use crate::process::{Reaped, eventually, terminate};
use crate::worker_process::{example, free_port};

fn module(db: &TestDb, args: &[&str]) -> std::process::Output {
    Command::new(example("module"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("JOBS_CONFIG", "/dev/null")
        .env_remove("JOBS_QUEUE_URL")
        .output()
        .expect("the example runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_binary_migrates_publishes_and_runs_from_one_configuration() {
    let db = TestDb::create().await;
    for round in 0..2 {
        let migrated = module(&db, &["migrate"]);
        assert!(migrated.status.success(), "round {round}: {migrated:?}");
        assert_eq!(String::from_utf8_lossy(&migrated.stdout).trim(), "migrated");
    }
    let pool = db.pool().await;
    let count = async |sql: &str| -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&pool)
            .await
            .expect(sql)
    };
    assert_eq!(
        count("select count(*) from booked_invoices").await,
        0,
        "its own table"
    );

    let published = module(&db, &["publish", "--invoice", "7"]);
    assert!(published.status.success(), "{published:?}");
    assert_eq!(
        count("select count(*) from core.jobs").await,
        1,
        "queued, no worker ran"
    );
    let memory = Command::new(example("module"))
        .args(["publish", "--invoice", "8", "--queue-url", "memory:"])
        .env("DATABASE_URL", &db.url)
        .env("JOBS_CONFIG", "/dev/null")
        .output()
        .expect("runs");
    assert!(!memory.status.success(), "{memory:?}");
    assert!(
        String::from_utf8_lossy(&memory.stderr).contains("lives in this process only"),
        "{memory:?}"
    );

    let port = free_port();
    let worker = Reaped(
        Command::new(example("module"))
            .args(["run", "--http-addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &db.url)
            .env("JOBS_CONFIG", "/dev/null")
            .env_remove("JOBS_QUEUE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the worker starts"),
    );
    eventually("the published invoice booked", async || {
        let booked: i64 =
            sqlx::query_scalar("select count(*) from booked_invoices where invoice = 7")
                .fetch_one(&pool)
                .await
                .ok()?;
        (booked == 1).then_some(())
    })
    .await;
    let (exited, log) = terminate(worker).await;
    assert!(exited.success(), "{log}");
    assert!(
        log.contains(&format!("127.0.0.1:{port}")),
        "the flag after `run` applied: {log}"
    );
    assert_eq!(
        count("select count(*) from core.jobs").await,
        0,
        "nothing left"
    );
    pool.close().await;
    db.drop_db().await;
}

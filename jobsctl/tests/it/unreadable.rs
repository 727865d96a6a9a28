//! A dead letter the store cannot read (a row written by SQL with a queue that is no valid
//! name) costs its own line: `dead-letters list` lists the rest and warns, and the console's
//! list and overview answer, each showing the row's id and why.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use jobs_adapter_postgres::PgStore;
use jobs_core::DeadLetterStore;
use jobs_testkit::fixtures::raw_letter;

use crate::cli::jobsctl_with;
use crate::pg::TestDb;

/// The body of `GET path` from the console on `port`, with its status line.
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.lines().next()?.to_owned();
    Some((status, answer))
}

#[tokio::test]
async fn an_unreadable_dead_letter_costs_its_line_in_the_list_and_the_console() {
    let (db, pool) = TestDb::migrated().await;
    let store = PgStore::from_pool(pool.clone());
    let mut ids = vec![];
    for n in 0..3 {
        let recorded = store
            .record(raw_letter(
                "billing.invoices",
                b"{}",
                &format!("failure number {n}"),
            ))
            .await
            .expect("record");
        ids.push(recorded.id());
    }
    sqlx::query("update core.dead_letters set queue = 'no queue name!' where id = $1")
        .bind(ids[1].0)
        .execute(&pool)
        .await
        .expect("spoil one row");
    let env = [
        ("DATABASE_URL", db.url.as_str()),
        ("JOBS_QUEUE_URL", "memory:"),
    ];

    let list = jobsctl_with(&["dead-letters", "list"], &env);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&list.stdout).into_owned(),
        String::from_utf8_lossy(&list.stderr).into_owned(),
    );
    assert!(list.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("failure number 0") && stdout.contains("failure number 2"),
        "{stdout}"
    );
    assert!(!stdout.contains("failure number 1"), "{stdout}");
    assert!(
        stderr.contains(&format!("dead letter {} cannot be read", ids[1]))
            && stderr.contains("queue"),
        "{stderr}"
    );
    let json = jobsctl_with(&["dead-letters", "list", "--json"], &env);
    assert!(json.status.success(), "{json:?}");
    assert_eq!(String::from_utf8_lossy(&json.stdout).lines().count(), 2);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobsctl"));
    command
        .args([
            "console",
            "--no-auth",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env_remove(jobs_ops::compose::CONFIG_ENV);
    for key in jobs_ops::compose::KEYS {
        command.env_remove(key.env);
    }
    let child = crate::process::Reaped(
        command
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the console starts"),
    );
    let (status, page) =
        crate::process::eventually("the console answers", async || get(port, "/letters")).await;
    assert!(status.contains(" 200 "), "{status}");
    for readable in [ids[0], ids[2]] {
        let row = format!("<tr data-id=\"{readable}\"><td><a href=\"/letters/{readable}\">");
        assert!(page.contains(&row), "{readable} listed: {page}");
    }
    assert!(
        page.contains(&format!("<tr class=\"unreadable\" data-id=\"{}\">", ids[1])),
        "the row is listed as unreadable: {page}"
    );
    let (status, overview) = get(port, "/").expect("the overview");
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        overview.contains("1 of them cannot be read as letters"),
        "{overview}"
    );
    drop(child);
    db.drop_db().await;
}

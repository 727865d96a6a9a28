//! The README's worker over PostgreSQL with rows of 5 MiB in its queue, written by direct SQL
//! (as a version without the publish check could have): they become dead letters with their
//! bytes, copied inside the database, while the process's peak memory stays small and its own
//! jobs run; rows that are no envelope become poison letters of the tenant their rows carried.

use jobs_adapter_postgres::sqlx;

use crate::pg::TestDb;
use crate::process::{Reaped, eventually, terminate};
use crate::worker_process::{free_port, readme_worker};

const ROWS: i32 = 64;
const BYTES: i32 = 5 << 20;
const TENANT: &str = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90";

/// The peak resident set of process `pid`, in bytes (`VmHWM` of `/proc/<pid>/status`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("a VmHWM line");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_over_the_limit_become_byte_identical_letters_without_reaching_the_workers_memory() {
    let (db, pool) = TestDb::migrated().await;
    // Distinct bytes per row, kept aside for the comparison.
    sqlx::query(
        "create table originals as select n, \
             substring(decode(repeat(md5(n::text), $2 / 16 + 1), 'hex') from 1 for $2) as payload \
         from generate_series(1, $1) as n",
    )
    .bind(ROWS)
    .bind(BYTES)
    .execute(&pool)
    .await
    .expect("originals");
    sqlx::query(
        "insert into core.jobs (queue, dedup_key, payload, tenant_id, visible_at, created_at) \
         select 'billing.invoices', 'raw-' || n, payload, $1::uuid, now(), now() \
         from originals order by n",
    )
    .bind(TENANT)
    .execute(&pool)
    .await
    .expect("rows over the limit");
    // And two that are no envelope at all: poison, which keeps the tenant its row carried.
    sqlx::query(
        "insert into core.jobs (queue, dedup_key, payload, tenant_id, visible_at, created_at) \
         select 'billing.invoices', 'junk-' || n, convert_to('not an envelope', 'UTF8'), \
             $1::uuid, now(), now() from generate_series(1, 2) as n",
    )
    .bind(TENANT)
    .execute(&pool)
    .await
    .expect("poison rows");

    let port = free_port();
    let child = Reaped(
        readme_worker(&db.url, port)
            .spawn()
            .expect("the example starts"),
    );
    let pid = child.0.id();
    let (booked, letters): (i64, i64) = eventually("three booked and every row a letter", async || {
        let counts: (i64, i64) = sqlx::query_as(
            "select (select count(*) from booked_invoices), (select count(*) from core.dead_letters)",
        )
        .fetch_one(&pool)
        .await
        .ok()?;
        (counts.0 >= 3 && counts.1 >= i64::from(ROWS) + 2).then_some(counts)
    })
    .await;
    assert_eq!((booked, letters), (3, i64::from(ROWS) + 2));
    let peak = peak_rss(pid);
    let (exited, log) = terminate(child).await;
    assert!(exited.success(), "exit status {exited}: {log}");
    assert!(
        peak < 100 << 20,
        "the worker's peak RSS was {} MB with {ROWS} rows of {BYTES} bytes in its queue",
        peak >> 20
    );

    let faithful: i64 = sqlx::query_scalar(
        "select count(*) from core.dead_letters d join originals o on d.payload = o.payload \
         where d.queue = 'billing.invoices' and d.tenant_id = $1::uuid \
           and d.status = 'pending_review' \
           and d.last_error like 'the envelope is ' || $2 || ' bytes, over the limit of %'",
    )
    .bind(TENANT)
    .bind(i64::from(BYTES))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        faithful,
        i64::from(ROWS),
        "each letter holds its row's bytes"
    );
    let poison_of_the_tenant: i64 = sqlx::query_scalar(
        "select count(*) from core.dead_letters \
         where payload = convert_to('not an envelope', 'UTF8') and tenant_id = $1::uuid",
    )
    .bind(TENANT)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(
        poison_of_the_tenant, 2,
        "a poison letter keeps its row's tenant"
    );
    let left: i64 = sqlx::query_scalar("select count(*) from core.jobs")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(left, 0, "no row left behind");
    pool.close().await;
    db.drop_db().await;
}

//! The TTL cleanup of `core.processed_jobs` (ADR 0014) next to the batched `DELETE` it
//! replaces, on the same claims in the same run.
//!
//! `JOBS_BENCH_CLEANUP_CLAIMS` claims (default 10,000,000), their ids minted over the last 30
//! days and processed two seconds later (1% of them, delayed jobs, processed now, picked by a
//! hash so that every day has its share), are written
//! to the sliced `core.processed_jobs` and to `unsliced`, a copy of the table as it was before
//! (one table, the same key and `processed_at` index). Each side then removes the same claims,
//! those processed before the start of the day 15 days ago, about half:
//!
//! - **slices**: `ProcessedCleanup::purge` over `PgStore`, the path of the cleanup job and of
//!   `jobsctl cleanup processed` (expired slices truncated, what they keep put back, the rest
//!   in batches of 1,000);
//! - **delete**: the statement the store ran before, batches of 1,000 by `ctid`, until a
//!   batch comes back short.
//!
//! Meanwhile one connection claims new jobs in the table being cleaned, one transaction each,
//! as a worker would: its slowest claims show what the cleanup makes the hot path wait. Each
//! side prints its wall time, the server's CPU time, the rows removed, the tables' bytes
//! before and after (a `DELETE` returns none before a vacuum) and the bytes per claim.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::support;
use anyhow::{Context, Result};
use jobs_adapter_postgres::PgStore;
use jobs_consumers::ProcessedCleanup;
use jobs_core::{ConsumerName, JobId, ManualClock, WorkStore, WorkTransaction};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

const DAY: Duration = Duration::from_secs(86_400);

/// The cleanup's cutoff: the start of the (UTC) day this long ago, about half the 30 days of
/// claims.
const AGE: Duration = Duration::from_secs(15 * 86_400);

/// Claims written per statement while seeding.
const SEED_CHUNK: u64 = 1_000_000;

/// The batch of both sides.
const BATCH: u32 = 1_000;

/// The statement the store's batches ran before ADR 0014, on the copy.
const DELETE_BATCH: &str = "delete from unsliced where ctid = any(array( \
    select u.ctid from unsliced u where u.processed_at < to_timestamp($1) \
    and not exists (select 1 from core.dead_letters d where d.job_id = u.job_id \
        and d.consumer = u.consumer and d.status = 'pending_review') \
    limit $2))";

pub(crate) fn run() -> Result<()> {
    let claims = support::count("JOBS_BENCH_CLEANUP_CLAIMS", 10_000_000)?;
    support::block_on(support::with_database(
        "jobs_bench_cleanup",
        |options| async move { compare(&options, claims).await },
    ))
}

async fn compare(options: &PgConnectOptions, claims: u64) -> Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await?;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await?;
    println!(
        "processed_jobs cleanup: {claims} claims over 30 days of ids, those processed before the start \
         of the day 15 days ago removed; one connection claiming meanwhile"
    );
    seed(&pool, claims).await?;

    // A cutoff at a day's start, so that no slice is partly expired and both sides remove the
    // same claims.
    let now = SystemTime::now();
    let cutoff_s = (now - AGE)
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs()
        / 86_400
        * 86_400;
    let cutoff = SystemTime::UNIX_EPOCH + Duration::from_secs(cutoff_s);
    let clock = ManualClock::default();
    clock.set(now);
    let sliced_bytes = sliced_size(&pool).await?;
    let cleanup = ProcessedCleanup::new(Arc::new(store.clone()))
        .ttl(now.duration_since(cutoff)?)
        .clock(Arc::new(clock))
        .batch(BATCH);
    let claimer = Claimer::start(
        &store,
        "insert into core.processed_jobs (job_id, consumer, processed_at, slot) \
         values ($1, $2, now(), core.processed_slot($1)) on conflict do nothing",
    );
    let cpu = support::Cpu::now();
    let started = Instant::now();
    let removed = cleanup.purge(None).await?;
    let slices = Side {
        name: "slices",
        seconds: started.elapsed().as_secs_f64(),
        server_cpu_s: server_seconds(cpu),
        removed,
        bytes_before: sliced_bytes,
        bytes_after: sliced_size(&pool).await?,
        claims: claimer.stop().await?,
    };

    let unsliced_bytes = table_size(&pool, "unsliced").await?;
    let claimer = Claimer::start(
        &store,
        "insert into unsliced (job_id, consumer, processed_at) values ($1, $2, now()) \
         on conflict do nothing",
    );
    let cpu = support::Cpu::now();
    let started = Instant::now();
    let mut removed = 0;
    loop {
        let done = sqlx::query(DELETE_BATCH)
            .bind(cutoff_s as f64)
            .bind(i64::from(BATCH))
            .execute(&pool)
            .await?
            .rows_affected();
        removed += done;
        if done < u64::from(BATCH) {
            break;
        }
    }
    let delete = Side {
        name: "delete",
        seconds: started.elapsed().as_secs_f64(),
        server_cpu_s: server_seconds(cpu),
        removed,
        bytes_before: unsliced_bytes,
        bytes_after: table_size(&pool, "unsliced").await?,
        claims: claimer.stop().await?,
    };

    println!(
        "{:>7}  {:>10}  {:>9}  {:>13}  {:>12}  {:>11}  {:>14}  {:>14}",
        "side",
        "removed",
        "seconds",
        "server cpu s",
        "MB before",
        "MB after",
        "claim p99 ms",
        "claim max ms"
    );
    for side in [&slices, &delete] {
        side.print(claims);
    }
    println!(
        "slices/delete: {:.1}x faster, {:.1}x less server CPU",
        delete.seconds / slices.seconds,
        delete.server_cpu_s / slices.server_cpu_s.max(0.01)
    );
    support::json_row(json!({
        "bench": "cleanup", "shape": "half-of-claims", "side": "slices", "claims": claims,
        "rows_per_s": (slices.removed as f64 / slices.seconds).round(),
        "baseline_rows_per_s": (delete.removed as f64 / delete.seconds).round(),
        "ratio": support::ratio(delete.seconds, slices.seconds),
    }));
    pool.close().await;
    Ok(())
}

/// Writes `claims` claims into both tables: ids minted over the last 30 days, each processed
/// two seconds after its id's time, but 1% (41 in 4,096, by the id's hash) processed now.
async fn seed(pool: &PgPool, claims: u64) -> Result<()> {
    let now_ms = i64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let day_ms = i64::try_from(DAY.as_millis())?;
    let started = Instant::now();
    let mut from = 0;
    while from < claims {
        let to = (from + SEED_CHUNK).min(claims);
        sqlx::query(
            "insert into core.processed_jobs (job_id, consumer, processed_at, slot) \
             select c.id, 'bench.consumer', c.at, core.processed_slot(c.id) from ( \
                 select (lpad(to_hex(m.ms), 12, '0') || '7' || substr(m.h, 1, 3) || '8' \
                         || substr(m.h, 4, 15))::uuid as id, \
                        case when ('x' || substr(m.h, 30, 3))::bit(12)::int < 41 then now() \
                             else to_timestamp(m.ms / 1000.0) + interval '2 seconds' end as at \
                 from (select g, md5(g::text) as h, \
                              $3 - (g % 30) * $4 - (g * 7919) % $4 as ms \
                       from generate_series($1::bigint, $2::bigint - 1) as g) as m \
             ) as c",
        )
        .bind(i64::try_from(from)?)
        .bind(i64::try_from(to)?)
        .bind(now_ms)
        .bind(day_ms)
        .execute(pool)
        .await
        .context("seed the claims")?;
        from = to;
    }
    sqlx::raw_sql(
        "create table unsliced (job_id uuid not null, consumer text not null, \
             processed_at timestamptz not null, primary key (job_id, consumer)); \
         insert into unsliced select job_id, consumer, processed_at from core.processed_jobs; \
         create index unsliced_processed_at on unsliced (processed_at)",
    )
    .execute(pool)
    .await
    .context("copy the claims")?;
    // One statement each: a multi-statement string runs in one transaction, VACUUM in none.
    for statement in [
        "vacuum analyze unsliced",
        "vacuum analyze core.processed_jobs",
        "checkpoint",
    ] {
        sqlx::query(statement).execute(pool).await?;
    }
    println!(
        "seeded both tables in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One side's figures.
struct Side {
    name: &'static str,
    seconds: f64,
    server_cpu_s: f64,
    removed: u64,
    bytes_before: i64,
    bytes_after: i64,
    claims: Latencies,
}

impl Side {
    fn print(&self, claims: u64) {
        let mb = |bytes: i64| bytes as f64 / 1_048_576.0;
        println!(
            "{:>7}  {:>10}  {:>9.2}  {:>13.2}  {:>12.0}  {:>11.0}  {:>14.2}  {:>14.2}",
            self.name,
            self.removed,
            self.seconds,
            self.server_cpu_s,
            mb(self.bytes_before),
            mb(self.bytes_after),
            self.claims.p99_ms,
            self.claims.max_ms,
        );
        support::json_row(json!({
            "bench": "cleanup", "shape": "half-of-claims", "side": self.name, "claims": claims,
            "removed": self.removed, "seconds": self.seconds, "server_cpu_s": self.server_cpu_s,
            "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
            "bytes_per_claim": self.bytes_before / i64::try_from(claims.max(1)).unwrap_or(1),
            "claims_during": self.claims.count, "claim_p99_ms": self.claims.p99_ms,
            "claim_max_ms": self.claims.max_ms,
        }));
    }
}

/// Seconds of CPU the server's processes spent since `start`.
fn server_seconds(start: support::Cpu) -> f64 {
    // `per_job_since` in µs for one "job": the whole span.
    support::Cpu::per_job_since(start, 1).1 / 1_000_000.0
}

/// The bytes of the sliced table: its 128 slices with their indexes.
async fn sliced_size(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "select coalesce(sum(pg_total_relation_size(relid)), 0)::bigint \
         from pg_partition_tree('core.processed_jobs')",
    )
    .fetch_one(pool)
    .await?)
}

async fn table_size(pool: &PgPool, table: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        "select pg_total_relation_size('{table}')"
    )))
    .fetch_one(pool)
    .await?)
}

/// How long the claims made meanwhile took.
struct Latencies {
    count: usize,
    p99_ms: f64,
    max_ms: f64,
}

/// One connection claiming fresh job ids, a transaction each, until stopped.
struct Claimer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Vec<Duration>>>,
}

impl Claimer {
    fn start(store: &PgStore, statement: &'static str) -> Claimer {
        let stop = Arc::new(AtomicBool::new(false));
        let (store, stopped) = (store.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let consumer: ConsumerName = "bench.claimer".parse()?;
            let mut took = vec![];
            while !stopped.load(Ordering::Relaxed) {
                let started = Instant::now();
                let mut tx = store.begin().await?;
                sqlx::query(statement)
                    .bind(JobId::generate().as_uuid())
                    .bind(consumer.as_str())
                    .execute(tx.conn())
                    .await?;
                tx.commit().await?;
                took.push(started.elapsed());
            }
            Ok(took)
        });
        Claimer { stop, task }
    }

    async fn stop(self) -> Result<Latencies> {
        self.stop.store(true, Ordering::Relaxed);
        let mut took = self.task.await??;
        took.sort_unstable();
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1_000.0);
        Ok(Latencies {
            count: took.len(),
            p99_ms: ms(took.get(took.len().saturating_sub(1) * 99 / 100)),
            max_ms: ms(took.last()),
        })
    }
}

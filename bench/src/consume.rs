//! Idempotent consumption on PostgreSQL: the worker runtime (memory queue, PostgreSQL store, a
//! handler writing one row in the work transaction) against raw SQL of the same transaction
//! shape (insert the processed row, insert the work row, one commit), at concurrency 1, 4, 16.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use anyhow::Result;
use async_trait::async_trait;
use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::{PgStore, PgWorkTx};
use jobs_consumers::{Handler, Job, JobError, Worker, WorkerConfig};
use jobs_core::{ConsumerName, Envelope, JobId, PublishOptions, QueueName, QueuePort};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const CONCURRENCY: [usize; 3] = [1, 4, 16];

/// Alternating rounds per concurrency; each side reports its best.
const ROUNDS: usize = 3;

pub(crate) fn run() -> Result<()> {
    let jobs = support::count("JOBS_BENCH_JOBS", 10_000)?;
    support::block_on(support::with_database("jobs_bench", |options| async move {
        compare(&options, jobs).await
    }))
}

async fn compare(options: &PgConnectOptions, jobs: u64) -> Result<()> {
    println!(
        "idempotent consumption on PostgreSQL, {jobs} jobs per run, no-op handler writing one row"
    );
    println!(
        "{:>11}  {:>16}  {:>16}  {:>6}",
        "concurrency", "raw SQL tx/s", "runtime jobs/s", "ratio"
    );
    for concurrency in CONCURRENCY {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(concurrency)?)
            .connect_with(options.clone())
            .await?;
        let store = PgStore::from_pool(pool.clone());
        store.migrate().await?;
        sqlx::query("create table if not exists work (job_id uuid primary key, n bigint not null)")
            .execute(&pool)
            .await?;
        // Warm the server's caches and the pool's connections before either side is timed,
        // then alternate the two, keeping each one's best round: the machine is shared and
        // noisy, and a checkpoint landing in one run should not decide the ratio.
        raw_sql(&pool, concurrency, jobs / 10).await?;
        let (mut baseline, mut runtime) = (0f64, 0f64);
        for _ in 0..ROUNDS {
            reset(&pool).await?;
            baseline = baseline.max(raw_sql(&pool, concurrency, jobs).await?);
            reset(&pool).await?;
            runtime = runtime.max(self::runtime(&store, concurrency, jobs).await?);
            let (count,): (i64,) = sqlx::query_as("select count(*) from work")
                .fetch_one(&pool)
                .await?;
            anyhow::ensure!(
                count == i64::try_from(jobs)?,
                "the runtime wrote {count} rows"
            );
        }
        println!(
            "{concurrency:>11}  {baseline:>16.0}  {runtime:>16.0}  {:>6.2}",
            runtime / baseline
        );
        support::rate_row(
            "consume",
            "insert",
            "runtime",
            concurrency,
            runtime,
            baseline,
        );
        pool.close().await;
    }
    Ok(())
}

async fn reset(pool: &PgPool) -> Result<()> {
    sqlx::query("truncate work, core.processed_jobs")
        .execute(pool)
        .await?;
    sqlx::query("vacuum analyze work").execute(pool).await?;
    sqlx::query("vacuum analyze core.processed_jobs")
        .execute(pool)
        .await?;
    Ok(())
}

/// The baseline: `concurrency` tasks each running the transaction shape directly.
async fn raw_sql(pool: &PgPool, concurrency: usize, jobs: u64) -> Result<f64> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (pool, next) = (pool.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < jobs {
                    let id = JobId::generate().as_uuid();
                    let mut tx = pool.begin().await?;
                    sqlx::query(sqlx::AssertSqlSafe(support::raw_claims(&[id])))
                        .bind([id])
                        .bind("bench.consumer")
                        .bind(sqlx::types::chrono::Utc::now())
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("insert into work (job_id, n) values ($1, 1)")
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
                Ok::<(), sqlx::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

#[derive(Deserialize)]
struct Data {
    n: i64,
}

struct WriteRow {
    done: Arc<AtomicU64>,
}

#[async_trait]
impl Handler<PgWorkTx> for WriteRow {
    type Data = Data;

    async fn handle(&self, job: Job<Data>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        sqlx::query("insert into work (job_id, n) values ($1, $2)")
            .bind(job.envelope.job_id.as_uuid())
            .bind(job.envelope.data.n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The runtime: jobs queued in memory beforehand, consumed by one worker at `concurrency`.
async fn runtime(store: &PgStore, concurrency: usize, jobs: u64) -> Result<f64> {
    let queue = MemoryQueue::default();
    let name: QueueName = "bench.jobs".parse()?;
    let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
    let correlation = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?;
    for n in 0..jobs {
        let data = serde_json::json!({ "n": n });
        let envelope = Envelope::new(tenant, correlation, "bench.job".parse()?, data);
        queue
            .publish(&name, &envelope, PublishOptions::default())
            .await?;
    }
    let done = Arc::new(AtomicU64::new(0));
    let mut config = WorkerConfig::default();
    config.concurrency = concurrency;
    config.poll_interval = Duration::from_millis(1);
    let worker = Arc::new(
        Worker::builder(
            ConsumerName::from_str("bench.consumer")?,
            name,
            Arc::new(queue),
            Arc::new(store.clone()),
            Arc::new(store.clone()),
        )
        .handler("bench.job".parse()?, WriteRow { done: done.clone() })
        .config(config)
        .build()?,
    );
    let started = Instant::now();
    let finished = done.clone();
    worker
        .run(async move {
            while finished.load(Ordering::Relaxed) < jobs {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

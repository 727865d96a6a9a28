//! The PostgreSQL queue (ADR 0011): publishing no-op jobs in batches and draining them with
//! idempotent consumption (`PgQueue::consume_batch`: the batch's claims in
//! `core.processed_jobs`, the no-op handler and the acks in one transaction) at concurrency
//! 1, 4, 16, next to raw SQL of the same work measured in the same run.
//!
//! The raw SQL works on `raw_jobs`, a copy of `core.jobs`' definition (columns, collations,
//! defaults, identity, the unique dedup key, the fetch index, the storage parameters) without
//! its wake-up trigger: the same rows inserted with one multi-row `INSERT ... ON CONFLICT DO
//! NOTHING` per batch of the same size (no receipts returned), and a `FOR UPDATE SKIP LOCKED`
//! fetch-and-delete plus the batch's `processed_jobs` insert in one transaction per fetch batch.
//! What the queue pays on top is its own: receipts, wake-ups, decoding and validating each
//! envelope.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use anyhow::{Context, Result};
use async_trait::async_trait;
use jobs_adapter_postgres::{BatchError, BatchHandler, NewJob, PgQueue, PgStore};
use jobs_core::{ConsumerName, Envelope, PublishOptions, QueueName};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::types::Uuid;
use sqlx::{PgConnection, PgPool};

const CONCURRENCY: [usize; 3] = [1, 4, 16];

/// Alternating rounds per concurrency; each side reports its best.
const ROUNDS: usize = 3;

/// Jobs per fetch, on both sides.
const BATCH: usize = 100;

/// Jobs per multi-row insert when publishing.
const PUBLISH_BATCH: usize = 1_000;

const QUEUE: &str = "bench.pg_queue";
const CONSUMER: &str = "bench.consumer";

pub(crate) fn run(jobs: Option<&str>) -> Result<()> {
    let jobs: u64 = match jobs {
        Some(n) => n.parse().context("the job count must be a number")?,
        None => support::count("JOBS_BENCH_PG_QUEUE_JOBS", 100_000)?,
    };
    support::block_on(support::with_database(
        "jobs_bench_pgq",
        |options| async move { compare(&options, jobs).await },
    ))
}

async fn compare(options: &PgConnectOptions, jobs: u64) -> Result<()> {
    println!(
        "PostgreSQL queue, {jobs} no-op jobs per run, publish batches of {PUBLISH_BATCH}, \
         fetch batches of {BATCH}, idempotent consumption (processed_jobs claim per job)"
    );
    println!(
        "{:>11}  {:>14}  {:>14}  {:>6}  {:>14}  {:>14}  {:>6}",
        "concurrency",
        "raw enqueue/s",
        "queue enqueue/s",
        "ratio",
        "raw drain/s",
        "queue drain/s",
        "ratio"
    );
    let envelopes = envelopes(jobs)?;
    for concurrency in CONCURRENCY {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(concurrency)? + 1)
            .connect_with(options.clone())
            .await?;
        PgStore::from_pool(pool.clone()).migrate().await?;
        raw_table(&pool).await?;
        let queue = PgQueue::new(pool.clone());
        // Warm the caches and the pool's connections before anything is timed, then alternate
        // the two sides, keeping each one's best round: the machine is shared and noisy, and a
        // checkpoint landing in one run should not decide the ratio.
        let warm = &envelopes[..envelopes.len().min(2_000)];
        raw_enqueue(&pool, warm, concurrency).await?;
        raw_drain(&pool, concurrency, warm.len() as u64).await?;
        queue_enqueue(&queue, warm, concurrency).await?;
        queue_drain(&queue, concurrency, warm.len() as u64).await?;
        let (mut raw_in, mut raw_out, mut queue_in, mut queue_out) = (0f64, 0f64, 0f64, 0f64);
        for _ in 0..ROUNDS {
            reset(&pool).await?;
            raw_in = raw_in.max(raw_enqueue(&pool, &envelopes, concurrency).await?);
            raw_out = raw_out.max(raw_drain(&pool, concurrency, jobs).await?);
            let (processed,): (i64,) = sqlx::query_as("select count(*) from core.processed_jobs")
                .fetch_one(&pool)
                .await?;
            anyhow::ensure!(
                processed == i64::try_from(jobs)?,
                "the baseline claimed {processed}"
            );
            reset(&pool).await?;
            queue_in = queue_in.max(queue_enqueue(&queue, &envelopes, concurrency).await?);
            queue_out = queue_out.max(queue_drain(&queue, concurrency, jobs).await?);
            let (processed, left): (i64, i64) = sqlx::query_as(
                "select (select count(*) from core.processed_jobs), \
                        (select count(*) from core.jobs)",
            )
            .fetch_one(&pool)
            .await?;
            anyhow::ensure!(
                processed == i64::try_from(jobs)? && left == 0,
                "the queue claimed {processed} jobs and left {left}"
            );
        }
        reset(&pool).await?;
        println!(
            "{concurrency:>11}  {raw_in:>14.0}  {queue_in:>14.0}  {:>6.2}  {raw_out:>14.0}  \
             {queue_out:>14.0}  {:>6.2}",
            queue_in / raw_in,
            queue_out / raw_out
        );
        pool.close().await;
    }
    Ok(())
}

/// `raw_jobs`: `core.jobs`' definition and storage parameters, without its trigger.
async fn raw_table(pool: &PgPool) -> Result<()> {
    sqlx::query("create table if not exists raw_jobs (like core.jobs including all)")
        .execute(pool)
        .await?;
    let (options,): (Option<Vec<String>>,) =
        sqlx::query_as("select reloptions from pg_class where oid = 'core.jobs'::regclass")
            .fetch_one(pool)
            .await?;
    if let Some(options) = options {
        sqlx::query(&format!(
            "alter table raw_jobs set ({})",
            options.join(", ")
        ))
        .execute(pool)
        .await?;
    }
    Ok(())
}

fn envelopes(jobs: u64) -> Result<Vec<Envelope>> {
    let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
    let correlation = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?;
    let kind: jobs_core::Kind = "bench.noop".parse()?;
    Ok((0..jobs)
        .map(|n| {
            Envelope::new(
                tenant,
                correlation,
                kind.clone(),
                serde_json::json!({ "n": n }),
            )
        })
        .collect())
}

async fn reset(pool: &PgPool) -> Result<()> {
    sqlx::query("truncate raw_jobs, core.jobs, core.processed_jobs")
        .execute(pool)
        .await?;
    for table in ["raw_jobs", "core.jobs", "core.processed_jobs"] {
        sqlx::query(&format!("vacuum analyze {table}"))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Splits `items` into `concurrency` contiguous shares.
fn shares<T>(items: &[T], concurrency: usize) -> impl Iterator<Item = &[T]> {
    let size = items.len().div_ceil(concurrency).max(1);
    items.chunks(size)
}

/// The baseline publish: the queue's rows (dedup key, payload, tenant, visible and created
/// times), one multi-row insert per batch into `raw_jobs`, with the same deduplication (the
/// unique key, `ON CONFLICT DO NOTHING`); no receipts, no wake-up.
async fn raw_enqueue(pool: &PgPool, envelopes: &[Envelope], concurrency: usize) -> Result<f64> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for share in shares(envelopes, concurrency) {
        let (pool, share) = (pool.clone(), share.to_vec());
        tasks.spawn(async move {
            for chunk in share.chunks(PUBLISH_BATCH) {
                let now = sqlx::types::chrono::Utc::now();
                let mut keys = Vec::with_capacity(chunk.len());
                let mut payloads = Vec::with_capacity(chunk.len());
                let mut tenants = Vec::with_capacity(chunk.len());
                let mut visible = Vec::with_capacity(chunk.len());
                for envelope in chunk {
                    keys.push(envelope.job_id.to_string());
                    payloads.push(envelope.to_json_bytes()?);
                    tenants.push(envelope.tenant_id.as_uuid());
                    visible.push(now);
                }
                sqlx::query(
                    "insert into raw_jobs (queue, dedup_key, payload, tenant_id, visible_at, \
                         created_at) \
                     select $1, k, p, t, v, $6 \
                     from unnest($2::text[], $3::bytea[], $4::uuid[], $5::timestamptz[]) \
                         as u(k, p, t, v) \
                     on conflict (queue, dedup_key) do nothing",
                )
                .bind(QUEUE)
                .bind(keys)
                .bind(payloads)
                .bind(tenants)
                .bind(visible)
                .bind(now)
                .execute(&pool)
                .await?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(envelopes.len() as f64 / started.elapsed().as_secs_f64())
}

/// The baseline drain: per batch, one transaction of a SKIP LOCKED fetch-and-delete and the
/// `processed_jobs` insert of the batch.
async fn raw_drain(pool: &PgPool, concurrency: usize, jobs: u64) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (pool, done) = (pool.clone(), done.clone());
        tasks.spawn(async move {
            while done.load(Ordering::Relaxed) < jobs {
                let mut tx = pool.begin().await?;
                let ids: Vec<Uuid> = sqlx::query_scalar(
                    "delete from raw_jobs where id = any(array( \
                         select id from raw_jobs where queue = $1 and visible_at <= $2 \
                         order by visible_at, id limit $3 for update skip locked)) \
                     returning dedup_key::uuid",
                )
                .bind(QUEUE)
                .bind(sqlx::types::chrono::Utc::now())
                .bind(BATCH as i64)
                .fetch_all(&mut *tx)
                .await?;
                if ids.is_empty() {
                    tx.rollback().await?;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                sqlx::query(
                    "insert into core.processed_jobs (job_id, consumer, processed_at) \
                     select unnest($1::uuid[]), $2, now() on conflict do nothing",
                )
                .bind(&ids)
                .bind(CONSUMER)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                done.fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// The queue's publish: `PgQueue::publish_batch`, one multi-row insert per batch.
async fn queue_enqueue(queue: &PgQueue, envelopes: &[Envelope], concurrency: usize) -> Result<f64> {
    let name: QueueName = QUEUE.parse()?;
    let shares: Vec<Vec<NewJob>> = shares(envelopes, concurrency)
        .map(|share| {
            share
                .iter()
                .map(|envelope| NewJob {
                    envelope: envelope.clone(),
                    opts: PublishOptions::default(),
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for jobs in shares {
        let (queue, name) = (queue.clone(), name.clone());
        tasks.spawn(async move {
            for chunk in jobs.chunks(PUBLISH_BATCH) {
                queue.publish_batch(&name, chunk).await?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(envelopes.len() as f64 / started.elapsed().as_secs_f64())
}

/// A no-op job: its only effect is the claim the batch records.
struct NoOp;

#[async_trait]
impl BatchHandler for NoOp {
    async fn handle(&self, _: &mut PgConnection, _: &Envelope) -> Result<(), BatchError> {
        Ok(())
    }
}

/// The queue's drain: `concurrency` consumers calling `PgQueue::consume_batch`.
async fn queue_drain(queue: &PgQueue, concurrency: usize, jobs: u64) -> Result<f64> {
    let name: QueueName = QUEUE.parse()?;
    let consumer = ConsumerName::from_str(CONSUMER)?;
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (queue, name, consumer, done) =
            (queue.clone(), name.clone(), consumer.clone(), done.clone());
        tasks.spawn(async move {
            while done.load(Ordering::Relaxed) < jobs {
                let batch = queue
                    .consume_batch(&name, &consumer, BATCH, Duration::from_secs(60), &NoOp)
                    .await?;
                anyhow::ensure!(batch.fallback.is_empty(), "a no-op batch fell back");
                let n = (batch.done + batch.skipped) as u64;
                if n == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

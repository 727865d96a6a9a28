//! Fair dequeue on the PostgreSQL queue (ADR 0013), as users run it: `Worker::run` grouped
//! over `PgQueue` and `PgStore`, concurrency 16, a handler that takes about 1 ms.
//!
//! Tenant A publishes a backlog at once (10,000 and 100,000 jobs, `JOBS_BENCH_FAIR_BACKLOGS`),
//! then tenant B publishes 200 jobs at 20 jobs/s while A's backlog drains. For oldest first
//! (FIFO) and for tenant round-robin, each backlog: B's wait from its publish to its handler's
//! start (p50, p99, max), and the throughput while A's backlog drains (every job done by the
//! time A's last is, over that time). The baseline of each fair row is the FIFO row of the same
//! backlog, measured in the same run; the publish rows compare A's backlog published in
//! batches of 1,000 into a fair queue with the same into a FIFO one (the best of three rounds
//! each, alternating).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_trait::async_trait;
use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, PgWorkTx};
use jobs_consumers::{Handler, Job, JobError, Worker, WorkerConfig};
use jobs_core::{
    ConsumerName, CorrelationId, Envelope, PublishOptions, QueueName, QueuePort, TenantFairness,
    TenantId,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support;

const CONCURRENCY: usize = 16;
const LIGHT_JOBS: usize = 200;
const LIGHT_RATE: u32 = 20;
const HANDLER_TIME: Duration = Duration::from_millis(1);
const PUBLISH_BATCH: usize = 1_000;
/// Publish rounds per side after the drains, alternating.
const PUBLISH_ROUNDS: usize = 2;
const KIND: &str = "bench.job";

/// How the queue is fetched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    Fifo,
    Fair,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Fair => "fair",
        }
    }

    fn queue(self) -> &'static str {
        match self {
            Policy::Fifo => "bench.fifo",
            Policy::Fair => "bench.fair",
        }
    }
}

pub(crate) fn run() -> Result<()> {
    let backlogs: Vec<u64> = match std::env::var("JOBS_BENCH_FAIR_BACKLOGS") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .context("JOBS_BENCH_FAIR_BACKLOGS lists numbers")
            })
            .collect::<Result<_>>()?,
        Err(_) => vec![10_000, 100_000],
    };
    support::install_observability()?;
    support::block_on(support::with_database(
        "jobs_bench_fair",
        |options| async move { compare(&options, &backlogs).await },
    ))
}

/// A measured drain.
struct Drain {
    published_per_s: f64,
    jobs_per_s: f64,
    light_ms: (f64, f64, f64),
}

async fn compare(options: &PgConnectOptions, backlogs: &[u64]) -> Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(CONCURRENCY)? + 8)
        .connect_with(options.clone())
        .await?;
    PgStore::from_pool(pool.clone()).migrate().await?;
    println!(
        "fairness on PostgreSQL: Worker::run grouped, concurrency {CONCURRENCY}, a handler of \
         about {} ms; tenant A's backlog at once, then tenant B's {LIGHT_JOBS} jobs at \
         {LIGHT_RATE}/s",
        HANDLER_TIME.as_millis()
    );
    println!(
        "{:>8} {:>6} {:>12} {:>10} {:>10} {:>10} {:>11} {:>7}",
        "backlog", "policy", "publish/s", "B p50 ms", "B p99 ms", "B max ms", "drain/s", "ratio"
    );
    for &backlog in backlogs {
        let mut fifo = drain(&pool, Policy::Fifo, backlog).await?;
        let mut fair = drain(&pool, Policy::Fair, backlog).await?;
        // Publishing moves ±15% between runs: the best of alternating rounds, each side.
        for _ in 0..PUBLISH_ROUNDS {
            for (policy, d) in [(Policy::Fifo, &mut fifo), (Policy::Fair, &mut fair)] {
                d.published_per_s = d
                    .published_per_s
                    .max(publish(&pool, policy, backlog).await?);
            }
        }
        for (policy, d) in [(Policy::Fifo, &fifo), (Policy::Fair, &fair)] {
            let ratio = support::ratio(d.jobs_per_s, fifo.jobs_per_s);
            println!(
                "{backlog:>8} {:>6} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>11.0} {:>7.2}",
                policy.name(),
                d.published_per_s,
                d.light_ms.0,
                d.light_ms.1,
                d.light_ms.2,
                d.jobs_per_s,
                ratio
            );
            support::json_row(json!({
                "bench": "fairness", "shape": "drain", "side": "runtime",
                "policy": policy.name(), "backlog": backlog, "concurrency": CONCURRENCY,
                "light_p50_ms": d.light_ms.0, "light_p99_ms": d.light_ms.1,
                "light_max_ms": d.light_ms.2, "jobs_per_s": d.jobs_per_s.round(),
                "baseline_jobs_per_s": fifo.jobs_per_s.round(), "ratio": ratio,
            }));
            support::json_row(json!({
                "bench": "fairness", "shape": "publish", "side": "runtime",
                "policy": policy.name(), "backlog": backlog, "concurrency": 1,
                "jobs_per_s": d.published_per_s.round(),
                "baseline_jobs_per_s": fifo.published_per_s.round(),
                "ratio": support::ratio(d.published_per_s, fifo.published_per_s),
            }));
        }
    }
    println!(
        "\nratio: the fair row's drain over the FIFO row's of the same backlog (publish ratios \
         in the JSON rows)"
    );
    Ok(())
}

/// Counts the jobs done and times the light tenant's starts.
struct Work {
    done: Arc<AtomicU64>,
    heavy_done: Arc<AtomicU64>,
    light_started: Arc<Mutex<Vec<Option<Instant>>>>,
}

#[async_trait]
impl Handler<PgWorkTx> for Work {
    type Data = Value;

    async fn handle(&self, job: Job<Value>, _: &mut PgWorkTx) -> Result<(), JobError> {
        if let Some(n) = job.envelope.data.get("light").and_then(Value::as_u64) {
            let mut started = self
                .light_started
                .lock()
                .map_err(|_| JobError::permanent("poisoned"))?;
            if let Some(slot) = usize::try_from(n).ok().and_then(|n| started.get_mut(n)) {
                slot.get_or_insert_with(Instant::now);
            }
        } else {
            self.heavy_done.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(HANDLER_TIME).await;
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn envelope(tenant: TenantId, data: Value) -> Result<Envelope> {
    Ok(Envelope::new(
        tenant,
        CorrelationId::generate(),
        KIND.parse()?,
        data,
    ))
}

/// An empty queue of `policy`, listed as fair when it is.
async fn fresh_queue(pool: &PgPool, policy: Policy) -> Result<(PgQueue, QueueName)> {
    sqlx::query("truncate core.jobs, core.processed_jobs, core.fair_queues")
        .execute(pool)
        .await?;
    let queue = PgQueue::new(pool.clone());
    let name: QueueName = policy.queue().parse()?;
    if policy == Policy::Fair {
        queue
            .make_fair(&name, TenantFairness::round_robin())
            .await?;
    }
    Ok((queue, name))
}

/// Tenant A's backlog published in batches on a fresh queue of `policy`: jobs per second.
async fn publish(pool: &PgPool, policy: Policy, backlog: u64) -> Result<f64> {
    let (queue, name) = fresh_queue(pool, policy).await?;
    publish_backlog(&queue, &name, backlog).await
}

async fn publish_backlog(queue: &PgQueue, name: &QueueName, backlog: u64) -> Result<f64> {
    let heavy = TenantId::from_str("00000000-0000-4000-8000-00000000000a")?;
    let jobs: Vec<NewJob> = (0..backlog)
        .map(|n| {
            Ok(NewJob {
                envelope: envelope(heavy, json!({ "heavy": n }))?,
                opts: PublishOptions::default(),
            })
        })
        .collect::<Result<_>>()?;
    let published = Instant::now();
    for chunk in jobs.chunks(PUBLISH_BATCH) {
        queue.publish_batch(name, chunk).await?;
    }
    Ok(backlog as f64 / published.elapsed().as_secs_f64())
}

async fn drain(pool: &PgPool, policy: Policy, backlog: u64) -> Result<Drain> {
    let (queue, name) = fresh_queue(pool, policy).await?;
    let store = PgStore::from_pool(pool.clone());
    let light = TenantId::from_str("00000000-0000-4000-8000-00000000000b")?;
    let published_per_s = publish_backlog(&queue, &name, backlog).await?;
    sqlx::query("analyze core.jobs").execute(pool).await?;

    let done = Arc::new(AtomicU64::new(0));
    let heavy_done = Arc::new(AtomicU64::new(0));
    let light_started = Arc::new(Mutex::new(vec![None; LIGHT_JOBS]));
    let mut config = WorkerConfig::default();
    config.concurrency = CONCURRENCY;
    let shared = Arc::new(queue.clone());
    let mut builder = Worker::grouped_builder(
        ConsumerName::from_str("bench.consumer")?,
        name.clone(),
        shared,
        Arc::new(store.clone()),
    )
    .handler(
        KIND.parse()?,
        Work {
            done: done.clone(),
            heavy_done: heavy_done.clone(),
            light_started: light_started.clone(),
        },
    )
    .config(config);
    if policy == Policy::Fair {
        builder = builder.fair(TenantFairness::round_robin());
    }
    let worker = Arc::new(builder.build()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    // B's jobs, trickled while A's backlog drains.
    let publisher = {
        let (queue, name) = (queue.clone(), name.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / LIGHT_RATE);
            let mut at = Vec::with_capacity(LIGHT_JOBS);
            for n in 0..LIGHT_JOBS {
                tick.tick().await;
                let job = envelope(light, json!({ "light": n }))?;
                at.push(Instant::now());
                queue
                    .publish(&name, &job, PublishOptions::default())
                    .await?;
            }
            Ok::<_, anyhow::Error>(at)
        })
    };
    let mut drained = None;
    let total = backlog + LIGHT_JOBS as u64;
    let mut last = (0, Instant::now());
    while done.load(Ordering::Relaxed) < total {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = done.load(Ordering::Relaxed);
        if drained.is_none() && heavy_done.load(Ordering::Relaxed) >= backlog {
            drained = Some((now, started.elapsed()));
        }
        if now > last.0 {
            last = (now, Instant::now());
        }
        anyhow::ensure!(
            last.1.elapsed() < Duration::from_secs(30),
            "the worker stalled after {now} of {total} jobs ({})",
            policy.name()
        );
    }
    let light_published = publisher.await??;
    let _ = stop.send(());
    running.await?;
    let (done_then, took) = drained.context("the backlog never drained")?;
    let light_started = light_started
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let mut waits: Vec<f64> = light_published
        .iter()
        .zip(&light_started)
        .map(|(published, started)| {
            started
                .map(|s| s.duration_since(*published).as_secs_f64() * 1000.0)
                .context("a light job never started")
        })
        .collect::<Result<_>>()?;
    waits.sort_by(f64::total_cmp);
    let at = |q: f64| waits[((waits.len() as f64 - 1.0) * q).round() as usize];
    Ok(Drain {
        published_per_s,
        jobs_per_s: done_then as f64 / took.as_secs_f64(),
        light_ms: (at(0.5), at(0.99), at(1.0)),
    })
}

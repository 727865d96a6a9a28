//! The PostgreSQL queue (ADR 0011), as users run it, next to raw SQL doing the same work in
//! the same run:
//!
//! - **enqueue**: `PgQueue::publish_batch` (one multi-row insert per batch of 1,000) against
//!   the same rows inserted into `raw_jobs`, a copy of `core.jobs`' definition (columns,
//!   collations, identity, the unique dedup key, the fetch index, the storage parameters)
//!   without its wake-up trigger, with the same `ON CONFLICT DO NOTHING` and no receipts;
//! - **drain**: `Worker::run` with an ordinary `Handler<PgWorkTx>`, grouped over `PgQueue` and
//!   `PgStore` on one pool, with a metrics recorder and an info-level tracing subscriber
//!   installed, in three shapes: `insert` (the handler inserts one row per job), `noop` (it
//!   writes nothing: the framework's own cost) and `insert-1%-fail` (1% of the jobs fail once
//!   and are retried), and the two `insert` shapes again with a handler declared
//!   `RERUNNABLE`. The raw side leases a batch with the queue's own lease statement, then
//!   in one transaction claims the batch in `core.processed_jobs`, runs one prepared
//!   single-row insert per job (`insert` shapes), deletes the batch and commits, on as many
//!   connections as the runtime runs groups; once with batches of the size of the runtime's
//!   groups for the shape (the ratio's baseline: `group_size`, or one more than the store's
//!   checkpoint budget for a handler that writes and is not rerunnable) and once with
//!   batches of 100; `JOBS_BENCH_GROUP_SIZE` sets `group_size`; and for the shapes whose
//!   jobs the runtime isolates with a checkpoint each, a third time with batches of the
//!   group and the checkpoint's savepoint before every insert but the first ("raw
//!   isolated"): what the isolation costs through sqlx, which sends each statement in a round
//!   trip of its own;
//! - **CPU per job**: beside each drain row, the microseconds of CPU the client (this process)
//!   and the server (every `postgres` process) spent per job, read from `/proc`: on a
//!   machine whose cores client and server share, the ratio follows these sums;
//! - **latency**: about 200 jobs/s trickled into an idle grouped worker, from publish to the
//!   handler's start and to the commit (a `NOTIFY` the handler sends arrives at the commit).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support;
use anyhow::{Context, Result};
use async_trait::async_trait;
use jobs_adapter_postgres::{LEASE_STATEMENT, NewJob, PgQueue, PgStore, PgWorkTx};
use jobs_consumers::{Handler, Job, JobError, QueuePolicy, RetryPolicy, Worker, WorkerConfig};
use jobs_core::{
    ConsumerName, Envelope, GroupTransaction, PublishOptions, QueueName, WorkStore, WorkTransaction,
};
use serde::Deserialize;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::types::Uuid;
use sqlx::{AssertSqlSafe, Executor, PgPool, Row};

const CONCURRENCY: [usize; 3] = [1, 4, 16];

/// Alternating rounds per row, unless `JOBS_BENCH_ROUNDS` says otherwise; each side reports
/// its best.
const ROUNDS: u64 = 3;

/// The raw side's second batch size.
const RAW_BATCH: usize = 100;

/// Jobs per multi-row insert when publishing.
const PUBLISH_BATCH: usize = 1_000;

const QUEUE: &str = "bench.pg_queue";
const CONSUMER: &str = "bench.consumer";
const KIND: &str = "bench.job";

/// What the handler does per job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Inserts one row.
    Insert,
    /// Writes nothing.
    Noop,
    /// Inserts one row; one job in a hundred fails once after its insert.
    InsertFailing,
    /// Inserts one row, and says so ([`Handler::RERUNNABLE`]): no checkpoint per job.
    InsertRerunnable,
    /// [`Shape::InsertFailing`] with a rerunnable handler: a failure reruns its group.
    InsertFailingRerunnable,
}

impl Shape {
    const ALL: [Shape; 5] = [
        Shape::Insert,
        Shape::Noop,
        Shape::InsertFailing,
        Shape::InsertRerunnable,
        Shape::InsertFailingRerunnable,
    ];

    fn name(self) -> &'static str {
        match self {
            Shape::Insert => "insert",
            Shape::Noop => "noop",
            Shape::InsertFailing => "insert-1%-fail",
            Shape::InsertRerunnable => "insert-rerunnable",
            Shape::InsertFailingRerunnable => "insert-1%-fail-rerunnable",
        }
    }

    fn fails(self) -> bool {
        matches!(self, Shape::InsertFailing | Shape::InsertFailingRerunnable)
    }

    fn rerunnable(self) -> bool {
        matches!(
            self,
            Shape::InsertRerunnable | Shape::InsertFailingRerunnable
        )
    }

    fn inserts(self) -> bool {
        self != Shape::Noop
    }

    /// Whether the runtime takes a checkpoint before each job: its jobs write and may not
    /// run again.
    fn checkpoints(self) -> bool {
        self.inserts() && !self.rerunnable()
    }

    /// The groups the runtime runs this shape in, configured for `group`: a group whose jobs
    /// write and may not run again takes a checkpoint per job, so it holds at most one job
    /// more than the transaction's `budget` of them ([`WorkerConfig::group_size`]); the raw
    /// side's first batch size.
    fn group(self, group: usize, budget: usize) -> usize {
        if self.checkpoints() {
            group.min(budget.saturating_add(1))
        } else {
            group
        }
    }
}

/// The checkpoints a work transaction of `PgStore` takes at most.
async fn checkpoint_budget(options: &PgConnectOptions) -> Result<usize> {
    let pool = PgStore::pool_options(1)
        .connect_with(options.clone())
        .await?;
    let tx = PgStore::from_pool(pool.clone()).begin().await?;
    let budget = tx.checkpoint_budget();
    tx.rollback().await?;
    pool.close().await;
    Ok(budget)
}

pub(crate) fn run(jobs: Option<&str>) -> Result<()> {
    let jobs: u64 = match jobs {
        Some(n) => n.parse().context("the job count must be a number")?,
        None => support::count("JOBS_BENCH_PG_QUEUE_JOBS", 100_000)?,
    };
    support::install_observability()?;
    support::block_on(support::with_database(
        "jobs_bench_pgq",
        |options| async move { compare(&options, jobs).await },
    ))
}

/// Whether `JOBS_BENCH_SHAPES` (comma-separated: `enqueue`, the drain shapes, `latency`)
/// selects `shape`; unset, every shape runs.
fn selected(shape: &str) -> bool {
    std::env::var("JOBS_BENCH_SHAPES")
        .map_or(true, |shapes| shapes.split(',').any(|s| s.trim() == shape))
}

/// `JOBS_BENCH_GROUP_SIZE`, else the runtime's default group size: the runtime's groups and
/// the raw side's first batch size.
fn group_size() -> Result<usize> {
    let default = WorkerConfig::default().group_size as u64;
    Ok(usize::try_from(support::count(
        "JOBS_BENCH_GROUP_SIZE",
        default,
    )?)?)
}

/// Whether `JOBS_BENCH_SIDES` (`raw`, `runtime`; comma-separated) selects `side` of the
/// drain rows; unset, both run. One side alone is for profiling it: its ratios are then
/// meaningless.
fn side(side: &str) -> bool {
    std::env::var("JOBS_BENCH_SIDES")
        .map_or(true, |sides| sides.split(',').any(|s| s.trim() == side))
}

/// One drain: its rate, and the CPU each side spent per job.
#[derive(Clone, Copy, Default)]
struct Drain {
    rate: f64,
    client_us: f64,
    server_us: f64,
}

impl Drain {
    /// Runs `drain` of `jobs` jobs, with the CPU both sides spent meanwhile.
    async fn measure(jobs: u64, drain: impl Future<Output = Result<f64>>) -> Result<Drain> {
        let start = support::Cpu::now();
        let rate = drain.await?;
        let (client_us, server_us) = support::Cpu::per_job_since(start, jobs);
        Ok(Drain {
            rate,
            client_us: client_us.round(),
            server_us: server_us.round(),
        })
    }

    /// The faster of two rounds.
    fn best(a: Drain, b: Drain) -> Drain {
        if b.rate > a.rate { b } else { a }
    }

    /// "client + server" CPU per job, in µs.
    fn cpu(&self) -> String {
        format!("{:.0} + {:.0}", self.client_us, self.server_us)
    }
}

/// `JOBS_BENCH_CONCURRENCY` (comma-separated), else 1, 4 and 16.
fn concurrencies() -> Result<Vec<usize>> {
    match std::env::var("JOBS_BENCH_CONCURRENCY") {
        Ok(list) => list
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .context("JOBS_BENCH_CONCURRENCY lists numbers")
            })
            .collect(),
        Err(_) => Ok(CONCURRENCY.to_vec()),
    }
}

async fn compare(options: &PgConnectOptions, jobs: u64) -> Result<()> {
    let started = Instant::now();
    let mut spent = Spent::default();
    let rounds = support::count("JOBS_BENCH_ROUNDS", ROUNDS)?;
    anyhow::ensure!(rounds > 0, "JOBS_BENCH_ROUNDS must be at least 1");
    let group = group_size()?;
    let budget = checkpoint_budget(options).await?;
    let concurrencies = concurrencies()?;
    println!(
        "PostgreSQL queue, {jobs} jobs per run, best of {rounds} alternating rounds; \
         publish batches of {PUBLISH_BATCH}; the runtime: Worker::run grouped, groups of {group}"
    );
    let envelopes = envelopes(jobs)?;
    if selected("enqueue") {
        println!(
            "{:>11}  {:>14}  {:>15}  {:>6}",
            "concurrency", "raw enqueue/s", "queue enqueue/s", "ratio"
        );
    }
    for &concurrency in concurrencies.iter().filter(|_| selected("enqueue")) {
        let pool = pool(options, concurrency).await?;
        let queue = PgQueue::new(pool.clone());
        let warm = &envelopes[..envelopes.len().min(2_000)];
        raw_enqueue(&pool, warm, concurrency).await?;
        queue_enqueue(&queue, warm, concurrency).await?;
        let (mut raw, mut ours) = (0f64, 0f64);
        for _ in 0..rounds {
            reset(&pool).await?;
            raw = raw.max(raw_enqueue(&pool, &envelopes, concurrency).await?);
            reset(&pool).await?;
            ours = ours.max(queue_enqueue(&queue, &envelopes, concurrency).await?);
        }
        reset(&pool).await?;
        println!(
            "{concurrency:>11}  {raw:>14.0}  {ours:>15.0}  {:>6.2}",
            ours / raw
        );
        support::rate_row("pg-queue", "enqueue", "queue", concurrency, ours, raw);
        pool.close().await;
    }

    println!(
        "\n{:>25}  {:>11}  {:>5}  {:>13}  {:>12}  {:>14}  {:>10}  {:>6}  {:>6}  {:>11}  {:>18}  {:>18}",
        "drain shape",
        "concurrency",
        "group",
        "raw group/s",
        format!("raw {RAW_BATCH}/tx /s"),
        "raw isolated/s",
        "runtime/s",
        "ratio",
        format!("vs {RAW_BATCH}"),
        "vs isolated",
        "raw cpu µs/job",
        "runtime cpu µs/job",
    );
    for shape in Shape::ALL.into_iter().filter(|s| selected(s.name())) {
        for &concurrency in &concurrencies {
            let group = shape.group(group, budget);
            let pool = pool(options, concurrency).await?;
            let store = PgStore::from_pool(pool.clone());
            let queue = PgQueue::new(pool.clone());
            let warm = &envelopes[..envelopes.len().min(2_000)];
            let warm_jobs = warm.len() as u64;
            raw_publish(&pool, warm).await?;
            raw_drain(&pool, shape, concurrency, group, warm_jobs, false).await?;
            // The raw side claimed these jobs: start again.
            reset(&pool).await?;
            queue_enqueue(&queue, warm, 1).await?;
            runtime_drain(&store, &queue, shape, concurrency, warm_jobs).await?;
            let (mut raw_group, mut raw_100, mut raw_isolated, mut ours) = Default::default();
            for _ in 0..rounds {
                if side("raw") {
                    spent.backlog(&pool, raw_publish(&pool, &envelopes)).await?;
                    let drain = raw_drain(&pool, shape, concurrency, group, jobs, false);
                    let measured = spent.drain(Drain::measure(jobs, drain)).await?;
                    raw_group = Drain::best(raw_group, measured);
                    if shape.checkpoints() {
                        spent.backlog(&pool, raw_publish(&pool, &envelopes)).await?;
                        let drain = raw_drain(&pool, shape, concurrency, group, jobs, true);
                        let measured = spent.drain(Drain::measure(jobs, drain)).await?;
                        raw_isolated = Drain::best(raw_isolated, measured);
                    }
                    spent.backlog(&pool, raw_publish(&pool, &envelopes)).await?;
                    let drain = raw_drain(&pool, shape, concurrency, RAW_BATCH, jobs, false);
                    let measured = spent.drain(Drain::measure(jobs, drain)).await?;
                    raw_100 = Drain::best(raw_100, measured);
                }
                if side("runtime") {
                    spent
                        .backlog(&pool, async {
                            queue_enqueue(&queue, &envelopes, 4).await.map(|_| ())
                        })
                        .await?;
                    let drain = runtime_drain(&store, &queue, shape, concurrency, jobs);
                    let measured = spent.drain(Drain::measure(jobs, drain)).await?;
                    ours = Drain::best(ours, measured);
                    check_drained(&pool, shape, jobs).await?;
                }
            }
            reset(&pool).await?;
            let (isolated, vs_isolated) = if shape.checkpoints() {
                (
                    format!("{:.0}", raw_isolated.rate),
                    format!("{:.2}", ours.rate / raw_isolated.rate),
                )
            } else {
                ("-".to_owned(), "-".to_owned())
            };
            println!(
                "{:>25}  {concurrency:>11}  {group:>5}  {:>13.0}  {:>12.0}  {isolated:>14}  {:>10.0}  {:>6.2}  {:>6.2}  {vs_isolated:>11}  {:>18}  {:>18}",
                shape.name(),
                raw_group.rate,
                raw_100.rate,
                ours.rate,
                ours.rate / raw_group.rate,
                ours.rate / raw_100.rate,
                raw_group.cpu(),
                ours.cpu(),
            );
            let isolated = shape.checkpoints().then_some(raw_isolated);
            support::json_row(json!({
                "bench": "pg-queue", "shape": shape.name(), "side": "runtime",
                "concurrency": concurrency, "group_size": group, "jobs_per_s": ours.rate.round(),
                "baseline_jobs_per_s": raw_group.rate.round(), "ratio": support::ratio(ours.rate, raw_group.rate),
                "baseline_100_jobs_per_s": raw_100.rate.round(), "ratio_100": support::ratio(ours.rate, raw_100.rate),
                "baseline_isolated_jobs_per_s": isolated.map(|raw| raw.rate.round()),
                "ratio_isolated": isolated.map(|raw| support::ratio(ours.rate, raw.rate)),
                "client_cpu_us_per_job": ours.client_us, "server_cpu_us_per_job": ours.server_us,
                "baseline_client_cpu_us_per_job": raw_group.client_us,
                "baseline_server_cpu_us_per_job": raw_group.server_us,
            }));
            pool.close().await;
        }
    }

    if selected("latency") {
        let pool = pool(options, 1).await?;
        latency(&pool, 200, 1_000).await?;
        pool.close().await;
    }
    spent.report(started.elapsed());
    Ok(())
}

/// Where a run's time went: the measured drains, and laying out a backlog before each.
#[derive(Default)]
struct Spent {
    drains: Duration,
    backlogs: Duration,
}

impl Spent {
    async fn drain<T>(&mut self, drain: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let drained = drain.await;
        self.drains += started.elapsed();
        drained
    }

    /// Empties the tables, then runs `publish` to lay out the next drain's backlog.
    async fn backlog(
        &mut self,
        pool: &PgPool,
        publish: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let started = Instant::now();
        reset(pool).await?;
        publish.await?;
        self.backlogs += started.elapsed();
        Ok(())
    }

    fn report(&self, total: Duration) {
        let rest = total.saturating_sub(self.drains + self.backlogs);
        println!(
            "\nthe run took {:.0} s: {:.0} s draining, {:.0} s laying out backlogs, {:.0} s else",
            total.as_secs_f64(),
            self.drains.as_secs_f64(),
            self.backlogs.as_secs_f64(),
            rest.as_secs_f64(),
        );
        support::json_row(json!({
            "bench": "pg-queue", "shape": "run", "seconds": total.as_secs_f64().round(),
            "drain_seconds": self.drains.as_secs_f64().round(),
            "backlog_seconds": self.backlogs.as_secs_f64().round(),
        }));
    }
}

/// A pool sized as a worker of `concurrency` needs it ([`WorkerConfig::connections`]), the
/// schema migrated and the raw table and the effects table created.
async fn pool(options: &PgConnectOptions, concurrency: usize) -> Result<PgPool> {
    let mut config = WorkerConfig::default();
    config.concurrency = concurrency;
    let pool = PgStore::pool_options(config.connections())
        .connect_with(options.clone())
        .await?;
    PgStore::from_pool(pool.clone()).migrate().await?;
    raw_table(&pool).await?;
    sqlx::query("create table if not exists effects (n bigint not null)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// The data of a job.
#[derive(Deserialize)]
struct Numbered {
    n: u64,
}

/// The handler of the drain: an ordinary `Handler<PgWorkTx>`, declared rerunnable when `R`.
struct Work<const R: bool> {
    shape: Shape,
    done: Arc<AtomicU64>,
}

#[async_trait]
impl<const R: bool> Handler<PgWorkTx> for Work<R> {
    type Data = Numbered;
    const RERUNNABLE: bool = R;

    async fn handle(&self, job: Job<Numbered>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        if self.shape.inserts() {
            sqlx::query("insert into effects (n) values ($1)")
                .bind(i64::try_from(n).map_err(JobError::permanent)?)
                .execute(tx.conn())
                .await
                .map_err(JobError::retry)?;
        }
        if self.shape.fails() && n % 100 == 7 && job.attempt == 1 {
            return Err(JobError::retry("fails once"));
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A grouped worker of `concurrency` over `queue` and `store`, running `handler`.
fn worker<H: Handler<PgWorkTx>>(
    store: &PgStore,
    queue: &PgQueue,
    concurrency: usize,
    handler: H,
) -> Result<Arc<Worker<PgStore>>> {
    let mut config = WorkerConfig::default();
    config.concurrency = concurrency;
    config.group_size = group_size()?;
    let name: QueueName = QUEUE.parse()?;
    let fast = RetryPolicy::new(5, Duration::from_millis(1), Duration::from_millis(10))?;
    let policy = QueuePolicy::new(name.clone(), fast, "a benchmark: retries at once")?;
    let queue = Arc::new(queue.clone());
    Ok(Arc::new(
        Worker::grouped_builder(
            ConsumerName::from_str(CONSUMER)?,
            name,
            queue,
            Arc::new(store.clone()),
        )
        .handler(KIND.parse()?, handler)
        .policy(policy)
        .config(config)
        .build()?,
    ))
}

/// The runtime's drain of `jobs` published jobs: from the worker's start until it stopped
/// after the last job's group committed.
async fn runtime_drain(
    store: &PgStore,
    queue: &PgQueue,
    shape: Shape,
    concurrency: usize,
    jobs: u64,
) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let worker = if shape.rerunnable() {
        let handler = Work::<true> {
            shape,
            done: done.clone(),
        };
        worker(store, queue, concurrency, handler)?
    } else {
        let handler = Work::<false> {
            shape,
            done: done.clone(),
        };
        worker(store, queue, concurrency, handler)?
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let mut last = (0, Instant::now());
    while done.load(Ordering::Relaxed) < jobs {
        tokio::time::sleep(Duration::from_micros(500)).await;
        let now = done.load(Ordering::Relaxed);
        if now > last.0 {
            last = (now, Instant::now());
        }
        anyhow::ensure!(
            last.1.elapsed() < Duration::from_secs(30),
            "the runtime stalled after {now} of {jobs} jobs ({})",
            shape.name()
        );
    }
    // A rerunnable group that failed ran its other handlers twice: the count of runs reaches
    // the jobs before the last commits do, so wait for the queue itself to be empty.
    while store_jobs_left(store).await? > 0 {
        anyhow::ensure!(
            last.1.elapsed() < Duration::from_secs(30),
            "the runtime stalled with jobs left ({})",
            shape.name()
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let _ = stop.send(());
    running.await?;
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// The jobs not yet acked in `core.jobs`.
async fn store_jobs_left(store: &PgStore) -> Result<i64> {
    Ok(sqlx::query_scalar("select count(*) from core.jobs")
        .fetch_one(store.pool())
        .await?)
}

/// Every job's effect once (for the shapes that write one), and nothing left queued.
async fn check_drained(pool: &PgPool, shape: Shape, jobs: u64) -> Result<()> {
    let (effects, distinct, left, processed): (i64, i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from effects), (select count(distinct n) from effects), \
                (select count(*) from core.jobs), (select count(*) from core.processed_jobs)",
    )
    .fetch_one(pool)
    .await?;
    let jobs = i64::try_from(jobs)?;
    let expected = if shape.inserts() { jobs } else { 0 };
    anyhow::ensure!(
        effects == expected && distinct == expected && left == 0 && processed == jobs,
        "{}: {effects} effects ({distinct} distinct), {left} jobs left, {processed} claims",
        shape.name()
    );
    Ok(())
}

/// The raw side's publish: the same rows into `raw_jobs`, untimed.
async fn raw_publish(pool: &PgPool, envelopes: &[Envelope]) -> Result<()> {
    raw_enqueue(pool, envelopes, 4).await.map(|_| ())
}

/// The baseline drain: `concurrency` connections, each leasing `batch` rows with the queue's
/// lease statement, then in one transaction the batch's claims, one prepared insert per job
/// (for the inserting shapes), the batch's delete, and the commit; when `isolated`, the
/// runtime's checkpoint before every insert but the first.
async fn raw_drain(
    pool: &PgPool,
    shape: Shape,
    concurrency: usize,
    batch: usize,
    jobs: u64,
    isolated: bool,
) -> Result<f64> {
    // The queue's own lease statement on `raw_jobs`, answering the dedup keys (the job ids)
    // too, for the claims.
    let lease = LEASE_STATEMENT
        .replace("core.jobs", "raw_jobs")
        .replace(
            "as oversized)",
            "as oversized, j.dedup_key::uuid as job_id)",
        )
        .replace(
            " from leased",
            ", coalesce(array_agg(job_id order by id), '{}') as job_ids from leased",
        );
    anyhow::ensure!(
        lease.contains("as job_ids") && lease.contains("as job_id)"),
        "the lease statement changed: teach the raw side its new form"
    );
    // The queue's own statement, edited above: no input in the text. Shared, so that each
    // lease hands sqlx a reference count rather than a copy of the text.
    let lease: Arc<str> = lease.into();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (pool, done, lease) = (pool.clone(), done.clone(), lease.clone());
        tasks.spawn(async move {
            let mut conn = pool.acquire().await?;
            // Where the next lease reads from, as the queue keeps it: the earliest row the
            // last one leased, never more than a second behind its start.
            let mut mark = None;
            while done.load(Ordering::Relaxed) < jobs {
                let now = sqlx::types::chrono::Utc::now();
                let row = sqlx::query(AssertSqlSafe(Arc::clone(&lease)))
                    .bind(QUEUE)
                    .bind(now)
                    .bind(now + Duration::from_secs(60))
                    .bind(i64::try_from(batch)?)
                    .bind(mark)
                    .bind(i32::try_from(jobs_core::DEFAULT_MAX_ENVELOPE_BYTES)?)
                    .fetch_one(&mut *conn)
                    .await?;
                let first: Option<sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc>> =
                    row.try_get("first")?;
                let behind = now - Duration::from_secs(1);
                mark = Some(first.map_or(behind, |first| first.min(behind)));
                let ids: Vec<i64> = row.try_get("ids")?;
                let job_ids: Vec<Uuid> = row.try_get("job_ids")?;
                if ids.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let mut tx = sqlx::Acquire::begin(&mut *conn).await?;
                sqlx::query(AssertSqlSafe(support::raw_claims(&job_ids)))
                    .bind(&job_ids)
                    .bind(CONSUMER)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                if shape.inserts() {
                    for (i, id) in ids.iter().enumerate() {
                        // The statements of `PgWorkTx`'s checkpoint (ADR 0011).
                        match i {
                            _ if !isolated => {}
                            0 => {}
                            1 => {
                                tx.execute("savepoint jobs_checkpoint").await?;
                            }
                            _ => {
                                tx.execute(
                                    "release savepoint jobs_checkpoint; savepoint jobs_checkpoint",
                                )
                                .await?;
                            }
                        }
                        sqlx::query("insert into effects (n) values ($1)")
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                sqlx::query("delete from raw_jobs where id = any($1)")
                    .bind(&ids)
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

/// Records when each handler started; the handler also sends a `NOTIFY` that arrives at its
/// commit.
struct Timed {
    started: Arc<Mutex<Vec<Option<Instant>>>>,
}

#[async_trait]
impl Handler<PgWorkTx> for Timed {
    type Data = Numbered;

    async fn handle(&self, job: Job<Numbered>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        let now = Instant::now();
        if let (Ok(mut started), Ok(n)) = (self.started.lock(), usize::try_from(n))
            && let Some(slot) = started.get_mut(n)
        {
            slot.get_or_insert(now);
        }
        sqlx::query("insert into effects (n) values ($1)")
            .bind(i64::try_from(n).map_err(JobError::permanent)?)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        sqlx::query("select pg_notify('bench_committed', $1)")
            .bind(n.to_string())
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

/// Publish-to-start and publish-to-commit latency of `count` jobs published one by one at
/// `rate` per second into an idle grouped worker of concurrency 4.
async fn latency(pool: &PgPool, rate: u64, count: usize) -> Result<()> {
    reset(pool).await?;
    let store = PgStore::from_pool(pool.clone());
    let queue = PgQueue::new(pool.clone());
    let started = Arc::new(Mutex::new(vec![None; count]));
    let worker = worker(
        &store,
        &queue,
        1,
        Timed {
            started: started.clone(),
        },
    )?;
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen("bench_committed").await?;
    // Each commit's notification, timed as it arrives.
    let collector = tokio::spawn(async move {
        let mut committed = vec![None; count];
        while committed.iter().any(Option::is_none) {
            let note = tokio::time::timeout(Duration::from_secs(30), listener.recv())
                .await
                .context("jobs never committed")??;
            if let Some(slot) = note
                .payload()
                .parse::<usize>()
                .ok()
                .and_then(|n| committed.get_mut(n))
            {
                slot.get_or_insert_with(Instant::now);
            }
        }
        Ok::<_, anyhow::Error>(committed)
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let name: QueueName = QUEUE.parse()?;
    let envelopes = envelopes(count as u64)?;
    let mut published = Vec::with_capacity(count);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / u32::try_from(rate)?);
    for envelope in &envelopes {
        tick.tick().await;
        published.push(Instant::now());
        jobs_core::QueuePort::publish(&queue, &name, envelope, PublishOptions::default()).await?;
    }
    let committed = collector.await??;
    let _ = stop.send(());
    running.await?;
    let started = started
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let to_start = percentiles(&published, &started)?;
    let to_commit = percentiles(&published, &committed)?;
    println!(
        "\nlatency at {rate} jobs/s into an idle grouped worker, {count} jobs: publish to handler \
         start p50 {:.2} ms, p99 {:.2} ms; publish to commit p50 {:.2} ms, p99 {:.2} ms",
        to_start.0, to_start.1, to_commit.0, to_commit.1
    );
    for (shape, (p50, p99)) in [("to-handler-start", to_start), ("to-commit", to_commit)] {
        support::json_row(json!({
            "bench": "pg-queue", "shape": format!("latency-{shape}"), "side": "runtime",
            "concurrency": 1, "rate_per_s": rate, "p50_ms": p50, "p99_ms": p99,
        }));
    }
    Ok(())
}

/// The p50 and p99, in milliseconds, of `ends[i] - starts[i]`.
fn percentiles(starts: &[Instant], ends: &[Option<Instant>]) -> Result<(f64, f64)> {
    let mut ms: Vec<f64> = starts
        .iter()
        .zip(ends)
        .map(|(start, end)| {
            end.map(|end| end.duration_since(*start).as_secs_f64() * 1000.0)
                .context("a job without its time")
        })
        .collect::<Result<_>>()?;
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Ok((at(0.5), at(0.99)))
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
        // The options as the catalog holds them, copied to the twin table.
        sqlx::query(AssertSqlSafe(format!(
            "alter table raw_jobs set ({})",
            options.join(", ")
        )))
        .execute(pool)
        .await?;
    }
    Ok(())
}

fn envelopes(jobs: u64) -> Result<Vec<Envelope>> {
    let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
    let correlation = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?;
    let kind: jobs_core::Kind = KIND.parse()?;
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

/// Empties every table a drain writes and vacuums them, so that each drain starts alike. Of
/// `core.processed_jobs` only the slices holding claims (ADR 0014): truncating and vacuuming
/// all 64 took a minute of a quick run's four.
async fn reset(pool: &PgPool) -> Result<()> {
    let slices: Vec<String> =
        sqlx::query_scalar("select distinct tableoid::regclass::text from core.processed_jobs")
            .fetch_all(pool)
            .await?;
    let tables: Vec<&str> = ["raw_jobs", "core.jobs", "effects"]
        .into_iter()
        .chain(slices.iter().map(String::as_str))
        .collect();
    sqlx::query(AssertSqlSafe(format!(
        "truncate core.dead_letter_events, core.dead_letters, {}",
        tables.join(", ")
    )))
    .execute(pool)
    .await?;
    for table in tables {
        sqlx::query(AssertSqlSafe(format!("vacuum analyze {table}")))
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

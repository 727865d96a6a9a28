//! The long haul on PostgreSQL: a sustained drain on a server with autovacuum on, once as the
//! only work of its database and once beside a repeatable-read transaction that read
//! `core.jobs` and `core.processed_jobs` before the first job was published and stays open
//! to the end (what `pg_dump`, a report or a session idle in transaction does).
//!
//! Each run gets a fresh database on the same server: a private cluster this benchmark
//! initialises and starts (PostgreSQL's defaults, autovacuum on; `initdb` run as the
//! `postgres` user when this process is root), or the server `JOBS_BENCH_SOAK_URL` names
//! (the header says whether its autovacuum is on). For `JOBS_BENCH_SOAK_SECONDS` (default
//! 180, at least 30) a publisher keeps about 50,000 jobs ready while two grouped workers
//! (`Worker::run` over `PgQueue` + `PgStore`, a handler inserting one row) drain them:
//!
//! - `soak.fifo`, concurrency 16: nine batches in ten;
//! - `soak.fair`, concurrency 4, fair by tenant (round-robin) over four tenants: the tenth;
//! - in both, one job in a hundred fails once and is retried 1 s to 10 s later, and one in
//!   fifty is published with a delay of 1 s to 30 s.
//!
//! Every 10-second window prints the jobs done per second and the 99th percentile of the
//! workers' fetches (`PullPort::receive`, timed around the queue); after the publisher stops,
//! the workers drain what is left, and every job's row must be there exactly once. The run
//! ends with the tables' dead tuples and sizes, and the held run's median window, its slowest
//! window and its fetch p99 next to the unheld run's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use async_trait::async_trait;
use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, PgWorkTx};
use jobs_consumers::{Handler, Job, JobError, QueuePolicy, RetryPolicy, Worker, WorkerConfig};
use jobs_core::{
    Claim, ConsumerName, Delivery, Envelope, GroupTransaction, JobId, Lease, PublishOptions,
    PullPort, QueueError, QueueName, SettleInTransaction, SettlePort, Settlement, StoreError,
    TenantFairness, TenantId, Unsupported,
};
use serde::Deserialize;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};

use crate::support;

const WINDOW: Duration = Duration::from_secs(10);
const FIFO: &str = "soak.fifo";
const FAIR: &str = "soak.fair";
const KIND: &str = "soak.job";
const CONSUMER: &str = "soak.consumer";
/// Jobs the publisher keeps ready (published and not yet done), about.
const READY: u64 = 50_000;
const PUBLISH_BATCH: u64 = 1_000;
/// Tenants of the fair queue's jobs.
const TENANTS: u64 = 4;
/// The longest the workers may go without finishing a job before the run is called stalled.
const STALL: Duration = Duration::from_secs(120);

pub(crate) fn run() -> Result<()> {
    let seconds = support::count("JOBS_BENCH_SOAK_SECONDS", 180)?;
    anyhow::ensure!(seconds >= 30, "JOBS_BENCH_SOAK_SECONDS must be at least 30");
    support::install_observability()?;
    let (server, _cluster) = match std::env::var("JOBS_BENCH_SOAK_URL") {
        Ok(url) => (PgConnectOptions::from_str(&url)?, None),
        Err(_) => {
            let cluster = Cluster::start()?;
            (cluster.options(), Some(cluster))
        }
    };
    let server = server.disable_statement_logging();
    support::block_on(soak(server, Duration::from_secs(seconds)))
}

async fn soak(server: PgConnectOptions, length: Duration) -> Result<()> {
    let mut admin = PgConnection::connect_with(&server)
        .await
        .context("connecting to the soak's PostgreSQL")?;
    let (autovacuum, version): (String, String) =
        sqlx::query_as("select current_setting('autovacuum'), current_setting('server_version')")
            .fetch_one(&mut admin)
            .await?;
    admin.close().await?;
    println!(
        "soak: PostgreSQL {version}, autovacuum {autovacuum}; {} s of publishing per run, \
         about {READY} jobs kept ready; soak.fifo at concurrency 16, soak.fair (4 tenants) at 4",
        length.as_secs()
    );
    let unheld = one_run(&server, length, false).await?;
    let held = one_run(&server, length, true).await?;

    println!(
        "\n{:>6}  {:>14}  {:>16}  {:>12}  {:>14}",
        "window", "unheld jobs/s", "unheld p99 ms", "held jobs/s", "held p99 ms"
    );
    for i in 0..unheld.windows.len().max(held.windows.len()) {
        let cell = |run: &Run, f: fn(&Window) -> f64, digits: usize| {
            run.windows
                .get(i)
                .map_or("-".to_owned(), |w| format!("{:.*}", digits, f(w)))
        };
        println!(
            "{:>6}  {:>14}  {:>16}  {:>12}  {:>14}",
            format!("{}s", (i + 1) * 10),
            cell(&unheld, |w| w.jobs_per_s, 0),
            cell(&unheld, |w| w.fetch_p99_ms, 1),
            cell(&held, |w| w.jobs_per_s, 0),
            cell(&held, |w| w.fetch_p99_ms, 1),
        );
    }
    let base = unheld.median();
    println!(
        "\n{:>7}  {:>13}  {:>12}  {:>14}  {:>13}  {:>15}  {:>14}  {:>16}  {:>13}",
        "run",
        "median jobs/s",
        "worst jobs/s",
        "worst / unheld",
        "fetch p99 ms",
        "jobs dead tuples",
        "jobs MB",
        "processed MB",
        "drained in s"
    );
    for run in [&unheld, &held] {
        println!(
            "{:>7}  {:>13.0}  {:>12.0}  {:>14.2}  {:>13.1}  {:>15}  {:>14.1}  {:>16.1}  {:>13.1}",
            run.name,
            run.median(),
            run.worst(),
            run.worst() / base,
            run.fetch_p99_ms,
            run.dead_jobs,
            run.jobs_bytes as f64 / 1e6,
            run.processed_bytes as f64 / 1e6,
            run.tail.as_secs_f64(),
        );
        support::json_row(json!({
            "bench": "soak", "shape": "run", "side": run.name,
            "jobs_per_s": run.median().round(), "worst_jobs_per_s": run.worst().round(),
            "baseline_jobs_per_s": base.round(), "ratio": support::ratio(run.worst(), base),
            "fetch_p99_ms": run.fetch_p99_ms, "fifo_fetch_p99_ms": run.fifo_p99_ms,
            "fair_fetch_p99_ms": run.fair_p99_ms, "jobs_dead_tuples": run.dead_jobs,
            "processed_dead_tuples": run.dead_processed, "jobs_bytes": run.jobs_bytes,
            "processed_bytes": run.processed_bytes, "published": run.published,
            "tail_seconds": run.tail.as_secs_f64(),
        }));
    }
    println!(
        "\nheld / unheld: median window {:.2}, slowest window {:.2} (target ≥ 0.8), fetch p99 {:.1}× \
         (target ≤ 2×; soak.fifo's {:.1}×, soak.fair's {:.1}×)",
        held.median() / base,
        held.worst() / base,
        held.fetch_p99_ms / unheld.fetch_p99_ms,
        held.fifo_p99_ms / unheld.fifo_p99_ms,
        held.fair_p99_ms / unheld.fair_p99_ms,
    );
    Ok(())
}

/// One 10-second window of a run.
struct Window {
    jobs_per_s: f64,
    fetch_p99_ms: f64,
}

/// What one run measured.
struct Run {
    name: &'static str,
    windows: Vec<Window>,
    /// Over the whole run: every fetch's, `soak.fifo`'s, `soak.fair`'s.
    fetch_p99_ms: f64,
    fifo_p99_ms: f64,
    fair_p99_ms: f64,
    published: u64,
    /// How long the workers took to finish what was left once publishing stopped.
    tail: Duration,
    dead_jobs: i64,
    dead_processed: i64,
    jobs_bytes: i64,
    processed_bytes: i64,
}

impl Run {
    fn rates(&self) -> Vec<f64> {
        let mut rates: Vec<f64> = self.windows.iter().map(|w| w.jobs_per_s).collect();
        rates.sort_by(f64::total_cmp);
        rates
    }

    fn median(&self) -> f64 {
        let rates = self.rates();
        rates.get(rates.len() / 2).copied().unwrap_or(0.0)
    }

    fn worst(&self) -> f64 {
        self.rates().first().copied().unwrap_or(0.0)
    }
}

/// A fresh database, `length` of sustained publishing and draining (beside a held snapshot
/// when `held`), the rest drained, every job's effect checked.
async fn one_run(server: &PgConnectOptions, length: Duration, held: bool) -> Result<Run> {
    let name = if held { "held" } else { "unheld" };
    let prefix = format!("jobs_bench_soak_{name}");
    let run = support::with_database_on(server, &prefix, |options| {
        drive(options, name, length, held)
    })
    .await?;
    println!(
        "{name}: {} jobs, {} windows, drained the rest in {:.1} s",
        run.published,
        run.windows.len(),
        run.tail.as_secs_f64()
    );
    Ok(run)
}

async fn drive(
    options: PgConnectOptions,
    name: &'static str,
    length: Duration,
    held: bool,
) -> Result<Run> {
    let pool = PgStore::pool_options(32)
        .connect_with(options.clone())
        .await?;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await?;
    sqlx::query("create table effects (n bigint not null)")
        .execute(&pool)
        .await?;
    let queue = PgQueue::new(pool.clone());
    let (fifo, fair): (QueueName, QueueName) = (FIFO.parse()?, FAIR.parse()?);
    queue
        .make_fair(&fair, TenantFairness::round_robin())
        .await?;

    // The snapshot, taken before the first job is published and held to the end.
    let mut holder = PgConnection::connect_with(&options).await?;
    if held {
        holder
            .execute("begin isolation level repeatable read")
            .await?;
        sqlx::query("select count(*) from core.jobs")
            .execute(&mut holder)
            .await?;
        sqlx::query("select count(*) from core.processed_jobs")
            .execute(&mut holder)
            .await?;
    }

    let done = Arc::new(AtomicU64::new(0));
    let fetches = Arc::new(Mutex::new(Vec::new()));
    let timed = Arc::new(TimedFetch {
        queue: queue.clone(),
        fetches: fetches.clone(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    for (name, concurrency, fairness) in [(&fifo, 16, false), (&fair, 4, true)] {
        let worker = worker(&store, &timed, name, concurrency, fairness, &done)?;
        let mut stopped = stopped.clone();
        workers.push(tokio::spawn(worker.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })));
    }

    let published = Arc::new(AtomicU64::new(0));
    let publishing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let publisher = tokio::spawn(publish(
        queue.clone(),
        published.clone(),
        done.clone(),
        publishing.clone(),
    ));

    let started = Instant::now();
    let mut windows = Vec::new();
    let mut all_fetches = Vec::new();
    let mut last = done.load(Ordering::Relaxed);
    while started.elapsed() < length {
        tokio::time::sleep(WINDOW).await;
        let now = done.load(Ordering::Relaxed);
        let mut window = std::mem::take(&mut *lock(&fetches)?);
        windows.push(Window {
            jobs_per_s: (now - last) as f64 / WINDOW.as_secs_f64(),
            fetch_p99_ms: p99(window.iter().map(|f| f.0)),
        });
        all_fetches.append(&mut window);
        last = now;
        let w = windows.last().context("a window")?;
        println!(
            "  {}: {:>5}s  {:>8.0} jobs/s  fetch p99 {:>7.1} ms",
            name,
            windows.len() * 10,
            w.jobs_per_s,
            w.fetch_p99_ms
        );
    }
    publishing.store(false, Ordering::Relaxed);
    publisher.await??;
    let published = published.load(Ordering::Relaxed);

    // What is left, drained (the handlers' count, then the queue itself: a group's last
    // commit follows its handlers); then every job's row exactly once.
    let tail = Instant::now();
    let mut progress = (done.load(Ordering::Relaxed), Instant::now());
    loop {
        let now = done.load(Ordering::Relaxed);
        if now >= published {
            let left: i64 = sqlx::query_scalar("select count(*) from core.jobs")
                .fetch_one(&pool)
                .await?;
            if left == 0 {
                break;
            }
        }
        if now > progress.0 {
            progress = (now, Instant::now());
        }
        anyhow::ensure!(
            progress.1.elapsed() < STALL,
            "the workers stalled after {now} of {published} jobs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tail = tail.elapsed();
    let _ = stop.send(true);
    for worker in workers {
        worker.await?;
    }
    let (rows, distinct): (i64, i64) =
        sqlx::query_as("select count(*), count(distinct n) from effects")
            .fetch_one(&pool)
            .await?;
    anyhow::ensure!(
        u64::try_from(rows)? == published && u64::try_from(distinct)? == published,
        "{published} jobs published, {distinct} done, {rows} effects: lost or doubled"
    );

    // Dead tuples as the statistics see them, and the tables' sizes, before the snapshot ends;
    // `core.processed_jobs` is the sum of its slices (the partitioned parent holds nothing).
    sqlx::query("select pg_sleep(1)").execute(&pool).await?;
    let (dead_jobs, dead_processed, jobs_bytes, processed_bytes): (i64, i64, i64, i64) =
        sqlx::query_as(
            "select (select n_dead_tup from pg_stat_user_tables \
                     where schemaname = 'core' and relname = 'jobs'), \
                    (select coalesce(sum(s.n_dead_tup), 0)::bigint \
                     from pg_stat_user_tables s join pg_inherits i on i.inhrelid = s.relid \
                     where i.inhparent = 'core.processed_jobs'::regclass), \
                    pg_total_relation_size('core.jobs'), \
                    (select coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint \
                     from pg_inherits i where i.inhparent = 'core.processed_jobs'::regclass)",
        )
        .fetch_one(&pool)
        .await?;
    if held {
        holder.execute("commit").await?;
    }
    holder.close().await?;
    pool.close().await;
    Ok(Run {
        name,
        windows,
        fetch_p99_ms: p99(all_fetches.iter().map(|f| f.0)),
        fifo_p99_ms: p99(all_fetches.iter().filter(|f| !f.1).map(|f| f.0)),
        fair_p99_ms: p99(all_fetches.iter().filter(|f| f.1).map(|f| f.0)),
        published,
        tail,
        dead_jobs,
        dead_processed,
        jobs_bytes,
        processed_bytes,
    })
}

fn lock<T>(mutex: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    mutex.lock().map_err(|_| anyhow::anyhow!("a poisoned lock"))
}

/// The 99th percentile of `fetches` (seconds), in milliseconds; 0 when there are none.
fn p99(fetches: impl Iterator<Item = f64>) -> f64 {
    let mut fetches: Vec<f64> = fetches.collect();
    fetches.sort_by(f64::total_cmp);
    let at = ((fetches.len() as f64 - 1.0) * 0.99).round();
    fetches.get(at as usize).map_or(0.0, |s| s * 1000.0)
}

/// Keeps about [`READY`] jobs published and not done while `publishing`: nine batches in
/// ten to `soak.fifo`, the tenth to `soak.fair` over four tenants; one job in fifty delayed.
async fn publish(
    queue: PgQueue,
    published: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    publishing: Arc<std::sync::atomic::AtomicBool>,
) -> Result<()> {
    let (fifo, fair): (QueueName, QueueName) = (FIFO.parse()?, FAIR.parse()?);
    let correlation = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?;
    let tenants: Vec<TenantId> = (0..TENANTS)
        .map(|t| TenantId::from_str(&format!("00000000-0000-4000-8000-{t:012}")))
        .collect::<Result<_, _>>()?;
    let kind: jobs_core::Kind = KIND.parse()?;
    let mut batch_no = 0u64;
    while publishing.load(Ordering::Relaxed) {
        let n0 = published.load(Ordering::Relaxed);
        if n0.saturating_sub(done.load(Ordering::Relaxed)) >= READY {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let to_fair = batch_no % 10 == 9;
        let jobs: Vec<NewJob> = (n0..n0 + PUBLISH_BATCH)
            .map(|n| {
                let tenant = if to_fair {
                    tenants[(n % TENANTS) as usize]
                } else {
                    tenants[0]
                };
                let opts = if n % 50 == 3 {
                    PublishOptions::default().delay(Duration::from_secs(n % 30 + 1))
                } else {
                    PublishOptions::default()
                };
                NewJob {
                    envelope: Envelope::new(tenant, correlation, kind.clone(), json!({ "n": n })),
                    opts,
                }
            })
            .collect();
        queue
            .publish_batch(if to_fair { &fair } else { &fifo }, &jobs)
            .await?;
        published.fetch_add(PUBLISH_BATCH, Ordering::Relaxed);
        batch_no += 1;
    }
    Ok(())
}

fn worker(
    store: &PgStore,
    queue: &Arc<TimedFetch>,
    name: &QueueName,
    concurrency: usize,
    fair: bool,
    done: &Arc<AtomicU64>,
) -> Result<Arc<Worker<PgStore>>> {
    let mut config = WorkerConfig::default();
    config.concurrency = concurrency;
    let retries = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(10))?;
    let policy = QueuePolicy::new(name.clone(), retries, "a benchmark: retries within seconds")?;
    let mut builder = Worker::grouped_builder(
        ConsumerName::from_str(CONSUMER)?,
        name.clone(),
        queue.clone(),
        Arc::new(store.clone()),
    )
    .handler(KIND.parse()?, Insert { done: done.clone() })
    .policy(policy)
    .config(config);
    if fair {
        builder = builder.fair(TenantFairness::round_robin());
    }
    Ok(Arc::new(builder.build()?))
}

#[derive(Deserialize)]
struct Numbered {
    n: u64,
}

/// Inserts the job's row; one job in a hundred fails once after it.
struct Insert {
    done: Arc<AtomicU64>,
}

#[async_trait]
impl Handler<PgWorkTx> for Insert {
    type Data = Numbered;

    async fn handle(&self, job: Job<Numbered>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        sqlx::query("insert into effects (n) values ($1)")
            .bind(i64::try_from(n).map_err(JobError::permanent)?)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        if n % 100 == 7 && job.attempt == 1 {
            return Err(JobError::retry("fails once"));
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// `PgQueue` with each fetch timed: every other call passes through unchanged.
struct TimedFetch {
    queue: PgQueue,
    /// Seconds each `receive` took since the window began, and whether it was the fair
    /// queue's.
    fetches: Arc<Mutex<Vec<(f64, bool)>>>,
}

#[async_trait]
impl PullPort for TimedFetch {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let started = Instant::now();
        let received = self.queue.receive(queue, max, lease).await;
        if let Ok(mut fetches) = self.fetches.lock() {
            fetches.push((started.elapsed().as_secs_f64(), queue.as_str() == FAIR));
        }
        received
    }

    async fn wait_for_work(&self, queue: &QueueName) {
        self.queue.wait_for_work(queue).await;
    }

    fn share_by_tenant(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), Unsupported> {
        self.queue.share_by_tenant(queue, fairness)
    }
}

#[async_trait]
impl SettlePort for TimedFetch {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.queue.ack(lease).await
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.queue.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.queue.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        self.queue.extend(lease, by).await
    }
}

#[async_trait]
impl SettleInTransaction<PgStore> for TimedFetch {
    fn shares_transactions_with(&self, store: &PgStore) -> Result<(), Unsupported> {
        self.queue.shares_transactions_with(store)
    }

    async fn hold(&self, tx: &mut PgWorkTx, leases: &[&Lease]) -> Result<Vec<bool>, StoreError> {
        self.queue.hold(tx, leases).await
    }

    async fn hold_and_claim(
        &self,
        tx: &mut PgWorkTx,
        deliveries: &[(&Lease, JobId)],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Option<Claim>>, StoreError>
    where
        PgWorkTx: GroupTransaction,
    {
        self.queue
            .hold_and_claim(tx, deliveries, consumer, at)
            .await
    }

    async fn settle(
        &self,
        tx: &mut PgWorkTx,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError> {
        self.queue.settle(tx, settlements).await
    }
}

/// A private PostgreSQL cluster in a temporary directory, with the server's defaults
/// (autovacuum on), stopped and removed when dropped.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let bin = pg_bin()?;
        let dir = std::env::temp_dir().join(format!("jobs-bench-soak-{}", std::process::id()));
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let cluster = Cluster { dir, bin, port };
        let dir = cluster
            .dir
            .to_str()
            .context("a temporary directory's path")?;
        cluster.as_server(&[
            "initdb",
            "-D",
            dir,
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        ])?;
        let settings =
            format!("-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c max_connections=100");
        let log = format!("{dir}/server.log");
        cluster.as_server(&[
            "pg_ctl", "-D", dir, "-o", &settings, "-l", &log, "-w", "start",
        ])?;
        Ok(cluster)
    }

    fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
    }

    /// Runs one of the server's programs, as the `postgres` user when this process is root
    /// (the server refuses to run as root).
    fn as_server(&self, args: &[&str]) -> Result<()> {
        let program = self.bin.join(args[0]);
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        let mut command = if root {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        let out = command
            .args(&args[1..])
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.to_str() {
            let _ = self.as_server(&["pg_ctl", "-D", dir, "-m", "fast", "-w", "stop"]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory of the server's programs: `JOBS_BENCH_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else `pg_config --bindir`.
fn pg_bin() -> Result<PathBuf> {
    if let Ok(bin) = std::env::var("JOBS_BENCH_PG_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let debian = Path::new("/usr/lib/postgresql");
    if let Ok(entries) = std::fs::read_dir(debian) {
        let newest = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .max();
        if let Some(version) = newest {
            return Ok(debian.join(version.to_string()).join("bin"));
        }
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .context("finding PostgreSQL's programs: set JOBS_BENCH_PG_BIN or JOBS_BENCH_SOAK_URL")?;
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

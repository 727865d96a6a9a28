//! What every benchmark needs: an async runtime, a count from the environment, and a throwaway
//! PostgreSQL database.

use std::str::FromStr;

use anyhow::{Context, Result};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};

/// Runs `work` to completion on a multi-threaded runtime, as a deployment would, or on a
/// current-thread one with `JOBS_BENCH_RUNTIME=current_thread` (what that choice costs a
/// worker, ADR 0011).
pub(crate) fn block_on(work: impl Future<Output = Result<()>>) -> Result<()> {
    let mut builder = match std::env::var("JOBS_BENCH_RUNTIME").as_deref() {
        Err(_) | Ok("multi_thread") => tokio::runtime::Builder::new_multi_thread(),
        Ok("current_thread") => tokio::runtime::Builder::new_current_thread(),
        Ok(other) => anyhow::bail!(
            "JOBS_BENCH_RUNTIME must be multi_thread or current_thread, not `{other}`"
        ),
    };
    builder.enable_all().build()?.block_on(work)
}

/// The number in the environment variable `var`, or `default` when it is unset.
pub(crate) fn count(var: &str, default: u64) -> Result<u64> {
    std::env::var(var)
        .ok()
        .map(|n| n.parse())
        .transpose()
        .with_context(|| format!("{var} must be a number"))
        .map(|n| n.unwrap_or(default))
}

/// Runs `work` on a fresh database named after `prefix` on the server `DATABASE_URL` names
/// (default the local one), dropping it afterwards whatever `work` returned.
pub(crate) async fn with_database<T, F, Fut>(prefix: &str, work: F) -> Result<T>
where
    F: FnOnce(PgConnectOptions) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let server = PgConnectOptions::from_str(&url)?.disable_statement_logging();
    with_database_on(&server, prefix, work).await
}

/// [`with_database`] on `server`.
pub(crate) async fn with_database_on<T, F, Fut>(
    server: &PgConnectOptions,
    prefix: &str,
    work: F,
) -> Result<T>
where
    F: FnOnce(PgConnectOptions) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let name = format!("{prefix}_{}", std::process::id());
    let mut admin = PgConnection::connect_with(server)
        .await
        .context("connecting to PostgreSQL")?;
    // The bench's own name: a prefix and the process id.
    sqlx::query(AssertSqlSafe(format!("create database \"{name}\"")))
        .execute(&mut admin)
        .await?;
    let result = work(server.clone().database(&name)).await;
    sqlx::query(AssertSqlSafe(format!(
        "drop database if exists \"{name}\" with (force)"
    )))
    .execute(&mut admin)
    .await?;
    result
}

/// One measured row, printed as a JSON object on its own line when `JOBS_BENCH_JSON=1`, so a
/// script can collect every figure a benchmark printed for people.
pub(crate) fn json_row(row: serde_json::Value) {
    if std::env::var("JOBS_BENCH_JSON").is_ok_and(|v| v == "1") {
        println!("{row}");
    }
}

/// [`json_row`] of a throughput next to its baseline: `rate` operations (jobs, acquisitions,
/// messages) per second for `side`, the baseline's, and their ratio.
pub(crate) fn rate_row(
    bench: &str,
    shape: &str,
    side: &str,
    concurrency: usize,
    rate: f64,
    baseline: f64,
) {
    json_row(serde_json::json!({
        "bench": bench,
        "shape": shape,
        "side": side,
        "concurrency": concurrency,
        "jobs_per_s": rate.round(),
        "baseline_jobs_per_s": baseline.round(),
        "ratio": ratio(rate, baseline),
    }));
}

/// `rate / baseline` to two decimals.
pub(crate) fn ratio(rate: f64, baseline: f64) -> f64 {
    (rate / baseline * 100.0).round() / 100.0
}

/// Installs what a deployed worker runs with: a metrics recorder (atomic counters and
/// histograms, as an exporter keeps them) and an info-level tracing subscriber (formatting into
/// a sink, so the terminal shows only the figures).
pub(crate) fn install_observability() -> Result<()> {
    metrics::set_global_recorder(AtomicRecorder::default())
        .map_err(|e| anyhow::anyhow!("install the metrics recorder: {e}"))?;
    // Without colours, as a worker process logs when its output is not a terminal.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(std::io::sink)
        .try_init()
        .map_err(|e| anyhow::anyhow!("install the tracing subscriber: {e}"))
}

/// A recorder keeping every metric in atomics, like the exporters' registries.
struct AtomicRecorder {
    registry: Registry<Key, AtomicStorage>,
}

impl Default for AtomicRecorder {
    fn default() -> Self {
        AtomicRecorder {
            registry: Registry::atomic(),
        }
    }
}

impl Recorder for AtomicRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// CPU time spent by this process (the client) and by the PostgreSQL server's processes, so a
/// row can say where a job's cost goes, not only how fast it went. Read from `/proc` (Linux);
/// elsewhere, or when `/proc` cannot be read, every reading is zero.
#[derive(Clone, Copy, Default)]
pub(crate) struct Cpu {
    client: u64,
    server: u64,
}

impl Cpu {
    /// The CPU time both sides have used so far, in clock ticks.
    pub(crate) fn now() -> Cpu {
        let mut cpu = Cpu {
            client: ticks("/proc/self/stat").unwrap_or(0),
            server: 0,
        };
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let path = entry.path().join("stat");
                if std::fs::read_to_string(entry.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == "postgres")
                {
                    cpu.server += ticks(&path).unwrap_or(0);
                }
            }
        }
        cpu
    }

    /// Microseconds of CPU per job since `start`, client and server, for `jobs` jobs.
    pub(crate) fn per_job_since(start: Cpu, jobs: u64) -> (f64, f64) {
        let end = Cpu::now();
        // Linux counts these in USER_HZ, 100 a second on every platform it runs on.
        let us = |ticks: u64| ticks as f64 * 10_000.0 / jobs.max(1) as f64;
        (
            us(end.client.saturating_sub(start.client)),
            us(end.server.saturating_sub(start.server)),
        )
    }
}

/// utime + stime + cutime + cstime of `/proc/PID/stat`: a process's CPU time and its reaped
/// children's (a server's ended backends), in clock ticks.
fn ticks(path: impl AsRef<std::path::Path>) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces; the fields after it are plain.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().ok())
        .sum()
}

/// The insert of raw claims of `ids` (`$1` the ids, `$2` the consumer, `$3` the time) as the
/// PostgreSQL store writes them (ADR 0014): into the one slice of `core.processed_jobs` the
/// ids share (the day of their first 48 bits, modulo 64), through the parent when they span
/// several. Restated here, not imported, so that the baseline does the adapter's work by hand.
pub(crate) fn raw_claims(ids: &[sqlx::types::Uuid]) -> String {
    let slot = |id: &sqlx::types::Uuid| {
        let ms = id.as_bytes()[..6]
            .iter()
            .fold(0u64, |ms, &b| ms << 8 | u64::from(b));
        ms / 86_400_000 % 64
    };
    let first = ids.first().map(slot);
    match first.filter(|s| ids.iter().all(|id| slot(id) == *s)) {
        Some(s) => format!(
            "insert into core.processed_jobs_{s:03} (job_id, consumer, processed_at, slot) \
             select u.id, $2, $3, {s} from unnest($1::uuid[]) as u(id) on conflict do nothing"
        ),
        None => "insert into core.processed_jobs (job_id, consumer, processed_at, slot) \
             select u.id, $2, $3, core.processed_slot(u.id) from unnest($1::uuid[]) as u(id) \
             on conflict do nothing"
            .to_owned(),
    }
}

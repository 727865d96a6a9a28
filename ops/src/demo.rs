//! `jobsctl demo`: the embedded defaults end to end, in seconds and with no services: the
//! in-memory queue and a SQLite store in a temporary file.
//!
//! Scenes: jobs for a few tenants, a retry that succeeds, a poison message, a job that
//! exhausts its attempts, a duplicate delivery skipped by `processed_jobs`, and a replay of the
//! dead letter. Time is compressed by a per-queue retry policy override, with its rationale,
//! exactly as a module would override the standard's policy.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_sqlite::{SqliteStore, SqliteWorkTx, sqlx};
use jobs_consumers::{
    CoalescingAlerter, DeadLetters, Handler, Job, JobError, Outcome, QueuePolicy, RetryPolicy,
    Worker,
};
use jobs_core::{
    Alert, AlertError, Alerter, ConsumerName, CorrelationId, DeadLetterFilter, DeadLetterStore,
    Envelope, JobId, PublishOptions, QueueDepth, QueueName, QueuePort, SystemClock, TenantId,
};
use serde::Deserialize;
use serde_json::json;

const TENANTS: [&str; 3] = [
    "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90",
    "5f0e2b1c-8a9d-4e3f-b2c1-7d6e5f4a3b21",
    "9c8b7a6d-5e4f-4a3b-8c2d-1e0f9a8b7c65",
];

#[derive(Debug, Deserialize)]
struct Invoice {
    invoice: u64,
    #[serde(default)]
    flaky: bool,
    #[serde(default)]
    broken: bool,
}

/// Books an invoice; `flaky` ones fail their first attempt, `broken` ones fail until fixed.
struct BookInvoice {
    fixed: Arc<AtomicBool>,
}

#[async_trait]
impl Handler<SqliteWorkTx> for BookInvoice {
    type Data = Invoice;

    async fn handle(&self, job: Job<Invoice>, tx: &mut SqliteWorkTx) -> Result<(), JobError> {
        let invoice = &job.envelope.data;
        if invoice.flaky && job.attempt == 1 {
            return Err(JobError::retry("ledger timed out"));
        }
        if invoice.broken && !self.fixed.load(Ordering::SeqCst) {
            return Err(JobError::retry(format!(
                "invoice {} references an unknown customer",
                invoice.invoice
            )));
        }
        // The business write, in the same transaction as the processed_jobs claim.
        sqlx::query("insert into booked_invoices (invoice, job_id) values (?, ?)")
            .bind(i64::try_from(invoice.invoice).map_err(JobError::permanent)?)
            .bind(job.envelope.job_id.to_string())
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

/// Keeps alerts for the report instead of paging anyone.
#[derive(Default, Clone)]
struct ConsoleAlerter {
    raised: Arc<Mutex<Vec<Alert>>>,
}

#[async_trait]
impl Alerter for ConsoleAlerter {
    async fn alert(&self, alert: &Alert) -> Result<(), AlertError> {
        self.raised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(alert.clone());
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Tally {
    published: u32,
    processed: u32,
    duplicates: u32,
    retries: u32,
    dead: u32,
}

/// Runs the demo on a SQLite file in the temporary directory, removed afterwards.
pub(crate) async fn run(out: &mut impl Write) -> Result<()> {
    let path = std::env::temp_dir().join(format!("jobsctl-demo-{}.db", std::process::id()));
    let result = run_on(&path, out).await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    result
}

async fn run_on(path: &std::path::Path, out: &mut impl Write) -> Result<()> {
    let queue = MemoryQueue::default();
    let store = SqliteStore::open(path).await?;
    store.migrate().await?;
    sqlx::query("create table booked_invoices (invoice integer not null, job_id text not null)")
        .execute(store.pool())
        .await?;
    let alerter = ConsoleAlerter::default();
    let fixed = Arc::new(AtomicBool::new(false));
    let invoices: QueueName = "billing.invoices".parse()?;
    let policy = QueuePolicy::new(
        invoices.clone(),
        RetryPolicy::new(3, Duration::from_millis(100), Duration::from_millis(400))?,
        "demo: compress the standard's 30 s to 1 h backoff so the story fits in seconds",
    )?;
    let worker = Worker::builder(
        ConsumerName::try_from("billing.booker")?,
        invoices.clone(),
        Arc::new(queue.clone()),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(
        "billing.invoice_issued".parse()?,
        BookInvoice {
            fixed: fixed.clone(),
        },
    )
    .policy(policy.clone())
    .alerts(CoalescingAlerter::new(
        Arc::new(alerter.clone()),
        Arc::new(SystemClock),
        Duration::from_secs(60),
    ))
    .build()?;

    writeln!(
        out,
        "softcrum-jobs demo: in-memory queue, SQLite store in {}, console alerts",
        path.display()
    )?;
    writeln!(out, "retry policy override: {policy}\n")?;

    let mut tally = Tally::default();
    let mut broken_job = None;
    for (n, tenant) in TENANTS.iter().enumerate() {
        let tenant: TenantId = tenant.parse()?;
        let correlation: CorrelationId = JobId::generate().to_string().parse()?;
        let invoice = 1000 + n as u64;
        let data = json!({ "invoice": invoice, "flaky": n == 1, "broken": n == 2 });
        let envelope = Envelope::new(tenant, correlation, "billing.invoice_issued".parse()?, data);
        publish(&queue, &invoices, &envelope, PublishOptions::default()).await?;
        tally.published += 1;
        if n == 0 {
            // The producer timed out and published again under a fresh key: the transport
            // delivers both copies, and processed_jobs skips the second.
            let again = PublishOptions::default().dedup_key("producer-retry");
            publish(&queue, &invoices, &envelope, again).await?;
        }
        if n == 2 {
            broken_job = Some(envelope.job_id);
        }
    }
    queue.publish_bytes(
        &invoices,
        b"{\"job_id\": 42, oops".to_vec(),
        &PublishOptions::default(),
    );
    writeln!(
        out,
        "published {} invoices for {} tenants, a duplicate copy and a poison message",
        tally.published,
        TENANTS.len()
    )?;

    drain(&worker, &mut tally, out).await?;

    let dead = store.list(&DeadLetterFilter::default()).await?;
    writeln!(out, "\ndead letters:")?;
    for letter in &dead {
        writeln!(
            out,
            "  #{} job {} after {} attempt(s): {}",
            letter.id,
            letter
                .letter
                .job_id
                .map_or_else(|| "(unreadable)".to_owned(), |id| id.to_string()),
            letter.letter.attempts,
            letter.letter.last_error
        )?;
    }
    for alert in alerter
        .raised
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        writeln!(out, "alert: {}", alert.title)?;
    }

    writeln!(out, "\nthe customer is fixed; replaying the exhausted job")?;
    fixed.store(true, Ordering::SeqCst);
    let ops = DeadLetters::new(Arc::new(store.clone()), Arc::new(queue.clone()));
    let replayable = dead
        .iter()
        .find(|l| l.letter.job_id.is_some() && l.letter.job_id == broken_job)
        .context("the exhausted job is in the dead letters")?;
    ops.replay(replayable.id, None).await?;
    drain(&worker, &mut tally, out).await?;

    writeln!(
        out,
        "\n{:<18} {:>9} {:>9} {:>10} {:>7} {:>13} {:>5}",
        "queue", "published", "processed", "duplicate", "retries", "dead-lettered", "depth"
    )?;
    let depth = queue.depth(&invoices).await?.total();
    writeln!(
        out,
        "{:<18} {:>9} {:>9} {:>10} {:>7} {:>13} {:>5}",
        invoices.as_str(),
        tally.published,
        tally.processed,
        tally.duplicates,
        tally.retries,
        tally.dead,
        depth
    )?;
    let effects: Vec<(i64,)> =
        sqlx::query_as("select invoice from booked_invoices order by invoice")
            .fetch_all(store.pool())
            .await?;
    let booked: Vec<String> = effects.iter().map(|(n,)| n.to_string()).collect();
    writeln!(
        out,
        "\ninvoices booked (rows in booked_invoices): {}",
        booked.join(", ")
    )?;
    store.pool().close().await;
    anyhow::ensure!(depth == 0, "{depth} messages left on the queue");
    anyhow::ensure!(
        effects.len() == TENANTS.len(),
        "expected one effect per invoice, got {effects:?}"
    );
    writeln!(
        out,
        "every invoice booked exactly once; the poison message waits for review"
    )?;
    cron_scene(out).await
}

/// One cron slot over tenants on different data-freshness tiers, fired by two scheduler
/// instances: the second publishes nothing new.
async fn cron_scene(out: &mut impl Write) -> Result<()> {
    use jobs_adapter_memory::MemoryTenantDirectory;
    use jobs_core::{ManualClock, Tenant};
    use jobs_cron::{CatchUp, Scheduler, standard_tasks};

    writeln!(
        out,
        "\ncron: the 06:00 UTC slot of 2026-12-02 over four tenants, fired by two schedulers"
    )?;
    let tiers = ["1h", "3h", "6h", "12h"];
    let directory = Arc::new(MemoryTenantDirectory::with_tenants(
        tiers.iter().enumerate().map(|(n, tier)| Tenant {
            id: format!("00000000-0000-4000-8000-{:012x}", n + 1)
                .parse()
                .expect("a valid tenant id"),
            entitlements: [("data_freshness".to_owned(), (*tier).to_owned())].into(),
        }),
    ));
    let slot = std::time::UNIX_EPOCH + Duration::from_secs(1_796_191_200); // 2026-12-02T06:00:00Z
    let clock = Arc::new(ManualClock::new(slot));
    let queue = MemoryQueue::new(clock.clone());
    for instance in ["a", "b"] {
        let scheduler = Scheduler::new(
            standard_tasks(),
            directory.clone(),
            Arc::new(queue.clone()),
            clock.clone(),
            CatchUp::default(),
        )?;
        let report = scheduler.tick_at(slot, false).await;
        for fired in &report.fired {
            writeln!(
                out,
                "  scheduler {instance}: {:<24} {} tenants, {} jobs: {} queued, {} duplicates",
                fired.kind.as_str(),
                fired.tenants,
                fired.jobs,
                fired.queued,
                fired.duplicates
            )?;
        }
    }
    writeln!(
        out,
        "  data freshness at 06:00 reaches the 1h, 3h and 6h tiers; 12h waits for 12:00"
    )?;
    Ok(())
}

async fn publish(
    queue: &MemoryQueue,
    name: &QueueName,
    envelope: &Envelope,
    opts: PublishOptions,
) -> Result<()> {
    queue
        .publish(name, envelope, opts)
        .await
        .with_context(|| format!("publishing {} to {name}", envelope.job_id))?;
    Ok(())
}

/// Runs the worker until the queue is empty, narrating each outcome.
async fn drain(
    worker: &Worker<SqliteStore>,
    tally: &mut Tally,
    out: &mut impl Write,
) -> Result<()> {
    let queue = worker.queue().clone();
    let mut idle_polls = 0;
    while idle_polls < 50 {
        let outcomes = worker.run_once().await?;
        if outcomes.is_empty() {
            idle_polls += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        idle_polls = 0;
        for outcome in outcomes {
            let line = match &outcome {
                Outcome::Processed => {
                    tally.processed += 1;
                    "processed".to_owned()
                }
                Outcome::Duplicate => {
                    tally.duplicates += 1;
                    "duplicate skipped (already in processed_jobs)".to_owned()
                }
                Outcome::Retrying { .. } => {
                    tally.retries += 1;
                    "failed, retrying with backoff".to_owned()
                }
                Outcome::DeadLettered { id, reason } => {
                    tally.dead += 1;
                    format!("dead-lettered as #{id} ({reason:?})")
                }
                other => format!("{other:?}"),
            };
            writeln!(out, "  {:<18} {line}", queue.as_str())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_demo_books_every_invoice_once_and_keeps_the_poison() {
        let mut out = Vec::new();
        super::run(&mut out).await.expect("the demo succeeds");
        let report = String::from_utf8(out).expect("utf-8");
        for expected in [
            "duplicate skipped",
            "failed, retrying",
            "(Poison)",
            "(Exhausted)",
            "alert: ",
            "exactly once",
            "4 tenants, 3 jobs: 0 queued, 3 duplicates",
        ] {
            assert!(
                report.contains(expected),
                "missing {expected:?} in:\n{report}"
            );
        }
    }
}

//! `jobsctl demo`: the embedded defaults end to end, in seconds and with no services: the
//! in-memory queue and a SQLite store in a temporary file.
//!
//! Scenes: jobs for a few tenants, a retry that succeeds, a poison message, a job that
//! exhausts its attempts, a duplicate delivery skipped by `processed_jobs`, and a replay of the
//! dead letter. Time is compressed by a per-queue retry policy override, with its rationale,
//! exactly as a module would override the standard's policy. Then a cron slot fanned out, and
//! the notification rails: a marketing blast and a stream of transactional emails through the
//! Resend adapter and the Resend fake (started in process), rate limited per provider and
//! tenant, with transactional first.

use std::collections::HashMap;
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
    let alerts = CoalescingAlerter::new(
        Arc::new(alerter.clone()),
        Arc::new(SystemClock),
        Duration::from_secs(60),
    );
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
    .alerts(alerts.clone())
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
    alerts.quiet().await;
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
    notifications_scene(out).await
}

/// Marketing emails of the blast.
const BLAST: usize = 3_000;
/// Transactional emails published at once when the scene starts (past the gate's threshold).
const BURST: usize = 24;
/// Then this many every tick, for `STREAM_TICKS` ticks.
const STREAM: usize = 3;
const STREAM_TICKS: u32 = 10;
const TICK: Duration = Duration::from_millis(250);
/// The provider's limit as the fake enforces it: requests in any second. Resend's is 5/s; the
/// demo runs ten times faster to finish in seconds.
const PROVIDER_LIMIT: usize = 50;

/// A marketing blast and a stream of transactional emails on one channel, through the Resend
/// fake: transactional first, the provider's rate never exceeded, every email sent once.
async fn notifications_scene(out: &mut impl Write) -> Result<()> {
    use jobs_adapter_memory::{MemoryRateLimiter, MemoryStore};
    use jobs_adapter_resend::{ResendConfig, ResendProvider};
    use jobs_core::{Bucket, Email, PullPort};
    use jobs_notifications::{
        Blast, EmailSender, PriorityGate, ProviderLimits, SEND_EMAIL_KIND, TransactionalFirst,
        publish_emails,
    };
    use jobs_testkit::fakes::resend::FakeResend;
    use std::time::Instant;

    let fake = FakeResend::start().await?;
    fake.limit_rate(PROVIDER_LIMIT, Duration::from_secs(1));
    let provider = Arc::new(ResendProvider::new(
        ResendConfig::new(fake.api_key()).with_base_url(fake.base_url()),
    )?);
    // 6 requests per 250 ms: at most 6 + 6 × 5 = 36 grants in any second of the limiter's
    // clock, so requests delayed on their way by up to half a second still arrive under the
    // provider's 50.
    let bucket = Bucket::new(6, 6, Duration::from_millis(250))?;
    let limits = ProviderLimits::new("resend", bucket, bucket);
    let limiter = Arc::new(MemoryRateLimiter::default());
    let sender = Arc::new(EmailSender::new(provider, limiter.clone(), limits));
    let queue = MemoryQueue::default();
    let store = MemoryStore::default();
    let transactional = jobs_notifications::transactional("email")?;
    let marketing = jobs_notifications::marketing("email")?;
    let gate = PriorityGate::new(4, 0)?;
    let layered = Arc::new(TransactionalFirst::new(
        Arc::new(queue.clone()),
        Arc::new(queue.clone()),
        transactional.clone(),
        gate,
    ));
    let worker = |name: &QueueName, pull: Option<Arc<dyn PullPort>>| -> Result<_> {
        let mut builder = Worker::builder(
            ConsumerName::try_from(format!("{name}.sender").as_str())?,
            name.clone(),
            Arc::new(queue.clone()),
            Arc::new(store.clone()),
            Arc::new(store.clone()),
        )
        .handler(
            SEND_EMAIL_KIND.parse()?,
            jobs_ops::notify::email_handler(sender.clone(), limiter.clone(), Arc::new(SystemClock)),
        )
        .concurrency(8);
        if let Some(pull) = pull {
            builder = builder.pull(pull);
        }
        Ok(builder.build()?)
    };
    let urgent = worker(&transactional, None)?;
    let bulk = worker(&marketing, Some(layered.clone()))?;

    writeln!(
        out,
        "\nnotifications: a marketing blast of {BLAST} emails and {} transactional ones through \
         the Resend fake,\n  which allows {PROVIDER_LIMIT} requests/s; our provider bucket: 6 per \
         250 ms; marketing pauses above 4 transactional jobs queued",
        BURST + STREAM * STREAM_TICKS as usize
    )?;
    let started = Instant::now();
    let tenant: TenantId = TENANTS[0].parse()?;
    let blast = Blast {
        id: JobId::generate(),
        tenant,
        correlation: JobId::generate().to_string().parse()?,
        queue: marketing.clone(),
    };
    let recipients = |prefix: &str, from: usize, n: usize, subject: &str| -> Vec<Email> {
        (from..from + n)
            .map(|i| {
                let mut email = Email::new(
                    "Acme <news@acme.test>",
                    vec![format!("{prefix}{i}@example.test")],
                    subject,
                );
                email.text = Some(format!("published at {} ms", started.elapsed().as_millis()));
                email
            })
            .collect()
    };
    let chunks = publish_emails(
        &queue,
        &blast,
        recipients("fan", 0, BLAST, "Winter sale"),
        100,
    )
    .await?
    .len();
    let mut published: HashMap<String, Instant> = HashMap::new();
    let mut next_transactional = 0;
    let mut publish_transactional = async |n: usize| -> Result<()> {
        for i in next_transactional..next_transactional + n {
            let tenant: TenantId = TENANTS[i % TENANTS.len()].parse()?;
            let one = Blast {
                id: JobId::generate(),
                tenant,
                correlation: JobId::generate().to_string().parse()?,
                queue: transactional.clone(),
            };
            let email = recipients("customer", i, 1, "Your receipt");
            published.insert(email[0].to[0].clone(), Instant::now());
            publish_emails(&queue, &one, email, 100).await?;
        }
        next_transactional += n;
        Ok(())
    };
    publish_transactional(BURST).await?;
    writeln!(
        out,
        "  published {chunks} marketing batch jobs, then a burst of {BURST} transactional emails"
    )?;
    writeln!(
        out,
        "  {:>6} {:>14} {:>18} {:>15} {:>10}",
        "time", "trans. waiting", "transactional sent", "marketing sent", "marketing"
    )?;

    let mut ticks = 0u32;
    let mut next_tick = started + TICK;
    let mut paused_this_tick = false;
    loop {
        let mut moved = urgent.run_once().await?.len();
        moved += bulk.run_once().await?.len();
        paused_this_tick |= layered.paused();
        if Instant::now() >= next_tick {
            next_tick += TICK;
            ticks += 1;
            let batches = fake.batches();
            let sent_on = |rail: &str| {
                batches
                    .iter()
                    .filter(|b| b.emails[0]["subject"] == rail)
                    .map(|b| b.emails.len())
                    .sum::<usize>()
            };
            writeln!(
                out,
                "  {:>5.2}s {:>14} {:>18} {:>15} {:>10}",
                started.elapsed().as_secs_f64(),
                queue.depth(&transactional).await?.total(),
                sent_on("Your receipt"),
                sent_on("Winter sale"),
                if paused_this_tick { "paused" } else { "open" }
            )?;
            paused_this_tick = false;
            if ticks <= STREAM_TICKS {
                publish_transactional(STREAM).await?;
            }
        }
        if moved == 0 {
            let left =
                queue.depth(&transactional).await?.total() + queue.depth(&marketing).await?.total();
            if left == 0 && ticks >= STREAM_TICKS {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "the notification scene did not finish: {left} jobs left"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    let batches = fake.batches();
    // Latency from publish to the provider, for the burst and for the stream after it.
    let latencies = |burst: bool| -> Vec<Duration> {
        let mut found: Vec<Duration> = batches
            .iter()
            .filter(|b| b.emails[0]["subject"] == "Your receipt")
            .filter_map(|b| {
                let to = b.emails[0]["to"].as_array()?.first()?.as_str()?;
                let n: usize = to
                    .strip_prefix("customer")?
                    .split('@')
                    .next()?
                    .parse()
                    .ok()?;
                (burst == (n < BURST))
                    .then(|| Some(b.received_at.duration_since(*published.get(to)?)))
                    .flatten()
            })
            .collect();
        found.sort();
        found
    };
    let (burst, stream) = (latencies(true), latencies(false));
    let ms = |found: &[Duration], p: usize| {
        found
            .get(found.len().saturating_sub(1) * p / 100)
            .map_or(0, Duration::as_millis)
    };
    let marketing_first = batches
        .iter()
        .filter(|b| b.emails[0]["subject"] == "Winter sale")
        .map(|b| b.received_at.duration_since(started))
        .min()
        .context("marketing was sent")?;
    let marketing_last = batches
        .iter()
        .filter(|b| b.emails[0]["subject"] == "Winter sale")
        .map(|b| b.received_at.duration_since(started))
        .max()
        .context("marketing was sent")?;
    let times = fake.batch_request_times();
    let peak = times
        .iter()
        .enumerate()
        .map(|(i, at)| {
            times[i..]
                .iter()
                .take_while(|later| later.duration_since(*at) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    let sent = fake.sent();
    let mut distinct: Vec<String> = sent.iter().map(|e| e["to"].to_string()).collect();
    distinct.sort();
    distinct.dedup();
    let expected = BLAST + next_transactional;
    writeln!(
        out,
        "  transactional latency, publish to provider: the burst of {BURST} p50 {} ms, max {} ms \
         (the bucket's pace);\n    the stream after it p50 {} ms, max {} ms, while the blast \
         was sending",
        ms(&burst, 50),
        ms(&burst, 100),
        ms(&stream, 50),
        ms(&stream, 100)
    )?;
    writeln!(
        out,
        "  marketing: first batch at {:.2}s, after the burst; last at {:.2}s",
        marketing_first.as_secs_f64(),
        marketing_last.as_secs_f64()
    )?;
    writeln!(
        out,
        "  provider: {} batch requests, peak {peak} in any second (limit {PROVIDER_LIMIT}), {} answered 429",
        times.len(),
        fake.rate_limited()
    )?;
    anyhow::ensure!(
        sent.len() == expected && distinct.len() == expected,
        "expected {expected} emails sent once, the provider got {} ({} distinct)",
        sent.len(),
        distinct.len()
    );
    anyhow::ensure!(
        fake.paths().iter().all(|p| p == "/emails/batch"),
        "a request went past the batch endpoint"
    );
    writeln!(
        out,
        "  {expected} emails sent exactly once, in {} batch requests, through /emails/batch only",
        batches.len()
    )?;
    fake.shutdown().await;
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
            "paused",
            ", 0 answered 429",
            "3054 emails sent exactly once",
        ] {
            assert!(
                report.contains(expected),
                "missing {expected:?} in:\n{report}"
            );
        }
    }
}

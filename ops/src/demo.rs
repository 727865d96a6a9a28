//! `jobsctl demo`: the embedded defaults end to end, in seconds and with no services.
//!
//! Time runs on a manual clock so that delayed jobs are shown without waiting for them.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use jobs_adapter_memory::MemoryQueue;
use jobs_core::{
    ConsumerPort, CorrelationId, Envelope, JobId, ManualClock, PublishOptions, QueueName,
    QueuePort, TenantId,
};
use serde_json::json;

const TENANTS: [&str; 3] = [
    "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90",
    "5f0e2b1c-8a9d-4e3f-b2c1-7d6e5f4a3b21",
    "9c8b7a6d-5e4f-4a3b-8c2d-1e0f9a8b7c65",
];

#[derive(Debug, Default)]
struct Tally {
    published: u32,
    duplicates: u32,
    delayed: u32,
    delivered: u32,
    acked: u32,
}

/// Runs the demo, writing its report to `out`.
pub(crate) async fn run(out: &mut impl Write) -> Result<()> {
    let clock = ManualClock::default();
    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    let invoices: QueueName = "billing.invoices".parse()?;
    let email = QueueName::transactional("email")?;
    let mut tally: BTreeMap<QueueName, Tally> = BTreeMap::new();

    writeln!(out, "softcrum-jobs demo: in-memory queue, manual clock\n")?;
    for (n, tenant) in TENANTS.iter().enumerate() {
        let tenant: TenantId = tenant.parse()?;
        let correlation: CorrelationId = JobId::generate().to_string().parse()?;
        let invoice = Envelope::new(
            tenant,
            correlation,
            "billing.invoice_issued".parse()?,
            json!({ "invoice": 1000 + n, "amount_cents": 4200 }),
        );
        let receipt = Envelope::new(
            tenant,
            correlation,
            "notif.email_receipt".parse()?,
            json!({ "invoice": 1000 + n }),
        );
        publish(
            &queue,
            &invoices,
            &invoice,
            PublishOptions::default(),
            &mut tally,
        )
        .await?;
        // A producer that retries its publish after a timeout: the job id deduplicates it.
        publish(
            &queue,
            &invoices,
            &invoice,
            PublishOptions::default(),
            &mut tally,
        )
        .await?;
        let reminder = PublishOptions::default().delay(Duration::from_secs(300));
        publish(
            &queue,
            &email,
            &receipt,
            PublishOptions::default(),
            &mut tally,
        )
        .await?;
        let later = Envelope::new(
            tenant,
            correlation,
            "notif.email_reminder".parse()?,
            json!({}),
        );
        publish(&queue, &email, &later, reminder, &mut tally).await?;
    }

    for name in [&invoices, &email] {
        drain(&queue, name, &mut tally, out).await?;
    }
    writeln!(out, "\n... 5 minutes pass on the manual clock ...\n")?;
    clock.advance(Duration::from_secs(301));
    for name in [&invoices, &email] {
        drain(&queue, name, &mut tally, out).await?;
    }

    writeln!(
        out,
        "\n{:<28} {:>9} {:>10} {:>7} {:>9} {:>5}",
        "queue", "published", "duplicate", "delayed", "delivered", "acked"
    )?;
    for (name, t) in &tally {
        writeln!(
            out,
            "{:<28} {:>9} {:>10} {:>7} {:>9} {:>5}",
            name.as_str(),
            t.published,
            t.duplicates,
            t.delayed,
            t.delivered,
            t.acked
        )?;
    }
    let lost: u32 = tally.values().map(|t| t.published - t.acked).sum();
    anyhow::ensure!(lost == 0, "{lost} published jobs were not acked");
    writeln!(
        out,
        "\nevery job published was delivered and acked exactly once"
    )?;
    Ok(())
}

async fn publish(
    queue: &MemoryQueue,
    name: &QueueName,
    envelope: &Envelope,
    opts: PublishOptions,
    tally: &mut BTreeMap<QueueName, Tally>,
) -> Result<()> {
    let delayed = opts.delay_value().is_some();
    let receipt = queue
        .publish(name, envelope, opts)
        .await
        .with_context(|| format!("publishing {} to {name}", envelope.job_id))?;
    let t = tally.entry(name.clone()).or_default();
    if receipt.duplicate {
        t.duplicates += 1;
    } else {
        t.published += 1;
        t.delayed += u32::from(delayed);
    }
    Ok(())
}

async fn drain(
    queue: &MemoryQueue,
    name: &QueueName,
    tally: &mut BTreeMap<QueueName, Tally>,
    out: &mut impl Write,
) -> Result<()> {
    loop {
        let batch = queue.receive(name, 10, Duration::from_secs(30)).await?;
        if batch.is_empty() {
            return Ok(());
        }
        for delivery in batch {
            let envelope = Envelope::decode(&delivery.payload)?;
            let t = tally.entry(name.clone()).or_default();
            t.delivered += 1;
            writeln!(
                out,
                "  {:<26} {:<22} tenant {}  attempt {}",
                name.as_str(),
                envelope.kind.as_str(),
                &envelope.tenant_id.to_string()[..8],
                delivery.attempt
            )?;
            queue.ack(&delivery.lease).await?;
            t.acked += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_demo_acks_every_job_it_publishes() {
        let mut out = Vec::new();
        super::run(&mut out).await.expect("the demo succeeds");
        let report = String::from_utf8(out).expect("utf-8");
        assert!(report.contains("billing.invoices"), "{report}");
        assert!(report.contains("notif.email.transactional"), "{report}");
        assert!(report.contains("exactly once"), "{report}");
    }
}

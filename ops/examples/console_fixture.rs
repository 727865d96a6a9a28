//! The operations console over an in-memory store holding dead letters, for the browser tests
//! (`e2e/`, run by `cargo xtask ci`) and for a look at the console without a database:
//!
//! ```sh
//! JOBS_CONSOLE_TOKENS=fixture-operator-token cargo run -p jobs-ops --example console_fixture
//! ```
//!
//! It records forty letters over two queues and three tenants (three failures, each with
//! varying ids; one payload and one error holding markup; one poison message of raw bytes),
//! serves the console on `127.0.0.1:PORT` (`--port`, default any free one), prints
//! `console on http://…/`, and runs until killed. Replays go to an in-memory queue whose
//! depth the overview shows; the three tenants' freshness tiers (`1h`, `6h`, none) are on the
//! cron page.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryTenantDirectory};
use jobs_core::{DeadLetterStore, Envelope, NewDeadLetter, QueueName, Tenant, TenantId};
use jobs_ops::console::{Console, ConsoleToken};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let port: u16 = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [flag, port] if flag == "--port" => port.parse()?,
        [] => 0,
        _ => anyhow::bail!("usage: console_fixture [--port N]"),
    };
    let tokens = ConsoleToken::parse_list(
        &std::env::var("JOBS_CONSOLE_TOKENS").unwrap_or_else(|_| "fixture-operator-token".into()),
    )
    .map_err(anyhow::Error::msg)?;
    let store = MemoryStore::default();
    let queue = MemoryQueue::default();
    seed(&store).await?;
    let queues: Vec<QueueName> = vec!["billing.invoices".parse()?, "notify.email".parse()?];
    let router = Console::new(Arc::new(store.clone()), Arc::new(queue.clone()), tokens)
        .depth(Arc::new(queue), queues)
        .bulk_runs(Arc::new(store))
        .tenants(Arc::new(directory()?))
        // The browser tests stand for other clients by the header, from loopback.
        .trusted_proxies(vec![std::net::Ipv4Addr::LOCALHOST.into()])
        .router();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("console on http://{}/", listener.local_addr()?);
    let limits = jobs_ops::listen::ListenerLimits::default();
    jobs_ops::listen::serve(listener, router, limits, std::future::pending()).await;
    Ok(())
}

fn tenant(n: u32) -> anyhow::Result<TenantId> {
    Ok(format!("00000000-0000-4000-8000-{n:012x}").parse()?)
}

/// Tenants 1 to 3, entitled to recomputes hourly, every six hours, and by default nightly.
fn directory() -> anyhow::Result<MemoryTenantDirectory> {
    let mut tenants = vec![];
    for (n, tier) in [(1, Some("1h")), (2, Some("6h")), (3, None)] {
        tenants.push(Tenant {
            id: tenant(n)?,
            entitlements: tier
                .map(|t| ("data_freshness".to_owned(), t.to_owned()))
                .into_iter()
                .collect(),
        });
    }
    Ok(MemoryTenantDirectory::with_tenants(tenants))
}

/// Forty letters, oldest first, an hour apart at most.
async fn seed(store: &MemoryStore) -> anyhow::Result<()> {
    let start = SystemTime::now() - Duration::from_secs(3_600);
    for n in 0..40u32 {
        let (queue, kind, error) = match n % 4 {
            0 | 1 => (
                "billing.invoices",
                "billing.invoice_issued",
                format!("customer {} not found", 1_000 + n),
            ),
            2 => (
                "billing.invoices",
                "billing.invoice_paid",
                format!("payment provider answered 503 after {} ms", 100 + n),
            ),
            _ => (
                "notify.email",
                "notify.welcome",
                format!("address 'user{n}@example.com' bounced"),
            ),
        };
        let error = if n == 7 {
            "<script>document.title='owned'</script> failed".to_owned()
        } else {
            error
        };
        let envelope = Envelope::new(
            tenant(1 + n % 3)?,
            jobs_core::CorrelationId::generate(),
            kind.parse()?,
            serde_json::json!({ "n": n, "note": if n == 7 { "<b>bold</b>" } else { "plain" } }),
        );
        store
            .record(NewDeadLetter {
                job_id: Some(envelope.job_id),
                queue: queue.parse()?,
                consumer: Some("fixture.worker".parse()?),
                tenant_id: Some(envelope.tenant_id),
                kind: Some(envelope.kind.clone()),
                correlation_id: Some(envelope.correlation_id),
                payload: envelope.to_json_bytes()?,
                attempts: 5,
                last_error: error,
                reason: None,
                dedup_key: Some(envelope.job_id.to_string()),
                at: start + Duration::from_secs(u64::from(n) * 60),
            })
            .await?;
    }
    store
        .record(NewDeadLetter {
            job_id: None,
            queue: "billing.invoices".parse()?,
            consumer: Some("fixture.worker".parse()?),
            tenant_id: None,
            kind: None,
            correlation_id: None,
            payload: vec![0x00, 0x9f, 0x92, 0x96, b'{'],
            attempts: 1,
            last_error: "envelope: not JSON: expected value at line 1 column 1".to_owned(),
            reason: None,
            dedup_key: None,
            at: SystemTime::now(),
        })
        .await?;
    Ok(())
}

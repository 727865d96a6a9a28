//! `jobsctl cron`: the periodic tasks, their next slots, and one slot fired by hand.

use std::io::Write;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Result, bail};
use jobs_adapter_memory::{MemoryQueue, MemoryTenantDirectory};
use jobs_core::{SystemClock, TenantDirectory};
use jobs_cron::{CatchUp, Scheduler, TickReport, standard_tasks};

use jobs_core::{QueueName, QueuePort};
use jobs_ops::compose::{Queue, Store};

use crate::{Usage, values};
use serde_json::json;

/// The standard tasks over `directory`, publishing to `queue` (an in-process queue when only
/// planning).
fn scheduler(directory: Arc<dyn TenantDirectory>, queue: Option<&Queue>) -> Result<Scheduler> {
    let publisher = queue.map_or_else(
        || Arc::new(MemoryQueue::default()) as Arc<dyn QueuePort>,
        |q| q.publisher.clone(),
    );
    Ok(Scheduler::new(
        standard_tasks(),
        directory,
        publisher,
        Arc::new(SystemClock),
        CatchUp::default(),
    )?)
}

/// The tenants of `store`, which only PostgreSQL keeps.
fn directory(store: &Store) -> Result<Arc<dyn TenantDirectory>> {
    let Some(directory) = store.tenants() else {
        bail!(Usage(
            "the tenant directory lives in PostgreSQL (core.tenants): pass a postgres:// \
             --database-url"
                .into()
        ));
    };
    Ok(directory)
}

/// The queues of the standard tasks, each once.
pub(crate) fn standard_queues() -> Result<Vec<QueueName>> {
    let mut queues: Vec<QueueName> = standard_tasks().into_iter().map(|t| t.queue).collect();
    queues.sort();
    queues.dedup();
    Ok(queues)
}

/// Prints every standard task with its schedule, queue and next slot.
pub(crate) fn list(as_json: bool, out: &mut impl Write) -> Result<()> {
    let scheduler = scheduler(Arc::new(MemoryTenantDirectory::default()), None)?;
    if !as_json {
        writeln!(
            out,
            "{:<32} {:<22} {:<28} next (UTC)",
            "kind", "schedule", "queue"
        )?;
    }
    for fire in scheduler.next_fire_times() {
        if as_json {
            let line = json!({
                "kind": fire.kind.as_str(),
                "schedule": fire.schedule.to_string(),
                "queue": fire.queue.as_str(),
                "next": fire.next.map(values::rfc3339),
            });
            writeln!(out, "{line}")?;
            continue;
        }
        writeln!(
            out,
            "{:<32} {:<22} {:<28} {}",
            fire.kind.as_str(),
            fire.schedule.to_string(),
            fire.queue.as_str(),
            fire.next
                .map_or_else(|| "never".to_owned(), values::rfc3339)
        )?;
    }
    Ok(())
}

/// `jobsctl cron run`: the scheduler over the tenants of `store`, publishing to `queue`,
/// ticking until a stop signal.
pub(crate) async fn run(store: &Store, queue: &Queue) -> Result<()> {
    let scheduler = scheduler(directory(store)?, Some(queue))?;
    crate::until_signal(|stop| jobs_ops::standing::run_cron(scheduler, stop)).await;
    Ok(())
}

/// Fans out every task due at `at` over the tenants of `store` to `queue`, or with no queue
/// only plans it (a dry run).
pub(crate) async fn tick(
    store: &Store,
    queue: Option<&Queue>,
    at: SystemTime,
    out: &mut impl Write,
) -> Result<()> {
    let scheduler = scheduler(directory(store)?, queue)?;
    let report: TickReport = scheduler.tick_at(at, queue.is_none()).await;
    match queue {
        None => writeln!(
            out,
            "slot {} (dry run: nothing published)",
            values::rfc3339(at)
        )?,
        Some(q) => writeln!(
            out,
            "slot {} published to {}:",
            values::rfc3339(at),
            q.scheme
        )?,
    }
    for fired in &report.fired {
        writeln!(
            out,
            "  {:<32} {:>6} tenants {:>6} jobs on {}",
            fired.kind.as_str(),
            fired.tenants,
            fired.jobs,
            fired.queue.as_str()
        )?;
        for job in &fired.sample {
            writeln!(
                out,
                "      tenant {} job {} at {}{}",
                job.tenant,
                job.job_id,
                values::rfc3339(job.run_at),
                job.tier
                    .map(|t| format!(" (tier {})", t.as_str()))
                    .unwrap_or_default()
            )?;
        }
    }
    for error in &report.errors {
        writeln!(out, "  error: {error}")?;
    }
    if report.errors.is_empty() {
        Ok(())
    } else {
        bail!("{} fan-outs failed", report.errors.len())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_list_names_every_standard_task_with_a_next_slot() {
        let mut out = Vec::new();
        super::list(false, &mut out).expect("lists");
        let text = String::from_utf8(out).expect("utf-8");
        for kind in [
            "core.usage_snapshot",
            "core.data_freshness",
            "core.processed_jobs_cleanup",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(kind))
                .unwrap_or_else(|| panic!("{kind} missing:\n{text}"));
            assert!(line.contains("20"), "no next slot on: {line}");
        }
    }
}

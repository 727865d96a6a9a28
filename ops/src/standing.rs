//! The standard's long-lived processes: the cron scheduler's ticks and the outbox relay, each
//! a loop that runs until told to stop. A worker process runs them where its configuration
//! asks ([`CRON`](crate::config::CRON), [`OUTBOX_RELAY`](crate::config::OUTBOX_RELAY));
//! `jobsctl cron run` and `jobsctl outbox relay` run them alone.

use std::time::Duration;

use jobs_cron::Scheduler;
use tokio::sync::watch;

/// How often the scheduler ticks: well inside the catch-up grace of every standard task, so
/// no slot is late by more than this.
pub const CRON_TICK: Duration = Duration::from_secs(30);

/// How long the relay waits after a batch that emptied the outbox, or after a failure.
pub const RELAY_IDLE: Duration = Duration::from_secs(1);

/// Rows the relay forwards per transaction.
pub const RELAY_BATCH: usize = 500;

/// Ticks `scheduler` at once and then every [`CRON_TICK`] until `stop` turns true; a tick
/// under way finishes first. Each tick's fan-outs and errors are logged; a failed fan-out is
/// tried again at the next tick (the scheduler's own rule).
pub async fn run_cron(scheduler: Scheduler, mut stop: watch::Receiver<bool>) {
    tracing::info!(tasks = scheduler.tasks().len(), every = ?CRON_TICK, "cron scheduler started");
    loop {
        let report = scheduler.tick().await;
        for fired in &report.fired {
            tracing::info!(
                kind = %fired.kind,
                tenants = fired.tenants,
                jobs = fired.jobs,
                queue = %fired.queue,
                "cron slot fanned out"
            );
        }
        for error in &report.errors {
            tracing::error!(%error, "a cron fan-out failed; the next tick tries the slot again");
        }
        tokio::select! {
            () = tokio::time::sleep(CRON_TICK) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    tracing::info!("cron scheduler stopped");
}

/// Forwards the outbox with `relay` until `stop` turns true: batch after batch while rows
/// wait, then every [`RELAY_IDLE`]; a failed batch is logged and tried again after the same
/// pause (its rows stay in the outbox). A batch under way finishes first.
#[cfg(feature = "postgres")]
pub async fn run_relay(relay: jobs_adapter_postgres::OutboxRelay, mut stop: watch::Receiver<bool>) {
    tracing::info!(batch = RELAY_BATCH, "outbox relay started");
    let mut forwarded_total = 0usize;
    loop {
        let pause = match relay.relay_once(RELAY_BATCH).await {
            Ok(forwarded) => {
                forwarded_total = forwarded_total.saturating_add(forwarded);
                forwarded < RELAY_BATCH
            }
            Err(error) => {
                tracing::warn!(%error, "relaying the outbox failed; trying again");
                true
            }
        };
        if *stop.borrow() {
            break;
        }
        if pause {
            tokio::select! {
                () = tokio::time::sleep(RELAY_IDLE) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
    }
    tracing::info!(forwarded = forwarded_total, "outbox relay stopped");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use jobs_adapter_memory::{MemoryQueue, MemoryTenantDirectory};
    use jobs_core::{ManualClock, QueueDepth, Tenant};
    use jobs_cron::{CatchUp, Scheduler, standard_tasks};

    #[tokio::test(start_paused = true)]
    async fn the_cron_loop_fires_due_slots_at_once_and_stops_when_told() {
        let clock = Arc::new(ManualClock::default());
        // Just after 03:00 UTC on 2026-12-01: the daily tasks of 01:00-03:00 are due.
        clock.set(UNIX_EPOCH + Duration::from_secs(1_764_558_060));
        let queue = MemoryQueue::new(clock.clone());
        let directory = MemoryTenantDirectory::default();
        directory.insert(Tenant {
            id: "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
                .parse()
                .expect("a tenant"),
            entitlements: Default::default(),
        });
        let scheduler = Scheduler::new(
            standard_tasks(),
            Arc::new(directory),
            Arc::new(queue.clone()),
            clock.clone(),
            CatchUp::default(),
        )
        .expect("the standard tasks");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(super::run_cron(scheduler, stopped));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let queues = queue
            .queues()
            .await
            .expect("listed")
            .expect("the memory queue lists");
        assert!(
            !queues.is_empty(),
            "the due slots fanned out at the first tick"
        );
        stop.send_replace(true);
        running.await.expect("the loop stops");
    }
}

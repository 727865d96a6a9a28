//! The per-job loop: a work transaction, and settlements through the transport, per
//! delivery.

use std::sync::Arc;

use jobs_core::{PullPort, WorkStore};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::delivery::Context;
use crate::lifecycle::{Drained, Heartbeat, beat_every, drain, reap, work_or_poll};

/// What the loop does after a receive.
enum Idle {
    /// Deliveries were handed out, or a slot freed up: receive again at once.
    Busy,
    /// Nothing was ready: wait for a wake-up or the poll interval.
    Empty,
    /// The receive failed: wait for the poll interval.
    Failed,
}

/// Runs until `shutdown` completes, up to `concurrency` deliveries at once, each processed to
/// its end by [`Context::process`]; beats `heartbeat` whenever it turns.
pub(super) async fn run<S: WorkStore>(
    ctx: &Arc<Context<S>>,
    pull: Arc<dyn PullPort>,
    heartbeat: &Heartbeat,
    shutdown: impl Future<Output = ()> + Send,
) -> Drained
where
    S::Tx: Send,
{
    let limits = &ctx.limits;
    let permits = Arc::new(Semaphore::new(limits.concurrency));
    let mut in_flight = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut given_back = 0;
    let mut beat = beat_every(limits.poll_interval);
    loop {
        heartbeat.beat();
        while let Some(joined) = in_flight.try_join_next() {
            reap(&ctx.queue, joined);
        }
        let free = permits.available_permits();
        let received = if free == 0 {
            None
        } else {
            let receiving = pull.receive(&ctx.queue, free, limits.lease);
            let mut receiving = std::pin::pin!(receiving);
            tokio::select! {
                () = &mut shutdown => {
                    // A receive is never dropped half-way (its leases could be applied on
                    // the server and lost here): it finishes within the grace, and what it
                    // brought is given back.
                    let grace = limits.shutdown_grace;
                    if let Ok(Ok(batch)) = tokio::time::timeout(grace, receiving).await {
                        given_back += ctx.give_back(batch).await;
                    }
                    break;
                }
                r = &mut receiving => Some(r),
            }
        };
        let idle = match received {
            Some(Ok(batch)) if !batch.is_empty() => {
                for delivery in batch {
                    let Ok(permit) = permits.clone().acquire_owned().await else {
                        break;
                    };
                    let ctx = ctx.clone();
                    in_flight.spawn(async move {
                        ctx.process(delivery).await;
                        drop(permit);
                    });
                }
                Idle::Busy
            }
            Some(Ok(_)) => Idle::Empty,
            Some(Err(e)) => {
                tracing::warn!(queue = %ctx.queue, error = %e, "receive failed; will poll again");
                Idle::Failed
            }
            None => {
                tokio::select! {
                    () = &mut shutdown => break,
                    Some(joined) = in_flight.join_next() => reap(&ctx.queue, joined),
                    // Turns while every slot is busy, for `Worker::stuck`.
                    _ = beat.tick() => {}
                }
                Idle::Busy
            }
        };
        ctx.flush_alerts();
        let poll = limits.poll_interval;
        let waited = match idle {
            Idle::Busy => continue,
            // Nothing ready: until the transport's wake-up or the next poll, whichever is
            // first (the poll also covers delays and retries falling due).
            Idle::Empty => {
                tokio::select! {
                    () = &mut shutdown => false,
                    () = work_or_poll(&*pull, &ctx.queue, poll) => true,
                }
            }
            // A failing transport is polled, never woken into a tight loop.
            Idle::Failed => {
                tokio::select! {
                    () = &mut shutdown => false,
                    () = tokio::time::sleep(poll) => true,
                }
            }
        };
        if !waited {
            break;
        }
    }
    Drained {
        given_back,
        ..drain(ctx, in_flight).await
    }
}

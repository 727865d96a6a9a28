//! What both loops of a worker share around their jobs: a heartbeat for health checks, the
//! reaping of their tasks, the wait for work, and the drain at shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jobs_core::{PullPort, QueueName, WorkStore};
use tokio::task::{JoinError, JoinSet};

use crate::delivery::Context;

/// What a [`Worker::run`](crate::Worker::run) left behind when it stopped, for the line a
/// process logs at exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Tasks (jobs; groups, when grouped) still running at shutdown that finished within the
    /// grace.
    pub finished: usize,
    /// Tasks still running when the grace ran out, left unacked for redelivery.
    pub abandoned: usize,
    /// Jobs fetched but not started, given back with their attempt unspent.
    pub given_back: usize,
}

/// How much longer than its own waits a loop may go without turning before
/// [`Heartbeat::stuck`] says it is.
const STUCK_SLACK: Duration = Duration::from_secs(10);

/// The most warning a shutdown gives in-flight handlers
/// ([`Cancellation`](crate::Cancellation)) before it abandons them.
const SHUTDOWN_NOTICE: Duration = Duration::from_secs(5);

/// When a worker's loop last turned: a loop stuck on a call that does not return stops
/// beating, and a process's health check fails on it.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    /// When the worker was built: the origin of `turned_ms`.
    born: tokio::time::Instant,
    /// When its loop last turned, in milliseconds after `born`; 0 before it first did.
    turned_ms: AtomicU64,
}

impl Heartbeat {
    pub(crate) fn new() -> Self {
        Heartbeat {
            born: tokio::time::Instant::now(),
            turned_ms: AtomicU64::new(0),
        }
    }

    /// Records that the loop turned.
    pub(crate) fn beat(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.turned_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// How long the loop has not turned, when that is longer than `allowed`; `None` while it
    /// turns, and before it first did.
    pub(crate) fn stuck(&self, allowed: Duration) -> Option<Duration> {
        let turned = self.turned_ms.load(Ordering::Relaxed);
        if turned == 0 {
            return None;
        }
        let since = (self.born.elapsed()).saturating_sub(Duration::from_millis(turned));
        (since > allowed).then_some(since)
    }
}

/// How long a loop of `ctx` may go without turning: twice the poll interval, plus the
/// longest time limit, plus 10 s. A loop waits for one job at most so long (the suspect one,
/// running alone, included) and beats at every poll interval otherwise.
pub(crate) fn allowed_silence<S: WorkStore>(ctx: &Context<S>) -> Duration {
    (ctx.limits.poll_interval.saturating_mul(2))
        .saturating_add(ctx.limits.longest())
        .saturating_add(STUCK_SLACK)
}

/// One timer for a loop's whole life that wakes it every `every`, so it beats while every
/// slot is busy; a missed tick is skipped, not made up.
pub(crate) fn beat_every(every: Duration) -> tokio::time::Interval {
    let mut beat = tokio::time::interval(every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    beat
}

/// A finished task of a loop: one that panicked outside the handler's guard (in the runtime
/// itself, or a transport's call) is logged with its queue and counted in
/// `jobs_task_panics_total`, not dropped; its jobs come back after their leases.
pub(crate) fn reap(queue: &QueueName, joined: Result<(), JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        metrics::counter!("jobs_task_panics_total", "queue" => queue.to_string()).increment(1);
        tracing::error!(queue = %queue, error = %e, "a worker task panicked; its jobs come back after their leases");
    }
}

/// Waits until the transport's wake-up or the next poll, whichever is first (the poll also
/// covers delays and retries falling due).
pub(crate) async fn work_or_poll(pull: &dyn PullPort, queue: &QueueName, poll: Duration) {
    tokio::select! {
        () = tokio::time::sleep(poll) => {}
        () = pull.wait_for_work(queue) => {}
    }
}

/// Lets in-flight work finish within the shutdown grace, then abandons it. A quarter of the
/// grace (at most 5 s) before the end, in-flight jobs' cancellations fire, so that handlers
/// that heed them stop and are settled.
pub(crate) async fn drain<S: WorkStore>(ctx: &Context<S>, mut in_flight: JoinSet<()>) -> Drained {
    let grace = ctx.limits.shutdown_grace;
    let mut finished = 0;
    let notice = (grace / 4).min(SHUTDOWN_NOTICE);
    let drained = tokio::time::timeout(grace, async {
        let deadline = tokio::time::sleep(grace - notice);
        let mut deadline = std::pin::pin!(deadline);
        let mut told = false;
        loop {
            tokio::select! {
                joined = in_flight.join_next() => match joined {
                    Some(joined) => {
                        reap(&ctx.queue, joined);
                        finished += 1;
                    }
                    None => break,
                },
                () = &mut deadline, if !told => {
                    told = true;
                    ctx.shutting_down.send_replace(true);
                }
            }
        }
    })
    .await;
    let abandoned = in_flight.len();
    if drained.is_err() {
        tracing::warn!(
            queue = %ctx.queue,
            abandoned,
            "shutdown grace elapsed; in-flight jobs left unacked for redelivery"
        );
        in_flight.shutdown().await;
    }
    Drained {
        finished,
        abandoned,
        given_back: 0,
    }
}

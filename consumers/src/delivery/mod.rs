//! One delivery, whichever loop drives it: the narrow context both loops borrow.
//!
//! A [`Context`] holds what running and settling a job needs (the consumer, the clock, the
//! retry policy, the handlers and their time limits, the metrics and the alerts, the store
//! and the transport's settle side) and nothing of how deliveries are fetched. The per-job
//! loop (`worker`) and the grouped one (`grouped`) both borrow it; neither reaches into the
//! other. Its parts:
//!
//! - `triage`: decode a delivery and find its handler, or say why none runs it;
//! - `bounded`: handler code within its time limit, a panic turned into a failure;
//! - `each`: one delivery in its own work transaction, settled through the transport;
//! - `transport`: a [`Verdict`](crate::verdict::Verdict) applied through the transport;
//! - `dead`: a dead letter recorded with its job's claim, and announced;
//! - `metrics`: the per-kind counters and the handler-time histogram.

mod bounded;
mod dead;
mod each;
mod metrics;
mod transport;
mod triage;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use jobs_core::{
    Clock, ConsumerName, DeadLetterStore, DecodeLimits, Kind, QueueName, SettlePort, WorkStore,
};
use tracing::field;

use crate::alerts::CoalescingAlerter;
use crate::handler::ErasedHandler;
use crate::retry::RetryPolicy;

pub(crate) use bounded::{ready_bounded, run_bounded};
pub(crate) use metrics::{Counted, KindMetrics, Tally};
pub(crate) use transport::will_retry;
pub(crate) use triage::{Ready, Salvage};

/// The limits a loop and its jobs keep: the part of the worker's configuration that running
/// a delivery reads.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Deliveries (or groups) handled at once.
    pub(crate) concurrency: usize,
    /// How long a delivery stays leased; extended every third of it while its work runs.
    pub(crate) lease: Duration,
    /// How long a handler may run, unless its kind has its own limit.
    pub(crate) handler_timeout: Duration,
    /// The kinds with a time limit of their own.
    pub(crate) timeouts: HashMap<Kind, Duration>,
    /// How long an idle loop waits before polling again.
    pub(crate) poll_interval: Duration,
    /// How long in-flight work may finish after a shutdown is asked.
    pub(crate) shutdown_grace: Duration,
    /// What a payload may be to decode.
    pub(crate) decode_limits: DecodeLimits,
    /// Whether a data error quotes the values it found.
    pub(crate) error_values: bool,
}

impl Limits {
    /// The longest time limit of any handler: how long a loop may wait on one job.
    pub(crate) fn longest(&self) -> Duration {
        (self.timeouts.values().copied())
            .chain([self.handler_timeout])
            .max()
            .unwrap_or_default()
    }
}

/// What running and settling a delivery needs, shared by both loops of a worker.
pub(crate) struct Context<S: WorkStore> {
    pub(crate) consumer: ConsumerName,
    pub(crate) queue: QueueName,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: RetryPolicy,
    pub(crate) limits: Limits,
    /// Where work transactions come from.
    pub(crate) store: Arc<S>,
    /// Where dead letters go when no work transaction records them.
    dead_letters: Arc<dyn DeadLetterStore>,
    /// How deliveries are settled outside a work transaction.
    pub(crate) settle: Arc<dyn SettlePort>,
    handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    /// A job of a kind no handler knows is poison, not retried.
    unknown_is_poison: bool,
    /// The metric keys of each registered kind, built once: counting a job allocates nothing.
    metrics: HashMap<Kind, KindMetrics>,
    alerts: Option<CoalescingAlerter>,
    /// Fires every in-flight job's cancellation shortly before a shutdown abandons them.
    pub(crate) shutting_down: tokio::sync::watch::Sender<bool>,
    /// Store failures in a row, for the wait of a give-back.
    store_failures: AtomicU32,
    /// The loop stopped: a group starts no more jobs and gives back those it has not started.
    stopping: AtomicBool,
    /// Jobs groups gave back unstarted since the loop stopped.
    stopped_back: AtomicUsize,
    /// The parent of its jobs' spans ([`Context::job_span`]), made at the first job.
    span: OnceLock<tracing::Span>,
}

/// The parts of a [`Context`], as the worker's builder has them.
pub(crate) struct Parts<S: WorkStore> {
    pub(crate) consumer: ConsumerName,
    pub(crate) queue: QueueName,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: RetryPolicy,
    pub(crate) limits: Limits,
    pub(crate) store: Arc<S>,
    pub(crate) dead_letters: Arc<dyn DeadLetterStore>,
    pub(crate) settle: Arc<dyn SettlePort>,
    pub(crate) handlers: HashMap<Kind, Arc<dyn ErasedHandler<S::Tx>>>,
    pub(crate) unknown_is_poison: bool,
    pub(crate) alerts: Option<CoalescingAlerter>,
}

impl<S: WorkStore> Context<S> {
    /// The context of a worker made of `parts`.
    pub(crate) fn new(parts: Parts<S>) -> Self {
        let metrics = (parts.handlers.keys())
            .map(|kind| (kind.clone(), KindMetrics::new(&parts.queue, kind)))
            .collect();
        Context {
            consumer: parts.consumer,
            queue: parts.queue,
            clock: parts.clock,
            policy: parts.policy,
            limits: parts.limits,
            store: parts.store,
            dead_letters: parts.dead_letters,
            settle: parts.settle,
            handlers: parts.handlers,
            unknown_is_poison: parts.unknown_is_poison,
            metrics,
            alerts: parts.alerts,
            shutting_down: tokio::sync::watch::Sender::new(false),
            store_failures: AtomicU32::new(0),
            stopping: AtomicBool::new(false),
            stopped_back: AtomicUsize::new(0),
            span: OnceLock::new(),
        }
    }

    /// How long handlers of `kind` may run.
    pub(crate) fn time_limit(&self, kind: &Kind) -> Duration {
        (self.limits.timeouts.get(kind).copied()).unwrap_or(self.limits.handler_timeout)
    }

    /// Sends the dead-letter alerts gathered so far (coalesced per queue).
    pub(crate) fn flush_alerts(&self) {
        if let Some(alerts) = &self.alerts {
            alerts.flush();
        }
    }

    /// Counts a store failure and says how many there have been in a row.
    pub(crate) fn store_failed(&self) -> u32 {
        (self.store_failures.fetch_add(1, Ordering::Relaxed)).saturating_add(1)
    }

    /// A work transaction committed: the store is back, so the next failure waits the least.
    pub(crate) fn store_works(&self) {
        self.store_failures.store(0, Ordering::Relaxed);
    }

    /// A run begins: no shutdown under way.
    pub(crate) fn begin_run(&self) {
        self.shutting_down.send_replace(false);
        self.stopping.store(false, Ordering::Relaxed);
        self.stopped_back.store(0, Ordering::Relaxed);
    }

    /// The loop stopped fetching: from now on a group starts no more jobs, and gives back the
    /// ones it has not started (their attempts unspent), so that a stop holds only the jobs
    /// whose handlers are running.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Whether the loop stopped ([`Context::stop`]).
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Counts `n` jobs a group gave back unstarted at a stop, for [`Context::stopped_back`].
    pub(crate) fn count_stopped_back(&self, n: usize) {
        self.stopped_back.fetch_add(n, Ordering::Relaxed);
    }

    /// The jobs groups gave back unstarted since the loop stopped.
    pub(crate) fn stopped_back(&self) -> usize {
        self.stopped_back.load(Ordering::Relaxed)
    }

    /// The span of one delivery's processing, made once with every field: the envelope's as
    /// `salvage` has them (all of a valid envelope's; whatever a broken payload still holds).
    /// Its parent, the worker's span, carries the queue and the consumer, formatted once for
    /// every job rather than once per job; should the worker's span be disabled (made before
    /// a subscriber was installed), each job's span carries them itself. The attempt is on
    /// the events that report a failure, where it matters, rather than formatted for every
    /// job.
    pub(crate) fn job_span(&self, salvage: &Salvage) -> tracing::Span {
        let worker = self.span.get_or_init(
            || tracing::info_span!("worker", queue = %self.queue, consumer = %self.consumer),
        );
        let (job_id, tenant_id, correlation_id, kind) = (
            salvage.job_id.map(field::display),
            salvage.tenant_id.map(field::display),
            salvage.correlation_id.map(field::display),
            salvage.kind.as_ref().map(field::display),
        );
        if worker.is_disabled() {
            return tracing::info_span!(
                "job",
                queue = %self.queue,
                consumer = %self.consumer,
                job_id,
                tenant_id,
                correlation_id,
                kind,
            );
        }
        tracing::info_span!(parent: worker, "job", job_id, tenant_id, correlation_id, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(handler_timeout: u64, own: &[(&str, u64)]) -> Limits {
        Limits {
            concurrency: 1,
            lease: Duration::from_secs(60),
            handler_timeout: Duration::from_secs(handler_timeout),
            timeouts: (own.iter())
                .map(|(kind, secs)| (kind.parse().expect("valid"), Duration::from_secs(*secs)))
                .collect(),
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            decode_limits: DecodeLimits::default(),
            error_values: false,
        }
    }

    #[test]
    fn the_longest_time_limit_is_a_kinds_own_or_the_workers() {
        assert_eq!(limits(30, &[]).longest(), Duration::from_secs(30));
        let own = [("test.slow", 600), ("test.quick", 5)];
        assert_eq!(limits(30, &own).longest(), Duration::from_secs(600));
        assert_eq!(limits(900, &own).longest(), Duration::from_secs(900));
    }
}

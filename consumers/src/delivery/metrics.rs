//! The runtime's per-job metrics, with keys built once per registered kind.

use std::sync::Arc;
use std::time::Duration;

use jobs_core::{Kind, QueueName, WorkStore};

use super::Context;

/// The per-job counters a runtime keeps, by kind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// `jobs_processed_total`: jobs whose work committed.
    Processed,
    /// `jobs_duplicate_skipped_total`: deliveries of jobs processed before.
    Duplicate,
    /// `jobs_retried_total`: failed attempts released for another.
    Retried,
}

impl Counted {
    const ALL: [Counted; 3] = [Counted::Processed, Counted::Duplicate, Counted::Retried];

    fn name(self) -> &'static str {
        match self {
            Counted::Processed => "jobs_processed_total",
            Counted::Duplicate => "jobs_duplicate_skipped_total",
            Counted::Retried => "jobs_retried_total",
        }
    }
}

/// Where the runtime's metrics say they come from, as the `metrics` macros would.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// A registered kind's metric keys on its worker's queue.
pub(crate) struct KindMetrics {
    /// By [`Counted`].
    counted: [metrics::Key; 3],
    handler_seconds: metrics::Key,
}

impl KindMetrics {
    pub(crate) fn new(queue: &QueueName, kind: &Kind) -> Self {
        let labels = metric_labels(queue, kind);
        let key = |name: &'static str| metrics::Key::from_parts(name, labels.to_vec());
        KindMetrics {
            counted: Counted::ALL.map(|counted| key(counted.name())),
            handler_seconds: key("jobs_handler_seconds"),
        }
    }
}

/// The `queue` and `kind` labels of a job's metrics, their values shared rather than copied.
fn metric_labels(queue: &QueueName, kind: &Kind) -> [metrics::Label; 2] {
    let shared = |text: &str| metrics::SharedString::from_shared(Arc::<str>::from(text));
    [
        metrics::Label::new("queue", shared(queue.as_str())),
        metrics::Label::new("kind", shared(kind.as_str())),
    ]
}

/// A group's counts per counter and kind, so that each is incremented once per group.
#[derive(Default)]
pub(crate) struct Tally(Vec<(Counted, Kind, u64)>);

impl Tally {
    pub(crate) fn add(&mut self, counted: Counted, kind: &Kind) {
        match (self.0.iter_mut()).find(|(c, k, _)| *c == counted && k == kind) {
            Some((_, _, count)) => *count += 1,
            None => self.0.push((counted, kind.clone(), 1)),
        }
    }
}

impl<S: WorkStore> Context<S> {
    /// Counts one job of `kind` in `counted`'s counter.
    pub(crate) fn count(&self, counted: Counted, kind: &Kind) {
        self.count_n(counted, kind, 1);
    }

    /// Counts what `tally` gathered, one increment per counter and kind.
    pub(crate) fn count_tally(&self, tally: Tally) {
        for (counted, kind, n) in tally.0 {
            self.count_n(counted, &kind, n);
        }
    }

    /// Counts `n` jobs of `kind` in `counted`'s counter.
    fn count_n(&self, counted: Counted, kind: &Kind, n: u64) {
        match self.metrics.get(kind) {
            Some(keys) => {
                let key = &keys.counted[counted as usize];
                metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                    .increment(n);
            }
            None => {
                let labels = metric_labels(&self.queue, kind).to_vec();
                metrics::counter!(counted.name(), labels).increment(n);
            }
        }
    }

    /// Records a handler's run time for a job of `kind`.
    pub(crate) fn timed(&self, kind: &Kind, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        match self.metrics.get(kind) {
            Some(keys) => {
                let key = &keys.handler_seconds;
                metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
                    .record(seconds);
            }
            None => {
                let labels = metric_labels(&self.queue, kind).to_vec();
                metrics::histogram!("jobs_handler_seconds", labels).record(seconds);
            }
        }
    }

    /// Counts a job of a kind no handler knows, released for another attempt.
    pub(crate) fn count_unknown_kind_retried(&self) {
        metrics::counter!("jobs_unknown_kind_retried_total", "queue" => self.queue.to_string())
            .increment(1);
    }
}

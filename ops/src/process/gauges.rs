//! The queues' depth and the age of their oldest ready job as gauges, for autoscaling: read
//! from the transport every [`SAMPLE_EVERY`] beside the workers, never on their path.
//!
//! Every process of a deployment reads the same queues and exports the same values, so a
//! rule over them takes `max by (queue)`, not a sum. A figure the transport cannot tell
//! (QStash's delayed and in-flight messages, any age but the memory and PostgreSQL queues')
//! has no series at all, rather than a zero that would read as an empty queue.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_core::{Depth, QueueDepth, QueueError, QueueName};
use tokio::sync::watch;

/// How often the gauges are read from the transport.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Messages of a queue in each state (`state`: `ready`, `delayed`, `in_flight`).
const DEPTH: &str = "jobs_queue_depth";
/// Seconds the oldest ready message of a queue has waited (0 when none is ready).
const OLDEST_READY: &str = "jobs_queue_oldest_ready_seconds";

/// Reads the depth of each of `queues` every [`SAMPLE_EVERY`] until `stopped` turns true
/// (at once, a read under way included: the gauges never hold up a stop), and sets their
/// gauges. A queue the transport refuses to count (a QStash queue published without a QStash
/// queue) is left out from then on; one whose read fails keeps its last sample, with a
/// warning when it starts failing and a line when it answers again.
pub(super) async fn sample(
    depth: Arc<dyn QueueDepth>,
    mut queues: Vec<QueueName>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut failing: BTreeSet<QueueName> = BTreeSet::new();
    loop {
        tokio::select! {
            () = sample_once(depth.as_ref(), &mut queues, &mut failing) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        tokio::select! {
            () = tokio::time::sleep(SAMPLE_EVERY) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

/// One sample of every queue of `queues`, each read within [`SAMPLE_EVERY`]; drops the
/// queues the transport refuses and keeps `failing` up to date.
async fn sample_once(
    depth: &dyn QueueDepth,
    queues: &mut Vec<QueueName>,
    failing: &mut BTreeSet<QueueName>,
) {
    let mut refused = Vec::new();
    for queue in queues.iter() {
        match tokio::time::timeout(SAMPLE_EVERY, depth.depth(queue)).await {
            Ok(Ok(read)) => {
                record(queue, &read, SystemTime::now());
                if failing.remove(queue) {
                    tracing::info!(%queue, "the queue's depth answers again");
                }
            }
            Ok(Err(QueueError::Rejected { reason, .. })) => {
                tracing::info!(%queue, %reason, "no depth gauges for this queue");
                refused.push(queue.clone());
            }
            Ok(Err(e)) => {
                if failing.insert(queue.clone()) {
                    tracing::warn!(%queue, error = %e, "the queue's depth could not be read; its gauges keep their last sample");
                }
            }
            Err(_) => {
                if failing.insert(queue.clone()) {
                    tracing::warn!(%queue, "the queue's depth took more than {SAMPLE_EVERY:?}; its gauges keep their last sample");
                }
            }
        }
    }
    queues.retain(|q| !refused.contains(q));
}

/// Sets `queue`'s gauges from `depth`, read at `now`: each figure the transport knows, and
/// no series for one it does not.
fn record(queue: &QueueName, depth: &Depth, now: SystemTime) {
    let name = queue.to_string();
    let states = [
        ("ready", Some(depth.ready)),
        ("delayed", depth.delayed_known()),
        ("in_flight", depth.in_flight_known()),
    ];
    for (state, count) in states {
        if let Some(count) = count {
            // A gauge is a float; counts beyond 2^53 lose precision, not meaning.
            metrics::gauge!(DEPTH, "queue" => name.clone(), "state" => state).set(count as f64);
        }
    }
    if let Some(waited) = depth.waited(now) {
        metrics::gauge!(OLDEST_READY, "queue" => name).set(waited.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use async_trait::async_trait;
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    fn queue(name: &str) -> QueueName {
        name.parse().expect("a queue")
    }

    /// The series `record` sets for each depth, rendered as `/metrics` renders them.
    fn rendered(depths: &[(&str, Depth)], now: SystemTime) -> Vec<String> {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for (name, depth) in depths {
                record(&queue(name), depth, now);
            }
        });
        let mut lines: Vec<String> = handle
            .render()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn each_known_figure_is_a_series_and_an_unknown_one_none() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let lines = rendered(
            &[
                (
                    "billing.invoices",
                    Depth::new(12, 3, 4).oldest_ready_at(Some(now - Duration::from_millis(2_500))),
                ),
                ("billing.quiet", Depth::new(0, 1, 0)),
                ("notif.email.marketing", Depth::in_flight_as_ready(7, 2)),
                ("qstash.fifo", Depth::ready_only(5)),
            ],
            now,
        );
        assert_eq!(
            lines,
            [
                r#"jobs_queue_depth{queue="billing.invoices",state="delayed"} 3"#,
                r#"jobs_queue_depth{queue="billing.invoices",state="in_flight"} 4"#,
                r#"jobs_queue_depth{queue="billing.invoices",state="ready"} 12"#,
                r#"jobs_queue_depth{queue="billing.quiet",state="delayed"} 1"#,
                r#"jobs_queue_depth{queue="billing.quiet",state="in_flight"} 0"#,
                r#"jobs_queue_depth{queue="billing.quiet",state="ready"} 0"#,
                r#"jobs_queue_depth{queue="notif.email.marketing",state="delayed"} 2"#,
                r#"jobs_queue_depth{queue="notif.email.marketing",state="ready"} 7"#,
                r#"jobs_queue_depth{queue="qstash.fifo",state="ready"} 5"#,
                r#"jobs_queue_oldest_ready_seconds{queue="billing.invoices"} 2.5"#,
                r#"jobs_queue_oldest_ready_seconds{queue="billing.quiet"} 0"#,
            ]
        );
    }

    /// A transport whose first queue counts, whose second refuses, and whose third fails
    /// once and then counts.
    struct Transport {
        reads: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait]
    impl QueueDepth for Transport {
        async fn depth(&self, queue: &QueueName) -> Result<Depth, QueueError> {
            let mut reads = self.reads.lock().expect("not poisoned");
            reads.push(queue.to_string());
            let nth = reads.iter().filter(|q| *q == queue.as_str()).count();
            match (queue.as_str(), nth) {
                ("jobs.refused", _) => Err(QueueError::Rejected {
                    queue: queue.clone(),
                    reason: "no depth here".into(),
                }),
                ("jobs.flaky", 1) => Err(QueueError::Unavailable {
                    queue: queue.clone(),
                    message: "down".into(),
                    source: None,
                }),
                _ => Ok(Depth::new(u64::try_from(nth).unwrap_or(0), 0, 0)),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn samples_every_interval_until_stopped_and_drops_a_refused_queue() {
        let transport = Arc::new(Transport {
            reads: std::sync::Mutex::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let queues = vec![
            queue("jobs.counted"),
            queue("jobs.refused"),
            queue("jobs.flaky"),
        ];
        let task = tokio::spawn(sample(transport.clone(), queues, stopped));
        tokio::time::sleep(SAMPLE_EVERY * 2 + Duration::from_millis(1)).await;
        stop.send(true).expect("the sampler listens");
        task.await.expect("the sampler ends");
        let reads = transport.reads.lock().expect("not poisoned").clone();
        assert_eq!(
            reads,
            [
                "jobs.counted",
                "jobs.refused",
                "jobs.flaky",
                "jobs.counted",
                "jobs.flaky",
                "jobs.counted",
                "jobs.flaky",
            ],
            "three samples; the refused queue asked once"
        );
    }
}

//! Successes are metrics, not rows: the runtime's counters and histogram, by queue and kind.
//!
//! Its own test binary, because it installs the process-wide recorder.

#[path = "it/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::time::Duration;

use jobs_consumers::JobError;
use jobs_core::PublishOptions;
use jobs_core::QueuePort;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use harness::Harness;

fn fail_once(attempt: u32) -> Result<(), JobError> {
    if attempt == 1 {
        Err(JobError::retry("flaky"))
    } else {
        Ok(())
    }
}

#[tokio::test]
async fn outcomes_are_counted_by_queue_and_kind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let h = Harness::new();
    let worker = h.worker(fail_once);
    let envelope = h.publish(1).await;
    h.drain(&worker).await;
    h.clock.advance(Duration::from_secs(31));
    h.drain(&worker).await;
    let again = PublishOptions::default().dedup_key("second copy");
    h.queue
        .publish(&h.name, &envelope, again)
        .await
        .expect("publish");
    h.queue
        .publish_bytes(&h.name, b"\xff".to_vec(), &PublishOptions::default());
    h.drain(&worker).await;

    let mut counters = std::collections::BTreeMap::new();
    let mut timings = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        match value {
            DebugValue::Counter(n) => {
                counters.insert(format!("{} {}", key.key().name(), labels.join(",")), n);
            }
            DebugValue::Histogram(samples) => {
                assert_eq!(key.key().name(), "jobs_handler_seconds");
                timings += samples.len();
            }
            DebugValue::Gauge(_) => {}
        }
    }
    let job = "queue=test.jobs,kind=test.job";
    assert_eq!(
        counters.get(&format!("jobs_retried_total {job}")),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&format!("jobs_processed_total {job}")),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get(&format!("jobs_duplicate_skipped_total {job}")),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("jobs_poison_total queue=test.jobs,kind=unknown"),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("jobs_dead_lettered_total queue=test.jobs,kind=unknown,reason=poison"),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(timings, 2, "one handler timing per run of the handler");
}

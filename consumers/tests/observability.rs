//! What an operator's logs show of a job: its span's fields, its worker's, and the attempt of
//! a failure. A binary of its own: `tracing` caches whether each log site is enabled across the
//! process, and other tests logging from other threads while this one installs its subscriber
//! could leave a site cached as disabled.

use std::io::Write;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
use jobs_core::{ManualClock, PublishOptions, QueuePort};

/// Log lines written into memory, as the fmt layer formats them (without colours).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Fails its first attempt.
struct FailsOnce;

#[async_trait]
impl Handler<MemoryWorkTx> for FailsOnce {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: Job<serde_json::Value>,
        _: &mut MemoryWorkTx,
    ) -> Result<(), JobError> {
        match job.attempt {
            1 => Err(JobError::retry("the ledger is down")),
            _ => Ok(()),
        }
    }
}

#[test]
fn a_failure_is_logged_in_its_jobs_span_with_its_attempt() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let envelope = jobs_testkit::fixtures::envelope_with(1, "test.job", serde_json::json!({}));
    let outcomes = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let clock = Arc::new(ManualClock::default());
            let queue = MemoryQueue::new(clock.clone());
            let worker = Worker::builder_on(
                "test.consumer".parse().expect("valid"),
                "test.jobs".parse().expect("valid"),
                Arc::new(queue.clone()),
                Arc::new(MemoryStore::default()),
            )
            .handler("test.job".parse().expect("valid"), FailsOnce)
            .clock(clock)
            .build()
            .expect("valid");
            queue
                .publish(worker.queue(), &envelope, PublishOptions::default())
                .await
                .expect("publish");
            worker.run_once().await.expect("receive")
        });
    assert!(
        matches!(outcomes[..], [Outcome::Retrying { .. }]),
        "{outcomes:?}"
    );
    let text = String::from_utf8_lossy(&lines.0.lock().expect("not poisoned")).into_owned();
    let failure = (text.lines())
        .find(|line| line.contains("will retry"))
        .unwrap_or_else(|| panic!("no retry logged: {text}"));
    let job = format!(
        "worker{{queue=test.jobs consumer=test.consumer}}:job{{job_id={} tenant_id={} \
         correlation_id={} kind=test.job}}",
        envelope.job_id, envelope.tenant_id, envelope.correlation_id
    );
    assert!(
        failure.contains(&job),
        "the job's fields in its worker's span: {failure}"
    );
    assert!(failure.contains("attempt=1"), "{failure}");
    assert!(failure.contains("the ledger is down"), "{failure}");
}

//! A worker wired to in-memory adapters, a scripted handler, and transports that fail on cue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker, WorkerConfig};
use jobs_core::{
    Alert, AlertError, Alerter, ConsumerName, Envelope, ManualClock, PublishOptions, QueueName,
    QueuePort,
};
use jobs_testkit::faults::LosesAcks;
use serde::Deserialize;

/// What the scripted handler does on a given attempt.
pub(crate) type Script = fn(attempt: u32) -> Result<(), JobError>;

#[derive(Debug, Deserialize)]
pub(crate) struct TestData {
    pub(crate) n: u64,
}

/// Runs `script` and, on success, records the effect `n=<n>` in the transaction.
pub(crate) struct Scripted {
    pub(crate) script: Script,
    pub(crate) calls: Arc<Mutex<HashMap<u64, u32>>>,
}

#[async_trait]
impl Handler<MemoryWorkTx> for Scripted {
    type Data = TestData;

    async fn handle(&self, job: Job<TestData>, tx: &mut MemoryWorkTx) -> Result<(), JobError> {
        *self
            .calls
            .lock()
            .expect("not poisoned")
            .entry(job.envelope.data.n)
            .or_default() += 1;
        (self.script)(job.attempt)?;
        tx.record_effect(format!("n={}", job.envelope.data.n));
        Ok(())
    }
}

/// Records every alert.
#[derive(Default, Clone)]
pub(crate) struct RecordingAlerter {
    pub(crate) alerts: Arc<Mutex<Vec<Alert>>>,
}

#[async_trait]
impl Alerter for RecordingAlerter {
    async fn alert(&self, alert: &Alert) -> Result<(), AlertError> {
        self.alerts
            .lock()
            .expect("not poisoned")
            .push(alert.clone());
        Ok(())
    }
}

pub(crate) struct Harness {
    pub(crate) clock: ManualClock,
    pub(crate) queue: MemoryQueue,
    pub(crate) transport: LosesAcks,
    pub(crate) store: MemoryStore,
    pub(crate) calls: Arc<Mutex<HashMap<u64, u32>>>,
    pub(crate) alerter: RecordingAlerter,
    /// The harness workers' alerts, coalesced over `alerter`.
    pub(crate) alerts: jobs_consumers::CoalescingAlerter,
    pub(crate) name: QueueName,
}

pub(crate) const QUEUE: &str = "test.jobs";
pub(crate) const KIND: &str = "test.job";

impl Harness {
    pub(crate) fn new() -> Self {
        let clock = ManualClock::default();
        let queue = MemoryQueue::new(Arc::new(clock.clone()));
        let alerter = RecordingAlerter::default();
        Harness {
            transport: LosesAcks::new(Arc::new(queue.clone())),
            alerts: jobs_consumers::CoalescingAlerter::new(
                Arc::new(alerter.clone()),
                Arc::new(clock.clone()),
                Duration::from_secs(300),
            ),
            clock,
            queue,
            store: MemoryStore::default(),
            calls: Arc::default(),
            alerter,
            name: QUEUE.parse().expect("valid"),
        }
    }

    /// A builder of the harness's consumer on its queue, transport, store and clock, for
    /// workers a test assembles itself.
    pub(crate) fn builder(&self) -> jobs_consumers::WorkerBuilder<MemoryStore> {
        Worker::builder(
            ConsumerName::try_from("test.consumer").expect("valid"),
            self.name.clone(),
            Arc::new(self.transport.clone()),
            Arc::new(self.store.clone()),
            Arc::new(self.store.clone()),
        )
        .clock(Arc::new(self.clock.clone()))
    }

    /// The queue of maintenance jobs, and a worker running `cleanup` on it.
    pub(crate) fn cleaner(
        &self,
        cleanup: jobs_consumers::ProcessedCleanup,
    ) -> (QueueName, Worker<MemoryStore>) {
        let maintenance: QueueName = "core.maintenance".parse().expect("valid");
        let cleaner = Worker::builder(
            ConsumerName::try_from("core.cleanup").expect("valid"),
            maintenance.clone(),
            Arc::new(self.queue.clone()),
            Arc::new(self.store.clone()),
            Arc::new(self.store.clone()),
        )
        .handler(
            jobs_consumers::CLEANUP_KIND.parse().expect("valid"),
            cleanup,
        )
        .clock(Arc::new(self.clock.clone()))
        .build()
        .expect("valid");
        (maintenance, cleaner)
    }

    pub(crate) fn worker(&self, script: Script) -> Worker<MemoryStore> {
        self.worker_with(script, WorkerConfig::default())
    }

    pub(crate) fn worker_with(&self, script: Script, config: WorkerConfig) -> Worker<MemoryStore> {
        self.builder()
            .handler(
                KIND.parse().expect("valid"),
                Scripted {
                    script,
                    calls: self.calls.clone(),
                },
            )
            .alerts(self.alerts.clone())
            .config(config)
            .build()
            .expect("a valid worker")
    }

    pub(crate) async fn publish(&self, n: u64) -> Envelope {
        let envelope =
            jobs_testkit::fixtures::envelope_with(1, KIND, serde_json::json!({ "n": n }));
        self.queue
            .publish(&self.name, &envelope, PublishOptions::default())
            .await
            .expect("publish");
        envelope
    }

    /// An envelope of this harness's kind, not published.
    pub(crate) fn publish_unpublished(&self, n: u64) -> Envelope {
        jobs_testkit::fixtures::envelope_with(1, KIND, serde_json::json!({ "n": n }))
    }

    /// Runs the worker until a poll finds nothing ready (at most 100 polls).
    pub(crate) async fn drain(&self, worker: &Worker<MemoryStore>) -> Vec<Outcome> {
        let mut all = vec![];
        for _ in 0..100 {
            let outcomes = worker.run_once().await.expect("receive");
            if outcomes.is_empty() {
                return all;
            }
            all.extend(outcomes);
        }
        panic!("the queue never drained: {all:?}");
    }

    pub(crate) fn calls(&self, n: u64) -> u32 {
        self.calls
            .lock()
            .expect("not poisoned")
            .get(&n)
            .copied()
            .unwrap_or(0)
    }

    /// The alerts sent, once every alert queued was answered.
    pub(crate) async fn alerts(&self) -> Vec<Alert> {
        self.alerts.quiet().await;
        self.alerter.alerts.lock().expect("not poisoned").clone()
    }
}

/// Runs `body` on a runtime of this thread with a metrics recorder of this thread only, so a
/// test counts its own metrics (and its worker's tasks', which run here too) whatever runs
/// beside it; then the counters named `name`, as (label values, count).
pub(crate) fn counters(
    name: &str,
    body: impl std::future::Future<Output = ()>,
) -> Vec<(Vec<String>, u64)> {
    (every_counter(body).into_iter())
        .filter(|(counter, ..)| counter == name)
        .map(|(_, labels, n)| (labels, n))
        .collect()
}

/// As [`counters`], every counter `body` counted, as (name, label values, count), sorted.
pub(crate) fn every_counter(
    body: impl std::future::Future<Output = ()>,
) -> Vec<(String, Vec<String>, u64)> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(body);
    });
    let mut counted: Vec<_> = (snapshotter.snapshot().into_vec().into_iter())
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().name().to_owned(),
                key.key().labels().map(|l| l.value().to_owned()).collect(),
                n,
            )),
            _ => None,
        })
        .collect();
    counted.sort();
    counted
}

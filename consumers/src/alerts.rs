//! Coalescing alerts so that a storm of dead letters pages a human once, not a thousand times.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use jobs_core::{Alert, Alerter, Clock, DeadLetterReason, QueueName};
use tokio::sync::mpsc::{self, error::TrySendError};

/// Alerts waiting for the sending task; past this, new ones are counted and dropped.
pub const ALERT_BUFFER: usize = 64;

/// At most one alert per queue per window; the events in between are counted and reported
/// with the next alert.
///
/// Alerts are sent by a task of their own, through a buffer of [`ALERT_BUFFER`] alerts, so
/// that a slow or unreachable alerting service never holds up a dead letter's ack or the
/// worker's receiving. When the buffer is full, the alert that does not fit is counted in
/// `jobs_alerts_dropped_total{queue}` and logged at error level, never waited for.
#[derive(Clone)]
pub struct CoalescingAlerter {
    inner: Arc<dyn Alerter>,
    clock: Arc<dyn Clock>,
    window: Duration,
    state: Arc<Mutex<HashMap<QueueName, Window>>>,
    /// The sending task's buffer, started with the first alert (inside a runtime).
    outbox: Arc<OnceLock<mpsc::Sender<Alert>>>,
    /// Alerts queued and not yet answered, for [`CoalescingAlerter::quiet`].
    pending: Arc<tokio::sync::watch::Sender<usize>>,
}

#[derive(Debug)]
struct Window {
    last_sent: SystemTime,
    suppressed: u32,
    latest_error: String,
    latest_reason: DeadLetterReason,
}

impl std::fmt::Debug for CoalescingAlerter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoalescingAlerter")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl CoalescingAlerter {
    /// Wraps `inner`, sending at most one alert per queue per `window` of `clock` time.
    pub fn new(inner: Arc<dyn Alerter>, clock: Arc<dyn Clock>, window: Duration) -> Self {
        CoalescingAlerter {
            inner,
            clock,
            window,
            state: Arc::default(),
            outbox: Arc::default(),
            pending: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Resolves once every alert queued so far has been answered (sent, or failed and
    /// logged): for a report that prints what was raised, or a shutdown that lets the last
    /// alerts out. It waits on the alerting service, so bound it with a timeout.
    pub async fn quiet(&self) {
        let mut pending = self.pending.subscribe();
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Reports one dead letter on `queue`, dead-lettered for `reason` with `error`; queues an
    /// alert for sending unless one for the queue went out within the window. Never waits: a
    /// failure to send is logged, never returned, since the dead letter is already safe.
    pub fn dead_lettered(&self, queue: &QueueName, reason: DeadLetterReason, error: &str) {
        let now = self.clock.now();
        let count = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            match state.get_mut(queue) {
                Some(w) if now < w.last_sent + self.window => {
                    w.suppressed += 1;
                    w.latest_error = error.to_owned();
                    w.latest_reason = reason;
                    return;
                }
                Some(w) => {
                    let count = w.suppressed + 1;
                    *w = Window {
                        last_sent: now,
                        suppressed: 0,
                        latest_error: error.to_owned(),
                        latest_reason: reason,
                    };
                    count
                }
                None => {
                    state.insert(
                        queue.clone(),
                        Window {
                            last_sent: now,
                            suppressed: 0,
                            latest_error: error.to_owned(),
                            latest_reason: reason,
                        },
                    );
                    1
                }
            }
        };
        self.send(queue, count, reason, error);
    }

    /// Queues the counts held back for windows that have closed. The worker calls this as it
    /// polls, so the last events of a storm are reported too; it never waits.
    pub fn flush(&self) {
        let now = self.clock.now();
        let due: Vec<(QueueName, u32, DeadLetterReason, String)> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .iter_mut()
                .filter(|(_, w)| w.suppressed > 0 && now >= w.last_sent + self.window)
                .map(|(q, w)| {
                    let due = (
                        q.clone(),
                        w.suppressed,
                        w.latest_reason,
                        w.latest_error.clone(),
                    );
                    w.suppressed = 0;
                    w.last_sent = now;
                    due
                })
                .collect()
        };
        for (queue, count, reason, error) in due {
            self.send(&queue, count, reason, &error);
        }
    }

    fn send(&self, queue: &QueueName, count: u32, reason: DeadLetterReason, error: &str) {
        let noun = if count == 1 { "job" } else { "jobs" };
        let alert = Alert {
            queue: queue.clone(),
            title: format!("{count} {noun} dead-lettered on {queue}"),
            detail: format!(
                "Latest ({reason}): {error}\nReview with `jobsctl dead-letters list --queue \
                 {queue} --reason {reason}`."
            ),
            count,
        };
        let outbox = self.outbox.get_or_init(|| {
            let (outbox, mut alerts) = mpsc::channel::<Alert>(ALERT_BUFFER);
            let (inner, pending) = (self.inner.clone(), self.pending.clone());
            tokio::spawn(async move {
                while let Some(alert) = alerts.recv().await {
                    if let Err(e) = inner.alert(&alert).await {
                        tracing::error!(queue = %alert.queue, error = %e, "could not raise a dead-letter alert");
                    }
                    pending.send_modify(|n| *n = n.saturating_sub(1));
                }
            });
            outbox
        });
        self.pending.send_modify(|n| *n += 1);
        if let Err(e) = outbox.try_send(alert) {
            self.pending.send_modify(|n| *n = n.saturating_sub(1));
            let why = match e {
                TrySendError::Full(_) => "the alert buffer is full",
                TrySendError::Closed(_) => "the alert task has stopped",
            };
            metrics::counter!("jobs_alerts_dropped_total", "queue" => queue.to_string())
                .increment(1);
            tracing::error!(queue = %queue, count, "{why}; a dead-letter alert is dropped");
        }
    }
}

/// One line per alert on standard error (or another writer): the default alerter, for
/// development and for deployments whose log pipeline pages. Put it behind a
/// [`CoalescingAlerter`] like any other.
#[derive(Clone, Default)]
pub struct ConsoleAlerter {
    /// Where the lines go; standard error when `None`.
    out: Option<Arc<Mutex<dyn Write + Send>>>,
}

impl ConsoleAlerter {
    /// An alerter writing its lines to `out` instead of standard error (a log file, a test).
    pub fn writing_to(out: Arc<Mutex<dyn Write + Send>>) -> Self {
        ConsoleAlerter { out: Some(out) }
    }
}

impl std::fmt::Debug for ConsoleAlerter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = if self.out.is_some() {
            "a writer"
        } else {
            "stderr"
        };
        f.debug_struct("ConsoleAlerter").field("to", &to).finish()
    }
}

#[async_trait::async_trait]
impl Alerter for ConsoleAlerter {
    async fn alert(&self, alert: &jobs_core::Alert) -> Result<(), jobs_core::AlertError> {
        let line = format!(
            "alert: {} ({}, {} time(s)): {}\n",
            alert.title,
            alert.queue.as_str(),
            alert.count,
            alert.detail
        );
        let written = match &self.out {
            None => std::io::stderr().lock().write_all(line.as_bytes()),
            Some(out) => out
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write_all(line.as_bytes()),
        };
        written.map_err(|e| jobs_core::AlertError::Unavailable {
            message: "writing the alert failed".to_owned(),
            source: Some(Box::new(e)),
        })
    }
}

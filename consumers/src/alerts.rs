//! Coalescing alerts so that a storm of dead letters pages a human once, not a thousand times.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use jobs_core::{Alert, Alerter, Clock, QueueName};

/// At most one alert per queue per window; the events in between are counted and reported
/// with the next alert.
#[derive(Clone)]
pub struct CoalescingAlerter {
    inner: Arc<dyn Alerter>,
    clock: Arc<dyn Clock>,
    window: Duration,
    state: Arc<Mutex<HashMap<QueueName, Window>>>,
}

#[derive(Debug)]
struct Window {
    last_sent: SystemTime,
    suppressed: u32,
    latest_error: String,
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
        }
    }

    /// Reports one dead letter on `queue`; sends now unless an alert for the queue went out
    /// within the window. A failure to send is logged, never returned: the dead letter is
    /// already safe.
    pub async fn dead_lettered(&self, queue: &QueueName, error: &str) {
        let now = self.clock.now();
        let count = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            match state.get_mut(queue) {
                Some(w) if now < w.last_sent + self.window => {
                    w.suppressed += 1;
                    w.latest_error = error.to_owned();
                    return;
                }
                Some(w) => {
                    let count = w.suppressed + 1;
                    *w = Window {
                        last_sent: now,
                        suppressed: 0,
                        latest_error: error.to_owned(),
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
                        },
                    );
                    1
                }
            }
        };
        self.send(queue, count, error).await;
    }

    /// Sends the counts held back for windows that have closed. The worker calls this as it
    /// polls, so the last events of a storm are reported too.
    pub async fn flush(&self) {
        let now = self.clock.now();
        let due: Vec<(QueueName, u32, String)> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .iter_mut()
                .filter(|(_, w)| w.suppressed > 0 && now >= w.last_sent + self.window)
                .map(|(q, w)| {
                    let due = (q.clone(), w.suppressed, w.latest_error.clone());
                    w.suppressed = 0;
                    w.last_sent = now;
                    due
                })
                .collect()
        };
        for (queue, count, error) in due {
            self.send(&queue, count, &error).await;
        }
    }

    async fn send(&self, queue: &QueueName, count: u32, error: &str) {
        let noun = if count == 1 { "job" } else { "jobs" };
        let alert = Alert {
            queue: queue.clone(),
            title: format!("{count} {noun} dead-lettered on {queue}"),
            detail: format!(
                "Latest error: {error}\nReview with `jobsctl dead-letters list --queue {queue}`."
            ),
            count,
        };
        if let Err(e) = self.inner.alert(&alert).await {
            tracing::error!(queue = %queue, error = %e, "could not raise a dead-letter alert");
        }
    }
}

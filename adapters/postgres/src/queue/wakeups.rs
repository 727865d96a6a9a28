//! The PostgreSQL queue's wake-ups: one LISTEN connection on `core_jobs` per queue and its
//! clones, forwarding each notification to the waiters of its queue.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use jobs_core::QueueName;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The channel `core.jobs`' insert trigger notifies, with the queue name as payload.
const CHANNEL: &str = "core_jobs";

/// The LISTEN connection behind [`PullPort::wait_for_work`], shared by a queue's clones: a
/// task forwards each notification to its queue's [`Notify`], which keeps one wake-up for the
/// next waiter when nobody waits.
///
/// [`PullPort::wait_for_work`]: jobs_core::PullPort::wait_for_work
pub(super) struct Hub {
    pool: PgPool,
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    wakers: HashMap<String, Arc<Notify>>,
    listener: Option<JoinHandle<()>>,
}

impl Hub {
    pub(super) fn new(pool: PgPool) -> Self {
        Hub {
            pool,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // Every mutation leaves the state consistent before it can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The wake-up of `queue`, starting the listener task if it is not running (first use,
    /// or its runtime ended).
    pub(super) fn waker(self: &Arc<Self>, queue: &str) -> Arc<Notify> {
        let mut state = self.lock();
        if state.listener.as_ref().is_none_or(JoinHandle::is_finished) {
            let hub = Arc::downgrade(self);
            state.listener = Some(tokio::spawn(listen(hub, self.pool.clone())));
        }
        state.wakers.entry(queue.to_owned()).or_default().clone()
    }

    /// Wakes every waiter on `queue` and keeps a wake-up for the next.
    fn wake(&self, queue: &str) {
        let waker = self
            .lock()
            .wakers
            .entry(queue.to_owned())
            .or_default()
            .clone();
        waker.notify_waiters();
        waker.notify_one();
    }

    /// Wakes every queue: notifications may have been missed.
    fn wake_all(&self) {
        let wakers: Vec<Arc<Notify>> = self.lock().wakers.values().cloned().collect();
        for waker in wakers {
            waker.notify_waiters();
            waker.notify_one();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(task) = self.lock().listener.take() {
            task.abort();
        }
    }
}

/// The listener task: LISTEN on `core_jobs` and forward each notification, until the hub is
/// dropped. Each (re)connection wakes every queue, because what was notified while it was
/// not listening is lost; a failing connection is retried with a capped backoff, meanwhile
/// waiters fall back on their polls.
async fn listen(hub: Weak<Hub>, pool: PgPool) {
    const BACKOFF: Duration = Duration::from_millis(100);
    let mut backoff = BACKOFF;
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN failed; workers poll until it is back");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        backoff = BACKOFF;
        let Some(live) = hub.upgrade() else { return };
        live.wake_all();
        drop(live);
        loop {
            match listener.try_recv().await {
                Ok(Some(note)) => {
                    let Some(live) = hub.upgrade() else { return };
                    live.wake(note.payload());
                }
                // The connection dropped: reconnect, then wake every queue, since anything
                // sent meanwhile is lost.
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "the LISTEN connection failed; reconnecting");
                    break;
                }
            }
        }
    }
}

/// How a [`Wakeups::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A job was inserted into the queue (and committed).
    Notified,
    /// The fallback elapsed first: poll anyway (delays and retries fall due without a
    /// notification).
    Polled,
}

/// LISTEN on `core_jobs` on a connection of its own, with polling as the fallback: a loop
/// outside the runtime awaits [`Wakeups::wait`] when a batch came back empty. The runtime
/// uses [`PullPort::wait_for_work`](jobs_core::PullPort::wait_for_work) instead.
///
/// Notifications that arrive between two waits are kept by the connection, so a job
/// published just after an empty receive still wakes the next wait.
pub struct Wakeups {
    pool: PgPool,
    listener: Option<PgListener>,
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeups")
            .field("listening", &self.listener.is_some())
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    /// Wake-ups over `pool`, listening from the first use.
    pub(super) fn new(pool: PgPool) -> Self {
        Wakeups {
            pool,
            listener: None,
        }
    }

    /// Starts listening now, so that notifications sent from here on are kept for the next
    /// [`Wakeups::wait`]. Fails only if no connection can be made.
    pub async fn listen(&mut self) -> Result<(), sqlx::Error> {
        if self.listener.is_none() {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(CHANNEL).await?;
            self.listener = Some(listener);
        }
        Ok(())
    }

    /// Waits until a job is inserted into `queue` or `fallback` elapses. A broken listener
    /// connection is reconnected on the next call; meanwhile the wait is a plain sleep.
    pub async fn wait(&mut self, queue: &QueueName, fallback: Duration) -> Wake {
        let deadline = tokio::time::Instant::now() + fallback;
        loop {
            if let Err(e) = self.listen().await {
                tracing::warn!(error = %e, "LISTEN failed; polling");
                tokio::time::sleep_until(deadline).await;
                return Wake::Polled;
            }
            let Some(listener) = self.listener.as_mut() else {
                return Wake::Polled;
            };
            match tokio::time::timeout_at(deadline, listener.try_recv()).await {
                Err(_) => return Wake::Polled,
                Ok(Ok(Some(note))) if note.payload() == queue.as_str() => return Wake::Notified,
                Ok(Ok(Some(_))) => {}
                // The connection dropped: notifications may be lost, so poll now.
                Ok(Ok(None)) => return Wake::Polled,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "listener failed; reconnecting");
                    self.listener = None;
                    return Wake::Polled;
                }
            }
        }
    }
}

//! The worker process's own HTTP endpoints: `/healthz` (every worker's loop turns), `/readyz`
//! (the store and the queue answered the last background check, and no stop was asked) and
//! `/metrics` (the runtime's metrics in the Prometheus text format).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures_util::future::BoxFuture;
use jobs_consumers::Worker;
use jobs_core::{QueueDepth, QueueName, WorkStore};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

use crate::hosts::AllowedHosts;
use crate::listen::ListenerLimits;

/// How often the background check behind `/readyz` asks the store and the queue.
pub const READINESS_EVERY: Duration = Duration::from_secs(5);

/// How long one readiness check may take before it counts as a failure.
const READINESS_TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the store whether it answers (and is migrated), for `/readyz`.
pub(super) type Ping = Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A worker as the health check sees it, whatever its store.
pub(super) trait Turning: Send + Sync {
    fn queue(&self) -> &QueueName;
    fn stuck(&self) -> Option<Duration>;
}

impl<S: WorkStore> Turning for Worker<S>
where
    S::Tx: Send,
{
    fn queue(&self) -> &QueueName {
        Worker::queue(self)
    }

    fn stuck(&self) -> Option<Duration> {
        Worker::stuck(self)
    }
}

/// What the endpoints report on.
pub(super) struct Probes {
    workers: Vec<Arc<dyn Turning>>,
    /// Queues whose worker's loop has ended.
    ended: Mutex<Vec<QueueName>>,
    stopping: AtomicBool,
    /// The last readiness check.
    readiness: Mutex<Result<(), String>>,
    metrics: PrometheusHandle,
}

impl Probes {
    /// Probes of `workers`, not ready until the first check.
    pub(super) fn new(workers: Vec<Arc<dyn Turning>>) -> Probes {
        Probes {
            workers,
            ended: Mutex::default(),
            stopping: AtomicBool::new(false),
            readiness: Mutex::new(Err("not checked yet".to_owned())),
            metrics: metrics_handle(),
        }
    }

    /// `queue`'s worker's loop has ended.
    pub(super) fn ended(&self, queue: &QueueName) {
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(queue.clone());
    }

    /// A stop was asked: `/readyz` answers 503 from now on, and loops may end.
    pub(super) fn stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// `Ok` while every loop turns and none has ended before a stop.
    fn health(&self) -> Result<(), String> {
        let mut wrong: Vec<String> = self
            .workers
            .iter()
            .filter_map(|w| {
                w.stuck()
                    .map(|since| format!("{}: its loop has not turned for {since:?}", w.queue()))
            })
            .collect();
        if !self.stopping.load(Ordering::SeqCst) {
            let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
            wrong.extend(ended.iter().map(|q| format!("{q}: its loop ended")));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }

    fn readiness(&self) -> Result<(), String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("stopping".to_owned());
        }
        self.readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Asks the store (and the queue, when it reports depth) every [`READINESS_EVERY`], so that
/// probes read a cached answer and never hammer a vendor.
pub(super) async fn check_readiness(
    probes: Arc<Probes>,
    ping: Ping,
    transport: Option<Ping>,
    depth: Option<Arc<dyn QueueDepth>>,
    queue: QueueName,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let check = async {
            ping().await?;
            if let Some(transport) = &transport {
                transport().await?;
            } else if let Some(depth) = &depth {
                depth
                    .depth(&queue)
                    .await
                    .map_err(|e| format!("the queue does not answer: {e}"))?;
            }
            Ok(())
        };
        let answer = tokio::time::timeout(READINESS_TIMEOUT, check)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {READINESS_TIMEOUT:?}")));
        if let Err(why) = &answer {
            tracing::warn!(%why, "not ready");
        }
        *probes
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = answer;
        tokio::select! {
            () = tokio::time::sleep(READINESS_EVERY) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

/// Serves the endpoints, and `routes` beside them (a push transport's, the console), until
/// `stopped` turns true.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    hosts: AllowedHosts,
    probes: Arc<Probes>,
    routes: Router,
    mut stopped: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(probes)
        .merge(routes);
    // Every route, the push transports' and the console's among them, answers only its hosts.
    let app = hosts.guard(app);
    let stop = async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    crate::listen::serve(listener, app, ListenerLimits::default(), stop).await;
}

fn answer(result: Result<(), String>, ok: &'static str) -> (StatusCode, String) {
    match result {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn healthz(State(probes): State<Arc<Probes>>) -> (StatusCode, String) {
    answer(probes.health(), "alive")
}

async fn readyz(State(probes): State<Arc<Probes>>) -> (StatusCode, String) {
    answer(probes.readiness(), "ready")
}

async fn metrics(
    State(probes): State<Arc<Probes>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        probes.metrics.render(),
    )
}

/// The process's Prometheus recorder: installed by the first worker process of the process,
/// shared by any later one (a recorder is global).
fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "another metrics recorder is installed; /metrics shows none of the runtime's"
                );
            }
            handle
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker as the health check sees it, stuck or not as told.
    struct Seen(QueueName, Option<Duration>);

    impl Turning for Seen {
        fn queue(&self) -> &QueueName {
            &self.0
        }
        fn stuck(&self) -> Option<Duration> {
            self.1
        }
    }

    fn probes(workers: Vec<Arc<dyn Turning>>) -> Probes {
        let probes = Probes::new(workers);
        *probes.readiness.lock().expect("not poisoned") = Ok(());
        probes
    }

    #[test]
    fn health_fails_on_a_stuck_or_ended_loop_and_readiness_on_a_stop() {
        let queue = |name: &str| name.parse::<QueueName>().expect("a queue");
        let stuck = probes(vec![
            Arc::new(Seen(queue("billing.invoices"), None)),
            Arc::new(Seen(queue("notify.email"), Some(Duration::from_secs(95)))),
        ]);
        let why = stuck.health().expect_err("a stuck loop");
        assert_eq!(why, "notify.email: its loop has not turned for 95s");

        let fine = probes(vec![Arc::new(Seen(queue("billing.invoices"), None))]);
        assert_eq!(fine.health(), Ok(()));
        assert_eq!(fine.readiness(), Ok(()));
        fine.ended(&queue("billing.invoices"));
        assert_eq!(
            fine.health(),
            Err("billing.invoices: its loop ended".to_owned())
        );
        fine.stopping();
        assert_eq!(fine.health(), Ok(()), "loops end when a stop is asked");
        assert_eq!(fine.readiness(), Err("stopping".to_owned()));
        assert_eq!(
            answer(fine.readiness(), "ready").0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}

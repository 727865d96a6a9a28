//! What a grouped worker's loop does around its groups: sizing them by the handlers' time,
//! lingering to fill them, fetching ahead of them, running a suspect job alone, giving back
//! what it fetched at a stop, and draining a backlog once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_consumers::{Drained, Handler, Job, JobError, Worker};
use jobs_core::{ConsumerName, Envelope, QueueDepth, QueueName, WorkStore};
use serde::Deserialize;

use super::{Fixture, GroupedBackend, GroupedQueue, GroupedStore, KIND, eventually, lock};
use crate::model::WriteEffect;

/// A worker's [`run`](Worker::run) in the background, as a worker process runs it, until
/// [`Running::stop`].
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Drained>,
}

impl Running {
    fn start<S: WorkStore>(worker: &Arc<Worker<S>>) -> Self
    where
        S::Tx: Send,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(worker.clone().run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    async fn stop(self) -> Drained {
        self.stop.send(()).expect("running");
        self.task.await.expect("stops")
    }
}

/// Groups hold about `group_time` of their handlers' recent mean time: behind handlers of
/// 40 ms or more, 400 ms holds at most ten jobs, whatever the group size allows (eleven wait
/// at once); behind less than 200 ms, more than one.
pub async fn groups_hold_about_group_time_of_their_handlers<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = Arc::new(
        (f.worker(64))
            .group_time(Duration::from_millis(400))
            .concurrency(1)
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    // A first job tells the worker how long its handlers take.
    f.publish(&f.envelope(0, "nap")).await;
    eventually("the first job ran", || async {
        f.effects().await.len() == 1
    })
    .await;
    f.publish_all(1..12, "nap").await;
    eventually("the twelve jobs ran", || async {
        f.effects().await.len() >= 12
    })
    .await;
    running.stop().await;
    let groups = f.handler.groups();
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    assert_eq!(sizes[0], 1, "the first job alone: {groups:?}");
    assert!(
        sizes.iter().all(|&size| size <= 10),
        "groups of at most ten: {groups:?}"
    );
    assert!(
        sizes.iter().any(|&size| size > 1),
        "groups, not jobs: {groups:?}"
    );
    assert_eq!(f.effects().await, (0..12).collect::<Vec<_>>(), "each once");
}

/// The loop's first fetch takes one job (its slow start); with `group_linger` it then waits
/// and fetches what fills the group, so jobs published while it lingers run in the group it
/// started.
pub async fn a_lingering_fetch_fills_its_group<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = Arc::new(
        (f.worker(4))
            .group_linger(Duration::from_secs(1))
            .concurrency(1)
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    // A fresh worker's first group holds one job: its handler's time sizes the next ones.
    f.publish(&f.envelope(0, "ok")).await;
    eventually("job 0 ran", || async { !f.effects().await.is_empty() }).await;
    f.publish(&f.envelope(1, "ok")).await;
    eventually("job 1 leased, its group lingering", || async {
        f.depth().await.in_flight == 1
    })
    .await;
    f.publish_all(2..4, "ok").await;
    eventually("the four jobs ran", || async {
        f.effects().await.len() >= 4
    })
    .await;
    running.stop().await;
    assert_eq!(
        f.handler.groups(),
        [vec![0], vec![1, 2, 3]],
        "one group lingered for more"
    );
}

/// A linger waits only to fill a group that a fetch started: a fetch that found nothing, or
/// a group of one, never waits, so an hour's linger delays neither the idle worker's wake-up
/// nor the jobs of a full group.
pub async fn a_linger_never_delays_an_empty_fetch_or_a_full_group<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = Arc::new(
        (f.worker(1))
            .group_linger(Duration::from_secs(3_600))
            .concurrency(1)
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    // The worker finds the queue empty first, then each publish wakes it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for n in 0..3 {
        f.publish(&f.envelope(n, "ok")).await;
        let ran = || async { f.handler.started().contains(&n) };
        eventually(&format!("job {n} ran"), ran).await;
    }
    running.stop().await;
}

/// A grouped worker fetches ahead only once less than a group waits in its buffer: with
/// every slot busy and one group waiting, it leases nothing more, so what it holds leased
/// beyond its running jobs stays small and their leases do not run out in a buffer.
pub async fn a_busy_grouped_worker_leases_no_more_while_a_group_waits<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    for n in 0..10 {
        let then = if n == 1 { "hold" } else { "ok" };
        f.publish(&f.envelope(n, then)).await;
    }
    let worker = Arc::new(
        (f.worker(1))
            .concurrency(1)
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    let started = || async { f.handler.started().contains(&1) };
    eventually("the second job started", started).await;
    // Time for a fetch the loop should not start to lease what it would.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let depth = f.depth().await;
    assert_eq!(
        (depth.in_flight, depth.ready),
        (2, 7),
        "the running job and one waiting leased, the first acked: {depth:?}"
    );
    f.handler.gate.add_permits(1);
    eventually("the queue drained", || async {
        f.depth().await.total() == 0
    })
    .await;
    running.stop().await;
    let mut started = f.handler.started();
    started.sort_unstable();
    assert_eq!(started, (0..10).collect::<Vec<_>>(), "each job once");
}

/// At a stop, the jobs a grouped worker fetched and did not start are given back with their
/// attempt unspent; a group still running when the grace runs out is abandoned, its job left
/// leased to come back after its lease. While its one slot is busy, the loop has leased the
/// running group and two groups ahead, no more.
pub async fn a_stop_gives_back_fetched_jobs_with_their_attempt_unspent<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    f.publish(&f.envelope(0, "hold")).await;
    let worker = Arc::new(
        (f.worker(10))
            .concurrency(1)
            // Long enough that a fetch under way at the stop answers within it on a loaded
            // machine, short enough to abandon the held job quickly.
            .shutdown_grace(Duration::from_secs(2))
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    // The running group holds the first job alone, then the rest arrive at once.
    let started = || async { f.handler.started().contains(&0) };
    eventually("the first job's handler starts", started).await;
    // All at once: due a second on, then the clock moves.
    for n in 1..40 {
        let soon = jobs_core::PublishOptions::default().delay(Duration::from_secs(1));
        f.publish_with(&f.envelope(n, "ok"), soon).await;
    }
    f.b.clock.advance(Duration::from_secs(1));
    // Until a handler's time is known a group holds one job, and the loop fetches while the
    // group runs until a group waits in the buffer, each fetch asking for up to two groups
    // ahead: the held job and two more are leased, and no more than that however long the
    // held job takes.
    let leased = || async { f.depth().await.in_flight };
    eventually("three jobs leased", || async { leased().await >= 3 }).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        leased().await,
        3,
        "the running group and what two groups of one ahead leave room for"
    );
    let drained = running.stop().await;
    assert_eq!(
        (drained.given_back, drained.abandoned, drained.finished),
        (2, 1, 0),
        "what the worker says it left: {drained:?}"
    );
    let depth = f.depth().await;
    assert_eq!(
        (depth.ready, depth.in_flight),
        (39, 1),
        "the given back and those never fetched ready; the abandoned group's job leased: \
         {depth:?}"
    );
    let back =
        (f.b.queue
            .receive(&f.name, 39, Duration::from_secs(30))
            .await)
            .expect("receive");
    assert_eq!(back.len(), 39);
    assert!(back.iter().all(|d| d.attempt == 1), "attempts unspent");
    assert_eq!(f.effects().await, Vec::<i64>::new(), "nothing committed");
}

#[derive(Deserialize)]
struct Numbered {
    n: i64,
}

/// Writes its job's number; job 0 takes its time, noting the jobs that start meanwhile and
/// how many messages are leased at its end.
struct Watched<Tx> {
    write: WriteEffect<Tx>,
    depth: Arc<dyn QueueDepth>,
    name: QueueName,
    suspect_running: Arc<AtomicBool>,
    overlapped: Arc<Mutex<Vec<i64>>>,
    leased_meanwhile: Arc<Mutex<Option<u64>>>,
}

#[async_trait]
impl<Tx: Send + 'static> Handler<Tx> for Watched<Tx> {
    type Data = Numbered;

    async fn handle(&self, job: Job<Numbered>, tx: &mut Tx) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        if n == 0 {
            self.suspect_running.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let depth = (self.depth.depth(&self.name).await).map_err(JobError::retry)?;
            *lock(&self.leased_meanwhile) = Some(depth.in_flight);
            self.suspect_running.store(false, Ordering::SeqCst);
        } else if self.suspect_running.load(Ordering::SeqCst) {
            lock(&self.overlapped).push(n);
        }
        (self.write)(tx, n.to_string())
            .await
            .map_err(JobError::retry)
    }
}

/// A stop ends a group under way after the job it is running: the group commits what it
/// did, and gives back the jobs it had not started at once, with their attempts unspent and
/// their claims released, so that only a job whose handler is still running keeps a lease.
pub async fn a_stop_ends_a_running_group_after_its_current_job<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = Arc::new(
        (f.worker(10))
            .concurrency(1)
            .group_linger(Duration::from_millis(200))
            .shutdown_grace(Duration::from_secs(10))
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    // A first job tells the worker how long its handlers take; then one group of five, the
    // first of which holds until the test opens the gate.
    f.publish(&f.envelope(0, "ok")).await;
    eventually("job 0 ran", || async { !f.effects().await.is_empty() }).await;
    f.publish(&f.envelope(1, "hold")).await;
    f.publish_all(2..6, "ok").await;
    eventually("job 1's handler starts", || async {
        f.handler.started().contains(&1)
    })
    .await;
    assert_eq!(
        f.handler.groups().last(),
        Some(&vec![1]),
        "the running group has started job 1 only"
    );
    let stopped = tokio::spawn(running.stop());
    // The stop waits for the running handler, which ends within the grace.
    tokio::time::sleep(Duration::from_millis(100)).await;
    f.handler.gate.add_permits(1);
    let drained = stopped.await.expect("the worker stops");
    assert_eq!(
        (drained.given_back, drained.abandoned, drained.finished),
        (4, 0, 1),
        "the group's four unstarted jobs given back: {drained:?}"
    );
    assert_eq!(
        f.effects().await,
        vec![0, 1],
        "the group committed its running job"
    );
    let depth = f.depth().await;
    assert_eq!(
        (depth.ready, depth.in_flight),
        (4, 0),
        "given back, ready at once: {depth:?}"
    );
    let back =
        (f.b.queue
            .receive(&f.name, 10, Duration::from_secs(30))
            .await)
            .expect("receive");
    assert_eq!(back.len(), 4);
    assert!(back.iter().all(|d| d.attempt == 1), "attempts unspent");
    let consumer = ConsumerName::try_from("test.grouped").expect("a valid consumer");
    for delivery in &back {
        let job = Envelope::decode(&delivery.payload).expect("a job").job_id;
        let claimed = f.b.backend.store.is_processed(job, &consumer).await;
        assert!(
            !claimed.expect("asked"),
            "a given-back job's claim is released"
        );
    }
}

/// A job whose previous lease expired unsettled (its worker may have died on it) runs alone:
/// only once every job fetched before it has settled, with nothing else leased or running
/// until it has, so that if it crashes this process too it takes no other job's attempt.
pub async fn a_job_whose_lease_expired_runs_alone_with_nothing_else_leased<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    // Job 0 was leased by a worker that never settled it, and its lease ran out.
    f.publish(&f.envelope(0, "ok")).await;
    let taken = (f.b.queue.receive(&f.name, 1, Duration::from_secs(60)).await).expect("receive");
    assert_eq!(taken.len(), 1);
    f.b.clock.advance(Duration::from_secs(61));
    f.publish_all(1..9, "ok").await;
    let handler = Watched {
        write: f.b.backend.write_effect,
        depth: f.b.queue.clone(),
        name: f.name.clone(),
        suspect_running: Arc::default(),
        overlapped: Arc::default(),
        leased_meanwhile: Arc::default(),
    };
    let (overlapped, leased_meanwhile) =
        (handler.overlapped.clone(), handler.leased_meanwhile.clone());
    let worker = Arc::new(
        (f.bare())
            .handler(KIND.parse().expect("valid"), handler)
            .group_size(4)
            .concurrency(2)
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    eventually("the nine jobs ran", || async {
        f.effects().await.len() >= 9
    })
    .await;
    running.stop().await;
    assert_eq!(
        f.effects().await,
        (0..=8).collect::<Vec<_>>(),
        "each job once"
    );
    assert_eq!(
        *lock(&overlapped),
        Vec::<i64>::new(),
        "no job started while the one whose lease expired ran"
    );
    assert_eq!(
        *lock(&leased_meanwhile),
        Some(1),
        "nothing but itself leased while it ran"
    );
}

/// `Worker::run` grouped, as a worker process runs it: every job of a backlog processed once,
/// in groups; a job published to the idle worker then runs without waiting out the poll; and
/// the queue is empty after the stop.
pub async fn the_grouped_loop_drains_a_backlog_once_and_wakes_for_new_jobs<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    f.publish_all(0..300, "ok").await;
    let worker = Arc::new(
        (f.worker(8))
            .concurrency(3)
            // The wake-up, not the poll, must bring the last job in.
            .poll_interval(Duration::from_secs(3_600))
            .build()
            .expect("a grouped worker"),
    );
    let running = Running::start(&worker);
    eventually("the backlog drained", || async {
        f.effects().await.len() >= 300
    })
    .await;
    f.publish(&f.envelope(300, "ok")).await;
    eventually("the job published to the idle worker ran", || async {
        f.effects().await.len() >= 301
    })
    .await;
    running.stop().await;
    assert_eq!(
        f.effects().await,
        (0..=300).collect::<Vec<_>>(),
        "each job once"
    );
    assert_eq!(f.depth().await.total(), 0, "nothing left");
}

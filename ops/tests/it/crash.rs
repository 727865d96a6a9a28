//! Crashes of a grouped worker process: killed with SIGKILL at random moments while draining,
//! and a handler that aborts the process. The worker runs in a child process, this test binary
//! started again on [`worker_process`] with `JOBS_CRASH_DB` naming the database.

use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, PgWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError, QueuePolicy, RetryPolicy, Worker, WorkerConfig};
use jobs_core::{ConsumerName, PublishOptions, QueueName};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::pg::TestDb;

const QUEUE: &str = "crash.jobs";
const KIND: &str = "crash.job";
/// Short, so that jobs a killed worker held come back within a second.
const LEASE: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct Numbered {
    n: i64,
    #[serde(default)]
    abort: bool,
}

/// Inserts one effect row per run (the table has no unique constraint: only the claim keeps
/// a job from writing twice), or aborts the process when the job says so.
struct Effect;

#[async_trait]
impl Handler<PgWorkTx> for Effect {
    type Data = Numbered;

    async fn handle(&self, job: Job<Numbered>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        if job.envelope.data.abort {
            std::process::abort();
        }
        sqlx::query("insert into effects (n) values ($1)")
            .bind(job.envelope.data.n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

async fn setup(pool: &sqlx::PgPool) {
    PgStore::from_pool(pool.clone())
        .migrate()
        .await
        .expect("migrate");
    sqlx::query("create table if not exists effects (n bigint not null)")
        .execute(pool)
        .await
        .expect("create effects");
}

async fn publish(pool: &sqlx::PgPool, jobs: impl Iterator<Item = serde_json::Value>) {
    let queue = PgQueue::new(pool.clone());
    let batch: Vec<NewJob> = jobs
        .map(|data| NewJob {
            envelope: jobs_testkit::fixtures::envelope_with(1, KIND, data),
            opts: PublishOptions::default(),
        })
        .collect();
    for chunk in batch.chunks(1_000) {
        queue
            .publish_batch(&QUEUE.parse().expect("valid"), chunk)
            .await
            .expect("publish");
    }
}

/// Runs a grouped worker on `url` until `stop` resolves (or the process dies).
async fn work(url: &str, stop: impl Future<Output = ()> + Send) {
    let mut config = WorkerConfig::default();
    config.concurrency = 4;
    config.lease = LEASE;
    config.poll_interval = Duration::from_millis(100);
    let options = PgConnectOptions::from_str(url).expect("a URL");
    let pool = PgPoolOptions::new()
        .max_connections(config.connections())
        .connect_with(options)
        .await
        .expect("connect");
    let store = PgStore::from_pool(pool.clone());
    let queue = Arc::new(PgQueue::new(pool));
    let name: QueueName = QUEUE.parse().expect("valid");
    // The kill test kills jobs' processes, not the jobs: it allows them more attempts.
    let attempts = std::env::var("JOBS_CRASH_ATTEMPTS").map_or(5, |a| a.parse().expect("a number"));
    let policy = RetryPolicy::new(attempts, Duration::from_millis(10), Duration::from_secs(1))
        .expect("valid");
    let policy = QueuePolicy::new(
        name.clone(),
        policy,
        "a crash test: retries come back at once",
    )
    .expect("has a rationale");
    let worker = Worker::grouped_builder(
        ConsumerName::try_from("crash.worker").expect("valid"),
        name,
        queue,
        Arc::new(store),
    )
    .handler(KIND.parse().expect("valid"), Effect)
    .policy(policy)
    .config(config)
    .build()
    .expect("a valid worker");
    Arc::new(worker).run(stop).await;
}

async fn counts(pool: &sqlx::PgPool) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "select (select count(*) from effects), (select count(distinct n) from effects), \
                (select count(*) from core.jobs), (select count(*) from core.dead_letters)",
    )
    .fetch_one(pool)
    .await
    .expect("count")
}

/// The worker process. Started by the crash tests with `JOBS_CRASH_DB`, it works until it is
/// killed. Run as a test of its own, it drains a few jobs in process and checks them, so it
/// also proves the child's composition works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    if let Ok(url) = std::env::var("JOBS_CRASH_DB") {
        work(&url, std::future::pending()).await;
        return;
    }
    let db = TestDb::create().await;
    let pool = db.pool().await;
    setup(&pool).await;
    publish(&pool, (0..50).map(|n| serde_json::json!({ "n": n }))).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let url = db.url.clone();
    let running = tokio::spawn(async move {
        work(&url, async {
            let _ = stopped.await;
        })
        .await;
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while counts(&pool).await.2 > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).expect("running");
    running.await.expect("the worker stops");
    assert_eq!(counts(&pool).await, (50, 50, 0, 0));
    db.drop_db().await;
}

/// A worker process, killed when dropped, so that a failing test leaves none behind.
struct Process(Child);

impl std::ops::Deref for Process {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test binary again, running only [`worker_process`], on the database at `url`, with a
/// retry policy of `attempts`. Its panics, if any, show in this test's output.
fn spawn_worker(url: &str, attempts: u32) -> Process {
    let child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["crash::worker_process", "--exact", "--nocapture"])
        .env("JOBS_CRASH_DB", url)
        .env("JOBS_CRASH_ATTEMPTS", attempts.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the worker process");
    Process(child)
}

/// A pseudo-random duration in `[min, max)`, different in every run.
fn random_between(min: Duration, max: Duration) -> Duration {
    let spread = u64::try_from((max - min).as_millis()).expect("small");
    let random = jobs_core::JobId::generate().as_uuid().as_u128() as u64;
    min + Duration::from_millis(random % spread.max(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_at_random_moments_loses_nothing_and_doubles_nothing() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    setup(&pool).await;
    let jobs = 8_000;
    publish(&pool, (0..jobs).map(|n| serde_json::json!({ "n": n }))).await;
    let mut kills = 0;
    while kills < 6 && counts(&pool).await.2 > 0 {
        let mut child = spawn_worker(&db.url, 100);
        tokio::time::sleep(random_between(
            Duration::from_millis(100),
            Duration::from_millis(400),
        ))
        .await;
        child.kill().expect("SIGKILL the worker");
        child.wait().expect("reap the worker");
        kills += 1;
    }
    let mut child = spawn_worker(&db.url, 100);
    let deadline = Instant::now() + Duration::from_secs(120);
    while counts(&pool).await.2 > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().expect("stop the worker");
    child.wait().expect("reap the worker");
    let (effects, distinct, left, letters) = counts(&pool).await;
    assert!(
        kills >= 3,
        "killed only {kills} times before the queue drained"
    );
    assert_eq!(left, 0, "every job was settled");
    assert_eq!(letters, 0, "no job was dead-lettered");
    assert_eq!(
        (effects, distinct),
        (jobs, jobs),
        "every job has exactly one effect after {kills} kills"
    );
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_aborts_its_process_is_dead_lettered_after_its_attempts() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    setup(&pool).await;
    publish(
        &pool,
        std::iter::once(serde_json::json!({ "n": -1, "abort": true }))
            .chain((0..20).map(|n| serde_json::json!({ "n": n }))),
    )
    .await;
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut child = spawn_worker(&db.url, 5);
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll the worker") {
                break Some(status);
            }
            let now = counts(&pool).await;
            if now.3 == 1 && now.2 == 0 {
                break None;
            }
            assert!(
                Instant::now() < deadline,
                "after {crashes} crashes the queue is not settled: (effects, distinct, left, \
                 dead letters) = {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        match status {
            Some(status) => {
                assert!(!status.success(), "the worker only ends by aborting");
                crashes += 1;
            }
            None => {
                child.kill().expect("stop the worker");
                child.wait().expect("reap the worker");
                break;
            }
        }
    }
    assert_eq!(crashes, 5, "one crash per attempt the policy allows");
    let (attempts, error): (i32, String) =
        sqlx::query_as("select attempts, last_error from core.dead_letters")
            .fetch_one(&pool)
            .await
            .expect("the dead letter");
    assert_eq!(
        attempts, 6,
        "dead-lettered on the delivery after the fifth attempt"
    );
    assert!(error.contains("beyond the policy"), "{error}");
    let (effects, distinct, _, _) = counts(&pool).await;
    assert_eq!(
        (effects, distinct),
        (20, 20),
        "its neighbours ran exactly once"
    );
    db.drop_db().await;
}

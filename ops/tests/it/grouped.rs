//! The grouped runtime on PostgreSQL (`Worker::grouped_builder` over `PgQueue` and `PgStore`)
//! as the reference composition runs it, and what depends on PostgreSQL itself: a statement
//! that aborts the transaction, the pool a queue must share, fencing by row, a deferred
//! constraint at the commit, killed connections, `statement_timeout`. What a grouped worker
//! does whatever its engine is the test kit's grouped suite (`jobs_testkit::grouped`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_postgres::{PgQueue, PgStore, PgWorkTx, sqlx};
use jobs_consumers::{
    DeadReason, Handler, Job, JobError, Outcome, QueuePolicy, RetryPolicy, Worker, WorkerConfig,
    WorkerError,
};
use jobs_core::{
    ConsumerName, Envelope, ManualClock, PublishOptions, PullPort, QueueDepth, QueueName,
    QueuePort, SettleInTransaction,
};
use serde::Deserialize;

use crate::pg::TestDb;

/// What a job of the test asks its handler to do after writing its row, on its first run
/// (later runs succeed).
#[derive(Deserialize)]
struct Step {
    n: i64,
    then: String,
}

/// Writes `(n)` into `effects`, then does what the job says; counts every run per `n`, which
/// stands for an external side effect (an HTTP call) that must not repeat because of a
/// neighbour.
#[derive(Clone, Default)]
struct Scripted {
    runs: Arc<Mutex<HashMap<i64, u32>>>,
}

impl Scripted {
    fn runs(&self, n: i64) -> u32 {
        self.runs
            .lock()
            .expect("not poisoned")
            .get(&n)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Handler<PgWorkTx> for Scripted {
    type Data = Step;

    async fn handle(&self, job: Job<Step>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let Step { n, then } = job.envelope.data;
        if then == "ok-no-write" {
            *self
                .runs
                .lock()
                .expect("not poisoned")
                .entry(n)
                .or_default() += 1;
            return Ok(());
        }
        let run = {
            let mut runs = self.runs.lock().expect("not poisoned");
            let run = runs.entry(n).or_default();
            *run += 1;
            *run
        };
        sqlx::query("insert into effects (n) values ($1)")
            .bind(n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        if run > 1 {
            return Ok(());
        }
        match then.as_str() {
            "retry" => Err(JobError::retry("the ledger is down after the insert")),
            "permanent" => Err(JobError::permanent("invoice does not exist")),
            "defer" => Err(JobError::Defer {
                until: std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_700),
            }),
            "panic" => panic!("the handler panics after its insert"),
            "bad sql" => {
                // A failing statement aborts the transaction: only the undo recovers it.
                let failed = sqlx::query("insert into no_such_table values (1)")
                    .execute(tx.conn())
                    .await;
                Err(JobError::retry(failed.expect_err("no such table")))
            }
            _ => Ok(()),
        }
    }
}

const KIND: &str = "test.step";

struct Fixture {
    db: TestDb,
    pool: sqlx::PgPool,
    store: PgStore,
    queue: PgQueue,
    clock: ManualClock,
    name: QueueName,
    handler: Scripted,
}

impl Fixture {
    async fn new() -> Fixture {
        let db = TestDb::create().await;
        let pool = db.pool().await;
        let store = PgStore::from_pool(pool.clone());
        store.migrate().await.expect("migrate");
        sqlx::query("create table effects (n bigint not null)")
            .execute(&pool)
            .await
            .expect("create the effects table");
        let clock = ManualClock::default();
        let queue = PgQueue::new(pool.clone()).with_clock(Arc::new(clock.clone()));
        Fixture {
            db,
            pool,
            store,
            queue,
            clock,
            name: "test.grouped".parse().expect("valid"),
            handler: Scripted::default(),
        }
    }

    fn worker(&self, config: WorkerConfig) -> Result<Worker<PgStore>, WorkerError> {
        self.worker_over(Arc::new(self.queue.clone()), config)
    }

    fn worker_over(
        &self,
        queue: Arc<PgQueue>,
        config: WorkerConfig,
    ) -> Result<Worker<PgStore>, WorkerError> {
        self.grouped(queue, self.handler.clone(), config)
    }

    /// A worker of the fixture's queue name and store, grouped over `queue`, running
    /// `handler`.
    fn grouped<Q, H>(
        &self,
        queue: Arc<Q>,
        handler: H,
        config: WorkerConfig,
    ) -> Result<Worker<PgStore>, WorkerError>
    where
        Q: SettleInTransaction<PgStore> + PullPort + 'static,
        H: Handler<PgWorkTx>,
    {
        Worker::grouped_builder(
            ConsumerName::try_from("test.grouped").expect("valid"),
            self.name.clone(),
            queue,
            Arc::new(self.store.clone()),
        )
        .handler(KIND.parse().expect("valid"), handler)
        .clock(Arc::new(self.clock.clone()))
        .config(config)
        .build()
    }

    /// A builder of the fixture's worker over its queue, grouped or per job.
    fn builder(&self, grouped: bool) -> jobs_consumers::WorkerBuilder<PgStore> {
        let (consumer, queue) = (
            ConsumerName::try_from("test.grouped").expect("valid"),
            Arc::new(self.queue.clone()),
        );
        let store = Arc::new(self.store.clone());
        if grouped {
            Worker::grouped_builder(consumer, self.name.clone(), queue, store)
        } else {
            Worker::builder_on(consumer, self.name.clone(), queue, store)
        }
    }

    fn envelope(&self, n: i64, then: &str) -> Envelope {
        jobs_testkit::fixtures::envelope_with(1, KIND, serde_json::json!({ "n": n, "then": then }))
    }

    async fn publish(&self, envelope: &Envelope, opts: PublishOptions) {
        self.queue
            .publish(&self.name, envelope, opts)
            .await
            .expect("publish");
    }

    /// Jobs numbered `ns` that succeed, in one batch.
    async fn publish_ok(&self, ns: std::ops::Range<i64>) {
        let batch: Vec<jobs_adapter_postgres::NewJob> = ns
            .map(|n| jobs_adapter_postgres::NewJob {
                envelope: self.envelope(n, "ok"),
                opts: PublishOptions::default(),
            })
            .collect();
        self.queue
            .publish_batch(&self.name, &batch)
            .await
            .expect("publish");
    }

    /// The effects committed, sorted.
    async fn effects(&self) -> Vec<i64> {
        sqlx::query_scalar("select n from effects order by n")
            .fetch_all(&self.pool)
            .await
            .expect("read effects")
    }

    async fn pending(&self) -> u64 {
        self.queue.depth(&self.name).await.expect("depth").total()
    }
}

fn config(group_size: usize) -> WorkerConfig {
    let mut config = WorkerConfig::default();
    config.group_size = group_size;
    config.concurrency = 2;
    config
}

/// A handler whose statement fails aborts the work transaction on PostgreSQL: only the undo
/// to the checkpoint recovers it, so its neighbours commit and no handler runs twice. (The
/// other ways a grouped job fails are the test kit's grouped suite, run by the adapter.)
#[tokio::test]
async fn a_failing_statement_is_undone_and_its_neighbours_commit() {
    let f = Fixture::new().await;
    let worker = f.worker(config(16)).expect("queue and store share a pool");
    for (n, then) in [(0, "ok"), (1, "bad sql"), (2, "ok")] {
        f.publish(&f.envelope(n, then), PublishOptions::default())
            .await;
    }
    let outcomes = worker.run_once().await.expect("receive");
    assert!(
        matches!(
            outcomes[..],
            [
                Outcome::Processed,
                Outcome::Retrying { .. },
                Outcome::Processed
            ]
        ),
        "{outcomes:?}"
    );
    assert_eq!(f.effects().await, [0, 2], "job 1's writes undone");
    for n in 0..3 {
        assert_eq!(f.handler.runs(n), 1, "job {n} ran once");
    }
    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(
        worker.run_once().await.expect("receive"),
        [Outcome::Processed],
        "the retry succeeds"
    );
    assert_eq!(f.effects().await, [0, 1, 2]);
    assert_eq!(f.pending().await, 0, "nothing left in core.jobs");
    f.db.drop_db().await;
}

#[tokio::test]
async fn the_build_refuses_a_queue_that_cannot_join_the_stores_transactions() {
    let f = Fixture::new().await;
    let other_pool = f.db.pool().await;
    let elsewhere = Arc::new(PgQueue::new(other_pool));
    match f.worker_over(elsewhere, config(8)) {
        Err(WorkerError::NotInStore { reason, .. }) => {
            assert!(
                reason.contains("PgQueue::new(store.pool().clone())"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The same database through a pool of its own: its statements cannot join the store's
    // transactions either.
    let other_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*f.pool.connect_options()).clone())
        .await
        .expect("connect");
    match f.worker_over(Arc::new(PgQueue::new(other_pool)), config(8)) {
        Err(WorkerError::NotInStore { reason, .. }) => {
            assert!(reason.contains("different pools"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(f.worker(config(8)).is_ok(), "the store's pool");
    f.db.drop_db().await;
}

/// Writes its row; while its job waits to be ready, moves the lease of the job its data names
/// (`"steal"`) on, as another worker that received it after its lease ran out would.
struct Steals {
    pool: sqlx::PgPool,
    runs: Arc<Mutex<Vec<i64>>>,
}

#[derive(Deserialize)]
struct Thief {
    n: i64,
    #[serde(default)]
    steal: Option<String>,
}

#[async_trait]
impl Handler<PgWorkTx> for Steals {
    type Data = Thief;

    async fn ready(&self, job: &Job<Thief>) -> Result<(), JobError> {
        if let Some(victim) = &job.envelope.data.steal {
            sqlx::query("update core.jobs set lease_gen = lease_gen + 1 where dedup_key = $1")
                .bind(victim)
                .execute(&self.pool)
                .await
                .expect("move the lease on");
        }
        Ok(())
    }

    async fn handle(&self, job: Job<Thief>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let n = job.envelope.data.n;
        self.runs.lock().expect("not poisoned").push(n);
        sqlx::query("insert into effects (n) values ($1)")
            .bind(n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

/// A job whose lease another worker took before its group held it is not run, claimed or
/// settled by the group: its neighbours commit, and it stays with the other worker (the
/// fencing of `PgQueue`'s hold).
#[tokio::test]
async fn a_job_whose_lease_moved_on_before_its_group_held_it_is_left_to_its_new_holder() {
    let f = Fixture::new().await;
    let job = |n: i64, steal: Option<String>| {
        jobs_testkit::fixtures::envelope_with(
            1,
            KIND,
            serde_json::json!({ "n": n, "steal": steal }),
        )
    };
    let victim = job(2, None);
    let thief = job(1, Some(victim.job_id.to_string()));
    for envelope in [&thief, &victim, &job(3, None)] {
        f.publish(envelope, PublishOptions::default()).await;
    }
    let runs = Arc::default();
    let handler = Steals {
        pool: f.pool.clone(),
        runs: Arc::clone(&runs),
    };
    let worker = f
        .grouped(Arc::new(f.queue.clone()), handler, config(3))
        .expect("valid");
    let outcomes = worker.run_once().await.expect("run");
    assert!(
        matches!(
            &outcomes[..],
            [Outcome::Processed, Outcome::Unsettled { error }, Outcome::Processed]
                if error.contains("lease was lost")
        ),
        "{outcomes:?}"
    );
    assert_eq!(
        *runs.lock().expect("not poisoned"),
        [1, 3],
        "job 2 never ran"
    );
    assert_eq!(f.effects().await, [1, 3]);
    let (left, claims): (Vec<String>, i64) = sqlx::query_as(
        "select (select coalesce(array_agg(dedup_key), '{}') from core.jobs where leased), \
                (select count(*) from core.processed_jobs)",
    )
    .fetch_one(&f.pool)
    .await
    .expect("read the queue");
    assert_eq!(
        left,
        [victim.job_id.to_string()],
        "job 2 is still leased, to its thief"
    );
    assert_eq!(claims, 2, "no claim for job 2");
    f.db.drop_db().await;
}

/// Writes a row whose deferred foreign key fails only at the commit, when its job says
/// `"then": "orphan"`.
struct Orphans;

#[async_trait]
impl Handler<PgWorkTx> for Orphans {
    type Data = Step;

    async fn handle(&self, job: Job<Step>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let parent = if job.envelope.data.then == "orphan" {
            2
        } else {
            1
        };
        sqlx::query("insert into children (parent) values ($1)")
            .bind(parent)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

/// A group whose commit fails (here a deferred constraint) settles nothing: every job says
/// the group did not commit and stays leased, to come back after its lease, with no claim and
/// no write left behind.
#[tokio::test]
async fn a_group_whose_commit_fails_leaves_its_jobs_leased_and_says_why() {
    let f = Fixture::new().await;
    sqlx::raw_sql(
        "create table parents (id int primary key); insert into parents values (1); \
         create table children (parent int references parents \
             deferrable initially deferred)",
    )
    .execute(&f.pool)
    .await
    .expect("create the tables");
    for (n, then) in [(0, "ok"), (1, "orphan"), (2, "ok")] {
        f.publish(&f.envelope(n, then), PublishOptions::default())
            .await;
    }
    let worker = f
        .grouped(Arc::new(f.queue.clone()), Orphans, config(3))
        .expect("valid");
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes.len(), 3);
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Outcome::Unsettled { error } if error.contains("the group did not commit")),
            "{outcomes:?}"
        );
    }
    let (leased, claims, children): (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from core.jobs where leased), \
                (select count(*) from core.processed_jobs), \
                (select count(*) from children)",
    )
    .fetch_one(&f.pool)
    .await
    .expect("read the tables");
    assert_eq!((leased, claims, children), (3, 0, 0));
    f.db.drop_db().await;
}

#[tokio::test]
async fn compose_gives_a_grouped_worker_one_pool_sized_for_it() {
    let f = Fixture::new().await;
    let env = |name: &str| (name == "DATABASE_URL").then(|| f.db.url.clone());
    let settings = jobs_ops::compose::Config::resolve(
        &Default::default(),
        &env,
        &jobs_ops::compose::ConfigFile::None,
    )
    .expect("resolves");
    let mut cfg = config(8);
    cfg.concurrency = 12;
    let (store, queue) = jobs_ops::compose::postgres_worker(&settings, &cfg)
        .await
        .expect("a migrated PostgreSQL database");
    assert_eq!(
        store.pool().options().get_max_connections(),
        15,
        "12 groups and 3 more"
    );
    let queue = Arc::new(queue);
    let worker = Worker::grouped_builder(
        ConsumerName::try_from("test.grouped").expect("valid"),
        f.name.clone(),
        queue,
        Arc::new(store),
    )
    .handler(KIND.parse().expect("valid"), f.handler.clone())
    .config(cfg)
    .build();
    assert!(worker.is_ok(), "{worker:?}");
    f.publish(&f.envelope(1, "ok"), PublishOptions::default())
        .await;
    assert_eq!(
        worker.expect("built").run_once().await.expect("run"),
        [Outcome::Processed]
    );
    f.db.drop_db().await;
}

#[tokio::test]
async fn behind_the_transactional_first_gate_a_pg_queue_still_runs_grouped() {
    let f = Fixture::new().await;
    let transactional: QueueName = "test.grouped.urgent".parse().expect("valid");
    let gate = jobs_notifications::PriorityGate::new(2, 0).expect("valid thresholds");
    let gated = Arc::new(jobs_notifications::TransactionalFirst::new(
        Arc::new(f.queue.clone()),
        Arc::new(f.queue.clone()),
        transactional.clone(),
        gate,
    ));
    // The gate is the worker's pull side; the queue itself settles, in the transaction.
    let worker = Worker::grouped_builder(
        ConsumerName::try_from("test.grouped").expect("valid"),
        f.name.clone(),
        Arc::new(f.queue.clone()),
        Arc::new(f.store.clone()),
    )
    .pull(gated)
    .handler(KIND.parse().expect("valid"), f.handler.clone())
    .clock(Arc::new(f.clock.clone()))
    .config(config(8))
    .build()
    .expect("a gate over the pull side");
    assert!(
        format!("{worker:?}").contains("grouped: true"),
        "still grouped: {worker:?}"
    );
    for n in 0..3 {
        f.publish(&f.envelope(n, "ok"), PublishOptions::default())
            .await;
    }
    for n in 0..3 {
        let urgent = f.envelope(100 + n, "ok");
        f.queue
            .publish(&transactional, &urgent, PublishOptions::default())
            .await
            .expect("publish");
    }
    assert!(
        worker.run_once().await.expect("run").is_empty(),
        "paused while the transactional queue is deep"
    );
    let drained =
        jobs_core::PullPort::receive(&f.queue, &transactional, 10, Duration::from_secs(60))
            .await
            .expect("receive");
    for delivery in drained {
        jobs_core::SettlePort::ack(&f.queue, &delivery.lease)
            .await
            .expect("ack");
    }
    assert_eq!(
        worker.run_once().await.expect("run"),
        vec![Outcome::Processed; 3],
        "one group of three once the gate reopens"
    );
    assert_eq!(f.effects().await, [0, 1, 2]);
    f.db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_connections_are_killed_drains_each_job_once() {
    // The pool a worker gets (`PgStore::connect_sized`) does not ping before each acquire: a
    // connection killed under it fails the statement that uses it, and the worker goes on.
    let f = Fixture::new().await;
    let jobs = 3_000;
    f.publish_ok(0..jobs).await;
    let mut cfg = config(16);
    cfg.concurrency = 4;
    cfg.lease = Duration::from_secs(2);
    cfg.poll_interval = Duration::from_millis(100);
    let separator = if f.db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}application_name=killed_worker", f.db.url);
    let store = PgStore::connect_sized(&url, cfg.connections())
        .await
        .expect("connect");
    let queue = Arc::new(PgQueue::new(store.pool().clone()));
    let worker = Worker::grouped_builder(
        ConsumerName::try_from("test.grouped").expect("valid"),
        f.name.clone(),
        queue,
        Arc::new(store.clone()),
    )
    .handler(KIND.parse().expect("valid"), f.handler.clone())
    // A handler whose statement the kill fails says retry: soon, for the test.
    .policy(
        QueuePolicy::new(
            f.name.clone(),
            RetryPolicy::new(5, Duration::from_millis(200), Duration::from_secs(1)).expect("valid"),
            "the test kills connections under handlers",
        )
        .expect("valid"),
    )
    .config(cfg)
    .build()
    .expect("valid");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::new(worker).run(async {
        let _ = stopped.await;
    }));
    let mut kills = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "select pg_terminate_backend(pid) from pg_stat_activity \
             where application_name = 'killed_worker'",
        )
        .fetch_all(&f.pool)
        .await
        .expect("terminate the worker's connections");
        kills += killed.len();
    }
    assert!(kills > 0, "the worker's connections were killed");
    let expected: Vec<i64> = (0..jobs).collect();
    for _ in 0..600 {
        if f.effects().await.len() >= expected.len() && f.pending().await == 0 {
            break;
        }

        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send(()).expect("the worker runs");
    running.await.expect("the worker stops");
    assert_eq!(f.effects().await, expected, "each job's effect once");
    assert_eq!(f.pending().await, 0, "nothing left in core.jobs");
    f.db.drop_db().await;
}

/// Never finishes (it awaits forever), like a handler stuck on a call without a timeout.
struct Hangs;

#[async_trait]
impl Handler<PgWorkTx> for Hangs {
    type Data = serde_json::Value;

    async fn handle(&self, _: Job<serde_json::Value>, _: &mut PgWorkTx) -> Result<(), JobError> {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_many_timed_out_handlers_every_connection_is_back() {
    let f = Fixture::new().await;
    let policy = || {
        QueuePolicy::new(
            f.name.clone(),
            RetryPolicy::new(1, Duration::from_secs(1), Duration::from_secs(1)).expect("valid"),
            "one attempt: a timed-out job is dead-lettered at once",
        )
        .expect("valid")
    };
    let mut cfg = config(4);
    cfg.handler_timeout = Duration::from_millis(100);
    for grouped in [true, false] {
        for n in 0..12 {
            f.publish(&f.envelope(n, "ok"), PublishOptions::default())
                .await;
        }
        let worker = f
            .builder(grouped)
            .handler(KIND.parse().expect("valid"), Hangs)
            .policy(policy())
            .clock(Arc::new(f.clock.clone()))
            .config(cfg.clone())
            .build()
            .expect("valid");
        let mut outcomes = vec![];
        while outcomes.len() < 12 {
            outcomes.extend(worker.run_once().await.expect("receive"));
        }
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Outcome::DeadLettered {
                    reason: DeadReason::Exhausted,
                    ..
                }
            )),
            "grouped {grouped}: {outcomes:?}"
        );
        assert_eq!(f.pending().await, 0);
    }
    let letters: Vec<String> = sqlx::query_scalar("select last_error from core.dead_letters")
        .fetch_all(&f.pool)
        .await
        .expect("letters");
    assert_eq!(letters.len(), 24);
    assert!(
        letters.iter().all(|e| e.contains("timed out")),
        "{letters:?}"
    );
    // Connections go back to the pool from tasks of their own.
    for _ in 0..100 {
        if f.pool.num_idle() == f.pool.size() as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        f.pool.num_idle(),
        f.pool.size() as usize,
        "no connection is held by a stopped handler"
    );
    f.db.drop_db().await;
}

/// Counts the database's transactions left open by other connections: a group's, while its
/// handlers run.
async fn open_transactions(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity \
         where datname = current_database() and state like 'idle in transaction%'",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity")
}

/// Records the open transactions when each job got ready and when it ran, and writes its row.
#[derive(Clone)]
struct Watched {
    pool: sqlx::PgPool,
    when_ready: Arc<Mutex<Vec<i64>>>,
    when_run: Arc<Mutex<Vec<i64>>>,
}

#[async_trait]
impl Handler<PgWorkTx> for Watched {
    type Data = Step;

    async fn ready(&self, _: &Job<Step>) -> Result<(), JobError> {
        let open = open_transactions(&self.pool).await;
        self.when_ready.lock().expect("not poisoned").push(open);
        Ok(())
    }

    async fn handle(&self, job: Job<Step>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let open = open_transactions(&self.pool).await;
        self.when_run.lock().expect("not poisoned").push(open);
        sqlx::query("insert into effects (n) values ($1)")
            .bind(job.envelope.data.n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

#[tokio::test]
async fn a_group_takes_its_tokens_before_its_transaction_opens_and_waits_short_ones_out() {
    let f = Fixture::new().await;
    let limiter = Arc::new(jobs_adapter_memory::MemoryRateLimiter::new(Arc::new(
        jobs_core::SystemClock,
    )));
    let bucket = jobs_core::Bucket::new(1, 1, Duration::from_millis(30)).expect("valid");
    let watched = Watched {
        pool: f.pool.clone(),
        when_ready: Arc::default(),
        when_run: Arc::default(),
    };
    let throttled =
        jobs_consumers::Throttled::new(watched.clone(), limiter, move |_: &Envelope<Step>| {
            vec![(jobs_core::BucketKey::provider("resend"), bucket)]
        });
    let mut cfg = config(8);
    cfg.concurrency = 1;
    let worker = f
        .grouped(Arc::new(f.queue.clone()), throttled, cfg)
        .expect("valid");
    f.publish_ok(0..8).await;

    // Eight jobs for one token every 30 ms: the group waits for them, then runs all eight.
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes, vec![Outcome::Processed; 8]);
    assert_eq!(f.effects().await, (0..8).collect::<Vec<_>>());
    assert_eq!(
        *watched.when_ready.lock().expect("not poisoned"),
        [0; 8],
        "no transaction open while the jobs waited"
    );
    assert!(
        watched
            .when_run
            .lock()
            .expect("not poisoned")
            .iter()
            .all(|open| *open == 1),
        "the group's transaction is seen while its handlers run"
    );
    f.db.drop_db().await;
}

/// Runs one statement that takes far longer than its time limit.
struct SleepsInSql;

#[async_trait]
impl Handler<PgWorkTx> for SleepsInSql {
    type Data = serde_json::Value;

    async fn handle(&self, _: Job<serde_json::Value>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        sqlx::query("select pg_sleep(60)")
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

/// Statements of the database still running `pg_sleep`, whoever started them.
async fn sleeping_statements(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_stat_activity where datname = current_database() \
         and state = 'active' and query like '%pg_sleep(60)%' and pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_stopped_in_the_middle_of_a_statement_leaves_nothing_running() {
    let f = Fixture::new().await;
    let mut cfg = config(4);
    cfg.handler_timeout = Duration::from_millis(300);
    for grouped in [true, false] {
        f.publish(&f.envelope(1, "ok"), PublishOptions::default())
            .await;
        let worker = f
            .builder(grouped)
            .handler(KIND.parse().expect("valid"), SleepsInSql)
            .clock(Arc::new(f.clock.clone()))
            .config(cfg.clone())
            .build()
            .expect("valid");
        let worker = Arc::new(worker);
        let running = tokio::spawn({
            let worker = worker.clone();
            async move { worker.run_once().await }
        });
        // The statement is cancelled by the database within the time limit of its start,
        // not left running (and holding the transaction's locks) for its whole minute.
        let mut seen = false;
        let mut left = 1;
        for _ in 0..100 {
            left = sleeping_statements(&f.pool).await;
            seen |= left > 0;
            if seen && left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "grouped {grouped}: the statement never ran");
        assert_eq!(left, 0, "grouped {grouped}: the statement still runs");
        let outcomes = running.await.expect("joined").expect("receive");
        assert!(
            matches!(outcomes[..], [Outcome::Retrying { .. }]),
            "grouped {grouped}: {outcomes:?}"
        );
        sqlx::query("delete from core.jobs")
            .execute(&f.pool)
            .await
            .expect("clear the queue");
    }
    f.db.drop_db().await;
}

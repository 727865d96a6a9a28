//! The grouped runtime on PostgreSQL (`WorkerBuilder::grouped` over `PgQueue` and `PgStore`):
//! several jobs in one work transaction, each succeeding or failing alone.

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

    /// Waits until at least `jobs` effects have committed, or `within` has passed (the
    /// assertions that follow say which).
    async fn await_effects(&self, jobs: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.effects().await.len() < jobs && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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

#[tokio::test]
async fn a_failing_job_takes_nothing_from_its_group_and_no_neighbour_runs_twice() {
    let f = Fixture::new().await;
    let worker = f.worker(config(16)).expect("queue and store share a pool");
    let steps = [
        (0, "ok"),
        (1, "retry"),
        (2, "ok"),
        (3, "permanent"),
        (4, "panic"),
        (5, "ok"),
        (6, "defer"),
        (7, "bad sql"),
        (8, "ok"),
    ];
    let mut envelopes = vec![];
    for (n, then) in steps {
        let envelope = f.envelope(n, then);
        f.publish(&envelope, PublishOptions::default()).await;
        envelopes.push(envelope);
    }
    // A second copy of job 0 under another key: the group runs it once.
    f.publish(&envelopes[0], PublishOptions::default().dedup_key("copy"))
        .await;

    let outcomes = worker.run_once().await.expect("receive");
    assert_eq!(outcomes.len(), 10, "{outcomes:?}");
    assert_eq!(outcomes[0], Outcome::Processed);
    assert!(
        matches!(outcomes[1], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], Outcome::Processed);
    assert!(
        matches!(
            outcomes[3],
            Outcome::DeadLettered {
                reason: DeadReason::Permanent,
                ..
            }
        ),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[4], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[5], Outcome::Processed);
    assert!(
        matches!(outcomes[6], Outcome::Deferred { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[7], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[8], Outcome::Processed);
    assert_eq!(outcomes[9], Outcome::Duplicate, "the second copy of job 0");

    assert_eq!(
        f.effects().await,
        [0, 2, 5, 8],
        "only the succeeding jobs' writes committed"
    );
    for n in 0..=8 {
        assert_eq!(f.handler.runs(n), 1, "job {n} ran once");
    }
    let letters: Vec<(String, i64)> =
        sqlx::query_as("select last_error, attempts::bigint from core.dead_letters")
            .fetch_all(&f.pool)
            .await
            .expect("read dead letters");
    assert_eq!(letters, [("invoice does not exist".to_owned(), 1)]);
    let claims: i64 = sqlx::query_scalar("select count(*) from core.processed_jobs")
        .fetch_one(&f.pool)
        .await
        .expect("count claims");
    assert_eq!(
        claims, 5,
        "four processed jobs and the dead letter hold claims"
    );
    let deferred: i32 =
        sqlx::query_scalar("select deliveries from core.jobs where dedup_key = $1 and not leased")
            .bind(envelopes[6].job_id.to_string())
            .fetch_one(&f.pool)
            .await
            .expect("the deferred job waits");
    assert_eq!(deferred, 0, "a deferral gives its attempt back");

    // The retried jobs come back alone, as redeliveries, and succeed.
    f.clock.advance(Duration::from_secs(3600));
    let mut later = vec![];
    for _ in 0..10 {
        let outcomes = worker.run_once().await.expect("receive");
        if outcomes.is_empty() {
            break;
        }
        later.extend(outcomes);
    }
    assert_eq!(later.len(), 4, "jobs 1, 4, 6 and 7: {later:?}");
    assert!(later.iter().all(|o| *o == Outcome::Processed), "{later:?}");
    assert_eq!(f.effects().await, [0, 1, 2, 4, 5, 6, 7, 8]);
    assert_eq!(f.pending().await, 0, "nothing left in core.jobs");
    f.db.drop_db().await;
}

#[tokio::test]
async fn a_group_skips_a_job_processed_before() {
    let f = Fixture::new().await;
    let worker = f.worker(config(8)).expect("valid");
    let first = f.envelope(1, "ok");
    f.publish(&first, PublishOptions::default()).await;
    assert_eq!(worker.run_once().await.expect("run"), [Outcome::Processed]);
    // Published again after its ack: a new row, whose claim finds the job processed.
    f.publish(&first, PublishOptions::default()).await;
    f.publish(&f.envelope(2, "ok"), PublishOptions::default())
        .await;
    assert_eq!(
        worker.run_once().await.expect("run"),
        [Outcome::Duplicate, Outcome::Processed]
    );
    assert_eq!(f.effects().await, [1, 2]);
    assert_eq!(f.handler.runs(1), 1);
    assert_eq!(f.pending().await, 0);
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
    let mut too_big = config(8);
    too_big.group_size = 65;
    assert!(matches!(f.worker(too_big), Err(WorkerError::GroupSize(65))));
    f.db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grouped_loop_drains_a_queue_exactly_once_and_gives_back_what_it_holds() {
    let f = Fixture::new().await;
    let jobs = 600;
    f.publish_ok(0..jobs).await;
    let mut cfg = config(16);
    cfg.concurrency = 4;
    let worker = Arc::new(f.worker(cfg).expect("valid"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.clone().run(async {
        let _ = stopped.await;
    }));
    let drained = usize::try_from(jobs).expect("small");
    f.await_effects(drained, Duration::from_secs(30)).await;
    // One more job while idle: the wake-up brings it in.
    f.publish(&f.envelope(jobs, "ok"), PublishOptions::default())
        .await;
    f.await_effects(drained + 1, Duration::from_secs(5)).await;
    stop.send(()).expect("the worker runs");
    running.await.expect("the worker stops");
    let effects = f.effects().await;
    assert_eq!(effects, (0..=jobs).collect::<Vec<_>>(), "each job once");
    assert_eq!(f.pending().await, 0);
    f.db.drop_db().await;
}

#[tokio::test]
async fn shutdown_gives_back_fetched_jobs_with_their_attempt_unspent() {
    let f = Fixture::new().await;
    f.publish(&f.envelope(0, "ok"), PublishOptions::default())
        .await;
    /// Blocks in its handler until told to go on, so the loop's buffer stays full; says when
    /// it is entered.
    struct Gate(Arc<tokio::sync::Semaphore>, Arc<tokio::sync::Notify>);
    #[async_trait]
    impl Handler<PgWorkTx> for Gate {
        type Data = serde_json::Value;
        async fn handle(
            &self,
            _: Job<serde_json::Value>,
            _: &mut PgWorkTx,
        ) -> Result<(), JobError> {
            self.1.notify_one();
            let _permit = self.0.acquire().await.map_err(JobError::retry)?;
            Ok(())
        }
    }
    let (gate, entered) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let queue = Arc::new(f.queue.clone());
    let mut cfg = config(10);
    cfg.concurrency = 1;
    // Long enough that a fetch under way at the stop answers within it on a loaded machine
    // (it is given back with the rest), short enough to abandon the blocked job quickly.
    cfg.shutdown_grace = Duration::from_secs(2);
    let worker = Arc::new(
        f.grouped(queue, Gate(gate.clone(), entered.clone()), cfg)
            .expect("valid"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    // The running group holds the first job alone (on a loaded machine a group formed after
    // a second fetch would hold three), then the rest arrive at once.
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the first job's handler starts");
    f.publish_ok(1..40).await;
    // The loop starts slow (fetches of 1, 2, 4, 8) and keeps fetching while the group runs,
    // until a group waits in the buffer, each fetch asking for up to two groups ahead: the
    // blocked job and fourteen more are leased, and no more than that however long the group
    // takes.
    let leased = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from core.jobs where leased")
            .fetch_one(&f.pool)
            .await
            .expect("count")
    };
    for _ in 0..200 {
        if leased().await >= 15 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ahead = leased().await;
    assert_eq!(
        ahead, 15,
        "the running group and what two groups ahead leave room for"
    );
    stop.send(()).expect("running");
    let drained = running.await.expect("stops");
    assert_eq!(
        (drained.given_back, drained.abandoned, drained.finished),
        (usize::try_from(ahead - 1).expect("a count"), 1, 0),
        "what the worker says it left: {drained:?}"
    );
    let (leased, given_back): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where leased), \
                count(*) filter (where not leased and deliveries = 0) \
         from core.jobs",
    )
    .fetch_one(&f.pool)
    .await
    .expect("count");
    assert_eq!(given_back, 39, "the buffered and those never fetched");
    assert_eq!(
        leased, 1,
        "the blocked group, abandoned after the grace, waits out its lease"
    );
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

/// [`Scripted`], declared rerunnable: its only effects are its writes.
#[derive(Clone, Default)]
struct Rerunnable(Scripted);

#[async_trait]
impl Handler<PgWorkTx> for Rerunnable {
    type Data = Step;
    const RERUNNABLE: bool = true;

    async fn handle(&self, job: Job<Step>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        self.0.handle(job, tx).await
    }
}

#[tokio::test]
async fn a_group_of_rerunnable_jobs_runs_the_others_again_when_one_fails() {
    let f = Fixture::new().await;
    let handler = Rerunnable::default();
    let queue = Arc::new(f.queue.clone());
    let worker = f.grouped(queue, handler.clone(), config(8)).expect("valid");
    for (n, then) in [(0, "ok"), (1, "ok"), (2, "retry"), (3, "ok")] {
        f.publish(&f.envelope(n, then), PublishOptions::default())
            .await;
    }
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes[0], Outcome::Processed);
    assert_eq!(outcomes[1], Outcome::Processed);
    assert!(
        matches!(outcomes[2], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[3], Outcome::Processed);
    assert_eq!(
        f.effects().await,
        [0, 1, 3],
        "each committed once, though 0 and 1 ran twice"
    );
    let runs: Vec<u32> = (0..4).map(|n| handler.0.runs(n)).collect();
    assert_eq!(
        runs,
        [2, 2, 1, 1],
        "the jobs before the failure ran again in the second pass, the failed one did not"
    );
    f.db.drop_db().await;
}

#[tokio::test]
async fn when_the_first_job_to_write_fails_the_group_starts_again_without_it() {
    let f = Fixture::new().await;
    let worker = f.worker(config(8)).expect("valid");
    for (n, then) in [(0, "ok-no-write"), (1, "retry"), (2, "ok")] {
        f.publish(&f.envelope(n, then), PublishOptions::default())
            .await;
    }
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes[0], Outcome::Processed);
    assert!(
        matches!(outcomes[1], Outcome::Retrying { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], Outcome::Processed);
    assert_eq!(f.effects().await, [2], "job 1's write was rolled back");
    for n in 0..3 {
        assert_eq!(f.handler.runs(n), 1, "job {n} ran once");
    }
    let claims: i64 = sqlx::query_scalar("select count(*) from core.processed_jobs")
        .fetch_one(&f.pool)
        .await
        .expect("count claims");
    assert_eq!(
        claims, 2,
        "jobs 0 and 2 claimed again in the second pass, job 1 not"
    );
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

/// A job whose previous lease expired unsettled (its worker may have died on it) runs alone:
/// only once every job fetched before it has settled, with nothing else leased or running
/// until it has, so that if it crashes this process too it takes no other job's attempt.
#[tokio::test]
async fn a_job_whose_lease_expired_runs_alone_with_nothing_else_leased() {
    let f = Fixture::new().await;
    /// Writes its row; job 0 takes its time and counts the rows leased meanwhile.
    struct Watched {
        pool: sqlx::PgPool,
        suspect_running: Arc<std::sync::atomic::AtomicBool>,
        /// Jobs that started while job 0 ran.
        overlapped: Arc<Mutex<Vec<i64>>>,
        /// The rows leased at the end of job 0's run.
        leased_meanwhile: Arc<Mutex<Option<i64>>>,
    }
    #[async_trait]
    impl Handler<PgWorkTx> for Watched {
        type Data = Step;
        async fn handle(&self, job: Job<Step>, tx: &mut PgWorkTx) -> Result<(), JobError> {
            use std::sync::atomic::Ordering;
            let n = job.envelope.data.n;
            if n == 0 {
                self.suspect_running.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                let leased: i64 = sqlx::query_scalar("select count(*) from core.jobs where leased")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(JobError::retry)?;
                *self.leased_meanwhile.lock().expect("not poisoned") = Some(leased);
                self.suspect_running.store(false, Ordering::SeqCst);
            } else if self.suspect_running.load(Ordering::SeqCst) {
                self.overlapped.lock().expect("not poisoned").push(n);
            }
            sqlx::query("insert into effects (n) values ($1)")
                .bind(n)
                .execute(tx.conn())
                .await
                .map_err(JobError::retry)?;
            Ok(())
        }
    }
    // Job 0 was leased by a worker that never settled it, and its lease ran out.
    f.publish(&f.envelope(0, "ok"), PublishOptions::default())
        .await;
    let taken = (f.queue)
        .receive(&f.name, 1, Duration::from_secs(60))
        .await
        .expect("receive");
    assert_eq!(taken.len(), 1);
    f.clock.advance(Duration::from_secs(61));
    f.publish_ok(1..9).await;
    let handler = Watched {
        pool: f.pool.clone(),
        suspect_running: Arc::default(),
        overlapped: Arc::default(),
        leased_meanwhile: Arc::default(),
    };
    let (overlapped, leased_meanwhile) =
        (handler.overlapped.clone(), handler.leased_meanwhile.clone());
    let worker = Arc::new(
        f.grouped(Arc::new(f.queue.clone()), handler, config(4))
            .expect("valid"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    f.await_effects(9, Duration::from_secs(10)).await;
    stop.send(()).expect("the worker runs");
    running.await.expect("the worker stops");
    assert_eq!(
        f.effects().await,
        (0..=8).collect::<Vec<_>>(),
        "each job once"
    );
    assert_eq!(
        *overlapped.lock().expect("not poisoned"),
        Vec::<i64>::new(),
        "no job started while the one whose lease expired ran"
    );
    assert_eq!(
        *leased_meanwhile.lock().expect("not poisoned"),
        Some(1),
        "nothing but itself leased while it ran"
    );
    f.db.drop_db().await;
}

//! A worker process's graceful stop on PostgreSQL, as issue 43's newcomer met it: slow
//! handlers, a short grace, the stop soon after the start. Only the jobs whose handlers are
//! still running may keep their leases; every other job fetched goes back at once with its
//! attempt unspent, and nothing is lost or done twice.

use std::time::Duration;

use async_trait::async_trait;
use jobs_adapter_postgres::{NewJob, PgQueue, PgStore, PgWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError};
use jobs_core::PublishOptions;
use jobs_ops::compose::{Config, ConfigFile};
use jobs_ops::process::WorkerProcess;
use serde::Deserialize;

use crate::pg::TestDb;

const QUEUE: &str = "stop.jobs";
const KIND: &str = "stop.job";
const JOBS: i64 = 200;
const CONCURRENCY: i64 = 8;

#[derive(Deserialize)]
struct Numbered {
    n: i64,
}

/// Takes a second, then writes its job's effect in the work transaction.
struct Slow;

#[async_trait]
impl Handler<PgWorkTx> for Slow {
    type Data = Numbered;

    async fn handle(&self, job: Job<Numbered>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        sqlx::query("insert into effects (n) values ($1)")
            .bind(job.envelope.data.n)
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

fn config(url: &str) -> Config {
    let concurrency = CONCURRENCY.to_string();
    let pairs = [
        ("DATABASE_URL", url),
        ("JOBS_HTTP_ADDR", "127.0.0.1:0"),
        ("JOBS_CONCURRENCY", concurrency.as_str()),
        ("JOBS_SHUTDOWN_GRACE", "3s"),
    ];
    let env = |name: &str| {
        (pairs.iter())
            .find(|(key, _)| *key == name)
            .map(|(_, value)| (*value).to_owned())
    };
    Config::resolve(&Default::default(), &env, &ConfigFile::None).expect("resolves")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_soon_after_the_start_keeps_only_the_running_jobs_leased() {
    let (db, pool) = TestDb::migrated().await;
    sqlx::query("create table effects (n bigint not null)")
        .execute(&pool)
        .await
        .expect("create effects");
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|n| NewJob {
            envelope: jobs_testkit::fixtures::envelope_with(1, KIND, serde_json::json!({ "n": n })),
            opts: PublishOptions::default(),
        })
        .collect();
    PgQueue::new(pool.clone())
        .publish_batch(&QUEUE.parse().expect("a queue"), &jobs)
        .await
        .expect("publish");

    let running = WorkerProcess::<PgStore>::with_config(config(&db.url))
        .queue(QUEUE, "stop.worker", |worker| {
            worker.handler(KIND.parse().expect("a kind"), Slow)
        })
        .start()
        .await
        .expect("the worker process starts");
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.stop().await;

    let (effects, distinct, claims): (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from effects), (select count(distinct n) from effects), \
                (select count(*) from core.processed_jobs)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    let (left, leased, spent): (i64, i64, i64) = sqlx::query_as(
        "select count(*), count(*) filter (where leased and visible_at > now()), \
                count(*) filter (where not (leased and visible_at > now()) and deliveries > 0) \
         from core.jobs",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert!(effects > 0, "the worker ran jobs for two seconds");
    assert_eq!(effects, distinct, "no job ran twice");
    assert_eq!(
        claims, effects,
        "a claim for every effect, none for a job given back"
    );
    assert_eq!(effects + left, JOBS, "every job done or still queued");
    assert!(
        leased <= CONCURRENCY,
        "{leased} jobs still leased: only running handlers may hold a lease"
    );
    assert_eq!(spent, 0, "the jobs given back have their attempts unspent");
    db.drop_db().await;
}

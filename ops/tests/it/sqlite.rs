//! The worker on the embedded default store, SQLite, where one transaction writes at a time.

use std::sync::Arc;

use async_trait::async_trait;
use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_sqlite::{SqliteStore, SqliteWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError, Outcome, Worker};
use jobs_core::{ConsumerName, QueueName, QueuePort};

use crate::temp::TempDb;

/// Writes its row in the work transaction, and reads through the pool meanwhile, as handlers
/// do for lookups (and as the model's handler does).
struct ReadsThePool(SqliteStore);

#[async_trait]
impl Handler<SqliteWorkTx> for ReadsThePool {
    type Data = serde_json::Value;

    async fn handle(
        &self,
        job: Job<serde_json::Value>,
        tx: &mut SqliteWorkTx,
    ) -> Result<(), JobError> {
        sqlx::query("insert into effects (job) values (?1)")
            .bind(job.envelope.job_id.to_string())
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        sqlx::query_scalar::<_, i64>("select count(*) from effects")
            .fetch_one(self.0.pool())
            .await
            .map_err(JobError::retry)?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_jobs_whose_handlers_read_the_pool_never_wait_out_the_busy_timeout() {
    // More jobs at once than the pool has connections: jobs waiting for the write lock must
    // not hold the connections the lock holder's handler reads through.
    let db = TempDb::new("sqlite-pool");
    let store = SqliteStore::open(&db.0).await.expect("open");
    store.migrate().await.expect("migrate");
    sqlx::query("create table effects (job text not null)")
        .execute(store.pool())
        .await
        .expect("create effects");
    let queue = MemoryQueue::default();
    let name: QueueName = "sqlite.jobs".parse().expect("valid");
    for n in 0..16 {
        let envelope =
            jobs_testkit::fixtures::envelope_with(1, "sqlite.job", serde_json::json!({ "n": n }));
        queue
            .publish(&name, &envelope, Default::default())
            .await
            .expect("publish");
    }
    let worker = Worker::builder(
        ConsumerName::try_from("sqlite.consumer").expect("valid"),
        name,
        Arc::new(queue),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )
    .handler(
        "sqlite.job".parse().expect("valid"),
        ReadsThePool(store.clone()),
    )
    .concurrency(8)
    .build()
    .expect("valid");
    let mut outcomes = vec![];
    while outcomes.len() < 16 {
        outcomes.extend(worker.run_once().await.expect("receive"));
    }
    assert_eq!(
        outcomes,
        vec![Outcome::Processed; 16],
        "none deferred for a busy database"
    );
}

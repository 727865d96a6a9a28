//! A PostgreSQL handler whose business write commits together with the job's
//! `processed_jobs` claim, so a job delivered twice books its invoice once; the queue is the
//! PostgreSQL queue on the store's own pool, so the worker runs grouped (many jobs per
//! transaction, each acked in it).
//!
//! Run it against a database you can write to (it creates `core.*` and `booked_invoices`):
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch cargo run -p jobs-ops --features postgres --example postgres_handler
//! ```

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use jobs_adapter_postgres::{PgQueue, PgStore, PgWorkTx, error_class, sqlx};
use jobs_consumers::{Handler, Job, JobError, Worker, WorkerConfig};
use jobs_core::{ConsumerName, Envelope, PublishOptions, QueueName, QueuePort};
use serde::Deserialize;

#[derive(Deserialize)]
struct InvoiceIssued {
    invoice: i64,
}

struct BookInvoice;

#[async_trait]
impl Handler<PgWorkTx> for BookInvoice {
    type Data = InvoiceIssued;

    async fn handle(&self, job: Job<InvoiceIssued>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        // `tx.conn()` is the work transaction's own connection: this row and the
        // processed_jobs claim commit, or roll back, together.
        sqlx::query("insert into booked_invoices (invoice, job_id) values ($1, $2)")
            .bind(job.envelope.data.invoice)
            .bind(job.envelope.job_id.as_uuid())
            .execute(tx.conn())
            .await
            .map_err(|e| JobError::classed(error_class(&e), e))?;
        Ok(())
    }
}

// A multi-thread runtime: the grouped drain is a sixth slower on a current-thread one,
// whose one thread every group's connection waits for (ADR 0011).
#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let config = WorkerConfig::default();
    // One pool for queue and store, sized for the worker, without sqlx's ping per acquire.
    let pool = PgStore::pool_options(config.connections())
        .connect(&url)
        .await?;
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await?;
    sqlx::query("create table if not exists booked_invoices (invoice bigint, job_id uuid)")
        .execute(store.pool())
        .await?;

    let queue = Arc::new(PgQueue::new(pool));
    let name: QueueName = "billing.invoices".parse()?;
    let worker = Worker::grouped_builder(
        ConsumerName::try_from("billing.booker")?,
        name.clone(),
        queue.clone(),
        Arc::new(store.clone()),
    )
    .handler("billing.invoice_issued".parse()?, BookInvoice)
    .config(config)
    .build()?;

    let envelope = Envelope::new(
        "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?,
        "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?,
        "billing.invoice_issued".parse()?,
        serde_json::json!({ "invoice": 42 }),
    );
    // Two deliveries of the same job, as an at-least-once transport may make.
    for key in ["first", "second"] {
        let opts = PublishOptions::default().dedup_key(key);
        queue.publish(&name, &envelope, opts).await?;
    }
    for outcome in worker.run_once().await? {
        println!("{outcome:?}");
    }
    let (rows,): (i64,) = sqlx::query_as("select count(*) from booked_invoices where job_id = $1")
        .bind(envelope.job_id.as_uuid())
        .fetch_one(store.pool())
        .await?;
    println!("rows booked for job {}: {rows}", envelope.job_id);
    Ok(())
}

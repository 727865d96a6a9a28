//! Write a worker: a typed job, a handler whose write commits with the job's `processed_jobs`
//! row (booked once, however often delivered), three jobs published, and the worker process
//! around it: `/healthz`, `/readyz` and `/metrics` on JOBS_HTTP_ADDR, a graceful stop on
//! SIGTERM. The schema comes first: `jobsctl migrate`.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch
//! cargo run -p jobsctl -- migrate && cargo run -p jobs-ops --features postgres --example worker
//! ```

use async_trait::async_trait;
use jobs_adapter_postgres::{PgStore, PgWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError};
use jobs_core::{CorrelationId, Envelope, JobKind};
use jobs_ops::process::WorkerProcess;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct InvoiceIssued {
    invoice: i64,
}

impl JobKind for InvoiceIssued {
    const KIND: &'static str = "billing.invoice_issued";
}

struct BookInvoice;

#[async_trait]
impl Handler<PgWorkTx> for BookInvoice {
    type Data = InvoiceIssued;

    async fn handle(&self, job: Job<InvoiceIssued>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        let book = sqlx::query("insert into booked_invoices (invoice) values ($1)");
        // On the work transaction: it commits with the job, or not at all.
        let booked = book.bind(job.envelope.data.invoice).execute(tx.conn());
        booked.await.map(drop).map_err(JobError::retry)
    }
}

const QUEUE: &str = "billing.invoices";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let process = WorkerProcess::<PgStore>::from_env()
        .queue(QUEUE, "billing.booker", |worker| worker.job(BookInvoice))
        .start()
        .await?;
    let schema = sqlx::query("create table if not exists booked_invoices (invoice bigint)");
    schema.execute(process.store().pool()).await?;
    let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
    let (queue, publisher) = (QUEUE.parse()?, process.publisher());
    for data in (1..=3).map(|invoice| InvoiceIssued { invoice }) {
        let job = Envelope::of(tenant, CorrelationId::generate(), &data)?;
        publisher.publish(&queue, &job, Default::default()).await?;
    }
    Ok(process.until_signal().await?)
}

//! The business handler the runtime tests share: it books an invoice in the work transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use jobs_adapter_postgres::{PgWorkTx, sqlx};
use jobs_consumers::{Handler, Job, JobError};
use serde::Deserialize;

/// The data of a `billing.invoice_issued` job.
#[derive(Deserialize)]
pub(crate) struct Invoice {
    invoice: i64,
}

/// Books the invoice in the work transaction, then fails the first `failures` attempts after
/// the insert, so a failed attempt must leave no row. `runs` counts every attempt.
pub(crate) struct Book {
    pub(crate) failures: u32,
    pub(crate) runs: Arc<AtomicU32>,
}

impl Book {
    /// Books every job at its first attempt.
    pub(crate) fn succeeding() -> Book {
        Book::failing(0)
    }

    /// Fails the first `failures` attempts after the insert (`u32::MAX`: every attempt).
    pub(crate) fn failing(failures: u32) -> Book {
        Book {
            failures,
            runs: Arc::new(AtomicU32::new(0)),
        }
    }
}

#[async_trait]
impl Handler<PgWorkTx> for Book {
    type Data = Invoice;

    async fn handle(&self, job: Job<Invoice>, tx: &mut PgWorkTx) -> Result<(), JobError> {
        sqlx::query("insert into booked (invoice, job_id) values ($1, $2)")
            .bind(job.envelope.data.invoice)
            .bind(job.envelope.job_id.as_uuid())
            .execute(tx.conn())
            .await
            .map_err(JobError::retry)?;
        if self.runs.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(JobError::retry("the ledger is down after the insert"));
        }
        Ok(())
    }
}

/// Creates the `booked` table the handler writes.
pub(crate) async fn create_table(pool: &sqlx::PgPool) {
    sqlx::query("create table booked (invoice bigint not null, job_id uuid not null)")
        .execute(pool)
        .await
        .expect("create the business table");
}

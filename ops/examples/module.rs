//! A module binary with its own commands: `migrate` (the framework's tables and the module's
//! own, idempotent), `publish` (one typed job, through the queue the workers consume, without
//! starting them) and `run` (the worker process), with the process's flags on every one.
//!
//! ```sh
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/scratch
//! cargo run -p jobs-ops --features postgres --example module -- migrate
//! cargo run -p jobs-ops --features postgres --example module -- publish --invoice 7
//! cargo run -p jobs-ops --features postgres --example module -- run --http-addr 127.0.0.1:9464
//! ```

use async_trait::async_trait;
use clap::{Parser, Subcommand};
use jobs_adapter_postgres::{PgStore, PgWorkTx, error_class, sqlx};
use jobs_consumers::{Handler, Job, JobError};
use jobs_core::{CorrelationId, Envelope, JobKind};
use jobs_ops::process::{ProcessFlags, WorkerProcess};
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
        let booked = book
            .bind(job.envelope.data.invoice)
            .execute(tx.conn())
            .await;
        booked
            .map(drop)
            .map_err(|e| JobError::classed(error_class(&e), e))
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    process: ProcessFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the workers until SIGTERM.
    Run,
    /// Create or update the framework's tables and this module's.
    Migrate,
    /// Publish one invoice to book.
    Publish {
        #[arg(long)]
        invoice: i64,
        #[arg(long, default_value = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90")]
        tenant: String,
    },
}

const QUEUE: &str = "billing.invoices";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let process = WorkerProcess::<PgStore>::from_flags(&cli.process).queue(
        QUEUE,
        "billing.booker",
        |worker| worker.job(BookInvoice),
    );
    match cli.command {
        Command::Run => process.run().await?,
        Command::Migrate => {
            let own = "create table if not exists booked_invoices (invoice bigint primary key)";
            let schema = async |store: PgStore| sqlx::query(own).execute(store.pool()).await;
            process.migrate(schema).await?;
            println!("migrated");
        }
        Command::Publish { invoice, tenant } => {
            let job = Envelope::of(
                tenant.parse()?,
                CorrelationId::generate(),
                &InvoiceIssued { invoice },
            )?;
            process
                .publisher()
                .await?
                .publish(&QUEUE.parse()?, &job, Default::default())
                .await?;
            println!("{}", job.job_id);
        }
    }
    Ok(())
}

//! `jobsctl`: the operator's command line of softcrum-jobs, and its reference composition
//! root: the one place where adapters are chosen and wired to the library crates.

mod compose;
mod cron;
mod dead_letters;
mod demo;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use jobs_core::{DeadLetterFilter, DeadLetterId, DeadLetterStatus, Kind, QueueName, TenantId};

use crate::compose::{DEFAULT_DATABASE_URL, Store};

/// Operate softcrum-jobs: run the demo, validate envelopes, and (as the library grows)
/// migrate stores and review dead letters.
///
/// Exit codes: 0 success, 1 failure (or an invalid envelope), 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "jobsctl", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the worker runtime on the embedded defaults and narrate what happens.
    ///
    /// Needs nothing but this binary: an in-memory queue and store, console alerts.
    ///
    /// Example: jobsctl demo
    Demo,
    /// Work with envelopes.
    #[command(subcommand)]
    Envelope(EnvelopeCommand),
    /// Create or update the store's tables (`core.processed_jobs`, `core.dead_letters`).
    ///
    /// Idempotent. Workers never migrate on their own: run this on deploy.
    ///
    /// Examples:
    ///   jobsctl migrate
    ///   jobsctl migrate --database-url postgres://postgres@127.0.0.1:5432/app
    Migrate(Db),
    /// Review dead letters.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLetterCommand),
    /// Housekeeping.
    #[command(subcommand)]
    Cleanup(CleanupCommand),
    /// The periodic tasks fanned out per tenant.
    #[command(subcommand)]
    Cron(CronCommand),
}

#[derive(Debug, Subcommand)]
enum CronCommand {
    /// List the tasks with their schedules, queues and next slots (UTC).
    ///
    /// Example: jobsctl cron list
    List,
    /// Fire one slot by hand; with --dry-run, print what would be published.
    ///
    /// Example: jobsctl cron tick --at 2026-12-01T03:00:00Z --dry-run --database-url postgres://…
    Tick {
        #[command(flatten)]
        db: Db,
        /// The slot, RFC 3339 (e.g. 2026-12-01T03:00:00Z).
        #[arg(long, value_parser = cron::parse_time)]
        at: std::time::SystemTime,
        /// Plan the fan-out without publishing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Where the store is.
#[derive(Debug, Args)]
struct Db {
    /// The store: sqlite://PATH or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    database_url: String,
}

#[derive(Debug, Subcommand)]
enum DeadLetterCommand {
    /// List dead letters, oldest first.
    ///
    /// Example: jobsctl dead-letters list --status pending_review --queue billing.invoices
    List {
        #[command(flatten)]
        db: Db,
        /// pending_review, replayed or discarded.
        #[arg(long, value_parser = parse_status)]
        status: Option<DeadLetterStatus>,
        /// Only this queue.
        #[arg(long)]
        queue: Option<QueueName>,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<TenantId>,
        /// Only this kind.
        #[arg(long)]
        kind: Option<Kind>,
        /// Only ids after this one (the next page).
        #[arg(long)]
        after: Option<i64>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter in full, payload included, as JSON.
    ///
    /// Example: jobsctl dead-letters show 42
    Show {
        #[command(flatten)]
        db: Db,
        /// The dead letter's id.
        id: i64,
    },
    /// Mark dead letters discarded (only from pending_review; repeating is harmless).
    ///
    /// Example: jobsctl dead-letters discard 42 43 --tenant 0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90
    Discard {
        #[command(flatten)]
        db: Db,
        /// Only if the letter belongs to this tenant.
        #[arg(long)]
        tenant: Option<TenantId>,
        /// The dead letters' ids.
        #[arg(required = true)]
        ids: Vec<i64>,
    },
}

#[derive(Debug, Subcommand)]
enum CleanupCommand {
    /// Delete processed_jobs rows older than a duration, in bounded batches.
    ///
    /// Keep rows well past the longest a message can live in your transport: a redelivery
    /// that finds no row runs again.
    ///
    /// Example: jobsctl cleanup processed --older-than 30d
    Processed {
        #[command(flatten)]
        db: Db,
        /// Age, e.g. 30d, 12h, 1h30m.
        #[arg(long, value_parser = dead_letters::parse_duration)]
        older_than: std::time::Duration,
    },
}

fn parse_status(s: &str) -> Result<DeadLetterStatus, String> {
    s.parse().map_err(|e: jobs_core::StoreError| e.to_string())
}

#[derive(Debug, Subcommand)]
enum EnvelopeCommand {
    /// Check envelopes the way every consumer will, printing each problem with its field.
    ///
    /// Exits 0 when every envelope is valid, 1 when one is not, 2 when the input cannot be
    /// read.
    ///
    /// Examples:
    ///   jobsctl envelope validate job.json
    ///   producer | jobsctl envelope validate --lines -
    Validate {
        /// The file to read, or `-` for standard input.
        #[arg(default_value = "-")]
        file: PathBuf,
        /// Read one envelope per line (JSON Lines).
        #[arg(long)]
        lines: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Envelope(EnvelopeCommand::Validate { file, lines }) => validate(&file, lines),
        Command::Demo => finish(block_on(async {
            demo::run(&mut std::io::stdout().lock()).await
        })),
        Command::Migrate(db) => finish(block_on(async {
            Store::connect(&db.database_url).await?.migrate().await?;
            println!("migrations applied");
            Ok(())
        })),
        Command::DeadLetters(command) => finish(block_on(dead_letter_command(command))),
        Command::Cron(CronCommand::List) => finish(cron::list(&mut std::io::stdout().lock())),
        Command::Cron(CronCommand::Tick { db, at, dry_run }) => finish(block_on(async {
            let store = Store::connect(&db.database_url).await?;
            cron::tick(&store, at, dry_run, &mut std::io::stdout().lock()).await
        })),
        Command::Cleanup(CleanupCommand::Processed { db, older_than }) => finish(block_on(async {
            let store = Store::connect(&db.database_url).await?;
            dead_letters::cleanup(&store, older_than, &mut std::io::stdout().lock()).await
        })),
    }
}

async fn dead_letter_command(command: DeadLetterCommand) -> Result<()> {
    let out = &mut std::io::stdout().lock();
    match command {
        DeadLetterCommand::List {
            db,
            status,
            queue,
            tenant,
            kind,
            after,
            limit,
            json,
        } => {
            let filter = DeadLetterFilter {
                status,
                queue,
                tenant_id: tenant,
                kind,
                after: after.map(DeadLetterId),
                limit,
            };
            let store = Store::connect(&db.database_url).await?;
            dead_letters::list(&store, &filter, json, out).await
        }
        DeadLetterCommand::Show { db, id } => {
            let store = Store::connect(&db.database_url).await?;
            dead_letters::show(&store, DeadLetterId(id), out).await
        }
        DeadLetterCommand::Discard { db, tenant, ids } => {
            let store = Store::connect(&db.database_url).await?;
            let ids: Vec<DeadLetterId> = ids.into_iter().map(DeadLetterId).collect();
            dead_letters::discard(&store, &ids, tenant, out).await
        }
    }
}

fn validate(file: &PathBuf, lines: bool) -> ExitCode {
    let input: Box<dyn std::io::Read> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(file).with_context(|| format!("opening {}", file.display())) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        }
    };
    match validate::run(input, lines, &mut std::io::stdout().lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn block_on<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(work)
}

fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

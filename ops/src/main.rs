//! `jobsctl`: the operator's command line of softcrum-jobs, and its reference composition
//! root: the one place where adapters are chosen and wired to the library crates.

mod bulk;
mod cron;
mod dead_letters;
#[cfg(feature = "demo")]
mod demo;
mod publish;
mod qstash;
mod validate;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use jobs_core::{DeadLetterFilter, DeadLetterId, DeadLetterStatus, Kind, QueueName, TenantId};
use jobs_ops::compose::{self, ComposeError, Config, Queue, Store};

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  failure: an operation failed (or an envelope is invalid); a bulk run can be re-run
  2  usage or configuration error (bad flag or value, unknown URL scheme, unreadable jobs.toml)
  3  not confirmed: the prompt was declined, or --yes is missing and stdin is not a terminal";

/// Operate softcrum-jobs: publish jobs, review and replay dead letters, migrate stores, watch
/// queues, validate envelopes.
#[derive(Debug, Parser)]
#[command(
    name = "jobsctl",
    version,
    about,
    long_about = "Operate softcrum-jobs: publish jobs, review and replay dead letters, migrate \
                  stores, watch queues, validate envelopes.\n\nConfiguration: each setting comes \
                  from its flag, else its environment variable, else its key in jobs.toml \
                  (--config PATH or JOBS_CONFIG, else ./jobs.toml when present), else its \
                  default. `jobsctl config` shows what is in effect and where it came from.",
    after_long_help = EXIT_CODES,
)]
struct Cli {
    #[command(flatten)]
    config: ConfigFlags,
    #[command(subcommand)]
    command: Command,
}

/// The configuration flags, accepted by every command.
#[derive(Debug, Args)]
#[command(next_help_heading = "Configuration (flag > environment > jobs.toml > default)")]
struct ConfigFlags {
    /// The configuration file [env: JOBS_CONFIG] [default: ./jobs.toml when present].
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The store: sqlite://PATH or postgres://USER@HOST:PORT/DB [env: DATABASE_URL]
    /// [jobs.toml: database_url] [default: sqlite://.jobs/jobs.db].
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// The queue transport: memory:, postgres-queue://USER@HOST:PORT/DB,
    /// vercel-queues://REGION, qstash: or qstash://REGION [env: JOBS_QUEUE_URL] [jobs.toml: queue_url]
    /// [default: memory:, which lives in this process only].
    #[arg(long, global = true, value_name = "URL")]
    queue_url: Option<String>,
    /// The rate limiter: memory: or redis://HOST:PORT [env: JOBS_RATE_LIMIT_URL]
    /// [jobs.toml: rate_limit_url] [default: memory:].
    #[arg(long, global = true, value_name = "URL")]
    rate_limit_url: Option<String>,
    /// Where alerts go: console or betterstack [env: JOBS_ALERTER] [jobs.toml: alerter]
    /// [default: console].
    #[arg(long, global = true, value_name = "NAME")]
    alerter: Option<String>,
}

impl ConfigFlags {
    fn resolve(&self) -> Result<Config, ComposeError> {
        let mut flags = BTreeMap::new();
        for (name, value) in [
            ("--database-url", &self.database_url),
            ("--queue-url", &self.queue_url),
            ("--rate-limit-url", &self.rate_limit_url),
            ("--alerter", &self.alerter),
        ] {
            if let Some(value) = value {
                flags.insert(name, value.clone());
            }
        }
        Ok(Config::from_process(&flags, self.config.clone())?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the worker runtime on the embedded defaults and narrate what happens.
    ///
    /// Needs nothing but this binary: an in-memory queue, a SQLite store in a temporary file,
    /// console alerts, the Resend fake in process. Ignores the configuration. (Built with the
    /// default `demo` feature, which links the test kit's fakes.)
    ///
    /// Example:
    ///   jobsctl demo
    #[cfg(feature = "demo")]
    #[command(verbatim_doc_comment)]
    Demo,
    /// Create or update the store's tables (`core.processed_jobs`, `core.dead_letters`).
    ///
    /// Idempotent. Workers never migrate on their own: run this on deploy.
    ///
    /// Examples:
    ///   jobsctl migrate
    ///   jobsctl migrate --database-url postgres://postgres@127.0.0.1:5432/app
    #[command(verbatim_doc_comment)]
    Migrate,
    /// Publish one job through the configured queue and print its job id.
    ///
    /// Builds the envelope (a fresh UUIDv7 job id; the correlation id defaults to the job id),
    /// validates it exactly as consumers will, then publishes it now, after --delay, or at
    /// --at. With --json, prints the job id with the transport's receipt.
    ///
    /// Examples:
    ///   jobsctl publish --queue billing.invoices --kind billing.invoice_issued \
    ///     --tenant 0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90 --data '{"invoice":42}'
    ///   jobsctl publish --queue billing.invoices --kind billing.invoice_issued \
    ///     --tenant 0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90 --data @invoice.json --delay 10m --json
    #[command(verbatim_doc_comment)]
    #[command(after_long_help = EXIT_CODES)]
    Publish(publish::PublishArgs),
    /// Work with envelopes.
    #[command(subcommand)]
    Envelope(EnvelopeCommand),
    /// Review, replay and discard dead letters.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLetterCommand),
    /// Depth per queue (ready, delayed, in flight) from the configured transport.
    ///
    /// The queues are the --queue flags, else JOBS_QUEUES / `queues` in jobs.toml, else the
    /// queues the transport holds messages in (the PostgreSQL queue lists them), else the
    /// queues of the standard periodic tasks.
    ///
    /// Examples:
    ///   jobsctl queues
    ///   jobsctl queues --queue billing.invoices --queue notify.email --json
    #[command(verbatim_doc_comment)]
    Queues {
        /// A queue to report on (repeatable).
        #[arg(long = "queue", value_name = "QUEUE")]
        queues: Vec<QueueName>,
        /// One JSON object per queue instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Housekeeping.
    #[command(subcommand)]
    Cleanup(CleanupCommand),
    /// The periodic tasks fanned out per tenant.
    #[command(subcommand)]
    Cron(CronCommand),
    /// The transactional outbox.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// QStash operations.
    #[command(subcommand)]
    Qstash(QstashCommand),
    /// Serve the operations console: dead letters reviewed, replayed and discarded, and the
    /// queues' depth, in a browser.
    ///
    /// Operators sign in with a token of JOBS_CONSOLE_TOKENS (`console_tokens` in jobs.toml);
    /// a token written SECRET@TENANT_ID sees that tenant's letters only. --no-auth serves
    /// without sign-in, and only on a loopback address. Runs until SIGTERM or Ctrl-C.
    ///
    /// Examples:
    ///   JOBS_CONSOLE_TOKENS=a-long-operator-secret jobsctl console --listen 127.0.0.1:8080
    ///   jobsctl console --listen 127.0.0.1:8080 --no-auth
    #[command(verbatim_doc_comment)]
    Console {
        /// Where to listen.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// No sign-in: every visitor is an operator (loopback addresses only).
        #[arg(long)]
        no_auth: bool,
    },
    /// Show the configuration in effect and where each value came from (secrets hidden).
    ///
    /// Examples:
    ///   jobsctl config
    ///   JOBS_QUEUE_URL=memory: jobsctl config --config ./deploy/jobs.toml --json
    #[command(verbatim_doc_comment)]
    Config {
        /// One JSON object per key instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum CronCommand {
    /// List the tasks with their schedules, queues and next slots (UTC).
    ///
    /// Examples:
    ///   jobsctl cron list
    ///   jobsctl cron list --json
    #[command(verbatim_doc_comment)]
    List {
        /// One JSON object per task instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Fire one slot by hand; with --dry-run, print what would be published.
    ///
    /// Tenants come from core.tenants of the PostgreSQL store; jobs go to the configured
    /// durable queue. Each job id derives from (task, tenant, slot), so firing a slot again,
    /// by hand or by a scheduler, publishes duplicates the queue and consumers drop.
    ///
    /// Examples:
    ///   jobsctl cron tick --at 2026-12-01T03:00:00Z --dry-run --database-url postgres://…
    ///   jobsctl cron tick --at 2026-12-01T03:00:00Z --queue-url postgres-queue://…
    #[command(verbatim_doc_comment)]
    #[command(after_long_help = EXIT_CODES)]
    Tick {
        /// The slot, RFC 3339 (e.g. 2026-12-01T03:00:00Z).
        #[arg(long, value_parser = cron::parse_time)]
        at: std::time::SystemTime,
        /// Plan the fan-out without publishing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run the scheduler: tick every 30 s, firing each task's due slot over the tenants of
    /// core.tenants to the configured durable queue, until SIGTERM or SIGINT.
    ///
    /// Several may run at once (one per replica): a slot fired twice publishes the same job
    /// ids, which the queue and the consumers drop.
    ///
    /// Examples:
    ///   jobsctl cron run --database-url postgres://… --queue-url postgres-queue://…
    #[command(verbatim_doc_comment)]
    Run,
}

/// The transactional outbox (PostgreSQL).
#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// Forward committed core.outbox rows to the configured durable queue, batch after
    /// batch, until SIGTERM or SIGINT (the batch under way finishes first).
    ///
    /// Examples:
    ///   jobsctl outbox relay --database-url postgres://… --queue-url postgres-queue://…
    #[command(verbatim_doc_comment)]
    Relay,
}

// The examples are for `--help`, where a URL is plain text.
#[allow(rustdoc::bare_urls)]
#[derive(Debug, Subcommand)]
enum QstashCommand {
    /// Check an Upstash-Signature the way the receiver does, and say why it fails.
    ///
    /// For debugging refused deliveries: give the header, the URL the receiver serves and the
    /// raw body. Keys come from QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY (or
    /// qstash.*_signing_key in jobs.toml). Exits 0 when valid, 1 when not, 2 on usage errors.
    ///
    /// Examples:
    ///   jobsctl qstash verify --signature "$SIG" --url https://app.example.com/qstash/billing.invoices --body body.json
    ///   jobsctl qstash verify --signature "$SIG" --url https://app.example.com/q --body - --at 2026-12-01T03:00:00Z --json
    #[command(verbatim_doc_comment)]
    #[command(after_long_help = EXIT_CODES)]
    Verify(qstash::VerifyArgs),
}

/// Which dead letters a bulk command selects.
#[derive(Debug, Args)]
pub(crate) struct Selection {
    /// The dead letters' ids.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<i64>,
    /// Every dead letter matching the filters (asks for confirmation unless --yes).
    #[arg(long)]
    all: bool,
    /// With --all: only this status [default: pending_review].
    #[arg(long, value_parser = parse_status, requires = "all")]
    status: Option<DeadLetterStatus>,
    /// With --all: only this queue.
    #[arg(long, requires = "all")]
    queue: Option<QueueName>,
    /// Only this tenant's letters (with ids: refuse the others).
    #[arg(long)]
    tenant: Option<TenantId>,
    /// With --all: only this kind.
    #[arg(long, requires = "all")]
    kind: Option<Kind>,
    /// Act without asking (required when standard input is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// One JSON object per letter instead of text lines.
    #[arg(long)]
    json: bool,
    /// Test hook: stop after this many letters, as an interruption would.
    #[arg(long, hide = true)]
    stop_after: Option<usize>,
}

#[derive(Debug, Subcommand)]
enum DeadLetterCommand {
    /// List dead letters, oldest first.
    ///
    /// Examples:
    ///   jobsctl dead-letters list --status pending_review --queue billing.invoices
    ///   jobsctl dead-letters list --after 200 --limit 100 --json
    #[command(verbatim_doc_comment)]
    List {
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
    /// Show one dead letter in full, payload included.
    ///
    /// Examples:
    ///   jobsctl dead-letters show 42
    ///   jobsctl dead-letters show 42 --json | jq .payload
    #[command(verbatim_doc_comment)]
    Show {
        /// The dead letter's id.
        id: i64,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Publish dead letters again to their queues (same job id), marking them replayed.
    ///
    /// Replaying releases the job's claim in processed_jobs, then publishes under the dedup
    /// key dead-letter-ID: repeating a replay is harmless. With --all, the matching letters
    /// are snapshotted into a run journaled in the store (core.bulk_runs) first; re-running
    /// the same command after an interruption, here or on any machine, resumes that run, so nothing is skipped (a letter marked
    /// replayed but not yet published is published) and nothing finished is done again.
    ///
    /// Examples:
    ///   jobsctl dead-letters replay 42 43
    ///   jobsctl dead-letters replay --all --queue billing.invoices --tenant 0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90
    ///   jobsctl dead-letters replay --all --kind billing.invoice_issued --yes --json
    #[command(verbatim_doc_comment)]
    #[command(after_long_help = EXIT_CODES)]
    Replay(Selection),
    /// Mark dead letters discarded (only from pending_review; repeating is harmless).
    ///
    /// With --all, resumable like replay.
    ///
    /// Examples:
    ///   jobsctl dead-letters discard 42 43 --tenant 0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90
    ///   jobsctl dead-letters discard --all --queue billing.invoices --kind billing.test --yes
    #[command(verbatim_doc_comment)]
    #[command(after_long_help = EXIT_CODES)]
    Discard(Selection),
}

#[derive(Debug, Subcommand)]
enum CleanupCommand {
    /// Delete processed_jobs rows older than a duration, in bounded batches.
    ///
    /// Keep rows well past the longest a message can live in your transport: a redelivery
    /// that finds no row runs again.
    ///
    /// Examples:
    ///   jobsctl cleanup processed --older-than 30d
    ///   jobsctl cleanup processed --older-than 1h30m --json
    #[command(verbatim_doc_comment)]
    Processed {
        /// Age: a number with a unit, several largest first (ms, s, m, h, d), e.g. 30d, 12h,
        /// 1h30m; up to 36500d.
        #[arg(long, value_parser = dead_letters::older_than)]
        older_than: std::time::Duration,
        /// A JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn parse_status(s: &str) -> Result<DeadLetterStatus, String> {
    s.parse().map_err(|_: jobs_core::StoreError| {
        "accepted values: pending_review, replayed, discarded".to_owned()
    })
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
    ///   producer | jobsctl envelope validate --lines --json -
    #[command(verbatim_doc_comment)]
    Validate {
        /// The file to read, or `-` for standard input.
        #[arg(default_value = "-")]
        file: PathBuf,
        /// Read one envelope per line (JSON Lines).
        #[arg(long)]
        lines: bool,
        /// One JSON object per envelope instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// An error the operator's input caused: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);

/// The operator did not confirm a bulk action: exit code 3.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotConfirmed(pub(crate) String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Envelope(EnvelopeCommand::Validate { file, lines, json }) = &cli.command {
        return validate(file, *lines, *json);
    }
    #[cfg(feature = "demo")]
    if let Command::Demo = cli.command {
        return finish(block_on(async {
            demo::run(&mut std::io::stdout().lock()).await
        }));
    }
    let config = match cli.config.resolve() {
        Ok(config) => config,
        Err(e) => return finish(Err(e.into())),
    };
    finish(block_on(run(cli.command, config)))
}

async fn run(command: Command, config: Config) -> Result<()> {
    let out = &mut std::io::stdout().lock();
    match command {
        #[cfg(feature = "demo")]
        Command::Demo => unreachable!("handled before configuration"),
        Command::Envelope(_) => unreachable!("handled before configuration"),
        Command::Config { json } => show_config(&config, json, out),
        Command::Migrate => {
            let store = Store::connect(&config).await?;
            store.migrate().await.context("applying migrations")?;
            writeln!(out, "migrations applied")?;
            Ok(())
        }
        Command::Publish(args) => {
            let queue = durable_queue(&config, "publish").await?;
            publish::run(&queue, args, out).await
        }
        Command::Queues { queues, json } => {
            let queue = Queue::connect(&config).await?;
            let names = if !queues.is_empty() {
                queues
            } else if let Some(list) = config.get(&compose::QUEUES) {
                list.split(',')
                    .map(|name| name.trim().parse::<QueueName>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| Usage(format!("{}: {e}", compose::QUEUES.describe())))?
            } else {
                listed(&queue).await?
            };
            if !queue.durable {
                eprintln!(
                    "note: the {}: queue lives in this process only, so its depth is always 0 here",
                    queue.scheme
                );
            }
            dead_letters::queues(&queue, &names, json, out).await
        }
        Command::DeadLetters(command) => dead_letter_command(command, &config, out).await,
        Command::Console { listen, no_auth } => console(&config, listen, no_auth).await,
        Command::Cron(CronCommand::List { json }) => cron::list(json, out),
        Command::Cron(CronCommand::Tick { at, dry_run }) => {
            let store = Store::connect(&config).await?;
            let queue = if dry_run {
                None
            } else {
                Some(durable_queue(&config, "cron tick").await?)
            };
            cron::tick(&store, queue.as_ref(), at, out).await
        }
        Command::Cron(CronCommand::Run) => {
            let store = Store::connect(&config).await?;
            let queue = durable_queue(&config, "cron run").await?;
            jobs_ops::process::init_tracing(config.get(&compose::LOG_FORMAT).unwrap_or("human"))?;
            cron::run(&store, &queue).await
        }
        Command::Outbox(OutboxCommand::Relay) => {
            let Store::Postgres(store) = Store::connect(&config).await? else {
                return Err(Usage(format!(
                    "the outbox lives in PostgreSQL (core.outbox): set {} to a postgres:// URL",
                    compose::DATABASE_URL.describe()
                ))
                .into());
            };
            let queue = durable_queue(&config, "the outbox relay").await?;
            jobs_ops::process::init_tracing(config.get(&compose::LOG_FORMAT).unwrap_or("human"))?;
            let relay =
                jobs_adapter_postgres::OutboxRelay::new(store.pool().clone(), queue.publisher);
            until_signal(|stop| jobs_ops::standing::run_relay(relay, stop)).await;
            Ok(())
        }
        Command::Qstash(QstashCommand::Verify(args)) => {
            let keys = compose::qstash_signing_keys(&config)?;
            if qstash::verify(&keys, &args, out)? {
                Ok(())
            } else {
                anyhow::bail!("the signature is not valid for this delivery")
            }
        }
        Command::Cleanup(CleanupCommand::Processed { older_than, json }) => {
            let store = Store::connect(&config).await?;
            dead_letters::cleanup(&store, older_than, json, out).await
        }
    }
}

/// `jobsctl console`: the console over the configured store and queue, until a stop signal.
async fn console(config: &Config, listen: std::net::SocketAddr, no_auth: bool) -> Result<()> {
    use jobs_ops::console::{Console, ConsoleToken};
    let tokens: Vec<ConsoleToken> = config
        .get(&compose::CONSOLE_TOKENS)
        .map(ConsoleToken::parse_list)
        .transpose()
        .map_err(|e| Usage(format!("{}: {e}", compose::CONSOLE_TOKENS.describe())))?
        .unwrap_or_default();
    if no_auth && !listen.ip().is_loopback() {
        return Err(Usage(format!(
            "--no-auth serves without sign-in, so only on a loopback address, not {listen}"
        ))
        .into());
    }
    if !no_auth && tokens.is_empty() {
        return Err(Usage(format!(
            "the console needs sign-in tokens: set {} (or --no-auth on a loopback address)",
            compose::CONSOLE_TOKENS.describe()
        ))
        .into());
    }
    let store = Store::connect(config).await?;
    let queue = durable_queue(config, "the console's replays").await?;
    jobs_ops::process::init_tracing(config.get(&compose::LOG_FORMAT).unwrap_or("human"))?;
    let mut console = if no_auth {
        Console::without_sign_in(store.dead_letters(), queue.publisher.clone())
    } else {
        Console::new(store.dead_letters(), queue.publisher.clone(), tokens)
    }
    .bulk_runs(store.bulk_runs())
    .replay_rate(compose::console_replay_rate(config)?);
    if let Some(tenants) = store.tenants() {
        console = console.tenants(tenants);
    }
    if let Some(depth) = queue.depth.clone() {
        let names = listed(&queue).await?;
        console = console.depth(depth, names);
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    eprintln!("console on http://{listen}/");
    axum::serve(listener, console.router())
        .with_graceful_shutdown(jobs_ops::process::stop_signal())
        .await
        .context("serving the console")?;
    Ok(())
}

/// The configured queue, refusing the default in-process one for commands whose messages
/// must outlive this process: an explicitly configured `memory:` is obeyed, with a warning.
async fn durable_queue(config: &Config, what: &str) -> Result<Queue> {
    let queue = Queue::connect(config).await?;
    if !queue.durable {
        let explicit = config
            .setting(&compose::QUEUE_URL)
            .is_some_and(|s| s.source != compose::Source::Default);
        if !explicit {
            return Err(Usage(format!(
                "no queue is configured, and what {what} sends to the default in-process \
                 memory: queue is lost when jobsctl exits; set {}",
                compose::QUEUE_URL.describe()
            ))
            .into());
        }
        eprintln!(
            "warning: the {}: queue lives in this process only: what {what} sends is lost when \
             jobsctl exits",
            queue.scheme
        );
    }
    Ok(queue)
}

fn show_config(config: &Config, json: bool, out: &mut impl std::io::Write) -> Result<()> {
    if !json {
        writeln!(
            out,
            "{:<28} {:<28} {:<28} source",
            "key", "value", "environment"
        )?;
        if let Some(file) = config.file() {
            writeln!(out, "(configuration file: {})", file.display())?;
        }
    }
    for key in compose::KEYS {
        let setting = config.setting(key);
        let value = setting.map(|s| key.shown(&s.value));
        let source = setting.map_or_else(|| "unset".to_owned(), |s| s.source.to_string());
        if json {
            let line = serde_json::json!({
                "key": key.name,
                "value": value,
                "source": source,
                "env": key.env,
                "flag": key.flag,
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:<28} {:<28} {:<28} {source}",
                key.name,
                value.as_deref().unwrap_or("-"),
                key.env
            )?;
        }
    }
    Ok(())
}

async fn dead_letter_command(
    command: DeadLetterCommand,
    config: &Config,
    out: &mut impl std::io::Write,
) -> Result<()> {
    match command {
        DeadLetterCommand::List {
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
                ..DeadLetterFilter::default()
            };
            let store = Store::connect(config).await?;
            dead_letters::list(&store, &filter, json, out).await
        }
        DeadLetterCommand::Show { id, json } => {
            let store = Store::connect(config).await?;
            dead_letters::show(&store, DeadLetterId(id), json, out).await
        }
        DeadLetterCommand::Replay(selection) => {
            let store = Store::connect(config).await?;
            let queue = durable_queue(config, "replay").await?;
            bulk::run(
                bulk::Action::Replay,
                &store,
                Some(&queue),
                config,
                selection,
                out,
            )
            .await
        }
        DeadLetterCommand::Discard(selection) => {
            let store = Store::connect(config).await?;
            bulk::run(bulk::Action::Discard, &store, None, config, selection, out).await
        }
    }
}

fn validate(file: &PathBuf, lines: bool, json: bool) -> ExitCode {
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
    match validate::run(input, lines, json, &mut std::io::stdout().lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) if reader_left(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Who runs this `jobsctl`, as dead-letter histories record it: `$USER`, else `unknown user`.
fn operator() -> String {
    std::env::var("USER")
        .ok()
        .filter(|user| !user.is_empty())
        .unwrap_or_else(|| "unknown user".to_owned())
}

fn block_on<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(work)
}

/// The queues the transport holds messages in, when it can list them; else the standard
/// tasks' queues, said so on standard error.
async fn listed(queue: &Queue) -> Result<Vec<QueueName>> {
    // An in-process queue holds nothing in a one-shot command: the standard ones say more.
    if queue.durable
        && let Some(depth) = &queue.depth
        && let Some(names) = depth.queues().await?
    {
        return Ok(names);
    }
    eprintln!(
        "note: the {}: transport cannot list its queues; showing the standard ones \
         (name others with --queue or JOBS_QUEUES)",
        queue.scheme
    );
    cron::standard_queues()
}

/// Runs the loop `start` makes until SIGTERM or SIGINT, then lets it finish.
pub(crate) async fn until_signal<F>(start: impl FnOnce(tokio::sync::watch::Receiver<bool>) -> F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(start(stopped));
    jobs_ops::process::stop_signal().await;
    stop.send_replace(true);
    if let Err(e) = running.await {
        eprintln!("error: the loop failed: {e}");
    }
}

/// Whether `e` is standard output's reader going away (`jobsctl … --json | head`): the
/// output was wanted no further, so the command ends quietly.
fn reader_left(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn finish(result: Result<()>) -> ExitCode {
    let Err(e) = result else {
        return ExitCode::SUCCESS;
    };
    if reader_left(&e) {
        return ExitCode::SUCCESS;
    }
    eprintln!("error: {e:#}");
    if e.downcast_ref::<NotConfirmed>().is_some() {
        return ExitCode::from(3);
    }
    let usage = e.downcast_ref::<Usage>().is_some()
        || e.downcast_ref::<ComposeError>()
            .is_some_and(ComposeError::is_configuration);
    if usage {
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_command_has_help_with_an_example() {
        super::Cli::command().debug_assert();
        fn walk(command: &clap::Command, path: &str) {
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                if sub.has_subcommands() {
                    walk(sub, &path);
                    continue;
                }
                let help = sub
                    .get_long_about()
                    .or(sub.get_about())
                    .map(ToString::to_string)
                    .unwrap_or_default();
                assert!(
                    help.lines().any(|l| l.trim_start().starts_with("jobsctl ")),
                    "{path} has no example on a line of its own:\n{help}"
                );
            }
        }
        walk(&super::Cli::command(), "jobsctl");
    }

    #[test]
    fn secrets_hide_their_password_in_print_and_in_debug() {
        let key = &jobs_ops::compose::DATABASE_URL;
        assert!(key.secret);
        assert_eq!(key.shown("postgres://u:pw@h/db"), "postgres://u:…@h/db");
        assert_eq!(key.shown("memory:"), "memory:");
        assert_eq!(key.shown("token123"), "…");
        let env =
            |name: &str| (name == "DATABASE_URL").then(|| "postgres://u:hunter2@h/db".to_owned());
        let config = jobs_ops::compose::Config::resolve(
            &Default::default(),
            &env,
            &jobs_ops::compose::ConfigFile::None,
        )
        .expect("resolves");
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("postgres://u:…@h/db"),
            "{debug}"
        );
    }
}

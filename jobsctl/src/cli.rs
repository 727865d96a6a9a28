//! The command line: every command, its flags and its help (with examples), parsed by clap.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use jobs_core::{DeadLetterReason, DeadLetterStatus, Kind, QueueName, TenantId};
use jobs_ops::compose::{ComposeError, Config};

use crate::bulk::Selection;
use crate::{publish, qstash, values};

pub(crate) const EXIT_CODES: &str = "\
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
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) config: ConfigFlags,
    /// Who the dead letters' history records as acting (replays, discards, bulk runs)
    /// [default: $USER, else the name of this process's uid].
    #[arg(long = "as", global = true, value_name = "NAME")]
    pub(crate) acting_as: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The configuration flags, accepted by every command.
#[derive(Debug, Args)]
#[command(next_help_heading = "Configuration (flag > environment > jobs.toml > default)")]
pub(crate) struct ConfigFlags {
    /// The configuration file [env: JOBS_CONFIG] [default: ./jobs.toml when present].
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The store: sqlite://PATH or postgres://USER@HOST:PORT/DB [env: DATABASE_URL]
    /// [jobs.toml: database_url] [default: sqlite://.jobs/jobs.db].
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// The queue transport: postgres-queue: (the store's database), postgres-queue://USER@HOST:PORT/DB,
    /// vercel-queues://REGION, qstash:, qstash://REGION or memory: [env: JOBS_QUEUE_URL]
    /// [jobs.toml: queue_url] [default: postgres-queue: with a PostgreSQL store, the queue a
    /// worker on it runs; else memory:, which lives in this process only].
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
    pub(crate) fn resolve(&self) -> Result<Config, ComposeError> {
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
pub(crate) enum Command {
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
    /// Create or update the store's tables, and on PostgreSQL the queue's.
    ///
    /// On PostgreSQL, in the schema `core`: processed_jobs (each job's claim), dead_letters,
    /// dead_letter_events (their history), bulk_runs and bulk_run_items (the bulk replays'
    /// journal), tenants, jobs (the PostgreSQL queue), outbox, fair_queues and tenant_weights
    /// (fair fetching). On SQLite: processed_jobs, dead_letters, dead_letter_events, bulk_runs
    /// and bulk_run_items. Idempotent. Workers never migrate on their own: run this on deploy.
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
    /// "waited" is how long the queue's oldest ready job has waited (0s when none is ready):
    /// the latency a deployment scales on. A figure the transport cannot tell shows as "-"
    /// (null in JSON): QStash reports ready jobs only, Redis-counted depth no in-flight ones,
    /// and only the memory and PostgreSQL queues date their jobs.
    ///
    /// In flight counts every leased job: those whose handler runs, and those a worker has
    /// fetched ahead and not started. Per job a worker leases at most its concurrency; grouped,
    /// its running groups (each up to 64 jobs) and up to two groups more, so a grouped worker at
    /// concurrency 8 can show several hundred in flight while at most 8 groups run. The
    /// transports do not tell the two apart.
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
        /// A host name (NAME or NAME:PORT) the console answers besides IP addresses and
        /// localhost, added to JOBS_ALLOWED_HOSTS; may be given more than once.
        #[arg(long = "allowed-host", value_name = "NAME")]
        allowed_hosts: Vec<String>,
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
pub(crate) enum CronCommand {
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
        #[arg(long, value_parser = values::parse_time)]
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
pub(crate) enum OutboxCommand {
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
pub(crate) enum QstashCommand {
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

#[derive(Debug, Subcommand)]
pub(crate) enum DeadLetterCommand {
    /// List dead letters, oldest first.
    ///
    /// Examples:
    ///   jobsctl dead-letters list --status pending_review --queue billing.invoices
    ///   jobsctl dead-letters list --reason exhausted --json
    ///   jobsctl dead-letters list --after 200 --limit 100 --json
    #[command(verbatim_doc_comment)]
    List {
        /// pending_review, replayed or discarded.
        #[arg(long, value_parser = values::parse_status)]
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
        /// Only letters dead-lettered for this reason: poison, unknown_kind, permanent,
        /// exhausted, too_large or unforwardable (letters from before reasons were kept have
        /// none).
        #[arg(long, value_parser = values::parse_reason)]
        reason: Option<DeadLetterReason>,
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
pub(crate) enum CleanupCommand {
    /// Delete processed_jobs rows older than a duration.
    ///
    /// On PostgreSQL whole expired days go at once (the claims of the last expired day may
    /// wait for the next cleanup), elsewhere rows go in bounded batches.
    ///
    /// Keep rows well past the longest a message can live in your transport: a redelivery
    /// that finds no row runs again. Below 8 days (the longest a transport redelivers, plus
    /// one) the command refuses unless given --below-floor. The claims of jobs whose dead
    /// letters are pending review are kept at any age.
    ///
    /// Examples:
    ///   jobsctl cleanup processed --older-than 30d
    ///   jobsctl cleanup processed --older-than 8d --json
    ///   jobsctl cleanup processed --older-than 1h --below-floor
    #[command(verbatim_doc_comment)]
    Processed {
        /// Age: a number with a unit, several largest first (ms, s, m, h, d), e.g. 30d, 12h,
        /// 1h30m; at least 8d unless --below-floor; up to 36500d.
        #[arg(long, value_parser = values::older_than)]
        older_than: std::time::Duration,
        /// Allow an age below 8 days. A job its transport redelivers after its row is gone
        /// runs again (and its effects happen twice): only for a transport that cannot
        /// redeliver that late.
        #[arg(long)]
        below_floor: bool,
        /// A JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum EnvelopeCommand {
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
}

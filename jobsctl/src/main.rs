//! `jobsctl`: the operator's command line of softcrum-jobs, over the composition root of
//! `jobs-ops` with every adapter. `cargo install --path jobsctl` installs it.

mod bulk;
mod cli;
mod cron;
mod dead_letters;
#[cfg(feature = "demo")]
mod demo;
mod publish;
mod qstash;
mod validate;
mod values;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use jobs_core::{DeadLetterFilter, DeadLetterId, QueueName, Resolution};
use jobs_ops::compose::{self, ComposeError, Config, Queue, Store};

use cli::{
    CleanupCommand, Cli, Command, CronCommand, DeadLetterCommand, EnvelopeCommand, OutboxCommand,
    QstashCommand,
};

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
    if let Some(name) = cli.acting_as.as_deref().map(str::trim) {
        if name.is_empty() || name.chars().any(char::is_control) {
            eprintln!("error: --as: a name of visible characters, not `{name:?}`");
            return ExitCode::from(2);
        }
        let _ = ACTING_AS.set(name.to_owned());
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
            publish::run(&queue, &compose::envelope_limits(&config)?, args, out).await
        }
        Command::Queues { queues, json } => {
            let queue = Queue::connect(&config).await?;
            let names = if !queues.is_empty() {
                queues
            } else if let Some(named) = configured_queues(&config)? {
                named
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
        Command::Console {
            listen,
            no_auth,
            allowed_hosts,
        } => console(&config, listen, no_auth, &allowed_hosts).await,
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
                jobs_adapter_postgres::OutboxRelay::new(store.pool().clone(), queue.publisher)
                    .with_envelope_limits(compose::envelope_limits(&config)?);
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
        Command::Cleanup(CleanupCommand::Processed {
            older_than,
            below_floor,
            json,
        }) => {
            let store = Store::connect(&config).await?;
            dead_letters::cleanup(&store, older_than, below_floor, json, out).await
        }
    }
}

/// `jobsctl console`: the console over the configured store and queue, until a stop signal.
async fn console(
    config: &Config,
    listen: std::net::SocketAddr,
    no_auth: bool,
    allowed_hosts: &[String],
) -> Result<()> {
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
    .replay_rate(compose::console_replay_rate(config)?)
    .trusted_proxies(compose::console_trusted_proxies(config)?)
    .allowed_hosts(with_flags(compose::allowed_hosts(config)?, allowed_hosts)?);
    if let Some(url) = compose::console_public_url(config)? {
        console = console.public_url(url);
    }
    if let Some(tenants) = store.tenants() {
        console = console.tenants(tenants);
    }
    if let Some(depth) = queue.depth.clone() {
        // The queues JOBS_QUEUES names stay on the overview when they drain; the console keeps
        // those it saw holding messages for ten minutes too.
        let mut names = configured_queues(config)?.unwrap_or_default();
        for listed in listed(&queue).await? {
            if !names.contains(&listed) {
                names.push(listed);
            }
        }
        console = console.depth(depth, names);
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    eprintln!("console on http://{listen}/");
    let limits = jobs_ops::listen::ListenerLimits::default();
    let stop = jobs_ops::process::stop_signal();
    jobs_ops::listen::serve(listener, console.router(), limits, stop).await;
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
    let rows: Vec<[String; 4]> = compose::KEYS
        .iter()
        .map(|key| {
            let setting = config.setting(key);
            [
                key.name.to_owned(),
                setting.map_or_else(|| "-".to_owned(), |s| key.shown(&s.value)),
                key.env.to_owned(),
                setting.map_or_else(|| "unset".to_owned(), |s| s.source.to_string()),
            ]
        })
        .collect();
    if json {
        for (key, [name, value, env, source]) in compose::KEYS.iter().zip(&rows) {
            let value = config.setting(key).map(|_| value);
            let line = serde_json::json!({
                "key": name,
                "value": value,
                "source": source,
                "env": env,
                "flag": key.flag,
            });
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    // Each column as wide as its longest cell, so a long value does not push the next ones.
    let header = ["key", "value", "environment", "source"].map(str::to_owned);
    let width = |column: usize| {
        std::iter::once(&header)
            .chain(&rows)
            .map(|row| row[column].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths = [width(0), width(1), width(2)];
    let line = |row: &[String; 4]| {
        format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        )
    };
    writeln!(out, "{}", line(&header))?;
    if let Some(file) = config.file() {
        writeln!(out, "(configuration file: {})", file.display())?;
    }
    for row in &rows {
        writeln!(out, "{}", line(row))?;
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
            reason,
            after,
            limit,
            json,
        } => {
            let filter = DeadLetterFilter {
                status,
                queue,
                tenant_id: tenant,
                kind,
                reason,
                after: after.map(DeadLetterId),
                limit,
                ..DeadLetterFilter::default()
            };
            let store = Store::connect(config).await?;
            dead_letters::list(&store, &filter, json, out, &mut std::io::stderr()).await
        }
        DeadLetterCommand::Show { id, json } => {
            let store = Store::connect(config).await?;
            dead_letters::show(&store, DeadLetterId(id), json, out).await
        }
        DeadLetterCommand::Replay(selection) => {
            let store = Store::connect(config).await?;
            let queue = durable_queue(config, "replay").await?;
            bulk::run(Resolution::Replay, &store, Some(&queue), selection, out).await
        }
        DeadLetterCommand::Discard(selection) => {
            let store = Store::connect(config).await?;
            bulk::run(Resolution::Discard, &store, None, selection, out).await
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

/// `--as NAME`, when given: who the dead-letter histories record.
static ACTING_AS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Who runs this `jobsctl`, as dead-letter histories record it: `--as NAME`, else `$USER`,
/// else the name `/etc/passwd` gives this process's uid (containers and CI often set no
/// `$USER`), else `uid N`, else `unknown user`.
fn operator() -> String {
    if let Some(name) = ACTING_AS.get() {
        return name.clone();
    }
    std::env::var("USER")
        .ok()
        .filter(|user| !user.is_empty())
        .or_else(uid_name)
        .unwrap_or_else(|| "unknown user".to_owned())
}

/// This process's real uid, by name where `/etc/passwd` has it (`uid N` where it does not).
fn uid_name() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_owned();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid).then(|| name.to_owned())
    });
    Some(name.unwrap_or_else(|| format!("uid {uid}")))
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
/// The queues [`compose::QUEUES`] names, if it is set; refused naming the key when one is no
/// queue name.
fn configured_queues(config: &Config) -> Result<Option<Vec<QueueName>>> {
    let Some(list) = config.get(&compose::QUEUES) else {
        return Ok(None);
    };
    let names = (list.split(','))
        .map(|name| name.trim().parse::<QueueName>())
        .collect::<Result<_, _>>()
        .map_err(|e| Usage(format!("{}: {e}", compose::QUEUES.describe())))?;
    Ok(Some(names))
}

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

/// `hosts` with the names `--allowed-host` adds, each checked as `JOBS_ALLOWED_HOSTS`' entries are.
fn with_flags(
    hosts: jobs_ops::hosts::AllowedHosts,
    flags: &[String],
) -> Result<jobs_ops::hosts::AllowedHosts, Usage> {
    flags.iter().try_fold(hosts, |hosts, flag| {
        let parsed = jobs_ops::hosts::AllowedHosts::parse_list(flag)
            .map_err(|e| Usage(format!("--allowed-host: {e}")))?;
        Ok(hosts.merged(parsed))
    })
}

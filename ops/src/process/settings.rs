//! The settings of a worker process: the flags a binary may offer ([`ProcessFlags`]), and the
//! keys only a worker process reads, each refused by name when it cannot work.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;

use jobs_core::{QueueName, TenantFairness};

use super::{ProcessError, refused};
use crate::compose::{
    CONCURRENCY, ComposeError, Config, DATABASE_URL, FAIR, HTTP_ADDR, Key, LOG_FORMAT, QUEUE_URL,
    SHUTDOWN_GRACE,
};

/// The settings a binary may offer as flags of its own command line, flattened with
/// `#[command(flatten)]`; unset flags fall back to the environment, `jobs.toml` and the
/// defaults, as for `jobsctl`. They are global: a binary with subcommands takes them before
/// or after its subcommand (`billing-worker run --http-addr …`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProcessFlags {
    /// The configuration file [env: JOBS_CONFIG] [default: ./jobs.toml when present].
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The store [env: DATABASE_URL].
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// The queue transport [env: JOBS_QUEUE_URL] [default: the store's own, on PostgreSQL].
    #[arg(long, global = true, value_name = "URL")]
    pub queue_url: Option<String>,
    /// Where /healthz, /readyz and /metrics are served [env: JOBS_HTTP_ADDR]
    /// [default: 127.0.0.1:9464].
    #[arg(long, global = true, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// Log lines: human or json [env: JOBS_LOG_FORMAT] [default: human].
    #[arg(long, global = true, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Jobs (grouped: groups of jobs) each queue's worker runs at once [env: JOBS_CONCURRENCY]
    /// [default: 8].
    #[arg(long, global = true, value_name = "N")]
    pub concurrency: Option<String>,
    /// How long in-flight jobs may finish after a stop signal, e.g. 30s or 1m30s
    /// [env: JOBS_SHUTDOWN_GRACE] [default: 30s].
    #[arg(long, global = true, value_name = "DURATION")]
    pub shutdown_grace: Option<String>,
}

impl ProcessFlags {
    /// The configuration these flags resolve to in this process.
    pub fn resolve(&self) -> Result<Config, ComposeError> {
        let keys: [(&Key, &Option<String>); 6] = [
            (&DATABASE_URL, &self.database_url),
            (&QUEUE_URL, &self.queue_url),
            (&HTTP_ADDR, &self.http_addr),
            (&LOG_FORMAT, &self.log_format),
            (&CONCURRENCY, &self.concurrency),
            (&SHUTDOWN_GRACE, &self.shutdown_grace),
        ];
        let mut flags = BTreeMap::new();
        for (key, value) in keys {
            if let (Some(flag), Some(value)) = (key.flag, value) {
                flags.insert(flag, value.clone());
            }
        }
        Ok(Config::from_process(&flags, self.config.clone())?)
    }
}

/// The queues [`FAIR`] names, each with its fairness: `QUEUE` or `QUEUE=LIMIT`.
pub(super) fn fair_queues(
    config: &Config,
) -> Result<HashMap<QueueName, TenantFairness>, ProcessError> {
    let mut fair = HashMap::new();
    let Some(value) = config.get(&FAIR) else {
        return Ok(fair);
    };
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, limit) = match item.split_once('=') {
            Some((name, limit)) => (name.trim(), Some(limit.trim())),
            None => (item, None),
        };
        let queue: QueueName = name
            .parse()
            .map_err(|e| refused(&FAIR, &format!("`{name}` is not a queue name: {e}")))?;
        let mut fairness = TenantFairness::round_robin();
        if let Some(limit) = limit {
            let limit = limit.parse::<NonZeroU32>().map_err(|_| {
                refused(
                    &FAIR,
                    &format!("the limit of `{name}`, `{limit}`, is not a whole number above zero"),
                )
            })?;
            fairness = fairness.limit(limit);
        }
        if fair.insert(queue, fairness).is_some() {
            return Err(refused(&FAIR, &format!("names `{name}` twice")));
        }
    }
    Ok(fair)
}

/// The most jobs a worker of a process runs at once: each holds a connection (or a group of
/// jobs) and a task, so a larger number only exhausts the database, and an absurd one would
/// abort the process allocating for it.
pub(super) const MAX_CONCURRENCY: usize = 4_096;

/// A whole number from `key`, from 1 to `max`.
pub(super) fn positive(config: &Config, key: &Key, max: usize) -> Result<usize, ProcessError> {
    let value = config.require(key)?;
    match value.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(refused(
            key,
            &format!("`{value}` is not a whole number from 1 to {max}"),
        )),
    }
}

/// Where [`HTTP_ADDR`] says the endpoints are served.
pub(super) fn socket_addr(config: &Config) -> Result<SocketAddr, ProcessError> {
    let value = config.require(&HTTP_ADDR)?;
    value.parse().map_err(|_| {
        refused(
            &HTTP_ADDR,
            &format!("`{value}` is not an address such as 127.0.0.1:9464"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compose::Source;

    #[test]
    fn a_binary_flattens_the_process_flags_into_its_own_command_line() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            process: ProcessFlags,
            /// A flag of the binary's own.
            #[arg(long)]
            dry_run: bool,
        }
        let cli = Cli::parse_from([
            "billing-worker",
            "--concurrency",
            "16",
            "--http-addr",
            "0.0.0.0:9464",
            "--dry-run",
        ]);
        assert!(cli.dry_run);
        assert_eq!(cli.process.concurrency.as_deref(), Some("16"));
        let config = cli.process.resolve().expect("resolves");
        assert_eq!(config.get(&CONCURRENCY), Some("16"));
        assert_eq!(
            config.setting(&HTTP_ADDR).map(|s| s.source.clone()),
            Some(Source::Flag)
        );
    }

    #[test]
    fn the_process_flags_are_taken_after_a_subcommand_too() {
        use clap::{Parser, Subcommand};
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            process: ProcessFlags,
            #[command(subcommand)]
            command: Command,
        }
        #[derive(Subcommand, PartialEq, Debug)]
        enum Command {
            Run,
            Migrate,
        }
        let after = Cli::try_parse_from(["billing-worker", "run", "--http-addr", "0.0.0.0:1"])
            .expect("a flag after the subcommand");
        assert_eq!(after.command, Command::Run);
        assert_eq!(after.process.http_addr.as_deref(), Some("0.0.0.0:1"));
        let before = Cli::try_parse_from(["billing-worker", "--concurrency", "4", "migrate"])
            .expect("a flag before it");
        assert_eq!(before.process.concurrency.as_deref(), Some("4"));
    }
}

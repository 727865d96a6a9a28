//! The configuration keys, each with its flag, environment variable, `jobs.toml` name and
//! default, and the typed readers of keys whose values are more than text.

use std::time::Duration;

use jobs_core::DecodeLimits;

use crate::hosts::{AllowedHosts, PublicUrl};

use super::{Config, ConfigError, DurationRange, Key};

/// The store's URL.
pub const DATABASE_URL: Key = Key {
    name: "database_url",
    flag: Some("--database-url"),
    env: "DATABASE_URL",
    default: Some("sqlite://.jobs/jobs.db"),
    secret: true,
    about: "the store: sqlite://PATH or postgres://USER@HOST:PORT/DB",
};

/// The queue transport's URL.
pub const QUEUE_URL: Key = Key {
    name: "queue_url",
    flag: Some("--queue-url"),
    env: "JOBS_QUEUE_URL",
    default: Some("memory:"),
    secret: true,
    about: "the queue transport: postgres-queue: (the store's database; the default when database_url is PostgreSQL), postgres-queue://…, vercel-queues://REGION, qstash://[REGION] or memory: (in this process only)",
};

/// The rate limiter's URL.
pub const RATE_LIMIT_URL: Key = Key {
    name: "rate_limit_url",
    flag: Some("--rate-limit-url"),
    env: "JOBS_RATE_LIMIT_URL",
    default: Some("memory:"),
    secret: true,
    about: "the rate limiter: memory: or redis://HOST:PORT",
};

/// The prefix of the rate limiter's Redis keys.
pub const RATE_LIMIT_PREFIX: Key = Key {
    name: "rate_limit_prefix",
    flag: None,
    env: "JOBS_RATE_LIMIT_PREFIX",
    default: Some("jobs:rate"),
    secret: false,
    about: "the prefix of the rate limiter's Redis keys",
};

/// Which alerter raises alerts.
pub const ALERTER: Key = Key {
    name: "alerter",
    flag: Some("--alerter"),
    env: "JOBS_ALERTER",
    default: Some("console"),
    secret: false,
    about: "where alerts go: console or betterstack",
};

/// The BetterStack Uptime API token.
pub const BETTERSTACK_TOKEN: Key = Key {
    name: "betterstack.token",
    flag: None,
    env: "BETTERSTACK_TOKEN",
    default: None,
    secret: true,
    about: "BetterStack Uptime API token (alerter = betterstack)",
};

/// The BetterStack user incidents are raised on behalf of.
pub const BETTERSTACK_REQUESTER_EMAIL: Key = Key {
    name: "betterstack.requester_email",
    flag: None,
    env: "BETTERSTACK_REQUESTER_EMAIL",
    default: None,
    secret: false,
    about: "the BetterStack user incidents are raised for (alerter = betterstack)",
};

/// BetterStack's base URL.
pub const BETTERSTACK_BASE_URL: Key = Key {
    name: "betterstack.base_url",
    flag: None,
    env: "BETTERSTACK_BASE_URL",
    // jobs_adapter_betterstack::DEFAULT_BASE_URL, which a build without the adapter lacks.
    default: Some("https://uptime.betterstack.com"),
    secret: false,
    about: "BetterStack's API base URL (a local fake in tests)",
};

/// Where transports without a depth API keep an approximate one.
pub const DEPTH_URL: Key = Key {
    name: "depth_url",
    flag: None,
    env: "JOBS_DEPTH_URL",
    default: None,
    secret: true,
    about: "redis://… counting depth for transports that report none (vercel-queues)",
};

/// The OIDC token Vercel Queues accepts.
pub const VERCEL_QUEUES_TOKEN: Key = Key {
    name: "vercel_queues.token",
    flag: None,
    env: "VERCEL_OIDC_TOKEN",
    default: None,
    secret: true,
    about: "the OIDC token for Vercel Queues (queue_url = vercel-queues://REGION)",
};

/// Where Vercel Queues is reached instead of the region's endpoint.
pub const VERCEL_QUEUES_BASE_URL: Key = Key {
    name: "vercel_queues.base_url",
    flag: None,
    env: "VERCEL_QUEUES_BASE_URL",
    default: None,
    secret: false,
    about: "Vercel Queues' base URL instead of the region's (an emulator in tests)",
};

/// The Vercel Queues consumer group workers receive as.
pub const VERCEL_QUEUES_CONSUMER_GROUP: Key = Key {
    name: "vercel_queues.consumer_group",
    flag: None,
    env: "VERCEL_QUEUES_CONSUMER_GROUP",
    // jobs_adapter_vercel_queues::DEFAULT_CONSUMER_GROUP, which a build without it lacks.
    default: Some("workers"),
    secret: false,
    about: "the Vercel Queues consumer group workers receive as",
};

/// The deployment Vercel Queues messages are isolated to.
pub const VERCEL_DEPLOYMENT_ID: Key = Key {
    name: "vercel_queues.deployment_id",
    flag: None,
    env: "VERCEL_DEPLOYMENT_ID",
    default: None,
    secret: false,
    about: "isolates Vercel Queues messages per deployment (shared when unset)",
};

/// The QStash API token.
pub const QSTASH_TOKEN: Key = Key {
    name: "qstash.token",
    flag: None,
    env: "QSTASH_TOKEN",
    default: None,
    secret: true,
    about: "the QStash API token (queue_url = qstash:)",
};

/// Where QStash is reached instead of the URL's region.
pub const QSTASH_BASE_URL: Key = Key {
    name: "qstash.base_url",
    flag: None,
    env: "QSTASH_URL",
    default: None,
    secret: false,
    about: "QStash's base URL instead of the region's (a local QStash in tests)",
};

/// The endpoint QStash delivers each queue to.
pub const QSTASH_DESTINATION: Key = Key {
    name: "qstash.destination",
    flag: None,
    env: "QSTASH_DESTINATION",
    default: None,
    secret: false,
    about: "the endpoint QStash delivers to, {queue} replaced by the queue name",
};

/// The key QStash signs deliveries with now.
pub const QSTASH_CURRENT_SIGNING_KEY: Key = Key {
    name: "qstash.current_signing_key",
    flag: None,
    env: "QSTASH_CURRENT_SIGNING_KEY",
    default: None,
    secret: true,
    about: "the key QStash signs deliveries with (jobsctl qstash verify)",
};

/// The key QStash will sign deliveries with after a rotation.
pub const QSTASH_NEXT_SIGNING_KEY: Key = Key {
    name: "qstash.next_signing_key",
    flag: None,
    env: "QSTASH_NEXT_SIGNING_KEY",
    default: None,
    secret: true,
    about: "the key QStash signs with after a rotation (jobsctl qstash verify)",
};

/// The queues `jobsctl queues` reports on.
pub const QUEUES: Key = Key {
    name: "queues",
    flag: None,
    env: "JOBS_QUEUES",
    default: None,
    secret: false,
    about: "queues to report on, comma-separated (an array in jobs.toml)",
};

/// Where a worker process serves `/healthz`, `/readyz` and `/metrics`.
pub const HTTP_ADDR: Key = Key {
    name: "http_addr",
    flag: Some("--http-addr"),
    env: "JOBS_HTTP_ADDR",
    default: Some("127.0.0.1:9464"),
    secret: false,
    about: "where a worker process serves /healthz, /readyz and /metrics (0.0.0.0:9464 in a container)",
};

/// How a worker process writes its logs.
pub const LOG_FORMAT: Key = Key {
    name: "log_format",
    flag: Some("--log-format"),
    env: "JOBS_LOG_FORMAT",
    default: Some("human"),
    secret: false,
    about: "log lines of a worker process: human or json (the filter is RUST_LOG, default info)",
};

/// How many jobs (or groups) each queue's worker runs at once in a worker process.
pub const CONCURRENCY: Key = Key {
    name: "concurrency",
    flag: Some("--concurrency"),
    env: "JOBS_CONCURRENCY",
    default: Some("8"),
    secret: false,
    about: "jobs (groups, on the PostgreSQL queue) each queue's worker runs at once; sizes the pool",
};

/// The longest envelope, in bytes, that a publish, the outbox and the workers accept.
pub const MAX_ENVELOPE_BYTES: Key = Key {
    name: "max_envelope_bytes",
    flag: None,
    env: "JOBS_MAX_ENVELOPE_BYTES",
    default: Some("1048576"),
    secret: false,
    about: "the longest envelope in bytes any publish, outbox or worker accepts (1024 to 67108864)",
};

/// The values [`MAX_ENVELOPE_BYTES`] accepts: from 1 KiB (an envelope's ids alone take a
/// few hundred bytes) to 64 MiB (a job carries references to large data, not the data).
pub const MAX_ENVELOPE_BYTES_RANGE: std::ops::RangeInclusive<usize> = 1024..=64 << 20;

/// [`MAX_ENVELOPE_BYTES`] as the limits the adapters publish and the workers decode with:
/// one setting, so nothing is published that a worker refuses.
pub fn envelope_limits(config: &Config) -> Result<DecodeLimits, ConfigError> {
    let value = config.require(&MAX_ENVELOPE_BYTES)?;
    match value.parse::<usize>() {
        Ok(n) if MAX_ENVELOPE_BYTES_RANGE.contains(&n) => Ok(DecodeLimits::default().max_bytes(n)),
        _ => Err(MAX_ENVELOPE_BYTES.invalid(format_args!(
            "`{value}` is not a whole number of bytes from {} to {}",
            MAX_ENVELOPE_BYTES_RANGE.start(),
            MAX_ENVELOPE_BYTES_RANGE.end()
        ))),
    }
}

/// Whether a worker's errors quote the payload values a handler's data type refused.
pub const ERROR_VALUES: Key = Key {
    name: "error_values",
    flag: None,
    env: "JOBS_ERROR_VALUES",
    default: Some("off"),
    secret: false,
    about: "on: errors of data that does not fit its handler quote the values found, in last_error, logs and alerts (debugging only)",
};

/// How long a worker process lets in-flight jobs finish after a stop signal.
pub const SHUTDOWN_GRACE: Key = Key {
    name: "shutdown_grace",
    flag: Some("--shutdown-grace"),
    env: "JOBS_SHUTDOWN_GRACE",
    default: Some("30s"),
    secret: false,
    about: "how long in-flight jobs may finish after SIGTERM (e.g. 30s, 1m30s; up to 1d)",
};

/// How long connecting to the store may take before it fails with its cause.
pub const CONNECT_TIMEOUT: Key = Key {
    name: "connect_timeout",
    flag: None,
    env: "JOBS_CONNECT_TIMEOUT",
    default: Some("5s"),
    secret: false,
    about: "how long the first connection to PostgreSQL may take (e.g. 5s, 500ms; up to 1d)",
};

/// Whether a worker process runs the cron scheduler.
pub const CRON: Key = Key {
    name: "cron",
    flag: None,
    env: "JOBS_CRON",
    default: Some("off"),
    secret: false,
    about: "on: a worker process also ticks the cron scheduler (tenants from core.tenants)",
};

/// Whether a worker process runs the outbox relay.
pub const OUTBOX_RELAY: Key = Key {
    name: "outbox_relay",
    flag: None,
    env: "JOBS_OUTBOX_RELAY",
    default: Some("off"),
    secret: false,
    about: "on: a worker process also forwards core.outbox to its queue (PostgreSQL)",
};

/// Which queues of a worker process are fetched fairly across tenants, and their per-tenant
/// limits.
pub const FAIR: Key = Key {
    name: "fair",
    flag: None,
    env: "JOBS_FAIR",
    default: None,
    secret: false,
    about: "queues fetched fairly across tenants, comma-separated, each QUEUE or QUEUE=LIMIT \
            (at most LIMIT jobs of one tenant in flight)",
};

/// The operations console's sign-in tokens.
pub const CONSOLE_TOKENS: Key = Key {
    name: "console_tokens",
    flag: None,
    env: "JOBS_CONSOLE_TOKENS",
    default: None,
    secret: true,
    about: "the console's sign-in tokens, comma-separated, each [NAME=]SECRET[@TENANT_ID]: \
            every tenant, or with @ that tenant only; NAME is who the dead letters' history \
            records; secrets of 16 characters or more",
};

/// How fast the console's bulk replays publish.
pub const CONSOLE_REPLAY_RATE: Key = Key {
    name: "console_replay_rate",
    flag: None,
    env: "JOBS_CONSOLE_REPLAY_RATE",
    default: Some("20"),
    secret: false,
    about: "replays a second the console's bulk runs publish, so a thousand replays do not \
            land on the queue at once",
};

/// The host names the HTTP listeners answer besides IP literals and `localhost`.
pub const ALLOWED_HOSTS: Key = Key {
    name: "allowed_hosts",
    flag: None,
    env: "JOBS_ALLOWED_HOSTS",
    default: None,
    secret: false,
    about: "host names (comma-separated, NAME or NAME:PORT) the console and a worker's endpoints answer besides IP addresses and localhost; others get 421",
};

/// [`ALLOWED_HOSTS`] as the listeners check it.
pub fn allowed_hosts(config: &Config) -> Result<AllowedHosts, ConfigError> {
    match config.get(&ALLOWED_HOSTS) {
        None => Ok(AllowedHosts::new()),
        Some(list) => AllowedHosts::parse_list(list).map_err(|e| ALLOWED_HOSTS.invalid(e)),
    }
}

/// Where operators reach the console when it is not the listener's own address.
pub const CONSOLE_PUBLIC_URL: Key = Key {
    name: "console.public_url",
    flag: None,
    env: "JOBS_CONSOLE_PUBLIC_URL",
    default: None,
    secret: false,
    about: "the console's URL behind a proxy (https://… makes its cookie Secure and __Host-); its origin is accepted on forms",
};

/// [`CONSOLE_PUBLIC_URL`], when set.
pub fn console_public_url(config: &Config) -> Result<Option<PublicUrl>, ConfigError> {
    (config.get(&CONSOLE_PUBLIC_URL))
        .map(|url| PublicUrl::parse(url).map_err(|e| CONSOLE_PUBLIC_URL.invalid(e)))
        .transpose()
}

/// The proxies whose `X-Forwarded-For` the console believes.
pub const CONSOLE_TRUSTED_PROXIES: Key = Key {
    name: "console.trusted_proxies",
    flag: None,
    env: "JOBS_CONSOLE_TRUSTED_PROXIES",
    default: None,
    secret: false,
    about: "addresses of the proxies (comma-separated) whose X-Forwarded-For names the client sign-ins are throttled and logged by",
};

/// [`CONSOLE_TRUSTED_PROXIES`]: none unless set.
pub fn console_trusted_proxies(config: &Config) -> Result<Vec<std::net::IpAddr>, ConfigError> {
    let Some(list) = config.get(&CONSOLE_TRUSTED_PROXIES) else {
        return Ok(vec![]);
    };
    (list.split(',').map(str::trim).filter(|s| !s.is_empty()))
        .map(|s| {
            s.parse().map_err(|_| {
                CONSOLE_TRUSTED_PROXIES.invalid(format_args!("`{s}` is not an IP address"))
            })
        })
        .collect()
}

/// [`CONSOLE_REPLAY_RATE`]: a whole number of replays a second, at least 1.
pub fn console_replay_rate(config: &Config) -> Result<u32, ConfigError> {
    let value = config.require(&CONSOLE_REPLAY_RATE)?;
    match value.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CONSOLE_REPLAY_RATE.invalid(format_args!(
            "`{value}` is not a whole number of replays a second above zero"
        ))),
    }
}

/// The durations [`SHUTDOWN_GRACE`] accepts: up to a day.
pub const SHUTDOWN_GRACE_RANGE: DurationRange = DurationRange::up_to(Duration::from_secs(86_400));

/// The durations [`CONNECT_TIMEOUT`] accepts: up to a day.
pub const CONNECT_TIMEOUT_RANGE: DurationRange = DurationRange::up_to(Duration::from_secs(86_400));

/// [`SHUTDOWN_GRACE`], within [`SHUTDOWN_GRACE_RANGE`].
pub fn shutdown_grace(config: &Config) -> Result<Duration, ConfigError> {
    config.duration(&SHUTDOWN_GRACE, SHUTDOWN_GRACE_RANGE)
}

/// [`CONNECT_TIMEOUT`], within [`CONNECT_TIMEOUT_RANGE`].
pub fn connect_timeout(config: &Config) -> Result<Duration, ConfigError> {
    config.duration(&CONNECT_TIMEOUT, CONNECT_TIMEOUT_RANGE)
}

/// Every configuration key, in the order `jobsctl config` prints them.
pub const KEYS: &[Key] = &[
    DATABASE_URL,
    QUEUE_URL,
    RATE_LIMIT_URL,
    RATE_LIMIT_PREFIX,
    ALERTER,
    BETTERSTACK_TOKEN,
    BETTERSTACK_REQUESTER_EMAIL,
    BETTERSTACK_BASE_URL,
    DEPTH_URL,
    VERCEL_QUEUES_TOKEN,
    VERCEL_QUEUES_BASE_URL,
    VERCEL_QUEUES_CONSUMER_GROUP,
    VERCEL_DEPLOYMENT_ID,
    QSTASH_TOKEN,
    QSTASH_BASE_URL,
    QSTASH_DESTINATION,
    QSTASH_CURRENT_SIGNING_KEY,
    QSTASH_NEXT_SIGNING_KEY,
    QUEUES,
    HTTP_ADDR,
    LOG_FORMAT,
    CONCURRENCY,
    MAX_ENVELOPE_BYTES,
    ERROR_VALUES,
    SHUTDOWN_GRACE,
    CONNECT_TIMEOUT,
    CRON,
    OUTBOX_RELAY,
    FAIR,
    CONSOLE_TOKENS,
    CONSOLE_REPLAY_RATE,
    CONSOLE_TRUSTED_PROXIES,
    CONSOLE_PUBLIC_URL,
    ALLOWED_HOSTS,
    VERCEL_QUEUES_PUSH,
    VERCEL_QUEUES_TRUST_PUSHED,
];

/// Whether a worker process takes Vercel Queues' push callbacks instead of pulling.
pub const VERCEL_QUEUES_PUSH: Key = Key {
    name: "vercel_queues.push",
    flag: None,
    env: "VERCEL_QUEUES_PUSH",
    default: Some("off"),
    secret: false,
    about: "on: a worker process serves Vercel Queues' callbacks on POST /vercel/queues instead of pulling",
};

/// Whether pushed callback payloads run without their receipt handle being confirmed.
pub const VERCEL_QUEUES_TRUST_PUSHED: Key = Key {
    name: "vercel_queues.trust_pushed_payload",
    flag: None,
    env: "VERCEL_QUEUES_TRUST_PUSHED_PAYLOAD",
    default: Some("off"),
    secret: false,
    about: "on: run pushed payloads unconfirmed (only on a route the platform alone can reach)",
};

//! Configuration: every key a `jobsctl` or a worker process reads, where each value comes
//! from, and the typed values some keys hold.
//!
//! **Precedence:** a command-line flag, else the environment variable, else the key in the
//! configuration file (`--config PATH` / `JOBS_CONFIG`, else `./jobs.toml` when present), else
//! the default. [`KEYS`] lists every key; [`Config`] is every key resolved. This module knows
//! no adapter: the composition root (`compose`) builds the ports from a [`Config`].

mod duration;
mod keys;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

pub use duration::{
    DurationError, DurationRange, DurationRefused, format_duration, parse_duration,
};
pub use keys::*;

/// One configuration key: its flag, environment variable, `jobs.toml` name and default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Its name in `jobs.toml`; dotted for a table (`betterstack.token` is `token` under
    /// `[betterstack]`).
    pub name: &'static str,
    /// The command-line flag, for the keys that have one.
    pub flag: Option<&'static str>,
    /// The environment variable.
    pub env: &'static str,
    /// The value when nothing sets it.
    pub default: Option<&'static str>,
    /// Whether printing the configuration hides the value (tokens, URLs with passwords).
    pub secret: bool,
    /// What it configures.
    pub about: &'static str,
}

impl Key {
    /// `value` as it may be printed. A secret URL keeps everything but its password (in the
    /// user part, or a `password=` parameter): `postgres://app:…@db:5432/jobs`. Any other
    /// secret (a token) is `…`.
    pub fn shown(&self, value: &str) -> String {
        if !self.secret {
            return value.to_owned();
        }
        match value.split_once("://") {
            Some((scheme, rest)) => format!("{scheme}://{}", without_password(rest)),
            None if value.ends_with(':') => value.to_owned(),
            None => "…".to_owned(),
        }
    }

    /// Every way to set the key, for error messages: `--queue-url (JOBS_QUEUE_URL, queue_url)`.
    pub fn describe(&self) -> String {
        match self.flag {
            Some(flag) => format!("{flag} ({}, {} in jobs.toml)", self.env, self.name),
            None => format!("{} ({} in jobs.toml)", self.env, self.name),
        }
    }

    /// A malformed value of this key: `message` says what is wrong with it.
    pub(crate) fn invalid(&self, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            key: self.describe(),
            message: message.to_string(),
        }
    }
}

/// What follows `scheme://` in a URL with its password replaced by `…`: the one in
/// `user:password@`, and the value of any `password=` query parameter.
fn without_password(rest: &str) -> String {
    let (authority, tail) = rest
        .find(['/', '?', '#'])
        .map_or((rest, ""), |at| rest.split_at(at));
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:…@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                        format!("{name}=…")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{authority}{tail}")
}

/// The environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "JOBS_CONFIG";
/// The configuration file read when present and none is named.
pub const DEFAULT_CONFIG_FILE: &str = "jobs.toml";

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env,
    /// The configuration file.
    File(PathBuf),
    /// The key's default.
    Default,
    /// The key's default given what another key holds: [`QUEUE_URL`] is `postgres-queue:` (the
    /// store's own database) when [`DATABASE_URL`] is a PostgreSQL URL, so that the worker and
    /// `jobsctl` use the same queue from the same settings.
    Implied {
        /// What implied it, as messages say it (`database_url is PostgreSQL`).
        by: &'static str,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("flag"),
            Source::Env => f.write_str("env"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Default => f.write_str("default"),
            Source::Implied { by } => write!(f, "default, as {by}"),
        }
    }
}

/// A resolved value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The value.
    pub value: String,
    /// Its source.
    pub source: Source,
}

/// Which configuration file to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigFile {
    /// This file, which must exist.
    Required(PathBuf),
    /// This file when it exists (the default `./jobs.toml`).
    IfPresent(PathBuf),
    /// No file.
    None,
}

impl ConfigFile {
    /// The file named by `flag`, else by `JOBS_CONFIG` in `env`, else `./jobs.toml` if present.
    pub fn choose(flag: Option<PathBuf>, env: &dyn Fn(&str) -> Option<String>) -> ConfigFile {
        match flag.or_else(|| env(CONFIG_ENV).map(PathBuf::from)) {
            Some(path) => ConfigFile::Required(path),
            None => ConfigFile::IfPresent(PathBuf::from(DEFAULT_CONFIG_FILE)),
        }
    }
}

/// The configuration, every key resolved by precedence. Its `Debug` hides secrets as
/// `jobsctl config` does ([`Key::shown`]).
#[derive(Clone)]
pub struct Config {
    settings: BTreeMap<&'static str, Setting>,
    file: Option<PathBuf>,
}

/// What the shorthand `postgres-queue:` means: the PostgreSQL queue in [`DATABASE_URL`]'s own
/// database (`core.jobs` beside the store's tables).
pub const STORE_QUEUE: &str = "postgres-queue:";

/// Defaults that depend on another key: with a PostgreSQL [`DATABASE_URL`] and no
/// [`QUEUE_URL`] set, the queue is the one in the store's database ([`STORE_QUEUE`]), which a
/// worker runs grouped and `jobsctl` reaches alike.
fn imply_defaults(settings: &mut BTreeMap<&'static str, Setting>) {
    let postgres = settings.get(DATABASE_URL.name).is_some_and(|s| {
        s.value.starts_with("postgres://") || s.value.starts_with("postgresql://")
    });
    let queue_defaulted = settings
        .get(QUEUE_URL.name)
        .is_none_or(|s| s.source == Source::Default);
    if postgres && queue_defaulted {
        settings.insert(
            QUEUE_URL.name,
            Setting {
                value: STORE_QUEUE.to_owned(),
                source: Source::Implied {
                    by: "database_url is PostgreSQL",
                },
            },
        );
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut settings = f.debug_map();
        for key in KEYS {
            if let Some(setting) = self.setting(key) {
                settings.entry(
                    &key.name,
                    &format_args!("{} ({})", key.shown(&setting.value), setting.source),
                );
            }
        }
        settings.finish()?;
        if let Some(file) = &self.file {
            write!(f, " from {}", file.display())?;
        }
        Ok(())
    }
}

impl Config {
    /// Resolves every key of [`KEYS`]: `flags` (flag name → value given) first, then `env`,
    /// then `file`, then the default. An empty environment variable counts as unset. A file with
    /// a key this build does not know is an error, so a typo does not silently fall back.
    pub fn resolve(
        flags: &BTreeMap<&'static str, String>,
        env: &dyn Fn(&str) -> Option<String>,
        file: &ConfigFile,
    ) -> Result<Config, ConfigError> {
        let (path, from_file) = match file {
            ConfigFile::Required(path) => (Some(path.clone()), read_file(path)?),
            ConfigFile::IfPresent(path) if path.exists() => (Some(path.clone()), read_file(path)?),
            _ => (None, BTreeMap::new()),
        };
        let mut settings = BTreeMap::new();
        for key in KEYS {
            let flag = key.flag.and_then(|f| flags.get(f)).cloned();
            let setting = if let Some(value) = flag {
                Some((value, Source::Flag))
            } else if let Some(value) = env(key.env).filter(|v| !v.is_empty()) {
                Some((value, Source::Env))
            } else if let (Some(value), Some(path)) = (from_file.get(key.name), &path) {
                Some((value.clone(), Source::File(path.clone())))
            } else {
                key.default.map(|d| (d.to_owned(), Source::Default))
            };
            if let Some((value, source)) = setting {
                settings.insert(key.name, Setting { value, source });
            }
        }
        imply_defaults(&mut settings);
        Ok(Config {
            settings,
            file: path,
        })
    }

    /// Resolves from flags and this process's environment, reading the file `JOBS_CONFIG` or
    /// `config_flag` names (else `./jobs.toml` when present). The one place that reads the
    /// environment.
    pub fn from_process(
        flags: &BTreeMap<&'static str, String>,
        config_flag: Option<PathBuf>,
    ) -> Result<Config, ConfigError> {
        let env = |name: &str| std::env::var(name).ok();
        Config::resolve(flags, &env, &ConfigFile::choose(config_flag, &env))
    }

    /// The setting of `key`, if anything sets it.
    pub fn setting(&self, key: &Key) -> Option<&Setting> {
        self.settings.get(key.name)
    }

    /// The value of `key`, if anything sets it.
    pub fn get(&self, key: &Key) -> Option<&str> {
        self.setting(key).map(|s| s.value.as_str())
    }

    /// The value of `key`, or [`ConfigError::Missing`] naming how to set it.
    pub fn require(&self, key: &Key) -> Result<&str, ConfigError> {
        self.get(key).ok_or(ConfigError::Missing {
            key: key.describe(),
        })
    }

    /// Where `key`'s value came from, for messages: its flag, its environment variable, the
    /// file, or `the default`.
    pub fn origin(&self, key: &Key) -> String {
        match self.setting(key).map(|s| &s.source) {
            Some(Source::Flag) => key.flag.unwrap_or(key.name).to_owned(),
            Some(Source::Env) => key.env.to_owned(),
            Some(Source::File(path)) => path.display().to_string(),
            Some(Source::Default) | None => "the default".to_owned(),
            Some(Source::Implied { by }) => format!("the default, as {by}"),
        }
    }

    /// The duration `key` holds, within `range` (the key's own bounds); refused, the error
    /// names the key, where its value came from and the bounds:
    /// `shutdown_grace (from JOBS_SHUTDOWN_GRACE) must be a duration up to 1d: …`.
    pub fn duration(&self, key: &Key, range: DurationRange) -> Result<Duration, ConfigError> {
        range
            .parse(self.require(key)?)
            .map_err(|refused| ConfigError::BadValue {
                setting: format!("{} (from {})", key.name, self.origin(key)),
                message: refused.to_string(),
            })
    }

    /// Whether `key` is `on` (else `off`); any other value is refused, naming the key.
    pub fn switch(&self, key: &Key) -> Result<bool, ConfigError> {
        match self.require(key)? {
            "on" => Ok(true),
            "off" => Ok(false),
            other => Err(key.invalid(format_args!("`{other}` is neither on nor off"))),
        }
    }

    /// The configuration file that was read, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

/// The longest configuration file read: a `jobs.toml` takes a few kilobytes, and a path to
/// something else (`/dev/zero`, a log) is refused at this bound, not read until memory runs out.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

fn read_file(path: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let refused = |message: String| ConfigError::File {
        path: path.to_owned(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| refused(e.to_string()))?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_CONFIG_BYTES + 1),
        &mut text,
    )
    .map_err(|e| refused(e.to_string()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(refused(format!(
            "longer than {MAX_CONFIG_BYTES} bytes: not a configuration file"
        )));
    }
    let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let mut values = BTreeMap::new();
    flatten(path, "", &table, &mut values)?;
    Ok(values)
}

fn flatten(
    path: &Path,
    prefix: &str,
    table: &toml::Table,
    into: &mut BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    for (name, value) in table {
        let full = format!("{prefix}{name}");
        let bad = |what: &str| ConfigError::File {
            path: path.to_owned(),
            message: format!("`{full}`: {what}"),
        };
        if let toml::Value::Table(inner) = value {
            flatten(path, &format!("{full}."), inner, into)?;
            continue;
        }
        if !KEYS.iter().any(|k| k.name == full) {
            let known: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
            return Err(bad(&format!("unknown key (known: {})", known.join(", "))));
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("expected an array of strings"))?
                .join(","),
            _ => return Err(bad("expected a string")),
        };
        into.insert(full, text);
    }
    Ok(())
}

/// A configuration the operator must fix: a key missing, a value malformed, a file unreadable
/// (`jobsctl` exits 2 on any).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key the chosen adapter needs is not set.
    #[error("{key} is not set")]
    Missing {
        /// How the key is set.
        key: String,
    },
    /// A value is malformed.
    #[error("{key}: {message}")]
    Invalid {
        /// How the key is set.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value its key refuses, named with where it came from:
    /// `shutdown_grace (from JOBS_SHUTDOWN_GRACE) must be a duration up to 1d: …`.
    #[error("{setting} {message}")]
    BadValue {
        /// The key and where its value came from.
        setting: String,
        /// What the key accepts, and why the value is not that.
        message: String,
    },
    /// The configuration file cannot be read or holds something unexpected.
    #[error("configuration file {}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_url_shows_all_but_its_password() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db.internal:5432/jobs",
                "postgres://app:…@db.internal:5432/jobs",
            ),
            ("postgres://app@db/jobs", "postgres://app@db/jobs"),
            ("redis://:s3cret@cache:6379", "redis://:…@cache:6379"),
            (
                "postgres://db/jobs?sslmode=require&password=s3cret",
                "postgres://db/jobs?sslmode=require&password=…",
            ),
            ("postgres://a:b@c@host/db", "postgres://a:…@host/db"),
            ("sqlite://.jobs/jobs.db", "sqlite://.jobs/jobs.db"),
            ("memory:", "memory:"),
        ] {
            assert_eq!(DATABASE_URL.shown(url), shown, "{url}");
            assert!(!DATABASE_URL.shown(url).contains("s3cret"), "{url}");
        }
        assert_eq!(QSTASH_TOKEN.shown("eyJhbGciOi"), "…");
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn file_with(text: &str) -> tempfile_path::TempFile {
        tempfile_path::TempFile::new(text)
    }

    mod tempfile_path {
        /// A file in the temporary directory, removed on drop.
        pub(super) struct TempFile(pub(super) std::path::PathBuf);
        impl TempFile {
            pub(super) fn new(text: &str) -> TempFile {
                let path = std::env::temp_dir().join(format!(
                    "jobs-compose-{}-{}.toml",
                    std::process::id(),
                    jobs_core::JobId::generate()
                ));
                std::fs::write(&path, text).expect("write the file");
                TempFile(path)
            }
        }
        impl Drop for TempFile {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn a_postgresql_database_implies_its_own_queue_unless_a_queue_is_set() {
        let resolve = |env: &[(&str, &str)]| {
            Config::resolve(&BTreeMap::new(), &env_of(env), &ConfigFile::None).expect("resolves")
        };
        let pg = resolve(&[("DATABASE_URL", "postgres://u@h/db")]);
        let queue = pg.setting(&QUEUE_URL).expect("a queue");
        assert_eq!(queue.value, STORE_QUEUE);
        assert_eq!(
            format!("{} from {}", queue.source, pg.origin(&QUEUE_URL)),
            "default, as database_url is PostgreSQL from the default, as database_url is PostgreSQL"
        );
        let sqlite = resolve(&[("DATABASE_URL", "sqlite://x.db")]);
        assert_eq!(sqlite.get(&QUEUE_URL), Some("memory:"));
        let set = resolve(&[
            ("DATABASE_URL", "postgresql://u@h/db"),
            ("JOBS_QUEUE_URL", "memory:"),
        ]);
        assert_eq!(
            set.setting(&QUEUE_URL).map(|s| (&*s.value, &s.source)),
            Some(("memory:", &Source::Env)),
            "a queue set is obeyed"
        );
    }

    #[test]
    fn flags_beat_the_environment_which_beats_the_file_which_beats_the_default() {
        let file = file_with(
            "database_url = \"sqlite://from-file.db\"\nqueue_url = \"memory:file\"\n\
             alerter = \"betterstack\"\n[betterstack]\nrequester_email = \"a@b.c\"\n",
        );
        let env = env_of(&[
            ("DATABASE_URL", "sqlite://from-env.db"),
            ("JOBS_QUEUE_URL", "memory:env"),
            ("JOBS_ALERTER", ""),
        ]);
        let flags = BTreeMap::from([("--database-url", "sqlite://from-flag.db".to_owned())]);
        let config =
            Config::resolve(&flags, &env, &ConfigFile::Required(file.0.clone())).expect("resolves");
        let got = |key: &Key| config.setting(key).cloned().expect("set");
        assert_eq!(got(&DATABASE_URL).value, "sqlite://from-flag.db");
        assert_eq!(got(&DATABASE_URL).source, Source::Flag);
        assert_eq!(got(&QUEUE_URL).value, "memory:env");
        assert_eq!(got(&QUEUE_URL).source, Source::Env);
        assert_eq!(
            got(&ALERTER).value,
            "betterstack",
            "an empty variable is unset"
        );
        assert_eq!(got(&ALERTER).source, Source::File(file.0.clone()));
        assert_eq!(got(&BETTERSTACK_REQUESTER_EMAIL).value, "a@b.c");
        assert_eq!(got(&RATE_LIMIT_URL).source, Source::Default);
        assert!(config.get(&BETTERSTACK_TOKEN).is_none());
    }

    #[test]
    fn the_consoles_replay_rate_defaults_to_twenty_and_refuses_zero_naming_the_key() {
        let config = |value: Option<&str>| {
            let env: Vec<(&str, &str)> = value
                .map(|v| ("JOBS_CONSOLE_REPLAY_RATE", v))
                .into_iter()
                .collect();
            Config::resolve(&BTreeMap::new(), &env_of(&env), &ConfigFile::None).expect("a config")
        };
        assert_eq!(console_replay_rate(&config(None)).expect("the default"), 20);
        assert_eq!(console_replay_rate(&config(Some("5"))).expect("set"), 5);
        for bad in ["0", "-1", "fast", "99999999999"] {
            let e = console_replay_rate(&config(Some(bad))).expect_err(bad);
            assert!(e.to_string().contains("JOBS_CONSOLE_REPLAY_RATE"), "{e}");
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn an_unknown_key_in_the_file_is_an_error_naming_it() {
        let file = file_with("[betterstack]\ntokn = \"x\"\n");
        let err = Config::resolve(
            &BTreeMap::new(),
            &env_of(&[]),
            &ConfigFile::Required(file.0.clone()),
        )
        .expect_err("a typo");
        assert!(
            err.to_string().contains("`betterstack.tokn`: unknown key"),
            "{err}"
        );
        let missing = Config::resolve(
            &BTreeMap::new(),
            &env_of(&[]),
            &ConfigFile::Required("/no/such/jobs.toml".into()),
        )
        .expect_err("a named file must exist");
        assert!(matches!(missing, ConfigError::File { .. }), "{missing}");
        let absent = Config::resolve(
            &BTreeMap::new(),
            &env_of(&[]),
            &ConfigFile::IfPresent("/no/such/jobs.toml".into()),
        )
        .expect("the default file is optional");
        assert_eq!(absent.get(&QUEUE_URL), Some("memory:"));
    }

    #[test]
    fn durations_take_one_grammar_from_every_source_and_keep_each_keys_bounds() {
        let from = |env: &[(&str, &str)], flags: &[(&'static str, &str)], file: &str| {
            let file = file_with(file);
            let flags = flags
                .iter()
                .map(|(flag, value)| (*flag, (*value).to_owned()))
                .collect();
            let config =
                Config::resolve(&flags, &env_of(env), &ConfigFile::Required(file.0.clone()))
                    .expect("resolves");
            (shutdown_grace(&config), connect_timeout(&config), file)
        };
        let (grace, timeout, _) = from(
            &[("JOBS_SHUTDOWN_GRACE", "1m30s")],
            &[],
            "connect_timeout = \"500ms\"\n",
        );
        assert_eq!(grace.expect("1m30s"), Duration::from_secs(90));
        assert_eq!(timeout.expect("500ms"), Duration::from_millis(500));
        let (grace, _, _) = from(&[], &[("--shutdown-grace", "1h30m")], "");
        assert_eq!(grace.expect("1h30m"), Duration::from_secs(5_400));
        let (grace, _, _) = from(&[], &[], "");
        assert_eq!(grace.expect("the default"), Duration::from_secs(30));

        let (grace, _, _) = from(&[("JOBS_SHUTDOWN_GRACE", "90")], &[], "");
        let refused = grace.expect_err("no unit").to_string();
        assert!(
            refused.starts_with(
                "shutdown_grace (from JOBS_SHUTDOWN_GRACE) must be a duration up to 1d: `90` has \
                 a number without a unit: add one"
            ),
            "{refused}"
        );
        let (_, timeout, file) = from(&[], &[], "connect_timeout = 5\n");
        let refused = timeout.expect_err("a bare number in the file").to_string();
        assert!(
            refused.starts_with(&format!(
                "connect_timeout (from {}) must be a duration up to 1d: `5`",
                file.0.display()
            )),
            "{refused}"
        );
        let (grace, _, _) = from(&[], &[("--shutdown-grace", "2d")], "");
        let refused = grace.expect_err("longer than a day").to_string();
        assert_eq!(
            refused,
            "shutdown_grace (from --shutdown-grace) must be a duration up to 1d: `2d` is longer \
             than 1d"
        );
    }

    #[test]
    fn a_configurations_debug_hides_its_secrets() {
        let env =
            |name: &str| (name == "DATABASE_URL").then(|| "postgres://u:hunter2@h/db".to_owned());
        let config = Config::resolve(&BTreeMap::new(), &env, &ConfigFile::None).expect("resolves");
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("postgres://u:…@h/db"),
            "{debug}"
        );
        assert_eq!(DATABASE_URL.shown("token123"), "…");
    }
}

//! Configuration: every key a `jobsctl` or a worker process reads, where each value comes
//! from, and the typed values some keys hold.
//!
//! **Precedence:** a command-line flag, else the environment variable, else the key in the
//! configuration file (`--config PATH` / `JOBS_CONFIG`, else `./jobs.toml` when present), else
//! the default. [`KEYS`] lists every key; [`Config`] is every key resolved. This module knows
//! no adapter: [`crate::compose`] builds the ports from a [`Config`].

mod keys;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

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
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("flag"),
            Source::Env => f.write_str("env"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Default => f.write_str("default"),
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

    /// The configuration file that was read, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

fn read_file(path: &Path) -> Result<BTreeMap<String, String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
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

/// `500ms`, `30s`, `2m` or `1h`, at most a day.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "s" => n.checked_mul(1_000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    (ms <= 86_400_000).then(|| Duration::from_millis(ms))
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
    /// The configuration file cannot be read or holds something unexpected.
    #[error("configuration file {}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

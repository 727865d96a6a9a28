//! The composition root: adapters chosen from configuration by URL scheme.
//!
//! This is the one module a downstream binary copies or calls: library crates never read
//! configuration or the environment themselves; they receive ports built here.
//!
//! | URL | adapter |
//! | --- | --- |
//! | `sqlite://PATH` (or `sqlite:PATH`) | [`SqliteStore`], the file created on first use |
//! | `postgres://…`, `postgresql://…` | [`PgStore`] |

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use jobs_adapter_postgres::PgStore;
use jobs_adapter_sqlite::SqliteStore;
use jobs_core::{DeadLetterStore, ProcessedJobs};

/// The default store: a SQLite file in `./.jobs/`, the embedded default.
pub(crate) const DEFAULT_DATABASE_URL: &str = "sqlite://.jobs/jobs.db";

/// A store chosen by URL.
#[derive(Clone, Debug)]
pub(crate) enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl Store {
    /// Connects to the store `url` names (without migrating it).
    pub(crate) async fn connect(url: &str) -> Result<Store> {
        if let Some(path) = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
        {
            if let Some(dir) = std::path::Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
            }
            let store = SqliteStore::open(path)
                .await
                .with_context(|| format!("opening {path}"))?;
            return Ok(Store::Sqlite(store));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let store = PgStore::connect(url)
                .await
                .context("connecting to PostgreSQL")?;
            return Ok(Store::Postgres(store));
        }
        bail!("unsupported database URL (expected sqlite://PATH or postgres://…)")
    }

    /// Applies the store's migrations; idempotent.
    pub(crate) async fn migrate(&self) -> Result<()> {
        match self {
            Store::Sqlite(s) => s.migrate().await,
            Store::Postgres(s) => s.migrate().await,
        }
        .context("applying migrations")
    }

    /// The dead-letter port.
    pub(crate) fn dead_letters(&self) -> Arc<dyn DeadLetterStore> {
        match self {
            Store::Sqlite(s) => Arc::new(s.clone()),
            Store::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// The processed-jobs housekeeping port.
    pub(crate) fn processed(&self) -> Arc<dyn ProcessedJobs> {
        match self {
            Store::Sqlite(s) => Arc::new(s.clone()),
            Store::Postgres(s) => Arc::new(s.clone()),
        }
    }
}

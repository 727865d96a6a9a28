//! SQLite: the embedded default store (`sqlite://PATH`), the file created on first use.

use std::path::Path;
use std::sync::Arc;

use futures_util::FutureExt;
use jobs_adapter_sqlite::SqliteStore;
use jobs_core::{BulkRuns, DeadLetterStore, ProcessedJobs, StoreError, TenantDirectory};

use super::{Adapter, ComposeError, DATABASE_URL, Engine, Store};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "sqlite",
    store: Some(|_, url| store(url).boxed()),
    queue: None,
    rate_limiter: None,
    alerter: None,
    depth: None,
};

/// `sqlite://PATH` (or `sqlite:PATH`), creating the file's folder when missing.
async fn store(url: &str) -> Result<Store, ComposeError> {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or_default();
    if let Some(dir) = Path::new(path).parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| DATABASE_URL.invalid(format_args!("creating {}: {e}", dir.display())))?;
    }
    let store = SqliteStore::open(path).await.map_err(ComposeError::Store)?;
    Ok(Store::Sqlite(store))
}

#[async_trait::async_trait]
impl Engine for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        SqliteStore::migrate(self).await
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterStore> {
        Arc::new(self.clone())
    }

    fn bulk_runs(&self) -> Arc<dyn BulkRuns> {
        Arc::new(self.clone())
    }

    /// SQLite keeps no tenants.
    fn tenants(&self) -> Option<Arc<dyn TenantDirectory>> {
        None
    }

    fn processed(&self) -> Arc<dyn ProcessedJobs> {
        Arc::new(self.clone())
    }
}

//! A worker process over SQLite: its workers consume the transport [`QUEUE_URL`](crate::compose::QUEUE_URL) names, per
//! job (SQLite holds no queue, no tenants and no outbox).

use async_trait::async_trait;
use jobs_adapter_sqlite::SqliteStore;

use super::{Opened, ProcessError, ProcessStore, refused};
use crate::compose::{ComposeError, Config, DATABASE_URL, Store};

#[async_trait]
impl ProcessStore for SqliteStore {
    const ENGINE: &'static str = "SQLite";
    const SCHEMES: &'static [&'static str] = &["sqlite"];

    /// The store; its workers consume the transport [`QUEUE_URL`](crate::compose::QUEUE_URL) names.
    async fn open(config: &Config, _connections: u32) -> Result<Opened<SqliteStore>, ProcessError> {
        // Irrefutable in a build that composes no other store.
        #[allow(irrefutable_let_patterns)]
        let Store::Sqlite(store) = Store::connect(config).await? else {
            return Err(refused(&DATABASE_URL, "names a store other than SQLite"));
        };
        let pool = store.pool().clone();
        Ok(Opened {
            store,
            ping: Box::new(move || {
                let pool = pool.clone();
                Box::pin(async move {
                    jobs_adapter_sqlite::sqlx::query("select 1")
                        .execute(&pool)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("the store does not answer: {e}"))
                })
            }),
            tenants: None,
            relay: None,
            own: None,
        })
    }

    async fn migrated(config: &Config) -> Result<SqliteStore, ProcessError> {
        #[allow(irrefutable_let_patterns)]
        let Store::Sqlite(store) = Store::connect(config).await? else {
            return Err(refused(&DATABASE_URL, "names a store other than SQLite"));
        };
        store.migrate().await.map_err(ComposeError::Store)?;
        Ok(store)
    }
}

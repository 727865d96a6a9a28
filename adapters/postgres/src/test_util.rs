//! A throwaway PostgreSQL database for a module's own handler tests (feature `test-util`):
//! created with a unique name on a server the test names, migrated, handed to the test, and
//! dropped when the test ends, pass or fail. Nothing of the workspace's test kit comes with it.
//!
//! ```no_run
//! use jobs_adapter_postgres::test_util::with_test_database;
//! use jobs_core::{ConsumerName, JobId, WorkStore, WorkTransaction};
//!
//! # async fn test() {
//! let server = std::env::var("DATABASE_URL")
//!     .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
//! with_test_database(&server, |store| async move {
//!     let mut tx = store.begin().await.expect("a work transaction");
//!     // run the handler: `handler.handle(Job::new(envelope, 1), &mut tx).await`
//!     tx.commit().await.expect("commit");
//! })
//! .await;
//! # }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

use jobs_core::{JobId, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};

use crate::PgStore;
use crate::error::store_error;

/// Runs `test` with a [`PgStore`] on a fresh, migrated database of the server `server_url`
/// names (any database URL of it: the test's database is created beside it), then drops that
/// database (forcibly, so connections left open do not keep it), also when `test` panics; the
/// panic is then resumed. Panics, naming the server, when the server cannot be reached or
/// refuses to create a database: a test cannot go on without one.
pub async fn with_test_database<F, Fut, T>(server_url: &str, test: F) -> T
where
    F: FnOnce(PgStore) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let db = TestDatabase::create(server_url)
        .await
        .unwrap_or_else(|e| panic!("a test database on {}: {e}", shown(server_url)));
    let store = db.store.clone();
    let outcome = tokio::spawn(test(store)).await;
    db.store.pool().close().await;
    if let Err(e) = db.drop_database().await {
        tracing::warn!(error = %e, "the test database could not be dropped");
    }
    match outcome {
        Ok(value) => value,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("the test's task failed: {e}"),
        },
    }
}

/// The server URL without its password, for messages.
fn shown(url: &str) -> String {
    match url.parse::<PgConnectOptions>() {
        Ok(o) => format!("{}:{}", o.get_host(), o.get_port()),
        Err(_) => "the server DATABASE_URL names".to_owned(),
    }
}

/// A created and migrated database, and how to drop it.
struct TestDatabase {
    store: PgStore,
    server: PgConnectOptions,
    name: String,
}

impl TestDatabase {
    /// `jobs_test_<pid>_<n>_<id>`: unique across processes and runs, so a database left by a
    /// killed run never collides with a later one.
    async fn create(server_url: &str) -> Result<TestDatabase, StoreError> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let server: PgConnectOptions = server_url
            .parse()
            .map_err(|e| StoreError::failed(format!("not a PostgreSQL URL: {e}")))?;
        let server = server.disable_statement_logging();
        let name = format!(
            "jobs_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            JobId::generate().as_uuid().simple()
        );
        let mut admin = PgConnection::connect_with(&server)
            .await
            .map_err(|e| store_error("connect to the server", e))?;
        sqlx::query(AssertSqlSafe(format!("create database \"{name}\"")))
            .execute(&mut admin)
            .await
            .map_err(|e| store_error("create the test database", e))?;
        let options = server.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| store_error("connect to the test database", e))?;
        let store = PgStore::from_pool(pool);
        store.migrate().await?;
        Ok(TestDatabase {
            store,
            server,
            name,
        })
    }

    async fn drop_database(self) -> Result<(), StoreError> {
        let mut admin = PgConnection::connect_with(&self.server)
            .await
            .map_err(|e| store_error("connect to the server", e))?;
        sqlx::query(AssertSqlSafe(format!(
            "drop database if exists \"{}\" with (force)",
            self.name
        )))
        .execute(&mut admin)
        .await
        .map_err(|e| store_error("drop the test database", e))?;
        Ok(())
    }
}

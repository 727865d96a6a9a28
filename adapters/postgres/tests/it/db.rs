//! Throwaway databases for the tests: every test gets databases of its own with unique names,
//! dropped when it ends, pass or fail, so a leftover from a killed run never collides with a
//! later one. The server is `DATABASE_URL`, by default the local trust-auth `postgres` user.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use jobs_adapter_postgres::PgStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, PgPool};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Throwaway databases on the test server, each with a unique name.
pub(crate) struct Databases {
    admin: PgPool,
    server: PgConnectOptions,
    created: Mutex<Vec<String>>,
}

impl Databases {
    pub(crate) async fn connect() -> Arc<Self> {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
        let server = PgConnectOptions::from_str(&url)
            .expect("DATABASE_URL is a PostgreSQL URL")
            .disable_statement_logging();
        let admin = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(server.clone())
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} must be running for these tests: {e}"));
        Arc::new(Databases {
            admin,
            server,
            created: Mutex::new(vec![]),
        })
    }

    /// A new empty database; its name is `jobs_test_<pid>_<counter>_<random>`.
    pub(crate) async fn create(&self) -> PgConnectOptions {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let random = RandomState::new().hash_one((pid, n)) as u32;
        let name = format!("jobs_test_{pid}_{n}_{random:08x}");
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.clone());
        sqlx::query(AssertSqlSafe(format!("create database \"{name}\"")))
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        self.server.clone().database(&name)
    }

    /// A pool on a new empty database.
    pub(crate) async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(8)
            .connect_with(self.create().await)
            .await
            .expect("connect to the test database")
    }

    /// A migrated store on a new database.
    pub(crate) async fn store(&self) -> PgStore {
        let store = PgStore::from_pool(self.pool().await);
        store.migrate().await.expect("migrate");
        store
    }

    /// Drops every database created, `with (force)` so open connections do not stop it, and
    /// concurrently: one at a time, a dozen drops take seconds on a busy disk.
    pub(crate) async fn drop_all(&self) {
        let names =
            std::mem::take(&mut *self.created.lock().unwrap_or_else(PoisonError::into_inner));
        let mut drops = tokio::task::JoinSet::new();
        for name in names {
            let admin = self.admin.clone();
            drops.spawn(async move {
                sqlx::query(AssertSqlSafe(format!(
                    "drop database if exists \"{name}\" with (force)"
                )))
                .execute(&admin)
                .await
                .unwrap_or_else(|e| panic!("drop database {name}: {e}"));
            });
        }
        while let Some(dropped) = drops.join_next().await {
            dropped.expect("a drop task");
        }
    }
}

/// Runs `test` with fresh databases and drops them afterwards, also when `test` panics.
pub(crate) async fn with_databases<F, Fut>(test: F)
where
    F: FnOnce(Arc<Databases>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dbs = Databases::connect().await;
    let outcome = tokio::spawn(test(Arc::clone(&dbs))).await;
    dbs.drop_all().await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test task failed: {e}"),
        }
    }
}

//! A throwaway PostgreSQL database per test, dropped when the test ends. `jobsctl`'s tests
//! use this file too (by path): the database's name starts with the package's.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection};

/// A database named `<package>_<pid>_<n>_<id>`, dropped (forcibly) on [`TestDb::drop_db`].
pub(crate) struct TestDb {
    /// A URL of the database, for the `jobsctl` binary.
    pub(crate) url: String,
    name: String,
    server: PgConnectOptions,
}

impl TestDb {
    pub(crate) async fn create() -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let base = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let server = PgConnectOptions::from_str(&base)
            .expect("DATABASE_URL is a PostgreSQL URL")
            .disable_statement_logging();
        let name = format!(
            "{}_{}_{}_{}",
            env!("CARGO_PKG_NAME").replace('-', "_"),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            jobs_core::JobId::generate().as_uuid().simple()
        );
        let mut admin = PgConnection::connect_with(&server)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL must be running at DATABASE_URL: {e}"));
        sqlx::query(AssertSqlSafe(format!("create database \"{name}\"")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let url = match base.rsplit_once('/') {
            Some((server_part, _)) => format!("{server_part}/{name}"),
            None => format!("{base}/{name}"),
        };
        TestDb { url, name, server }
    }

    /// A database with the store's schema (`PgStore::migrate`), and a pool on it.
    pub(crate) async fn migrated() -> (TestDb, sqlx::PgPool) {
        let db = TestDb::create().await;
        let pool = db.pool().await;
        jobs_adapter_postgres::PgStore::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        (db, pool)
    }

    pub(crate) async fn pool(&self) -> sqlx::PgPool {
        PgPoolOptions::new()
            .max_connections(8)
            .connect_with(self.server.clone().database(&self.name))
            .await
            .expect("connect to the test database")
    }

    pub(crate) async fn drop_db(self) {
        let mut admin = PgConnection::connect_with(&self.server)
            .await
            .expect("connect to drop the test database");
        sqlx::query(AssertSqlSafe(format!(
            "drop database if exists \"{}\" with (force)",
            self.name
        )))
        .execute(&mut admin)
        .await
        .expect("drop the test database");
    }
}

/// Commits one `billing.invoices` job into `core.outbox`, as an application's transaction does.
pub(crate) async fn into_the_outbox(pool: &sqlx::PgPool) {
    let queue: jobs_core::QueueName = "billing.invoices".parse().expect("a queue");
    let job =
        jobs_testkit::fixtures::envelope_with(1, "billing.invoice_issued", serde_json::json!({}));
    let mut tx = pool.begin().await.expect("begin");
    jobs_adapter_postgres::Outbox::new()
        .publish_in(&mut tx, &queue, &job, Default::default())
        .await
        .expect("into the outbox");
    tx.commit().await.expect("commit");
}

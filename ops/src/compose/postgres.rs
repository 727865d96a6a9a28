//! PostgreSQL: the store (`postgres://…`), the PostgreSQL queue in a database's `core.jobs`
//! (`postgres-queue://…`), and a grouped worker's store and queue on one pool.

use std::sync::Arc;

use futures_util::FutureExt;
use jobs_adapter_postgres::sqlx::postgres::PgPoolOptions;
use jobs_adapter_postgres::{PgQueue, PgStore, PgTenantDirectory};
use jobs_consumers::WorkerConfig;
use jobs_core::{BulkRuns, DeadLetterStore, ProcessedJobs, StoreError, TenantDirectory};

use super::{
    Adapter, ComposeError, Config, DATABASE_URL, Engine, QUEUE_URL, Queue, STORE_QUEUE, Store,
    connect_timeout, envelope_limits, scheme,
};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "postgres",
    store: Some(|config, url| store(config, url).boxed()),
    queue: Some(|config, url| queue(config, url).boxed()),
    rate_limiter: None,
    alerter: None,
    depth: None,
};

/// `postgres://…`, within [`connect_timeout`](super::connect_timeout).
async fn store(config: &Config, url: &str) -> Result<Store, ComposeError> {
    let timeout = connect_timeout(config)?;
    let store = PgStore::connect_with(url, PgPoolOptions::new(), timeout)
        .await
        .map_err(ComposeError::Store)?;
    Ok(Store::Postgres(store))
}

#[async_trait::async_trait]
impl Engine for PgStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        PgStore::migrate(self).await
    }

    fn dead_letters(&self) -> Arc<dyn DeadLetterStore> {
        Arc::new(self.clone())
    }

    fn bulk_runs(&self) -> Arc<dyn BulkRuns> {
        Arc::new(self.clone())
    }

    fn tenants(&self) -> Option<Arc<dyn TenantDirectory>> {
        Some(Arc::new(PgTenantDirectory::new(self.pool().clone())))
    }

    fn processed(&self) -> Arc<dyn ProcessedJobs> {
        Arc::new(self.clone())
    }
}

/// `postgres-queue://…`: the PostgreSQL queue over `core.jobs` of the database the rest of the
/// URL names; `postgres-queue:` alone ([`STORE_QUEUE`], what a PostgreSQL [`DATABASE_URL`]
/// implies), the one in the store's own database. Its table comes with the store's
/// migrations (`jobsctl migrate` on that URL).
async fn queue(config: &Config, url: &str) -> Result<Queue, ComposeError> {
    let limits = envelope_limits(config)?;
    let database = queue_database(config, url)?;
    let store = PgStore::connect(&database)
        .await
        .map_err(|e| ComposeError::Queue(e.to_string()))?;
    let queue = PgQueue::new(store.pool().clone()).with_envelope_limits(limits);
    match queue.is_migrated().await {
        Ok(true) => Ok(Queue::pull(scheme(url), queue, true)),
        Ok(false) => Err(ComposeError::Queue(
            "that database has no core.jobs table: run `jobsctl migrate --database-url \
             postgres://…` on the same database first"
                .into(),
        )),
        Err(e) => Err(ComposeError::Queue(e.to_string())),
    }
}

/// The `postgres://` URL of the database whose `core.jobs` the queue URL `url` names.
fn queue_database(config: &Config, url: &str) -> Result<String, ComposeError> {
    if url == STORE_QUEUE || url == "postgresql-queue:" {
        let database = config.require(&DATABASE_URL)?;
        return match scheme(database) {
            "postgres" | "postgresql" => Ok(database.to_owned()),
            _ => Err(QUEUE_URL
                .invalid(
                    "`postgres-queue:` is the queue in the store's database, and database_url is \
                 no PostgreSQL URL: name the queue's database (postgres-queue://USER@HOST:PORT/DB)",
                )
                .into()),
        };
    }
    let rest = ["postgres-queue://", "postgresql-queue://"]
        .iter()
        .find_map(|prefix| url.strip_prefix(prefix))
        .ok_or_else(|| {
            QUEUE_URL.invalid(
                "expected postgres-queue: (the store's database) or \
                 postgres-queue://USER@HOST:PORT/DB",
            )
        })?;
    Ok(format!("postgres://{rest}"))
}

/// Whether the queue URL `url` names the store's own database: [`STORE_QUEUE`], or a
/// `postgres-queue://` URL with the host, port, database and user of [`DATABASE_URL`]. A
/// worker over such a queue runs grouped, on the store's pool.
pub fn is_store_queue(config: &Config, url: &str) -> bool {
    use jobs_adapter_postgres::sqlx::postgres::PgConnectOptions;
    let (Ok(queue), Some(store)) = (queue_database(config, url), config.get(&DATABASE_URL)) else {
        return false;
    };
    let (Ok(queue), Ok(store)) = (
        queue.parse::<PgConnectOptions>(),
        store.parse::<PgConnectOptions>(),
    ) else {
        return false;
    };
    queue.get_host() == store.get_host()
        && queue.get_port() == store.get_port()
        && queue.get_database() == store.get_database()
        && queue.get_username() == store.get_username()
}

/// The store and queue of a grouped PostgreSQL worker (`Worker::grouped_builder`): the
/// PostgreSQL queue in [`DATABASE_URL`]'s own database, on the store's pool, sized for
/// `worker` ([`WorkerConfig::connections`]: one connection per concurrent group, plus
/// fetching, settlements outside a transaction and the wake-up listener). The schema must be
/// migrated (`jobsctl migrate`).
pub async fn postgres_worker(
    config: &Config,
    worker: &WorkerConfig,
) -> Result<(PgStore, PgQueue), ComposeError> {
    let url = config.require(&DATABASE_URL)?;
    if !matches!(scheme(url), "postgres" | "postgresql") {
        return Err(ComposeError::Unsupported {
            key: DATABASE_URL.describe(),
            scheme: scheme(url).to_owned(),
            source_of: config
                .setting(&DATABASE_URL)
                .map_or_else(|| "nothing".to_owned(), |s| s.source.to_string()),
            accepted: "postgres://…, postgresql://…".to_owned(),
        });
    }
    let store = PgStore::connect_sized(url, worker.connections())
        .await
        .map_err(ComposeError::Store)?;
    // The worker's own limits: what it decodes with is what its queue reads.
    let queue = PgQueue::new(store.pool().clone()).with_envelope_limits(worker.decode_limits);
    match queue.is_migrated().await {
        Ok(true) => Ok((store, queue)),
        Ok(false) => Err(ComposeError::Queue(
            "that database has no core.jobs table: run `jobsctl migrate` on it first".into(),
        )),
        Err(e) => Err(ComposeError::Queue(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{ConfigFile, Queue};

    #[tokio::test]
    async fn a_queue_url_of_another_shape_is_refused_naming_the_shape() {
        let flags = BTreeMap::from([("--queue-url", "postgres-queue:db".to_owned())]);
        let config =
            super::Config::resolve(&flags, &|_| None, &ConfigFile::None).expect("resolves");
        let err = Queue::connect(&config).await.expect_err("refused");
        assert!(err.is_configuration(), "{err}");
        assert!(
            err.to_string()
                .contains("postgres-queue://USER@HOST:PORT/DB"),
            "{err}"
        );
    }

    fn config(pairs: &[(&'static str, &str)]) -> super::Config {
        let flags = pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        super::Config::resolve(&flags, &|_| None, &ConfigFile::None).expect("resolves")
    }

    #[test]
    fn the_store_queue_is_the_shorthand_or_a_url_of_the_same_database_and_user() {
        let store = [("--database-url", "postgres://app@db.internal:5432/billing")];
        let on = |queue: &str| {
            let mut pairs = store.to_vec();
            pairs.push(("--queue-url", queue));
            let config = config(&pairs);
            super::is_store_queue(&config, config.get(&super::QUEUE_URL).expect("a queue"))
        };
        assert!(on("postgres-queue:"));
        assert!(on("postgres-queue://app@db.internal:5432/billing"));
        assert!(
            on("postgresql-queue://app:secret@db.internal/billing"),
            "the port defaults"
        );
        assert!(
            !on("postgres-queue://app@db.internal:5432/other"),
            "another database"
        );
        assert!(
            !on("postgres-queue://ops@db.internal:5432/billing"),
            "another user"
        );
        assert!(
            !on("postgres-queue://app@replica:5432/billing"),
            "another host"
        );
        assert!(!on("memory:"));
        let implied = config(&store);
        assert!(super::is_store_queue(
            &implied,
            implied.get(&super::QUEUE_URL).expect("implied")
        ));
    }

    #[tokio::test]
    async fn the_shorthand_needs_a_postgresql_store() {
        let config = config(&[
            ("--database-url", "sqlite://x.db"),
            ("--queue-url", "postgres-queue:"),
        ]);
        let err = Queue::connect(&config).await.expect_err("refused");
        assert!(err.is_configuration(), "{err}");
        assert!(err.to_string().contains("no PostgreSQL URL"), "{err}");
    }
}

//! A worker process over PostgreSQL: its workers run grouped in the store's own queue (what
//! [`QUEUE_URL`] is by default, `postgres-queue:`, or a URL of the same database), unless it
//! names another transport, which the process warns of at start; the cron scheduler reads `core.tenants` and the
//! outbox relay forwards `core.outbox`.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use jobs_adapter_postgres::{OutboxRelay, PgQueue, PgStore, PgTenantDirectory};
use jobs_consumers::Worker;
use jobs_core::DecodeLimits;

use super::{Opened, ProcessError, ProcessStore, Transport};
use crate::compose::{self, ComposeError, Config, DATABASE_URL, QUEUE_URL, STORE_QUEUE};

#[async_trait]
impl ProcessStore for PgStore {
    const ENGINE: &'static str = "PostgreSQL";
    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];

    /// The store on one pool of `connections`, and, when [`QUEUE_URL`] names the store's own
    /// database ([`compose::is_store_queue`]), the PostgreSQL queue there on that pool,
    /// grouped (`Worker::grouped_builder`); any other transport is warned of as per job.
    async fn open(config: &Config, connections: u32) -> Result<Opened<PgStore>, ProcessError> {
        let url = config.require(&DATABASE_URL)?;
        let timeout = compose::connect_timeout(config)?;
        let limits = compose::envelope_limits(config)?;
        let options = PgStore::pool_options(connections);
        let store = PgStore::connect_with(url, options, timeout)
            .await
            .map_err(ComposeError::Store)?;
        let pool = store.pool().clone();
        let ping = Box::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let migrated: Option<bool> = jobs_adapter_postgres::sqlx::query_scalar(
                    "select to_regclass('core.processed_jobs') is not null",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("the store does not answer: {e}"))?;
                match migrated {
                    Some(true) => Ok(()),
                    _ => Err("the store has no core schema: run `jobsctl migrate`".to_owned()),
                }
            }) as BoxFuture<'static, Result<(), String>>
        });
        let queue_url = config.require(&QUEUE_URL)?;
        let own = if compose::is_store_queue(config, queue_url) {
            Some(grouped(&store, limits).await?)
        } else {
            tracing::warn!(
                queue_url = %QUEUE_URL.shown(queue_url),
                from = %config.origin(&QUEUE_URL),
                "the workers run per job, not grouped: grouped mode needs the PostgreSQL queue \
                 in the store's own database (queue_url `{STORE_QUEUE}`, or unset)"
            );
            None
        };
        let outbox = store.pool().clone();
        Ok(Opened {
            tenants: Some(Arc::new(PgTenantDirectory::new(store.pool().clone()))),
            relay: Some(Box::new(move |target| {
                let relay = OutboxRelay::new(outbox, target).with_envelope_limits(limits);
                Box::new(move |stop| Box::pin(crate::standing::run_relay(relay, stop)))
            })),
            own,
            store,
            ping,
        })
    }

    async fn migrated(config: &Config) -> Result<PgStore, ProcessError> {
        let url = config.require(&DATABASE_URL)?;
        let timeout = compose::connect_timeout(config)?;
        let store = PgStore::connect_with(url, PgStore::pool_options(2), timeout)
            .await
            .map_err(ComposeError::Store)?;
        store.migrate().await.map_err(ComposeError::Store)?;
        Ok(store)
    }
}

/// The PostgreSQL queue in `store`'s database, on its pool, its workers grouped; envelopes
/// held to `limits`.
async fn grouped(
    store: &PgStore,
    limits: DecodeLimits,
) -> Result<Transport<PgStore>, ProcessError> {
    let queue = Arc::new(PgQueue::new(store.pool().clone()).with_envelope_limits(limits));
    match queue.is_migrated().await {
        Ok(true) => {}
        Ok(false) => {
            return Err(ComposeError::Queue(
                "that database has no core.jobs table: run `jobsctl migrate` on it first".into(),
            )
            .into());
        }
        Err(e) => return Err(ComposeError::Queue(e.to_string()).into()),
    }
    let shared = Arc::new(store.clone());
    let grouped = queue.clone();
    Ok(Transport {
        builder: Box::new(move |name, queue_name| {
            Worker::grouped_builder(name, queue_name, grouped.clone(), shared.clone())
        }),
        transport: "the PostgreSQL queue in the store's database (grouped)".to_owned(),
        publisher: queue.clone(),
        depth: Some(queue),
        ready: None,
        push: None,
    })
}

//! A worker process over PostgreSQL: its workers run grouped in the store's own queue (what
//! [`QUEUE_URL`] is by default, `postgres-queue:`, or a URL of the same database), unless it
//! names another transport, which the process warns of at start; the cron scheduler reads `core.tenants` and the
//! outbox relay forwards `core.outbox`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use jobs_adapter_postgres::{
    OutboxRelay, PgQueue, PgStore, PgTenantDirectory, SnapshotHolder, oldest_snapshot,
};
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
        let warned = Arc::new(Mutex::new(None));
        let ping = Box::new(move || {
            let (pool, warned) = (pool.clone(), warned.clone());
            Box::pin(async move {
                let migrated: Option<bool> = jobs_adapter_postgres::sqlx::query_scalar(
                    "select to_regclass('core.processed_jobs') is not null",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("the store does not answer: {e}"))?;
                if migrated != Some(true) {
                    return Err("the store has no core schema: run `jobsctl migrate`".to_owned());
                }
                // Readiness does not depend on it: an old snapshot slows the queue, it does
                // not stop it.
                if let Ok(holder) = oldest_snapshot(&pool).await {
                    let mut warned = warned.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(holder) = snapshot_to_warn_of(holder, &mut warned) {
                        tracing::warn!(
                            pid = holder.pid,
                            application = %holder.application,
                            user = %holder.user,
                            state = %holder.state,
                            held_for = ?holder.held_for,
                            "a transaction has held a snapshot for a long time: until it ends, \
                             the rows jobs leave behind cannot be cleaned and the PostgreSQL \
                             queue's fetches slow down (end it with pg_terminate_backend(pid))"
                        );
                    }
                }
                Ok(())
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

/// How long a snapshot may be held before the worker process names its holder: longer than a
/// report or a `pg_dump` of a small database takes, short enough that the queue has not yet
/// slowed much (issue 38 measured the drain halved within a minute of a held snapshot).
const SNAPSHOT_WARN_AFTER: Duration = Duration::from_secs(300);

/// The holder to warn of: one whose snapshot is older than [`SNAPSHOT_WARN_AFTER`] and who
/// was not warned of already (`warned`, the last pid named), so a long report is named once.
fn snapshot_to_warn_of(
    holder: Option<SnapshotHolder>,
    warned: &mut Option<i32>,
) -> Option<SnapshotHolder> {
    let holder = holder.filter(|h| h.held_for >= SNAPSHOT_WARN_AFTER)?;
    if *warned == Some(holder.pid) {
        return None;
    }
    *warned = Some(holder.pid);
    Some(holder)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: i32, minutes: u64) -> Option<SnapshotHolder> {
        Some(SnapshotHolder {
            pid,
            application: "nightly-report".to_owned(),
            user: "reports".to_owned(),
            state: "idle in transaction".to_owned(),
            held_for: Duration::from_secs(minutes * 60),
        })
    }

    #[test]
    fn a_long_held_snapshot_is_named_once_per_holder() {
        let mut warned = None;
        assert_eq!(
            snapshot_to_warn_of(holder(7, 4), &mut warned),
            None,
            "not yet"
        );
        assert_eq!(snapshot_to_warn_of(None, &mut warned), None);
        let named = snapshot_to_warn_of(holder(7, 5), &mut warned).expect("named");
        assert_eq!(named.pid, 7);
        assert_eq!(snapshot_to_warn_of(holder(7, 9), &mut warned), None, "once");
        assert!(
            snapshot_to_warn_of(holder(8, 6), &mut warned).is_some(),
            "another holder"
        );
        assert!(
            snapshot_to_warn_of(holder(7, 12), &mut warned).is_some(),
            "7 again, after 8"
        );
    }
}

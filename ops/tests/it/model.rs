//! The model-based property tests of `jobs_testkit::model` on the PostgreSQL store and on the
//! SQLite store (the embedded default: one file per case, one writer at a time), with the
//! memory queue as transport, at smaller case counts than on the memory store.

use std::sync::Arc;

use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::{PgStore, PgWorkTx, sqlx};
use jobs_adapter_sqlite::{SqliteStore, SqliteWorkTx};
use jobs_core::{ManualClock, PublishOptions, StoreError};
use jobs_testkit::model::{self, Backend, BoxFuture, Transport};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::pg::TestDb;

fn write_effect(tx: &mut PgWorkTx, key: String) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move {
        sqlx::query("insert into model_effects (key) values ($1)")
            .bind(key)
            .execute(tx.conn())
            .await
            .map(drop)
            .map_err(|e| StoreError::Unavailable {
                message: "insert the effect".into(),
                source: Some(Box::new(e)),
            })
    })
}

/// The memory queue as the model's transport, on a manual clock of its own.
fn memory_transport() -> Transport {
    let clock = ManualClock::default();
    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    let inject = queue.clone();
    Transport {
        publisher: Arc::new(queue.clone()),
        consumer: Arc::new(queue.clone()),
        depth: Arc::new(queue),
        inject: Arc::new(move |name, bytes| {
            inject.publish_bytes(name, bytes, &PublishOptions::default());
        }),
        clock,
    }
}

#[test]
fn the_runtime_keeps_every_invariant_on_postgres() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let db = runtime.block_on(async {
        let (db, pool) = TestDb::migrated().await;
        sqlx::query("create table model_effects (key text not null)")
            .execute(&pool)
            .await
            .expect("create the effects table");
        pool.close().await;
        db
    });
    let db = Arc::new(db);
    let setup = {
        let db = db.clone();
        move || {
            let db = db.clone();
            async move {
                // Each case runs in its own async runtime, so it gets its own pool.
                let pool = db.pool().await;
                sqlx::query("truncate core.processed_jobs, core.dead_letter_events, core.dead_letters, model_effects")
                    .execute(&pool)
                    .await
                    .expect("empty the tables");
                let effects_pool = pool.clone();
                (
                    Backend {
                        store: PgStore::from_pool(pool),
                        write_effect,
                        effects: Arc::new(move || {
                            let pool = effects_pool.clone();
                            Box::pin(async move {
                                sqlx::query_scalar("select key from model_effects")
                                    .fetch_all(&pool)
                                    .await
                                    .expect("read the effects")
                            })
                        }),
                    },
                    memory_transport(),
                )
            }
        }
    };
    model::check_invariants(model::cases(24), setup);
    let db = Arc::into_inner(db).expect("the cases are done");
    runtime.block_on(db.drop_db());
}

fn write_sqlite_effect(
    tx: &mut SqliteWorkTx,
    key: String,
) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move {
        jobs_adapter_sqlite::sqlx::query("insert into effects (key) values (?1)")
            .bind(key)
            .execute(tx.conn())
            .await
            .map(|_| ())
            .map_err(|e| StoreError::failed(e.to_string()))
    })
}

/// A fresh migrated store in a file of its own, with an `effects` table.
async fn sqlite() -> (Backend<SqliteStore>, Transport) {
    static CASE: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "jobs-sqlite-model-{}-{}.db",
        std::process::id(),
        CASE.fetch_add(1, Ordering::Relaxed)
    ));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    // The pool `SqliteStore::open` makes, but for `synchronous = NORMAL`: a case needs no
    // durability against power loss.
    let options = jobs_adapter_sqlite::sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(jobs_adapter_sqlite::sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(jobs_adapter_sqlite::BUSY_TIMEOUT)
        .synchronous(jobs_adapter_sqlite::sqlx::sqlite::SqliteSynchronous::Normal)
        .foreign_keys(true);
    let pool = jobs_adapter_sqlite::sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(jobs_adapter_sqlite::MAX_CONNECTIONS)
        .connect_with(options)
        .await
        .expect("open");
    let store = SqliteStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    jobs_adapter_sqlite::sqlx::query("create table effects (key text not null)")
        .execute(store.pool())
        .await
        .expect("create effects");
    let pool = store.pool().clone();
    (
        Backend {
            store,
            write_effect: write_sqlite_effect,
            effects: Arc::new(move || {
                let pool = pool.clone();
                Box::pin(async move {
                    jobs_adapter_sqlite::sqlx::query_scalar::<_, String>("select key from effects")
                        .fetch_all(&pool)
                        .await
                        .expect("read effects")
                })
            }),
        },
        memory_transport(),
    )
}

/// A small case count by default: each case is a database file (`PROPTEST_CASES` raises it).
#[test]
fn the_runtime_keeps_every_invariant_on_the_sqlite_store() {
    model::check_invariants(model::cases(8), sqlite);
}

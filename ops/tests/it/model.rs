//! The model-based property tests of `jobs_testkit::model` on the PostgreSQL store (with the
//! memory queue as transport), at a smaller case count than on the memory store.

use std::sync::Arc;

use jobs_adapter_memory::MemoryQueue;
use jobs_adapter_postgres::{PgStore, PgWorkTx, sqlx};
use jobs_core::{ManualClock, PublishOptions, StoreError};
use jobs_testkit::model::{self, Backend, BoxFuture, Transport};

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

#[test]
fn the_runtime_keeps_every_invariant_on_postgres() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let db = runtime.block_on(async {
        let db = TestDb::create().await;
        let pool = db.pool().await;
        PgStore::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrate");
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
                sqlx::query("truncate core.processed_jobs, core.dead_letters, model_effects")
                    .execute(&pool)
                    .await
                    .expect("empty the tables");
                let clock = ManualClock::default();
                let queue = MemoryQueue::new(Arc::new(clock.clone()));
                let inject = queue.clone();
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
                    Transport {
                        publisher: Arc::new(queue.clone()),
                        consumer: Arc::new(queue.clone()),
                        depth: Arc::new(queue),
                        inject: Arc::new(move |name, bytes| {
                            inject.publish_bytes(name, bytes, &PublishOptions::default());
                        }),
                        clock,
                    },
                )
            }
        }
    };
    model::check_invariants(model::cases(24), setup);
    let db = Arc::into_inner(db).expect("the cases are done");
    runtime.block_on(db.drop_db());
}

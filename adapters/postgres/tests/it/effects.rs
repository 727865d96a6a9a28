//! What the model's and the grouped suite's handlers write: a row of `model_effects` inside
//! the work transaction, read back once committed.

use std::sync::Arc;

use jobs_adapter_postgres::{PgStore, PgWorkTx};
use jobs_core::StoreError;
use jobs_testkit::model::{Backend, BoxFuture};
use sqlx::PgPool;

/// Creates the effects table in the database of `pool`.
pub(crate) async fn create_table(pool: &PgPool) {
    sqlx::query("create table model_effects (key text not null)")
        .execute(pool)
        .await
        .expect("create the effects table");
}

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

/// `store` with its handlers' effects written to, and read from, its effects table.
pub(crate) fn backend(store: PgStore) -> Backend<PgStore> {
    let pool = store.pool().clone();
    Backend {
        store,
        write_effect,
        effects: Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                sqlx::query_scalar("select key from model_effects")
                    .fetch_all(&pool)
                    .await
                    .expect("read the effects")
            })
        }),
    }
}

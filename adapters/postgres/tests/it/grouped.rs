//! The test kit's grouped suite on `PgQueue` and `PgStore`, in real time: the grouped
//! runtime's behaviour on the queue it was built for.

use std::sync::Arc;

use jobs_adapter_postgres::{PgQueue, PgStore};
use jobs_core::ManualClock;
use jobs_testkit::grouped::GroupedBackend;

use crate::db::Databases;

/// A fresh migrated database with an effects table, its store, and the queue on the store's
/// pool and a manual clock.
async fn postgres(dbs: &Databases) -> GroupedBackend<PgStore, PgQueue> {
    let store = dbs.store().await;
    crate::effects::create_table(store.pool()).await;
    let clock = ManualClock::default();
    let queue = PgQueue::new(store.pool().clone()).with_clock(Arc::new(clock.clone()));
    GroupedBackend {
        backend: crate::effects::backend(store),
        queue: Arc::new(queue),
        clock,
    }
}

/// One test per case of the suite, each on a database of its own.
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                crate::db::with_databases(|dbs| async move {
                    jobs_testkit::grouped::$case(postgres(&dbs).await).await;
                })
                .await;
            }
        )*
    };
}

jobs_testkit::grouped_cases!(suite);

//! The test kit's grouped suite on `PgQueue` and `PgStore`, in real time: the grouped
//! runtime's behaviour on the queue it was built for.

use std::sync::Arc;

use jobs_adapter_postgres::{PgQueue, PgStore, PgWorkTx};
use jobs_core::{ManualClock, StoreError};
use jobs_testkit::grouped::GroupedBackend;
use jobs_testkit::model::{Backend, BoxFuture};

use crate::db::Databases;

fn write_effect(tx: &mut PgWorkTx, key: String) -> BoxFuture<'_, Result<(), StoreError>> {
    Box::pin(async move {
        sqlx::query("insert into grouped_effects (key) values ($1)")
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

/// A fresh migrated database with an effects table, its store, and the queue on the store's
/// pool and a manual clock.
async fn postgres(dbs: &Databases) -> GroupedBackend<PgStore, PgQueue> {
    let store = dbs.store().await;
    sqlx::query("create table grouped_effects (key text not null)")
        .execute(store.pool())
        .await
        .expect("create the effects table");
    let clock = ManualClock::default();
    let queue = PgQueue::new(store.pool().clone()).with_clock(Arc::new(clock.clone()));
    let pool = store.pool().clone();
    GroupedBackend {
        backend: Backend {
            store,
            write_effect,
            effects: Arc::new(move || {
                let pool = pool.clone();
                Box::pin(async move {
                    sqlx::query_scalar("select key from grouped_effects")
                        .fetch_all(&pool)
                        .await
                        .expect("read the effects")
                })
            }),
        },
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

suite!(
    a_failing_job_takes_nothing_from_its_group,
    a_group_skips_a_job_processed_before,
    undoing_a_failed_job_keeps_what_its_neighbours_settled,
    a_group_size_out_of_bounds_is_refused,
    a_group_runs_the_jobs_that_get_ready_and_defers_the_others,
    groups_fit_the_transactions_checkpoint_budget,
    when_the_first_job_to_write_fails_the_group_starts_again_without_it,
    a_group_of_rerunnable_jobs_runs_the_others_again_when_one_fails,
    a_rerunnable_group_tries_again_without_checkpoints_then_carefully,
    a_rerunnable_group_checkpoints_as_often_as_its_jobs_fail,
    a_grouped_worker_counts_each_job_once_by_outcome_and_kind,
    groups_hold_about_group_time_of_their_handlers,
    a_lingering_fetch_fills_its_group,
    a_linger_never_delays_an_empty_fetch_or_a_full_group,
    a_busy_grouped_worker_leases_no_more_while_a_group_waits,
    a_stop_gives_back_fetched_jobs_with_their_attempt_unspent,
    a_job_whose_lease_expired_runs_alone_with_nothing_else_leased,
    the_grouped_loop_drains_a_backlog_once_and_wakes_for_new_jobs,
);

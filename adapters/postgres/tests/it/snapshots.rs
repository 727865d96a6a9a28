//! `oldest_snapshot` names the session that holds the database's oldest snapshot.

use jobs_adapter_postgres::oldest_snapshot;
use sqlx::Connection;

use crate::db::with_databases;

#[tokio::test]
async fn the_session_holding_the_oldest_snapshot_is_named() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        assert_eq!(
            oldest_snapshot(&pool).await.expect("read"),
            None,
            "nobody holds one"
        );
        let report_options =
            (pool.connect_options().as_ref().clone()).application_name("nightly-report");
        let mut report = sqlx::PgConnection::connect_with(&report_options)
            .await
            .expect("a session");
        sqlx::query("begin isolation level repeatable read")
            .execute(&mut report)
            .await
            .expect("begin");
        let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
            .fetch_one(&mut report)
            .await
            .expect("its pid; the snapshot is taken");
        let holder = oldest_snapshot(&pool)
            .await
            .expect("read")
            .expect("a holder");
        assert_eq!(holder.pid, pid);
        assert_eq!(holder.application, "nightly-report");
        assert_eq!(holder.state, "idle in transaction");
        sqlx::query("rollback")
            .execute(&mut report)
            .await
            .expect("end it");
        assert_eq!(
            oldest_snapshot(&pool).await.expect("read"),
            None,
            "released"
        );
        report.close().await.expect("close");
        pool.close().await;
    })
    .await;
}

//! `precreate_monthly_partitions` against a real PostgreSQL: the expected partitions, nothing
//! changed by a second run, clear errors for tables it cannot partition, safe quoting, and
//! savepoint behaviour inside a work transaction.
//!
//! The server is `DATABASE_URL`, by default the local trust-auth `postgres` superuser. Every
//! test gets a database of its own with a unique name, dropped when the test ends, pass or
//! fail (see `db.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::with_databases;
use jobs_adapter_postgres::{PartitionError, PartitionPrecreation, precreate_monthly_partitions};
use jobs_core::{ErrorClass, WorkStore, WorkTransaction};
use sqlx::{Executor, PgPool};

/// 2026-11-30T12:00:00Z.
fn nov30() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_796_040_000)
}

/// Runs `sql`, several statements allowed (the simple query protocol; not `sqlx::raw_sql`,
/// whose future is not provably `Send`).
async fn exec(pool: &PgPool, sql: &str) {
    pool.execute(sqlx::AssertSqlSafe(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// `billing.events`, range-partitioned by `at`.
async fn events_table(pool: &PgPool) {
    exec(
        pool,
        "create schema billing; \
         create table billing.events (id bigint not null, at timestamptz not null) \
         partition by range (at);",
    )
    .await;
}

/// Every partition of `table` with its bounds, as PostgreSQL prints them in UTC.
async fn partitions_of(pool: &PgPool, table: &str) -> Vec<(String, String)> {
    let mut conn = pool.acquire().await.expect("a connection");
    exec_on(&mut conn, "set timezone = 'UTC'").await;
    sqlx::query_as(
        "select c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) \
         from pg_inherits i join pg_class c on c.oid = i.inhrelid \
         where i.inhparent = $1::regclass order by 1",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .expect("list partitions")
}

async fn exec_on(conn: &mut sqlx::PgConnection, sql: &'static str) {
    conn.execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn bounds(from: &str, to: &str) -> String {
    format!("FOR VALUES FROM ('{from} 00:00:00+00') TO ('{to} 00:00:00+00')")
}

#[tokio::test]
async fn creates_the_months_from_now_on() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        events_table(&pool).await;
        let mut conn = pool.acquire().await.expect("a connection");
        let made = precreate_monthly_partitions(&mut conn, "billing.events", 3, nov30())
            .await
            .expect("pre-created");
        let names: Vec<(&str, &str, bool)> = made
            .iter()
            .map(|p| (p.schema.as_str(), p.name.as_str(), p.created))
            .collect();
        assert_eq!(
            names,
            [
                ("billing", "events_p2026_11", true),
                ("billing", "events_p2026_12", true),
                ("billing", "events_p2027_01", true),
            ]
        );
        assert_eq!(
            made[0].from,
            UNIX_EPOCH + Duration::from_secs(1_793_491_200)
        ); // 2026-11-01
        assert_eq!(made[0].to, made[1].from);
        assert_eq!(
            partitions_of(&pool, "billing.events").await,
            vec![
                (
                    "billing.events_p2026_11".to_owned(),
                    bounds("2026-11-01", "2026-12-01")
                ),
                (
                    "billing.events_p2026_12".to_owned(),
                    bounds("2026-12-01", "2027-01-01")
                ),
                (
                    "billing.events_p2027_01".to_owned(),
                    bounds("2027-01-01", "2027-02-01")
                ),
            ]
        );

        // Rows route to their month, at the edges too; past the last month there is no room.
        for (at, partition) in [
            ("2026-11-30T23:59:59.999999Z", "billing.events_p2026_11"),
            ("2026-12-01T00:00:00Z", "billing.events_p2026_12"),
            ("2027-01-31T23:59:59Z", "billing.events_p2027_01"),
        ] {
            let landed: String = sqlx::query_scalar(
                "insert into billing.events (id, at) values (1, $1::timestamptz) \
                 returning tableoid::regclass::text",
            )
            .bind(at)
            .fetch_one(&pool)
            .await
            .expect("a partition takes the row");
            assert_eq!(landed, partition, "{at}");
        }
        sqlx::query("insert into billing.events (id, at) values (1, '2027-02-01T00:00:00Z')")
            .execute(&pool)
            .await
            .expect_err("February 2027 is not pre-created");
    })
    .await;
}

#[tokio::test]
async fn running_twice_changes_nothing_and_a_month_later_adds_one() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        events_table(&pool).await;
        let mut conn = pool.acquire().await.expect("a connection");
        precreate_monthly_partitions(&mut conn, "billing.events", 3, nov30())
            .await
            .expect("first run");
        let before = partitions_of(&pool, "billing.events").await;
        let again = precreate_monthly_partitions(&mut conn, "billing.events", 3, nov30())
            .await
            .expect("second run");
        assert!(again.iter().all(|p| !p.created), "{again:?}");
        assert_eq!(partitions_of(&pool, "billing.events").await, before);

        let month_later = nov30() + Duration::from_secs(31 * 86_400);
        let next = precreate_monthly_partitions(&mut conn, "billing.events", 3, month_later)
            .await
            .expect("a month later");
        let created: Vec<&str> = next
            .iter()
            .filter(|p| p.created)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(created, ["events_p2027_02"]);
        assert_eq!(partitions_of(&pool, "billing.events").await.len(), 4);
    })
    .await;
}

#[tokio::test]
async fn tables_it_cannot_partition_give_clear_errors() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        exec(
            &pool,
            "create table plain (at timestamptz); \
             create table by_list (region text) partition by list (region); \
             create table by_naive (at timestamp) partition by range (at); \
             create table by_two (a timestamptz, b timestamptz) partition by range (a, b); \
             create view a_view as select 1 as one;",
        )
        .await;
        let mut conn = pool.acquire().await.expect("a connection");
        let mut run = async |table: &str| {
            precreate_monthly_partitions(&mut conn, table, 2, nov30())
                .await
                .expect_err("cannot partition")
        };

        let e = run("plain").await;
        assert!(matches!(&e, PartitionError::NotPartitioned { table } if table == "public.plain"));
        assert!(
            e.to_string()
                .contains("`public.plain` is not a partitioned table"),
            "{e}"
        );
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(matches!(
            run("a_view").await,
            PartitionError::NotPartitioned { .. }
        ));

        let e = run("by_list").await;
        assert!(
            e.to_string().contains("partitioned by list on region text"),
            "{e}"
        );
        let e = run("by_naive").await;
        assert!(e.to_string().contains("timestamp without time zone"), "{e}");
        let e = run("by_two").await;
        assert!(e.to_string().contains("2 columns"), "{e}");
        assert!(matches!(e, PartitionError::NotRangeByTimestamptz { .. }));

        let e = run("missing").await;
        assert!(
            matches!(&e, PartitionError::NoSuchTable { table } if table == "missing"),
            "{e}"
        );
        let e = run("a.b.c.d").await;
        assert!(matches!(e, PartitionError::Database { .. }), "{e}");
        assert!(partitions_of(&pool, "plain").await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn identifiers_are_quoted() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        exec(
            &pool,
            r#"create schema "My Schema";
               create table "My Schema"."Odd ""Name""; drop" (at timestamptz)
               partition by range (at);"#,
        )
        .await;
        let table = r#""My Schema"."Odd ""Name""; drop""#;
        let mut conn = pool.acquire().await.expect("a connection");
        let made = precreate_monthly_partitions(&mut conn, table, 1, nov30())
            .await
            .expect("pre-created");
        assert_eq!(made[0].schema, "My Schema");
        assert_eq!(made[0].name, r#"Odd "Name"; drop_p2026_11"#);
        assert_eq!(
            partitions_of(&pool, table).await,
            vec![(
                r#""My Schema"."Odd ""Name""; drop_p2026_11""#.to_owned(),
                bounds("2026-11-01", "2026-12-01")
            )]
        );
    })
    .await;
}

#[tokio::test]
async fn names_that_would_be_truncated_or_are_taken_are_refused() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        let long = "e".repeat(56); // + "_p2026_11" = 65 bytes
        exec(
            &pool,
            &format!(
                "create table {long} (at timestamptz) partition by range (at); \
                 create table events (at timestamptz) partition by range (at); \
                 create table events_p2026_12 (at timestamptz);"
            ),
        )
        .await;
        let mut conn = pool.acquire().await.expect("a connection");
        let e = precreate_monthly_partitions(&mut conn, &long, 1, nov30())
            .await
            .expect_err("too long");
        assert!(matches!(e, PartitionError::NameTooLong { .. }), "{e}");

        let e = precreate_monthly_partitions(&mut conn, "events", 3, nov30())
            .await
            .expect_err("a stray table has December's name");
        assert!(
            e.to_string().contains(
                "`public.events_p2026_12` exists but is not a partition of `public.events`"
            ),
            "{e}"
        );
        // All or nothing: November was not left behind.
        assert!(partitions_of(&pool, "events").await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn an_overlapping_partition_of_another_name_is_reported() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        exec(
            &pool,
            "create table events (at timestamptz) partition by range (at); \
             create table events_december partition of events \
             for values from ('2026-12-01T00:00:00Z') to ('2027-01-01T00:00:00Z');",
        )
        .await;
        let mut conn = pool.acquire().await.expect("a connection");
        let e = precreate_monthly_partitions(&mut conn, "events", 2, nov30())
            .await
            .expect_err("December is taken");
        let text = e.to_string();
        assert!(
            text.contains("create partition public.events_p2026_12"),
            "{text}"
        );
        assert!(text.contains("overlap"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn inside_a_work_transaction_it_commits_and_fails_with_it() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let pool = store.pool().clone();
        events_table(&pool).await;
        exec(&pool, "create table plain (at timestamptz);").await;

        // Rolled back with the work transaction.
        let mut tx = store.begin().await.expect("begin");
        let made = precreate_monthly_partitions(tx.conn(), "billing.events", 2, nov30())
            .await
            .expect("in the transaction");
        assert_eq!(made.len(), 2);
        tx.rollback().await.expect("rollback");
        assert!(partitions_of(&pool, "billing.events").await.is_empty());

        // A failure rolls back to its savepoint only: the work transaction goes on.
        let mut tx = store.begin().await.expect("begin");
        let handler = PartitionPrecreation::new(2, ["billing.events", "plain"]);
        let e = handler
            .run(tx.conn(), nov30())
            .await
            .expect_err("plain is not partitioned");
        assert!(matches!(e, PartitionError::NotPartitioned { .. }));
        precreate_monthly_partitions(tx.conn(), "billing.events", 2, nov30())
            .await
            .expect("the transaction is still usable");
        tx.commit().await.expect("commit");
        assert_eq!(partitions_of(&pool, "billing.events").await.len(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_create_each_partition_once() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        events_table(&pool).await;
        let run = |pool: PgPool| async move {
            let mut conn = pool.acquire().await.expect("a connection");
            precreate_monthly_partitions(&mut conn, "billing.events", 6, nov30())
                .await
                .expect("no race on the catalog")
        };
        let runs: Vec<_> = (0..4).map(|_| tokio::spawn(run(pool.clone()))).collect();
        let mut created = 0;
        for r in runs {
            created += r.await.expect("a run").iter().filter(|p| p.created).count();
        }
        assert_eq!(created, 6);
        assert_eq!(partitions_of(&pool, "billing.events").await.len(), 6);
    })
    .await;
}

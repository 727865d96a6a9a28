//! `PgStore` against a real PostgreSQL: the store contract suite and what only PostgreSQL has
//! (handlers writing in the work transaction, error classes, migrations).
//!
//! The server is `DATABASE_URL`, by default the local trust-auth `postgres` superuser. Every
//! store gets a database of its own with a unique name, dropped when its test ends, pass or
//! fail; a leftover from a killed run never collides with a later one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::db::with_databases;
use jobs_adapter_postgres::PgStore;
use jobs_core::{
    Claim, ConsumerName, DeadLetterStore, ErrorClass, JobId, NewDeadLetter, ProcessedJobs,
    Recorded, StoreError, WorkStore, WorkTransaction,
};
use jobs_testkit::{contract, fixtures};
use sqlx::postgres::PgPoolOptions;

fn consumer() -> ConsumerName {
    "test.invoicer".parse().expect("a valid consumer name")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract() {
    with_databases(|dbs| async move {
        contract::store::run(|| {
            let dbs = Arc::clone(&dbs);
            async move { dbs.store().await }
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_runs_contract() {
    with_databases(|dbs| async move {
        contract::store::run_bulk_runs(|| {
            let dbs = Arc::clone(&dbs);
            async move { dbs.store().await }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn migrate_twice_is_fine() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        store.migrate().await.expect("a second migrate");
        PgStore::from_pool(store.pool().clone())
            .migrate()
            .await
            .expect("a migrate from another handle");
        let tables: Vec<Option<String>> = sqlx::query_scalar(
            "select to_regclass(t)::text from unnest(array['core.processed_jobs', \
             'core.dead_letters']) as t",
        )
        .fetch_all(store.pool())
        .await
        .expect("look up the tables");
        assert_eq!(
            tables,
            vec![
                Some("core.processed_jobs".to_owned()),
                Some("core.dead_letters".to_owned())
            ]
        );
        let mut tx = store.begin().await.expect("begin");
        let claim = tx
            .claim(JobId::generate(), &consumer(), SystemTime::now())
            .await
            .expect("claim after repeated migrations");
        assert_eq!(claim, Claim::Claimed);
        tx.commit().await.expect("commit");
    })
    .await;
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // Port 1 refuses connections; sqlx retries until the acquire timeout.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .expect("a valid URL");
    let store = PgStore::from_pool(pool);
    let begin = store.begin().await.map(|_| ());
    let read = store
        .is_processed(JobId::generate(), &consumer())
        .await
        .map(|_| ());
    for result in [begin, read] {
        let e = result.expect_err("nothing listens on port 1");
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Retryable);
    }
}

#[tokio::test]
async fn begin_gets_past_pooled_connections_the_server_closed() {
    with_databases(|dbs| async move {
        // A worker's pool pings no connection before handing it out.
        let options = dbs.create().await.application_name("closed_under_the_pool");
        let pool = PgStore::pool_options(3)
            .min_connections(3)
            .connect_with(options)
            .await
            .expect("connect");
        let store = PgStore::from_pool(pool.clone());
        for _ in 0..100 {
            if pool.num_idle() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(pool.num_idle(), 3, "three idle connections");
        let admin = dbs.pool().await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "select pg_terminate_backend(pid) from pg_stat_activity \
             where application_name = 'closed_under_the_pool'",
        )
        .fetch_all(&admin)
        .await
        .expect("terminate");
        assert_eq!(killed, [true, true, true]);
        admin.close().await;
        let mut tx = store
            .begin()
            .await
            .expect("another connection once each closed one fails");
        let one: i32 = sqlx::query_scalar("select 1")
            .fetch_one(tx.conn())
            .await
            .expect("the transaction works");
        assert_eq!(one, 1);
        tx.rollback().await.expect("rollback");
    })
    .await;
}

#[tokio::test]
async fn missing_schema_is_a_permanent_failure() {
    with_databases(|dbs| async move {
        let store = PgStore::from_pool(dbs.pool().await);
        let e = store
            .is_processed(JobId::generate(), &consumer())
            .await
            .expect_err("core.processed_jobs does not exist before migrate");
        assert!(matches!(e, StoreError::SchemaMissing { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().ends_with("(run `jobsctl migrate`)"), "{e}");
    })
    .await;
}

#[tokio::test]
async fn errors_are_classified_by_sqlstate() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        // A trigger that fails a claim with the SQLSTATE the session asks for.
        sqlx::raw_sql(
            "create function fail_claim() returns trigger language plpgsql as $$ \
             begin \
               if coalesce(current_setting('test.errcode', true), '') <> '' then \
                 raise exception 'failed by the test' \
                   using errcode = current_setting('test.errcode'); \
               end if; \
               return new; \
             end $$; \
             create trigger fail_claim before insert on core.processed_jobs \
               for each row execute function fail_claim();",
        )
        .execute(store.pool())
        .await
        .expect("create the trigger");
        for (code, class) in [
            ("40001", ErrorClass::Retryable), // serialization_failure
            ("40P01", ErrorClass::Retryable), // deadlock_detected
            ("57P01", ErrorClass::Retryable), // admin_shutdown
            ("08006", ErrorClass::Retryable), // connection_failure
            ("23514", ErrorClass::Permanent), // check_violation
            ("42501", ErrorClass::Permanent), // insufficient_privilege
        ] {
            let mut tx = store.begin().await.expect("begin");
            sqlx::query("select set_config('test.errcode', $1, true)")
                .bind(code)
                .execute(tx.conn())
                .await
                .expect("set the error code");
            let e = tx
                .claim(JobId::generate(), &consumer(), SystemTime::now())
                .await
                .expect_err("the trigger fails the claim");
            assert_eq!(e.class(), class, "SQLSTATE {code}: {e:?}");
            let source = e.engine_error().expect("the sqlx error is kept");
            assert!(
                source.to_string().contains("failed by the test"),
                "{source}"
            );
            tx.rollback().await.expect("rollback");
        }
    })
    .await;
}

#[tokio::test]
async fn handler_writes_commit_and_roll_back_with_the_claim() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        sqlx::query("create table invoices (job_id uuid primary key, amount integer not null)")
            .execute(store.pool())
            .await
            .expect("create the business table");
        let invoiced = |job: JobId| {
            let pool = store.pool().clone();
            async move {
                sqlx::query_scalar::<_, bool>(
                    "select exists (select 1 from invoices where job_id = $1)",
                )
                .bind(job.as_uuid())
                .fetch_one(&pool)
                .await
                .expect("read invoices")
            }
        };

        let committed = JobId::generate();
        let mut tx = store.begin().await.expect("begin");
        assert_eq!(
            tx.claim(committed, &consumer(), SystemTime::now())
                .await
                .expect("claim"),
            Claim::Claimed
        );
        sqlx::query("insert into invoices (job_id, amount) values ($1, 42)")
            .bind(committed.as_uuid())
            .execute(tx.conn())
            .await
            .expect("the handler's write");
        assert!(!invoiced(committed).await, "visible before commit");
        tx.commit().await.expect("commit");
        assert!(
            invoiced(committed).await,
            "the handler's row must commit with the claim"
        );
        assert!(
            store
                .is_processed(committed, &consumer())
                .await
                .expect("read")
        );

        let rolled_back = JobId::generate();
        let mut tx = store.begin().await.expect("begin");
        assert_eq!(
            tx.claim(rolled_back, &consumer(), SystemTime::now())
                .await
                .expect("claim"),
            Claim::Claimed
        );
        // Through `DerefMut` this time.
        sqlx::query("insert into invoices (job_id, amount) values ($1, 7)")
            .bind(rolled_back.as_uuid())
            .execute(&mut *tx)
            .await
            .expect("the handler's write");
        tx.rollback().await.expect("rollback");
        assert!(
            !invoiced(rolled_back).await,
            "the handler's row must roll back with the claim"
        );
        assert!(
            !store
                .is_processed(rolled_back, &consumer())
                .await
                .expect("read")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_records_of_one_key_make_one_pending_letter() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let letter = NewDeadLetter {
            job_id: Some(JobId::generate()),
            queue: "test.race".parse().expect("a valid queue name"),
            consumer: None,
            tenant_id: Some(fixtures::tenant(1)),
            kind: Some(fixtures::kind("test.job")),
            correlation_id: Some(fixtures::correlation()),
            payload: b"{}".to_vec(),
            attempts: 5,
            last_error: "boom".to_owned(),
            reason: None,
            dedup_key: Some("job-1".to_owned()),
            at: SystemTime::now(),
        };
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (store, letter) = (store.clone(), letter.clone());
                tokio::spawn(async move { store.record(letter).await })
            })
            .collect();
        let mut outcomes = vec![];
        for task in tasks {
            outcomes.push(task.await.expect("task").expect("record"));
        }
        let new: Vec<_> = outcomes
            .iter()
            .filter(|r| matches!(r, Recorded::New(_)))
            .collect();
        assert_eq!(new.len(), 1, "{outcomes:?}");
        let id = new[0].id();
        assert!(outcomes.iter().all(|r| r.id() == id), "{outcomes:?}");
    })
    .await;
}

#[tokio::test]
async fn connecting_to_a_server_that_refuses_says_where_and_why_once() {
    let e = PgStore::connect("postgres://postgres@127.0.0.1:1/postgres")
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.starts_with("store unavailable: connect to PostgreSQL at 127.0.0.1:1: "),
        "{message}"
    );
    assert!(message.contains("Connection refused"), "{message}");
    assert_eq!(
        message.matches("Connection refused").count(),
        1,
        "the cause once: {message}"
    );
    assert!(
        std::error::Error::source(&e).is_none(),
        "the message carries the cause"
    );
}

#[tokio::test]
async fn connecting_to_a_server_that_never_answers_fails_after_the_connect_timeout() {
    // Accepts connections (the kernel's backlog) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = silent.local_addr().expect("bound").port();
    let e = PgStore::connect_with(
        &format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        PgPoolOptions::new(),
        Duration::from_millis(300),
    )
    .await
    .expect_err("no answer");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "store unavailable: connect to PostgreSQL at 127.0.0.1:{port}: no answer within 300ms"
        )
    );
    drop(silent);
}

#[tokio::test]
async fn a_letter_written_with_an_invalid_queue_name_is_listed_as_unreadable() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let pool = store.pool().clone();
        jobs_testkit::contract::listing::reads_around_an_unreadable_letter(
            store,
            "queue",
            |id| async move {
                sqlx::query("update core.dead_letters set queue = 'not a queue!' where id = $1")
                    .bind(id.0)
                    .execute(&pool)
                    .await
                    .expect("spoil the row");
            },
        )
        .await;
    })
    .await;
}

/// A handler's own errors, classified by `error_class` on a real server: what running the
/// job again cannot fix is permanent, what a new connection or a later try can fix retries.
#[tokio::test]
async fn a_handlers_sqlx_errors_are_classified_as_the_store_classifies_its_own() {
    use jobs_adapter_postgres::error_class;
    use jobs_core::ErrorClass::{Permanent, Retryable};
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        let failing = async |sql: &str| {
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&pool)
                .await
                .expect_err(sql)
        };
        sqlx::query("create table ledger (invoice bigint primary key)")
            .execute(&pool)
            .await
            .expect("a table");
        sqlx::query("insert into ledger values (1)")
            .execute(&pool)
            .await
            .expect("a row");
        for (sql, why) in [
            ("insert into no_such_table values (1)", "undefined table"),
            ("select no_such_column from ledger", "undefined column"),
            ("insert into ledger values (1)", "unique violation"),
            ("insert into ledger values ('not a number')", "data error"),
            ("selec 1", "syntax error"),
        ] {
            assert_eq!(error_class(&failing(sql).await), Permanent, "{why}");
        }
        // The server ends the connection under the statement: another connection may succeed.
        let mut conn = pool.acquire().await.expect("a connection");
        let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .expect("a pid");
        sqlx::query("select pg_terminate_backend($1)")
            .bind(pid)
            .execute(&pool)
            .await
            .expect("terminate");
        let lost = sqlx::query("select 1")
            .execute(&mut *conn)
            .await
            .expect_err("the connection is gone");
        assert_eq!(error_class(&lost), Retryable, "{lost}");
        assert_eq!(error_class(&sqlx::Error::PoolTimedOut), Retryable);
        // The broken connection goes back to the pool (which drops it) before the pool closes.
        drop(conn);
        pool.close().await;
    })
    .await;
}

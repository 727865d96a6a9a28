//! `test_util::with_test_database`, as a module's handler test uses it: a migrated database
//! for the test, dropped afterwards, also when the test panics.

use std::sync::{Arc, Mutex, PoisonError};

use jobs_adapter_postgres::test_util::with_test_database;
use jobs_core::{Claim, ConsumerName, JobId, WorkStore, WorkTransaction};
use sqlx::Connection;

fn server() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

async fn exists(name: &str) -> bool {
    let mut admin = sqlx::PgConnection::connect(&server())
        .await
        .expect("the server");
    sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
        .bind(name)
        .fetch_one(&mut admin)
        .await
        .expect("pg_database")
}

#[tokio::test]
async fn a_handler_test_gets_a_migrated_database_that_is_dropped_afterwards() {
    let name = with_test_database(&server(), |store| async move {
        let consumer: ConsumerName = "billing.booker".parse().expect("a consumer");
        let mut tx = store.begin().await.expect("a work transaction");
        let job = JobId::generate();
        assert_eq!(
            tx.claim(job, &consumer, std::time::SystemTime::now())
                .await
                .expect("claim"),
            Claim::Claimed,
            "the store's schema is there"
        );
        sqlx::query("create table ledger (invoice bigint)")
            .execute(tx.conn())
            .await
            .expect("the handler's own table");
        tx.commit().await.expect("commit");
        sqlx::query_scalar::<_, String>("select current_database()")
            .fetch_one(store.pool())
            .await
            .expect("its name")
    })
    .await;
    assert!(name.starts_with("jobs_test_"), "{name}");
    assert!(!exists(&name).await, "{name} is dropped");
}

#[tokio::test]
async fn a_failing_test_still_drops_its_database_and_fails() {
    let seen = Arc::new(Mutex::new(String::new()));
    let inside = seen.clone();
    let failed = tokio::spawn(async move {
        with_test_database(&server(), |store| async move {
            let name: String = sqlx::query_scalar("select current_database()")
                .fetch_one(store.pool())
                .await
                .expect("its name");
            *inside.lock().unwrap_or_else(PoisonError::into_inner) = name;
            panic!("the handler did the wrong thing");
        })
        .await
    })
    .await
    .expect_err("the test fails");
    assert!(failed.is_panic());
    let name = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert!(name.starts_with("jobs_test_"), "{name}");
    assert!(
        !exists(&name).await,
        "{name} is dropped though the test panicked"
    );
}

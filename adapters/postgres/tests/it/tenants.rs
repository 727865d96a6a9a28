//! `PgTenantDirectory` against a real PostgreSQL: keyset paging reaches every tenant once,
//! entitlements read as text, and the table refuses rows the directory could not return.
//!
//! The server is `DATABASE_URL`, by default the local trust-auth `postgres` superuser. Every
//! test gets a database of its own with a unique name, dropped when the test ends, pass or
//! fail (see `db.rs`).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::time::Duration;

use crate::db::{Databases, with_databases};
use jobs_adapter_postgres::PgTenantDirectory;
use jobs_core::{ErrorClass, TenantDirectory, TenantId};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// A migrated database's pool with `ids` in `core.tenants`, each with `entitlements`.
async fn tenants(dbs: &Databases, ids: &[TenantId], entitlements: &str) -> PgPool {
    let store = dbs.store().await;
    for id in ids {
        sqlx::query("insert into core.tenants (id, entitlements) values ($1, $2::jsonb)")
            .bind(id.as_uuid())
            .bind(entitlements)
            .execute(store.pool())
            .await
            .expect("insert a tenant");
    }
    store.pool().clone()
}

/// Tenant ids of several versions, in no particular order.
fn ids(n: u32) -> Vec<TenantId> {
    (0..n)
        .map(|i| {
            let version = [4, 7, 1][i as usize % 3];
            let hashed = RandomState::new().hash_one(i) as u32;
            format!("{hashed:08x}-0000-{version}000-8000-{i:012x}")
                .parse()
                .expect("a valid tenant id")
        })
        .collect()
}

/// Every tenant id, page by page; asserts the page shape along the way.
async fn read_all(directory: &PgTenantDirectory, limit: u32) -> (Vec<TenantId>, usize) {
    let mut seen = vec![];
    let mut pages = 0;
    let mut after = None;
    loop {
        let page = directory.page(after, limit).await.expect("a page");
        pages += 1;
        assert!(page.tenants.len() <= limit as usize);
        let page_ids: Vec<TenantId> = page.tenants.iter().map(|t| t.id).collect();
        assert!(page_ids.windows(2).all(|w| w[0] < w[1]), "in id order");
        seen.extend(page_ids);
        match page.next {
            Some(next) => {
                assert_eq!(
                    page.tenants.len(),
                    limit as usize,
                    "only the last page is short"
                );
                assert_eq!(
                    Some(next),
                    seen.last().copied(),
                    "the cursor is the last id"
                );
                after = Some(next);
            }
            None => return (seen, pages),
        }
    }
}

#[tokio::test]
async fn paging_reaches_every_tenant_once() {
    with_databases(|dbs| async move {
        let all = ids(25);
        let directory = PgTenantDirectory::new(tenants(&dbs, &all, "{}").await);
        let mut expected = all.clone();
        expected.sort();
        for (limit, pages) in [(7, 4), (5, 5), (25, 1), (1000, 1), (1, 25)] {
            let (seen, read) = read_all(&directory, limit).await;
            assert_eq!(seen, expected, "page size {limit}");
            assert_eq!(read, pages, "page size {limit}: no empty trailing page");
        }
        let unique: BTreeSet<TenantId> = read_all(&directory, 3).await.0.into_iter().collect();
        assert_eq!(unique.len(), 25);
    })
    .await;
}

#[tokio::test]
async fn one_tenant_is_looked_up_by_id() {
    with_databases(|dbs| async move {
        let all = ids(5);
        let directory =
            PgTenantDirectory::new(tenants(&dbs, &all[..4], r#"{"data_freshness": "3h"}"#).await);
        for id in &all[..4] {
            let found = directory
                .tenant(*id)
                .await
                .expect("a lookup")
                .expect("held");
            assert_eq!(found.id, *id);
            assert_eq!(found.entitlements["data_freshness"], "3h");
        }
        assert_eq!(directory.tenant(all[4]).await.expect("a lookup"), None);
    })
    .await;
}

#[tokio::test]
async fn an_empty_directory_is_one_empty_last_page() {
    with_databases(|dbs| async move {
        let directory = PgTenantDirectory::new(tenants(&dbs, &[], "{}").await);
        let page = directory.page(None, 10).await.expect("a page");
        assert!(page.tenants.is_empty());
        assert_eq!(page.next, None);
    })
    .await;
}

#[tokio::test]
async fn entitlements_are_read_as_text() {
    with_databases(|dbs| async move {
        let id = ids(1);
        let pool = tenants(
            &dbs,
            &id,
            r#"{"data_freshness": "6h", "seats": 10, "beta": true, "retired": null}"#,
        )
        .await;
        let page = PgTenantDirectory::new(pool)
            .page(None, 10)
            .await
            .expect("a page");
        let expected: BTreeMap<String, String> =
            [("beta", "true"), ("data_freshness", "6h"), ("seats", "10")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        assert_eq!(page.tenants[0].entitlements, expected);
    })
    .await;
}

#[tokio::test]
async fn the_table_refuses_rows_the_directory_could_not_return() {
    with_databases(|dbs| async move {
        let pool = tenants(&dbs, &[], "{}").await;
        let insert = |id: &'static str, entitlements: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query(
                    "insert into core.tenants (id, entitlements) values ($1::uuid, $2::jsonb)",
                )
                .bind(id)
                .bind(entitlements)
                .execute(&pool)
                .await
            }
        };
        // Not an object: entitlements are name -> value.
        let e = insert("0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90", r#"["6h"]"#)
            .await
            .expect_err("an array");
        assert!(e.to_string().contains("tenants_entitlements_object"), "{e}");
        // Version 0 is not a UUID the envelope accepts as a tenant id.
        let e = insert("0b6c5e5a-3c1f-0d8e-9a57-2f1e4c6b7d90", "{}")
            .await
            .expect_err("a version 0 UUID");
        assert!(e.to_string().contains("tenants_id_is_envelope_uuid"), "{e}");
        insert("00000000-0000-0000-0000-000000000000", "{}")
            .await
            .expect("the nil UUID is a valid tenant id");
        let defaulted: (String,) = sqlx::query_as("select entitlements::text from core.tenants")
            .fetch_one(&pool)
            .await
            .expect("the row");
        assert_eq!(defaulted.0, "{}");
    })
    .await;
}

#[tokio::test]
async fn errors_are_classified() {
    with_databases(|dbs| async move {
        // Not migrated: the table is missing, which retrying cannot fix.
        let e = PgTenantDirectory::new(dbs.pool().await)
            .page(None, 10)
            .await
            .expect_err("no core.tenants");
        assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
        assert!(e.to_string().contains("core.tenants"), "{e}");
    })
    .await;
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .expect("a valid URL");
    let e = PgTenantDirectory::new(pool)
        .page(None, 10)
        .await
        .expect_err("nothing listens on port 1");
    assert_eq!(e.class(), ErrorClass::Retryable, "{e}");
}

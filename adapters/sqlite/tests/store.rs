//! `SqliteStore` on real files: the store contract suite and what only SQLite has (the file
//! created on first use, its pragmas, the single writer).
//!
//! Every store gets a file of its own with a unique name under the system's temporary
//! directory, removed (with its WAL and shared-memory files) when its test ends, pass or fail.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use jobs_adapter_sqlite::SqliteStore;
use jobs_core::{
    Claim, ConsumerName, DeadLetterStore, ErrorClass, JobId, NewDeadLetter, ProcessedJobs,
    Recorded, StoreError, WorkStore, WorkTransaction,
};
use jobs_testkit::{contract, fixtures};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

/// Database files for one test, removed by `remove_all`.
#[derive(Default)]
struct Files {
    created: Mutex<Vec<PathBuf>>,
}

impl Files {
    /// A path that does not exist yet: `jobs-sqlite-test-<pid>-<counter>-<random>.db`.
    fn path(&self) -> PathBuf {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let random = RandomState::new().hash_one((pid, n)) as u32;
        let path = std::env::temp_dir().join(format!("jobs-sqlite-test-{pid}-{n}-{random:08x}.db"));
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(path.clone());
        path
    }

    /// A migrated store on a new file.
    async fn store(&self) -> SqliteStore {
        let store = SqliteStore::open(self.path()).await.expect("open");
        store.migrate().await.expect("migrate");
        store
    }

    fn remove_all(&self) {
        let paths =
            std::mem::take(&mut *self.created.lock().unwrap_or_else(PoisonError::into_inner));
        for path in paths {
            for suffix in ["", "-wal", "-shm"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => panic!("remove {}: {e}", Path::new(&file).display()),
                }
            }
        }
    }
}

/// Runs `test` with fresh files and removes them afterwards, also when `test` panics.
async fn with_files<F, Fut>(test: F)
where
    F: FnOnce(Arc<Files>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let files = Arc::new(Files::default());
    let outcome = tokio::spawn(test(Arc::clone(&files))).await;
    files.remove_all();
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test task failed: {e}"),
        }
    }
}

fn consumer() -> ConsumerName {
    "test.invoicer".parse().expect("a valid consumer name")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract() {
    with_files(|files| async move {
        contract::store::run(|| {
            let files = Arc::clone(&files);
            async move { files.store().await }
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_runs_contract() {
    with_files(|files| async move {
        contract::store::run_bulk_runs(|| {
            let files = Arc::clone(&files);
            async move { files.store().await }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn file_is_created_on_first_use_and_keeps_its_data() {
    with_files(|files| async move {
        let path = files.path();
        assert!(!path.exists());
        let store = SqliteStore::open(&path).await.expect("open");
        assert!(path.exists(), "open must create the file");
        store.migrate().await.expect("migrate");
        store.migrate().await.expect("a second migrate");

        let pragmas: (String, i64, i64, i64) = sqlx::query_as(
            "select (select journal_mode from pragma_journal_mode), \
                    (select timeout from pragma_busy_timeout), \
                    (select foreign_keys from pragma_foreign_keys), \
                    (select synchronous from pragma_synchronous)",
        )
        .fetch_one(store.pool())
        .await
        .expect("read the pragmas");
        assert_eq!(pragmas, ("wal".to_owned(), 5000, 1, 2));

        let job = JobId::generate();
        let mut tx = store.begin().await.expect("begin");
        assert_eq!(
            tx.claim(job, &consumer(), SystemTime::now())
                .await
                .expect("claim"),
            Claim::Claimed
        );
        tx.commit().await.expect("commit");
        let letter = NewDeadLetter {
            job_id: Some(job),
            queue: "test.files".parse().expect("a valid queue name"),
            consumer: None,
            tenant_id: Some(fixtures::tenant(1)),
            kind: Some(fixtures::kind("test.job")),
            correlation_id: Some(fixtures::correlation()),
            payload: vec![0xff, 0x00, 0xfe],
            attempts: 3,
            last_error: "boom".to_owned(),
            reason: None,
            dedup_key: Some(job.to_string()),
            at: SystemTime::now(),
        };
        let id = store.record(letter.clone()).await.expect("record").id();
        store.pool().close().await;
        drop(store);

        let reopened = SqliteStore::open(&path).await.expect("reopen");
        reopened.migrate().await.expect("migrate an existing file");
        assert!(reopened.is_processed(job, &consumer()).await.expect("read"));
        let got = reopened
            .get(id)
            .await
            .expect("get")
            .expect("the letter survives");
        assert_eq!(got.letter.payload, letter.payload);
        assert_eq!(
            reopened.record(letter).await.expect("record again"),
            Recorded::Existing(id),
            "the pending key survives a reopen"
        );
    })
    .await;
}

#[tokio::test]
async fn a_missing_directory_is_a_permanent_failure() {
    with_files(|files| async move {
        let path = files.path().join("no-such-directory").join("jobs.db");
        let e = SqliteStore::open(&path)
            .await
            .expect_err("the directory does not exist");
        assert!(matches!(e, StoreError::Failed { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Permanent);
    })
    .await;
}

#[tokio::test]
async fn a_busy_database_is_unavailable() {
    with_files(|files| async move {
        let path = files.path();
        let store = SqliteStore::open(&path).await.expect("open");
        store.migrate().await.expect("migrate");
        let mut holder = store.begin().await.expect("begin");
        holder
            .claim(JobId::generate(), &consumer(), SystemTime::now())
            .await
            .expect("claim");

        // A second handle on the file that does not wait for locks.
        let impatient = SqliteStore::from_pool(
            SqlitePoolOptions::new()
                .connect_with(
                    SqliteConnectOptions::new()
                        .filename(&path)
                        .busy_timeout(Duration::ZERO),
                )
                .await
                .expect("open a second pool"),
        );
        let e = impatient.begin().await.expect_err("the write lock is held");
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Retryable);
        // Reads go on while the writer works.
        impatient
            .is_processed(JobId::generate(), &consumer())
            .await
            .expect("WAL readers are not blocked");
        holder.rollback().await.expect("rollback");
        let tx = impatient.begin().await.expect("the lock is free again");
        tx.rollback().await.expect("rollback");
    })
    .await;
}

#[tokio::test]
async fn handler_writes_commit_and_roll_back_with_the_claim() {
    with_files(|files| async move {
        let store = files.store().await;
        sqlx::query("create table invoices (job_id text primary key, amount integer not null)")
            .execute(store.pool())
            .await
            .expect("create the business table");
        let invoiced = |job: JobId| {
            let pool = store.pool().clone();
            async move {
                sqlx::query_scalar::<_, bool>(
                    "select exists (select 1 from invoices where job_id = ?1)",
                )
                .bind(job.to_string())
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
        sqlx::query("insert into invoices (job_id, amount) values (?1, 42)")
            .bind(committed.to_string())
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
        sqlx::query("insert into invoices (job_id, amount) values (?1, 7)")
            .bind(rolled_back.to_string())
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

#[tokio::test]
async fn a_store_not_migrated_says_so_and_how_to_fix_it() {
    with_files(|files| async move {
        let store = SqliteStore::open(files.path()).await.expect("opens");
        let consumer = jobs_core::ConsumerName::try_from("test.consumer").expect("valid");
        let e =
            jobs_core::ProcessedJobs::is_processed(&store, jobs_core::JobId::generate(), &consumer)
                .await
                .expect_err("no tables before migrate");
        assert!(matches!(e, StoreError::SchemaMissing { .. }), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().ends_with("(run `jobsctl migrate`)"), "{e}");
    })
    .await;
}

#[tokio::test]
async fn a_letter_written_with_an_invalid_kind_is_listed_as_unreadable() {
    with_files(|files| async move {
        let store = files.store().await;
        let pool = store.pool().clone();
        contract::listing::reads_around_an_unreadable_letter(store, "kind", |id| async move {
            sqlx::query("update dead_letters set kind = 'Not A Kind' where id = ?1")
                .bind(id.0)
                .execute(&pool)
                .await
                .expect("spoil the row");
        })
        .await;
    })
    .await;
}

//! From sqlx errors to the port's [`StoreError`]: transient failures are `Unavailable` (the
//! runtime retries the job later), everything else is `Failed`.

use jobs_core::StoreError;

/// `SQLITE_BUSY`: another connection holds the lock past the busy timeout.
const SQLITE_BUSY: i32 = 5;
/// `SQLITE_LOCKED`: a conflict inside one connection or a shared cache.
const SQLITE_LOCKED: i32 = 6;

/// Whether `e` is worth retrying: the database is busy or locked (by primary result code, so
/// every extended `SQLITE_BUSY_*` code counts), the pool is exhausted or closing, or a
/// connection's I/O or worker thread failed.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED)),
        _ => false,
    }
}

/// `what` failed with `e`, classified by [`is_transient`]; the sqlx error is kept as source.
pub(crate) fn store_error(what: &str, e: sqlx::Error) -> StoreError {
    let message = format!("{what}: {e}");
    let transient = is_transient(&e);
    // SQLite says it only in words: `no such table: core_processed_jobs`.
    let schema = matches!(&e, sqlx::Error::Database(db)
        if db.message().starts_with("no such table") || db.message().starts_with("no such column"));
    let source = Some(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
    if schema {
        StoreError::SchemaMissing { message, source }
    } else if transient {
        StoreError::Unavailable { message, source }
    } else {
        StoreError::Failed { message, source }
    }
}

/// A stored value that does not decode into the port's types: the row is corrupt, which
/// retrying cannot fix.
pub(crate) fn corrupt(
    what: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> StoreError {
    StoreError::Failed {
        message: format!("corrupt row: {what}: {source}"),
        source: Some(Box::new(source)),
    }
}

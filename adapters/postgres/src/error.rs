//! From sqlx errors to the port's [`StoreError`]: transient failures are `Unavailable` (the
//! runtime retries the job later), everything else is `Failed`.

use jobs_core::{ErrorClass, StoreError};

/// SQLSTATEs after which the same statement may succeed: serialization failure, deadlock,
/// the server shutting down, restarting or not yet accepting connections, too many
/// connections.
const TRANSIENT_SQLSTATES: [&str; 6] = ["40001", "40P01", "57P01", "57P02", "57P03", "53300"];

/// The SQLSTATEs of a transaction aborted by a conflict with another: serialization failure
/// and deadlock. Running the whole transaction again may succeed.
const CONFLICT_SQLSTATES: [&str; 2] = ["40001", "40P01"];

/// The SQLSTATEs of a schema that is missing or behind: undefined table, schema, column or
/// function.
const SCHEMA_SQLSTATES: [&str; 4] = ["42P01", "3F000", "42703", "42883"];

pub(crate) fn is_schema_missing(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|code| SCHEMA_SQLSTATES.contains(&&*code)))
}

fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|code| CONFLICT_SQLSTATES.contains(&&*code)))
}

/// Whether `e` is worth retrying: pool exhaustion or closing, I/O (connection refused, reset,
/// closed), a connection exception (SQLSTATE class 08) or one of [`TRANSIENT_SQLSTATES`].
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || TRANSIENT_SQLSTATES.contains(&&*code)),
        _ => false,
    }
}

/// Whether `e` says the connection was closed under the statement (the server terminated
/// it, restarted, or the socket was reset), as opposed to the server being unreachable: a
/// statement on another connection may succeed at once.
pub(crate) fn is_broken_connection(e: &sqlx::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::UnexpectedEof
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
        ),
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code == "57P01" || code == "57P02"),
        _ => false,
    }
}

/// `what` failed with `e`: a conflict ([`CONFLICT_SQLSTATES`]) is [`StoreError::Conflict`],
/// else classified by [`is_transient`]; the sqlx error is kept as source.
pub(crate) fn store_error(what: &str, e: sqlx::Error) -> StoreError {
    let message = format!("{what}: {e}");
    let conflict = is_conflict(&e);
    let transient = is_transient(&e);
    let schema = is_schema_missing(&e);
    let source = Some(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
    if conflict {
        StoreError::Conflict { message, source }
    } else if schema {
        StoreError::SchemaMissing { message, source }
    } else if transient {
        StoreError::Unavailable { message, source }
    } else {
        StoreError::Failed { message, source }
    }
}

/// How a handler's own `sqlx::Error` should count, classified as [`PgStore`](crate::PgStore)
/// classifies its own, so that a missing table is not retried for a whole retry policy:
/// a lost or refused connection, an exhausted pool, a serialization failure, a deadlock, a
/// server shutting down or out of connections are [`ErrorClass::Retryable`]; everything
/// else (an undefined table or column, a constraint violation, a data error, a syntax error,
/// a row not found) is [`ErrorClass::Permanent`]. With `JobError::classed` in a handler:
///
/// ```
/// # use jobs_adapter_postgres::{error_class, sqlx};
/// # use jobs_core::ErrorClass;
/// let e = sqlx::Error::PoolTimedOut;
/// assert_eq!(error_class(&e), ErrorClass::Retryable);
/// // In a handler: `.map_err(|e| JobError::classed(error_class(&e), e))`.
/// ```
pub fn error_class(e: &sqlx::Error) -> ErrorClass {
    if is_transient(e) || is_conflict(e) {
        ErrorClass::Retryable
    } else {
        ErrorClass::Permanent
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

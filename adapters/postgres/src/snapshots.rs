//! Who holds the oldest snapshot in the database: while a transaction that took a snapshot
//! stays open (`pg_dump`, a report, a session idle in a transaction), vacuum cannot remove the
//! rows deleted after it began, and every fetch of the PostgreSQL queue walks past the dead
//! entries each job leaves behind (issue 38, ADR 0015). Operators need its pid to end it.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::store_error;
use jobs_core::StoreError;

/// The session holding the database's oldest snapshot (`pg_stat_activity.backend_xmin`), other
/// than the one asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotHolder {
    /// Its backend's pid (`pg_terminate_backend(pid)` ends it).
    pub pid: i32,
    /// What it called itself (`application_name`), empty when it said nothing.
    pub application: String,
    /// Who it connected as.
    pub user: String,
    /// `active`, `idle in transaction`, …
    pub state: String,
    /// How long its transaction has been open.
    pub held_for: Duration,
}

/// `pid, application_name, usename, state`, and seconds since its transaction began.
type HolderRow = (i32, Option<String>, Option<String>, Option<String>, f64);

/// The session of this database whose snapshot is the oldest (by the age of its
/// `backend_xmin`), if any session but this one holds one. Reads `pg_stat_activity`, which
/// any role may read for its own database (other roles' `query` aside, which this does not
/// read).
pub async fn oldest_snapshot(pool: &PgPool) -> Result<Option<SnapshotHolder>, StoreError> {
    let row: Option<HolderRow> = sqlx::query_as(
        "select pid, application_name, usename::text, state, \
                 extract(epoch from now() - coalesce(xact_start, backend_start))::float8 \
             from pg_stat_activity \
             where backend_xmin is not null and pid <> pg_backend_pid() \
               and datname = current_database() and backend_type = 'client backend' \
             order by age(backend_xmin) desc \
             limit 1",
    )
    .fetch_optional(pool)
    .await
    .map_err(|e| store_error("read pg_stat_activity", e))?;
    Ok(
        row.map(|(pid, application, user, state, seconds)| SnapshotHolder {
            pid,
            application: application.unwrap_or_default(),
            user: user.unwrap_or_default(),
            state: state.unwrap_or_default(),
            held_for: Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::ZERO),
        }),
    )
}

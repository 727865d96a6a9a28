//! `core.processed_jobs` in slices (ADR 0014): 64 list partitions, one per day of the job id's
//! UUIDv7 time modulo 64 ([`slot`]).
//!
//! The claim path writes into the slice itself, not through the parent: a claim then costs
//! what it cost in one table (no tuple routing, no lock on the parent or the other slices).
//! Statements for a set of ids in several slices (rare: a group spanning midnight, a replay of
//! an old id beside new ones) go through the parent, which routes each row.
//!
//! The TTL cleanup empties a slice whose claims expired with one `TRUNCATE`, putting back the
//! few it keeps (claims not yet expired, claims of pending dead letters), so its cost follows
//! the claims kept, not the claims removed, and the space comes back without a vacuum. What it
//! leaves (a slice in use, or one with too many claims to keep) goes in bounded batches, slice
//! by slice.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use jobs_core::StoreError;
use sqlx::types::Uuid;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::convert::to_timestamp;
use crate::error::store_error;

/// How many slices `core.processed_jobs` has: the migration's 64, so a slice takes new ids
/// again 64 days after its day, long after the default TTL (30 days) emptied it.
const SLICES: i16 = 64;

/// The span of a slice's ids: a day (`core.processed_slot`'s divisor).
pub(crate) const SLICE_SPAN: Duration = Duration::from_secs(86_400);

/// The slice of a job id: its first 48 bits (a UUIDv7's milliseconds) in days, modulo
/// [`SLICES`]; what `core.processed_slot` computes, and the slice's check constraint holds
/// every row to it.
pub(crate) fn slot(job_id: Uuid) -> i16 {
    let bytes = job_id.as_bytes();
    let ms = bytes[..6]
        .iter()
        .fold(0u64, |ms, &byte| ms << 8 | u64::from(byte));
    let day = ms / SLICE_SPAN.as_millis() as u64;
    // Below SLICES, so within i16.
    (day % SLICES as u64) as i16
}

/// The one slice all of `job_ids` fall in, or `None` when they span several (or none).
pub(crate) fn common_slot(job_ids: &[Uuid]) -> Option<i16> {
    let (first, rest) = job_ids.split_first()?;
    let slot = slot(*first);
    rest.iter()
        .all(|id| self::slot(*id) == slot)
        .then_some(slot)
}

/// Writes a statement for a table (`core.processed_jobs_NNN`, or the parent), given the slot
/// expression of a row from its id's column: the slice's number, or a call of
/// `core.processed_slot` for the parent.
pub(crate) type Template = fn(&str, &dyn Fn(&str) -> String) -> String;

/// A statement written once for each slice and once for the parent, built on first use.
pub(crate) struct PerSlice {
    make: Template,
    built: OnceLock<Vec<String>>,
}

impl PerSlice {
    pub(crate) const fn new(make: Template) -> Self {
        PerSlice {
            make,
            built: OnceLock::new(),
        }
    }

    /// The statement for `slot`'s slice, or for the parent when `None`.
    pub(crate) fn get(&'static self, slot: Option<i16>) -> &'static str {
        let built = self.built.get_or_init(|| {
            let parent = (self.make)("core.processed_jobs", &|id| {
                format!("core.processed_slot({id})")
            });
            std::iter::once(parent)
                .chain((0..SLICES).map(|s| (self.make)(&slice_table(s), &|_| s.to_string())))
                .collect()
        });
        slot.map_or(&built[0], |s| &built[usize::try_from(s).unwrap_or(0) + 1])
    }
}

/// The name of slice `slot`'s table.
fn slice_table(slot: i16) -> String {
    format!("core.processed_jobs_{slot:03}")
}

/// How long emptying a slice waits for its lock. A slice in use (an open transaction that
/// claimed an old id in it, a report reading the table) is left for a later run rather than
/// making the claims queued behind the cleanup's lock wait longer.
const LOCK_TIMEOUT: &str = "set local lock_timeout = '50ms'";

/// A slice with more claims to keep than this is left to the batches: putting them back would
/// cost more than deleting the rest.
const MOST_KEPT: i64 = 10_000;

/// SQLSTATE `lock_not_available`: the lock timeout passed.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// One bounded batch of the TTL cleanup in one slice: `$1` the cutoff, `$2` the batch, `$3`
/// the slice; by `ctid`, which is unique within one slice. A claim whose job waits in the dead
/// letters is kept, however old: without it a republished or redelivered copy would claim
/// again and run behind the operator's back (replaying the letter releases it).
const PURGE_SLICE: &str = "delete from core.processed_jobs where slot = $3 and ctid = any(array( \
    select p.ctid from core.processed_jobs p where p.slot = $3 and p.processed_at < $1 \
    and not exists (select 1 from core.dead_letters d where d.job_id = p.job_id \
        and d.consumer = p.consumer and d.status = 'pending_review') \
    limit $2))";

/// The slices holding a claim processed before `$1` (`$2`: [`SLICES`]): one probe of the
/// oldest claim's index entry per slice (a `min`, not an `exists`, which the planner may turn
/// into a scan of every expired claim).
const EXPIRED_SLICES: &str = "select g.s \
    from (select n::smallint as s from generate_series(0, $2 - 1) as n) as g \
    where (select min(p.processed_at) from core.processed_jobs p where p.slot = g.s) < $1";

/// How many rows the slice `$1` holds, as PostgreSQL's statistics count them
/// (`pg_stat_user_tables.n_live_tup`): what emptying it reports as removed. A `count(*)` would
/// read the whole slice, the one cost the `TRUNCATE` exists to avoid (a third of the cleanup's
/// time at 10 million claims, bench/RESULTS.md). The figure lags the slice's last writes by up
/// to a few seconds, and is zero after a statistics reset; for a slice whose claims expired
/// days ago it is exact.
const LIVE_ROWS: &str = "select coalesce(pg_stat_get_live_tuples($1::regclass), 0)";

/// The claims of the slice `table` that emptying it keeps, at most `$2` of each kind: those
/// processed at or after `$1` (read from the `processed_at` index), and older ones of jobs
/// waiting in the dead letters (a key probe per pending letter), so that choosing them costs
/// what is kept, not the slice.
fn kept(table: &str) -> String {
    format!(
        "(select p.job_id, p.consumer, p.processed_at from {table} p \
          where p.processed_at >= $1 limit $2) \
         union all \
         (select p.job_id, p.consumer, p.processed_at from {table} p \
          join (select distinct d.job_id, d.consumer from core.dead_letters d \
                where d.status = 'pending_review') as d \
            on p.job_id = d.job_id and p.consumer = d.consumer \
          where p.processed_at < $1 limit $2)"
    )
}

/// Deletes at most `batch` claims processed before `older_than` on `conn`, slice after slice
/// ([`PURGE_SLICE`]); returns how many.
pub(crate) async fn purge_batch(
    conn: &mut PgConnection,
    older_than: SystemTime,
    batch: u32,
) -> Result<u64, StoreError> {
    let cutoff = to_timestamp(older_than)?;
    let failed = |e| store_error("purge core.processed_jobs", e);
    let slices: Vec<i16> = sqlx::query_scalar(EXPIRED_SLICES)
        .bind(cutoff)
        .bind(SLICES)
        .fetch_all(&mut *conn)
        .await
        .map_err(failed)?;
    let mut done = 0;
    for slice in slices {
        let left = u64::from(batch) - done;
        if left == 0 {
            break;
        }
        done += sqlx::query(PURGE_SLICE)
            .bind(cutoff)
            .bind(i64::try_from(left).unwrap_or(i64::MAX))
            .bind(slice)
            .execute(&mut *conn)
            .await
            .map_err(failed)?
            .rows_affected();
    }
    Ok(done)
}

/// Empties every slice holding claims processed before `older_than`, but for the claims it
/// keeps; returns how many rows went, as the statistics count them ([`LIVE_ROWS`]). A slice
/// in use, or with more than [`MOST_KEPT`] claims to keep, is left as it is.
pub(crate) async fn purge_expired_slices(
    pool: &PgPool,
    older_than: SystemTime,
) -> Result<u64, StoreError> {
    let cutoff = to_timestamp(older_than)?;
    let slices: Vec<i16> = sqlx::query_scalar(EXPIRED_SLICES)
        .bind(cutoff)
        .bind(SLICES)
        .fetch_all(pool)
        .await
        .map_err(|e| store_error("find the expired slices of core.processed_jobs", e))?;
    let mut gone = 0;
    for slice in slices {
        match empty(pool, slice, cutoff).await {
            Ok(Emptied::Rows(rows)) => gone += rows,
            Ok(Emptied::Left { kept }) => {
                tracing::debug!(
                    slice,
                    kept,
                    "a slice of core.processed_jobs keeps too many claims to empty: left to the batches"
                );
            }
            Err(e) if is_lock_timeout(&e) => {
                tracing::info!(
                    slice,
                    "a slice of core.processed_jobs is in use: left for a later cleanup"
                );
            }
            Err(e) => return Err(store_error("empty a slice of core.processed_jobs", e)),
        }
    }
    Ok(gone)
}

/// What emptying a slice did.
enum Emptied {
    /// It removed this many rows.
    Rows(u64),
    /// It left the slice as it was: it has at least `kept` claims to keep.
    Left { kept: i64 },
}

/// Empties `slice` in one transaction, under the slice's own lock (taken within
/// [`LOCK_TIMEOUT`]): reads the claims to keep ([`kept`]) and the slice's live rows
/// ([`LIVE_ROWS`]), truncates it and puts them back. Claims of other slices never wait for it.
async fn empty(pool: &PgPool, slice: i16, cutoff: DateTime<Utc>) -> Result<Emptied, sqlx::Error> {
    let table = slice_table(slice);
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
    sqlx::query(AssertSqlSafe(format!(
        "lock table {table} in access exclusive mode"
    )))
    .execute(&mut *tx)
    .await?;
    let rows: Vec<(Uuid, String, DateTime<Utc>)> = sqlx::query_as(AssertSqlSafe(kept(&table)))
        .bind(cutoff)
        .bind(MOST_KEPT + 1)
        .fetch_all(&mut *tx)
        .await?;
    let kept = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    if kept > MOST_KEPT {
        tx.rollback().await?;
        return Ok(Emptied::Left { kept });
    }
    let total: i64 = sqlx::query_scalar(LIVE_ROWS)
        .bind(&table)
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(AssertSqlSafe(format!("truncate {table}")))
        .execute(&mut *tx)
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut consumers = Vec::with_capacity(rows.len());
    let mut times = Vec::with_capacity(rows.len());
    for (id, consumer, at) in rows {
        ids.push(id);
        consumers.push(consumer);
        times.push(at);
    }
    sqlx::query(AssertSqlSafe(format!(
        "insert into {table} (job_id, consumer, processed_at, slot) \
         select k.job_id, k.consumer, k.processed_at, $4 \
         from unnest($1::uuid[], $2::text[], $3::timestamptz[]) as k(job_id, consumer, processed_at)"
    )))
    .bind(&ids)
    .bind(&consumers)
    .bind(&times)
    .bind(slice)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Emptied::Rows(
        u64::try_from(total.saturating_sub(kept)).unwrap_or(0),
    ))
}

/// Whether `e` is the lock timeout passing.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_at_ms(ms: u64) -> Uuid {
        let mut bytes = [0x77; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        Uuid::from_bytes(bytes)
    }

    #[test]
    fn a_slot_is_the_ids_day_modulo_the_slices() {
        let day = SLICE_SPAN.as_millis() as u64;
        assert_eq!(slot(id_at_ms(0)), 0);
        assert_eq!(slot(id_at_ms(day - 1)), 0, "the day's last millisecond");
        assert_eq!(slot(id_at_ms(day)), 1);
        assert_eq!(slot(id_at_ms(63 * day)), 63);
        assert_eq!(slot(id_at_ms(64 * day)), 0, "the ring turns");
        assert_eq!(
            slot(id_at_ms(0xFFFF_FFFF_FFFF)),
            ((0xFFFF_FFFF_FFFF / day) % 64) as i16
        );
    }

    #[test]
    fn ids_share_a_slot_only_when_all_fall_in_it() {
        let day = SLICE_SPAN.as_millis() as u64;
        assert_eq!(common_slot(&[]), None);
        assert_eq!(common_slot(&[id_at_ms(5 * day)]), Some(5));
        assert_eq!(
            common_slot(&[id_at_ms(5 * day), id_at_ms(69 * day)]),
            Some(5)
        );
        assert_eq!(common_slot(&[id_at_ms(5 * day), id_at_ms(6 * day)]), None);
    }

    #[test]
    fn a_statement_names_its_slice_or_the_parent() {
        static READ: PerSlice =
            PerSlice::new(|table, slot| format!("select from {table} where slot = {}", slot("$1")));
        assert_eq!(
            READ.get(None),
            "select from core.processed_jobs where slot = core.processed_slot($1)"
        );
        assert_eq!(
            READ.get(Some(7)),
            "select from core.processed_jobs_007 where slot = 7"
        );
        assert_eq!(
            READ.get(Some(63)),
            "select from core.processed_jobs_063 where slot = 63"
        );
    }
}

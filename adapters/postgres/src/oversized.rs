//! Rows of `core.jobs` over the envelope limit (feature `queue`): written by direct SQL or a
//! version that did not check the limit at publish. The fetches lease them without reading
//! their payload (they compare its length first, so a worker never holds more than the limit
//! per job), and [`divert`] moves them to `core.dead_letters`, their bytes copied inside the
//! database, with a reason saying why.

use std::time::SystemTime;

use jobs_core::{DecodeLimits, QueueError, QueueName};
use sqlx::PgPool;

use crate::rows::{queue_error, timestamp};

/// The limit as the fetches bind it: PostgreSQL's `octet_length` is an `integer`, and no
/// `bytea` is longer than `i32::MAX`, so a larger limit admits every row.
pub(crate) fn max_bytes(limits: &DecodeLimits) -> i32 {
    i32::try_from(limits.max_envelope_bytes()).unwrap_or(i32::MAX)
}

/// Deletes the rows `leased` (`(id, generation)` pairs the caller's fetch leased) of `queue`
/// and records each as a pending dead letter in the same statement, with the tenant the row
/// carried, its payload, its deliveries as attempts, and its id as the dedup key (as the
/// runtime keys the letter of a payload it cannot read). A row whose lease passed on since the
/// fetch is left alone: its new holder diverts it. Returns how many rows it moved.
pub(crate) async fn divert(
    pool: &PgPool,
    queue: &QueueName,
    limits: &DecodeLimits,
    now: SystemTime,
    leased: &[(i64, i64)],
) -> Result<u64, QueueError> {
    if leased.is_empty() {
        return Ok(0);
    }
    let (ids, generations): (Vec<i64>, Vec<i64>) = leased.iter().copied().unzip();
    let moved = sqlx::query(
        "with taken as (delete from core.jobs j \
             using unnest($2::bigint[], $3::bigint[]) as t(id, generation) \
             where j.id = t.id and j.lease_gen = t.generation and j.leased and j.queue = $1 \
             returning j.id, j.tenant_id, j.payload, j.deliveries) \
         insert into core.dead_letters (queue, tenant_id, payload, attempts, last_error, \
             dedup_key, created_at, updated_at, reason) \
         select $1, tenant_id, payload, deliveries, \
             format('the envelope is %s bytes, over the limit of %s bytes: moved here by the \
                     fetch without being read', octet_length(payload), $4::bigint), \
             id::text, $5, $5, 'too_large' \
         from taken \
         on conflict (queue, dedup_key) \
             where status = 'pending_review' and dedup_key is not null do nothing",
    )
    .bind(queue.as_str())
    .bind(&ids)
    .bind(&generations)
    .bind(i64::try_from(limits.max_envelope_bytes()).unwrap_or(i64::MAX))
    .bind(timestamp(queue, now)?)
    .execute(pool)
    .await
    .map_err(|e| {
        queue_error(
            queue,
            "move rows over the envelope limit to core.dead_letters",
            e,
        )
    })?
    .rows_affected();
    if moved > 0 {
        tracing::error!(
            queue = %queue,
            rows = moved,
            limit = limits.max_envelope_bytes(),
            "jobs over the envelope limit were moved to the dead letters without being read"
        );
    }
    Ok(moved)
}

//! What the queue's modules make of PostgreSQL's answers (feature `queue`): its errors as
//! [`QueueError`]s, times as the timestamps it stores, and leased rows of `core.jobs` as
//! [`Delivery`]s with their lease tokens.
//!
//! Both fetches build deliveries here, the oldest-first one ([`Leased`]) and the fair one
//! ([`deliveries`]), so a lease token is made in one place and read back in one place
//! ([`parse_token`]) whichever fetch leased the row. Both set apart the rows whose payload is
//! over the envelope limit, which the fetch leased without reading ([`Fetched::oversized`]).

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use jobs_core::{Delivery, Lease, QueueError, QueueName, TenantId};
use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::types::Uuid;

use crate::convert::{from_timestamp, to_timestamp};
use crate::error::{is_schema_missing, is_transient};

/// `e` from PostgreSQL as a [`QueueError`] of `queue`: transient failures are
/// [`QueueError::Unavailable`], the rest [`QueueError::Rejected`].
pub(crate) fn queue_error(queue: &QueueName, what: &str, e: sqlx::Error) -> QueueError {
    if is_transient(&e) {
        QueueError::Unavailable {
            queue: queue.clone(),
            message: format!("{what}: {e}"),
            source: Some(Box::new(e)),
        }
    } else if is_schema_missing(&e) {
        QueueError::Rejected {
            queue: queue.clone(),
            reason: format!("{what}: {e} (the schema is missing or behind: run `jobsctl migrate`)"),
        }
    } else {
        QueueError::Rejected {
            queue: queue.clone(),
            reason: format!("{what}: {e}"),
        }
    }
}

/// A time the port handed us that PostgreSQL cannot store.
pub(crate) fn timestamp(queue: &QueueName, t: SystemTime) -> Result<DateTime<Utc>, QueueError> {
    to_timestamp(t).map_err(|e| QueueError::Rejected {
        queue: queue.clone(),
        reason: e.to_string(),
    })
}

/// What one fetch asks for: at most `max` rows, leased for `lease`, payloads read up to
/// `max_bytes` (longer ones are leased unread, [`Fetched::oversized`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch {
    pub(crate) max: usize,
    pub(crate) lease: std::time::Duration,
    pub(crate) max_bytes: i32,
}

/// What a fetch leased: the deliveries, and the rows over the envelope limit, leased but with
/// their payload left in the database, as `(id, generation)` for
/// [`oversized::divert`](crate::oversized::divert).
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) oversized: Vec<(i64, i64)>,
}

/// [`LEASE_STATEMENT`](crate::LEASE_STATEMENT)'s answer.
#[derive(sqlx::FromRow)]
pub(crate) struct Leased {
    first: Option<DateTime<Utc>>,
    ids: Vec<i64>,
    payloads: Vec<Vec<u8>>,
    deliveries: Vec<i32>,
    generations: Vec<i64>,
    expired: Vec<bool>,
    oversized: Vec<bool>,
    tenants: Vec<Option<Uuid>>,
}

impl Leased {
    /// The earliest `visible_at` the leased rows had: where the queue's next fetch may start.
    pub(crate) fn first(&self) -> Option<SystemTime> {
        self.first.and_then(|first| from_timestamp(first).ok())
    }

    /// The deliveries of queue `queue`, each lease ending at `until`, in id order.
    pub(crate) fn deliveries(self, queue: &QueueName, until: SystemTime) -> Fetched {
        let Leased {
            first: _,
            ids,
            payloads,
            deliveries,
            generations,
            expired,
            oversized,
            tenants,
        } = self;
        let rows = payloads
            .into_iter()
            .zip(deliveries)
            .zip(generations)
            .zip(expired)
            .zip(oversized)
            .zip(tenants);
        let mut fetched = Fetched::default();
        for (id, (((((payload, attempt), generation), expired), oversized), tenant)) in
            ids.into_iter().zip(rows)
        {
            if oversized {
                fetched.oversized.push((id, generation));
                continue;
            }
            let lease = Lease::new(queue.clone(), token(id, generation), until);
            let attempt = u32::try_from(attempt).unwrap_or(0);
            fetched.deliveries.push(
                Delivery::new(payload, attempt, Some(id.to_string()), lease)
                    .after_expiry(expired)
                    .with_tenant(tenant_of(tenant)),
            );
        }
        fetched
    }
}

/// The deliveries of rows the fair fetch leased (id, payload, deliveries, generation, lease
/// end, expired), in the order of the integer column `order`: the order its rounds served
/// them. The boolean column `oversized` marks the rows over the envelope limit, and the uuid
/// column `tenant_column` holds each row's tenant.
pub(crate) fn deliveries(
    queue: &QueueName,
    rows: Vec<PgRow>,
    order: usize,
    oversized: usize,
    tenant_column: usize,
) -> Result<Fetched, QueueError> {
    let corrupt = |e: sqlx::Error| queue_error(queue, "read a leased row", e);
    let mut out = Vec::with_capacity(rows.len());
    let mut over = Vec::new();
    for row in rows {
        let id: i64 = row.try_get(0).map_err(corrupt)?;
        if row.try_get::<bool, _>(oversized).map_err(corrupt)? {
            over.push((id, row.try_get(3).map_err(corrupt)?));
            continue;
        }
        let key: i32 = row.try_get(order).map_err(corrupt)?;
        let payload: Vec<u8> = row.try_get(1).map_err(corrupt)?;
        let attempt: i32 = row.try_get(2).map_err(corrupt)?;
        let generation: i64 = row.try_get(3).map_err(corrupt)?;
        let expires: DateTime<Utc> = row.try_get(4).map_err(corrupt)?;
        let expired: bool = row.try_get(5).map_err(corrupt)?;
        let tenant: Option<Uuid> = row.try_get(tenant_column).map_err(corrupt)?;
        let expires_at = from_timestamp(expires).map_err(|e| QueueError::Rejected {
            queue: queue.clone(),
            reason: e.to_string(),
        })?;
        out.push((
            key,
            Delivery::new(
                payload,
                u32::try_from(attempt).unwrap_or(0),
                Some(id.to_string()),
                Lease::new(queue.clone(), token(id, generation), expires_at),
            )
            .after_expiry(expired)
            .with_tenant(tenant_of(tenant)),
        ));
    }
    out.sort_by_key(|(key, _)| *key);
    Ok(Fetched {
        deliveries: out.into_iter().map(|(_, d)| d).collect(),
        oversized: over,
    })
}

/// The tenant a row of `core.jobs` carries, if it is one `TenantId` accepts.
fn tenant_of(uuid: Option<Uuid>) -> Option<TenantId> {
    uuid.and_then(|uuid| uuid.to_string().parse().ok())
}

/// The lease token of row `id` leased with fencing generation `generation`: what
/// [`parse_token`] reads back when the lease is settled.
fn token(id: i64, generation: i64) -> String {
    format!("{id}.{generation}")
}

/// The row id and generation of a lease token [`token`] made; none for any other text (a
/// token of another transport, or garbage), which then holds no row.
pub(crate) fn parse_token(token: &str) -> Option<(i64, i64)> {
    let (id, generation) = token.split_once('.')?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_garbage() {
        assert_eq!(parse_token(&token(42, 7)), Some((42, 7)));
        for bad in ["", "42", "42.", ".7", "a.b", "42.7.1"] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }
}

//! `core.dead_letters`.

use std::time::SystemTime;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use jobs_core::{
    DeadLetter, DeadLetterEvent, DeadLetterFilter, DeadLetterId, DeadLetterStatus, DeadLetterStore,
    ListedLetter, NewDeadLetter, QueueName, Recorded, Resolution, StoreError, TenantId, Transition,
    UnreadableLetter,
};
use sqlx::postgres::PgRow;
use sqlx::types::Uuid;
use sqlx::{AssertSqlSafe, PgConnection, QueryBuilder, Row};

use crate::PgStore;
use crate::convert::{from_timestamp, id_from_uuid, to_timestamp};
use crate::error::{corrupt, store_error};

const COLUMNS: &str = "id, job_id, queue, consumer, tenant_id, kind, correlation_id, payload, \
                       attempts, last_error, dedup_key, status, created_at, updated_at, reason";

/// How often `record` retries when the pending letter it collided with left `pending_review`
/// before it could be read (each retry needs another operator action to race with).
const RECORD_ATTEMPTS: usize = 3;

fn decode_err(e: sqlx::Error) -> StoreError {
    store_error("decode a core.dead_letters row", e)
}

fn parse<T>(id: i64, column: &str, value: &str) -> Result<T, StoreError>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    value
        .parse()
        .map_err(|e| corrupt(format!("dead letter {id}: {column} `{value}`"), e))
}

fn optional_id<T>(column: &str, uuid: Option<Uuid>) -> Result<Option<T>, StoreError>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    uuid.map(|u| id_from_uuid(column, u)).transpose()
}

fn dead_letter(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let id: i64 = row.try_get("id").map_err(decode_err)?;
    let queue: String = row.try_get("queue").map_err(decode_err)?;
    let consumer: Option<String> = row.try_get("consumer").map_err(decode_err)?;
    let kind: Option<String> = row.try_get("kind").map_err(decode_err)?;
    let attempts: i32 = row.try_get("attempts").map_err(decode_err)?;
    let status: String = row.try_get("status").map_err(decode_err)?;
    let created_at: DateTime<Utc> = row.try_get("created_at").map_err(decode_err)?;
    let updated_at: DateTime<Utc> = row.try_get("updated_at").map_err(decode_err)?;
    Ok(DeadLetter {
        id: DeadLetterId(id),
        letter: NewDeadLetter {
            job_id: optional_id("job_id", row.try_get("job_id").map_err(decode_err)?)?,
            queue: parse(id, "queue", &queue)?,
            consumer: consumer.map(|c| parse(id, "consumer", &c)).transpose()?,
            tenant_id: optional_id("tenant_id", row.try_get("tenant_id").map_err(decode_err)?)?,
            kind: kind.map(|k| parse(id, "kind", &k)).transpose()?,
            correlation_id: optional_id(
                "correlation_id",
                row.try_get("correlation_id").map_err(decode_err)?,
            )?,
            payload: row.try_get("payload").map_err(decode_err)?,
            attempts: u32::try_from(attempts)
                .map_err(|e| corrupt(format!("dead letter {id}: attempts {attempts}"), e))?,
            last_error: row.try_get("last_error").map_err(decode_err)?,
            reason: (row
                .try_get::<Option<String>, _>("reason")
                .map_err(decode_err)?)
            .map(|r| parse(id, "reason", &r))
            .transpose()?,
            dedup_key: row.try_get("dedup_key").map_err(decode_err)?,
            at: from_timestamp(created_at)?,
        },
        status: parse(id, "status", &status)?,
        updated_at: from_timestamp(updated_at)?,
    })
}

async fn pending_id(
    conn: &mut PgConnection,
    queue: &QueueName,
    dedup_key: &str,
) -> Result<Option<DeadLetterId>, StoreError> {
    let id: Option<i64> = sqlx::query_scalar(
        "select id from core.dead_letters \
         where queue = $1 and dedup_key = $2 and status = 'pending_review'",
    )
    .bind(queue.as_str())
    .bind(dedup_key)
    .fetch_optional(conn)
    .await
    .map_err(|e| store_error("read core.dead_letters", e))?;
    Ok(id.map(DeadLetterId))
}

/// `insert ... on conflict do nothing returning id` against the unique index of pending
/// letters by `(queue, dedup_key)`; on conflict, the pending letter's id. A concurrent
/// record of the same key waits for the first insert and then finds it.
pub(crate) async fn record_on(
    conn: &mut PgConnection,
    letter: &NewDeadLetter,
) -> Result<Recorded, StoreError> {
    let attempts = i32::try_from(letter.attempts).map_err(|e| StoreError::Failed {
        message: format!(
            "attempts {} does not fit an integer column",
            letter.attempts
        ),
        source: Some(Box::new(e)),
    })?;
    let at = to_timestamp(letter.at)?;
    for _ in 0..RECORD_ATTEMPTS {
        let inserted: Option<i64> = sqlx::query_scalar(
            "insert into core.dead_letters (job_id, queue, tenant_id, kind, correlation_id, \
                 payload, attempts, last_error, dedup_key, created_at, updated_at, consumer, \
                 reason) \
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12) \
             on conflict (queue, dedup_key) \
                 where status = 'pending_review' and dedup_key is not null do nothing \
             returning id",
        )
        .bind(letter.job_id.map(|id| id.as_uuid()))
        .bind(letter.queue.as_str())
        .bind(letter.tenant_id.map(|id| id.as_uuid()))
        .bind(letter.kind.as_ref().map(|k| k.as_str()))
        .bind(letter.correlation_id.map(|id| id.as_uuid()))
        .bind(letter.payload.as_slice())
        .bind(attempts)
        .bind(letter.last_error.as_str())
        .bind(letter.dedup_key.as_deref())
        .bind(at)
        .bind(letter.consumer.as_ref().map(|c| c.as_str()))
        .bind(letter.reason.map(|r| r.as_str()))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| store_error("insert into core.dead_letters", e))?;
        if let Some(id) = inserted {
            return Ok(Recorded::New(DeadLetterId(id)));
        }
        // Only a pending letter with the same key conflicts, and a key is present.
        let key = letter.dedup_key.as_deref().unwrap_or_default();
        if let Some(existing) = pending_id(&mut *conn, &letter.queue, key).await? {
            tracing::debug!(queue = %letter.queue, id = %existing, "dead letter already pending");
            return Ok(Recorded::Existing(existing));
        }
    }
    Err(StoreError::unavailable(format!(
        "the pending dead letter of queue {} with dedup key {:?} kept changing",
        letter.queue, letter.dedup_key
    )))
}

impl PgStore {
    /// The rows `filter` matches, in its order. Only the given criteria become predicates, so
    /// the listing indexes serve each shape.
    async fn listed_rows(&self, filter: &DeadLetterFilter) -> Result<Vec<PgRow>, StoreError> {
        let mut query = QueryBuilder::new(format!(
            "select {COLUMNS} from core.dead_letters where true"
        ));
        if let Some(status) = filter.status {
            query.push(" and status = ").push_bind(status.as_str());
        }
        if let Some(queue) = &filter.queue {
            query
                .push(" and queue = ")
                .push_bind(queue.as_str().to_owned());
        }
        if let Some(tenant) = filter.tenant_id {
            query.push(" and tenant_id = ").push_bind(tenant.as_uuid());
        }
        if let Some(kind) = &filter.kind {
            query
                .push(" and kind = ")
                .push_bind(kind.as_str().to_owned());
        }
        if let Some(job) = filter.job_id {
            query.push(" and job_id = ").push_bind(job.as_uuid());
        }
        if let Some(correlation) = filter.correlation_id {
            query
                .push(" and correlation_id = ")
                .push_bind(correlation.as_uuid());
        }
        if let Some(reason) = filter.reason {
            query.push(" and reason = ").push_bind(reason.as_str());
        }
        if let Some(after) = filter.after {
            query.push(" and id > ").push_bind(after.0);
        }
        if let Some(before) = filter.before {
            query.push(" and id < ").push_bind(before.0);
        }
        query
            .push(if filter.newest_first {
                " order by id desc limit "
            } else {
                " order by id limit "
            })
            .push_bind(i64::from(filter.limit));
        query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(|e| store_error("list core.dead_letters", e))
    }
}

/// A listed row as a letter, or, when a column does not read as its type, as an
/// [`UnreadableLetter`] naming why; an error only when not even its id reads.
fn readable(row: &PgRow) -> Result<ListedLetter, StoreError> {
    match dead_letter(row) {
        Ok(letter) => Ok(Ok(letter)),
        Err(why) => {
            let id: i64 = row.try_get("id").map_err(decode_err)?;
            Ok(Err(UnreadableLetter {
                id: DeadLetterId(id),
                why: why.to_string(),
            }))
        }
    }
}

#[async_trait]
impl DeadLetterStore for PgStore {
    /// `insert ... on conflict do nothing returning id` against the unique index of pending
    /// letters by `(queue, dedup_key)`; on conflict, the pending letter's id.
    async fn record(&self, letter: NewDeadLetter) -> Result<Recorded, StoreError> {
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(|e| store_error("connect to record a dead letter", e))?;
        record_on(&mut conn, &letter).await
    }

    async fn get(&self, id: DeadLetterId) -> Result<Option<DeadLetter>, StoreError> {
        // Constants only; the id is bound.
        sqlx::query(AssertSqlSafe(format!(
            "select {COLUMNS} from core.dead_letters where id = $1"
        )))
        .bind(id.0)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("read core.dead_letters", e))?
        .as_ref()
        .map(dead_letter)
        .transpose()
    }

    async fn list(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, StoreError> {
        self.listed_rows(filter)
            .await?
            .iter()
            .map(dead_letter)
            .collect()
    }

    async fn listing(&self, filter: &DeadLetterFilter) -> Result<Vec<ListedLetter>, StoreError> {
        self.listed_rows(filter)
            .await?
            .iter()
            .map(readable)
            .collect()
    }

    async fn pending(
        &self,
        queue: &QueueName,
        dedup_key: &str,
    ) -> Result<Option<DeadLetterId>, StoreError> {
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(|e| store_error("connect to read core.dead_letters", e))?;
        pending_id(&mut conn, queue, dedup_key).await
    }

    /// One `UPDATE ... WHERE status = 'pending_review'` (and the tenant, when given); when it
    /// changes nothing, a read tells `AlreadyDone`, `Conflict` and `NotFound` apart. Another
    /// tenant's letter is `NotFound` whatever its status, so its existence is not revealed.
    /// The event is inserted by the same statement, from the rows the update returned, so it
    /// exists exactly when the change does.
    async fn transition(
        &self,
        id: DeadLetterId,
        to: Resolution,
        tenant: Option<TenantId>,
        at: SystemTime,
        by: &str,
    ) -> Result<Transition, StoreError> {
        let to = to.status();
        let tenant = tenant.map(|t| t.as_uuid());
        // One statement: the status change, for a replay the release of the claim, and the
        // event. The update only moves pending letters, so `pending_review` is the old status.
        let moved: i64 = sqlx::query_scalar(
            "with moved as ( \
                 update core.dead_letters set status = $1, updated_at = $2 \
                 where id = $3 and status = 'pending_review' \
                   and ($4::uuid is null or tenant_id = $4) \
                 returning id, job_id, consumer \
             ), released as ( \
                 delete from core.processed_jobs p using moved \
                 where $1 = 'replayed' and p.job_id = moved.job_id \
                   and p.consumer = moved.consumer \
                   and p.slot = core.processed_slot(moved.job_id) \
             ), logged as ( \
                 insert into core.dead_letter_events (letter_id, at, from_status, to_status, \"by\") \
                 select moved.id, $2, 'pending_review', $1, $5 from moved \
             ) \
             select count(*) from moved",
        )
        .bind(to.as_str())
        .bind(to_timestamp(at)?)
        .bind(id.0)
        .bind(tenant)
        .bind(by)
        .fetch_one(self.pool())
        .await
        .map_err(|e| store_error("update core.dead_letters", e))?;
        if moved == 1 {
            return Ok(Transition::Done);
        }
        let row: Option<(String, Option<Uuid>)> =
            sqlx::query_as("select status, tenant_id from core.dead_letters where id = $1")
                .bind(id.0)
                .fetch_optional(self.pool())
                .await
                .map_err(|e| store_error("read core.dead_letters", e))?;
        let Some((status, owner)) = row else {
            return Ok(Transition::NotFound);
        };
        if tenant.is_some() && owner != tenant {
            return Ok(Transition::NotFound);
        }
        match parse(id.0, "status", &status)? {
            current if current == to => Ok(Transition::AlreadyDone),
            DeadLetterStatus::PendingReview => Err(StoreError::unavailable(format!(
                "dead letter {id} is pending yet was not updated; try again"
            ))),
            current => Ok(Transition::Conflict(current)),
        }
    }

    async fn history(&self, id: DeadLetterId) -> Result<Vec<DeadLetterEvent>, StoreError> {
        let rows: Vec<(DateTime<Utc>, String, String, String)> = sqlx::query_as(
            "select at, from_status, to_status, \"by\" from core.dead_letter_events \
             where letter_id = $1 order by id",
        )
        .bind(id.0)
        .fetch_all(self.pool())
        .await
        .map_err(|e| store_error("read core.dead_letter_events", e))?;
        rows.into_iter()
            .map(|(at, from, to, by)| {
                Ok(DeadLetterEvent {
                    at: from_timestamp(at)?,
                    from: parse(id.0, "history from_status", &from)?,
                    to: parse(id.0, "history to_status", &to)?,
                    by,
                })
            })
            .collect()
    }
}

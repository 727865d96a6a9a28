//! The transactional outbox (feature `queue`, ADR 0011): jobs written to `core.outbox` in the
//! application's own transaction, and a relay forwarding the committed ones to another
//! transport with their dedup keys.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use chrono::{DateTime, Utc};
use jobs_core::{
    Clock, DecodeLimits, Envelope, PublishOptions, QueueError, QueueName, QueuePort, Receipt,
    SystemClock,
};
use sqlx::{PgConnection, PgPool};

use crate::convert::from_timestamp;
use crate::mark::{Mark, Start};
use crate::oversized;
use crate::rows::{queue_error, timestamp};

/// The advisory lock key the relay holds for its transaction: one relay at a time, so rows
/// are forwarded in id order.
const RELAY_LOCK: i64 = 0x6a6f_6273_6f75_7462; // "jobsoutb"

/// Writes jobs to `core.outbox` inside the caller's transaction: the job exists if and only
/// if the business write commits. [`OutboxRelay`] forwards it afterwards.
///
/// ```no_run
/// use jobs_adapter_postgres::Outbox;
/// use jobs_core::{Envelope, PublishOptions, QueueName};
///
/// # async fn run(pool: sqlx::PgPool, job: Envelope) -> Result<(), Box<dyn std::error::Error>> {
/// let outbox = Outbox::new();
/// let queue: QueueName = "billing.invoices".parse()?;
/// let mut tx = pool.begin().await?;
/// sqlx::query("insert into billing.orders (id) values (1)").execute(&mut *tx).await?;
/// outbox.publish_in(&mut tx, &queue, &job, PublishOptions::default()).await?;
/// tx.commit().await?; // both rows, or neither
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Outbox {
    clock: Arc<dyn Clock>,
    limits: DecodeLimits,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox").finish_non_exhaustive()
    }
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox::new()
    }
}

impl Outbox {
    /// An outbox on the system clock.
    pub fn new() -> Self {
        Outbox {
            clock: Arc::new(SystemClock),
            limits: DecodeLimits::default(),
        }
    }

    /// The same outbox reading time from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Refuses, with [`QueueError::TooLarge`] and nothing written, envelopes longer than
    /// `limits` allow: the limits the consumers decode with (the default matches theirs).
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Writes `envelope` for `queue` through `conn` (the caller's transaction). The dedup key
    /// (set in `opts`, else the job id) travels with it, so the target drops a second relay.
    /// The receipt names the outbox row; nothing is queued until the relay forwards it.
    pub async fn publish_in(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let now = self.clock.now();
        let run_at = opts.visible_at(queue, now)?;
        let key = opts.dedup_key_for(envelope);
        self.insert(conn, queue, envelope, &key, run_at, now).await
    }

    /// Like [`Outbox::publish_in`], for delivery at `run_at`, deduplicated by the job id (the
    /// port's `schedule`).
    pub async fn schedule_in(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        envelope: &Envelope,
        run_at: SystemTime,
    ) -> Result<Receipt, QueueError> {
        let opts = PublishOptions::default().run_at(run_at);
        self.publish_in(conn, queue, envelope, opts).await
    }

    async fn insert(
        &self,
        conn: &mut PgConnection,
        queue: &QueueName,
        envelope: &Envelope,
        key: &str,
        run_at: SystemTime,
        now: SystemTime,
    ) -> Result<Receipt, QueueError> {
        let payload = envelope.encode_for(queue, &self.limits)?;
        let id: i64 = sqlx::query_scalar(
            "insert into core.outbox (queue, dedup_key, tenant_id, payload, run_at, created_at) \
             values ($1, $2, $3, $4, $5, $6) returning id",
        )
        .bind(queue.as_str())
        .bind(key)
        .bind(envelope.tenant_id.as_uuid())
        .bind(payload)
        .bind(timestamp(queue, run_at.max(now))?)
        .bind(timestamp(queue, now)?)
        .fetch_one(conn)
        .await
        .map_err(|e| queue_error(queue, "insert into core.outbox", e))?;
        Ok(Receipt::queued(Some(format!("outbox:{id}"))))
    }
}

/// Forwards committed `core.outbox` rows to another transport.
///
/// Each [`OutboxRelay::relay_once`] is one transaction holding an advisory lock (a second
/// relay waits), reading rows in id order, publishing each with its dedup key and deleting
/// what was forwarded. A relay that dies mid-batch commits nothing, so the rows are forwarded
/// again and the target drops the copies by key: no job is lost or doubled downstream, as
/// long as the target deduplicates for longer than the relay takes to come back.
///
/// The relay and its clones read the outbox from a low-water mark (ADR 0015): the first id
/// the last read found, so that a snapshot held elsewhere does not make every read walk the
/// rows forwarded since. A row committed with an id below it (a transaction that took its id
/// before the last read and committed after it) is forwarded by the next sweep from the
/// start, at most a second later (longer while a held snapshot makes sweeps slow).
///
/// A row that can never be forwarded (a payload over the envelope limit, read only for its
/// length, or one that does not decode, or a queue name that is not valid: rows written by
/// direct SQL or an older version) does not hold up the rows behind it: the same transaction
/// moves it to `core.dead_letters` with its bytes, copied inside the database, and a reason.
#[derive(Clone)]
pub struct OutboxRelay {
    pool: PgPool,
    target: Arc<dyn QueuePort>,
    clock: Arc<dyn Clock>,
    mark: Arc<Mutex<Option<Mark<i64>>>>,
    limits: DecodeLimits,
}

impl fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxRelay").finish_non_exhaustive()
    }
}

/// The name errors of the relay itself carry.
fn outbox_name() -> QueueName {
    "core.outbox".parse().expect("a valid queue name")
}

/// A stored outbox row.
#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    queue: String,
    dedup_key: String,
    payload: Vec<u8>,
    size: i32,
    run_at: DateTime<Utc>,
}

impl OutboxRelay {
    /// A relay from the outbox in `pool`'s database to `target`, on the system clock.
    pub fn new(pool: PgPool, target: Arc<dyn QueuePort>) -> Self {
        OutboxRelay {
            pool,
            target,
            clock: Arc::new(SystemClock),
            mark: Arc::default(),
            limits: DecodeLimits::default(),
        }
    }

    /// The same relay reading time from `clock` (for the remaining delay of a row).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Reads rows with `limits` (those of the [`Outbox`] that writes them): a longer payload
    /// is left unread in the database and its row becomes a dead letter.
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Forwards up to `batch` committed rows, oldest first, and returns how many left the
    /// outbox (forwarded, or moved to the dead letters as unforwardable).
    ///
    /// The first forward that fails stops the batch, so no later row of the same tenant
    /// overtakes it: the rows before it are deleted, it and the rest stay for the next call,
    /// and its error is returned.
    pub async fn relay_once(&self, batch: usize) -> Result<usize, QueueError> {
        let outbox = outbox_name();
        let err = |what: &'static str| {
            let outbox = outbox.clone();
            move |e| queue_error(&outbox, what, e)
        };
        let mut tx = self.pool.begin().await.map_err(err("begin a relay"))?;
        sqlx::query("select pg_advisory_xact_lock($1)")
            .bind(RELAY_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(err("take the relay lock"))?;
        let start = Start::at(self.lock_mark().as_ref(), Instant::now());
        let rows: Vec<Row> = sqlx::query_as(
            "select id, queue, dedup_key, run_at, octet_length(payload) as size, \
                 case when octet_length(payload) <= $3 then payload else ''::bytea end \
                 as payload \
             from core.outbox where id >= $2 order by id limit $1",
        )
        .bind(i64::try_from(batch).unwrap_or(i64::MAX))
        .bind(start.from.unwrap_or(i64::MIN))
        .bind(oversized::max_bytes(&self.limits))
        .fetch_all(&mut *tx)
        .await
        .map_err(err("read core.outbox"))?;
        self.learn(start, rows.first().map(|row| row.id));
        let mut forwarded = Vec::with_capacity(rows.len());
        let mut failure = None;
        for row in rows {
            let forward = match self.read(&row) {
                Ok((queue, envelope)) => self.forward(&row, &queue, &envelope).await,
                Err(reason) => dead_letter(&mut tx, &row, &reason, self.clock.now()).await,
            };
            match forward {
                Ok(()) => forwarded.push(row.id),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        sqlx::query("delete from core.outbox where id = any($1)")
            .bind(&forwarded)
            .execute(&mut *tx)
            .await
            .map_err(err("delete forwarded rows from core.outbox"))?;
        tx.commit().await.map_err(err("commit a relay"))?;
        match failure {
            Some(e) => Err(e),
            None => Ok(forwarded.len()),
        }
    }

    fn lock_mark(&self) -> std::sync::MutexGuard<'_, Option<Mark<i64>>> {
        // The mark is replaced whole, never left half-written.
        self.mark.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mark after a read that started as `start` and found `first` as its lowest id:
    /// every committed row at or above the old mark and below `first` was read, or there was
    /// none; a read that found nothing keeps the mark where it was.
    fn learn(&self, start: Start<i64>, first: Option<i64>) {
        let mut mark = self.lock_mark();
        let low = first.or_else(|| mark.map(|mark| mark.low()));
        if let Some(low) = low {
            *mark = Some(Mark::moved(mark.as_ref(), start, low));
        }
    }

    /// The queue and envelope of `row`, or why it can never be forwarded.
    fn read(&self, row: &Row) -> Result<(QueueName, Envelope), String> {
        let limit = self.limits.max_envelope_bytes();
        if usize::try_from(row.size).unwrap_or(usize::MAX) > limit {
            return Err(format!(
                "the envelope is {} bytes, over the limit of {limit} bytes: moved here by the \
                 outbox relay without being read",
                row.size
            ));
        }
        let queue: QueueName = row
            .queue
            .parse()
            .map_err(|e| format!("the outbox row names no valid queue: {e}"))?;
        let envelope = Envelope::decode_with(&row.payload, &self.limits)
            .map_err(|e| format!("the outbox row does not decode: {e}"))?;
        Ok((queue, envelope))
    }

    async fn forward(
        &self,
        row: &Row,
        queue: &QueueName,
        envelope: &Envelope,
    ) -> Result<(), QueueError> {
        let run_at = from_timestamp(row.run_at).map_err(|e| QueueError::Rejected {
            queue: queue.clone(),
            reason: e.to_string(),
        })?;
        let mut opts = PublishOptions::default().dedup_key(row.dedup_key.clone());
        if let Ok(delay) = run_at.duration_since(self.clock.now())
            && !delay.is_zero()
        {
            opts = opts.delay(delay);
        }
        let span = tracing::debug_span!(
            "relay",
            queue = %queue,
            job_id = %envelope.job_id,
            tenant_id = %envelope.tenant_id,
            correlation_id = %envelope.correlation_id,
            kind = %envelope.kind,
        );
        let receipt = self.target.publish(queue, envelope, opts).await?;
        span.in_scope(|| tracing::debug!(duplicate = receipt.duplicate, "forwarded"));
        Ok(())
    }
}

/// Records `row`, which can never be forwarded for `reason`, as a pending dead letter in the
/// relay's transaction `tx`, its payload copied inside the database (never read by the relay)
/// and its tenant kept; deduplicated by the row's id, so a relay that dies before its commit
/// records it once. A row whose queue name is not valid is recorded under `core.outbox`.
async fn dead_letter(
    tx: &mut PgConnection,
    row: &Row,
    reason: &str,
    now: SystemTime,
) -> Result<(), QueueError> {
    let outbox = outbox_name();
    let queue = row
        .queue
        .parse::<QueueName>()
        .unwrap_or_else(|_| outbox.clone());
    sqlx::query(
        "insert into core.dead_letters (queue, tenant_id, payload, attempts, last_error, \
             dedup_key, created_at, updated_at, reason) \
         select $2, tenant_id, payload, 0, $3, 'outbox:' || id, $4, $4, 'unforwardable' \
         from core.outbox where id = $1 \
         on conflict (queue, dedup_key) \
             where status = 'pending_review' and dedup_key is not null do nothing",
    )
    .bind(row.id)
    .bind(queue.as_str())
    .bind(reason)
    .bind(timestamp(&queue, now)?)
    .execute(tx)
    .await
    .map_err(|e| queue_error(&outbox, "move an outbox row to core.dead_letters", e))?;
    tracing::error!(queue = %queue, outbox_row = row.id, reason, "an outbox row that cannot be forwarded became a dead letter");
    Ok(())
}

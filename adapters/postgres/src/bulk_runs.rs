//! `core.bulk_runs` and `core.bulk_run_items`: the journal of bulk dead-letter runs.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use jobs_core::{BulkRun, BulkRunId, BulkRuns, DeadLetterId, Resolution, StoreError};

use crate::PgStore;
use crate::convert::{from_timestamp, to_timestamp};
use crate::error::store_error;

/// How often `start_run` tries again when the unfinished run it collided with was finished
/// before it could be read (each retry needs another operator to finish a run meanwhile).
const START_ATTEMPTS: usize = 3;

/// A run with its items, aggregated in the same statement so progress is read consistently.
/// `$1` is the predicate's parameter.
fn select_runs(runs: &str) -> String {
    format!(
        "select r.id, r.key, r.action, r.ids, r.\"by\", r.started_at, r.finished_at, \
             coalesce(array_agg(i.letter_id order by i.letter_id) \
                 filter (where i.letter_id is not null), '{{}}') as settled, \
             coalesce(array_agg(i.outcome order by i.letter_id) \
                 filter (where i.letter_id is not null), '{{}}') as outcomes \
         from ({runs}) r left join core.bulk_run_items i on i.run_id = r.id \
         group by r.id, r.key, r.action, r.ids, r.\"by\", r.started_at, r.finished_at \
         order by r.id desc"
    )
}

type Row = (
    i64,
    String,
    String,
    Vec<i64>,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Vec<i64>,
    Vec<String>,
);

fn action_str(action: Resolution) -> &'static str {
    match action {
        Resolution::Replay => "replay",
        Resolution::Discard => "discard",
    }
}

fn bulk_run(row: Row) -> Result<BulkRun, StoreError> {
    let (id, key, action, ids, by, started_at, finished_at, settled, outcomes) = row;
    let action = match action.as_str() {
        "replay" => Resolution::Replay,
        "discard" => Resolution::Discard,
        other => {
            return Err(StoreError::failed(format!(
                "corrupt row: bulk run {id}: action `{other}`"
            )));
        }
    };
    Ok(BulkRun {
        id: BulkRunId(id),
        key,
        action,
        ids: ids.into_iter().map(DeadLetterId).collect(),
        settled: settled
            .into_iter()
            .map(DeadLetterId)
            .zip(outcomes)
            .collect::<BTreeMap<_, _>>(),
        by,
        started_at: from_timestamp(started_at)?,
        finished_at: finished_at.map(from_timestamp).transpose()?,
    })
}

impl PgStore {
    async fn runs_where(
        &self,
        runs: &str,
        bind: i64,
        what: &str,
    ) -> Result<Vec<BulkRun>, StoreError> {
        // Built from `runs`, one of this module's literal statements: no input in the text.
        sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(select_runs(runs)))
            .bind(bind)
            .fetch_all(self.pool())
            .await
            .map_err(|e| store_error(what, e))?
            .into_iter()
            .map(bulk_run)
            .collect()
    }

    async fn unfinished_of(&self, key: &str) -> Result<Option<BulkRun>, StoreError> {
        let id: Option<i64> = sqlx::query_scalar(
            "select id from core.bulk_runs where key = $1 and finished_at is null",
        )
        .bind(key)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("read core.bulk_runs", e))?;
        match id {
            Some(id) => self.run(BulkRunId(id)).await,
            None => Ok(None),
        }
    }
}

#[async_trait]
impl BulkRuns for PgStore {
    /// `insert … on conflict do nothing` against the unique index of unfinished keys, then the
    /// unfinished run of the key: two concurrent starts get the same run.
    async fn start_run(
        &self,
        key: &str,
        action: Resolution,
        ids: &[DeadLetterId],
        by: &str,
        at: SystemTime,
    ) -> Result<BulkRun, StoreError> {
        let snapshot: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let at = to_timestamp(at)?;
        for _ in 0..START_ATTEMPTS {
            let inserted: Option<i64> = sqlx::query_scalar(
                "insert into core.bulk_runs (key, action, ids, \"by\", started_at) \
                 values ($1, $2, $3, $4, $5) \
                 on conflict (key) where finished_at is null do nothing \
                 returning id",
            )
            .bind(key)
            .bind(action_str(action))
            .bind(&snapshot)
            .bind(by)
            .bind(at)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| store_error("insert into core.bulk_runs", e))?;
            let run = match inserted {
                Some(id) => self.run(BulkRunId(id)).await?,
                None => self.unfinished_of(key).await?,
            };
            if let Some(run) = run {
                return Ok(run);
            }
        }
        Err(StoreError::unavailable(format!(
            "the unfinished bulk run of `{key}` kept changing"
        )))
    }

    async fn unfinished(&self, key: &str) -> Result<Option<BulkRun>, StoreError> {
        self.unfinished_of(key).await
    }

    /// One statement: the item is inserted only for an id of the run's snapshot, and the
    /// answer tells an unknown run and a foreign id from a recorded (or already recorded) one.
    async fn record_settled(
        &self,
        run: BulkRunId,
        id: DeadLetterId,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let member: Option<bool> = sqlx::query_scalar(
            "with target as ( \
                 select id, $2 = any(ids) as member from core.bulk_runs where id = $1 \
             ), recorded as ( \
                 insert into core.bulk_run_items (run_id, letter_id, outcome) \
                 select id, $2, $3 from target where member \
                 on conflict (run_id, letter_id) do nothing \
             ) \
             select member from target",
        )
        .bind(run.0)
        .bind(id.0)
        .bind(outcome)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("insert into core.bulk_run_items", e))?;
        match member {
            Some(true) => Ok(()),
            Some(false) => Err(StoreError::failed(format!(
                "dead letter {id} is not in bulk run {run}"
            ))),
            None => Err(StoreError::failed(format!("bulk run {run} not found"))),
        }
    }

    async fn finish_run(&self, run: BulkRunId, at: SystemTime) -> Result<(), StoreError> {
        let done = sqlx::query(
            "update core.bulk_runs set finished_at = coalesce(finished_at, $2) where id = $1",
        )
        .bind(run.0)
        .bind(to_timestamp(at)?)
        .execute(self.pool())
        .await
        .map_err(|e| store_error("update core.bulk_runs", e))?;
        if done.rows_affected() == 0 {
            return Err(StoreError::failed(format!("bulk run {run} not found")));
        }
        Ok(())
    }

    async fn run(&self, run: BulkRunId) -> Result<Option<BulkRun>, StoreError> {
        Ok(self
            .runs_where(
                "select * from core.bulk_runs where id = $1",
                run.0,
                "read core.bulk_runs",
            )
            .await?
            .pop())
    }

    async fn runs(&self, limit: u32) -> Result<Vec<BulkRun>, StoreError> {
        self.runs_where(
            "select * from core.bulk_runs order by id desc limit $1",
            i64::from(limit),
            "list core.bulk_runs",
        )
        .await
    }
}

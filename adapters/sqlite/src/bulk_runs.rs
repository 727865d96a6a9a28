//! `bulk_runs` and `bulk_run_items`: the journal of bulk dead-letter runs.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;
use jobs_core::{BulkRun, BulkRunId, BulkRuns, DeadLetterId, Resolution, StoreError};
use sqlx::AssertSqlSafe;

use crate::SqliteStore;
use crate::convert::{from_millis, to_millis};
use crate::error::store_error;

/// How often `start_run` tries again when the unfinished run it collided with was finished
/// before it could be read (each retry needs another operator to finish a run meanwhile).
const START_ATTEMPTS: usize = 3;

const COLUMNS: &str = "id, key, action, ids, \"by\", started_at, finished_at";

type Row = (i64, String, String, String, String, i64, Option<i64>);

fn action_str(action: Resolution) -> &'static str {
    match action {
        Resolution::Replay => "replay",
        Resolution::Discard => "discard",
    }
}

/// The snapshot as the JSON array the `ids` column holds.
fn encode_ids(ids: &[DeadLetterId]) -> String {
    let items: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// The snapshot from the `ids` column, a JSON array of integers.
fn decode_ids(run: i64, text: &str) -> Result<Vec<DeadLetterId>, StoreError> {
    let corrupt = || StoreError::failed(format!("corrupt row: bulk run {run}: ids `{text}`"));
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(corrupt)?;
    if inner.trim().is_empty() {
        return Ok(vec![]);
    }
    inner
        .split(',')
        .map(|id| id.trim().parse().map(DeadLetterId).map_err(|_| corrupt()))
        .collect()
}

fn bulk_run(row: Row, settled: BTreeMap<DeadLetterId, String>) -> Result<BulkRun, StoreError> {
    let (id, key, action, ids, by, started_at, finished_at) = row;
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
        ids: decode_ids(id, &ids)?,
        settled,
        by,
        started_at: from_millis(started_at)?,
        finished_at: finished_at.map(from_millis).transpose()?,
    })
}

impl SqliteStore {
    /// The runs of `rows` with their items. The items are read after the runs, so a run may
    /// show more progress than its row's time of reading: progress only grows.
    async fn with_items(&self, rows: Vec<Row>) -> Result<Vec<BulkRun>, StoreError> {
        let (Some(low), Some(high)) = (
            rows.iter().map(|r| r.0).min(),
            rows.iter().map(|r| r.0).max(),
        ) else {
            return Ok(vec![]);
        };
        let items: Vec<(i64, i64, String)> = sqlx::query_as(
            "select run_id, letter_id, outcome from bulk_run_items \
             where run_id between ?1 and ?2",
        )
        .bind(low)
        .bind(high)
        .fetch_all(self.pool())
        .await
        .map_err(|e| store_error("read bulk_run_items", e))?;
        let mut settled: BTreeMap<i64, BTreeMap<DeadLetterId, String>> = BTreeMap::new();
        for (run, letter, outcome) in items {
            settled
                .entry(run)
                .or_default()
                .insert(DeadLetterId(letter), outcome);
        }
        rows.into_iter()
            .map(|row| {
                let items = settled.remove(&row.0).unwrap_or_default();
                bulk_run(row, items)
            })
            .collect()
    }

    async fn unfinished_of(&self, key: &str) -> Result<Option<BulkRun>, StoreError> {
        // Constants only (`COLUMNS`); the key is bound.
        let row: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "select {COLUMNS} from bulk_runs where key = ?1 and finished_at is null"
        )))
        .bind(key)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("read bulk_runs", e))?;
        Ok(self.with_items(row.into_iter().collect()).await?.pop())
    }
}

#[async_trait]
impl BulkRuns for SqliteStore {
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
        let snapshot = encode_ids(ids);
        let at = to_millis(at)?;
        for _ in 0..START_ATTEMPTS {
            let inserted: Option<i64> = sqlx::query_scalar(
                "insert into bulk_runs (key, action, ids, \"by\", started_at) \
                 values (?1, ?2, ?3, ?4, ?5) \
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
            .map_err(|e| store_error("insert into bulk_runs", e))?;
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

    /// The item is inserted only for an id of the run's snapshot; when nothing was inserted,
    /// a read tells a repeated record from an unknown run or a foreign id.
    async fn record_settled(
        &self,
        run: BulkRunId,
        id: DeadLetterId,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let inserted = sqlx::query(
            "insert into bulk_run_items (run_id, letter_id, outcome) \
             select id, ?2, ?3 from bulk_runs \
             where id = ?1 and exists (select 1 from json_each(bulk_runs.ids) where value = ?2) \
             on conflict (run_id, letter_id) do nothing",
        )
        .bind(run.0)
        .bind(id.0)
        .bind(outcome)
        .execute(self.pool())
        .await
        .map_err(|e| store_error("insert into bulk_run_items", e))?;
        if inserted.rows_affected() == 1 {
            return Ok(());
        }
        let member: Option<bool> = sqlx::query_scalar(
            "select exists (select 1 from json_each(bulk_runs.ids) where value = ?2) \
             from bulk_runs where id = ?1",
        )
        .bind(run.0)
        .bind(id.0)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("read bulk_runs", e))?;
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
            "update bulk_runs set finished_at = coalesce(finished_at, ?2) where id = ?1",
        )
        .bind(run.0)
        .bind(to_millis(at)?)
        .execute(self.pool())
        .await
        .map_err(|e| store_error("update bulk_runs", e))?;
        if done.rows_affected() == 0 {
            return Err(StoreError::failed(format!("bulk run {run} not found")));
        }
        Ok(())
    }

    async fn run(&self, run: BulkRunId) -> Result<Option<BulkRun>, StoreError> {
        // Constants only (`COLUMNS`); the id is bound.
        let row: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "select {COLUMNS} from bulk_runs where id = ?1"
        )))
        .bind(run.0)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| store_error("read bulk_runs", e))?;
        Ok(self.with_items(row.into_iter().collect()).await?.pop())
    }

    async fn runs(&self, limit: u32) -> Result<Vec<BulkRun>, StoreError> {
        // Constants only (`COLUMNS`); the limit is bound.
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "select {COLUMNS} from bulk_runs order by id desc limit ?1"
        )))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| store_error("list bulk_runs", e))?;
        self.with_items(rows).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_through_their_json_array() {
        for ids in [
            vec![],
            vec![DeadLetterId(7)],
            vec![DeadLetterId(3), DeadLetterId(-1), DeadLetterId(12)],
        ] {
            assert_eq!(decode_ids(1, &encode_ids(&ids)).expect("decodes"), ids);
        }
        assert_eq!(
            decode_ids(1, " [ 1 , 2 ] ").expect("spaces are fine"),
            [DeadLetterId(1), DeadLetterId(2)]
        );
        for bad in ["", "[1,,2]", "{}", "[1.5]", "[\"1\"]"] {
            assert!(decode_ids(1, bad).is_err(), "{bad}");
        }
    }
}

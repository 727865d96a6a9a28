//! The PostgreSQL queue's depth ([`QueueDepth`]): counts of `core.jobs` by state and the
//! oldest ready row's time, one statement per queue or for every queue at once.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use jobs_core::{Depth, QueueDepth, QueueError, QueueName};

use super::PgQueue;
use crate::convert::from_timestamp;
use crate::rows::{queue_error, timestamp};

/// The columns of a depth over the rows of `core.jobs` a statement selects, at the time
/// `$now` (SQL): the ready, delayed and in-flight counts, and the oldest ready row's
/// `visible_at`.
macro_rules! counted {
    ($now:literal) => {
        concat!(
            "count(*) filter (where visible_at <= ",
            $now,
            "), count(*) filter (where not leased and visible_at > ",
            $now,
            "), count(*) filter (where leased and visible_at > ",
            $now,
            "), min(visible_at) filter (where visible_at <= ",
            $now,
            ")"
        )
    };
}
/// A row of [`counted!`].
type Counted = (i64, i64, i64, Option<DateTime<Utc>>);

/// The depth a row of [`counted!`] says.
fn depth_of((ready, delayed, in_flight, oldest): Counted) -> Depth {
    let n = |c: i64| u64::try_from(c).unwrap_or(0);
    Depth::new(n(ready), n(delayed), n(in_flight))
        .oldest_ready_at(oldest.and_then(|at| from_timestamp(at).ok()))
}

#[async_trait]
impl QueueDepth for PgQueue {
    /// A lease that expired counts as ready: the row is deliverable again, since its lease's
    /// end, which is then its `visible_at` and so the oldest ready time.
    async fn depth(&self, queue: &QueueName) -> Result<Depth, QueueError> {
        let counted: Counted = sqlx::query_as(concat!(
            "select ",
            counted!("$2"),
            " from core.jobs where queue = $1"
        ))
        .bind(queue.as_str())
        .bind(timestamp(queue, self.clock.now())?)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| queue_error(queue, "count core.jobs", e))?;
        Ok(depth_of(counted))
    }

    /// The queues with rows in `core.jobs`, by name.
    async fn queues(&self) -> Result<Option<Vec<QueueName>>, QueueError> {
        let any: QueueName = "core.jobs".parse().expect("a valid name");
        let names: Vec<String> =
            sqlx::query_scalar("select distinct queue from core.jobs order by 1")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| queue_error(&any, "list the queues of core.jobs", e))?;
        // A row of another program's naming is left out rather than failing the list.
        Ok(Some(names.iter().filter_map(|n| n.parse().ok()).collect()))
    }

    /// One statement over `core.jobs`, grouped by queue, whatever the number of queues.
    async fn depths(&self, also: &[QueueName]) -> Result<Vec<(QueueName, Depth)>, QueueError> {
        let any: QueueName = "core.jobs".parse().expect("a valid name");
        let rows: Vec<(String, i64, i64, i64, Option<DateTime<Utc>>)> = sqlx::query_as(concat!(
            "select queue, ",
            counted!("$1"),
            " from core.jobs group by queue"
        ))
        .bind(timestamp(&any, self.clock.now())?)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| queue_error(&any, "count core.jobs by queue", e))?;
        let mut depths: BTreeMap<QueueName, Depth> = (also.iter())
            .map(|name| (name.clone(), Depth::new(0, 0, 0)))
            .collect();
        // A row of another program's naming is left out, as `queues` leaves it.
        for (queue, ready, delayed, in_flight, oldest) in rows {
            if let Ok(name) = queue.parse() {
                depths.insert(name, depth_of((ready, delayed, in_flight, oldest)));
            }
        }
        Ok(depths.into_iter().collect())
    }
}

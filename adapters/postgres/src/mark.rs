//! Where a fetch starts reading `core.jobs`' ready index (feature `queue`, ADR 0015).
//!
//! A leased job's row moves in the ready index (its `visible_at` becomes the lease's end) and
//! an acked one goes: each leaves a dead entry where it was published. While any snapshot in
//! the database is older than those changes (`pg_dump`, a report, a session idle in a
//! transaction), neither vacuum nor index scans can clear the entries, and a fetch that reads
//! the index from the queue's start visits every one of them: its cost grows with the jobs
//! done since the snapshot began. So each [`PgQueue`](crate::PgQueue) keeps, per queue, a
//! low-water mark below which it does not read:
//!
//! - after a fetch, the mark is the earliest `visible_at` among the rows it leased (the
//!   first ready row in index order), or the fetch's "now" less [`GRACE`] when that is
//!   earlier: a row that commits with a `visible_at` up to [`GRACE`] in the past (a publish
//!   whose commit took that long, a clock that far behind) is still above the mark;
//! - every row committed before a fetch and ready at or above its mark is found in order, so
//!   no such row falls below the mark the fetch sets: not a retry, a deferral or an expired
//!   lease (their times are later than the rows they follow);
//! - a row that does (committed later than [`GRACE`] after its `visible_at`: `publish_in` in
//!   a long transaction, a publisher's clock further behind, a lease statement rolled back)
//!   is found by the next **sweep**, a fetch from the index's start, which runs at most
//!   every [`SWEEP_EVERY`] and no sooner than twenty times the last sweep's length after it
//!   (a sweep's cost grows under a held snapshot): such a row is late by up to that
//!   period, never lost.
//!
//! A fair queue's rows are in another index, by lane (ADR 0013), and its fetch keeps one
//! [`Mark`] per lane by the same rules (`fair.rs`), each lane swept on its own.
//!
//! The mark lives in the process, not the database: a mark in a table would itself leave a
//! dead version per update for the held snapshot to keep.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use jobs_core::QueueName;

/// How far behind a fetch's "now" the mark stays at most: rows committed this long after
/// their `visible_at` are still found without a sweep.
const GRACE: Duration = Duration::from_secs(1);

/// The least time between two sweeps of a queue.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A sweep may take at most this share of the time since the previous one (its inverse).
const SWEEP_SHARE: u32 = 20;

/// The marks of the queues one [`PgQueue`](crate::PgQueue) and its clones fetch oldest first.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    queues: Mutex<HashMap<QueueName, Mark>>,
}

/// Where reads of one range of an index start (a queue's ready rows, a fair queue's lane, the
/// outbox's ids), and when it was last swept. The mark is a time for the queue's indexes and
/// an id for the outbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark<T = SystemTime> {
    low: T,
    swept: Instant,
    sweep_took: Duration,
}

impl<T: Copy> Mark<T> {
    /// Where a read starting at `at` begins: at the mark, or at the index's start (none)
    /// when the sweep is due.
    fn from(&self, at: Instant) -> Option<T> {
        let due = self.swept + SWEEP_EVERY.max(self.sweep_took * SWEEP_SHARE);
        (at < due).then_some(self.low)
    }

    /// The mark at `low` after a read that started as `start` from `previous`.
    pub(crate) fn moved(previous: Option<&Mark<T>>, start: Start<T>, low: T) -> Mark<T> {
        match previous {
            // A read from the mark keeps the sweep's period.
            Some(mark) if start.from.is_some() => Mark { low, ..*mark },
            // A sweep, or the first read.
            _ => Mark {
                low,
                swept: start.at,
                sweep_took: start.at.elapsed(),
            },
        }
    }

    /// Where reads start while no sweep is due.
    pub(crate) fn low(&self) -> T {
        self.low
    }
}

impl Mark {
    /// The mark after a read that started as `start` at `now` (the queue's clock) and found
    /// its first row at `first`, if any; `previous` is the mark it started from.
    pub(crate) fn after(
        previous: Option<&Mark>,
        start: Start,
        now: SystemTime,
        first: Option<SystemTime>,
    ) -> Mark {
        let behind = now.checked_sub(GRACE).unwrap_or(SystemTime::UNIX_EPOCH);
        let low = first.map_or(behind, |first| first.min(behind));
        Mark::moved(previous, start, low)
    }
}

/// Where one read starts, handed back to [`Mark::after`] with its answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start<T = SystemTime> {
    /// The mark, or none for a sweep.
    pub(crate) from: Option<T>,
    at: Instant,
}

impl<T: Copy> Start<T> {
    /// A read starting at `at` from `mark`: at its low mark, or from the index's start when
    /// there is none or its sweep is due.
    pub(crate) fn at(mark: Option<&Mark<T>>, at: Instant) -> Start<T> {
        Start {
            from: mark.and_then(|mark| mark.from(at)),
            at,
        }
    }
}

impl Marks {
    /// Where a fetch of `queue` starts: its mark, or the index's start (a sweep) when the
    /// queue has none yet or its sweep is due.
    pub(crate) fn start(&self, queue: &QueueName) -> Start {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        Start::at(queues.get(queue), Instant::now())
    }

    /// The mark after a fetch of `queue` that started as `start` at `now` (the queue's clock)
    /// and leased rows whose earliest `visible_at` was `first`, if any.
    pub(crate) fn learn(
        &self,
        queue: &QueueName,
        start: Start,
        now: SystemTime,
        first: Option<SystemTime>,
    ) {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        match queues.get_mut(queue) {
            Some(mark) => *mark = Mark::after(Some(mark), start, now, first),
            None => {
                queues.insert(queue.clone(), Mark::after(None, start, now, first));
            }
        }
    }

    /// The mark of `queue`, for a read that must not look below where fetches do; none
    /// before the first fetch.
    pub(crate) fn low(&self, queue: &QueueName) -> Option<SystemTime> {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.get(queue).map(|mark| mark.low)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueName {
        "billing.invoices".parse().unwrap()
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn the_first_fetch_sweeps_and_later_ones_start_at_the_mark() {
        let marks = Marks::default();
        let start = marks.start(&queue());
        assert_eq!(start.from, None);
        marks.learn(&queue(), start, at(1_000), Some(at(900)));
        assert_eq!(marks.start(&queue()).from, Some(at(900)));
        assert_eq!(marks.low(&queue()), Some(at(900)));
    }

    #[test]
    fn the_mark_stays_the_grace_behind_now() {
        let marks = Marks::default();
        marks.learn(&queue(), marks.start(&queue()), at(1_000), Some(at(1_000)));
        assert_eq!(marks.low(&queue()), Some(at(1_000) - GRACE));
        let start = marks.start(&queue());
        marks.learn(&queue(), start, at(2_000), None);
        assert_eq!(marks.low(&queue()), Some(at(2_000) - GRACE));
    }

    #[test]
    fn a_fetch_may_lower_the_mark() {
        let marks = Marks::default();
        marks.learn(&queue(), marks.start(&queue()), at(1_000), Some(at(990)));
        let start = marks.start(&queue());
        marks.learn(&queue(), start, at(1_001), Some(at(500)));
        assert_eq!(marks.low(&queue()), Some(at(500)));
    }

    /// A mark whose last sweep began `ago` and took `took`.
    fn swept(ago: Duration, took: Duration) -> Marks {
        let marks = Marks::default();
        let swept = Instant::now().checked_sub(ago).unwrap();
        let mark = Mark {
            low: at(990),
            swept,
            sweep_took: took,
        };
        marks.queues.lock().unwrap().insert(queue(), mark);
        marks
    }

    #[test]
    fn a_sweep_falls_due_again() {
        let marks = swept(SWEEP_EVERY + Duration::from_millis(100), Duration::ZERO);
        assert_eq!(marks.start(&queue()).from, None);
        let marks = swept(SWEEP_EVERY / 2, Duration::ZERO);
        assert_eq!(marks.start(&queue()).from, Some(at(990)));
    }

    #[test]
    fn a_slow_sweep_waits_twenty_times_its_length() {
        let took = Duration::from_millis(200);
        let marks = swept(SWEEP_EVERY + Duration::from_millis(100), took);
        assert_eq!(marks.start(&queue()).from, Some(at(990)));
        let marks = swept(took * SWEEP_SHARE + Duration::from_millis(100), took);
        assert_eq!(marks.start(&queue()).from, None);
    }

    #[test]
    fn a_fetch_from_the_mark_moves_it_and_keeps_the_sweeps_period() {
        let marks = swept(SWEEP_EVERY / 2, Duration::ZERO);
        let before = marks.queues.lock().unwrap()[&queue()].swept;
        let start = marks.start(&queue());
        assert_eq!(start.from, Some(at(990)));
        marks.learn(&queue(), start, at(1_000), Some(at(995)));
        let mark = marks.queues.lock().unwrap()[&queue()];
        assert_eq!(mark.low, at(995));
        assert_eq!(mark.swept, before, "only a sweep starts the next period");
    }

    #[test]
    fn a_sweep_over_a_mark_starts_the_next_period() {
        let marks = swept(SWEEP_EVERY + Duration::from_millis(100), Duration::ZERO);
        let start = marks.start(&queue());
        assert_eq!(start.from, None);
        marks.learn(&queue(), start, at(1_000), Some(at(995)));
        assert_eq!(marks.start(&queue()).from, Some(at(995)));
    }

    #[test]
    fn a_sweep_remembers_how_long_it_took() {
        let marks = Marks::default();
        let took = Duration::from_millis(1_500);
        let start = Start {
            from: None,
            at: Instant::now().checked_sub(took).unwrap(),
        };
        marks.learn(&queue(), start, at(1_000), Some(at(990)));
        // Twenty times its length from its start: not due for half a minute.
        assert_eq!(marks.start(&queue()).from, Some(at(990)));
    }

    #[test]
    fn queues_keep_their_own_marks() {
        let marks = Marks::default();
        let other: QueueName = "billing.refunds".parse().unwrap();
        marks.learn(&queue(), marks.start(&queue()), at(1_000), Some(at(990)));
        assert_eq!(marks.start(&other).from, None);
    }
}

//! How large the next group is, and how far apart a rerunnable group takes its checkpoints.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// The most a fair worker's group's handlers take in all: a light tenant's job waits for the
/// ones before it in its group, of another tenant's backlog (behind 1 ms handlers, groups of
/// 64 made it wait 56 ms at p99, groups of 30 about 30; 20 waited less but drained a
/// 100,000-job backlog at 0.86 of the oldest-first worker's pace).
const FAIR_GROUP_TIME: Duration = Duration::from_millis(30);

/// The size of a grouped worker's next groups, learnt from the groups before: what fits a
/// transaction's checkpoints, and about `group_time` of the handlers' recent mean time.
#[derive(Debug)]
pub(crate) struct Sizing {
    /// `WorkerConfig::group_size`: the most a group ever holds.
    size: usize,
    /// About how long a group's handlers should take in all.
    time: Duration,
    /// What fits the checkpoints: `size`, or less while groups run out of them.
    fits: AtomicUsize,
    /// The handlers' recent mean time, in nanoseconds (0 before the first).
    handler_ns: AtomicU64,
    /// How often, lately, a job failed after writing, in parts per million (each job weighs
    /// 1/64): how far apart a group of rerunnable jobs takes its checkpoints.
    undo_ppm: AtomicU64,
}

impl Sizing {
    /// Groups of at most `size` jobs holding about `time` of their handlers' mean time, at
    /// most [`FAIR_GROUP_TIME`] when the worker fetches `fair`ly across tenants (its light
    /// tenant's job should not wait behind a group of another's).
    pub(crate) fn new(size: usize, time: Duration, fair: bool) -> Self {
        Sizing {
            size,
            time: if fair {
                time.min(FAIR_GROUP_TIME)
            } else {
                time
            },
            fits: AtomicUsize::new(size),
            handler_ns: AtomicU64::new(0),
            undo_ppm: AtomicU64::new(0),
        }
    }

    /// The most jobs the next group carries: `size`, or fewer while groups run out of their
    /// transaction's checkpoints, or while the handlers take long enough that fewer fill the
    /// group's time (at least one).
    pub(crate) fn next(&self) -> usize {
        let fits = self.fits.load(Relaxed);
        match self.handler_ns.load(Relaxed) {
            0 => fits,
            mean => {
                let in_time = self.time.as_nanos() / u128::from(mean);
                fits.min(usize::try_from(in_time).unwrap_or(usize::MAX).max(1))
            }
        }
    }

    /// The most jobs the loop's next group carries: [`Sizing::next`] once a handler's time is
    /// known, one before, so that a fresh worker's first groups (fetched a group or two ahead
    /// of each other, before any of them ends) do not hold many slow jobs.
    pub(crate) fn next_in_loop(&self) -> usize {
        match self.handler_ns.load(Relaxed) {
            0 => 1,
            _ => self.next(),
        }
    }

    /// The most a group ever holds.
    pub(crate) fn most(&self) -> usize {
        self.size
    }

    /// Sizes the next groups after one whose transaction took `taken` of its `budget` of
    /// checkpoints: a group that `ran_out` gave jobs back, so the next ones hold one job more
    /// than the budget (the first job to write needs none); groups that used at most half of
    /// it grow again, twice as large each time, up to `size`. A steady stream of jobs that
    /// write settles at the budget's size, one that writes nothing at `size`.
    pub(crate) fn fit(&self, taken: usize, budget: usize, ran_out: bool) -> Option<usize> {
        if ran_out {
            let fits = budget.saturating_add(1).min(self.size);
            self.fits.store(fits, Relaxed);
            return Some(fits);
        }
        if taken.saturating_mul(2) <= budget {
            // The checkpoints' limit alone, whatever the handlers' time makes of it.
            let fits = self.fits.load(Relaxed);
            self.fits
                .store(fits.saturating_mul(2).min(self.size), Relaxed);
        }
        None
    }

    /// Folds one handler's run time into the mean (each run weighs an eighth).
    pub(crate) fn timed(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.handler_ns
            .store(folded(self.handler_ns.load(Relaxed), ns), Relaxed);
    }

    /// Folds one job into the rate of failures after writing.
    pub(crate) fn count_undo(&self, undone: bool) {
        let ppm = self.undo_ppm.load(Relaxed);
        let sample = if undone { 1_000_000 } else { 0 };
        self.undo_ppm
            .store(ppm - ppm.div_ceil(64) + sample / 64, Relaxed);
    }

    /// How many jobs that write a group of rerunnable jobs runs between checkpoints: none
    /// while they do not fail after writing. A checkpoint costs about a job's round trip, and
    /// a failure rolls back to the last one and runs again the jobs since (half the interval,
    /// on average), so with a failure rate `p` the interval `sqrt(2 / p)` costs least.
    pub(crate) fn checkpoint_every(&self) -> Option<usize> {
        match self.undo_ppm.load(Relaxed) {
            0 => None,
            ppm => {
                let every = (2_000_000 / ppm).isqrt().max(1);
                Some(usize::try_from(every).unwrap_or(usize::MAX))
            }
        }
    }
}

/// A mean of the handlers' times with one more, `sample`, weighing an eighth; the first
/// sample when `mean` is 0 (nothing measured). Never 0 itself, so that it stays measured.
fn folded(mean: u64, sample: u64) -> u64 {
    let folded = match mean {
        0 => sample,
        _ => mean - mean / 8 + sample / 8,
    };
    folded.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fair_workers_groups_hold_at_most_thirty_milliseconds() {
        let fair = Sizing::new(64, 100 * MS, true);
        fair.timed(MS);
        assert_eq!(fair.next(), 30, "30 ms of 1 ms handlers");
        let tighter = Sizing::new(64, 5 * MS, true);
        tighter.timed(MS);
        assert_eq!(tighter.next(), 5, "its own, tighter bound");
        let oldest_first = Sizing::new(64, 100 * MS, false);
        oldest_first.timed(MS);
        assert_eq!(oldest_first.next(), 64, "100 ms of 1 ms handlers: all 64");
    }

    #[test]
    fn groups_shrink_to_one_more_than_the_budget_and_grow_back_by_doubling() {
        let sizing = Sizing::new(48, 100 * MS, false);
        assert_eq!(sizing.next(), 48);
        assert_eq!(sizing.fit(31, 31, true), Some(32));
        assert_eq!(sizing.next(), 32, "ran out: one more than the budget");
        assert_eq!(sizing.fit(16, 31, false), None);
        assert_eq!(sizing.next(), 32, "more than half the budget: as it is");
        sizing.fit(15, 31, false);
        assert_eq!(sizing.next(), 48, "at most half: twice, up to group_size");
        sizing.fit(3, 7, true);
        assert_eq!(sizing.next(), 8);
        sizing.fit(3, 7, false);
        assert_eq!(sizing.next(), 16, "doubled");
        sizing.fit(0, usize::MAX, false);
        assert_eq!(sizing.next(), 32);
    }

    #[test]
    fn a_budget_larger_than_the_groups_leaves_them_whole() {
        let sizing = Sizing::new(8, 100 * MS, false);
        assert_eq!(
            sizing.fit(7, 31, true),
            Some(8),
            "never more than group_size"
        );
        assert_eq!(sizing.next(), 8);
        sizing.fit(usize::MAX, usize::MAX, false);
        assert_eq!(sizing.next(), 8);
        assert_eq!(sizing.most(), 8);
    }

    #[test]
    fn the_loops_first_groups_hold_one_job_until_a_handlers_time_is_known() {
        let sizing = Sizing::new(48, 100 * MS, false);
        assert_eq!(sizing.next_in_loop(), 1);
        assert_eq!(sizing.next(), 48, "what one fetch run at once is cut into");
        sizing.timed(MS);
        assert_eq!(sizing.next_in_loop(), 48);
        sizing.timed(2_000 * MS);
        assert_eq!(sizing.next_in_loop(), 1, "a slow handler runs alone");
    }

    #[test]
    fn groups_hold_about_group_time_of_the_handlers_mean_time() {
        let sizing = Sizing::new(48, 100 * MS, false);
        assert_eq!(sizing.next(), 48, "nothing measured yet");
        sizing.timed(MS);
        assert_eq!(
            sizing.next(),
            48,
            "100 ms of 1 ms handlers: more than group_size"
        );
        sizing.timed(79 * MS);
        assert_eq!(sizing.next(), 9, "100 ms of about 11 ms handlers");
        sizing.timed(2_000 * MS);
        assert_eq!(sizing.next(), 1, "a slow handler runs alone");
        for _ in 0..100 {
            sizing.timed(Duration::ZERO);
        }
        assert_eq!(sizing.next(), 48, "fast again: as large as they may be");
        sizing.fit(31, 31, true);
        assert_eq!(
            sizing.next(),
            32,
            "and no larger than the checkpoints allow"
        );
    }

    #[test]
    fn the_handlers_mean_time_weighs_each_run_an_eighth() {
        assert_eq!(folded(0, 800), 800, "the first run is the mean");
        assert_eq!(folded(800, 1_600), 900);
        assert_eq!(folded(800, 0), 700);
        assert_eq!(folded(0, 0), 1, "measured, however short");
        assert_eq!(folded(1, 0), 1);
        assert_eq!(
            folded(u64::MAX, u64::MAX),
            u64::MAX - u64::MAX / 8 + u64::MAX / 8
        );
    }

    #[test]
    fn slow_handlers_do_not_shrink_what_the_checkpoints_allow() {
        let sizing = Sizing::new(64, 100 * MS, false);
        sizing.timed(10 * MS);
        assert_eq!(sizing.next(), 10);
        sizing.fit(31, 31, true);
        sizing.fit(0, 31, false);
        for _ in 0..100 {
            sizing.timed(Duration::ZERO);
        }
        assert_eq!(sizing.next(), 64, "grown from 32, not from the time's 10");
    }

    #[test]
    fn checkpoints_are_spaced_by_how_often_jobs_fail_after_writing() {
        let sizing = Sizing::new(64, 100 * MS, false);
        assert_eq!(sizing.checkpoint_every(), None, "none while nothing fails");
        sizing.count_undo(true);
        // 1/64 of a million: every sqrt(2 / 0.015625) = 11 jobs.
        assert_eq!(sizing.checkpoint_every(), Some(11));
        for _ in 0..10 {
            sizing.count_undo(true);
        }
        let often = sizing.checkpoint_every().expect("failing");
        assert!(often < 11, "more failures, closer checkpoints: {often}");
        for _ in 0..2_000 {
            sizing.count_undo(false);
        }
        assert_eq!(sizing.checkpoint_every(), None, "forgotten once they stop");
    }
}

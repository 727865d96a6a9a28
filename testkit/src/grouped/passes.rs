//! What a group does in its transaction: each job succeeds or fails alone, duplicates are
//! skipped, jobs not ready wait outside it, its checkpoints stay within the budget, rerunnable
//! groups try again without them, and each job is counted once.

use std::time::Duration;

use jobs_consumers::{DeadReason, Outcome, WorkerError};
use jobs_core::{DeadLetterFilter, PublishOptions};

use super::{Fixture, GroupedBackend, GroupedQueue, GroupedStore, step};

/// `(processed, other)` among `outcomes`.
fn processed(outcomes: &[Outcome]) -> (usize, usize) {
    let done = outcomes
        .iter()
        .filter(|o| **o == Outcome::Processed)
        .count();
    (done, outcomes.len() - done)
}

fn retrying(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Retrying { .. })
}

/// A group whose jobs fail in every way (a retry, a permanent failure, a panic, a deferral,
/// each after writing) commits its other jobs' writes and none of the failed ones', runs no
/// handler twice, skips a second copy of a job it runs, and settles each failure as the
/// policy says; the retried and deferred jobs then come back and succeed.
pub async fn a_failing_job_takes_nothing_from_its_group<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.worker(16).build().expect("a grouped worker");
    let steps = [
        (0, "ok"),
        (1, "retry"),
        (2, "ok"),
        (3, "permanent"),
        (4, "panic"),
        (5, "ok"),
        (6, "defer"),
        (7, "ok"),
    ];
    let envelopes = f.publish_steps(&steps).await;
    // A second copy of job 0 under another key: the group runs it once.
    f.publish_with(&envelopes[0], PublishOptions::default().dedup_key("copy"))
        .await;

    let outcomes = worker.run_once().await.expect("receive");
    assert_eq!(outcomes.len(), 9, "one group: {outcomes:?}");
    let shape: Vec<&str> = (outcomes.iter())
        .map(|o| match o {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::Retrying { .. } => "retrying",
            Outcome::Deferred { .. } => "deferred",
            Outcome::DeadLettered {
                reason: DeadReason::Permanent,
                ..
            } => "dead (permanent)",
            _ => "other",
        })
        .collect();
    assert_eq!(
        shape,
        [
            "processed",
            "retrying",
            "processed",
            "dead (permanent)",
            "retrying",
            "processed",
            "deferred",
            "processed",
            "duplicate"
        ],
        "{outcomes:?}"
    );
    assert_eq!(
        f.effects().await,
        [0, 2, 5, 7],
        "only the succeeding jobs' writes committed"
    );
    for n in 0..8 {
        assert_eq!(f.handler.runs(n), 1, "job {n} ran once");
    }
    let letters = (f.b.backend.store)
        .list(&DeadLetterFilter::default())
        .await
        .expect("list the dead letters");
    let letters: Vec<_> = (letters.into_iter())
        .map(|l| (l.letter.last_error, l.letter.attempts, l.letter.reason))
        .collect();
    assert_eq!(
        letters,
        [(
            "invoice does not exist".to_owned(),
            1,
            Some(jobs_core::DeadLetterReason::Permanent)
        )],
        "the grouped path keeps the letter's reason"
    );
    for (n, envelope) in envelopes.iter().enumerate() {
        let claimed = [0, 2, 3, 5, 7].contains(&n);
        assert_eq!(
            f.processed(envelope).await,
            claimed,
            "job {n}: the processed jobs and the dead letter hold claims, the others not"
        );
    }

    // The retried and deferred jobs come back, after their times, and succeed.
    f.b.clock.advance(Duration::from_secs(3_600));
    let mut later = vec![];
    for _ in 0..10 {
        let outcomes = worker.run_once().await.expect("receive");
        if outcomes.is_empty() {
            break;
        }
        later.extend(outcomes);
    }
    assert_eq!(processed(&later), (3, 0), "jobs 1, 4 and 6: {later:?}");
    assert_eq!(f.effects().await, [0, 1, 2, 4, 5, 6, 7]);
    assert_eq!(f.handler.attempts(1), [1, 2], "a retry spends an attempt");
    assert_eq!(
        f.handler.attempts(6),
        [1, 1],
        "a deferral gives its attempt back"
    );
    assert_eq!(f.depth().await.total(), 0, "nothing left in the queue");
}

/// Undoing a failed job goes back to a checkpoint taken after its neighbours settled: a dead
/// letter recorded before it stays, the write of a job that succeeded before it commits, its
/// own write does not.
pub async fn undoing_a_failed_job_keeps_what_its_neighbours_settled<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.worker(3).build().expect("a grouped worker");
    let envelopes = f
        .publish_steps(&[(1, "ok"), (2, "permanent-early"), (3, "retry")])
        .await;
    let outcomes = worker.run_once().await.expect("receive");
    assert!(
        matches!(
            outcomes[..],
            [
                Outcome::Processed,
                Outcome::DeadLettered { .. },
                Outcome::Retrying { .. }
            ]
        ),
        "{outcomes:?}"
    );
    assert_eq!(
        f.effects().await,
        [1],
        "job 1's write committed, job 3's undone"
    );
    let letters = (f.b.backend.store)
        .list(&DeadLetterFilter::default())
        .await
        .expect("list the dead letters");
    let lettered: Vec<_> = letters.iter().map(|l| l.letter.job_id).collect();
    assert_eq!(
        lettered,
        [Some(envelopes[1].job_id)],
        "job 2's letter survived job 3's undo"
    );
}

/// A job processed before, published again, is acked by its group as a duplicate without
/// running.
pub async fn a_group_skips_a_job_processed_before<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.worker(8).build().expect("a grouped worker");
    let first = f.envelope(1, "ok");
    f.publish(&first).await;
    assert_eq!(worker.run_once().await.expect("run"), [Outcome::Processed]);
    // Published again after its ack: a new message, whose claim finds the job processed.
    f.publish_with(&first, PublishOptions::default().dedup_key("again"))
        .await;
    f.publish(&f.envelope(2, "ok")).await;
    assert_eq!(
        worker.run_once().await.expect("run"),
        [Outcome::Duplicate, Outcome::Processed]
    );
    assert_eq!(f.effects().await, [1, 2]);
    assert_eq!(f.handler.runs(1), 1);
    assert_eq!(f.depth().await.total(), 0);
}

/// A group size outside 1 to 64 is refused by the build, naming it.
pub async fn a_group_size_out_of_bounds_is_refused<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    for size in [0, 65] {
        match f.worker(size).build() {
            Err(e @ WorkerError::GroupSize(refused)) => {
                assert_eq!(refused, size);
                assert!(e.to_string().contains("group_size"), "{e}");
            }
            other => panic!("group_size {size}: {other:?}"),
        }
    }
    assert!(f.worker(64).build().is_ok(), "64 is the largest");
}

/// A group asks each job's handler whether it is ready before its transaction opens, waits
/// for those that are not yet, and settles on their own those that will not be (deferred,
/// their attempt unspent).
pub async fn a_group_runs_the_jobs_that_get_ready_and_defers_the_others<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.worker(8).build().expect("a grouped worker");
    for (n, ready) in [(1, "wait"), (2, "defer"), (3, ""), (4, "wait")] {
        f.publish(&step(n, "ok", ready)).await;
    }
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes[0], Outcome::Processed, "{outcomes:?}");
    assert!(
        matches!(outcomes[1], Outcome::Deferred { .. }),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2..], [Outcome::Processed, Outcome::Processed]);
    assert_eq!(f.effects().await, [1, 3, 4]);
    assert_eq!(f.handler.runs(2), 0, "never ran");
    let depth = f.depth().await;
    assert_eq!(
        (depth.total(), depth.in_flight),
        (1, 0),
        "the deferred job waits, not leased: {depth:?}"
    );
    f.b.clock.advance(Duration::from_secs(61));
    let again = (f.b.queue.receive(&f.name, 1, Duration::from_secs(30)).await).expect("receive");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 1, "deferred, its attempt unspent");
}

/// A group of jobs that write takes a checkpoint per job but the first, at most the
/// transaction's budget: what it cannot cover goes back unrun with its attempt unspent, and
/// the next groups fit the budget, growing back after groups that used at most half of it.
pub async fn groups_fit_the_transactions_checkpoint_budget<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let budget = f.budget().await;
    let (k, over) = (i64::try_from(budget).expect("small"), 8);
    // Groups sized by the checkpoints alone, however long a loaded machine's writes take.
    let worker = (f.worker(budget + 9))
        .group_time(Duration::from_secs(60))
        .build()
        .expect("a grouped worker");

    f.publish_all(0..k + 1 + over, "ok").await;
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(processed(&outcomes), (budget + 1, 8), "{outcomes:?}");
    assert!(
        (outcomes[budget + 1..].iter()).all(|o| matches!(o, Outcome::Deferred { .. })),
        "given back: {outcomes:?}"
    );
    let depth = f.depth().await;
    assert_eq!(
        (depth.ready, depth.in_flight),
        (8, 0),
        "ready again: {depth:?}"
    );
    let effects = f.effects().await;
    assert_eq!(
        effects,
        (0..=k).collect::<Vec<_>>(),
        "no effect of a given-back job"
    );

    // The next groups hold one job more than the budget: the 8 given back and budget + 1
    // more run as a group that takes every checkpoint and one of 8, all processed.
    f.publish_all(k + 1 + over..2 * k + 2 + over, "ok").await;
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(processed(&outcomes), (budget + 9, 0), "{outcomes:?}");
    // The group of 8 took 7 checkpoints, at most half the budget: the groups grew back to
    // the group size, so budget + 9 jobs are one group again, which runs out as the first.
    f.publish_all(2 * k + 2 + over..3 * k + 3 + 2 * over, "ok")
        .await;
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(processed(&outcomes), (budget + 1, 8), "{outcomes:?}");
    for n in 0..3 * k + 3 + 2 * over {
        assert!(
            f.handler.runs(n) <= 1,
            "job {n} ran {} times",
            f.handler.runs(n)
        );
    }
}

/// When the first job to write fails, there is no checkpoint to go back to: the group rolls
/// back and starts again without it, and no other job's handler runs twice.
pub async fn when_the_first_job_to_write_fails_the_group_starts_again_without_it<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.worker(8).build().expect("a grouped worker");
    let envelopes = f
        .publish_steps(&[(0, "no-write"), (1, "retry"), (2, "ok")])
        .await;
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes[0], Outcome::Processed, "{outcomes:?}");
    assert!(retrying(&outcomes[1]), "{outcomes:?}");
    assert_eq!(outcomes[2], Outcome::Processed);
    assert_eq!(f.effects().await, [2], "job 1's write was rolled back");
    for n in 0..3 {
        assert_eq!(f.handler.runs(n), 1, "job {n} ran once");
    }
    let claims = [
        f.processed(&envelopes[0]).await,
        f.processed(&envelopes[1]).await,
        f.processed(&envelopes[2]).await,
    ];
    assert_eq!(
        claims,
        [true, false, true],
        "jobs 0 and 2 claimed again in the second pass, job 1 not"
    );
}

/// A group of rerunnable jobs takes no checkpoint: when one fails after writing, the group
/// rolls back and runs again the jobs before it, which may run twice; each effect commits
/// once.
pub async fn a_group_of_rerunnable_jobs_runs_the_others_again_when_one_fails<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = f.rerunnable(8).build().expect("a grouped worker");
    for (n, then) in [(0, "ok"), (1, "ok"), (2, "retry"), (3, "ok")] {
        f.publish(&f.envelope(n, then)).await;
    }
    let outcomes = worker.run_once().await.expect("run");
    assert_eq!(outcomes[..2], [Outcome::Processed, Outcome::Processed]);
    assert!(retrying(&outcomes[2]), "{outcomes:?}");
    assert_eq!(outcomes[3], Outcome::Processed);
    assert_eq!(f.effects().await, [0, 1, 3], "each committed once");
    let runs: Vec<u32> = (0..4).map(|n| f.handler.runs(n)).collect();
    assert_eq!(
        runs,
        [2, 2, 1, 1],
        "the jobs before the failure ran again in the second pass, the failed one did not"
    );
}

/// A group of rerunnable jobs in which three fail after writing: two more passes without
/// checkpoints, each running again the jobs the last rolled back, then a careful one, which
/// runs out of checkpoints and gives the last jobs back. Every job's effect commits once.
pub async fn a_rerunnable_group_tries_again_without_checkpoints_then_carefully<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let budget = f.budget().await;
    let worker = (f.rerunnable(48))
        .group_time(Duration::from_secs(60))
        .build()
        .expect("a grouped worker");
    for n in 0..40 {
        let then = if (1..=3).contains(&n) { "retry" } else { "ok" };
        f.publish(&f.envelope(n, then)).await;
    }
    let outcomes = worker.run_once().await.expect("run");
    let runs = |n| f.handler.runs(n);
    // Passes 1 to 3 end at jobs 1, 2 and 3, each failing once and decided; job 0 ran in
    // each and in the careful fourth.
    assert_eq!(
        (runs(0), runs(1), runs(2), runs(3), runs(4)),
        (4, 1, 1, 1, 1)
    );
    let retried: Vec<usize> = (0..40).filter(|&n| retrying(&outcomes[n])).collect();
    assert_eq!(retried, [1, 2, 3]);
    // The careful pass: a checkpoint before job 0 and before each job from 4 on, `budget` in
    // all; the jobs after those go back unrun.
    let first_back = budget + 3;
    let given_back: Vec<usize> = (0..40)
        .filter(|&n| matches!(outcomes[n], Outcome::Deferred { .. }))
        .collect();
    assert_eq!(
        given_back,
        (first_back..40).collect::<Vec<_>>(),
        "{outcomes:?}"
    );
    let first_back = i64::try_from(first_back).expect("small");
    let expected: Vec<i64> = (0..first_back).filter(|n| !(1..=3).contains(n)).collect();
    assert_eq!(
        f.effects().await,
        expected,
        "each processed job's write, once"
    );
}

/// Once rerunnable jobs have failed after writing, their groups take a checkpoint every so
/// many jobs that wrote, and a failure goes back to the last one: only the jobs since run
/// again, in the same transaction, rather than the whole group in another.
pub async fn a_rerunnable_group_checkpoints_as_often_as_its_jobs_fail<S, Q>(b: GroupedBackend<S, Q>)
where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    let f = Fixture::new(b);
    let worker = (f.rerunnable(48))
        .group_time(Duration::from_secs(60))
        .build()
        .expect("a grouped worker");
    let mut envelopes = vec![];
    let publish = |range: std::ops::Range<i64>, failing: i64| {
        (range)
            .map(|n| {
                let then = match n {
                    _ if n == failing => "retry",
                    131 => "retry-early",
                    132 => "permanent-early",
                    _ => "ok",
                };
                f.envelope(n, then)
            })
            .collect::<Vec<_>>()
    };
    let runs = |n| f.handler.runs(n);
    // The first failure after writing finds no checkpoint: a second pass runs job 0 again.
    for envelope in publish(0..40, 1) {
        f.publish(&envelope).await;
        envelopes.push(envelope);
    }
    worker.run_once().await.expect("run");
    assert_eq!((runs(0), runs(1), runs(2)), (2, 1, 1));
    // That failure, folded into the rate (1/64) and decayed by the 39 jobs after it, spaces
    // the next group's checkpoints 15 writing jobs apart: before jobs 115 and 130. Jobs 131
    // and 132 fail before writing (a retry and a dead letter); job 135 fails after writing,
    // and the undo goes back to before job 130: jobs 130, 133 and 134 run again, 131's claim
    // is released and 132's letter recorded again, and no other runs.
    for envelope in publish(100..140, 135) {
        f.publish(&envelope).await;
        envelopes.push(envelope);
    }
    let outcomes = worker.run_once().await.expect("run");
    let twice: Vec<i64> = (100..140).filter(|&n| runs(n) == 2).collect();
    assert_eq!(twice, [130, 133, 134]);
    assert!((100..140).all(|n| (1..=2).contains(&runs(n))));
    let retried: Vec<usize> = (0..40).filter(|&i| retrying(&outcomes[i])).collect();
    assert_eq!(retried, [31, 35], "{outcomes:?}");
    assert!(
        matches!(outcomes[32], Outcome::DeadLettered { .. }),
        "{outcomes:?}"
    );
    let letters = (f.b.backend.store)
        .list(&DeadLetterFilter::default())
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "job 132's letter, once: {letters:?}");
    // Every job holds its claim but the three to retry (1, 131 and 135): the released claims
    // survived the undo.
    let mut unclaimed = vec![];
    for envelope in &envelopes {
        if !f.processed(envelope).await {
            let n = envelope.data["n"].as_i64().expect("a number");
            unclaimed.push(n);
        }
    }
    assert_eq!(unclaimed, [1, 131, 135]);
    let expected: Vec<i64> = (0..40)
        .chain(100..140)
        .filter(|&n| ![1, 131, 132, 135].contains(&n))
        .collect();
    assert_eq!(
        f.effects().await,
        expected,
        "each processed job's write, once"
    );
}

/// One group of two kinds, with a retry and a second copy of a job: each job counted once, by
/// its outcome and its kind, and each handler run timed once.
pub async fn a_grouped_worker_counts_each_job_once_by_outcome_and_kind<S, Q>(
    b: GroupedBackend<S, Q>,
) where
    S: GroupedStore,
    Q: GroupedQueue<S>,
{
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let f = Fixture::new(b);
    let worker = (f.bare())
        .handler("test.a".parse().expect("valid"), f.handler.clone())
        .handler("test.b".parse().expect("valid"), f.handler.clone())
        .build()
        .expect("a grouped worker");
    let job = |kind, n, then| {
        let data = serde_json::json!({ "n": n, "then": then });
        crate::fixtures::envelope_with(1, kind, data)
    };
    let first = job("test.a", 1, "ok");
    for envelope in [
        first.clone(),
        job("test.a", 2, "retry"),
        job("test.b", 3, "ok"),
        job("test.b", 4, "ok"),
    ] {
        f.publish(&envelope).await;
    }
    f.publish_with(&first, PublishOptions::default().dedup_key("copy"))
        .await;
    // One fetch, its groups run in this task: every metric it emits reaches the recorder.
    let outcomes = Recording {
        recorder: &recorder,
        inner: Box::pin(worker.run_once()),
    }
    .await
    .expect("run");
    assert_eq!(outcomes.len(), 5, "one group: {outcomes:?}");
    let mut counted: Vec<(String, String, u64)> = Vec::new();
    let mut timed: Vec<(String, usize)> = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let kind = (key.labels())
            .find(|label| label.key() == "kind")
            .map(|label| label.value().to_owned())
            .unwrap_or_default();
        match value {
            DebugValue::Counter(n) => counted.push((key.name().to_owned(), kind, n)),
            DebugValue::Histogram(runs) if key.name() == "jobs_handler_seconds" => {
                timed.push((kind, runs.len()));
            }
            _ => {}
        }
    }
    counted.sort();
    timed.sort();
    let row = |name: &str, kind: &str, n| (name.to_owned(), kind.to_owned(), n);
    assert_eq!(
        counted,
        [
            row("jobs_duplicate_skipped_total", "test.a", 1),
            row("jobs_processed_total", "test.a", 1),
            row("jobs_processed_total", "test.b", 2),
            row("jobs_retried_total", "test.a", 1),
        ]
    );
    assert_eq!(timed, [("test.a".to_owned(), 2), ("test.b".to_owned(), 2)]);
}

/// A future polled with `recorder` as its thread's metrics recorder, whatever the runtime.
struct Recording<'a, F> {
    recorder: &'a metrics_util::debugging::DebuggingRecorder,
    inner: std::pin::Pin<Box<F>>,
}

impl<F: Future> Future for Recording<'_, F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.get_mut();
        metrics::with_local_recorder(this.recorder, || this.inner.as_mut().poll(cx))
    }
}

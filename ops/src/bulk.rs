//! Replaying and discarding dead letters, one by id or every letter a filter matches, for
//! `jobsctl dead-letters replay|discard` and the console alike: one classification of what
//! happened to a letter, one key per bulk run, one loop that settles a run and journals it.
//!
//! A filtered run acts on a snapshot of the matching ids journaled in the store
//! ([`BulkRuns`]), not on a fresh query: a replay marks a letter `replayed` before publishing
//! it, so after an interruption between the two, a new query over `pending_review` would no
//! longer see that letter and it would never be published. Resuming the snapshot publishes it
//! (replaying a `replayed` letter republishes under the same dedup key, harmlessly), and
//! letters the run records as settled are not touched again. The run lives in the store, keyed
//! by its action and filter ([`run_key`]), so every `jobsctl` and console on the store sees it
//! and resumes the same one.

use std::ops::ControlFlow;
use std::time::{Duration, SystemTime};

use jobs_consumers::{DeadLetters, ReplayError, Replayed};
use jobs_core::{
    BulkRun, BulkRunId, BulkRuns, DeadLetterFilter, DeadLetterId, DeadLetterStatus, Resolution,
    StoreError, TenantId, Transition,
};

/// `replay` or `discard`: the action as commands, keys and messages spell it.
pub fn action_name(resolution: Resolution) -> &'static str {
    match resolution {
        Resolution::Replay => "replay",
        Resolution::Discard => "discard",
    }
}

/// A bulk run's filter as its key spells it (`status=… queue=… tenant=… kind=…`): one
/// spelling for `jobsctl` and the console, so that each resumes the other's runs.
pub fn describe_filter(filter: &DeadLetterFilter) -> String {
    let mut parts = vec![format!(
        "status={}",
        filter.status.map_or("any", DeadLetterStatus::as_str)
    )];
    if let Some(queue) = &filter.queue {
        parts.push(format!("queue={}", queue.as_str()));
    }
    if let Some(tenant) = filter.tenant_id {
        parts.push(format!("tenant={tenant}"));
    }
    if let Some(kind) = &filter.kind {
        parts.push(format!("kind={}", kind.as_str()));
    }
    if let Some(reason) = filter.reason {
        parts.push(format!("reason={reason}"));
    }
    parts.join(" ")
}

/// The key of the run of `resolution` over `filter` (`replay status=pending_review
/// queue=billing.invoices`): a second start of the same key resumes the unfinished run.
pub fn run_key(resolution: Resolution, filter: &DeadLetterFilter) -> String {
    format!("{} {}", action_name(resolution), describe_filter(filter))
}

/// What became of one letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Replayed or discarded now.
    Done,
    /// It already was: replayed again (harmless), or left discarded.
    AlreadyDone,
    /// No such letter, or another tenant's.
    NotFound,
    /// Its state refuses the action (a discarded letter is not replayed; only letters waiting
    /// for review are discarded).
    Conflict,
    /// Its payload is no envelope, so it cannot be replayed.
    NotAnEnvelope,
    /// The store or the transport failed; trying again may pass.
    Failed,
}

/// The outcome of acting on one letter: its [`Verdict`] and a sentence for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    resolution: Resolution,
    verdict: Verdict,
    message: String,
}

impl Resolved {
    /// What became of the letter.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// A sentence for the operator (`replayed`, `dead letter 42 not found`, …).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A stable word for scripts: `replayed`, `already_replayed`, `discarded`,
    /// `already_discarded`, `not_found`, `conflict`, `not_an_envelope` or `failed`.
    pub fn result(&self) -> &'static str {
        match (self.verdict, self.resolution) {
            (Verdict::Done, Resolution::Replay) => "replayed",
            (Verdict::Done, Resolution::Discard) => "discarded",
            (Verdict::AlreadyDone, Resolution::Replay) => "already_replayed",
            (Verdict::AlreadyDone, Resolution::Discard) => "already_discarded",
            (Verdict::NotFound, _) => "not_found",
            (Verdict::Conflict, _) => "conflict",
            (Verdict::NotAnEnvelope, _) => "not_an_envelope",
            (Verdict::Failed, _) => "failed",
        }
    }

    /// Whether the letter is in the state asked for.
    pub fn is_done(&self) -> bool {
        matches!(self.verdict, Verdict::Done | Verdict::AlreadyDone)
    }

    /// Whether trying again would change nothing: done, or refused for a reason a retry does
    /// not change. Only a failure is unsettled.
    pub fn is_settled(&self) -> bool {
        self.verdict != Verdict::Failed
    }

    /// The outcome as a bulk run journals it: `done`, `already done`, `not found`,
    /// `conflict: …`, or the failure.
    pub fn recorded(&self) -> String {
        match self.verdict {
            Verdict::Done => "done".to_owned(),
            Verdict::AlreadyDone => "already done".to_owned(),
            Verdict::NotFound => "not found".to_owned(),
            Verdict::Conflict | Verdict::NotAnEnvelope => format!("conflict: {}", self.message),
            Verdict::Failed => self.message.clone(),
        }
    }
}

/// What a run of [`Resolver::settle`] came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Letters in the state asked for.
    pub done: usize,
    /// Letters that are not: refused, or failed.
    pub failed: usize,
    /// Failed letters a new attempt may settle (the run is not closed while any is left).
    pub unsettled: usize,
    /// Whether the caller stopped it before the end.
    pub stopped: bool,
    /// Whether its journaled run was closed: every letter settled.
    pub finished: bool,
}

/// Replays and discards letters as one operator, within one tenant's letters or all.
#[derive(Clone)]
pub struct Resolver {
    letters: DeadLetters,
    by: String,
    tenant: Option<TenantId>,
}

impl Resolver {
    /// Acts through `letters` as `by` (what the letters' history records), on `tenant`'s
    /// letters only when given (another's is not found).
    pub fn new(letters: &DeadLetters, by: impl Into<String>, tenant: Option<TenantId>) -> Self {
        let by = by.into();
        Resolver {
            letters: letters.acting_as(by.clone()),
            by,
            tenant,
        }
    }

    /// Who acts.
    pub fn by(&self) -> &str {
        &self.by
    }

    /// `resolution` of letter `id`, classified.
    pub async fn resolve(&self, resolution: Resolution, id: DeadLetterId) -> Resolved {
        let (verdict, message) = match resolution {
            Resolution::Replay => match self.letters.replay(id, self.tenant).await {
                Ok(Replayed::Done) => (Verdict::Done, "replayed".to_owned()),
                Ok(Replayed::AlreadyDone) => (
                    Verdict::AlreadyDone,
                    format!("already replayed; published again under dead-letter-{id}"),
                ),
                Err(e @ ReplayError::NotFound(_)) => (Verdict::NotFound, e.to_string()),
                Err(e @ ReplayError::Conflict { .. }) => (Verdict::Conflict, e.to_string()),
                Err(e @ ReplayError::NotAnEnvelope { .. }) => {
                    (Verdict::NotAnEnvelope, e.to_string())
                }
                Err(e) => (Verdict::Failed, e.to_string()),
            },
            Resolution::Discard => match self.letters.discard(id, self.tenant).await {
                Ok(Transition::Done) => (Verdict::Done, "discarded".to_owned()),
                Ok(Transition::AlreadyDone) => {
                    (Verdict::AlreadyDone, "already discarded".to_owned())
                }
                Ok(Transition::Conflict(status)) => (
                    Verdict::Conflict,
                    format!(
                        "not discarded: dead letter {id} is {status}, and only pending_review \
                         letters can be discarded"
                    ),
                ),
                Ok(Transition::NotFound) => {
                    (Verdict::NotFound, format!("dead letter {id} not found"))
                }
                Err(e) => (Verdict::Failed, e.to_string()),
            },
        };
        Resolved {
            resolution,
            verdict,
            message,
        }
    }

    /// A snapshot of the ids `filter` matches now, for a new run.
    pub async fn matching(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetterId>, StoreError> {
        self.letters.matching(filter).await
    }

    /// Settles `ids` in order with `resolution`. With `journal` (the store's runs and the
    /// run's id), each settled letter is recorded in the run, and the run closed once every
    /// letter of its snapshot is settled. `each` sees every letter's outcome before it is recorded, and stops the
    /// run by answering [`ControlFlow::Break`]. Replays are spaced by `pace`, so a thousand
    /// of them do not land on the queue at once.
    pub async fn settle(
        &self,
        resolution: Resolution,
        ids: &[DeadLetterId],
        journal: Option<(&dyn BulkRuns, BulkRunId)>,
        pace: Duration,
        mut each: impl FnMut(DeadLetterId, &Resolved) -> ControlFlow<()>,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        for &id in ids {
            let resolved = self.resolve(resolution, id).await;
            if resolved.is_done() {
                tally.done += 1;
            } else {
                tally.failed += 1;
            }
            let go_on = each(id, &resolved);
            if !resolved.is_settled() {
                tally.unsettled += 1;
            } else if let Some((runs, run)) = journal {
                runs.record_settled(run, id, &resolved.recorded()).await?;
            }
            if go_on.is_break() {
                tally.stopped = true;
                return Ok(tally);
            }
            if resolution == Resolution::Replay && !pace.is_zero() {
                tokio::time::sleep(pace).await;
            }
        }
        if let (Some((runs, run)), 0) = (journal, tally.unsettled) {
            // `ids` may be part of the run only: it closes once its whole snapshot is settled.
            let left = runs
                .run(run)
                .await?
                .is_some_and(|run| run.pending().next().is_some());
            if !left {
                runs.finish_run(run, SystemTime::now()).await?;
                tally.finished = true;
            }
        }
        Ok(tally)
    }

    /// Starts the run of `resolution` over `filter` on `ids` (a snapshot from
    /// [`matching`](Self::matching)), journaled in `runs` — or answers the unfinished run of
    /// the same key, which keeps its own snapshot.
    pub async fn start(
        &self,
        runs: &dyn BulkRuns,
        resolution: Resolution,
        filter: &DeadLetterFilter,
        ids: &[DeadLetterId],
    ) -> Result<BulkRun, StoreError> {
        runs.start_run(
            &run_key(resolution, filter),
            resolution,
            ids,
            &self.by,
            SystemTime::now(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jobs_adapter_memory::{MemoryQueue, MemoryStore};
    use jobs_core::DeadLetterStore;

    use super::*;

    fn filter() -> DeadLetterFilter {
        DeadLetterFilter {
            status: Some(DeadLetterStatus::PendingReview),
            queue: Some("billing.invoices".parse().expect("a queue")),
            limit: 500,
            ..DeadLetterFilter::default()
        }
    }

    #[test]
    fn a_runs_key_is_its_action_and_its_filter() {
        assert_eq!(
            run_key(Resolution::Replay, &filter()),
            "replay status=pending_review queue=billing.invoices"
        );
        assert_eq!(describe_filter(&DeadLetterFilter::default()), "status=any");
    }

    /// A store with `n` pending letters of poison (no envelope) and their resolver.
    async fn letters(n: usize) -> (MemoryStore, Resolver, Vec<DeadLetterId>) {
        let store = MemoryStore::default();
        for i in 0..n {
            let payload = format!("not json {i}");
            let letter = jobs_testkit::fixtures::raw_letter(
                "billing.invoices",
                payload.as_bytes(),
                "not an envelope",
            );
            store.record(letter).await.expect("recorded");
        }
        let ops = DeadLetters::new(Arc::new(store.clone()), Arc::new(MemoryQueue::default()));
        let resolver = Resolver::new(&ops, "test (operator)", None);
        let ids = resolver.matching(&filter()).await.expect("listed");
        (store, resolver, ids)
    }

    #[tokio::test]
    async fn a_run_journals_each_letter_stops_when_told_and_resumes_where_it_stopped() {
        let (store, resolver, ids) = letters(3).await;
        assert_eq!(ids.len(), 3);
        let runs: &dyn BulkRuns = &store;
        let run = resolver
            .start(runs, Resolution::Discard, &filter(), &ids)
            .await
            .expect("started");
        let mut seen = 0;
        let first = resolver
            .settle(
                Resolution::Discard,
                &ids,
                Some((runs, run.id)),
                Duration::ZERO,
                |_, r| {
                    assert_eq!(r.result(), "discarded");
                    seen += 1;
                    if seen == 2 {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )
            .await
            .expect("settles");
        assert!(
            first.stopped && !first.finished && first.done == 2,
            "{first:?}"
        );
        let resumed = resolver
            .start(runs, Resolution::Discard, &filter(), &[])
            .await
            .expect("the same run");
        assert_eq!(resumed.id, run.id);
        let left: Vec<DeadLetterId> = resumed.pending().collect();
        assert_eq!(left, ids[2..]);
        let second = resolver
            .settle(
                Resolution::Discard,
                &left,
                Some((runs, run.id)),
                Duration::ZERO,
                |_, _| ControlFlow::Continue(()),
            )
            .await
            .expect("settles");
        assert!(second.finished && second.done == 1, "{second:?}");
        let closed = runs.run(run.id).await.expect("read").expect("the run");
        assert!(closed.is_finished());
        assert!(closed.settled.values().all(|outcome| outcome == "done"));
    }

    #[tokio::test]
    async fn refusals_are_settled_and_say_why() {
        let (store, resolver, ids) = letters(1).await;
        let poison = resolver.resolve(Resolution::Replay, ids[0]).await;
        assert_eq!(poison.verdict(), Verdict::NotAnEnvelope);
        assert!(poison.is_settled() && !poison.is_done());
        assert!(poison.recorded().starts_with("conflict: "), "{poison:?}");
        let discarded = resolver.resolve(Resolution::Discard, ids[0]).await;
        assert_eq!(discarded.result(), "discarded");
        let again = resolver.resolve(Resolution::Discard, ids[0]).await;
        assert_eq!(
            (again.result(), again.recorded().as_str()),
            ("already_discarded", "already done")
        );
        let replayed = resolver.resolve(Resolution::Replay, ids[0]).await;
        assert_eq!(replayed.verdict(), Verdict::Conflict, "{replayed:?}");
        let missing = resolver
            .resolve(Resolution::Discard, DeadLetterId(999))
            .await;
        assert_eq!(missing.result(), "not_found");
        let other = Resolver::new(
            &DeadLetters::new(Arc::new(store), Arc::new(MemoryQueue::default())),
            "tenant",
            Some(
                "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
                    .parse()
                    .expect("a tenant"),
            ),
        );
        let hidden = other.resolve(Resolution::Discard, ids[0]).await;
        assert_eq!(
            hidden.verdict(),
            Verdict::NotFound,
            "another tenant's letter"
        );
    }
}

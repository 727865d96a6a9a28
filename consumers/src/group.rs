//! Grouped consumption: several jobs in one work transaction that also settles them, for a
//! queue kept in the store's own database ([`SettleInTransaction`]).
//!
//! One group is one transaction on one connection: hold the group's leases, claim its jobs,
//! run each job's handler, settle them all in one statement and commit once. A job that fails
//! is undone back to a checkpoint taken before it, so its partial writes never commit and its
//! neighbours' are kept, and their handlers never run again because of it. A checkpoint is
//! taken only when a handler wrote since the last one: handlers that write nothing cost none,
//! nor does the first job after the claims (claims can be made again), nor the runtime's own
//! writes after a failure (an undo that takes them redoes them).
//!
//! A group whose every job is [`RERUNNABLE`](crate::Handler::RERUNNABLE) is optimistic: it
//! takes a checkpoint only every so many jobs that wrote, spaced by how often jobs failed
//! after writing lately ([`Worker::checkpoint_every`]; none while they did not), and a failure
//! goes back to the last one and runs again the jobs whose writes went with it.
//!
//! When a failed job has no checkpoint to go back to (it was the first to write, or the group
//! is optimistic and took none), the group rolls back and makes another pass in a new
//! transaction: the claims again, the jobs whose outcome is known settled as decided, and only
//! the jobs that have to run again run (ones that never ran, and rerunnable ones whose writes
//! were rolled back), now with a checkpoint before each; an optimistic group makes up to two
//! more optimistic passes first, each a failure shorter. A conflict with another transaction
//! (a deadlock, a serialization failure) in the group's own statements makes its jobs run
//! again one by one, without spending an attempt.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Instant, SystemTime};

use futures_util::future::BoxFuture;
use jobs_core::{
    Claim, Delivery, GroupTransaction, JobId, Kind, Lease, Recorded, SettleInTransaction,
    Settlement, StoreError, WorkStore, WorkTransaction,
};
use tracing::Instrument;

use crate::handler::{Canceller, JobError, Prepared};
use crate::retry::Backoff;
use crate::worker::{
    Counted, DeadReason, Outcome, Ready, Salvage, Worker, ready_bounded, run_bounded,
};

/// How many passes a group of rerunnable jobs makes without checkpoints before a careful one:
/// each pass costs the group's jobs again, a careful one a round trip per job (and it may run
/// out of checkpoints and give jobs back).
const OPTIMISTIC_PASSES: usize = 3;

/// The grouped mode of a worker, with the queue's type erased: built by
/// [`WorkerBuilder::grouped`](crate::WorkerBuilder::grouped) where the bounds are known.
pub(crate) trait Groups<S: WorkStore>: Send + Sync {
    /// Why the queue cannot join `store`'s transactions, if it cannot.
    fn check(&self, store: &S) -> Result<(), String>;

    /// Processes one group (see [`next_group`](crate::worker::next_group)) to the end.
    fn run<'a>(
        &'a self,
        worker: &'a Worker<S>,
        group: Vec<Delivery>,
    ) -> BoxFuture<'a, Vec<Outcome>>;
}

/// [`Groups`] over the queue `Q`.
pub(crate) struct GroupsOf<Q>(pub(crate) Arc<Q>);

impl<S, Q> Groups<S> for GroupsOf<Q>
where
    S: WorkStore,
    S::Tx: GroupTransaction,
    Q: SettleInTransaction<S> + 'static,
{
    fn check(&self, store: &S) -> Result<(), String> {
        self.0.shares_transactions_with(store)
    }

    fn run<'a>(
        &'a self,
        worker: &'a Worker<S>,
        group: Vec<Delivery>,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        Box::pin(worker.process_group(&*self.0, group))
    }
}

/// A job of a group.
struct Member<Tx: Send> {
    delivery: Delivery,
    salvage: Salvage,
    kind: Kind,
    job_id: JobId,
    span: tracing::Span,
    rerunnable: bool,
    /// Fires its handler's cancellation.
    cancel: Canceller,
    /// Its place among the group's deliveries, for the outcomes' order.
    index: usize,
    /// The prepared handler call, until it runs.
    prepared: Option<Box<dyn Prepared<Tx>>>,
    /// What it became in this transaction, once known.
    decided: Option<Decided>,
    /// Its lease was lost before the group held it.
    lost: bool,
}

/// What a job of a group became, settled when the group commits.
#[derive(Clone)]
enum Decided {
    /// Its handler committed; `wrote` says whether it wrote anything.
    Processed {
        wrote: bool,
    },
    /// Settled before (processed, or dead-lettered): acked without running.
    Duplicate,
    Retrying(SystemTime),
    Deferred(SystemTime),
    /// Dead-lettered in the group's transaction.
    DeadLettered {
        reason: DeadReason,
        error: String,
        /// The letter as recorded, by the latest pass (a pass after a rollback records it
        /// again).
        recorded: Option<Recorded>,
    },
}

impl Decided {
    fn settlement(&self) -> Settlement {
        match self {
            Decided::Retrying(at) => Settlement::RetryAt(*at),
            Decided::Deferred(until) => Settlement::Defer(*until),
            Decided::Processed { .. } | Decided::Duplicate | Decided::DeadLettered { .. } => {
                Settlement::Ack
            }
        }
    }
}

/// Why a pass of a group did not reach its commit.
enum Stop {
    /// A failed job has no checkpoint to go back to: roll back and make a second pass.
    Again,
    /// A conflict with another transaction: the jobs may run again one by one.
    Conflict(StoreError),
    /// Anything else: the jobs stay leased and come back after their leases.
    Failed(String),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { .. } => Stop::Conflict(e),
            other => Stop::Failed(other.to_string()),
        }
    }
}

impl<S: WorkStore> Worker<S>
where
    S::Tx: Send,
{
    /// Processes `group` in one work transaction settled through `queue`, and says what
    /// became of each delivery, in the group's order. Deliveries no handler can run (poison,
    /// an unknown kind) settle on their own first, through the transport ([`Worker::rejected`]).
    pub(crate) async fn process_group<Q>(&self, queue: &Q, group: Vec<Delivery>) -> Vec<Outcome>
    where
        Q: SettleInTransaction<S> + ?Sized,
        S::Tx: GroupTransaction,
    {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; group.len()];
        let mut members = Vec::with_capacity(group.len());
        for (index, delivery) in group.into_iter().enumerate() {
            let triaged = self.triage(&delivery);
            let span = self.job_span(Ready::salvage_of(&triaged));
            match triaged {
                Ok(Ready {
                    prepared,
                    salvage,
                    kind,
                    job_id,
                    rerunnable,
                    cancel,
                }) => members.push(Member {
                    delivery,
                    salvage,
                    kind,
                    job_id,
                    span,
                    rerunnable,
                    cancel,
                    index,
                    prepared: Some(prepared),
                    decided: None,
                    lost: false,
                }),
                Err(reject) => {
                    let outcome = self.rejected(&delivery, reject).instrument(span).await;
                    outcomes[index] = Some(outcome);
                }
            }
        }
        let members = self.ready_members(members, &mut outcomes).await;
        if !members.is_empty() {
            for (index, outcome) in self.commit_group(queue, members).await {
                outcomes[index] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Outcome::Unsettled {
                    error: "not settled by its group".to_owned(),
                })
            })
            .collect()
    }

    /// Waits for every member to be ready ([`Handler::ready`](crate::Handler::ready)), all at
    /// once and before the group's transaction opens; the members that are not ready (their
    /// tokens too far off, say) are settled on their own through the transport, with their
    /// outcomes in `outcomes`, and the rest returned to run.
    async fn ready_members(
        &self,
        members: Vec<Member<S::Tx>>,
        outcomes: &mut [Option<Outcome>],
    ) -> Vec<Member<S::Tx>> {
        // Most handlers are ready at once: each readiness is polled once here, and only the
        // ones still waiting are awaited together.
        let mut readiness = Vec::with_capacity(members.len());
        let mut waiting = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let prepared = member.prepared.as_deref().expect("prepared until it runs");
            let mut ready = Box::pin(
                ready_bounded(prepared, self.time_limit(&member.kind), &member.cancel)
                    .instrument(member.span.clone()),
            );
            let first = std::future::poll_fn(|cx| Poll::Ready(ready.as_mut().poll(cx))).await;
            match first {
                Poll::Ready(result) => readiness.push(Some(result)),
                Poll::Pending => {
                    readiness.push(None);
                    waiting.push(async move { (i, ready.await) });
                }
            }
        }
        for (i, result) in futures_util::future::join_all(waiting).await {
            readiness[i] = Some(result);
        }
        let readiness = readiness
            .into_iter()
            .map(|result| result.expect("every readiness was awaited"));
        let mut ready = Vec::with_capacity(members.len());
        for (member, readiness) in members.into_iter().zip(readiness) {
            match readiness {
                Ok(()) => ready.push(member),
                Err(error) => {
                    let outcome = self
                        .settle_failure(&member.delivery, member.salvage, &member.kind, error)
                        .instrument(member.span)
                        .await;
                    outcomes[member.index] = Some(outcome);
                }
            }
        }
        ready
    }

    /// Runs the members in a transaction and commits it, in another pass when one could not
    /// undo a failure; on a conflict, runs them again one by one on the per-job path (their
    /// leases still hold, so no attempt is spent).
    async fn commit_group<Q>(
        &self,
        queue: &Q,
        mut members: Vec<Member<S::Tx>>,
    ) -> Vec<(usize, Outcome)>
    where
        Q: SettleInTransaction<S> + ?Sized,
        S::Tx: GroupTransaction,
    {
        // A group of jobs that may all run again starts optimistic, and stays so for a few
        // passes, each running again the jobs whose writes the last one rolled back (a failure
        // is decided once and not run again, so each pass runs fewer); then, as any other
        // group's second pass, careful.
        let mut careful = !members.iter().all(|m| m.rerunnable);
        let (mut second, mut passes) = (false, 0);
        // Every statement of the group's transaction is bounded by its longest time limit.
        let limit = members
            .iter()
            .map(|member| self.time_limit(&member.kind))
            .max()
            .unwrap_or(self.config.handler_timeout);
        let stop = loop {
            passes += 1;
            let mut tx = match self.store.begin_within(limit).await {
                Ok(tx) => tx,
                Err(e) => return self.unavailable(members, &e).await,
            };
            match self
                .pass(queue, &mut tx, &mut members, careful, second)
                .await
            {
                Ok(()) => match tx.commit().await {
                    Ok(()) => {
                        self.store_works();
                        return self.announce(members).await;
                    }
                    // Whether it committed is unknown; the redeliveries' claims will tell.
                    Err(e) => break Stop::from(e),
                },
                Err(stop) => {
                    if let Err(e) = tx.rollback().await {
                        tracing::warn!(error = %e, "rollback failed; the transaction is abandoned");
                    }
                    match stop {
                        Stop::Again if !second => {
                            self.forget_rolled_back(&mut members);
                            if careful || passes >= OPTIMISTIC_PASSES {
                                (careful, second) = (true, true);
                            }
                        }
                        Stop::Again => {
                            break Stop::Failed("a careful pass could not undo a job".into());
                        }
                        other => break other,
                    }
                }
            }
        };
        match stop {
            Stop::Conflict(e) => {
                tracing::warn!(queue = %self.queue(), error = %e, "a group lost a conflict; its jobs run again one by one");
                let mut outcomes = Vec::with_capacity(members.len());
                for member in members {
                    outcomes.push((member.index, self.process(member.delivery).await));
                }
                outcomes
            }
            Stop::Failed(error) => self.abandon(members, &error),
            Stop::Again => self.abandon(members, "a careful pass could not undo a job"),
        }
    }

    /// One pass of a group in `tx`: hold, claim, run what has to run, settle. `careful` takes a
    /// checkpoint before a job whenever a handler wrote since the last (otherwise every job is
    /// rerunnable, and checkpoints are as far apart as [`Worker::checkpoint_every`] says);
    /// `second` takes one before the first job to run as well, so nothing of this pass can
    /// need another.
    async fn pass<Q>(
        &self,
        queue: &Q,
        tx: &mut S::Tx,
        members: &mut [Member<S::Tx>],
        careful: bool,
        second: bool,
    ) -> Result<(), Stop>
    where
        Q: SettleInTransaction<S> + ?Sized,
        S::Tx: GroupTransaction,
    {
        let live: Vec<usize> = (0..members.len()).filter(|&i| !members[i].lost).collect();
        let deliveries: Vec<(&Lease, JobId)> = live
            .iter()
            .map(|&i| (&members[i].delivery.lease, members[i].job_id))
            .collect();
        let claims = queue
            .hold_and_claim(tx, &deliveries, &self.consumer, self.clock.now())
            .await?;
        let mut live_claims = Vec::with_capacity(live.len());
        for (&i, claim) in live.iter().zip(claims) {
            match claim {
                Some(claim) => live_claims.push((i, claim)),
                None => members[i].lost = true,
            }
        }
        let live: Vec<usize> = live_claims.iter().map(|&(i, _)| i).collect();
        tx.take_touched();
        // What is left to run or redo, in the group's order; a job whose writes an undo took
        // with a failed one's goes back to its front.
        let mut queued = VecDeque::with_capacity(live.len());
        for (i, claim) in live_claims {
            if claim == Claim::Claimed {
                queued.push_back(i);
            } else {
                // Settled before: processed, or dead-lettered (a replay releases the claim).
                members[i].decided = Some(Decided::Duplicate);
            }
        }
        // A handler wrote since the last checkpoint (the runtime's own writes, a released claim
        // or a dead letter, need none: an undo that takes them puts their jobs back in line to
        // redo them).
        let mut dirty = second;
        let mut checkpointed = false;
        let (budget, mut checkpoints) = (tx.checkpoint_budget(), 0usize);
        // A careful pass checkpoints whenever a handler wrote; an optimistic one (every job
        // rerunnable) only every so many jobs that wrote, while jobs fail after writing.
        let every = if careful {
            None
        } else {
            self.checkpoint_every()
        };
        // The jobs done since the last checkpoint, and how many of them wrote.
        let (mut since, mut wrote_since) = (Vec::new(), 0usize);
        // The jobs that would have needed a checkpoint past the budget: given back, unrun.
        let mut given_back = Vec::new();
        while let Some(i) = queued.pop_front() {
            let member = &mut members[i];
            if member.decided.is_some() {
                // Decided before (in a pass or before an undo): its store actions again, its
                // handler not.
                self.redo(tx, member).await?;
                since.push(i);
                continue;
            }
            if dirty && (careful || every.is_some_and(|every| wrote_since >= every)) {
                if checkpoints < budget {
                    tx.checkpoint().await?;
                    checkpoints += 1;
                    (dirty, checkpointed) = (false, true);
                    (since, wrote_since) = (Vec::new(), 0);
                } else if careful {
                    // Out of checkpoints: it waits for another group, its attempt unspent.
                    member.decided = Some(Decided::Deferred(self.clock.now()));
                    given_back.push(member.job_id);
                    continue;
                }
            }
            let prepared = match member.prepared.take() {
                Some(prepared) => prepared,
                // Rolled back before: prepared anew.
                None => match self.triage(&member.delivery) {
                    Ok(ready) => {
                        member.cancel = ready.cancel;
                        ready.prepared
                    }
                    Err(reject) => return Err(Stop::Failed(reject.error)),
                },
            };
            let started = Instant::now();
            let limit = self.time_limit(&member.kind);
            let result = run_bounded(prepared, tx, limit, &member.cancel)
                .instrument(member.span.clone())
                .await;
            self.timed(&member.kind, started);
            let wrote = tx.take_touched();
            self.count_undo(wrote && result.is_err());
            let error = match result {
                Ok(()) => {
                    member.decided = Some(Decided::Processed { wrote });
                    dirty |= wrote;
                    wrote_since += usize::from(wrote);
                    since.push(i);
                    continue;
                }
                Err(error) => error,
            };
            member.decided = Some(self.failed(member, error));
            if wrote {
                if !checkpointed {
                    // Nothing to go back to that keeps the others' writes.
                    return Err(Stop::Again);
                }
                tx.undo().await?;
                // What the jobs since the checkpoint wrote went too: the ones that wrote run
                // again (rerunnable: a careful pass checkpoints after every write, so it never
                // undoes one), the others' store actions are redone.
                for j in since.drain(..).rev() {
                    if let Some(Decided::Processed { wrote: true }) = members[j].decided {
                        debug_assert!(members[j].rerunnable, "a careful pass undid a write");
                        members[j].decided = None;
                    }
                    queued.push_front(j);
                }
                (dirty, wrote_since) = (false, 0);
            }
            self.redo(tx, &mut members[i]).await?;
            since.push(i);
        }
        if !given_back.is_empty() {
            tx.unclaim_all(&given_back, &self.consumer).await?;
        }
        self.fit_groups(checkpoints, budget, !given_back.is_empty());
        let settlements: Vec<(&Delivery, Settlement)> = live
            .iter()
            .filter_map(|&i| {
                let member = &members[i];
                let decided = member.decided.as_ref()?;
                Some((&member.delivery, decided.settlement()))
            })
            .collect();
        queue.settle(tx, &settlements).await?;
        Ok(())
    }

    /// What a failed job becomes, by the policy: retried, deferred, or dead-lettered.
    fn failed(&self, member: &Member<S::Tx>, error: JobError) -> Decided {
        match error {
            JobError::Defer { until } => Decided::Deferred(until),
            JobError::Retry(e) => match self.policy.after_failure(member.delivery.attempt) {
                Backoff::RetryIn(delay) => {
                    member.span.in_scope(|| {
                        let attempt = member.delivery.attempt;
                        tracing::warn!(attempt, error = %e, retry_in = ?delay, "job failed; will retry");
                    });
                    Decided::Retrying(self.clock.now() + delay)
                }
                Backoff::Exhausted => Decided::DeadLettered {
                    reason: DeadReason::Exhausted,
                    error: e.to_string(),
                    recorded: None,
                },
            },
            JobError::Permanent(e) => Decided::DeadLettered {
                reason: DeadReason::Permanent,
                error: e.to_string(),
                recorded: None,
            },
        }
    }

    /// The store's side of a decided job in this transaction: a failed job's claim released
    /// for a retry or a deferral, or its dead letter recorded (the claim stays: they commit
    /// together).
    async fn redo(&self, tx: &mut S::Tx, member: &mut Member<S::Tx>) -> Result<(), StoreError>
    where
        S::Tx: GroupTransaction,
    {
        match &mut member.decided {
            Some(Decided::Retrying(_) | Decided::Deferred(_)) => {
                tx.unclaim(member.job_id, &self.consumer).await?;
            }
            Some(Decided::DeadLettered {
                error, recorded, ..
            }) => {
                let letter = self.letter(&member.delivery, &member.salvage, error.clone());
                *recorded = Some(tx.record_dead_letter(letter).await?);
            }
            Some(Decided::Processed { .. } | Decided::Duplicate) | None => {}
        }
        Ok(())
    }

    /// After a pass rolled back: the jobs whose writes went with it run again (rerunnable: a
    /// careful pass rolls back only when its failing job was the first to write); the others'
    /// store actions, dead letters included, are redone by the next pass.
    fn forget_rolled_back(&self, members: &mut [Member<S::Tx>]) {
        for member in members {
            if let Some(Decided::Processed { wrote: true }) = member.decided {
                debug_assert!(member.rerunnable, "a rollback took a careful pass's write");
                member.decided = None;
            }
        }
    }

    /// The store could not begin a transaction: every member is deferred, no attempt spent.
    async fn unavailable(
        &self,
        members: Vec<Member<S::Tx>>,
        error: &StoreError,
    ) -> Vec<(usize, Outcome)> {
        let mut outcomes = Vec::with_capacity(members.len());
        for member in members {
            let outcome = self
                .store_unavailable(&member.delivery, error)
                .instrument(member.span)
                .await;
            outcomes.push((member.index, outcome));
        }
        outcomes
    }

    /// The group did not commit: every member stays leased and comes back.
    fn abandon(&self, members: Vec<Member<S::Tx>>, error: &str) -> Vec<(usize, Outcome)> {
        tracing::warn!(queue = %self.queue(), error = %error, "a group did not commit; its jobs come back after their leases");
        members
            .into_iter()
            .map(|member| {
                member
                    .span
                    .in_scope(|| tracing::debug!("the group did not commit"));
                let error = format!("the group did not commit: {error}");
                (member.index, Outcome::Unsettled { error })
            })
            .collect()
    }

    /// After the commit: the outcomes, with their metrics, logs and alerts.
    async fn announce(&self, members: Vec<Member<S::Tx>>) -> Vec<(usize, Outcome)> {
        let mut outcomes = Vec::with_capacity(members.len());
        let mut tally = Tally::default();
        for member in members {
            let kind = &member.kind;
            let outcome = match member.decided {
                _ if member.lost => {
                    member.span.in_scope(|| {
                        tracing::warn!(
                            "lease lost before the group held it; the job is not run here"
                        );
                    });
                    Outcome::Unsettled {
                        error: "the lease was lost before the group held it".to_owned(),
                    }
                }
                Some(Decided::Processed { .. }) => {
                    tally.add(Counted::Processed, kind);
                    Outcome::Processed
                }
                Some(Decided::Duplicate) => {
                    tally.add(Counted::Duplicate, kind);
                    Outcome::Duplicate
                }
                Some(Decided::Retrying(at)) => {
                    tally.add(Counted::Retried, kind);
                    Outcome::Retrying { at }
                }
                Some(Decided::Deferred(until)) => Outcome::Deferred { until },
                Some(Decided::DeadLettered {
                    reason,
                    error,
                    recorded: Some(recorded),
                }) => {
                    if let Recorded::New(_) = recorded {
                        let attempt = member.delivery.attempt;
                        self.announce_dead(Some(kind), attempt, reason, &error)
                            .instrument(member.span.clone())
                            .await;
                    }
                    Outcome::DeadLettered {
                        id: recorded.id(),
                        reason,
                    }
                }
                // A committed group decided every job it held; should one slip through, its
                // lease expires and it comes back.
                Some(Decided::DeadLettered { recorded: None, .. }) | None => {
                    member.span.in_scope(|| {
                        tracing::error!("a job of a committed group was not settled");
                    });
                    Outcome::Unsettled {
                        error: "not settled by its group".to_owned(),
                    }
                }
            };
            member
                .span
                .in_scope(|| tracing::debug!(?outcome, "delivery settled"));
            outcomes.push((member.index, outcome));
        }
        for (name, kind, n) in tally.0 {
            self.count_n(name, &kind, n);
        }
        outcomes
    }
}

/// A group's counts per counter and kind, so that each is incremented once per group.
#[derive(Default)]
struct Tally(Vec<(Counted, Kind, u64)>);

impl Tally {
    fn add(&mut self, name: Counted, kind: &Kind) {
        match (self.0.iter_mut()).find(|(n, k, _)| *n == name && k == kind) {
            Some((_, _, count)) => *count += 1,
            None => self.0.push((name, kind.clone(), 1)),
        }
    }
}

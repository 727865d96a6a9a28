//! One group to its commit: several jobs in one work transaction that also settles them.
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
//! after writing lately ([`Sizing::checkpoint_every`]; none while they did not), and a failure
//! goes back to the last one and runs again the jobs whose writes went with it.
//!
//! When a failed job has no checkpoint to go back to (it was the first to write, or the group
//! is optimistic and took none), the group rolls back and makes another pass in a new
//! transaction: the claims again, the jobs whose verdict is known settled as decided, and only
//! the jobs that have to run again run (ones that never ran, and rerunnable ones whose writes
//! were rolled back), now with a checkpoint before each; an optimistic group makes up to two
//! more optimistic passes first, each a failure shorter. A conflict with another transaction
//! (a deadlock, a serialization failure) in the group's own statements makes its jobs run
//! again one by one, without spending an attempt.

use std::collections::VecDeque;
use std::task::Poll;
// tokio's clock: the same as the system's, but paused with a test's time, so that group
// sizing by the handlers' time is tested without waiting.
use tokio::time::Instant;

use jobs_core::{
    Claim, Delivery, GroupTransaction, JobId, Kind, Lease, Recorded, SettleInTransaction,
    Settlement, StoreError, WorkStore, WorkTransaction,
};
use tracing::Instrument;

use super::sizing::Sizing;
use crate::delivery::{
    Context, Counted, Ready, Salvage, Tally, ready_bounded, run_bounded, will_retry,
};
use crate::handler::{Canceller, Prepared};
use crate::retry::random_unit;
use crate::verdict::{Outcome, Tried, Verdict, verdict};

/// How many passes a group of rerunnable jobs makes without checkpoints before a careful one:
/// each pass costs the group's jobs again, a careful one a round trip per job (and it may run
/// out of checkpoints and give jobs back).
const OPTIMISTIC_PASSES: usize = 3;

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
    /// What becomes of it, once its try in this transaction is known; settled at the commit.
    verdict: Option<Verdict>,
    /// Its handler wrote: a processed job whose writes an undo takes must run again.
    wrote: bool,
    /// Its dead letter as the latest pass recorded it (a pass after a rollback records it
    /// again).
    recorded: Option<Recorded>,
    /// Its lease was lost before the group held it.
    lost: bool,
    /// Given back unstarted because the worker stopped.
    stopped: bool,
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

/// How a verdict settles its delivery inside the group's transaction; `None` for one that
/// settles nothing (a lost lease, which a group never holds).
fn settlement(verdict: &Verdict) -> Option<Settlement> {
    match verdict {
        Verdict::Processed | Verdict::Duplicate | Verdict::DeadLetter { .. } => {
            Some(Settlement::Ack)
        }
        Verdict::RetryAt { at, .. } => Some(Settlement::RetryAt(*at)),
        Verdict::DeferUntil(until) | Verdict::GiveBack { until, .. } => {
            Some(Settlement::Defer(*until))
        }
        Verdict::Unsettled => None,
    }
}

/// A group's run over one queue: the worker's context, its group sizing and the queue that
/// settles inside the store's transactions.
pub(crate) struct Group<'a, S: WorkStore, Q: ?Sized> {
    pub(crate) ctx: &'a Context<S>,
    pub(crate) sizing: &'a Sizing,
    pub(crate) queue: &'a Q,
}

impl<S, Q> Group<'_, S, Q>
where
    S: WorkStore,
    S::Tx: GroupTransaction + Send,
    Q: SettleInTransaction<S> + ?Sized,
{
    /// Processes `group` in one work transaction settled through the queue, and says what
    /// became of each delivery, in the group's order. Deliveries no handler can run (poison,
    /// an unknown kind) settle on their own first, through the transport.
    pub(crate) async fn process(&self, group: Vec<Delivery>) -> Vec<Outcome> {
        let ctx = self.ctx;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; group.len()];
        let mut members = Vec::with_capacity(group.len());
        for (index, delivery) in group.into_iter().enumerate() {
            let triaged = ctx.triage(&delivery);
            let span = ctx.job_span(Ready::salvage_of(&triaged));
            match triaged {
                Ok(ready) => members.push(Member {
                    delivery,
                    salvage: ready.salvage,
                    kind: ready.kind,
                    job_id: ready.job_id,
                    span,
                    rerunnable: ready.rerunnable,
                    cancel: ready.cancel,
                    index,
                    prepared: Some(ready.prepared),
                    verdict: None,
                    wrote: false,
                    recorded: None,
                    lost: false,
                    stopped: false,
                }),
                Err(reject) => {
                    let tried = Tried::Rejected {
                        reason: reject.reason,
                        error: reject.error,
                    };
                    let concluded = ctx.conclude(&delivery, reject.salvage, tried);
                    outcomes[index] = Some(concluded.instrument(span).await);
                }
            }
        }
        let members = self.ready_members(members, &mut outcomes).await;
        if !members.is_empty() {
            for (index, outcome) in self.commit(members).await {
                outcomes[index] = Some(outcome);
            }
        }
        (outcomes.into_iter())
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
        let ctx = self.ctx;
        // Most handlers are ready at once: each readiness is polled once here, and only the
        // ones still waiting are awaited together.
        let mut readiness = Vec::with_capacity(members.len());
        let mut waiting = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let prepared = member.prepared.as_deref().expect("prepared until it runs");
            let mut ready = Box::pin(
                ready_bounded(prepared, ctx.time_limit(&member.kind), &member.cancel)
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
        let readiness =
            (readiness.into_iter()).map(|result| result.expect("every readiness was awaited"));
        let mut ready = Vec::with_capacity(members.len());
        for (member, readiness) in members.into_iter().zip(readiness) {
            match readiness {
                Ok(()) => ready.push(member),
                Err(error) => {
                    let concluded =
                        ctx.conclude(&member.delivery, member.salvage, Tried::Failed(error));
                    outcomes[member.index] = Some(concluded.instrument(member.span).await);
                }
            }
        }
        ready
    }

    /// Runs the members in a transaction and commits it, in another pass when one could not
    /// undo a failure; on a conflict, runs them again one by one on the per-job path (their
    /// leases still hold, so no attempt is spent).
    async fn commit(&self, mut members: Vec<Member<S::Tx>>) -> Vec<(usize, Outcome)> {
        let ctx = self.ctx;
        // A group of jobs that may all run again starts optimistic, and stays so for a few
        // passes, each running again the jobs whose writes the last one rolled back (a failure
        // is decided once and not run again, so each pass runs fewer); then, as any other
        // group's second pass, careful.
        let mut careful = !members.iter().all(|m| m.rerunnable);
        let (mut second, mut passes) = (false, 0);
        // Every statement of the group's transaction is bounded by its longest time limit.
        let limit = (members.iter())
            .map(|member| ctx.time_limit(&member.kind))
            .max()
            .unwrap_or(ctx.limits.handler_timeout);
        let stop = loop {
            passes += 1;
            let mut tx = match ctx.store.begin_within(limit).await {
                Ok(tx) => tx,
                Err(e) => return self.unavailable(members, &e).await,
            };
            match self.pass(&mut tx, &mut members, careful, second).await {
                Ok(()) => match tx.commit().await {
                    Ok(()) => {
                        ctx.store_works();
                        return self.announce(members);
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
                            forget_rolled_back(&mut members);
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
                tracing::warn!(queue = %ctx.queue, error = %e, "a group lost a conflict; its jobs run again one by one");
                let mut outcomes = Vec::with_capacity(members.len());
                for member in members {
                    outcomes.push((member.index, ctx.process(member.delivery).await));
                }
                outcomes
            }
            Stop::Failed(error) => abandon(ctx, members, &error),
            Stop::Again => abandon(ctx, members, "a careful pass could not undo a job"),
        }
    }

    /// One pass of a group in `tx`: hold, claim, run what has to run, settle. `careful` takes a
    /// checkpoint before a job whenever a handler wrote since the last (otherwise every job is
    /// rerunnable, and checkpoints are as far apart as [`Sizing::checkpoint_every`] says);
    /// `second` takes one before the first job to run as well, so nothing of this pass can
    /// need another.
    async fn pass(
        &self,
        tx: &mut S::Tx,
        members: &mut [Member<S::Tx>],
        careful: bool,
        second: bool,
    ) -> Result<(), Stop> {
        let ctx = self.ctx;
        let live: Vec<usize> = (0..members.len()).filter(|&i| !members[i].lost).collect();
        let deliveries: Vec<(&Lease, JobId)> = (live.iter())
            .map(|&i| (&members[i].delivery.lease, members[i].job_id))
            .collect();
        let claims = (self.queue)
            .hold_and_claim(tx, &deliveries, &ctx.consumer, ctx.clock.now())
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
                members[i].verdict = Some(Verdict::Duplicate);
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
            self.sizing.checkpoint_every()
        };
        // The jobs done since the last checkpoint, and how many of them wrote.
        let (mut since, mut wrote_since) = (Vec::new(), 0usize);
        // The jobs that would have needed a checkpoint past the budget: given back, unrun.
        let mut given_back = Vec::new();
        // The jobs not started when the worker stopped: given back, unrun.
        let mut stopped_back = Vec::new();
        while let Some(i) = queued.pop_front() {
            let member = &mut members[i];
            if member.verdict.is_some() {
                // Decided before (in a pass or before an undo): its store actions again, its
                // handler not.
                redo(ctx, tx, member).await?;
                since.push(i);
                continue;
            }
            if ctx.stopping() {
                // The worker stopped: another takes it at once, its attempt unspent, and the
                // group commits what it did without waiting for more handlers.
                member.verdict = Some(Verdict::DeferUntil(ctx.clock.now()));
                member.stopped = true;
                stopped_back.push(member.job_id);
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
                    member.verdict = Some(Verdict::DeferUntil(ctx.clock.now()));
                    given_back.push(member.job_id);
                    continue;
                }
            }
            let prepared = match member.prepared.take() {
                Some(prepared) => prepared,
                // Rolled back before: prepared anew.
                None => match ctx.triage(&member.delivery) {
                    Ok(ready) => {
                        member.cancel = ready.cancel;
                        ready.prepared
                    }
                    Err(reject) => return Err(Stop::Failed(reject.error)),
                },
            };
            let started = Instant::now();
            let limit = ctx.time_limit(&member.kind);
            let result = run_bounded(prepared, tx, limit, &member.cancel)
                .instrument(member.span.clone())
                .await;
            let elapsed = started.elapsed();
            ctx.timed(&member.kind, elapsed);
            self.sizing.timed(elapsed);
            let wrote = tx.take_touched();
            self.sizing.count_undo(wrote && result.is_err());
            member.wrote = wrote;
            let error = match result {
                Ok(()) => {
                    member.verdict = Some(Verdict::Processed);
                    dirty |= wrote;
                    wrote_since += usize::from(wrote);
                    since.push(i);
                    continue;
                }
                Err(error) => error,
            };
            let attempt = member.delivery.attempt;
            let decided = verdict(
                Tried::Failed(error),
                attempt,
                &ctx.policy,
                ctx.clock.now(),
                random_unit,
            );
            if let Verdict::RetryAt {
                delay,
                cause,
                error,
                ..
            } = &decided
            {
                (member.span).in_scope(|| will_retry(attempt, *delay, *cause, error));
            }
            member.verdict = Some(decided);
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
                    let undone = &mut members[j];
                    if undone.wrote && undone.verdict == Some(Verdict::Processed) {
                        debug_assert!(undone.rerunnable, "a careful pass undid a write");
                        undone.verdict = None;
                    }
                    queued.push_front(j);
                }
                (dirty, wrote_since) = (false, 0);
            }
            redo(ctx, tx, &mut members[i]).await?;
            since.push(i);
        }
        let ran_out = !given_back.is_empty();
        given_back.extend_from_slice(&stopped_back);
        if !given_back.is_empty() {
            tx.unclaim_all(&given_back, &ctx.consumer).await?;
        }
        if let Some(size) = self.sizing.fit(checkpoints, budget, ran_out) {
            tracing::debug!(queue = %ctx.queue, size, "a group ran out of checkpoints; the next groups are smaller");
        }
        let settlements: Vec<(&Delivery, Settlement)> = (live.iter())
            .filter_map(|&i| {
                let member = &members[i];
                Some((&member.delivery, settlement(member.verdict.as_ref()?)?))
            })
            .collect();
        self.queue.settle(tx, &settlements).await?;
        Ok(())
    }

    /// The store could not begin a transaction: every member is given back, no attempt spent.
    async fn unavailable(
        &self,
        members: Vec<Member<S::Tx>>,
        error: &StoreError,
    ) -> Vec<(usize, Outcome)> {
        let ctx = self.ctx;
        let mut outcomes = Vec::with_capacity(members.len());
        for member in members {
            let tried = ctx.store_unavailable(error);
            let concluded = ctx.conclude(&member.delivery, member.salvage, tried);
            outcomes.push((member.index, concluded.instrument(member.span).await));
        }
        outcomes
    }

    /// After the commit: the outcomes, with their metrics, logs and alerts.
    fn announce(&self, members: Vec<Member<S::Tx>>) -> Vec<(usize, Outcome)> {
        let ctx = self.ctx;
        let mut outcomes = Vec::with_capacity(members.len());
        let mut tally = Tally::default();
        ctx.count_stopped_back(members.iter().filter(|m| m.stopped).count());
        for member in members {
            let kind = &member.kind;
            let outcome = match (member.verdict, member.recorded) {
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
                (Some(Verdict::Processed), _) => {
                    tally.add(Counted::Processed, kind);
                    Outcome::Processed
                }
                (Some(Verdict::Duplicate), _) => {
                    tally.add(Counted::Duplicate, kind);
                    Outcome::Duplicate
                }
                // A member's handler ran: a kind no handler knows was settled by the triage,
                // before the group, and counted there.
                (Some(Verdict::RetryAt { at, .. }), _) => {
                    tally.add(Counted::Retried, kind);
                    Outcome::Retrying { at }
                }
                (Some(Verdict::DeferUntil(until) | Verdict::GiveBack { until, .. }), _) => {
                    Outcome::Deferred { until }
                }
                (Some(Verdict::DeadLetter { reason, error }), Some(recorded)) => {
                    if let Recorded::New(_) = recorded {
                        let attempt = member.delivery.attempt;
                        (member.span)
                            .in_scope(|| ctx.announce_dead(Some(kind), attempt, reason, &error));
                    }
                    Outcome::DeadLettered {
                        id: recorded.id(),
                        reason,
                    }
                }
                // A committed group decided every job it held; should one slip through, its
                // lease expires and it comes back.
                (Some(Verdict::DeadLetter { .. } | Verdict::Unsettled) | None, _) => {
                    member.span.in_scope(|| {
                        tracing::error!("a job of a committed group was not settled");
                    });
                    Outcome::Unsettled {
                        error: "not settled by its group".to_owned(),
                    }
                }
            };
            (member.span).in_scope(|| tracing::debug!(?outcome, "delivery settled"));
            outcomes.push((member.index, outcome));
        }
        ctx.count_tally(tally);
        outcomes
    }
}

/// The store's side of a decided job in this transaction: a failed job's claim released for
/// a retry or a deferral, or its dead letter recorded (the claim stays: they commit
/// together).
async fn redo<S>(
    ctx: &Context<S>,
    tx: &mut S::Tx,
    member: &mut Member<S::Tx>,
) -> Result<(), StoreError>
where
    S: WorkStore,
    S::Tx: GroupTransaction + Send,
{
    match &member.verdict {
        Some(Verdict::RetryAt { .. } | Verdict::DeferUntil(_) | Verdict::GiveBack { .. }) => {
            tx.unclaim(member.job_id, &ctx.consumer).await?;
        }
        Some(Verdict::DeadLetter { error, reason }) => {
            let letter = ctx.letter(&member.delivery, &member.salvage, *reason, error.clone());
            member.recorded = Some(tx.record_dead_letter(letter).await?);
        }
        Some(Verdict::Processed | Verdict::Duplicate | Verdict::Unsettled) | None => {}
    }
    Ok(())
}

/// After a pass rolled back: the jobs whose writes went with it run again (rerunnable: a
/// careful pass rolls back only when its failing job was the first to write); the others'
/// store actions, dead letters included, are redone by the next pass.
fn forget_rolled_back<Tx: Send>(members: &mut [Member<Tx>]) {
    for member in members {
        if member.wrote && member.verdict == Some(Verdict::Processed) {
            debug_assert!(member.rerunnable, "a rollback took a careful pass's write");
            member.verdict = None;
        }
    }
}

/// The group did not commit: every member stays leased and comes back.
fn abandon<S: WorkStore, Tx: Send>(
    ctx: &Context<S>,
    members: Vec<Member<Tx>>,
    error: &str,
) -> Vec<(usize, Outcome)> {
    tracing::warn!(queue = %ctx.queue, error = %error, "a group did not commit; its jobs come back after their leases");
    (members.into_iter())
        .map(|member| {
            (member.span).in_scope(|| tracing::debug!("the group did not commit"));
            let error = format!("the group did not commit: {error}");
            (member.index, Outcome::Unsettled { error })
        })
        .collect()
}

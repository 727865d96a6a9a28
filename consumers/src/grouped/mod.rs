//! The grouped mode, for a queue kept in the store's own database
//! ([`SettleInTransaction`]): several jobs per work transaction, each acked in it.
//!
//! The loop here feeds groups from a local buffer that one fetch at a time keeps a group or
//! two ahead of them; [`sizing`] decides how large the next group is; [`pass`] runs a group
//! to its commit. It borrows the worker's [`Context`] and knows nothing of the worker itself.

mod pass;
mod sizing;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use jobs_core::{Delivery, GroupTransaction, PullPort, QueueError, SettleInTransaction, WorkStore};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::delivery::Context;
use crate::lifecycle::{Drained, Heartbeat, beat_every, drain, reap, work_or_poll};
use crate::verdict::Outcome;

pub(crate) use sizing::Sizing;

use pass::Group;

/// How many groups a grouped worker's fetch brings beyond its free slots. A fetch starts when
/// less than a group waits in the buffer, so with two the fetches of a busy worker bring a
/// group or two each rather than less than one, and the lease statement's cost is spread over
/// more jobs (the no-op drain at concurrency 4 went from about 45k to 47k jobs/s); a worker
/// leases at most its running groups and two groups ahead.
const FETCH_AHEAD: usize = 2;

/// The most jobs one fetch of a grouped worker leases: enough for many groups at once when
/// the fetch falls behind them, few enough that one statement stays short.
const MAX_FETCH: usize = 1_024;

/// A queue that settles inside the store's transactions, its type erased: made where the
/// bounds are known (the worker's builder), run here.
pub(crate) trait Groups<S: WorkStore>: Send + Sync {
    /// Why the queue cannot join `store`'s transactions, if it cannot.
    fn check(&self, store: &S) -> Result<(), jobs_core::Unsupported>;

    /// Processes one group (see [`next_group`]) to the end.
    fn run<'a>(
        &'a self,
        ctx: &'a Context<S>,
        sizing: &'a Sizing,
        group: Vec<Delivery>,
    ) -> BoxFuture<'a, Vec<Outcome>>;
}

/// [`Groups`] over the queue `Q`.
pub(crate) struct GroupsOf<Q>(pub(crate) Arc<Q>);

impl<S, Q> Groups<S> for GroupsOf<Q>
where
    S: WorkStore,
    S::Tx: GroupTransaction + Send,
    Q: SettleInTransaction<S> + 'static,
{
    fn check(&self, store: &S) -> Result<(), jobs_core::Unsupported> {
        self.0.shares_transactions_with(store)
    }

    fn run<'a>(
        &'a self,
        ctx: &'a Context<S>,
        sizing: &'a Sizing,
        group: Vec<Delivery>,
    ) -> BoxFuture<'a, Vec<Outcome>> {
        let queue = &*self.0;
        Box::pin(async move { Group { ctx, sizing, queue }.process(group).await })
    }
}

/// A worker's grouped mode: the queue, the sizing of its groups, and how long a short group
/// waits for more.
pub(crate) struct Grouped<S: WorkStore> {
    groups: Arc<dyn Groups<S>>,
    sizing: Sizing,
    /// `WorkerConfig::group_linger`.
    linger: Duration,
}

impl<S: WorkStore> Grouped<S>
where
    S::Tx: Send,
{
    /// The grouped mode over `groups`, sized by `sizing`, a short group waiting `linger` for
    /// more.
    pub(crate) fn new(groups: Arc<dyn Groups<S>>, sizing: Sizing, linger: Duration) -> Self {
        Grouped {
            groups,
            sizing,
            linger,
        }
    }

    /// Why the queue cannot join `store`'s transactions, if it cannot.
    pub(crate) fn check(&self, store: &S) -> Result<(), jobs_core::Unsupported> {
        self.groups.check(store)
    }

    /// One fetch of up to a group, run as the groups the loop would make of it, one after
    /// another.
    pub(crate) async fn run_once(
        &self,
        ctx: &Context<S>,
        pull: &dyn PullPort,
    ) -> Result<Vec<Outcome>, QueueError> {
        let fetched = pull.receive(&ctx.queue, self.sizing.most(), ctx.limits.lease);
        let mut buffer: VecDeque<Delivery> = fetched.await?.into();
        let mut outcomes = Vec::with_capacity(buffer.len());
        while !buffer.is_empty() {
            let group = next_group(&mut buffer, self.sizing.next());
            outcomes.extend(self.groups.run(ctx, &self.sizing, group).await);
        }
        Ok(outcomes)
    }

    /// The grouped loop: up to `concurrency` groups at once, each in its own work
    /// transaction, fed from a local buffer that one fetch at a time keeps a group or two
    /// ahead of them. The fetch runs while the groups do, and asks for as many jobs as there
    /// are free slots plus [`FETCH_AHEAD`] groups, so a fetch slower than the groups brings
    /// more each time. A job whose previous lease expired unsettled runs alone, once the jobs
    /// fetched before it have settled, with nothing else leased. It beats `heartbeat` whenever
    /// it turns, and at every poll interval while it waits.
    pub(crate) async fn run(
        self: &Arc<Self>,
        ctx: &Arc<Context<S>>,
        pull: Arc<dyn PullPort>,
        heartbeat: &Heartbeat,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Drained {
        let limits = &ctx.limits;
        let permits = Arc::new(Semaphore::new(limits.concurrency));
        let mut in_flight = JoinSet::new();
        let mut buffer = VecDeque::with_capacity(2 * self.sizing.most());
        let mut shutdown = std::pin::pin!(shutdown);
        let mut fetching: Option<BoxFuture<'static, Result<Vec<Delivery>, QueueError>>> = None;
        // After an empty or failed fetch: the wake-up or the poll before the next.
        let mut waiting: Option<BoxFuture<'static, ()>> = None;
        // A job whose worker may have died on it, waiting to run alone.
        let mut suspect: Option<Delivery> = None;
        // Slow start: one job, then twice as many each fetch. Every fetched job spends an
        // attempt, so a process that a job crashes at once (an abort, an OOM) costs that job
        // an attempt and leaves its neighbours' alone.
        let mut most = 1;
        let mut given_back = 0;
        let mut beat = beat_every(limits.poll_interval);
        loop {
            heartbeat.beat();
            while let Some(joined) = in_flight.try_join_next() {
                reap(&ctx.queue, joined);
            }
            if buffer.is_empty()
                && let Some(delivery) = suspect.take()
            {
                // Alone, once every job fetched with it has settled, and with nothing else
                // leased while it runs, so that if it crashes this process too it takes no
                // other job's attempt with it.
                let settled = tokio::select! {
                    () = &mut shutdown => false,
                    () = join_all(ctx, &mut in_flight, heartbeat, &mut beat) => true,
                };
                if !settled {
                    buffer.push_back(delivery);
                    break;
                }
                let (ctx_, grouped) = (ctx.clone(), self.clone());
                in_flight.spawn(async move {
                    (grouped.groups)
                        .run(&ctx_, &grouped.sizing, vec![delivery])
                        .await;
                });
                tokio::select! {
                    () = &mut shutdown => break,
                    () = join_all(ctx, &mut in_flight, heartbeat, &mut beat) => {}
                }
                most = 1;
                continue;
            }
            let size = self.sizing.next_in_loop();
            if fetching.is_none() && waiting.is_none() && suspect.is_none() && buffer.len() < size {
                let room = (permits.available_permits() + FETCH_AHEAD)
                    .saturating_mul(size)
                    .saturating_sub(buffer.len());
                fetching = Some(self.fetch(ctx, &pull, room.min(most)));
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                fetched = async { fetching.as_mut().expect("guarded").await }, if fetching.is_some() => {
                    fetching = None;
                    match fetched {
                        Ok(batch) if batch.is_empty() => {
                            let (pull, queue, poll) = (pull.clone(), ctx.queue.clone(), limits.poll_interval);
                            waiting = Some(Box::pin(async move { work_or_poll(&*pull, &queue, poll).await }));
                        }
                        Ok(batch) => {
                            // One suspect a fetch; the others are given back at once, attempt
                            // unspent, so that none of them is leased while it runs.
                            let (suspects, fresh): (Vec<_>, Vec<_>) =
                                batch.into_iter().partition(|d| d.expired);
                            let mut suspects = suspects.into_iter();
                            buffer.extend(fresh);
                            suspect = suspects.next();
                            given_back += ctx.give_back(suspects).await;
                            most = most.saturating_mul(2).min(MAX_FETCH);
                        }
                        Err(e) => {
                            tracing::warn!(queue = %ctx.queue, error = %e, "receive failed; will poll again");
                            waiting = Some(Box::pin(tokio::time::sleep(limits.poll_interval)));
                        }
                    }
                    ctx.flush_alerts();
                }
                () = async { waiting.as_mut().expect("guarded").await }, if waiting.is_some() => {
                    waiting = None;
                }
                // Turns while every slot is busy, for `Worker::stuck`.
                _ = beat.tick() => {}
                permit = permits.clone().acquire_owned(), if !buffer.is_empty() => {
                    let Ok(permit) = permit else { break };
                    let group = next_group(&mut buffer, self.sizing.next_in_loop());
                    let (ctx, grouped) = (ctx.clone(), self.clone());
                    in_flight.spawn(async move {
                        grouped.groups.run(&ctx, &grouped.sizing, group).await;
                        drop(permit);
                    });
                }
            }
        }
        // Groups under way start no more jobs: they give back the ones they hold unstarted.
        ctx.stop();
        // What a fetch under way leases is given back with the rest; a fetch that does not
        // answer within the grace is left (its leases expire).
        let grace = limits.shutdown_grace;
        if let Some(fetching) = fetching
            && let Ok(Ok(batch)) = tokio::time::timeout(grace, fetching).await
        {
            buffer.extend(batch);
        }
        buffer.extend(suspect);
        // A transport that does not answer keeps the rest; their leases expire.
        match tokio::time::timeout(grace, ctx.give_back(buffer)).await {
            Ok(released) => given_back += released,
            Err(_) => {
                tracing::warn!(queue = %ctx.queue, "could not give back every fetched job within the grace");
            }
        }
        let drained = drain(ctx, in_flight).await;
        Drained {
            given_back: given_back + ctx.stopped_back(),
            ..drained
        }
    }

    /// One fetch of up to `limit` deliveries, lingering for more (up to a group) when the
    /// configuration says so.
    fn fetch(
        &self,
        ctx: &Arc<Context<S>>,
        pull: &Arc<dyn PullPort>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Delivery>, QueueError>> {
        let (ctx, pull) = (ctx.clone(), pull.clone());
        let (linger, most) = (self.linger, self.sizing.most());
        Box::pin(async move {
            let (queue, lease) = (&ctx.queue, ctx.limits.lease);
            let mut batch = pull.receive(queue, limit, lease).await?;
            let missing = most.saturating_sub(batch.len());
            if !batch.is_empty() && missing > 0 && !linger.is_zero() {
                tokio::time::sleep(linger).await;
                match pull.receive(queue, missing, lease).await {
                    Ok(more) => batch.extend(more),
                    Err(e) => tracing::warn!(queue = %queue, error = %e, "receive failed"),
                }
            }
            Ok(batch)
        })
    }
}

/// The next group from the front of `buffer`: a delivery whose previous lease expired
/// unsettled ([`Delivery::expired`]) alone, else the first deliveries up to `size`, stopping
/// before such a one. A job that crashed its process (and so its group) thus runs alone from
/// then on, and cannot take neighbours down with it again.
fn next_group(buffer: &mut VecDeque<Delivery>, size: usize) -> Vec<Delivery> {
    let mut group = Vec::with_capacity(size.min(buffer.len()));
    while let Some(delivery) = buffer.pop_front() {
        let alone = delivery.expired;
        if alone && !group.is_empty() {
            buffer.push_front(delivery);
            break;
        }
        group.push(delivery);
        if alone || group.len() >= size {
            break;
        }
    }
    group
}

/// Waits until every task of `in_flight` has finished, reaping each (a task that panicked is
/// logged and counted) and beating `heartbeat` at every tick of `beat` meanwhile: a loop that
/// waits for its tasks on purpose is not stuck.
async fn join_all<S: WorkStore>(
    ctx: &Context<S>,
    in_flight: &mut JoinSet<()>,
    heartbeat: &Heartbeat,
    beat: &mut tokio::time::Interval,
) {
    loop {
        tokio::select! {
            joined = in_flight.join_next() => match joined {
                Some(joined) => reap(&ctx.queue, joined),
                None => return,
            },
            _ = beat.tick() => heartbeat.beat(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use jobs_core::QueueName;

    use super::*;

    /// Deliveries numbered by their message ids, `expired` where the flags say.
    fn buffer(expired: &[bool]) -> VecDeque<Delivery> {
        let queue: QueueName = "test.groups".parse().expect("valid");
        (expired.iter().enumerate())
            .map(|(n, &expired)| {
                let lease =
                    jobs_core::Lease::new(queue.clone(), n.to_string(), SystemTime::UNIX_EPOCH);
                Delivery::new(vec![], 1, Some(n.to_string()), lease).after_expiry(expired)
            })
            .collect()
    }

    fn ids(group: &[Delivery]) -> Vec<String> {
        group.iter().filter_map(|d| d.message_id.clone()).collect()
    }

    #[test]
    fn a_group_takes_up_to_its_size_from_the_front() {
        let mut deliveries = buffer(&[false; 5]);
        assert_eq!(ids(&next_group(&mut deliveries, 3)), ["0", "1", "2"]);
        assert_eq!(ids(&next_group(&mut deliveries, 3)), ["3", "4"]);
        assert!(next_group(&mut deliveries, 3).is_empty());
    }

    #[test]
    fn a_delivery_after_an_expired_lease_runs_alone() {
        let mut deliveries = buffer(&[false, false, true, false, true, true]);
        assert_eq!(
            ids(&next_group(&mut deliveries, 8)),
            ["0", "1"],
            "the group stops before it"
        );
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["2"], "alone");
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["3"]);
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["4"]);
        assert_eq!(ids(&next_group(&mut deliveries, 8)), ["5"]);
        assert!(deliveries.is_empty());
    }
}

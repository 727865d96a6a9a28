//! The fairness contract: what a transport that accepts
//! [`PullPort::share_by_tenant`](jobs_core::PullPort::share_by_tenant) must do, checked over
//! random mixes of tenants' backlogs.
//!
//! Each case publishes every tenant's backlog on a queue of its own (some jobs ready at once,
//! some delayed), then drains it the way workers do: receive a batch, hold the deliveries a
//! few receives (work in flight), then ack them or retry some once. Throughout, it checks:
//!
//! - a per-tenant limit is never exceeded: no more of one tenant's deliveries unsettled at once;
//! - without a limit, while two tenants both have ready jobs, the deliveries each got, divided
//!   by its weight, differ by at most one batch;
//! - every job is eventually delivered and acked, none lost, none acked twice.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jobs_core::{
    Delivery, Envelope, JobId, PublishOptions, QueueName, TenantFairness, TenantId, TenantWeights,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::contract::queue::QueueUnderTest;
use crate::fixtures;

/// One instance of a fair transport under test.
pub struct FairUnderTest {
    /// The queue itself: publishing, consuming and its time.
    pub queue: QueueUnderTest,
    /// Where its fetch reads the tenants' weights.
    pub weights: Arc<dyn TenantWeights>,
}

const LEASE: Duration = Duration::from_secs(30);
/// How long the delayed part of a backlog waits.
const DELAY: Duration = Duration::from_secs(60);
/// How long a retried job waits.
const RETRY: Duration = Duration::from_secs(1);

/// One tenant's part of a case.
#[derive(Debug, Clone)]
struct Backlog {
    tenant: u32,
    ready: usize,
    delayed: usize,
    weight: u32,
}

/// One random case.
#[derive(Debug, Clone)]
struct Case {
    backlogs: Vec<Backlog>,
    batch: usize,
    limit: Option<NonZeroU32>,
    /// Receives a delivery stays unsettled for.
    hold: usize,
    /// Every this many deliveries, one is retried once instead of acked.
    retry_every: Option<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    let backlog = (0usize..30, 0usize..4, 1u32..=3);
    (
        prop::collection::vec(backlog, 1..=4),
        1usize..=8,
        prop::option::of(1u32..=3),
        0usize..=2,
        prop::option::of(3usize..=7),
    )
        .prop_map(|(backlogs, batch, limit, hold, retry_every)| Case {
            backlogs: backlogs
                .into_iter()
                .enumerate()
                .map(|(i, (ready, delayed, weight))| Backlog {
                    tenant: u32::try_from(i).unwrap_or(0) + 1,
                    ready,
                    delayed,
                    weight,
                })
                .collect(),
            batch,
            limit: limit.and_then(NonZeroU32::new),
            hold,
            retry_every,
        })
}

/// Checks the contract over `cases` random cases, each in a runtime of its own on a fresh
/// instance from `setup` and a queue of its own. Panics with the broken promise and the
/// smallest case that breaks it.
pub fn check<F, Fut>(cases: u32, setup: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = FairUnderTest>,
{
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let n = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&case(), |case| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(format!("a runtime: {e}")))?;
        let queue: QueueName = format!("contract.fair.case{n}")
            .parse()
            .map_err(|e| TestCaseError::fail(format!("a queue name: {e}")))?;
        runtime.block_on(async {
            let t = setup().await;
            run_case(&t, &queue, &case).await
        })
    });
    if let Err(e) = result {
        panic!("the fairness contract is broken: {e}");
    }
}

/// A job the model knows of.
struct Pending {
    tenant: TenantId,
    /// When it is (next) ready, while nobody holds it.
    ready_at: SystemTime,
    leased: bool,
    retried: bool,
}

async fn run_case(t: &FairUnderTest, q: &QueueName, case: &Case) -> Result<(), TestCaseError> {
    let fairness = case
        .limit
        .map_or_else(TenantFairness::round_robin, |limit| {
            TenantFairness::round_robin().limit(limit)
        });
    t.queue
        .consumer
        .share_by_tenant(q, fairness)
        .map_err(|e| TestCaseError::fail(format!("share_by_tenant refused: {e}")))?;
    let mut weights: HashMap<TenantId, f64> = HashMap::new();
    let mut pending: HashMap<JobId, Pending> = HashMap::new();
    let start = t.queue.time.now();
    let mut n = 0u64;
    for backlog in &case.backlogs {
        let tenant = fixtures::tenant(backlog.tenant);
        let weight = NonZeroU32::new(backlog.weight).unwrap_or(NonZeroU32::MIN);
        t.weights
            .set_weight(q, tenant, weight)
            .await
            .map_err(|e| TestCaseError::fail(format!("set_weight: {e}")))?;
        weights.insert(tenant, f64::from(weight.get()));
        for i in 0..backlog.ready + backlog.delayed {
            n += 1;
            let envelope = fixtures::envelope(backlog.tenant, n);
            let delayed = i >= backlog.ready;
            let opts = if delayed {
                PublishOptions::default().delay(DELAY)
            } else {
                PublishOptions::default()
            };
            t.queue
                .publisher
                .publish(q, &envelope, opts)
                .await
                .map_err(|e| TestCaseError::fail(format!("publish: {e}")))?;
            let ready_at = if delayed { start + DELAY } else { start };
            pending.insert(
                envelope.job_id,
                Pending {
                    tenant,
                    ready_at,
                    leased: false,
                    retried: false,
                },
            );
        }
    }
    let total = pending.len();
    let mut acked: HashSet<JobId> = HashSet::new();
    let mut held: VecDeque<(usize, Delivery, JobId)> = VecDeque::new();
    // Per tenant, its deliveries so far, and since when it has had ready jobs without a
    // break (the delivery counts at that time, to compare from).
    let mut served: BTreeMap<TenantId, usize> = BTreeMap::new();
    let mut active_since: HashMap<TenantId, BTreeMap<TenantId, usize>> = HashMap::new();
    let mut settled = 0usize;
    let bound = 4 * total + 20;
    for step in 0..bound {
        if acked.len() == total {
            return Ok(());
        }
        let now = t.queue.time.now();
        let ready: HashSet<TenantId> = pending
            .values()
            .filter(|p| !p.leased && p.ready_at <= now)
            .map(|p| p.tenant)
            .collect();
        active_since.retain(|tenant, _| ready.contains(tenant));
        for tenant in &ready {
            active_since
                .entry(*tenant)
                .or_insert_with(|| served.clone());
        }
        let was_holding = !held.is_empty();
        let batch = t
            .queue
            .consumer
            .receive(q, case.batch, LEASE)
            .await
            .map_err(|e| TestCaseError::fail(format!("receive: {e}")))?;
        prop_assert!(batch.len() <= case.batch, "more than the batch asked for");
        for delivery in batch {
            let envelope = Envelope::decode(&delivery.payload)
                .map_err(|e| TestCaseError::fail(format!("a delivery does not decode: {e}")))?;
            let job = pending.get_mut(&envelope.job_id).ok_or_else(|| {
                TestCaseError::fail(format!(
                    "job {} delivered, but it is acked or was never published",
                    envelope.job_id
                ))
            })?;
            prop_assert!(!job.leased, "job {} delivered while held", envelope.job_id);
            prop_assert!(
                job.ready_at <= now,
                "job {} delivered before it was due",
                envelope.job_id
            );
            job.leased = true;
            *served.entry(job.tenant).or_default() += 1;
            held.push_back((step, delivery, envelope.job_id));
        }
        if let Some(limit) = case.limit {
            let mut in_flight: HashMap<TenantId, u32> = HashMap::new();
            for (_, _, job) in &held {
                if let Some(p) = pending.get(job) {
                    *in_flight.entry(p.tenant).or_default() += 1;
                }
            }
            for (tenant, count) in in_flight {
                prop_assert!(
                    count <= limit.get(),
                    "tenant {tenant} has {count} deliveries in flight, its limit is {limit}"
                );
            }
        } else {
            check_shares(&active_since, &served, &weights, &ready, case.batch)?;
        }
        // Settle what was held long enough, or everything when nothing else came.
        let idle = held.back().is_none_or(|(at, _, _)| *at != step);
        while let Some((at, _, _)) = held.front() {
            if !idle && step < at + case.hold {
                break;
            }
            let Some((_, delivery, job_id)) = held.pop_front() else {
                break;
            };
            settled += 1;
            let Some(job) = pending.get_mut(&job_id) else {
                continue;
            };
            let retry = !job.retried
                && case
                    .retry_every
                    .is_some_and(|every| settled.is_multiple_of(every));
            if retry {
                let at = t.queue.time.now() + RETRY;
                t.queue
                    .consumer
                    .retry_at(&delivery.lease, at)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("retry_at: {e}")))?;
                job.leased = false;
                job.retried = true;
                job.ready_at = at;
            } else {
                t.queue
                    .consumer
                    .ack(&delivery.lease)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("ack: {e}")))?;
                pending.remove(&job_id);
                prop_assert!(acked.insert(job_id), "job {job_id} acked twice");
            }
        }
        if idle && held.is_empty() {
            // Nothing came and nothing is held: let the delayed jobs and retries fall due.
            let waiting = pending.values().any(|p| p.ready_at > t.queue.time.now());
            if waiting {
                t.queue.time.advance(DELAY + RETRY).await;
            } else if !was_holding {
                return Err(TestCaseError::fail(format!(
                    "{} jobs are ready but a receive brought none of them",
                    pending.len()
                )));
            }
        }
    }
    Err(TestCaseError::fail(format!(
        "{} of {total} jobs were not acked after {bound} receives",
        total - acked.len()
    )))
}

/// For every two tenants with ready jobs since before this receive and still after it: the
/// deliveries each got since both were ready, over its weight, differ by at most one batch.
fn check_shares(
    active_since: &HashMap<TenantId, BTreeMap<TenantId, usize>>,
    served: &BTreeMap<TenantId, usize>,
    weights: &HashMap<TenantId, f64>,
    ready_before: &HashSet<TenantId>,
    batch: usize,
) -> Result<(), TestCaseError> {
    let tenants: Vec<&TenantId> = active_since
        .keys()
        .filter(|t| ready_before.contains(t))
        .collect();
    let count = |t: &TenantId, from: &BTreeMap<TenantId, usize>| {
        served.get(t).copied().unwrap_or(0) - from.get(t).copied().unwrap_or(0)
    };
    for (i, a) in tenants.iter().enumerate() {
        for b in &tenants[i + 1..] {
            // Compare from when the later of the two became ready.
            let (since_a, since_b) = (&active_since[*a], &active_since[*b]);
            let later = if count(a, since_a) <= count(a, since_b) {
                since_a
            } else {
                since_b
            };
            let (got_a, got_b) = (count(a, later), count(b, later));
            let share_a = got_a as f64 / weights.get(*a).copied().unwrap_or(1.0);
            let share_b = got_b as f64 / weights.get(*b).copied().unwrap_or(1.0);
            prop_assert!(
                (share_a - share_b).abs() <= batch as f64,
                "tenants {a} and {b} both had ready jobs: {got_a} and {got_b} deliveries \
                 (weights {} and {}), more than a batch of {batch} apart",
                weights.get(*a).copied().unwrap_or(1.0),
                weights.get(*b).copied().unwrap_or(1.0)
            );
        }
    }
    Ok(())
}

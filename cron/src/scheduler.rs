//! The scheduler: fires due slots and fans each out to the tenants.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, StreamExt};
use jobs_core::{
    Clock, DirectoryError, Envelope, ErrorClass, JobId, Kind, QueueError, QueueName, QueuePort,
    Tenant, TenantDirectory, TenantId,
};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::schedule::Schedule;
use crate::task::{CronTask, FanOut, Payload, Tier};
use crate::time::rfc3339;
use crate::{fanout_correlation_id, fanout_job_id, spread_offset, system_tenant};

/// Tenants read per directory page by default.
pub const DEFAULT_PAGE_SIZE: u32 = 1000;

/// Publishes in flight at once by default, within one page.
pub const DEFAULT_PUBLISH_CONCURRENCY: usize = 32;

/// Planned jobs kept in a [`FanOutReport`] as a sample.
pub const REPORT_SAMPLE: usize = 10;

/// What a tick does with slots missed while no scheduler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Fire the latest due slot of each task, once, however many were missed: a scheduler
    /// back after three days publishes one usage snapshot, not 144.
    #[default]
    Latest,
    /// Fire a due slot only if the tick comes within `grace` after it; older slots are
    /// skipped and reported. `grace` should exceed the interval between ticks, or slots are
    /// skipped in normal operation.
    Skip {
        /// How late a slot may still fire.
        grace: Duration,
    },
}

/// Fires the slots of periodic tasks and fans each out to the tenants.
///
/// Several instances may run at once (one per replica, say) and any may restart: every job's
/// id is [`fanout_job_id`] of (task, tenant, slot), so a slot fired twice publishes the same
/// jobs twice and the queue's deduplication by job id (then the consumers' `processed_jobs`
/// check) drops the second copy. No coordination between instances is needed.
///
/// The last fired slot of each task is kept in memory only. A fresh instance therefore
/// re-fires the latest due slot of every task on its first tick; that is deliberate (it is
/// also how a slot missed during a deploy gets fired) and harmless because of the above.
///
/// Memory stays bounded by one directory page, whatever the number of tenants.
pub struct Scheduler {
    tasks: Vec<CronTask>,
    directory: Arc<dyn TenantDirectory>,
    queue: Arc<dyn QueuePort>,
    clock: Arc<dyn Clock>,
    catch_up: CatchUp,
    page_size: u32,
    concurrency: usize,
    fired: Mutex<HashMap<Kind, SystemTime>>,
    /// Held for a whole tick, so one instance never runs two ticks at once.
    ticking: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field(
                "tasks",
                &self
                    .tasks
                    .iter()
                    .map(|t| t.kind.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("catch_up", &self.catch_up)
            .field("page_size", &self.page_size)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler of `tasks` over the tenants of `directory`, publishing to `queue`, on
    /// `clock`, with pages of [`DEFAULT_PAGE_SIZE`] and [`DEFAULT_PUBLISH_CONCURRENCY`].
    ///
    /// Refuses two tasks of the same kind (their jobs would share ids, so one would silently
    /// swallow the other's) and a tiered task with [`FanOut::Single`].
    pub fn new(
        tasks: Vec<CronTask>,
        directory: Arc<dyn TenantDirectory>,
        queue: Arc<dyn QueuePort>,
        clock: Arc<dyn Clock>,
        catch_up: CatchUp,
    ) -> Result<Self, CronError> {
        let mut kinds = HashSet::new();
        for task in &tasks {
            if !kinds.insert(&task.kind) {
                return Err(CronError::DuplicateKind(task.kind.clone()));
            }
            if task.tier.is_some() && task.fan_out == FanOut::Single {
                return Err(CronError::TieredSingle(task.kind.clone()));
            }
        }
        Ok(Scheduler {
            tasks,
            directory,
            queue,
            clock,
            catch_up,
            page_size: DEFAULT_PAGE_SIZE,
            concurrency: DEFAULT_PUBLISH_CONCURRENCY,
            fired: Mutex::default(),
            ticking: tokio::sync::Mutex::new(()),
        })
    }

    /// Reads the directory `page_size` tenants at a time (at least 1).
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Keeps up to `concurrency` publishes in flight (at least 1).
    pub fn publish_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The tasks, in the order they fire within a tick.
    pub fn tasks(&self) -> &[CronTask] {
        &self.tasks
    }

    /// Fires, for each task, the slot due now under the catch-up policy: the latest slot at or
    /// before now, if it is after the last slot this instance fired.
    ///
    /// Call it periodically (every minute, say); it never fires a slot twice per instance
    /// unless the fan-out was incomplete (a directory error, or publishes that failed), in
    /// which case the next tick tries the slot again and deduplication drops what was already
    /// published. Once a newer slot is due the older one is given up for it.
    pub async fn tick(&self) -> TickReport {
        let _one_at_a_time = self.ticking.lock().await;
        let now = self.clock.now();
        let mut report = TickReport::default();
        for task in &self.tasks {
            let Some(slot) = task.schedule.latest_at_or_before(now) else {
                continue;
            };
            if self.last_fired(&task.kind).is_some_and(|last| last >= slot) {
                continue;
            }
            if let CatchUp::Skip { grace } = self.catch_up
                && now.duration_since(slot).unwrap_or_default() > grace
            {
                self.mark_fired(&task.kind, slot);
                report.skipped.push(SkippedSlot {
                    kind: task.kind.clone(),
                    slot,
                });
                continue;
            }
            match self.fan_out(task, slot, now, false).await {
                Ok(fan_out) => {
                    if fan_out.is_complete() {
                        self.mark_fired(&task.kind, slot);
                    }
                    report.fired.push(fan_out);
                }
                Err(e) => report.errors.push(e),
            }
        }
        report
    }

    /// Fires `slot` by hand for every task that has it as a slot, as `jobsctl cron tick`
    /// does; with `dry_run`, publishes nothing and reports what would be published.
    ///
    /// Leaves the record of fired slots alone: the automatic ticks behave as if it had not
    /// run (and a slot fired both ways is deduplicated).
    pub async fn tick_at(&self, slot: SystemTime, dry_run: bool) -> TickReport {
        let now = self.clock.now();
        let mut report = TickReport::default();
        for task in self.tasks.iter().filter(|t| t.schedule.contains(slot)) {
            match self.fan_out(task, slot, now, dry_run).await {
                Ok(fan_out) => report.fired.push(fan_out),
                Err(e) => report.errors.push(e),
            }
        }
        report
    }

    /// Fires `slot` of the task of `kind` by hand; see [`Scheduler::tick_at`]. Refuses a
    /// kind no task has and a time that is not one of the task's slots.
    pub async fn fire(
        &self,
        kind: &Kind,
        slot: SystemTime,
        dry_run: bool,
    ) -> Result<FanOutReport, CronError> {
        let task = self
            .tasks
            .iter()
            .find(|t| t.kind == *kind)
            .ok_or_else(|| CronError::UnknownTask(kind.clone()))?;
        if !task.schedule.contains(slot) {
            return Err(CronError::NotASlot {
                kind: kind.clone(),
                slot,
            });
        }
        self.fan_out(task, slot, self.clock.now(), dry_run).await
    }

    /// Each task's schedule, last slot fired by this instance and next slot after now, for
    /// `jobsctl cron list`.
    pub fn next_fire_times(&self) -> Vec<NextFire> {
        let now = self.clock.now();
        let fired = self.lock_fired();
        self.tasks
            .iter()
            .map(|task| NextFire {
                kind: task.kind.clone(),
                queue: task.queue.clone(),
                schedule: task.schedule.clone(),
                last_fired: fired.get(&task.kind).copied(),
                next: task.schedule.next_after(now),
            })
            .collect()
    }

    fn lock_fired(&self) -> MutexGuard<'_, HashMap<Kind, SystemTime>> {
        // Every write is a single insert: a panic cannot leave the map half-updated.
        self.fired.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn last_fired(&self, kind: &Kind) -> Option<SystemTime> {
        self.lock_fired().get(kind).copied()
    }

    fn mark_fired(&self, kind: &Kind, slot: SystemTime) {
        let mut fired = self.lock_fired();
        let last = fired.entry(kind.clone()).or_insert(slot);
        *last = (*last).max(slot);
    }

    /// Publishes (or, dry, plans) the jobs of `task` at `slot`, page by page.
    async fn fan_out(
        &self,
        task: &CronTask,
        slot: SystemTime,
        now: SystemTime,
        dry_run: bool,
    ) -> Result<FanOutReport, CronError> {
        let mut report = FanOutReport::new(task, slot, dry_run);
        // A late slot (catch-up, a manual re-run) is spread from now, not from the past: its
        // jobs would otherwise all be due at once.
        let base = slot.max(now);
        if task.fan_out == FanOut::Single {
            let job = self.plan(task, slot, base, system_tenant(), None);
            self.publish(task, vec![job], &mut report).await;
            return Ok(report);
        }
        let mut after: Option<TenantId> = None;
        loop {
            let page = self
                .directory
                .page(after, self.page_size)
                .await
                .map_err(|source| CronError::Directory {
                    kind: task.kind.clone(),
                    slot,
                    source,
                })?;
            report.tenants += page.tenants.len() as u64;
            let jobs: Vec<_> = page
                .tenants
                .iter()
                .filter_map(|tenant| {
                    let tier = self.tier_of(task, tenant, &mut report)?;
                    Some(self.plan(task, slot, base, tenant.id, tier))
                })
                .collect();
            self.publish(task, jobs, &mut report).await;
            match page.next {
                None => return Ok(report),
                Some(next) if after.is_some_and(|a| next <= a) => {
                    return Err(CronError::CursorStuck {
                        kind: task.kind.clone(),
                        slot,
                        cursor: next,
                    });
                }
                Some(next) => after = Some(next),
            }
        }
    }

    /// `Some(tier)` for a tenant due under the task's tier rule, `Some(None)` for an untiered
    /// task, `None` for a tenant not due at the slot.
    fn tier_of(
        &self,
        task: &CronTask,
        tenant: &Tenant,
        report: &mut FanOutReport,
    ) -> Option<Option<Tier>> {
        let Some(rule) = &task.tier else {
            return Some(None);
        };
        let tier = rule.tier_of(tenant).unwrap_or_else(|e| {
            tracing::warn!(
                tenant = %tenant.id,
                kind = %task.kind,
                error = %e,
                "unknown tier; using the default"
            );
            report.unknown_tiers += 1;
            rule.default
        });
        tier.is_due(report.slot).then_some(Some(tier))
    }

    fn plan(
        &self,
        task: &CronTask,
        slot: SystemTime,
        base: SystemTime,
        tenant: TenantId,
        tier: Option<Tier>,
    ) -> (PlannedJob, Envelope) {
        let job_id = fanout_job_id(&task.kind, tenant, slot);
        let data = match &task.payload {
            Payload::Fixed(data) => data.clone(),
            Payload::Slot => {
                let mut data = Map::new();
                data.insert("slot".to_owned(), Value::String(rfc3339(slot)));
                if let Some(tier) = tier {
                    data.insert("tier".to_owned(), Value::String(tier.as_str().to_owned()));
                }
                Value::Object(data)
            }
        };
        let envelope = Envelope {
            job_id,
            tenant_id: tenant,
            correlation_id: fanout_correlation_id(&task.kind, slot),
            kind: task.kind.clone(),
            data,
        };
        let planned = PlannedJob {
            tenant,
            job_id,
            run_at: base + spread_offset(tenant, task.spread),
            tier,
        };
        (planned, envelope)
    }

    async fn publish(
        &self,
        task: &CronTask,
        jobs: Vec<(PlannedJob, Envelope)>,
        report: &mut FanOutReport,
    ) {
        report.jobs += jobs.len() as u64;
        let room = REPORT_SAMPLE.saturating_sub(report.sample.len());
        report
            .sample
            .extend(jobs.iter().take(room).map(|(planned, _)| planned.clone()));
        if report.dry_run {
            return;
        }
        let queue = &*self.queue;
        let results: Vec<_> = stream::iter(jobs)
            .map(|(planned, envelope)| async move {
                let result = queue.schedule(&task.queue, &envelope, planned.run_at).await;
                (planned, result)
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        for (planned, result) in results {
            match result {
                Ok(receipt) if receipt.duplicate => report.duplicates += 1,
                Ok(_) => report.queued += 1,
                Err(e) => {
                    tracing::warn!(
                        kind = %task.kind,
                        tenant = %planned.tenant,
                        job_id = %planned.job_id,
                        error = %e,
                        "publishing a cron job failed; the slot is retried at the next tick"
                    );
                    report.failed += 1;
                    report.first_error.get_or_insert(e);
                }
            }
        }
    }
}

/// One job of a fan-out, as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    /// Its tenant ([`crate::system_tenant`] for a [`FanOut::Single`] task).
    pub tenant: TenantId,
    /// Its id, [`fanout_job_id`] of (task, tenant, slot).
    pub job_id: JobId,
    /// When it is scheduled to run: the slot (or now, if later) plus the tenant's offset.
    pub run_at: SystemTime,
    /// The tenant's tier, for a tiered task.
    pub tier: Option<Tier>,
}

/// What one task did (or, dry, would do) at one slot.
#[derive(Debug)]
#[non_exhaustive]
pub struct FanOutReport {
    /// The task.
    pub kind: Kind,
    /// Its queue.
    pub queue: QueueName,
    /// The slot.
    pub slot: SystemTime,
    /// Whether nothing was published.
    pub dry_run: bool,
    /// Tenants listed by the directory.
    pub tenants: u64,
    /// Jobs planned: one per tenant due at the slot (one in all for a single task).
    pub jobs: u64,
    /// Jobs newly queued.
    pub queued: u64,
    /// Jobs the queue dropped as already published (by another instance, or before a
    /// restart).
    pub duplicates: u64,
    /// Publishes that failed; the slot is not recorded as fired while any did.
    pub failed: u64,
    /// Tenants whose tier entitlement was not a tier, given the default tier.
    pub unknown_tiers: u64,
    /// The first publish error, if any.
    pub first_error: Option<QueueError>,
    /// The first [`REPORT_SAMPLE`] planned jobs, in tenant order.
    pub sample: Vec<PlannedJob>,
}

impl FanOutReport {
    fn new(task: &CronTask, slot: SystemTime, dry_run: bool) -> Self {
        FanOutReport {
            kind: task.kind.clone(),
            queue: task.queue.clone(),
            slot,
            dry_run,
            tenants: 0,
            jobs: 0,
            queued: 0,
            duplicates: 0,
            failed: 0,
            unknown_tiers: 0,
            first_error: None,
            sample: vec![],
        }
    }

    /// Whether every planned job was published (or found already published).
    pub fn is_complete(&self) -> bool {
        self.failed == 0
    }
}

/// A slot the [`CatchUp::Skip`] policy did not fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSlot {
    /// The task.
    pub kind: Kind,
    /// The slot.
    pub slot: SystemTime,
}

/// What a tick did, task by task.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct TickReport {
    /// The fan-outs run, complete or not.
    pub fired: Vec<FanOutReport>,
    /// Slots skipped as too late.
    pub skipped: Vec<SkippedSlot>,
    /// Fan-outs that could not run to the end; their slots are tried again at the next
    /// tick.
    pub errors: Vec<CronError>,
}

impl TickReport {
    /// Whether every fan-out ran and published completely.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty() && self.fired.iter().all(FanOutReport::is_complete)
    }
}

/// A task's schedule and next slot, from [`Scheduler::next_fire_times`].
#[derive(Debug, Clone, PartialEq)]
pub struct NextFire {
    /// The task.
    pub kind: Kind,
    /// Its queue.
    pub queue: QueueName,
    /// Its schedule.
    pub schedule: Schedule,
    /// The last slot this instance fired, if any.
    pub last_fired: Option<SystemTime>,
    /// The first slot after now.
    pub next: Option<SystemTime>,
}

/// A failure of the scheduler.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CronError {
    /// The tenant directory could not be read; the fan-out stopped there.
    #[error("`{kind}` at {}: {source}", rfc3339(*.slot))]
    Directory {
        /// The task.
        kind: Kind,
        /// The slot.
        slot: SystemTime,
        /// The directory's error.
        #[source]
        source: DirectoryError,
    },
    /// The directory returned a cursor that does not move forward, which would loop forever.
    #[error("`{kind}` at {}: the tenant directory's cursor did not advance past {cursor}", rfc3339(*.slot))]
    CursorStuck {
        /// The task.
        kind: Kind,
        /// The slot.
        slot: SystemTime,
        /// The cursor returned.
        cursor: TenantId,
    },
    /// Two tasks of the same kind.
    #[error("two tasks have kind `{0}`; kinds are part of job ids and must be unique")]
    DuplicateKind(Kind),
    /// A tier rule on a task that publishes one job in all.
    #[error("task `{0}` is tiered but publishes a single job; tiers select tenants")]
    TieredSingle(Kind),
    /// No task has this kind.
    #[error("no task has kind `{0}`")]
    UnknownTask(Kind),
    /// The time is not a slot of the task's schedule.
    #[error("{} is not a slot of `{kind}`", rfc3339(*.slot))]
    NotASlot {
        /// The task.
        kind: Kind,
        /// The time given.
        slot: SystemTime,
    },
}

impl CronError {
    /// Whether the same call may succeed later: only a directory failure may.
    pub fn class(&self) -> ErrorClass {
        match self {
            CronError::Directory { source, .. } => source.class(),
            _ => ErrorClass::Permanent,
        }
    }
}

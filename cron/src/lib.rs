//! Per-tenant fan-out of the periodic jobs (partition pre-creation, retention, reconciliation,
//! data freshness, points expiring soon, usage snapshots, `processed_jobs` cleanup), over the
//! `jobs-core` ports only.
//!
//! - [`Schedule`]: a five-field cron expression in UTC or a fixed interval aligned to the Unix
//!   epoch; its slots are the instants a task fires.
//! - [`CronTask`]: kind, schedule, queue, spread and optional [`TierRule`];
//!   [`standard_tasks`] registers the standard's.
//! - [`Scheduler`]: [`Scheduler::tick`] fires due slots under a [`CatchUp`] policy, paging
//!   through the [`TenantDirectory`](jobs_core::TenantDirectory) and scheduling one job per
//!   (task, tenant, slot) on the [`QueuePort`](jobs_core::QueuePort).
//!
//! Everything rests on [`fanout_job_id`], which makes the job of (task, tenant, slot) the same
//! job whichever scheduler instance publishes it, so a second instance or a restart firing the
//! same slot is dropped by the queue's dedup key and by the consumers' `processed_jobs` check.
//! No lock, leader election or shared state between instances is needed.

mod schedule;
mod scheduler;
mod task;
mod time;

pub use schedule::{CronField, FieldProblem, Schedule, ScheduleError, Slots};
pub use scheduler::{
    CatchUp, CronError, DEFAULT_PAGE_SIZE, DEFAULT_PUBLISH_CONCURRENCY, FanOutReport, NextFire,
    PlannedJob, REPORT_SAMPLE, Scheduler, SkippedSlot, TickReport,
};
pub use task::{
    CronTask, DATA_FRESHNESS_ENTITLEMENT, DATA_FRESHNESS_KIND, FanOut, MAX_TIER_WAIT,
    PARTITIONS_PRECREATE_KIND, POINTS_EXPIRING_SOON_KIND, PROCESSED_JOBS_CLEANUP_KIND, Payload,
    RECONCILIATION_KIND, RETENTION_PURGE_KIND, Tier, TierError, TierRule, USAGE_SNAPSHOT_KIND,
    standard_tasks,
};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobs_core::{CorrelationId, JobId, Kind, TenantId};

/// The job id of task `task`'s job for `tenant` at `slot`: a valid UUID v7 whose timestamp is
/// the slot time (so ids still sort by schedule) and whose random bits are a SHA-1 digest of
/// the three, stable across processes, machines and releases.
///
/// ```
/// use jobs_cron::fanout_job_id;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let task = "billing.usage_snapshot".parse()?;
/// let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
/// let slot = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
/// assert_eq!(fanout_job_id(&task, tenant, slot), fanout_job_id(&task, tenant, slot));
/// assert_eq!(fanout_job_id(&task, tenant, slot).unix_ms(), 1_767_225_600_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fanout_job_id(task: &Kind, tenant: TenantId, slot: SystemTime) -> JobId {
    let slot_ms = unix_ms(slot);
    let mut digest = sha1_smol::Sha1::new();
    digest.update(task.as_str().as_bytes());
    digest.update(&[0]);
    digest.update(tenant.as_uuid().as_bytes());
    digest.update(&slot_ms.to_be_bytes());
    let bytes = digest.digest().bytes();
    let mut random = [0u8; 16];
    random.copy_from_slice(&bytes[..16]);
    JobId::from_parts(slot_ms, u128::from_be_bytes(random))
}

/// The correlation id shared by every job of task `task` at `slot`: a UUID v7 stamped with the
/// slot, derived like [`fanout_job_id`] (with a different domain), so an operator finds all of
/// one slot's jobs, logs and dead letters by one id, whichever instance published them.
pub fn fanout_correlation_id(task: &Kind, slot: SystemTime) -> CorrelationId {
    let slot_ms = unix_ms(slot);
    let mut digest = sha1_smol::Sha1::new();
    digest.update(b"correlation\0");
    digest.update(task.as_str().as_bytes());
    digest.update(&[0]);
    digest.update(&slot_ms.to_be_bytes());
    let bytes = digest.digest().bytes();
    let mut random = [0u8; 16];
    random.copy_from_slice(&bytes[..16]);
    let id = JobId::from_parts(slot_ms, u128::from_be_bytes(random));
    // A UUID v7 is one of the versions `z.uuid()` accepts.
    id.to_string()
        .parse()
        .unwrap_or_else(|_| unreachable!("a UUID v7 is a valid correlation id"))
}

/// How long after its slot `tenant`'s job runs within a spread window of `spread`: a hash of
/// the tenant (stable across instances and releases) in milliseconds, below `spread` (zero
/// when `spread` is zero). Tenants land uniformly over the window instead of in one second.
pub fn spread_offset(tenant: TenantId, spread: Duration) -> Duration {
    let window_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX);
    if window_ms == 0 {
        return Duration::ZERO;
    }
    let mut digest = sha1_smol::Sha1::new();
    digest.update(b"spread\0");
    digest.update(tenant.as_uuid().as_bytes());
    let bytes = digest.digest().bytes();
    let mut head = [0u8; 8];
    head.copy_from_slice(&bytes[..8]);
    Duration::from_millis(u64::from_be_bytes(head) % window_ms)
}

/// The tenant of [`FanOut::Single`] jobs, which belong to no tenant: the nil UUID, which the
/// envelope's `z.uuid()` accepts.
pub fn system_tenant() -> TenantId {
    "00000000-0000-0000-0000-000000000000"
        .parse()
        .unwrap_or_else(|_| unreachable!("the nil UUID is a valid tenant id"))
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

//! Per-tenant fan-out of the periodic jobs (partition pre-creation, retention, reconciliation,
//! data freshness, usage snapshots, …), over the `jobs-core` ports only.
//!
//! The scheduler itself is being built. What is here is the piece every fan-out rests on:
//! [`fanout_job_id`], which makes the job of (task, tenant, slot) the same job whichever
//! scheduler instance publishes it, so a second instance or a restart firing the same slot is
//! dropped by the queue's dedup key and by the consumers' `processed_jobs` check.

use std::time::{SystemTime, UNIX_EPOCH};

use jobs_core::{JobId, Kind, TenantId};

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
    let slot_ms = slot
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
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

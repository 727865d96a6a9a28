//! The periodic tasks: what fires, when, on which queue, for which tenants.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use jobs_core::{Kind, QueueName, Tenant};
use serde_json::Value;
use thiserror::Error;

use crate::schedule::Schedule;
use crate::time::floor_secs;

/// Kind of the monthly partition pre-creation job (daily).
pub const PARTITIONS_PRECREATE_KIND: &str = "core.partitions_precreate";
/// Kind of the retention job: export what has aged out, then purge it (daily).
pub const RETENTION_PURGE_KIND: &str = "core.retention_purge";
/// Kind of the nightly reconciliation job.
pub const RECONCILIATION_KIND: &str = "core.reconciliation";
/// Kind of the data-freshness recompute, tiered by the `data_freshness` entitlement (hourly
/// slots).
pub const DATA_FRESHNESS_KIND: &str = "core.data_freshness";
/// Kind of the scan for loyalty points about to expire (daily).
pub const POINTS_EXPIRING_SOON_KIND: &str = "core.points_expiring_soon";
/// Kind of the usage snapshot (every 30 minutes).
pub const USAGE_SNAPSHOT_KIND: &str = "core.usage_snapshot";
/// Kind of the `core.processed_jobs` TTL cleanup (daily), which `jobs-consumers` handles:
/// named once, in `jobs-core`.
pub use jobs_core::PROCESSED_JOBS_CLEANUP_KIND;

/// The entitlement that selects a tenant's data-freshness [`Tier`].
pub const DATA_FRESHNESS_ENTITLEMENT: &str = "data_freshness";

/// Who gets a job when a task fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FanOut {
    /// One job per tenant of the directory (filtered by the task's [`TierRule`], if any).
    #[default]
    PerTenant,
    /// One job for the whole system, carrying [`crate::system_tenant`] (the nil UUID) as its
    /// tenant: for housekeeping such as the `processed_jobs` cleanup, where one job per tenant
    /// would do the same global work 100,000 times.
    Single,
}

/// The `data` of the jobs a task publishes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Payload {
    /// `{"slot": "<RFC 3339>"}`, plus `"tier": "<tier>"` for a tiered task.
    #[default]
    Slot,
    /// Exactly this value, for handlers whose data type refuses unknown fields (the
    /// `processed_jobs` cleanup takes `{}`). The slot stays recoverable from the job id, whose
    /// UUID v7 timestamp is the slot.
    Fixed(Value),
}

/// A periodic task: on every slot of `schedule`, one job of `kind` per tenant (or one in
/// all, see [`FanOut`]) is scheduled on `queue`, each at its slot plus a per-tenant offset
/// within `spread`.
#[derive(Debug, Clone, PartialEq)]
pub struct CronTask {
    /// The jobs' kind; unique among a scheduler's tasks, since it is part of every job id.
    pub kind: Kind,
    /// When the task fires.
    pub schedule: Schedule,
    /// Where its jobs go.
    pub queue: QueueName,
    /// Jobs of one slot run spread over `[slot, slot + spread)` by a hash of their tenant, so
    /// 100,000 tenants do not hit the workers in the same second. Keep it shorter than the
    /// schedule's period.
    pub spread: Duration,
    /// When set, only tenants whose entitlement makes them due at the slot get a job.
    pub tier: Option<TierRule>,
    /// One job per tenant, or one in all.
    pub fan_out: FanOut,
    /// The jobs' data.
    pub payload: Payload,
}

impl CronTask {
    /// A per-tenant task with no spread, no tier and the slot as data; adjust with the
    /// builder methods.
    pub fn new(kind: Kind, schedule: Schedule, queue: QueueName) -> Self {
        CronTask {
            kind,
            schedule,
            queue,
            spread: Duration::ZERO,
            tier: None,
            fan_out: FanOut::PerTenant,
            payload: Payload::Slot,
        }
    }

    /// Spreads each slot's jobs over `spread`.
    pub fn spread(mut self, spread: Duration) -> Self {
        self.spread = spread;
        self
    }

    /// Publishes only for tenants due under `rule` at each slot.
    pub fn tiered(mut self, rule: TierRule) -> Self {
        self.tier = Some(rule);
        self
    }

    /// The first slot after `after` at which a tenant of `tier` gets this task's job: the
    /// schedule's next slot for an untiered task (`tier` ignored), the next due one for a tiered
    /// task, looked for within [`MAX_TIER_WAIT`]. `None` when the schedule has no such slot
    /// (or a tiered task is asked without a tier).
    pub fn next_slot_for(&self, tier: Option<Tier>, after: SystemTime) -> Option<SystemTime> {
        let Some(rule_tier) = self.tier.as_ref().map(|rule| tier.unwrap_or(rule.default)) else {
            return self.schedule.next_after(after);
        };
        let until = after.checked_add(MAX_TIER_WAIT)?;
        self.schedule
            .slots(after, until)
            .find(|slot| rule_tier.is_due(*slot))
    }

    /// Publishes one job per slot for the whole system instead of one per tenant.
    pub fn single(mut self) -> Self {
        self.fan_out = FanOut::Single;
        self
    }

    /// Publishes `data` as every job's data instead of the slot.
    pub fn fixed_payload(mut self, data: Value) -> Self {
        self.payload = Payload::Fixed(data);
        self
    }
}

/// How often a tenant's data is recomputed, from its `data_freshness` entitlement.
///
/// Due at hourly slots whose UTC hour is a multiple of the period: `1h` every hour, `3h` at
/// 0, 3, …, 21, `6h` at 0, 6, 12, 18, `12h` at 0 and 12, `nightly` at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Once a day, at 00:00 UTC (`nightly`): the default.
    Nightly,
    /// Every 12 hours (`12h`).
    Every12Hours,
    /// Every 6 hours (`6h`).
    Every6Hours,
    /// Every 3 hours (`3h`).
    Every3Hours,
    /// Every hour (`1h`).
    Hourly,
}

impl Tier {
    /// Every tier, least frequent first.
    pub const ALL: [Tier; 5] = [
        Tier::Nightly,
        Tier::Every12Hours,
        Tier::Every6Hours,
        Tier::Every3Hours,
        Tier::Hourly,
    ];

    /// The entitlement value: `nightly`, `12h`, `6h`, `3h` or `1h`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Nightly => "nightly",
            Tier::Every12Hours => "12h",
            Tier::Every6Hours => "6h",
            Tier::Every3Hours => "3h",
            Tier::Hourly => "1h",
        }
    }

    /// Hours between two recomputes.
    pub fn period_hours(self) -> u32 {
        match self {
            Tier::Nightly => 24,
            Tier::Every12Hours => 12,
            Tier::Every6Hours => 6,
            Tier::Every3Hours => 3,
            Tier::Hourly => 1,
        }
    }

    /// Whether a tenant of this tier gets a job at `slot`: its UTC hour is a multiple of the
    /// period. Pair it with an hourly schedule; every slot within a due hour counts.
    pub fn is_due(self, slot: SystemTime) -> bool {
        let hour = floor_secs(slot).div_euclid(3600).rem_euclid(24);
        hour % i64::from(self.period_hours()) == 0
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = TierError;

    fn from_str(s: &str) -> Result<Tier, TierError> {
        Tier::ALL
            .into_iter()
            .find(|tier| tier.as_str() == s)
            .ok_or_else(|| TierError(s.to_owned()))
    }
}

/// How far ahead [`CronTask::next_slot_for`] looks for a tier's next due slot: a day and an
/// hour, past the slowest tier's period, so any schedule with a slot in a due hour finds one.
pub const MAX_TIER_WAIT: Duration = Duration::from_secs(25 * 3600);

/// An entitlement value that is not a [`Tier`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{0}` is not a data freshness tier (nightly, 12h, 6h, 3h, 1h)")]
pub struct TierError(pub String);

/// Which entitlement selects a tenant's [`Tier`], and the tier of tenants without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierRule {
    /// The entitlement's name.
    pub entitlement: String,
    /// The tier of tenants without the entitlement, and of those whose value is not a tier.
    pub default: Tier,
}

impl TierRule {
    /// The standard's rule: entitlement `data_freshness`, default `nightly`.
    pub fn data_freshness() -> Self {
        TierRule {
            entitlement: DATA_FRESHNESS_ENTITLEMENT.to_owned(),
            default: Tier::Nightly,
        }
    }

    /// The tenant's tier: its entitlement's, the default when it has none, and an error when
    /// the value is not a tier (the scheduler then uses the default and counts it).
    pub fn tier_of(&self, tenant: &Tenant) -> Result<Tier, TierError> {
        tenant
            .entitlements
            .get(&self.entitlement)
            .map_or(Ok(self.default), |value| value.parse())
    }
}

/// A name the crate spells as a literal; tests parse every one of them.
fn known<T: FromStr>(name: &str) -> T {
    name.parse()
        .unwrap_or_else(|_| unreachable!("`{name}` is a valid name (tested)"))
}

fn cron(expr: &str) -> Schedule {
    expr.parse()
        .unwrap_or_else(|_| unreachable!("`{expr}` is a valid schedule (tested)"))
}

const MINUTE: Duration = Duration::from_secs(60);

/// The standard's periodic tasks with their default schedules (UTC), each on a queue named
/// after its kind so that one slow task never delays another and each scales on its own:
///
/// | kind | schedule | spread |
/// |---|---|---|
/// | `core.partitions_precreate` | daily 01:00 | 30 min |
/// | `core.retention_purge` (export, then purge) | daily 02:00 | 1 h |
/// | `core.reconciliation` | nightly 03:00 | 1 h |
/// | `core.processed_jobs_cleanup` (one job in all, data `{}`) | daily 04:00 | none |
/// | `core.points_expiring_soon` | daily 08:00 | 1 h |
/// | `core.data_freshness` (tiered by `data_freshness`) | hourly :00 | 20 min |
/// | `core.usage_snapshot` | every 30 min | 10 min |
///
/// The daily tasks avoid midnight, where the nightly data-freshness tier already lands.
pub fn standard_tasks() -> Vec<CronTask> {
    let task = |kind: &str, schedule: Schedule, spread: Duration| {
        CronTask::new(known(kind), schedule, known(kind)).spread(spread)
    };
    vec![
        task(PARTITIONS_PRECREATE_KIND, cron("0 1 * * *"), 30 * MINUTE),
        task(RETENTION_PURGE_KIND, cron("0 2 * * *"), 60 * MINUTE),
        task(RECONCILIATION_KIND, cron("0 3 * * *"), 60 * MINUTE),
        task(
            PROCESSED_JOBS_CLEANUP_KIND,
            cron("0 4 * * *"),
            Duration::ZERO,
        )
        .single()
        .fixed_payload(Value::Object(serde_json::Map::new())),
        task(POINTS_EXPIRING_SOON_KIND, cron("0 8 * * *"), 60 * MINUTE),
        task(DATA_FRESHNESS_KIND, cron("0 * * * *"), 20 * MINUTE)
            .tiered(TierRule::data_freshness()),
        task(
            USAGE_SNAPSHOT_KIND,
            Schedule::every(30 * MINUTE)
                .unwrap_or_else(|_| unreachable!("30 minutes is a valid interval")),
            10 * MINUTE,
        ),
    ]
}

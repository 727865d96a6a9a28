//! The scheduler over the memory queue and tenant directory: each (task, tenant, slot) is
//! published once whatever the number of instances and restarts, catch-up fires one slot,
//! tiers follow the entitlement table, and paging reaches every tenant.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use jobs_adapter_memory::{MemoryQueue, MemoryTenantDirectory};
use jobs_core::{
    Clock, DirectoryError, Envelope, ErrorClass, Kind, ManualClock, PullPort, QueueError,
    QueueName, QueuePort, Receipt, SettlePort, Tenant, TenantDirectory, TenantId, TenantPage,
};
use jobs_cron::{
    CatchUp, CronError, CronTask, DATA_FRESHNESS_KIND, Scheduler, TierRule, USAGE_SNAPSHOT_KIND,
    fanout_correlation_id, fanout_job_id, spread_offset, standard_tasks, system_tenant,
};
use proptest::prelude::*;
use serde_json::json;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// 2026-01-01T00:00:00Z, a Thursday.
fn jan1() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn tenant_id(n: u128) -> TenantId {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        (n >> 48) as u32,
        n & 0xFFFF_FFFF_FFFF
    )
    .parse()
    .expect("a version 4 UUID")
}

fn tenant(n: u128, freshness: Option<&str>) -> Tenant {
    Tenant {
        id: tenant_id(n),
        entitlements: freshness
            .map(|tier| ("data_freshness".to_owned(), tier.to_owned()))
            .into_iter()
            .collect(),
    }
}

fn kind(s: &str) -> Kind {
    s.parse().expect("a valid kind")
}

fn queue_name(s: &str) -> QueueName {
    s.parse().expect("a valid queue name")
}

/// A clock, a queue and a directory shared by every scheduler instance of a test.
struct World {
    clock: ManualClock,
    queue: MemoryQueue,
    directory: MemoryTenantDirectory,
}

impl World {
    fn new(start: SystemTime, tenants: impl IntoIterator<Item = Tenant>) -> Self {
        let clock = ManualClock::new(start);
        World {
            queue: MemoryQueue::new(Arc::new(clock.clone()))
                .with_dedup_window(Duration::from_secs(365 * 86_400)),
            directory: MemoryTenantDirectory::with_tenants(tenants),
            clock,
        }
    }

    fn scheduler(&self, tasks: Vec<CronTask>, catch_up: CatchUp) -> Scheduler {
        Scheduler::new(
            tasks,
            Arc::new(self.directory.clone()),
            Arc::new(self.queue.clone()),
            Arc::new(self.clock.clone()),
            catch_up,
        )
        .expect("valid tasks")
    }

    /// Every envelope ready now on `queues`, acked.
    async fn drain(&self, queues: &[QueueName]) -> Vec<Envelope> {
        let mut envelopes = vec![];
        for name in queues {
            loop {
                let deliveries = self
                    .queue
                    .receive(name, 1000, MINUTE)
                    .await
                    .expect("receive");
                if deliveries.is_empty() {
                    break;
                }
                for delivery in deliveries {
                    envelopes.push(Envelope::decode(&delivery.payload).expect("a valid envelope"));
                    self.queue.ack(&delivery.lease).await.expect("ack");
                }
            }
        }
        envelopes
    }

    /// Moves past every spread window and drains everything queued so far.
    async fn drain_all(&self, tasks: &[CronTask]) -> Vec<Envelope> {
        self.clock.advance(DAY);
        let queues: BTreeSet<QueueName> = tasks.iter().map(|t| t.queue.clone()).collect();
        self.drain(&queues.into_iter().collect::<Vec<_>>()).await
    }
}

/// (kind, tenant, slot in ms) of a fan-out job: its slot is its job id's timestamp.
type JobKey = (String, TenantId, u64);

fn key(envelope: &Envelope) -> JobKey {
    (
        envelope.kind.to_string(),
        envelope.tenant_id,
        envelope.job_id.unix_ms(),
    )
}

fn counts(envelopes: &[Envelope]) -> BTreeMap<JobKey, usize> {
    let mut counts = BTreeMap::new();
    for envelope in envelopes {
        *counts.entry(key(envelope)).or_default() += 1;
    }
    counts
}

fn ms(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits in u64")
}

fn task(name: &str, schedule: &str) -> CronTask {
    CronTask::new(
        kind(name),
        schedule.parse().expect("a valid schedule"),
        queue_name(name),
    )
}

fn five_tenants() -> Vec<Tenant> {
    (1..=5).map(|n| tenant(n, Some("1h"))).collect()
}

#[tokio::test]
async fn two_instances_on_the_same_slots_publish_each_job_once() {
    let world = World::new(jan1() + 4 * HOUR + 30 * MINUTE, five_tenants());
    let tasks = standard_tasks();
    let a = world.scheduler(tasks.clone(), CatchUp::default());
    let b = world.scheduler(tasks.clone(), CatchUp::default());

    let first = a.tick().await;
    let second = b.tick().await;
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    let queued: u64 = first.fired.iter().map(|f| f.queued).sum();
    assert_eq!(second.fired.iter().map(|f| f.queued).sum::<u64>(), 0);
    assert_eq!(
        second.fired.iter().map(|f| f.duplicates).sum::<u64>(),
        queued,
        "the second instance finds every job already published"
    );

    // Half an hour later, at 05:00, both tick again: the usage snapshot and the hourly data
    // freshness have new slots.
    world.clock.advance(30 * MINUTE);
    let third = b.tick().await;
    let fourth = a.tick().await;
    let fired: Vec<&str> = third.fired.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(fired, [DATA_FRESHNESS_KIND, USAGE_SNAPSHOT_KIND]);
    assert!(third.fired.iter().all(|f| f.queued == 5));
    assert!(
        fourth
            .fired
            .iter()
            .all(|f| f.queued == 0 && f.duplicates == 5)
    );

    let delivered = world.drain_all(&tasks).await;
    let counts = counts(&delivered);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    // Per tenant: the latest slot of the six per-tenant tasks (data freshness at 04:00 is
    // due for `1h`), then the 05:00 usage snapshot and data freshness; plus one cleanup job.
    assert_eq!(delivered.len(), 5 * 8 + 1);
    assert_eq!(queued + 10, delivered.len() as u64);
}

#[tokio::test]
async fn a_restart_refiring_the_latest_slot_doubles_nothing() {
    let world = World::new(jan1() + 10 * MINUTE, five_tenants());
    let tasks = vec![
        task(USAGE_SNAPSHOT_KIND, "@every 30m").spread(10 * MINUTE),
        task("core.nightly", "0 0 * * *"),
    ];
    let before = world.scheduler(tasks.clone(), CatchUp::default());
    let fired = before.tick().await;
    assert_eq!(fired.fired.iter().map(|f| f.queued).sum::<u64>(), 10);
    drop(before);

    let after = world.scheduler(tasks.clone(), CatchUp::default());
    let refired = after.tick().await;
    assert_eq!(
        refired.fired.len(),
        2,
        "a fresh instance re-fires the latest slots"
    );
    assert!(
        refired
            .fired
            .iter()
            .all(|f| f.queued == 0 && f.duplicates == 5)
    );
    assert!(after.tick().await.fired.is_empty(), "but only once");

    let delivered = world.drain_all(&tasks).await;
    assert_eq!(delivered.len(), 10);
    assert!(counts(&delivered).values().all(|n| *n == 1));
}

#[tokio::test]
async fn catch_up_after_a_three_day_gap_fires_only_the_latest_slot() {
    let world = World::new(jan1() + 5 * MINUTE, five_tenants());
    let tasks = vec![task(USAGE_SNAPSHOT_KIND, "@every 30m").spread(10 * MINUTE)];
    let scheduler = world.scheduler(tasks.clone(), CatchUp::Latest);
    scheduler.tick().await;

    // Down for three days (144 half-hour slots missed), back at 00:47 on the 4th.
    world.clock.advance(3 * DAY + 42 * MINUTE);
    let caught_up = scheduler.tick().await;
    assert_eq!(caught_up.fired.len(), 1);
    let latest = jan1() + 3 * DAY + 30 * MINUTE;
    assert_eq!(caught_up.fired[0].slot, latest);
    assert_eq!(caught_up.fired[0].queued, 5);
    assert!(scheduler.tick().await.fired.is_empty());

    // Late jobs are spread from now, not all due at once in the past.
    let now = world.clock.now();
    assert!(
        caught_up.fired[0]
            .sample
            .iter()
            .all(|job| job.run_at >= now)
    );

    let delivered = world.drain_all(&tasks).await;
    let slots: BTreeSet<u64> = delivered.iter().map(|e| e.job_id.unix_ms()).collect();
    assert_eq!(slots, BTreeSet::from([ms(jan1()), ms(latest)]));
    assert_eq!(delivered.len(), 10);
}

#[tokio::test]
async fn the_skip_policy_drops_missed_slots_and_fires_timely_ones() {
    let world = World::new(jan1() + 5 * MINUTE, five_tenants());
    let tasks = vec![task(USAGE_SNAPSHOT_KIND, "@every 30m")];
    let scheduler = world.scheduler(tasks.clone(), CatchUp::Skip { grace: 2 * MINUTE });

    let late = scheduler.tick().await;
    assert!(late.fired.is_empty());
    assert_eq!(late.skipped.len(), 1);
    assert_eq!(late.skipped[0].slot, jan1());

    world.clock.set(jan1() + 30 * MINUTE + MINUTE);
    let timely = scheduler.tick().await;
    assert_eq!(timely.fired.len(), 1);
    assert_eq!(timely.fired[0].slot, jan1() + 30 * MINUTE);
    assert!(timely.skipped.is_empty());

    let delivered = world.drain_all(&tasks).await;
    assert_eq!(delivered.len(), 5);
}

#[tokio::test]
async fn a_slot_exactly_the_grace_late_still_fires() {
    let world = World::new(jan1() + 2 * MINUTE, five_tenants());
    let tasks = vec![task(USAGE_SNAPSHOT_KIND, "@every 30m")];
    let scheduler = world.scheduler(tasks.clone(), CatchUp::Skip { grace: 2 * MINUTE });
    let on_the_edge = scheduler.tick().await;
    assert_eq!(
        on_the_edge.fired.len(),
        1,
        "two minutes late, within a grace of two"
    );
    assert!(on_the_edge.skipped.is_empty());
    world
        .clock
        .set(jan1() + 30 * MINUTE + 2 * MINUTE + Duration::from_secs(1));
    let past = scheduler.tick().await;
    assert!(past.fired.is_empty(), "a second past the grace");
    assert_eq!(past.skipped.len(), 1);
    // What a scheduler runs, and says it runs.
    assert_eq!(scheduler.tasks(), &tasks[..]);
    let shown = format!("{scheduler:?}");
    assert!(
        shown.contains("Scheduler") && shown.contains(USAGE_SNAPSHOT_KIND),
        "{shown}"
    );
}

/// The entitlement table, written out hour by hour rather than computed.
fn due_hours(tier: &str) -> &'static [u32] {
    match tier {
        "1h" => &[
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
        ],
        "3h" => &[0, 3, 6, 9, 12, 15, 18, 21],
        "6h" => &[0, 6, 12, 18],
        "12h" => &[0, 12],
        _ => &[0], // nightly, missing, and values that are not a tier
    }
}

#[tokio::test]
async fn tiers_follow_the_entitlement_table_at_every_hour_of_a_week() {
    let entitlements = [
        Some("1h"),
        Some("3h"),
        Some("6h"),
        Some("12h"),
        Some("nightly"),
        None,
        Some("2h"),
    ];
    let tenants: Vec<Tenant> = entitlements
        .iter()
        .enumerate()
        .map(|(i, tier)| tenant(i as u128 + 1, *tier))
        .collect();
    let world = World::new(jan1(), tenants);
    let tasks: Vec<CronTask> = standard_tasks()
        .into_iter()
        .filter(|t| t.kind == kind(DATA_FRESHNESS_KIND))
        .collect();
    let scheduler = world
        .scheduler(tasks.clone(), CatchUp::default())
        .page_size(3);

    for hour in 0..7 * 24u32 {
        world.clock.set(jan1() + HOUR * hour);
        let report = scheduler.tick().await;
        assert_eq!(report.fired.len(), 1, "hour {hour}");
        assert_eq!(report.fired[0].unknown_tiers, 1, "the `2h` tenant");
        world.clock.advance(59 * MINUTE); // past the 20-minute spread
        let delivered = world.drain(&[tasks[0].queue.clone()]).await;
        let got: BTreeSet<TenantId> = delivered.iter().map(|e| e.tenant_id).collect();
        let want: BTreeSet<TenantId> = entitlements
            .iter()
            .enumerate()
            .filter(|(_, tier)| due_hours(tier.unwrap_or("nightly")).contains(&(hour % 24)))
            .map(|(i, _)| tenant_id(i as u128 + 1))
            .collect();
        assert_eq!(got, want, "hour {hour} of the week");
        assert_eq!(
            delivered.len(),
            want.len(),
            "hour {hour}: one job per tenant"
        );
        for envelope in &delivered {
            let tier = envelope.data["tier"].as_str().expect("a tier in the data");
            assert!(due_hours(tier).contains(&(hour % 24)));
        }
    }
}

/// A directory that records the pages asked for.
struct CountingDirectory {
    inner: MemoryTenantDirectory,
    calls: Mutex<Vec<(Option<TenantId>, u32, usize)>>,
}

#[async_trait]
impl TenantDirectory for CountingDirectory {
    async fn page(
        &self,
        after: Option<TenantId>,
        limit: u32,
    ) -> Result<TenantPage, DirectoryError> {
        let page = self.inner.page(after, limit).await?;
        self.calls
            .lock()
            .expect("not poisoned")
            .push((after, limit, page.tenants.len()));
        Ok(page)
    }
}

#[tokio::test]
async fn paging_two_at_a_time_reaches_all_five_tenants() {
    let world = World::new(jan1(), five_tenants());
    let directory = Arc::new(CountingDirectory {
        inner: world.directory.clone(),
        calls: Mutex::default(),
    });
    let tasks = vec![task("core.nightly", "0 0 * * *")];
    let scheduler = Scheduler::new(
        tasks.clone(),
        directory.clone(),
        Arc::new(world.queue.clone()),
        Arc::new(world.clock.clone()),
        CatchUp::default(),
    )
    .expect("valid tasks")
    .page_size(2);
    let report = scheduler.tick().await;
    assert_eq!(report.fired[0].tenants, 5);
    assert_eq!(report.fired[0].queued, 5);
    let calls = directory.calls.lock().expect("not poisoned").clone();
    assert_eq!(
        calls,
        vec![
            (None, 2, 2),
            (Some(tenant_id(2)), 2, 2),
            (Some(tenant_id(4)), 2, 1)
        ]
    );
    let delivered = world.drain_all(&tasks).await;
    let got: BTreeSet<TenantId> = delivered.iter().map(|e| e.tenant_id).collect();
    assert_eq!(got, (1..=5).map(tenant_id).collect());
}

#[tokio::test]
async fn jobs_carry_derived_ids_the_slot_and_a_per_tenant_offset() {
    let world = World::new(jan1(), five_tenants());
    let spread = 10 * MINUTE;
    let tasks = vec![task(USAGE_SNAPSHOT_KIND, "@every 30m").spread(spread)];
    let scheduler = world.scheduler(tasks.clone(), CatchUp::default());
    scheduler.tick().await;

    let kind = kind(USAGE_SNAPSHOT_KIND);
    let mut offsets: Vec<(Duration, TenantId)> = (1..=5)
        .map(|n| (spread_offset(tenant_id(n), spread), tenant_id(n)))
        .collect();
    offsets.sort();
    // Each job becomes ready exactly at its slot plus its tenant's offset.
    for (offset, tenant) in offsets {
        assert!(offset < spread);
        world.clock.set(jan1() + offset);
        let ready = world.drain(&[tasks[0].queue.clone()]).await;
        assert!(
            ready.iter().any(|e| e.tenant_id == tenant),
            "{tenant} ready at its offset {offset:?}"
        );
        for envelope in ready {
            assert!(spread_offset(envelope.tenant_id, spread) <= offset);
            assert_eq!(
                envelope.job_id,
                fanout_job_id(&kind, envelope.tenant_id, jan1())
            );
            assert_eq!(
                envelope.correlation_id,
                fanout_correlation_id(&kind, jan1())
            );
            assert_eq!(envelope.data, json!({"slot": "2026-01-01T00:00:00Z"}));
        }
    }
}

#[tokio::test]
async fn the_cleanup_is_one_job_for_the_system_with_empty_data() {
    let world = World::new(jan1() + 4 * HOUR, five_tenants());
    let tasks: Vec<CronTask> = standard_tasks()
        .into_iter()
        .filter(|t| t.kind.as_str() == "core.processed_jobs_cleanup")
        .collect();
    let scheduler = world.scheduler(tasks.clone(), CatchUp::default());
    let report = scheduler.tick().await;
    assert_eq!(report.fired[0].jobs, 1);
    let delivered = world.drain_all(&tasks).await;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].tenant_id, system_tenant());
    // `CleanupRequest` refuses unknown fields: the slot must not be in the data.
    assert_eq!(delivered[0].data, json!({}));
    assert_eq!(delivered[0].job_id.unix_ms(), ms(jan1() + 4 * HOUR));
}

/// A directory whose call number `fail_call` (from 0) fails.
struct FlakyDirectory {
    inner: MemoryTenantDirectory,
    calls: AtomicU32,
    fail_call: u32,
}

#[async_trait]
impl TenantDirectory for FlakyDirectory {
    async fn page(
        &self,
        after: Option<TenantId>,
        limit: u32,
    ) -> Result<TenantPage, DirectoryError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.fail_call {
            return Err(DirectoryError::Unavailable {
                message: "connection reset".to_owned(),
                source: None,
            });
        }
        self.inner.page(after, limit).await
    }
}

#[tokio::test]
async fn a_directory_failure_leaves_the_slot_to_the_next_tick() {
    let world = World::new(jan1(), five_tenants());
    let directory = Arc::new(FlakyDirectory {
        inner: world.directory.clone(),
        calls: AtomicU32::new(0),
        fail_call: 1, // the second page of the first tick
    });
    let tasks = vec![task("core.nightly", "0 0 * * *")];
    let scheduler = Scheduler::new(
        tasks.clone(),
        directory.clone(),
        Arc::new(world.queue.clone()),
        Arc::new(world.clock.clone()),
        CatchUp::default(),
    )
    .expect("valid tasks")
    .page_size(3);
    let failed = scheduler.tick().await;
    assert!(!failed.is_ok());
    assert!(
        matches!(&failed.errors[..], [CronError::Directory { slot, .. }] if *slot == jan1()),
        "{failed:?}"
    );
    assert_eq!(failed.errors[0].class(), ErrorClass::Retryable);

    world.clock.advance(MINUTE);
    let retried = scheduler.tick().await;
    assert!(retried.is_ok(), "{retried:?}");
    assert_eq!(retried.fired[0].slot, jan1());
    assert_eq!(
        (retried.fired[0].queued, retried.fired[0].duplicates),
        (2, 3),
        "the first page was published before the failure"
    );
    assert!(scheduler.tick().await.fired.is_empty());
    assert_eq!(world.drain_all(&tasks).await.len(), 5);
}

/// A queue that refuses its first `failures` publishes.
struct FlakyQueue {
    inner: MemoryQueue,
    failures: AtomicU32,
}

#[async_trait]
impl QueuePort for FlakyQueue {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: jobs_core::PublishOptions,
    ) -> Result<Receipt, QueueError> {
        self.inner.publish(queue, envelope, opts).await
    }

    async fn schedule(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        run_at: SystemTime,
    ) -> Result<Receipt, QueueError> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(QueueError::Unavailable {
                queue: queue.clone(),
                message: "503".to_owned(),
                source: None,
            });
        }
        self.inner.schedule(queue, envelope, run_at).await
    }
}

#[tokio::test]
async fn failed_publishes_are_retried_at_the_next_tick_without_doubling_the_rest() {
    let world = World::new(jan1(), five_tenants());
    let queue = Arc::new(FlakyQueue {
        inner: world.queue.clone(),
        failures: AtomicU32::new(2),
    });
    let tasks = vec![task("core.nightly", "0 0 * * *")];
    let scheduler = Scheduler::new(
        tasks.clone(),
        Arc::new(world.directory.clone()),
        queue,
        Arc::new(world.clock.clone()),
        CatchUp::default(),
    )
    .expect("valid tasks");
    let first = scheduler.tick().await;
    assert_eq!((first.fired[0].queued, first.fired[0].failed), (3, 2));
    assert!(first.fired[0].first_error.is_some() && !first.is_ok());

    let second = scheduler.tick().await;
    assert_eq!((second.fired[0].queued, second.fired[0].duplicates), (2, 3));
    assert!(second.is_ok());
    assert!(scheduler.tick().await.fired.is_empty());
    assert_eq!(world.drain_all(&tasks).await.len(), 5);
}

#[tokio::test]
async fn tick_at_runs_one_slot_by_hand_dry_or_not() {
    let world = World::new(jan1() + 2 * DAY, five_tenants());
    let tasks = vec![
        task("core.nightly", "0 0 * * *").spread(HOUR),
        task(USAGE_SNAPSHOT_KIND, "@every 30m"),
        task("core.at_three", "0 3 * * *"),
    ];
    let scheduler = world.scheduler(tasks.clone(), CatchUp::default());
    let slot = jan1() + DAY; // a slot of the first two tasks only

    let dry = scheduler.tick_at(slot, true).await;
    let kinds: Vec<&str> = dry.fired.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(kinds, ["core.nightly", USAGE_SNAPSHOT_KIND]);
    assert!(
        dry.fired
            .iter()
            .all(|f| f.dry_run && f.jobs == 5 && f.queued == 0)
    );
    assert_eq!(dry.fired[0].sample.len(), 5);
    assert_eq!(
        dry.fired[0].sample[0].job_id,
        fanout_job_id(&kind("core.nightly"), tenant_id(1), slot)
    );
    assert!(
        world.drain_all(&tasks).await.is_empty(),
        "a dry run publishes nothing"
    );

    let wet = scheduler.tick_at(slot, false).await;
    assert_eq!(wet.fired.iter().map(|f| f.queued).sum::<u64>(), 10);
    assert!(
        scheduler
            .tick_at(slot + MINUTE, false)
            .await
            .fired
            .is_empty()
    );

    let single = scheduler
        .fire(&kind("core.at_three"), jan1() + 3 * HOUR, false)
        .await
        .expect("a slot of the task");
    assert_eq!(single.queued, 5);
    assert!(matches!(
        scheduler.fire(&kind("core.at_three"), slot, true).await,
        Err(CronError::NotASlot { .. })
    ));
    assert!(matches!(
        scheduler.fire(&kind("core.unknown"), slot, true).await,
        Err(CronError::UnknownTask(_))
    ));
    let delivered = world.drain_all(&tasks).await;
    assert_eq!(delivered.len(), 15);
    assert!(counts(&delivered).values().all(|n| *n == 1));
}

#[tokio::test]
async fn next_fire_times_list_each_task() {
    let world = World::new(jan1() + 10 * MINUTE, five_tenants());
    let scheduler = world.scheduler(standard_tasks(), CatchUp::default());
    let before = scheduler.next_fire_times();
    assert_eq!(before.len(), 7);
    assert!(before.iter().all(|n| n.last_fired.is_none()));
    let snapshot = before
        .iter()
        .find(|n| n.kind.as_str() == USAGE_SNAPSHOT_KIND)
        .expect("listed");
    assert_eq!(snapshot.next, Some(jan1() + 30 * MINUTE));
    assert_eq!(snapshot.schedule.to_string(), "@every 30m");

    scheduler.tick().await;
    let after = scheduler.next_fire_times();
    let snapshot = after
        .iter()
        .find(|n| n.kind.as_str() == USAGE_SNAPSHOT_KIND)
        .expect("listed");
    assert_eq!(snapshot.last_fired, Some(jan1()));
}

#[test]
fn tasks_must_have_distinct_kinds_and_single_tasks_no_tier() {
    let world = World::new(jan1(), []);
    let new = |tasks| {
        Scheduler::new(
            tasks,
            Arc::new(world.directory.clone()),
            Arc::new(world.queue.clone()),
            Arc::new(world.clock.clone()),
            CatchUp::default(),
        )
    };
    let twice = vec![task("core.a", "@hourly"), task("core.a", "@daily")];
    assert!(matches!(new(twice), Err(CronError::DuplicateKind(k)) if k.as_str() == "core.a"));
    let tiered_single = vec![
        task("core.a", "@hourly")
            .single()
            .tiered(TierRule::data_freshness()),
    ];
    assert!(matches!(
        new(tiered_single),
        Err(CronError::TieredSingle(_))
    ));
}

/// A directory whose cursor never moves.
struct StuckDirectory(Tenant);

#[async_trait]
impl TenantDirectory for StuckDirectory {
    async fn page(&self, _: Option<TenantId>, _: u32) -> Result<TenantPage, DirectoryError> {
        Ok(TenantPage {
            tenants: vec![self.0.clone()],
            next: Some(self.0.id),
        })
    }
}

#[tokio::test]
async fn a_cursor_that_does_not_advance_is_an_error_not_a_loop() {
    let world = World::new(jan1(), []);
    let scheduler = Scheduler::new(
        vec![task("core.nightly", "@daily")],
        Arc::new(StuckDirectory(tenant(1, None))),
        Arc::new(world.queue.clone()),
        Arc::new(world.clock.clone()),
        CatchUp::default(),
    )
    .expect("valid tasks");
    let report = scheduler.tick().await;
    assert!(
        matches!(&report.errors[..], [CronError::CursorStuck { .. }]),
        "{report:?}"
    );
}

/// The slot a scheduler ticking at `t` fires for each test task, computed by plain arithmetic
/// rather than by `Schedule`.
fn model_slot(task: usize, t: u64) -> u64 {
    const DAY_S: u64 = 86_400;
    match task {
        0 => t / 1800 * 1800,                           // every 30 minutes
        1 => t / 3600 * 3600,                           // hourly, tiered
        2 => (t - 3 * 3600) / DAY_S * DAY_S + 3 * 3600, // daily at 03:00 (t is after it)
        _ => (t - 4 * 3600 - 1800) / DAY_S * DAY_S + 4 * 3600 + 1800, // daily 04:30, single
    }
}

fn model_tasks() -> Vec<CronTask> {
    vec![
        task("t.every30", "@every 30m").spread(10 * MINUTE),
        task("t.hourly", "0 * * * *")
            .spread(20 * MINUTE)
            .tiered(TierRule::data_freshness()),
        task("t.daily", "0 3 * * *").spread(HOUR),
        task("t.single", "30 4 * * *").single(),
    ]
}

const TIERS: [Option<&str>; 7] = [
    Some("1h"),
    Some("3h"),
    Some("6h"),
    Some("12h"),
    Some("nightly"),
    None,
    Some("bogus"),
];

fn due(tier: Option<&str>, slot_s: u64) -> bool {
    due_hours(tier.unwrap_or("nightly")).contains(&((slot_s / 3600 % 24) as u32))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any number of instances, ticking at arbitrary times and restarting at will, publish
    /// every (task, tenant, slot) that any tick was due to fire exactly once.
    #[test]
    fn each_job_is_published_exactly_once(
        tenants in prop::collection::btree_map(1u128..1_000, 0usize..TIERS.len(), 0..8),
        instances in 1usize..4,
        page_size in 1u32..4,
        events in prop::collection::vec((0usize..4, 0u64..600, any::<bool>()), 1..25),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            // Start after 04:30 so that every daily task has a slot at or before any tick.
            let start = jan1() + 5 * HOUR;
            let world = World::new(
                start,
                tenants.iter().map(|(n, tier)| tenant(*n, TIERS[*tier])),
            );
            let tasks = model_tasks();
            let make = || world.scheduler(tasks.clone(), CatchUp::Latest).page_size(page_size);
            let mut schedulers: Vec<Scheduler> = (0..instances).map(|_| make()).collect();
            let mut tick_times = vec![];
            let mut queued = 0;
            for (who, advance_minutes, restart) in &events {
                world.clock.advance(MINUTE * *advance_minutes as u32);
                let who = who % instances;
                if *restart {
                    schedulers[who] = make();
                }
                let report = schedulers[who].tick().await;
                prop_assert!(report.is_ok(), "{:?}", report);
                queued += report.fired.iter().map(|f| f.queued).sum::<u64>();
                tick_times.push(ms(world.clock.now()) / 1000);
            }

            let mut expected: HashMap<JobKey, usize> = HashMap::new();
            for t in &tick_times {
                for (i, task) in tasks.iter().enumerate() {
                    let slot_s = model_slot(i, *t);
                    if i == 3 {
                        expected.insert((task.kind.to_string(), system_tenant(), slot_s * 1000), 1);
                        continue;
                    }
                    for (n, tier) in &tenants {
                        if i != 1 || due(TIERS[*tier], slot_s) {
                            expected.insert((task.kind.to_string(), tenant_id(*n), slot_s * 1000), 1);
                        }
                    }
                }
            }
            let delivered = world.drain_all(&tasks).await;
            let got: HashMap<JobKey, usize> = counts(&delivered).into_iter().collect();
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(queued, delivered.len() as u64);
            Ok::<(), TestCaseError>(())
        })?;
    }
}

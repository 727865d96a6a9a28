//! The standard tasks, tiers, and the derived correlation ids and spread offsets.

use std::collections::BTreeSet;
use std::time::{Duration, UNIX_EPOCH};

use jobs_core::{Kind, QueueName, Tenant, TenantId};
use jobs_cron::{
    DATA_FRESHNESS_KIND, FanOut, PROCESSED_JOBS_CLEANUP_KIND, Payload, Tier, TierRule,
    USAGE_SNAPSHOT_KIND, fanout_correlation_id, spread_offset, standard_tasks, system_tenant,
};
use proptest::prelude::*;
use serde_json::json;

const HOUR: Duration = Duration::from_secs(3600);

fn jan1() -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

#[test]
fn the_cleanup_kind_parses_and_is_scheduled_once_a_day_for_all() {
    let kind: Kind = PROCESSED_JOBS_CLEANUP_KIND.parse().expect("a valid kind");
    let cleanup = standard_tasks()
        .into_iter()
        .find(|t| t.kind == kind)
        .expect("registered");
    assert_eq!(cleanup.fan_out, FanOut::Single);
    // The cleanup's data type refuses unknown fields.
    assert_eq!(cleanup.payload, Payload::Fixed(json!({})));
}

#[test]
fn the_standard_tasks_have_their_own_kinds_queues_and_schedules() {
    let tasks = standard_tasks();
    let kinds: Vec<&str> = tasks.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "core.partitions_precreate",
            "core.retention_purge",
            "core.reconciliation",
            "core.processed_jobs_cleanup",
            "core.points_expiring_soon",
            "core.data_freshness",
            "core.usage_snapshot",
        ]
    );
    let queues: BTreeSet<&QueueName> = tasks.iter().map(|t| &t.queue).collect();
    assert_eq!(queues.len(), tasks.len(), "one queue per task");

    // Slots per day of each task, over a week.
    let week_later = jan1() + 7 * 24 * HOUR;
    for task in &tasks {
        let per_day = task.schedule.slots(jan1(), week_later).count() / 7;
        let expected = match task.kind.as_str() {
            "core.data_freshness" => 24,
            "core.usage_snapshot" => 48,
            _ => 1,
        };
        assert_eq!(per_day, expected, "{}", task.kind);
        // A slot's jobs are all due before the next slot.
        let first = task.schedule.next_after(jan1()).expect("a slot");
        let second = task.schedule.next_after(first).expect("a slot");
        assert!(task.spread < second.duration_since(first).expect("ordered"));
        assert_eq!(
            task.tier.is_some(),
            task.kind.as_str() == "core.data_freshness",
            "{}",
            task.kind
        );
    }
    assert_eq!(
        tasks[6].schedule.interval(),
        Some(Duration::from_secs(30 * 60))
    );
}

#[test]
fn tiers_parse_from_their_entitlement_values() {
    for (text, tier) in [
        ("nightly", Tier::Nightly),
        ("12h", Tier::Every12Hours),
        ("6h", Tier::Every6Hours),
        ("3h", Tier::Every3Hours),
        ("1h", Tier::Hourly),
    ] {
        assert_eq!(text.parse::<Tier>(), Ok(tier));
        assert_eq!(tier.to_string(), text);
    }
    let e = "2h".parse::<Tier>().expect_err("not a tier");
    assert!(e.to_string().contains("`2h`"), "{e}");

    let rule = TierRule::data_freshness();
    let tenant = |value: Option<&str>| Tenant {
        id: system_tenant(),
        entitlements: value
            .map(|v| ("data_freshness".to_owned(), v.to_owned()))
            .into_iter()
            .collect(),
    };
    assert_eq!(rule.tier_of(&tenant(None)), Ok(Tier::Nightly));
    assert_eq!(rule.tier_of(&tenant(Some("6h"))), Ok(Tier::Every6Hours));
    assert!(rule.tier_of(&tenant(Some("hourly"))).is_err());
}

#[test]
fn a_known_slot_keeps_its_correlation_id_across_releases() {
    let task: Kind = "billing.usage_snapshot".parse().expect("valid");
    // Computed independently with Python's hashlib and uuid modules.
    assert_eq!(
        fanout_correlation_id(&task, jan1()).to_string(),
        "019b76da-a800-7444-bc32-2f7f3f25f084"
    );
    let tenant: TenantId = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
        .parse()
        .expect("valid");
    assert_eq!(
        spread_offset(tenant, Duration::from_secs(600)),
        Duration::from_millis(20_408)
    );
}

#[test]
fn spread_offsets_scatter_tenants_over_the_window() {
    let window = Duration::from_secs(600);
    let mut per_second = [0u32; 600];
    for n in 0..10_000u32 {
        let tenant: TenantId = format!("00000000-0000-4000-8000-{n:012x}")
            .parse()
            .expect("valid");
        per_second[spread_offset(tenant, window).as_secs() as usize] += 1;
    }
    // 10,000 tenants over 600 seconds, about 17 a second: every second gets some, none a
    // crowd, and each minute of the window about a tenth.
    assert!(
        per_second.iter().all(|n| (1..=45).contains(n)),
        "{per_second:?}"
    );
    for minute in per_second.chunks(60) {
        let total: u32 = minute.iter().sum();
        assert!((850..=1150).contains(&total), "{total} in one minute");
    }
    assert_eq!(
        spread_offset(system_tenant(), Duration::ZERO),
        Duration::ZERO
    );
}

proptest! {
    #[test]
    fn offsets_stay_inside_the_window(n in any::<u64>(), window_ms in 1u64..10_000_000) {
        let tenant: TenantId = format!("00000000-0000-4000-8000-{:012x}", n & 0xFFFF_FFFF_FFFF)
            .parse()
            .expect("valid");
        let window = Duration::from_millis(window_ms);
        prop_assert!(spread_offset(tenant, window) < window);
        prop_assert_eq!(spread_offset(tenant, window), spread_offset(tenant, window));
    }

    #[test]
    fn correlation_ids_are_v7_stamped_with_the_slot_and_differ_by_task(secs in 0u64..4_000_000_000) {
        let a: Kind = "core.a".parse().expect("valid");
        let b: Kind = "core.b".parse().expect("valid");
        let slot = UNIX_EPOCH + Duration::from_secs(secs);
        let id = fanout_correlation_id(&a, slot);
        prop_assert_eq!(id.as_uuid().get_version_num(), 7);
        prop_assert_eq!(id.as_uuid().get_timestamp().map(|t| t.to_unix().0), Some(secs));
        prop_assert_ne!(id, fanout_correlation_id(&b, slot));
        prop_assert_ne!(id, fanout_correlation_id(&a, slot + Duration::from_secs(1)));
    }
}

#[test]
fn tiers_are_due_at_multiples_of_their_period() {
    for hour in 0..48u32 {
        let slot = jan1() + HOUR * hour;
        let h = hour % 24;
        assert!(Tier::Hourly.is_due(slot));
        assert_eq!(Tier::Every3Hours.is_due(slot), h % 3 == 0, "{hour}");
        assert_eq!(Tier::Every6Hours.is_due(slot), h % 6 == 0, "{hour}");
        assert_eq!(Tier::Every12Hours.is_due(slot), h % 12 == 0, "{hour}");
        assert_eq!(Tier::Nightly.is_due(slot), h == 0, "{hour}");
    }
}

fn standard(kind: &str) -> jobs_cron::CronTask {
    let kind: Kind = kind.parse().expect("a valid kind");
    standard_tasks()
        .into_iter()
        .find(|t| t.kind == kind)
        .expect("registered")
}

#[test]
fn a_tenants_next_recompute_is_the_next_slot_its_tier_is_due() {
    let freshness = standard(DATA_FRESHNESS_KIND);
    // 05:30 on January 1st: the next hourly slots are 06:00, 07:00, …
    let after = jan1() + HOUR * 5 + Duration::from_secs(1800);
    for (tier, next) in [
        (Tier::Hourly, jan1() + HOUR * 6),
        (Tier::Every3Hours, jan1() + HOUR * 6),
        (Tier::Every6Hours, jan1() + HOUR * 6),
        (Tier::Every12Hours, jan1() + HOUR * 12),
        (Tier::Nightly, jan1() + HOUR * 24),
    ] {
        assert_eq!(
            freshness.next_slot_for(Some(tier), after),
            Some(next),
            "{tier}"
        );
    }
    // Exactly at a due slot, the next one is a period later.
    assert_eq!(
        freshness.next_slot_for(Some(Tier::Every3Hours), jan1() + HOUR * 6),
        Some(jan1() + HOUR * 9)
    );
    // No tier asked of a tiered task: the rule's default (nightly).
    assert_eq!(
        freshness.next_slot_for(None, after),
        Some(jan1() + HOUR * 24)
    );
}

#[test]
fn an_untiered_tasks_next_slot_is_its_schedules() {
    let snapshot = standard(USAGE_SNAPSHOT_KIND);
    let after = jan1() + Duration::from_secs(60);
    let next = snapshot.schedule.next_after(after);
    assert!(next.is_some());
    for tier in Tier::ALL {
        assert_eq!(snapshot.next_slot_for(Some(tier), after), next, "{tier}");
    }
    assert_eq!(snapshot.next_slot_for(None, after), next);
}

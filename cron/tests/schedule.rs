//! Schedules: cron parsing with errors that name the field, slots of known expressions, and
//! agreement with a brute-force matcher on generated expressions.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, NaiveDate, Timelike, Utc};
use jobs_cron::{CronField, FieldProblem, Schedule, ScheduleError};
use proptest::prelude::*;

fn at(rfc3339: &str) -> SystemTime {
    let t = DateTime::parse_from_rfc3339(rfc3339).expect("a valid time");
    UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).expect("after 1970"))
}

fn schedule(expr: &str) -> Schedule {
    expr.parse()
        .unwrap_or_else(|e| panic!("`{expr}` parses: {e}"))
}

fn next(expr: &str, after: &str) -> SystemTime {
    schedule(expr).next_after(at(after)).expect("a next slot")
}

#[test]
fn known_expressions_fire_when_cron_would() {
    let cases = [
        // (expression, after, next slot)
        (
            "*/15 * * * *",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:15:00Z",
        ),
        (
            "*/15 * * * *",
            "2026-01-01T00:14:59Z",
            "2026-01-01T00:15:00Z",
        ),
        ("0 3 * * *", "2026-01-01T03:00:00Z", "2026-01-02T03:00:00Z"),
        ("0 0 1 * *", "2026-01-31T12:00:00Z", "2026-02-01T00:00:00Z"),
        // Weekdays at 09:00; 2026-01-02 is a Friday.
        (
            "0 9 * * mon-fri",
            "2026-01-02T10:00:00Z",
            "2026-01-05T09:00:00Z",
        ),
        // Both day fields restricted: the 13th or any Friday.
        (
            "0 0 13 * fri",
            "2026-01-03T00:00:00Z",
            "2026-01-09T00:00:00Z",
        ),
        (
            "0 0 13 * fri",
            "2026-01-10T00:00:00Z",
            "2026-01-13T00:00:00Z",
        ),
        // A day field starting with `*` combines with AND: odd days that are Fridays.
        (
            "0 0 */2 * 5",
            "2026-01-01T00:00:00Z",
            "2026-01-09T00:00:00Z",
        ),
        // 7 and 0 are both Sunday; 2026-01-04 is a Sunday.
        ("30 6 * * 7", "2026-01-01T00:00:00Z", "2026-01-04T06:30:00Z"),
        (
            "30 6 * * 0,7",
            "2026-01-01T00:00:00Z",
            "2026-01-04T06:30:00Z",
        ),
        (
            "30 6 * * 6-7",
            "2026-01-04T07:00:00Z",
            "2026-01-10T06:30:00Z",
        ),
        ("30 6 * * 0", "2026-01-01T00:00:00Z", "2026-01-04T06:30:00Z"),
        // Leap day.
        ("0 0 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T00:00:00Z"),
        // `a/step` runs to the end of the range; names are case-insensitive.
        (
            "5/20 * * JAN *",
            "2026-01-01T00:06:00Z",
            "2026-01-01T00:25:00Z",
        ),
        (
            "0 12 * feb-mar sun",
            "2026-01-01T00:00:00Z",
            "2026-02-01T12:00:00Z",
        ),
        (
            "0 0,12 1,15 * *",
            "2026-01-01T00:00:00Z",
            "2026-01-01T12:00:00Z",
        ),
        ("@hourly", "2026-01-01T00:59:59Z", "2026-01-01T01:00:00Z"),
        ("@weekly", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"),
        ("@yearly", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        ("@every 90m", "2026-01-01T00:00:00Z", "2026-01-01T01:30:00Z"),
    ];
    for (expr, after, expected) in cases {
        assert_eq!(next(expr, after), at(expected), "`{expr}` after {after}");
        let slot = at(expected);
        let s = schedule(expr);
        assert!(s.contains(slot), "`{expr}` contains {expected}");
        assert_eq!(s.latest_at_or_before(slot), Some(slot));
        assert_eq!(
            s.latest_at_or_before(slot + Duration::from_secs(59)),
            Some(slot),
            "`{expr}`: the latest slot a minute later"
        );
    }
}

#[test]
fn sub_second_and_mid_minute_times_round_to_the_right_slot() {
    let s = schedule("* * * * *");
    let t = at("2026-01-01T00:00:00Z") + Duration::from_millis(1);
    assert_eq!(s.next_after(t), Some(at("2026-01-01T00:01:00Z")));
    assert_eq!(s.latest_at_or_before(t), Some(at("2026-01-01T00:00:00Z")));
    assert!(!s.contains(t));
    let every = Schedule::every(Duration::from_secs(1800)).expect("valid");
    assert_eq!(
        every.next_after(at("2026-01-01T00:30:00Z")),
        Some(at("2026-01-01T01:00:00Z"))
    );
}

#[test]
fn slots_lists_the_window_exclusive_of_its_start() {
    let s = schedule("0 */6 * * *");
    let slots: Vec<SystemTime> = s
        .slots(at("2026-01-01T00:00:00Z"), at("2026-01-02T00:00:00Z"))
        .collect();
    let expected: Vec<SystemTime> = [
        "2026-01-01T06:00:00Z",
        "2026-01-01T12:00:00Z",
        "2026-01-01T18:00:00Z",
        "2026-01-02T00:00:00Z",
    ]
    .map(at)
    .to_vec();
    assert_eq!(slots, expected);
}

fn field_error(expr: &str) -> (CronField, String, FieldProblem) {
    match expr.parse::<Schedule>() {
        Err(ScheduleError::Field {
            field,
            text,
            problem,
        }) => (field, text, problem),
        other => panic!("`{expr}`: expected a field error, got {other:?}"),
    }
}

#[test]
fn errors_name_the_field_and_say_what_is_wrong() {
    let cases = [
        ("60 * * * *", CronField::Minute, "60 is outside 0-59"),
        ("* 24 * * *", CronField::Hour, "24 is outside 0-23"),
        ("* * 0 * *", CronField::DayOfMonth, "0 is outside 1-31"),
        ("* * * 13 *", CronField::Month, "13 is outside 1-12"),
        ("* * * * 8", CronField::DayOfWeek, "8 is outside 0-7"),
        ("* * * foo *", CronField::Month, "month name"),
        ("* * * * funday", CronField::DayOfWeek, "day name"),
        ("x * * * *", CronField::Minute, "`x` is not a number"),
        ("*/0 * * * *", CronField::Minute, "step `0`"),
        ("* 5-2 * * *", CronField::Hour, "runs backwards"),
        ("1,,2 * * * *", CronField::Minute, "empty"),
    ];
    for (expr, field, message) in cases {
        let (found, _, problem) = field_error(expr);
        assert_eq!(found, field, "`{expr}`");
        let e = expr.parse::<Schedule>().expect_err("invalid");
        let text = e.to_string();
        let name = match field {
            CronField::Minute => "minute",
            CronField::Hour => "hour",
            CronField::DayOfMonth => "day-of-month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day-of-week",
        };
        assert_eq!(field.as_str(), name);
        assert!(
            text.starts_with(&format!("{name} field `")) && text.contains(message),
            "`{expr}`: {text} ({problem:?})"
        );
    }
    let every: Schedule = "@every 90m".parse().expect("valid");
    assert_eq!(format!("{every:?}"), "Schedule(@every 90m)");
}

#[test]
fn malformed_schedules_are_refused_with_a_reason() {
    assert!(matches!(
        "* * * *".parse::<Schedule>(),
        Err(ScheduleError::FieldCount { found: 4, .. })
    ));
    assert!(matches!(
        "0 0 30 2 *".parse::<Schedule>(),
        Err(ScheduleError::Never(_))
    ));
    assert!(matches!(
        "0 0 31 4,6,9,11 *".parse::<Schedule>(),
        Err(ScheduleError::Never(_))
    ));
    // With both day fields restricted, the weekday alone can fire.
    assert!("0 0 30 2 mon".parse::<Schedule>().is_ok());
    assert!(matches!(
        "@fortnightly".parse::<Schedule>(),
        Err(ScheduleError::UnknownShorthand(_))
    ));
    for bad in ["@every", "@every 10", "@every 10x", "@every m"] {
        assert!(
            matches!(bad.parse::<Schedule>(), Err(ScheduleError::BadEvery(_))),
            "{bad}"
        );
    }
    for interval in [Duration::ZERO, Duration::from_millis(1500)] {
        assert_eq!(
            Schedule::every(interval),
            Err(ScheduleError::Interval(interval))
        );
    }
    assert!(matches!(
        "@every 0s".parse::<Schedule>(),
        Err(ScheduleError::Interval(_))
    ));
}

#[test]
fn schedules_print_as_they_parse() {
    for text in [
        "0 3 * * *",
        "@daily",
        "@every 30m",
        "@every 2h",
        "@every 45s",
        "@every 1d",
    ] {
        let s = schedule(text);
        assert_eq!(s.to_string(), text);
        assert_eq!(schedule(&s.to_string()), s);
    }
    let every = Schedule::every(Duration::from_secs(7200)).expect("valid");
    assert_eq!(every.to_string(), "@every 2h");
}

/// A generated cron field: its text and the values it selects, computed without the parser.
#[derive(Debug, Clone)]
struct GenField {
    text: String,
    values: BTreeSet<u32>,
}

fn gen_field(min: u32, max: u32) -> impl Strategy<Value = GenField> {
    let all = move || (min..=max).collect::<BTreeSet<u32>>();
    prop_oneof![
        Just(GenField {
            text: "*".to_owned(),
            values: all(),
        }),
        (1u32..=max.max(2)).prop_map(move |step| GenField {
            text: format!("*/{step}"),
            values: (min..=max).step_by(step as usize).collect(),
        }),
        prop::collection::btree_set(min..=max, 1..4).prop_map(|values| GenField {
            text: values
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            values,
        }),
        (min..=max, min..=max, 1u32..4).prop_map(|(a, b, step)| {
            let (a, b) = (a.min(b), a.max(b));
            GenField {
                text: format!("{a}-{b}/{step}"),
                values: (a..=b).step_by(step as usize).collect(),
            }
        }),
    ]
}

/// The brute-force reference: does this expression fire at this minute?
struct Reference {
    minutes: BTreeSet<u32>,
    hours: BTreeSet<u32>,
    doms: BTreeSet<u32>,
    months: BTreeSet<u32>,
    dows: BTreeSet<u32>,
    dom_star: bool,
    dow_star: bool,
}

impl Reference {
    fn day(&self, d: NaiveDate) -> bool {
        let dow = d.weekday().num_days_from_sunday();
        let dow_ok = self.dows.contains(&dow) || (dow == 0 && self.dows.contains(&7));
        let dom_ok = self.doms.contains(&d.day());
        self.months.contains(&d.month())
            && if self.dom_star || self.dow_star {
                dom_ok && dow_ok
            } else {
                dom_ok || dow_ok
            }
    }

    /// Minutes of a day that fire, in order.
    fn times(&self) -> Vec<(u32, u32)> {
        self.hours
            .iter()
            .flat_map(|h| self.minutes.iter().map(move |m| (*h, *m)))
            .collect()
    }

    fn next_after(&self, t: i64) -> Option<i64> {
        let start = DateTime::<Utc>::from_timestamp(t, 0)?.date_naive();
        let times = self.times();
        (0..146_200i64).find_map(|i| {
            let d = start + chrono::Days::new(i as u64);
            if !self.day(d) {
                return None;
            }
            times.iter().find_map(|(h, m)| {
                let s = d.and_hms_opt(*h, *m, 0)?.and_utc().timestamp();
                (s > t).then_some(s)
            })
        })
    }

    fn latest_at_or_before(&self, t: i64) -> Option<i64> {
        let start = DateTime::<Utc>::from_timestamp(t, 0)?.date_naive();
        let times = self.times();
        (0..146_200i64).find_map(|i| {
            let d = start - chrono::Days::new(i as u64);
            if !self.day(d) {
                return None;
            }
            times.iter().rev().find_map(|(h, m)| {
                let s = d.and_hms_opt(*h, *m, 0)?.and_utc().timestamp();
                (s <= t).then_some(s)
            })
        })
    }
}

/// Whole seconds since the epoch; slots are whole seconds, possibly before 1970.
fn secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).expect("fits"),
        Err(e) => -i64::try_from(e.duration().as_secs()).expect("fits"),
    }
}

fn time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn slots_agree_with_a_brute_force_matcher(
        minute in gen_field(0, 59),
        hour in gen_field(0, 23),
        dom in gen_field(1, 31),
        month in gen_field(1, 12),
        dow in gen_field(0, 7),
        t in 0i64..4_000_000_000,
    ) {
        let expr = format!("{} {} {} {} {}", minute.text, hour.text, dom.text, month.text, dow.text);
        let reference = Reference {
            minutes: minute.values,
            hours: hour.values,
            doms: dom.values,
            months: month.values,
            dows: dow.values,
            dom_star: dom.text.starts_with('*'),
            dow_star: dow.text.starts_with('*'),
        };
        let expected_next = reference.next_after(t);
        let parsed = expr.parse::<Schedule>();
        let Ok(schedule) = parsed else {
            prop_assert!(matches!(parsed, Err(ScheduleError::Never(_))), "`{}`: {:?}", expr, parsed);
            prop_assert_eq!(expected_next, None, "`{}` was refused but fires", expr);
            return Ok(());
        };
        let at_t = UNIX_EPOCH + Duration::from_secs(t as u64);
        let next = schedule.next_after(at_t).map(secs);
        prop_assert_eq!(next, expected_next, "next after {} of `{}`", t, expr);
        let latest = schedule.latest_at_or_before(at_t).map(secs);
        prop_assert_eq!(latest, reference.latest_at_or_before(t), "latest at {} of `{}`", t, expr);
        if let (Some(next), Some(latest)) = (next, latest) {
            prop_assert!(latest <= t && t < next);
            let latest_time = time(latest);
            prop_assert_eq!(schedule.next_after(latest_time).map(secs), Some(next));
            let next_dt = DateTime::<Utc>::from_timestamp(next, 0).expect("in range");
            prop_assert_eq!(next_dt.second(), 0);
        }
    }

    #[test]
    fn interval_slots_are_multiples_since_the_epoch(every in 1u64..200_000, t in 0u64..4_000_000_000) {
        let schedule = Schedule::every(Duration::from_secs(every)).expect("valid");
        let at_t = UNIX_EPOCH + Duration::from_secs(t);
        let latest = secs(schedule.latest_at_or_before(at_t).expect("a slot")) as u64;
        let next = secs(schedule.next_after(at_t).expect("a slot")) as u64;
        prop_assert_eq!(latest % every, 0);
        prop_assert_eq!(next, latest + every);
        prop_assert!(latest <= t && t < next);
    }
}

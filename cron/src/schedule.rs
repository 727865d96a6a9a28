//! When a task fires: a five-field cron expression in UTC, or a fixed interval aligned to the
//! Unix epoch.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Datelike, NaiveDate, Timelike};
use thiserror::Error;

use crate::time::{floor_secs, from_secs};

/// How far [`Schedule::next_after`] and [`Schedule::latest_at_or_before`] search: one
/// Gregorian cycle of 400 years, after which the calendar repeats. An expression that can fire
/// at all (which parsing checks) fires within it.
const SEARCH_DAYS: u32 = 146_097;

/// When a task fires: a set of instants called slots.
///
/// Either a five-field cron expression (`minute hour day-of-month month day-of-week`, in UTC,
/// slots on whole minutes) or a fixed interval whose slots are the multiples of the interval
/// since the Unix epoch, so every scheduler instance computes the same slots whenever it
/// starts.
///
/// Cron fields take `*`, numbers, lists (`1,15`), ranges (`1-5`), steps (`*/15`, `0-30/10`,
/// `5/15`), month names (`jan`–`dec`) and day names (`sun`–`sat`; `0` and `7` are Sunday).
/// As in Vixie cron, when both day fields are restricted (neither starts with `*`) a day
/// matching either fires. `@hourly`, `@daily`/`@midnight`, `@weekly`, `@monthly`,
/// `@yearly`/`@annually` and `@every <n><s|m|h|d>` are accepted too.
///
/// ```
/// use jobs_cron::Schedule;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let jan1 = UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01T00:00:00Z
/// let nightly: Schedule = "0 3 * * *".parse()?;
/// assert_eq!(nightly.next_after(jan1), Some(jan1 + Duration::from_secs(3 * 3600)));
///
/// let half_hourly = Schedule::every(Duration::from_secs(1800))?;
/// assert_eq!(half_hourly.latest_at_or_before(jan1 + Duration::from_secs(2000)),
///            Some(jan1 + Duration::from_secs(1800)));
/// assert_eq!(half_hourly.to_string(), "@every 30m");
/// # Ok::<(), jobs_cron::ScheduleError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Schedule {
    repr: Repr,
}

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Cron { text: String, cron: Cron },
    Every { secs: i64 },
}

impl Schedule {
    /// Parses a cron expression or one of the `@` forms; see [`Schedule`].
    pub fn cron(expr: &str) -> Result<Schedule, ScheduleError> {
        expr.parse()
    }

    /// Slots every `interval`, at the multiples of it since the Unix epoch (so `every(30 min)`
    /// fires at :00 and :30). The interval must be a whole number of seconds, at least one.
    pub fn every(interval: Duration) -> Result<Schedule, ScheduleError> {
        match i64::try_from(interval.as_secs()) {
            Ok(secs) if secs > 0 && interval.subsec_nanos() == 0 => Ok(Schedule {
                repr: Repr::Every { secs },
            }),
            _ => Err(ScheduleError::Interval(interval)),
        }
    }

    /// The first slot strictly after `t`; `None` only beyond the range of `SystemTime` or the
    /// calendar.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let secs = floor_secs(t);
        let next = match &self.repr {
            Repr::Every { secs: every } => {
                secs.div_euclid(*every).checked_add(1)?.checked_mul(*every)
            }
            Repr::Cron { cron, .. } => cron.next_after(secs),
        }?;
        from_secs(next)
    }

    /// The last slot at or before `t`: the one a scheduler ticking at `t` is due to fire.
    pub fn latest_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        let secs = floor_secs(t);
        let latest = match &self.repr {
            Repr::Every { secs: every } => secs.div_euclid(*every).checked_mul(*every),
            Repr::Cron { cron, .. } => cron.latest_at_or_before(secs),
        }?;
        from_secs(latest)
    }

    /// Whether `t` is one of the slots.
    pub fn contains(&self, t: SystemTime) -> bool {
        self.latest_at_or_before(t) == Some(t)
    }

    /// The slots `s` with `after < s <= until`, in order. Lazy: a long window costs nothing
    /// until iterated.
    pub fn slots(&self, after: SystemTime, until: SystemTime) -> Slots<'_> {
        Slots {
            schedule: self,
            cursor: Some(after),
            until,
        }
    }

    /// The interval of an `every` schedule; `None` for cron expressions.
    pub fn interval(&self) -> Option<Duration> {
        match self.repr {
            Repr::Every { secs } => Some(Duration::from_secs(secs.unsigned_abs())),
            Repr::Cron { .. } => None,
        }
    }
}

/// The slots of a [`Schedule`] in a window, from [`Schedule::slots`].
#[derive(Debug, Clone)]
pub struct Slots<'a> {
    schedule: &'a Schedule,
    cursor: Option<SystemTime>,
    until: SystemTime,
}

impl Iterator for Slots<'_> {
    type Item = SystemTime;

    fn next(&mut self) -> Option<SystemTime> {
        let next = self
            .schedule
            .next_after(self.cursor?)
            .filter(|n| *n <= self.until);
        self.cursor = next;
        next
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Schedule, ScheduleError> {
        let text = s.trim();
        if let Some(rest) = text.strip_prefix("@every") {
            return Schedule::every(parse_every(rest.trim(), text)?);
        }
        let expanded = match text {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            other if other.starts_with('@') => {
                return Err(ScheduleError::UnknownShorthand(other.to_owned()));
            }
            other => other,
        };
        let cron = Cron::parse(expanded)?;
        Ok(Schedule {
            repr: Repr::Cron {
                text: text.to_owned(),
                cron,
            },
        })
    }
}

fn parse_every(amount: &str, text: &str) -> Result<Duration, ScheduleError> {
    let bad = || ScheduleError::BadEvery(text.to_owned());
    let split = amount.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = amount.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

impl fmt::Display for Schedule {
    /// The expression as written, or `@every <n><unit>` in the largest unit that divides the
    /// interval, which parses back to an equal schedule.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Cron { text, .. } => f.write_str(text),
            Repr::Every { secs } => {
                let (n, unit) = [(86_400, "d"), (3600, "h"), (60, "m")]
                    .into_iter()
                    .find(|(unit, _)| secs % unit == 0)
                    .map_or((*secs, "s"), |(size, unit)| (secs / size, unit));
                write!(f, "@every {n}{unit}")
            }
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({self})")
    }
}

/// A field of a cron expression, as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronField {
    /// The first field, 0–59.
    Minute,
    /// The second field, 0–23.
    Hour,
    /// The third field, 1–31.
    DayOfMonth,
    /// The fourth field, 1–12 or `jan`–`dec`.
    Month,
    /// The fifth field, 0–7 (0 and 7 are Sunday) or `sun`–`sat`.
    DayOfWeek,
}

impl CronField {
    const ALL: [CronField; 5] = [
        CronField::Minute,
        CronField::Hour,
        CronField::DayOfMonth,
        CronField::Month,
        CronField::DayOfWeek,
    ];

    /// The field's name: `minute`, `hour`, `day-of-month`, `month`, `day-of-week`.
    pub fn as_str(self) -> &'static str {
        match self {
            CronField::Minute => "minute",
            CronField::Hour => "hour",
            CronField::DayOfMonth => "day-of-month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day-of-week",
        }
    }

    fn bounds(self) -> (u32, u32) {
        match self {
            CronField::Minute => (0, 59),
            CronField::Hour => (0, 23),
            CronField::DayOfMonth => (1, 31),
            CronField::Month => (1, 12),
            CronField::DayOfWeek => (0, 7),
        }
    }

    fn expected(self) -> &'static str {
        match self {
            CronField::Month => "a number or a month name (jan-dec)",
            CronField::DayOfWeek => "a number or a day name (sun-sat)",
            _ => "a number",
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            CronField::Month => &[
                "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
            ],
            CronField::DayOfWeek => &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
            _ => &[],
        }
    }
}

impl fmt::Display for CronField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a schedule does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// Not five whitespace-separated fields.
    #[error(
        "a cron expression has 5 fields (minute hour day-of-month month day-of-week), found {found} in `{expr}`"
    )]
    FieldCount {
        /// The expression.
        expr: String,
        /// How many fields it has.
        found: usize,
    },
    /// One field is malformed.
    #[error("{field} field `{text}`: {problem}")]
    Field {
        /// The field at fault.
        field: CronField,
        /// The field as written.
        text: String,
        /// What is wrong with it.
        problem: FieldProblem,
    },
    /// Well-formed, but no date satisfies it (e.g. `0 0 30 2 *`): a task that never runs is a
    /// configuration mistake, not a schedule.
    #[error("`{0}` never fires: none of the selected months has the selected day of month")]
    Never(String),
    /// An `@` form other than the known ones.
    #[error(
        "unknown shorthand `{0}`; known: @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually, @every <n><s|m|h|d>"
    )]
    UnknownShorthand(String),
    /// `@every` without a number and a unit `s`, `m`, `h` or `d`.
    #[error("`{0}`: expected `@every <n><s|m|h|d>`, e.g. `@every 30m`")]
    BadEvery(String),
    /// An interval of zero, of a fraction of a second, or too long.
    #[error("an interval must be a whole number of seconds, at least one; got {0:?}")]
    Interval(Duration),
}

/// What is wrong with one cron field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FieldProblem {
    /// An empty field or list item (`1,,2`).
    #[error("has an empty item")]
    Empty,
    /// Neither a number nor a name this field knows.
    #[error("`{text}` is not {expected}")]
    NotAValue {
        /// The value as written.
        text: String,
        /// What the field takes, e.g. `a number or a month name (jan-dec)`.
        expected: &'static str,
    },
    /// A value outside the field's range.
    #[error("{value} is outside {min}-{max}")]
    OutOfRange {
        /// The value.
        value: u32,
        /// The least value allowed.
        min: u32,
        /// The greatest value allowed.
        max: u32,
    },
    /// A range whose start is after its end (ranges do not wrap).
    #[error("range {start}-{end} runs backwards")]
    Backwards {
        /// The start.
        start: u32,
        /// The end.
        end: u32,
    },
    /// A step of zero or not a number.
    #[error("step `{0}` must be a whole number of at least 1")]
    BadStep(String),
}

/// The selected values of each field as bit sets, and whether the day fields were written
/// starting with `*` (which decides how they combine).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cron {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    dom_star: bool,
    dow_star: bool,
}

fn has(set: u64, value: u32) -> bool {
    set & (1 << value) != 0
}

impl Cron {
    fn parse(expr: &str) -> Result<Cron, ScheduleError> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(ScheduleError::FieldCount {
                expr: expr.to_owned(),
                found: fields.len(),
            });
        };
        let [minutes, hours, days_of_month, months, mut days_of_week] = {
            let mut sets = [0u64; 5];
            for ((set, field), text) in sets
                .iter_mut()
                .zip(CronField::ALL)
                .zip([minute, hour, dom, month, dow])
            {
                *set = parse_field(field, text).map_err(|problem| ScheduleError::Field {
                    field,
                    text: text.to_owned(),
                    problem,
                })?;
            }
            sets
        };
        // 7 is another name for Sunday (bit 7 itself is never read: weekdays are 0-6).
        if has(days_of_week, 7) {
            days_of_week |= 1;
        }
        let cron = Cron {
            minutes,
            hours,
            days_of_month,
            months,
            days_of_week,
            dom_star: dom.starts_with('*'),
            dow_star: dow.starts_with('*'),
        };
        if !cron.can_fire() {
            return Err(ScheduleError::Never(expr.to_owned()));
        }
        Ok(cron)
    }

    /// Whether some date matches. With both day fields restricted any selected weekday will
    /// do; otherwise a selected day of month must exist in a selected month (every such date
    /// falls on every weekday in some year).
    fn can_fire(&self) -> bool {
        const LONGEST: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        if !self.dom_star && !self.dow_star {
            return true;
        }
        (1..=12).any(|m| {
            has(self.months, m)
                && (1..=LONGEST[(m - 1) as usize]).any(|d| has(self.days_of_month, d))
        })
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        if !has(self.months, date.month()) {
            return false;
        }
        let dom = has(self.days_of_month, date.day());
        let dow = has(self.days_of_week, date.weekday().num_days_from_sunday());
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    fn next_after(&self, secs: i64) -> Option<i64> {
        let start = secs.div_euclid(60).checked_add(1)?.checked_mul(60)?;
        let start = DateTime::from_timestamp(start, 0)?.naive_utc();
        let mut date = start.date();
        let (mut hour, mut minute) = (start.hour(), start.minute());
        for _ in 0..SEARCH_DAYS {
            if self.day_matches(date)
                && let Some((h, m)) = self.first_time_from(hour, minute)
            {
                return Some(date.and_hms_opt(h, m, 0)?.and_utc().timestamp());
            }
            date = date.succ_opt()?;
            (hour, minute) = (0, 0);
        }
        None
    }

    fn latest_at_or_before(&self, secs: i64) -> Option<i64> {
        let start = secs.div_euclid(60).checked_mul(60)?;
        let start = DateTime::from_timestamp(start, 0)?.naive_utc();
        let mut date = start.date();
        let (mut hour, mut minute) = (start.hour(), start.minute());
        for _ in 0..SEARCH_DAYS {
            if self.day_matches(date)
                && let Some((h, m)) = self.last_time_until(hour, minute)
            {
                return Some(date.and_hms_opt(h, m, 0)?.and_utc().timestamp());
            }
            date = date.pred_opt()?;
            (hour, minute) = (23, 59);
        }
        None
    }

    /// The first selected (hour, minute) at or after (`hour`, `minute`) on one day.
    fn first_time_from(&self, hour: u32, minute: u32) -> Option<(u32, u32)> {
        (hour..24).filter(|h| has(self.hours, *h)).find_map(|h| {
            let from = if h == hour { minute } else { 0 };
            (from..60).find(|m| has(self.minutes, *m)).map(|m| (h, m))
        })
    }

    /// The last selected (hour, minute) at or before (`hour`, `minute`) on one day.
    fn last_time_until(&self, hour: u32, minute: u32) -> Option<(u32, u32)> {
        (0..=hour)
            .rev()
            .filter(|h| has(self.hours, *h))
            .find_map(|h| {
                let to = if h == hour { minute } else { 59 };
                (0..=to)
                    .rev()
                    .find(|m| has(self.minutes, *m))
                    .map(|m| (h, m))
            })
    }
}

/// The bit set of the values `text` selects in `field`.
fn parse_field(field: CronField, text: &str) -> Result<u64, FieldProblem> {
    let (min, max) = field.bounds();
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => match step.parse::<u32>() {
                Ok(n) if n >= 1 => (range, Some(n)),
                _ => return Err(FieldProblem::BadStep(step.to_owned())),
            },
            None => (item, None),
        };
        let (start, end) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (start, end) = (value(field, a)?, value(field, b)?);
            if start > end {
                return Err(FieldProblem::Backwards { start, end });
            }
            (start, end)
        } else {
            let start = value(field, range)?;
            // `5/15` means `5-max/15`.
            (start, if step.is_some() { max } else { start })
        };
        let step = step.unwrap_or(1);
        let mut v = start;
        while v <= end {
            set |= 1 << v;
            v += step;
        }
    }
    Ok(set)
}

/// One value of `field`: a number in range, or a name the field knows.
fn value(field: CronField, text: &str) -> Result<u32, FieldProblem> {
    if text.is_empty() {
        return Err(FieldProblem::Empty);
    }
    let (min, max) = field.bounds();
    let n = if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u32>().unwrap_or(u32::MAX)
    } else {
        let lower = text.to_ascii_lowercase();
        let names = field.names();
        let index = names
            .iter()
            .position(|name| *name == lower)
            .ok_or_else(|| FieldProblem::NotAValue {
                text: text.to_owned(),
                expected: field.expected(),
            })?;
        // Months count from 1, weekdays from 0 (Sunday).
        u32::try_from(index).unwrap_or(u32::MAX) + min
    };
    if n < min || n > max {
        return Err(FieldProblem::OutOfRange { value: n, min, max });
    }
    Ok(n)
}

//! `Retry-After` (RFC 9110 §10.2.3) as every adapter reads it: one pure function, bounded,
//! so that no provider's answer can overflow a clock or park a job for a year.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest wait a `Retry-After` can ask of us: longer answers are clamped to it. An hour,
/// the retry policy's cap: a provider that is still not ready then says so again.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3_600);

/// How long `value`, a `Retry-After` header's value, asks to wait: either delay-seconds
/// (`"120"`) or an HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`, the IMF-fixdate form)
/// measured from `date`, the same response's `Date` header ([`parse_http_date`]), so that no
/// local clock is read and clock skew does not matter; without `date` the date form is not
/// understood. Clamped to [`MAX_RETRY_AFTER`]; a date before `date` is no wait. `None` for
/// anything else (a negative or fractional number, another date form, garbage), so that the
/// caller falls back to its own backoff.
///
/// ```
/// use jobs_core::{parse_http_date, parse_retry_after, MAX_RETRY_AFTER};
/// use std::time::Duration;
///
/// let date = parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT");
/// assert_eq!(parse_retry_after("7", None), Some(Duration::from_secs(7)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", date), Some(Duration::from_secs(60)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", None), None);
/// assert_eq!(parse_retry_after("99999999999999999999999", None), Some(MAX_RETRY_AFTER));
/// assert_eq!(parse_retry_after("-1", date), None);
/// ```
pub fn parse_retry_after(value: &str, date: Option<SystemTime>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: at worst too many of them, which clamps.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let at = parse_http_date(value)?;
    let wait = at.duration_since(date?).unwrap_or(Duration::ZERO);
    Some(wait.min(MAX_RETRY_AFTER))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, the form HTTP's `Date` and `Retry-After`
/// headers use) as a time; `None` for any other text, an impossible date or one before 1970.
pub fn parse_http_date(value: &str) -> Option<SystemTime> {
    let value = value.trim();
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (day_name, rest) = value.split_once(", ")?;
    if !DAYS.contains(&day_name) {
        return None;
    }
    let mut parts = rest.split(' ');
    let (day, month, year, time, zone) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    if parts.next().is_some() || zone != "GMT" || day.len() != 2 || year.len() != 4 {
        return None;
    }
    let number = |s: &str| -> Option<u64> {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let day = number(day)?;
    let month = MONTHS.iter().position(|m| *m == month)? as u64 + 1;
    let year = number(year)?;
    let mut clock = time.split(':');
    let (hour, minute, second) = (
        number(clock.next()?)?,
        number(clock.next()?)?,
        number(clock.next()?)?,
    );
    if clock.next().is_some()
        || year < 1970
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_since_epoch(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

fn is_leap(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to `year-month-day` (`year` ≥ 1970, four digits).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    let years: u64 = (1970..year)
        .map(|y| if is_leap(y) { 366 } else { 365 })
        .sum();
    let months: u64 = (1..month).map(|m| days_in_month(year, m)).sum();
    years + months + day - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn dates_match_the_calendar() {
        // RFC 9110's example, and a leap day.
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(at(784_111_777))
        );
        assert_eq!(
            parse_http_date("Thu, 29 Feb 2024 00:00:00 GMT"),
            Some(at(1_709_164_800))
        );
        assert_eq!(parse_http_date("Fri, 29 Feb 2023 00:00:00 GMT"), None);
    }

    #[test]
    fn hostile_values_never_panic_and_never_exceed_the_bound() {
        let now = Some(at(1_700_000_000));
        for value in [
            "",
            " ",
            "1.5",
            "+3",
            "0x10",
            "18446744073709551616",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "Sun, 99 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 9999 99:99:99 GMT",
            "Sun, 06 Nov 9999 23:59:59 GMT",
            "Mon, 06 Nov 1994 08:49:37 GMT extra",
        ] {
            if let Some(wait) = parse_retry_after(value, now) {
                assert!(wait <= MAX_RETRY_AFTER, "{value:?}: {wait:?}");
            }
        }
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 9999 23:59:59 GMT", now),
            Some(MAX_RETRY_AFTER),
            "a far date clamps"
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO),
            "a past date is no wait"
        );
        assert_eq!(
            parse_retry_after(" 30 ", now),
            Some(Duration::from_secs(30))
        );
    }
}

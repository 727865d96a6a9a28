//! The one duration grammar of flags, environment variables and `jobs.toml` alike: a whole
//! number with a unit, or several, largest unit first, each unit once: `500ms`, `30s`,
//! `1m30s`, `1h30m`, `30d`. Units are `ms`, `s`, `m`, `h` and `d`. A bare number is refused,
//! so that `30` never means seconds to one reader and milliseconds to another.
//!
//! Each key or flag keeps its own bounds ([`DurationRange`]) and names them when it refuses
//! a value.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Why a text is not a duration of the grammar, or not one within a key's bounds.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Nothing was given.
    #[error("nothing was given (a number with a unit, e.g. 30s)")]
    Empty,
    /// A number has no unit after it.
    #[error("`{text}` has a number without a unit: add one (ms, s, m, h or d), as in 90s or 1h30m")]
    NoUnit {
        /// The text refused.
        text: String,
    },
    /// Something other than whole numbers and units, or units out of order.
    #[error(
        "`{text}` is not a duration: whole numbers each with a unit (ms, s, m, h or d), \
         largest first, as in 500ms, 30s, 1h30m or 30d"
    )]
    Malformed {
        /// The text refused.
        text: String,
    },
    /// Longer than the bounds allow.
    #[error("`{text}` is longer than {max}")]
    TooLong {
        /// The text refused.
        text: String,
        /// The longest accepted, in the grammar.
        max: String,
    },
    /// Shorter than the bounds allow.
    #[error("`{text}` is shorter than {min}")]
    TooShort {
        /// The text refused.
        text: String,
        /// The shortest accepted, in the grammar.
        min: String,
    },
}

/// Parses `text` in the grammar, with no bounds but what a `u64` of milliseconds holds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let malformed = || DurationError::Malformed {
        text: text.to_owned(),
    };
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut rest = text;
    // The index in UNITS of the last unit read: the next must come after it.
    let mut last: Option<usize> = None;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(malformed());
        }
        let (number, after) = rest.split_at(digits);
        if after.is_empty() {
            return Err(DurationError::NoUnit {
                text: text.to_owned(),
            });
        }
        // `ms` before `m`, which it begins with.
        let (rank, (unit, millis)) = UNITS
            .iter()
            .enumerate()
            .filter(|(_, (unit, _))| after.starts_with(unit))
            .max_by_key(|(_, (unit, _))| unit.len())
            .ok_or_else(malformed)?;
        if last.is_some_and(|last| rank <= last) {
            return Err(malformed());
        }
        last = Some(rank);
        let too_long = || DurationError::TooLong {
            text: text.to_owned(),
            max: format_duration(Duration::from_millis(u64::MAX)),
        };
        total = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(*millis))
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(too_long)?;
        rest = &after[unit.len()..];
    }
    Ok(Duration::from_millis(total))
}

/// `duration` in the grammar, to the millisecond: `0s`, `500ms`, `1h30m`, `36500d`.
pub fn format_duration(duration: Duration) -> String {
    let mut left = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if left == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, millis) in UNITS {
        let n = left / millis;
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
            left -= n * millis;
        }
    }
    out
}

/// The durations one key or flag accepts, inclusive; it names them when it refuses a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    min: Duration,
    max: Duration,
}

impl DurationRange {
    /// From `min` to `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        DurationRange { min, max }
    }

    /// From zero to `max`.
    pub const fn up_to(max: Duration) -> Self {
        DurationRange::new(Duration::ZERO, max)
    }

    /// The shortest accepted.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest accepted.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// `text` in the grammar and within the bounds; refused, the error says what the bounds
    /// are and why the text is not within them.
    pub fn parse(&self, text: &str) -> Result<Duration, DurationRefused> {
        let refused = |reason| DurationRefused {
            range: *self,
            reason,
        };
        let duration = parse_duration(text).map_err(|reason| match reason {
            DurationError::TooLong { text, .. } => refused(DurationError::TooLong {
                text,
                max: format_duration(self.max),
            }),
            reason => refused(reason),
        })?;
        if duration > self.max {
            return Err(refused(DurationError::TooLong {
                text: text.to_owned(),
                max: format_duration(self.max),
            }));
        }
        if duration < self.min {
            return Err(refused(DurationError::TooShort {
                text: text.to_owned(),
                min: format_duration(self.min),
            }));
        }
        Ok(duration)
    }
}

impl fmt::Display for DurationRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min.is_zero() {
            write!(f, "up to {}", format_duration(self.max))
        } else {
            write!(
                f,
                "from {} to {}",
                format_duration(self.min),
                format_duration(self.max)
            )
        }
    }
}

/// A value a key or flag refuses: `must be a duration up to 24h: `90` has a number without
/// a unit…`, to follow the name of what refused it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("must be a duration {range}: {reason}")]
pub struct DurationRefused {
    /// The bounds of the key or flag.
    pub range: DurationRange,
    /// Why the value is not within them.
    pub reason: DurationError,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn every_number_takes_a_unit_and_units_come_largest_first() {
        for (text, ms) in [
            ("500ms", 500),
            ("0s", 0),
            ("30s", 30_000),
            ("1m30s", 90_000),
            ("1h30m", 5_400_000),
            ("30d", 2_592_000_000),
            ("1d2h3m4s5ms", 93_784_005),
            ("1s500ms", 1_500),
        ] {
            assert_eq!(parse_duration(text), Ok(MS(ms)), "{text}");
            assert_eq!(
                parse_duration(&format_duration(MS(ms))),
                Ok(MS(ms)),
                "{text}"
            );
        }
        assert_eq!(format_duration(MS(5_400_000)), "1h30m");
        assert_eq!(format_duration(MS(1_500)), "1s500ms");
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bare in ["30", "1h30", "5000"] {
            let refused = parse_duration(bare).expect_err(bare);
            assert!(matches!(refused, DurationError::NoUnit { .. }), "{bare}");
            assert!(refused.to_string().contains("add one"), "{refused}");
        }
        for bad in [
            "30m1h", "1s1s", "500ms1s", "3w", "1.5s", "-1s", "s", "1 h", "1hh", "1h ",
        ] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed { .. })),
                "{bad}: {:?}",
                parse_duration(bad)
            );
        }
        for huge in ["99999999999999999999d", "18446744073709551615s"] {
            assert!(
                matches!(parse_duration(huge), Err(DurationError::TooLong { .. })),
                "{huge}"
            );
        }
    }

    #[test]
    fn a_range_names_its_bounds_when_it_refuses() {
        let day = DurationRange::up_to(Duration::from_secs(86_400));
        assert_eq!(day.parse("24h"), Ok(Duration::from_secs(86_400)));
        let long = day.parse("25h").expect_err("longer than a day");
        assert_eq!(
            long.to_string(),
            "must be a duration up to 1d: `25h` is longer than 1d"
        );
        let bare = day.parse("90").expect_err("no unit");
        assert!(
            bare.to_string()
                .starts_with("must be a duration up to 1d: `90` has a number without a unit"),
            "{bare}"
        );
        let huge = day.parse("99999999999999999999d").expect_err("too long");
        assert!(huge.to_string().ends_with("is longer than 1d"), "{huge}");
        let from = DurationRange::new(Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(
            from.parse("500ms").expect_err("too short").to_string(),
            "must be a duration from 1s to 1m: `500ms` is shorter than 1s"
        );
    }
}

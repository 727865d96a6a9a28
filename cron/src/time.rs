//! Conversions between `SystemTime` and the whole Unix seconds slots are computed in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat, Utc};

/// Whole seconds since the Unix epoch, rounded down (also before the epoch).
pub(crate) fn floor_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let before = e.duration();
            let secs = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            if before.subsec_nanos() > 0 {
                secs.saturating_neg().saturating_sub(1)
            } else {
                secs.saturating_neg()
            }
        }
    }
}

/// The instant `secs` seconds after the Unix epoch, if `SystemTime` can hold it.
pub(crate) fn from_secs(secs: i64) -> Option<SystemTime> {
    let magnitude = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    }
}

/// `t` in UTC, if chrono can represent it.
pub(crate) fn utc(t: SystemTime) -> Option<DateTime<Utc>> {
    let secs = floor_secs(t);
    let below = from_secs(secs).and_then(|s| t.duration_since(s).ok());
    DateTime::from_timestamp(secs, below.map_or(0, |d| d.subsec_nanos()))
}

/// `t` as RFC 3339 in UTC (`2026-01-01T00:00:00Z`, with fractional seconds only when `t` has
/// them), or its `Debug` form if it is beyond chrono's range.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    utc(t).map_or_else(
        || format!("{t:?}"),
        |d| d.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_on_both_sides_of_the_epoch() {
        assert_eq!(floor_secs(UNIX_EPOCH + Duration::from_millis(1_500)), 1);
        assert_eq!(floor_secs(UNIX_EPOCH - Duration::from_millis(1_500)), -2);
        assert_eq!(floor_secs(UNIX_EPOCH - Duration::from_secs(2)), -2);
        assert_eq!(from_secs(-2), Some(UNIX_EPOCH - Duration::from_secs(2)));
    }

    #[test]
    fn formats_rfc3339_in_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        assert_eq!(rfc3339(t), "2026-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(t + Duration::from_millis(250)),
            "2026-01-01T00:00:00.250Z"
        );
    }
}

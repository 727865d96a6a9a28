//! Conversions between the port's types and PostgreSQL's columns.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use jobs_core::StoreError;
use sqlx::types::Uuid;

/// A `timestamptz` for `t`; PostgreSQL keeps microseconds, so finer digits are dropped.
pub(crate) fn to_timestamp(t: SystemTime) -> Result<DateTime<Utc>, StoreError> {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => (i64::try_from(after.as_secs()).ok(), after.subsec_nanos()),
        Err(e) => {
            let before = e.duration();
            let carry = i64::from(before.subsec_nanos() > 0);
            let secs = i64::try_from(before.as_secs())
                .ok()
                .and_then(|s| s.checked_add(carry))
                .map(|s| -s);
            (
                secs,
                (1_000_000_000 - before.subsec_nanos()) % 1_000_000_000,
            )
        }
    };
    secs.and_then(|secs| DateTime::from_timestamp(secs, nanos))
        .ok_or_else(|| StoreError::failed(format!("time {t:?} is out of range for timestamptz")))
}

/// The instant a `timestamptz` denotes.
pub(crate) fn from_timestamp(t: DateTime<Utc>) -> Result<SystemTime, StoreError> {
    let secs = t.timestamp();
    let nanos = Duration::from_nanos(u64::from(t.timestamp_subsec_nanos()));
    let whole = Duration::from_secs(secs.unsigned_abs());
    let at = if secs >= 0 {
        UNIX_EPOCH.checked_add(whole)
    } else {
        UNIX_EPOCH.checked_sub(whole)
    };
    at.and_then(|at| at.checked_add(nanos))
        .ok_or_else(|| StoreError::failed(format!("stored time {t} is out of range")))
}

/// Parses a stored UUID into one of the envelope's id types, which validate as the standard
/// does.
pub(crate) fn id_from_uuid<T>(column: &str, uuid: Uuid) -> Result<T, StoreError>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    uuid.hyphenated()
        .to_string()
        .parse()
        .map_err(|e| crate::error::corrupt(format!("{column} `{uuid}`"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_times_on_both_sides_of_the_epoch() {
        for t in [
            UNIX_EPOCH + Duration::new(1_800_000_000, 123_456_789),
            UNIX_EPOCH - Duration::new(86_400, 250_000_001),
            UNIX_EPOCH,
        ] {
            let stamp = to_timestamp(t).expect("in range");
            assert_eq!(
                from_timestamp(stamp).expect("in range"),
                t,
                "{t:?} via {stamp}"
            );
        }
    }
}

//! Conversions between the port's types and SQLite's columns.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobs_core::StoreError;

/// Unix milliseconds for `t`, rounded down: the stored form of every time.
pub(crate) fn to_millis(t: SystemTime) -> Result<i64, StoreError> {
    let millis = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).ok(),
        Err(e) => {
            let before = e.duration();
            let ceil = before.as_millis() + u128::from(before.subsec_nanos() % 1_000_000 > 0);
            i64::try_from(ceil).ok().map(|m| -m)
        }
    };
    millis.ok_or_else(|| StoreError::failed(format!("time {t:?} is out of range for i64 ms")))
}

/// The instant that `millis` Unix milliseconds denote.
pub(crate) fn from_millis(millis: i64) -> Result<SystemTime, StoreError> {
    let span = Duration::from_millis(millis.unsigned_abs());
    let at = if millis >= 0 {
        UNIX_EPOCH.checked_add(span)
    } else {
        UNIX_EPOCH.checked_sub(span)
    };
    at.ok_or_else(|| StoreError::failed(format!("stored time {millis} ms is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_times_as_unix_millis_rounded_down() {
        for (t, millis) in [
            (
                UNIX_EPOCH + Duration::new(1_800_000_000, 123_456_789),
                1_800_000_000_123,
            ),
            (UNIX_EPOCH, 0),
            (UNIX_EPOCH - Duration::from_millis(1500), -1500),
            (UNIX_EPOCH - Duration::from_micros(1500), -2),
        ] {
            assert_eq!(to_millis(t).expect("in range"), millis, "{t:?}");
        }
        for millis in [1_800_000_000_123, 0, -1500] {
            let t = from_millis(millis).expect("in range");
            assert_eq!(to_millis(t).expect("in range"), millis);
        }
    }
}

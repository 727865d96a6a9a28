//! The values flags take and output shows: times (RFC 3339), durations (the one grammar of
//! `jobs_ops::config`, each flag with its own bounds), dead-letter statuses and reasons.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use jobs_core::{DeadLetterReason, DeadLetterStatus};
use jobs_ops::config::{DurationRange, DurationRefused};

use crate::Usage;

/// The contents of the file `path` (`-`: standard input), given as `given` (the flag and its
/// value, for messages), read up to `limit` bytes: a longer input (a wrong file, `/dev/zero`)
/// is refused once `limit` bytes are read, naming the flag and the limit, rather than read
/// until memory runs out.
pub(crate) fn read_bounded(given: &str, path: &Path, limit: usize) -> Result<Vec<u8>, Usage> {
    let refused = |e: std::io::Error| Usage(format!("{given}: {e}"));
    let reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(path).map_err(refused)?)
    };
    let mut bytes = Vec::new();
    let bound = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(bound)
        .read_to_end(&mut bytes)
        .map_err(refused)?;
    if bytes.len() > limit {
        return Err(Usage(format!(
            "{given}: longer than the limit of {limit} bytes"
        )));
    }
    Ok(bytes)
}

/// `t` as RFC 3339 in UTC, to the second.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Parses an RFC 3339 time such as `2026-12-01T03:00:00Z`.
pub(crate) fn parse_time(text: &str) -> Result<SystemTime, String> {
    DateTime::parse_from_rfc3339(text)
        .map(SystemTime::from)
        .map_err(|e| format!("`{text}` is not an RFC 3339 time (e.g. 2026-12-01T03:00:00Z): {e}"))
}

/// `pending_review`, `replayed` or `discarded`.
pub(crate) fn parse_status(s: &str) -> Result<DeadLetterStatus, String> {
    s.parse().map_err(|_: jobs_core::StoreError| {
        "accepted values: pending_review, replayed, discarded".to_owned()
    })
}

/// `--reason`: one of the reasons a letter is kept with.
pub(crate) fn parse_reason(s: &str) -> Result<DeadLetterReason, String> {
    s.parse().map_err(|_: jobs_core::StoreError| {
        let known: Vec<&str> = DeadLetterReason::ALL.iter().map(|r| r.as_str()).collect();
        format!("accepted values: {}", known.join(", "))
    })
}

/// The longest `--delay`, `--older-than` or `--tolerance` accepts, a hundred years: now plus
/// or minus it is a time every clock and store can hold.
const LONGEST: Duration = Duration::from_secs(36_500 * 86_400);

/// `--delay`: how long a job waits before it is delivered.
pub(crate) fn delay(text: &str) -> Result<Duration, DurationRefused> {
    DurationRange::up_to(LONGEST).parse(text)
}

/// `--older-than`: the age of the `processed_jobs` rows a cleanup deletes.
pub(crate) fn older_than(text: &str) -> Result<Duration, DurationRefused> {
    DurationRange::up_to(LONGEST).parse(text)
}

/// `--tolerance`: the clock skew allowed on a signature's `exp` and `nbf`.
pub(crate) fn tolerance(text: &str) -> Result<Duration, DurationRefused> {
    DurationRange::up_to(LONGEST).parse(text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339() {
        assert!(super::parse_time("2026-12-01T03:00:00Z").is_ok());
        assert!(super::parse_time("tomorrow").is_err());
    }

    #[test]
    fn duration_flags_take_the_one_grammar_up_to_a_hundred_years() {
        assert_eq!(
            super::older_than("30d"),
            Ok(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(super::delay("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(super::delay("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(super::tolerance("1500ms"), Ok(Duration::from_millis(1_500)));
        assert_eq!(
            super::delay("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
        for absurd in ["36501d", "18446744073709551615s", "99999999999999999999d"] {
            let error = super::delay(absurd).expect_err("refused");
            assert!(error.to_string().contains(absurd), "{error}");
            assert!(error.to_string().contains("up to 36500d"), "{error}");
        }
        let bare = super::older_than("30").expect_err("no unit");
        assert!(bare.to_string().contains("add one"), "{bare}");
        assert!(super::delay("3w").is_err());
        assert!(super::delay("").is_err());
    }
}

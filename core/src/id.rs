//! The envelope's identifiers, validated exactly as the standard's Zod schema validates them.
//!
//! TypeScript modules check the same envelopes with Zod 4, so acceptance here is defined by
//! Zod's patterns, not by what the `uuid` crate can parse: `job_id` must match `z.uuidv7()`,
//! `tenant_id` and `correlation_id` must match `z.uuid()`. Parsed ids print in lower case.

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;
use uuid::Uuid;

/// Zod 4's `z.uuidv7()` pattern: the JSON Schema and the property tests are built from it.
pub const UUIDV7_PATTERN: &str =
    "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12})$";

/// Zod 4's `z.uuid()` pattern: versions 1–8 with the RFC 9562 variant, the nil UUID and the
/// lower-case max UUID.
pub const UUID_PATTERN: &str = "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$";

const NIL: &str = "00000000-0000-0000-0000-000000000000";
const MAX: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

/// Why a string is not an acceptable identifier.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UuidError {
    /// Not 36 characters of hex with hyphens at positions 9, 14, 19 and 24.
    #[error("must be a UUID in the 36-character form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    NotHyphenatedHex,
    /// The version digit is outside what the field accepts.
    #[error("must be a UUID version {expected}, found version {found}")]
    WrongVersion {
        /// The versions accepted, e.g. `7` or `1-8`.
        expected: &'static str,
        /// The version digit found (a hex digit).
        found: char,
    },
    /// The variant digit is not the RFC 9562 one.
    #[error(
        "must carry the RFC 9562 variant (8, 9, a or b as the 20th character), found `{found}`"
    )]
    WrongVariant {
        /// The variant character found.
        found: char,
    },
}

/// The value of each hex digit byte; `0xFF` for any other byte.
const HEX: [u8; 256] = {
    let mut table = [0xFF; 256];
    let mut c = 0;
    while c < 10 {
        table[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        table[b'a' as usize + c] = 10 + c as u8;
        table[b'A' as usize + c] = 10 + c as u8;
        c += 1;
    }
    table
};

/// Reads the 8-4-4-4-12 hyphenated hex form in one pass: the UUID, and its version and variant
/// characters for the caller's checks.
fn shape(s: &str) -> Result<(Uuid, char, char), UuidError> {
    let b = s.as_bytes();
    if b.len() != 36 || b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return Err(UuidError::NotHyphenatedHex);
    }
    // Where each byte's two digits start, the hyphens skipped.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let mut bytes = [0u8; 16];
    let mut bad = 0;
    for (byte, at) in bytes.iter_mut().zip(AT) {
        let (high, low) = (HEX[usize::from(b[at])], HEX[usize::from(b[at + 1])]);
        bad |= high | low;
        *byte = high << 4 | low;
    }
    if bad & 0xF0 != 0 {
        return Err(UuidError::NotHyphenatedHex);
    }
    Ok((
        Uuid::from_bytes(bytes),
        char::from(b[14]),
        char::from(b[19]),
    ))
}

fn check_variant(variant: char) -> Result<(), UuidError> {
    match variant {
        '8' | '9' | 'a' | 'b' | 'A' | 'B' => Ok(()),
        found => Err(UuidError::WrongVariant { found }),
    }
}

/// Validates `s` against [`UUIDV7_PATTERN`].
fn parse_v7(s: &str) -> Result<Uuid, UuidError> {
    let (uuid, version, variant) = shape(s)?;
    if version != '7' {
        return Err(UuidError::WrongVersion {
            expected: "7",
            found: version,
        });
    }
    check_variant(variant)?;
    Ok(uuid)
}

/// Validates `s` against [`UUID_PATTERN`].
fn parse_any(s: &str) -> Result<Uuid, UuidError> {
    let (uuid, version, variant) = shape(s)?;
    if s == NIL || s == MAX {
        return Ok(uuid);
    }
    if !('1'..='8').contains(&version) {
        return Err(UuidError::WrongVersion {
            expected: "1-8 (or the nil or lower-case max UUID)",
            found: version,
        });
    }
    check_variant(variant)?;
    Ok(uuid)
}

macro_rules! uuid_newtype {
    ($(#[$meta:meta])* $name:ident, $parse:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// The underlying UUID.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = UuidError;

            fn from_str(s: &str) -> Result<Self, UuidError> {
                $parse(s).map($name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(&self.0.hyphenated())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

uuid_newtype!(
    /// A job's identity: a UUID version 7, so ids sort by creation time.
    ///
    /// It is the default deduplication key at publish and, with the consumer's name, the key of
    /// `core.processed_jobs`: two deliveries with the same `JobId` are the same job.
    ///
    /// ```
    /// use jobs_core::JobId;
    ///
    /// let id: JobId = "017F22E2-79B0-7CC3-98C4-DC0C0C07398F".parse()?;
    /// assert_eq!(id.to_string(), "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    /// assert_eq!(id.unix_ms(), 1_645_557_742_000);
    /// assert!("a5b6c7d8-1234-4abc-8def-0123456789ab".parse::<JobId>().is_err()); // a v4
    /// # Ok::<(), jobs_core::UuidError>(())
    /// ```
    JobId,
    parse_v7
);

uuid_newtype!(
    /// The tenant a job belongs to: any UUID that Zod's `z.uuid()` accepts.
    TenantId,
    parse_any
);

uuid_newtype!(
    /// Ties together every job, log line and dead letter of one business operation: any UUID
    /// that Zod's `z.uuid()` accepts.
    CorrelationId,
    parse_any
);

impl CorrelationId {
    /// A fresh correlation id, for a job that starts a business operation (a version 7 UUID,
    /// like a job id: the operation's ids sort by when it began).
    ///
    /// ```
    /// use jobs_core::CorrelationId;
    ///
    /// assert_ne!(CorrelationId::generate(), CorrelationId::generate());
    /// ```
    pub fn generate() -> CorrelationId {
        CorrelationId::from(JobId::generate())
    }
}

/// A job that starts a business operation correlates with itself.
impl From<JobId> for CorrelationId {
    fn from(id: JobId) -> CorrelationId {
        CorrelationId(id.0)
    }
}

/// Bits of a version 7 UUID below the timestamp that are free for randomness (`rand_a` and
/// `rand_b`, 12 + 62).
const RANDOM_BITS: u32 = 74;

struct Minted {
    unix_ms: u64,
    random: u128,
}

static LAST: Mutex<Minted> = Mutex::new(Minted {
    unix_ms: 0,
    random: 0,
});

fn random_bits() -> u128 {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    // Keep the top bit clear so that increments within one millisecond have room to grow.
    u128::from_le_bytes(bytes) & ((1 << (RANDOM_BITS - 1)) - 1)
}

impl JobId {
    /// Mints a fresh id for the current time.
    ///
    /// Ids minted by one process are strictly increasing (RFC 9562 §6.2, method 3: within one
    /// millisecond, or if the system clock steps back, the random part is incremented), so
    /// two jobs created in a row sort in creation order.
    pub fn generate() -> JobId {
        JobId::generate_at(SystemTime::now())
    }

    /// Mints a fresh id for `now`, a [`Clock`](crate::Clock)'s time, so that ids minted under
    /// a manual clock carry its time; still strictly increasing within the process.
    ///
    /// ```
    /// use jobs_core::{Clock, JobId, ManualClock};
    ///
    /// let clock = ManualClock::default();
    /// let id = JobId::generate_at(clock.now());
    /// let ms = clock.now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    /// assert!(u128::from(id.unix_ms()) >= ms);
    /// assert!(JobId::generate_at(clock.now()) > id);
    /// ```
    pub fn generate_at(now: SystemTime) -> JobId {
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if now_ms > last.unix_ms {
            *last = Minted {
                unix_ms: now_ms,
                random: random_bits(),
            };
        } else {
            last.random += 1;
            if last.random >> RANDOM_BITS != 0 {
                *last = Minted {
                    unix_ms: last.unix_ms + 1,
                    random: random_bits(),
                };
            }
        }
        JobId::from_parts(last.unix_ms, last.random)
    }

    /// Builds the id with timestamp `unix_ms` and the low 74 bits of `random`.
    ///
    /// For ids that must be derived rather than minted, e.g. a cron fan-out job whose id is a
    /// function of (task, tenant, slot) so that two schedulers firing the same slot publish the
    /// same job. Only the low 48 bits of `unix_ms` fit (until the year 10889).
    pub fn from_parts(unix_ms: u64, random: u128) -> JobId {
        let ts = u128::from(unix_ms & 0xFFFF_FFFF_FFFF);
        let rand_a = (random >> 62) & 0xFFF;
        let rand_b = random & ((1 << 62) - 1);
        JobId(Uuid::from_u128(
            (ts << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b,
        ))
    }

    /// Milliseconds since the Unix epoch when the id was minted.
    pub fn unix_ms(&self) -> u64 {
        u64::try_from(self.0.as_u128() >> 80).unwrap_or_else(|_| unreachable!("48-bit field"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_strictly_increasing() {
        let mut previous = JobId::generate();
        for _ in 0..10_000 {
            let next = JobId::generate();
            assert!(next > previous, "{next} does not sort after {previous}");
            assert_eq!(next.to_string().parse::<JobId>(), Ok(next));
            previous = next;
        }
    }

    #[test]
    fn from_parts_keeps_the_timestamp_and_sets_version_and_variant() {
        let id = JobId::from_parts(1_645_557_742_000, u128::MAX);
        assert_eq!(id.unix_ms(), 1_645_557_742_000);
        assert_eq!(id.as_uuid().get_version_num(), 7);
        assert_eq!(id.as_uuid().get_variant(), uuid::Variant::RFC4122);
    }
}

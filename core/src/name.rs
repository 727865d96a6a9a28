//! Dotted lowercase names: job kinds and queue names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// The grammar of [`Kind`] and [`QueueName`]: dotted segments of `[a-z][a-z0-9_]*`. The
/// length limit, [`MAX_NAME_LEN`], is stated separately (JSON Schema `maxLength`).
pub const NAME_PATTERN: &str = "^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$";

/// The longest kind or queue name, in characters.
pub const MAX_NAME_LEN: usize = 128;

/// The kind of the standard's `core.processed_jobs` TTL cleanup: scheduled by `jobs-cron`,
/// handled by `jobs-consumers`, named once here, where both can reach it.
pub const PROCESSED_JOBS_CLEANUP_KIND: &str = "core.processed_jobs_cleanup";

/// Why a string is not an acceptable kind or queue name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty string.
    #[error("must not be empty")]
    Empty,
    /// Longer than [`MAX_NAME_LEN`].
    #[error("is {len} characters long, over the limit of {MAX_NAME_LEN}")]
    TooLong {
        /// The length found, in characters.
        len: usize,
    },
    /// A character outside `a-z`, `0-9`, `_` and `.`.
    #[error("contains `{found}` at position {position}; only a-z, 0-9, `_` and `.` are allowed")]
    BadChar {
        /// The offending character.
        found: char,
        /// Its 1-based position.
        position: usize,
    },
    /// A segment that is empty or does not start with a lowercase letter.
    #[error("segment {segment} must start with a lowercase letter (found {found:?})")]
    BadSegment {
        /// The 1-based index of the segment.
        segment: usize,
        /// The segment as written (empty for `a..b`, `.a` or `a.`).
        found: String,
    },
}

fn check_name(s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    let len = s.chars().count();
    if len > MAX_NAME_LEN {
        return Err(NameError::TooLong { len });
    }
    if let Some((i, found)) = s
        .chars()
        .enumerate()
        .find(|(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '.'))
    {
        return Err(NameError::BadChar {
            found,
            position: i + 1,
        });
    }
    for (i, segment) in s.split('.').enumerate() {
        if !segment.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(NameError::BadSegment {
                segment: i + 1,
                found: segment.to_owned(),
            });
        }
    }
    Ok(())
}

macro_rules! name_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        // Shared rather than copied: a worker clones its queue's name and its jobs' kinds into
        // every delivery, job and label.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// The name as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = NameError;

            fn from_str(s: &str) -> Result<Self, NameError> {
                check_name(s)?;
                Ok($name(s.into()))
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;

            fn try_from(s: &str) -> Result<Self, NameError> {
                s.parse()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
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

name_newtype!(
    /// What a job does, e.g. `billing.invoice_issued`: handlers are registered per kind.
    ///
    /// ```
    /// use jobs_core::Kind;
    ///
    /// let kind: Kind = "billing.invoice_issued".parse()?;
    /// assert_eq!(kind.as_str(), "billing.invoice_issued");
    /// assert!("Billing.Invoice".parse::<Kind>().is_err());
    /// # Ok::<(), jobs_core::NameError>(())
    /// ```
    Kind
);

name_newtype!(
    /// Where jobs are published and consumed, e.g. `billing.invoices` or
    /// `notif.email.transactional`.
    ///
    /// Taking a `&QueueName` rather than a `&str` makes an invalid queue name a compile-time
    /// impossibility at every port. Adapters map it onto their transport's naming rules.
    QueueName
);

name_newtype!(
    /// The name of a consumer, e.g. `billing.invoice_mailer`: with the job id, the key of
    /// `core.processed_jobs`, so two consumers of one queue each process every job once.
    ConsumerName
);

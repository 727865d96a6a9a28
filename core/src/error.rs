//! The one question every error in the project answers: try again, or give up?

use std::fmt;

/// Whether a failed operation may succeed if it is tried again later.
///
/// Every error type of the ports carries a class so that the consumer runtime decides
/// retry-or-dead-letter from a typed answer, never by downcasting or matching messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A transient condition (network, overload, a lease that may come back): try again later.
    Retryable,
    /// Trying again cannot help (invalid input, refused credentials): give up now.
    Permanent,
}

impl ErrorClass {
    /// `true` for [`ErrorClass::Retryable`].
    pub fn is_retryable(self) -> bool {
        self == ErrorClass::Retryable
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorClass::Retryable => "retryable",
            ErrorClass::Permanent => "permanent",
        })
    }
}

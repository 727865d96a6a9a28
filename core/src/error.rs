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

/// The shape every error of a port with an engine behind it shares: one variant per portable
/// kind, each with a `message` that already carries the engine's error (so a printed chain
/// says it once: `Error::source` returns nothing) and the engine's error in `source` for
/// callers that inspect it ([`engine_error`](StoreError::engine_error)); a `class()` that
/// says whether to try again.
macro_rules! port_error {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident => $display:literal, $class:ident;
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum $name {
            $(
                $(#[$vmeta])*
                $variant {
                    /// What failed, with the engine's error.
                    message: String,
                    /// The engine's error, when there is one.
                    source: Option<Box<dyn std::error::Error + Send + Sync>>,
                },
            )+
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    $($name::$variant { message, .. } => write!(f, $display, message = message),)+
                }
            }
        }

        /// No source: the message carries it.
        impl std::error::Error for $name {}

        impl $name {
            /// Whether the same operation may succeed later.
            pub fn class(&self) -> $crate::ErrorClass {
                match self {
                    $($name::$variant { .. } => $crate::ErrorClass::$class,)+
                }
            }

            /// The engine's error, when there is one, for callers that inspect it.
            pub fn engine_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
                match self {
                    $($name::$variant { source, .. } => source.as_deref(),)+
                }
            }
        }
    };
}

pub(crate) use port_error;

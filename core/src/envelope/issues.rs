//! What is wrong with an envelope, field by field: the errors [`Envelope::decode`] names.
//!
//! [`Envelope::decode`]: super::Envelope::decode

use std::fmt;

use crate::error::ErrorClass;
use crate::id::UuidError;
use crate::name::NameError;
use thiserror::Error;

/// An envelope field, as named in errors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Field {
    /// The envelope as a whole (size, syntax, not an object).
    Envelope,
    /// `job_id`.
    JobId,
    /// `tenant_id`.
    TenantId,
    /// `correlation_id`.
    CorrelationId,
    /// `kind`.
    Kind,
    /// `data`.
    Data,
    /// A top-level key the envelope does not have.
    Unknown(String),
}

impl Field {
    pub(super) fn from_key(key: &str) -> Field {
        match key {
            "job_id" => Field::JobId,
            "tenant_id" => Field::TenantId,
            "correlation_id" => Field::CorrelationId,
            "kind" => Field::Kind,
            "data" => Field::Data,
            other => Field::Unknown(other.to_owned()),
        }
    }

    /// The field's JSON key (`envelope` for the whole).
    pub fn as_str(&self) -> &str {
        match self {
            Field::Envelope => "envelope",
            Field::JobId => "job_id",
            Field::TenantId => "tenant_id",
            Field::CorrelationId => "correlation_id",
            Field::Kind => "kind",
            Field::Data => "data",
            Field::Unknown(key) => key,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is wrong with a field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Problem {
    /// The encoded envelope exceeds the configured limit; it was not parsed.
    #[error("is {size} bytes, over the limit of {limit}")]
    TooLarge {
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// Not valid JSON (or trailing characters after it).
    #[error("is not valid JSON: {0}")]
    Syntax(String),
    /// Valid JSON, but not an object.
    #[error("must be a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// A key appears twice in one object; `path` says where (`kind`, `data.items[3].sku`).
    #[error("duplicate key at `{path}`")]
    DuplicateKey {
        /// The path of the repeated key.
        path: String,
    },
    /// A top-level key the envelope does not define.
    #[error("is not a field of the envelope")]
    UnknownField,
    /// A required field is absent.
    #[error("is missing")]
    Missing,
    /// The field holds the wrong JSON type (`null` included).
    #[error("must be a {expected}, found {found}")]
    WrongType {
        /// The JSON type required.
        expected: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// An id that is not the UUID the field requires.
    #[error("{0}")]
    Uuid(#[from] UuidError),
    /// A kind that breaks the naming rules.
    #[error("{0}")]
    Name(#[from] NameError),
}

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// The field at fault.
    pub field: Field,
    /// What is wrong with it.
    pub problem: Problem,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.problem)
    }
}

/// An envelope that failed validation: poison, never worth retrying.
///
/// It lists every problem found (at least one), like a Zod error's issues, so an operator sees
/// all that is wrong with a message at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeError {
    pub(super) issues: Vec<Issue>,
}

impl EnvelopeError {
    pub(super) fn one(field: Field, problem: Problem) -> Self {
        EnvelopeError {
            issues: vec![Issue { field, problem }],
        }
    }

    /// Every problem found, in field order.
    pub fn issues(&self) -> &[Issue] {
        &self.issues
    }

    /// Whether any issue is about `field`.
    pub fn names(&self, field: &Field) -> bool {
        self.issues.iter().any(|issue| issue.field == *field)
    }

    /// Always [`ErrorClass::Permanent`].
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid envelope: ")?;
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{issue}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EnvelopeError {}

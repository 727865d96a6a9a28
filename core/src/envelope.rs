//! The job envelope, the Rust counterpart of the standard's Zod schema.
//!
//! Every job crosses a transport as the JSON object
//! `{ job_id, tenant_id, correlation_id, kind, data }`. [`Envelope::decode`] is the only way
//! from bytes to an envelope and validates as strictly as Zod's `z.strictObject` does, plus one
//! refusal Zod cannot make: duplicate keys, which `JSON.parse` would silently resolve to the
//! last one.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};
use thiserror::Error;

use crate::error::ErrorClass;
use crate::id::{CorrelationId, JobId, TenantId, UuidError};
use crate::name::{Kind, NameError};

/// The default limit on an encoded envelope, checked before any parsing.
pub const DEFAULT_MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

/// A job: who it is for, what it does, and its data.
///
/// The fields are public because each is already valid by construction; `data` is a
/// [`serde_json::Value`] at the transport and the handler's own type once
/// [`Envelope::into_typed`] succeeds.
///
/// ```
/// use jobs_core::{CorrelationId, Envelope, Kind, TenantId};
/// use serde_json::json;
///
/// let tenant: TenantId = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
/// let correlation: CorrelationId = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?;
/// let envelope = Envelope::new(tenant, correlation, "billing.invoice_issued".parse()?, json!({"invoice": 42}));
///
/// let bytes = envelope.to_json_bytes()?;
/// assert_eq!(Envelope::decode(&bytes)?, envelope);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope<T = Value> {
    /// The job's identity, a UUID version 7 (the default deduplication key).
    pub job_id: JobId,
    /// The tenant the job belongs to.
    pub tenant_id: TenantId,
    /// The business operation the job is part of.
    pub correlation_id: CorrelationId,
    /// What the job does; selects the handler.
    pub kind: Kind,
    /// The kind-specific payload.
    pub data: T,
}

impl<T> Envelope<T> {
    /// A new job with a freshly minted [`JobId`].
    pub fn new(tenant_id: TenantId, correlation_id: CorrelationId, kind: Kind, data: T) -> Self {
        Envelope {
            job_id: JobId::generate(),
            tenant_id,
            correlation_id,
            kind,
            data,
        }
    }

    /// The same job with `data` transformed.
    pub fn map_data<U>(self, f: impl FnOnce(T) -> U) -> Envelope<U> {
        Envelope {
            job_id: self.job_id,
            tenant_id: self.tenant_id,
            correlation_id: self.correlation_id,
            kind: self.kind,
            data: f(self.data),
        }
    }
}

impl<T: Serialize> Envelope<T> {
    /// The wire form: compact JSON that [`Envelope::decode`] turns back into an equal envelope.
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// The same job with its data as JSON, the form the queue ports take.
    pub fn into_json(self) -> Result<Envelope, serde_json::Error> {
        let data = serde_json::to_value(&self.data)?;
        Ok(self.map_data(|_| data))
    }
}

impl Envelope {
    /// Decodes and validates an envelope with the default limits.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
        Envelope::decode_with(bytes, &DecodeLimits::default())
    }

    /// Decodes and validates an envelope, reporting every problem found, each naming its field.
    pub fn decode_with(bytes: &[u8], limits: &DecodeLimits) -> Result<Envelope, EnvelopeError> {
        if bytes.len() > limits.max_bytes {
            return Err(EnvelopeError::one(
                Field::Envelope,
                Problem::TooLarge {
                    size: bytes.len(),
                    limit: limits.max_bytes,
                },
            ));
        }
        if let Some(envelope) = decode_valid(bytes) {
            return Ok(envelope);
        }
        let map = match parse_strict(bytes)? {
            Value::Object(map) => map,
            other => {
                return Err(EnvelopeError::one(
                    Field::Envelope,
                    Problem::NotAnObject {
                        found: json_type(&other),
                    },
                ));
            }
        };
        Fields {
            map,
            issues: vec![],
        }
        .validate()
    }

    /// The same job with `data` deserialised into the handler's type.
    pub fn into_typed<T: DeserializeOwned>(self) -> Result<Envelope<T>, DataError> {
        match T::deserialize(&self.data) {
            Ok(data) => Ok(self.map_data(|_| data)),
            Err(source) => Err(DataError {
                kind: self.kind,
                source,
            }),
        }
    }
}

impl Envelope {
    /// A new job of `J`'s kind carrying `data`, with a freshly minted [`JobId`]: the typed
    /// way to publish, whose kind and data cannot disagree.
    ///
    /// ```
    /// use jobs_core::{CorrelationId, Envelope, JobKind};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct InvoiceIssued {
    ///     invoice: i64,
    /// }
    ///
    /// impl JobKind for InvoiceIssued {
    ///     const KIND: &'static str = "billing.invoice_issued";
    /// }
    ///
    /// let tenant = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?;
    /// let job = Envelope::of(tenant, CorrelationId::generate(), &InvoiceIssued { invoice: 42 })?;
    /// assert_eq!(job.kind.as_str(), "billing.invoice_issued");
    /// assert_eq!(job.data["invoice"], 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of<J: JobKind>(
        tenant_id: TenantId,
        correlation_id: CorrelationId,
        data: &J,
    ) -> Result<Envelope, TypedError> {
        let kind = kind_of::<J>()?;
        let data = serde_json::to_value(data).map_err(|source| TypedError::Data {
            kind: kind.clone(),
            source,
        })?;
        Ok(Envelope::new(tenant_id, correlation_id, kind, data))
    }
}

/// A job kind bound once to its data type: [`Envelope::of`] publishes it, and a worker
/// registers its handler by the data type (`WorkerBuilder::job` in `jobs-consumers`), so a
/// handler can never be registered under a kind whose data it does not take.
pub trait JobKind: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind's name: a valid [`Kind`] (lowercase dotted segments, e.g.
    /// `billing.invoice_issued`).
    const KIND: &'static str;
}

/// The [`Kind`] of `J`, or why its [`JobKind::KIND`] is not a valid kind name.
pub fn kind_of<J: JobKind>() -> Result<Kind, TypedError> {
    J::KIND.parse().map_err(|source| TypedError::Kind {
        name: J::KIND,
        type_name: std::any::type_name::<J>(),
        source,
    })
}

/// Why typed data could not become an envelope.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TypedError {
    /// The type's [`JobKind::KIND`] is not a valid kind name.
    #[error("`{name}`, the JobKind::KIND of {type_name}, is not a valid kind: {source}")]
    Kind {
        /// The name.
        name: &'static str,
        /// The type that declared it.
        type_name: &'static str,
        /// Why it is refused.
        #[source]
        source: NameError,
    },
    /// The data did not serialise to JSON (a map with keys that are not strings, say).
    #[error("the `data` of a `{kind}` job does not serialise to JSON: {source}")]
    Data {
        /// The job's kind.
        kind: Kind,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
}

/// Limits applied by [`Envelope::decode_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    max_bytes: usize,
}

impl DecodeLimits {
    /// Rejects envelopes longer than `max_bytes` before parsing them.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl Default for DecodeLimits {
    /// [`DEFAULT_MAX_ENVELOPE_BYTES`].
    fn default() -> Self {
        DecodeLimits {
            max_bytes: DEFAULT_MAX_ENVELOPE_BYTES,
        }
    }
}

/// `data` did not deserialise into the handler's type: the job is poison.
#[derive(Debug, Error)]
#[error("`data` does not fit kind `{kind}`: {source}")]
pub struct DataError {
    /// The job's kind.
    pub kind: Kind,
    /// What serde said.
    #[source]
    pub source: serde_json::Error,
}

impl DataError {
    /// Always [`ErrorClass::Permanent`]: the same bytes will never fit.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

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
    fn from_key(key: &str) -> Field {
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
    issues: Vec<Issue>,
}

impl EnvelopeError {
    fn one(field: Field, problem: Problem) -> Self {
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

/// The top-level object, consumed field by field.
struct Fields {
    map: Map<String, Value>,
    issues: Vec<Issue>,
}

impl Fields {
    fn validate(mut self) -> Result<Envelope, EnvelopeError> {
        let job_id = self.string_field(Field::JobId, |s| s.parse::<JobId>().map_err(Into::into));
        let tenant_id = self.string_field(Field::TenantId, |s| {
            s.parse::<TenantId>().map_err(Into::into)
        });
        let correlation_id = self.string_field(Field::CorrelationId, |s| {
            s.parse::<CorrelationId>().map_err(Into::into)
        });
        let kind = self.string_field(Field::Kind, |s| s.parse::<Kind>().map_err(Into::into));
        let data = self.map.remove("data");
        if data.is_none() {
            self.issue(Field::Data, Problem::Missing);
        }
        let unknown: Vec<String> = std::mem::take(&mut self.map)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for key in unknown {
            self.issue(Field::Unknown(key), Problem::UnknownField);
        }
        match assembled(job_id, tenant_id, correlation_id, kind, data) {
            Some(envelope) if self.issues.is_empty() => Ok(envelope),
            _ => Err(EnvelopeError {
                issues: self.issues,
            }),
        }
    }

    fn string_field<T>(
        &mut self,
        field: Field,
        parse: impl FnOnce(&str) -> Result<T, Problem>,
    ) -> Option<T> {
        let result = match self.map.remove(field.as_str()) {
            None => Err(Problem::Missing),
            Some(Value::String(s)) => parse(&s),
            Some(other) => Err(Problem::WrongType {
                expected: "string",
                found: json_type(&other),
            }),
        };
        result.map_err(|problem| self.issue(field, problem)).ok()
    }

    fn issue(&mut self, field: Field, problem: Problem) {
        self.issues.push(Issue { field, problem });
    }
}

/// The envelope of its five fields, when each was read.
fn assembled(
    job_id: Option<JobId>,
    tenant_id: Option<TenantId>,
    correlation_id: Option<CorrelationId>,
    kind: Option<Kind>,
    data: Option<Value>,
) -> Option<Envelope> {
    Some(Envelope {
        job_id: job_id?,
        tenant_id: tenant_id?,
        correlation_id: correlation_id?,
        kind: kind?,
        data: data?,
    })
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The valid envelope `bytes` hold, in one pass: the five fields, each once and valid, read
/// straight into their types. `None` for anything else, whatever it is, so that the thorough
/// path ([`parse_strict`], then [`Fields::validate`]) names every problem; it accepts exactly
/// these envelopes, equal field for field (a property test holds the two to it), only slower:
/// it builds the top-level object, its keys and its strings first.
fn decode_valid(bytes: &[u8]) -> Option<Envelope> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let envelope = de::Deserializer::deserialize_map(
        &mut de,
        ValidEnvelope {
            duplicate: &duplicate,
        },
    )
    .ok()?;
    de.end().ok()?;
    Some(envelope)
}

/// [`decode_valid`]'s visitor of the top-level object.
struct ValidEnvelope<'a> {
    duplicate: &'a RefCell<Option<Vec<Step>>>,
}

/// A top-level key, read without copying it.
enum Key {
    JobId,
    TenantId,
    CorrelationId,
    Kind,
    Data,
    /// Not a field of the envelope.
    Unknown,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field of the envelope")
            }

            fn visit_str<E>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "job_id" => Key::JobId,
                    "tenant_id" => Key::TenantId,
                    "correlation_id" => Key::CorrelationId,
                    "kind" => Key::Kind,
                    "data" => Key::Data,
                    _ => Key::Unknown,
                })
            }
        }

        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// A string field parsed as `T`, without copying the string when it holds no escapes.
struct Parsed<T>(T);

impl<'de, T: std::str::FromStr> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ParsedVisitor<T>(std::marker::PhantomData<T>);

        impl<T: std::str::FromStr> Visitor<'_> for ParsedVisitor<T> {
            type Value = Parsed<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a valid string")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Parsed<T>, E> {
                v.parse().map(Parsed).map_err(|_| E::custom("not valid"))
            }
        }

        deserializer.deserialize_str(ParsedVisitor(std::marker::PhantomData))
    }
}

impl<'de> Visitor<'de> for ValidEnvelope<'_> {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a valid envelope")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Envelope, A::Error> {
        fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(E::custom("duplicate key")),
            }
        }
        let (mut job_id, mut tenant_id, mut correlation_id, mut kind, mut data) =
            (None, None, None, None, None);
        while let Some(key) = access.next_key::<Key>()? {
            match key {
                Key::JobId => once(&mut job_id, access.next_value::<Parsed<JobId>>()?.0)?,
                Key::TenantId => once(&mut tenant_id, access.next_value::<Parsed<TenantId>>()?.0)?,
                Key::CorrelationId => once(
                    &mut correlation_id,
                    access.next_value::<Parsed<CorrelationId>>()?.0,
                )?,
                Key::Kind => once(&mut kind, access.next_value::<Parsed<Kind>>()?.0)?,
                Key::Data => {
                    let strict = StrictValue {
                        duplicate: self.duplicate,
                    };
                    once(&mut data, access.next_value_seed(strict)?)?;
                }
                Key::Unknown => return Err(de::Error::custom("not a field of the envelope")),
            }
        }
        assembled(job_id, tenant_id, correlation_id, kind, data)
            .ok_or_else(|| de::Error::custom("a field is missing"))
    }
}

/// A step of the path to a duplicate key, recorded innermost first while the error unwinds.
enum Step {
    Key(String),
    Index(usize),
}

/// Parses JSON into a [`Value`], refusing duplicate keys at any depth.
fn parse_strict(bytes: &[u8]) -> Result<Value, EnvelopeError> {
    let duplicate = RefCell::new(None::<Vec<Step>>);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = StrictValue {
        duplicate: &duplicate,
    }
    .deserialize(&mut de)
    .and_then(|value| de.end().map(|()| value));
    parsed.map_err(|e| match duplicate.into_inner() {
        Some(mut steps) => {
            steps.reverse();
            let field = match steps.first() {
                Some(Step::Key(key)) => Field::from_key(key),
                _ => Field::Envelope,
            };
            EnvelopeError::one(
                field,
                Problem::DuplicateKey {
                    path: render_path(&steps),
                },
            )
        }
        None => EnvelopeError::one(Field::Envelope, Problem::Syntax(e.to_string())),
    })
}

fn render_path(steps: &[Step]) -> String {
    let mut path = String::new();
    for step in steps {
        match step {
            Step::Key(key) if path.is_empty() => path.push_str(key),
            Step::Key(key) => {
                path.push('.');
                path.push_str(key);
            }
            Step::Index(i) => path.push_str(&format!("[{i}]")),
        }
    }
    path
}

#[derive(Clone, Copy)]
struct StrictValue<'a> {
    duplicate: &'a RefCell<Option<Vec<Step>>>,
}

impl StrictValue<'_> {
    /// Records that the failing child sits under `step`, if the failure is a duplicate key.
    fn under(&self, step: impl FnOnce() -> Step) {
        if let Some(steps) = self.duplicate.borrow_mut().as_mut() {
            steps.push(step());
        }
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            match seq.next_element_seed(self) {
                Ok(Some(item)) => items.push(item),
                Ok(None) => return Ok(Value::Array(items)),
                Err(e) => {
                    self.under(|| Step::Index(items.len()));
                    return Err(e);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = match access.next_value_seed(self) {
                Ok(value) => value,
                Err(e) => {
                    self.under(|| Step::Key(key));
                    return Err(e);
                }
            };
            match map.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(slot) => {
                    *self.duplicate.borrow_mut() = Some(vec![Step::Key(slot.key().clone())]);
                    return Err(de::Error::custom("duplicate key"));
                }
            }
        }
        Ok(Value::Object(map))
    }
}

impl<'de> Deserialize<'de> for Envelope {
    /// Deserialises through the same strict rules as [`Envelope::decode`], for envelopes
    /// embedded in larger documents. Prefer `decode` on raw bytes: it also enforces the size
    /// limit and rejects duplicate keys.
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let Value::Object(map) = value else {
            return Err(de::Error::custom(EnvelopeError::one(
                Field::Envelope,
                Problem::NotAnObject {
                    found: json_type(&value),
                },
            )));
        };
        Fields {
            map,
            issues: vec![],
        }
        .validate()
        .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The thorough path alone: what `decode_with` did before its one-pass path.
    fn thorough(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
        match parse_strict(bytes)? {
            Value::Object(map) => Fields {
                map,
                issues: vec![],
            }
            .validate(),
            other => Err(EnvelopeError::one(
                Field::Envelope,
                Problem::NotAnObject {
                    found: json_type(&other),
                },
            )),
        }
    }

    /// Values a field may hold: valid ones often, the wrong type or a near miss sometimes.
    fn field_value(valid: &'static str) -> impl Strategy<Value = String> {
        prop_oneof![
            6 => Just(format!("{valid:?}")),
            1 => Just("null".to_owned()),
            1 => Just("42".to_owned()),
            1 => Just(format!("{:?}", &valid[1..])),
            1 => Just(format!("{:?}", valid.to_uppercase())),
            1 => Just(format!("\"{}\"", valid.replace('a', "\\u0061"))),
        ]
    }

    fn data_value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"n": 1}"#.to_owned()),
            Just(r#"{"n": 1, "n": 2}"#.to_owned()),
            Just(r#"[1, {"a": [true, null]}]"#.to_owned()),
            Just(r#"{"a": {"b": 1, "b": 2}}"#.to_owned()),
            Just("null".to_owned()),
            Just(r#""text""#.to_owned()),
        ]
    }

    /// The envelope's five fields, any of them off (the wrong type, a near miss, escaped),
    /// in any order, now and then one missing, one twice, a stranger or trailing bytes.
    fn object() -> impl Strategy<Value = String> {
        let fields = (
            field_value("0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19"),
            field_value("0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"),
            field_value("3c4d5e6f-1a2b-4c3d-8e9f-0a1b2c3d4e5f"),
            field_value("billing.invoice_issued"),
            data_value(),
        )
            .prop_map(|(job, tenant, correlation, kind, data)| {
                vec![
                    format!(r#""job_id": {job}"#),
                    format!(r#""tenant_id": {tenant}"#),
                    format!(r#""correlation_id": {correlation}"#),
                    format!(r#""kind": {kind}"#),
                    format!(r#""data": {data}"#),
                ]
            });
        let odd = prop_oneof![
            6 => Just(None),
            1 => (0..5usize).prop_map(|i| Some(("drop", i))),
            1 => (0..5usize).prop_map(|i| Some(("twice", i))),
            1 => Just(Some(("extra", 0))),
        ];
        (
            fields,
            odd,
            prop_oneof![6 => Just(""), 1 => Just(" x"), 1 => Just(" ")],
        )
            .prop_flat_map(|(mut entries, odd, tail)| {
                match odd {
                    Some(("drop", i)) => drop(entries.remove(i)),
                    Some(("twice", i)) => entries.push(entries[i].clone()),
                    Some(_) => entries.push(r#""extra": 1"#.to_owned()),
                    None => {}
                }
                Just(entries)
                    .prop_shuffle()
                    .prop_map(move |entries| format!("{{{}}}{tail}", entries.join(", ")))
            })
    }

    /// The five fields once each, valid, in any order.
    fn valid() -> impl Strategy<Value = String> {
        Just(vec![
            r#""job_id": "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19""#,
            r#""tenant_id": "0B6C5E5A-3C1F-4D8E-9A57-2F1E4C6B7D90""#,
            r#""correlation_id": "3c4d5e6f-1a2b-4c3d-8e9f-0a1b2c3d4e5f""#,
            r#""kind": "billing.invoice_issued""#,
            r#""data": {"n": [1, 2.5, "x", null, {"deep": true}]}"#,
        ])
        .prop_shuffle()
        .prop_map(|entries| format!("{{{}}}", entries.join(",")))
    }

    proptest! {
        #[test]
        fn the_one_pass_path_agrees_with_the_thorough_one(bytes in object()) {
            let fast = decode_valid(bytes.as_bytes());
            let thorough = thorough(bytes.as_bytes());
            match (&fast, &thorough) {
                (Some(fast), Ok(thorough)) => prop_assert_eq!(fast, thorough),
                (Some(fast), Err(e)) => prop_assert!(false, "accepted {fast:?}, refused {e}: {bytes}"),
                (None, Ok(thorough)) => prop_assert!(false, "only the thorough path took {thorough:?}: {bytes}"),
                (None, Err(_)) => {}
            }
            prop_assert_eq!(Envelope::decode(bytes.as_bytes()), thorough);
        }

        #[test]
        fn the_one_pass_path_takes_every_valid_envelope(bytes in valid()) {
            prop_assert!(decode_valid(bytes.as_bytes()).is_some(), "{}", bytes);
        }
    }
}

//! From bytes to an envelope: one pass for a valid envelope, and a thorough one that names
//! every problem of any other.

use std::cell::RefCell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

use super::{Envelope, EnvelopeError, Field, Issue, Problem};
use crate::id::{CorrelationId, JobId, TenantId};
use crate::name::Kind;

/// The envelope a JSON value holds, or every problem with it: the thorough path, naming each
/// problem's field.
pub(super) fn validated(value: Value) -> Result<Envelope, EnvelopeError> {
    match value {
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

/// The envelope `bytes` hold, or every problem with them, a duplicate key included.
pub(super) fn thorough(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
    validated(parse_strict(bytes)?)
}

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
pub(super) fn valid(bytes: &[u8]) -> Option<Envelope> {
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

/// [`valid`]'s visitor of the top-level object.
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

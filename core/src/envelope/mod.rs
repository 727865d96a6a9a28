//! The job envelope, the Rust counterpart of the standard's Zod schema.
//!
//! Every job crosses a transport as the JSON object
//! `{ job_id, tenant_id, correlation_id, kind, data }`. [`Envelope::decode`] is the only way
//! from bytes to an envelope and validates as strictly as Zod's `z.strictObject` does, plus one
//! refusal Zod cannot make: duplicate keys, which `JSON.parse` would silently resolve to the
//! last one.

mod decode;
mod issues;

pub use issues::{EnvelopeError, Field, Issue, Problem};

use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::error::ErrorClass;
use crate::id::{CorrelationId, JobId, TenantId};
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
        match decode::valid(bytes) {
            Some(envelope) => Ok(envelope),
            None => decode::thorough(bytes),
        }
    }

    /// The same job with `data` deserialised into the handler's type.
    pub fn into_typed<T: DeserializeOwned>(self) -> Result<Envelope<T>, DataError> {
        match serde_path_to_error::deserialize(&self.data) {
            Ok(data) => Ok(self.map_data(|_| data)),
            Err(e) => Err(DataError {
                kind: self.kind,
                path: e.path().to_string(),
                source: e.into_inner(),
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

    /// The longest envelope, in bytes, these limits accept.
    pub fn max_envelope_bytes(&self) -> usize {
        self.max_bytes
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
///
/// Its message names where in `data` and what was expected, never the value found: it goes
/// to `last_error`, the logs and the alerts, which must not carry what a payload holds (a
/// producer's personal data, or markup aimed at whoever reads them).
/// [`DataError::with_values`] is serde's own message, for debugging.
#[derive(Debug)]
pub struct DataError {
    /// The job's kind.
    pub kind: Kind,
    /// Where in `data` serde stopped, e.g. `items[3].sku` (`.` for `data` itself).
    pub path: String,
    /// What serde said, values included.
    pub source: serde_json::Error,
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, said, at) = (&self.kind, redact(&self.source.to_string()), self.at());
        write!(f, "`data` does not fit kind `{kind}`: {said} at `{at}`")
    }
}

impl std::error::Error for DataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl DataError {
    /// Always [`ErrorClass::Permanent`]: the same bytes will never fit.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }

    /// The message with the values serde quoted: for debugging only.
    pub fn with_values(&self) -> String {
        format!(
            "`data` does not fit kind `{}`: {} at `{}`",
            self.kind,
            self.source,
            self.at()
        )
    }

    fn at(&self) -> String {
        match self.path.as_str() {
            "." | "" => "data".to_owned(),
            path => format!("data.{path}"),
        }
    }
}

/// serde's message without the values it quotes: `invalid type: string "<b>", expected u64`
/// becomes `invalid type: string, expected u64`; `invalid value: integer `7`, expected …` and
/// `unknown variant `x`, expected …` lose the quoted value; names of the handler's own fields
/// (`missing field `x``) stay, and so does the position serde adds.
fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest.as_bytes()[start] as char;
        let before = &rest[..start];
        let value_follows = quote == '"'
            || ["invalid value: ", "invalid type: ", "unknown variant "]
                .iter()
                .any(|lead| before.contains(lead) && !before.contains(", expected"));
        let Some(end) = find_closing(&rest[start + 1..], quote) else {
            break;
        };
        let quoted = &rest[start..start + 1 + end + 1];
        if value_follows {
            out.push_str(before.trim_end_matches(' '));
        } else {
            out.push_str(before);
            out.push_str(quoted);
        }
        rest = &rest[start + quoted.len()..];
    }
    out.push_str(rest);
    out
}

/// Where `quote` closes `text` (which follows the opening one), past escaped quotes.
fn find_closing(text: &str, quote: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            '\\' if quote == '"' && !escaped => escaped = true,
            c if c == quote && !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

impl<'de> Deserialize<'de> for Envelope {
    /// Deserialises through the same strict rules as [`Envelope::decode`], for envelopes
    /// embedded in larger documents. Prefer `decode` on raw bytes: it also enforces the size
    /// limit and rejects duplicate keys.
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        decode::validated(Value::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::decode::{thorough, valid as decode_valid};
    use super::*;
    use proptest::prelude::*;

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

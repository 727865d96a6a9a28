//! The envelope's JSON Schema, generated from the same constants the validator uses.
//!
//! `cargo xtask schema` writes it to `core/schema/envelope.schema.json`, the file other
//! languages and tools read; a test fails when the committed file is stale.

use serde_json::{Value, json};

use crate::id::{UUID_PATTERN, UUIDV7_PATTERN};
use crate::name::{MAX_NAME_LEN, NAME_PATTERN};

/// The JSON Schema (draft 2020-12) of an encoded envelope.
///
/// Two rules of [`crate::Envelope::decode`] are beyond JSON Schema and stated in the
/// description only: duplicate keys are refused, and so is an envelope over the size limit.
pub fn envelope() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:softcrum:jobs:envelope:v2",
        "title": "Job envelope",
        "description": "A job as it crosses a queue. Decoders also refuse duplicate keys at any depth and envelopes over the configured size limit (1 MiB by default).",
        "type": "object",
        "additionalProperties": false,
        "required": ["job_id", "tenant_id", "correlation_id", "kind", "data"],
        "properties": {
            "job_id": {
                "description": "The job's identity: a UUID version 7 with the RFC 9562 variant (Zod 4 z.uuidv7()).",
                "type": "string",
                "pattern": UUIDV7_PATTERN,
            },
            "tenant_id": {
                "description": "The tenant: a UUID as Zod 4 z.uuid() accepts it.",
                "type": "string",
                "pattern": UUID_PATTERN,
            },
            "correlation_id": {
                "description": "The business operation: a UUID as Zod 4 z.uuid() accepts it.",
                "type": "string",
                "pattern": UUID_PATTERN,
            },
            "kind": {
                "description": "What the job does: dotted lowercase segments, e.g. billing.invoice_issued.",
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_NAME_LEN,
                "pattern": NAME_PATTERN,
            },
            "data": {
                "description": "The kind's payload: any JSON value, null included; its shape is the handler's."
            }
        }
    })
}

//! Envelopes and identifiers for tests.

use jobs_core::{CorrelationId, Envelope, JobId, Kind, TenantId};
use serde_json::{Value, json};

/// A tenant id derived from `n`, so tests can speak of "tenant 1" and "tenant 2".
pub fn tenant(n: u32) -> TenantId {
    format!("00000000-0000-4000-8000-{n:012x}")
        .parse()
        .expect("a valid version 4 UUID")
}

/// A fresh correlation id.
pub fn correlation() -> CorrelationId {
    JobId::generate()
        .to_string()
        .parse()
        .expect("a version 7 UUID is a valid correlation id")
}

/// A kind from a string known to be valid.
pub fn kind(name: &str) -> Kind {
    name.parse().expect("a valid kind")
}

/// An envelope of kind `test.job` for `tenant(tenant_no)` carrying `{"n": n}`.
pub fn envelope(tenant_no: u32, n: u64) -> Envelope {
    envelope_with(tenant_no, "test.job", json!({ "n": n }))
}

/// An envelope of `kind` for `tenant(tenant_no)` carrying `data`.
pub fn envelope_with(tenant_no: u32, kind_name: &str, data: Value) -> Envelope {
    Envelope::new(tenant(tenant_no), correlation(), kind(kind_name), data)
}

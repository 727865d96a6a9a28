//! Envelopes and identifiers for tests.

use jobs_core::{CorrelationId, Envelope, JobId, Kind, NewDeadLetter, QueueName, TenantId};
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

/// A dead letter of `payload` on `queue` with `last_error`, of no job, tenant or kind (what a
/// broken payload leaves), one attempt, no reason recorded and no dedup key: for tests that
/// need letters in a store rather than a worker that makes them.
pub fn raw_letter(queue: &str, payload: &[u8], last_error: &str) -> NewDeadLetter {
    NewDeadLetter {
        job_id: None,
        queue: queue.parse::<QueueName>().expect("a valid queue name"),
        consumer: None,
        tenant_id: None,
        kind: None,
        correlation_id: None,
        payload: payload.to_vec(),
        attempts: 1,
        last_error: last_error.to_owned(),
        reason: None,
        dedup_key: None,
        at: std::time::SystemTime::now(),
    }
}

//! What every Redis test needs: where Redis is, and a key prefix of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `REDIS_URL`, default `redis://127.0.0.1:6379`.
pub(crate) fn url() -> String {
    std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())
}

/// A prefix no other test (or earlier run) uses.
pub(crate) fn unique_prefix(test: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("jobs-test:{test}:{}:{n}:{nanos}", std::process::id())
}

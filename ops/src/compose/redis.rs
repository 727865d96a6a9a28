//! Redis: the rate limiter (`redis://…`, `rediss://…`), and an approximate depth for a
//! transport that reports none ([`DEPTH_URL`](super::DEPTH_URL)).

use std::sync::Arc;

use jobs_adapter_redis::{CountedQueue, DEFAULT_HORIZON, RedisRateLimiter};
use jobs_core::{ConsumerPort, QueuePort, RateLimiter};

use super::{Adapter, ComposeError, Config, DEPTH_URL, Queue, RATE_LIMIT_PREFIX, RATE_LIMIT_URL};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "redis",
    store: None,
    queue: None,
    rate_limiter: Some(rate_limiter),
    alerter: None,
    depth: Some(counted),
};

/// Token buckets in Redis at `url`, under [`RATE_LIMIT_PREFIX`]; it connects on first use.
fn rate_limiter(config: &Config, url: &str) -> Result<Arc<dyn RateLimiter>, ComposeError> {
    let prefix = config.require(&RATE_LIMIT_PREFIX)?;
    let limiter = RedisRateLimiter::new(url, prefix).map_err(|e| RATE_LIMIT_URL.invalid(e))?;
    Ok(Arc::new(limiter))
}

/// The transport of `scheme` (its `publisher` and `consumer` sides) counted in Redis at `url`
/// (keys `jobs:depth:<queue>`). Publishers and workers must all go through the count for it
/// to hold; a count that misses an ack is repaired after [`DEFAULT_HORIZON`].
fn counted(
    url: &str,
    scheme: &str,
    publisher: Arc<dyn QueuePort>,
    consumer: Arc<dyn ConsumerPort>,
) -> Result<Queue, ComposeError> {
    let client = jobs_adapter_redis::redis::Client::open(url).map_err(|e| DEPTH_URL.invalid(e))?;
    let counted = CountedQueue::new(publisher, consumer, client, "jobs", DEFAULT_HORIZON);
    Ok(Queue::pull(scheme, counted, true))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{ConfigFile, rate_limiter};

    #[test]
    fn the_limiter_composes_without_connecting() {
        let flags = BTreeMap::from([("--rate-limit-url", "redis://127.0.0.1:6379".to_owned())]);
        let config =
            super::Config::resolve(&flags, &|_| None, &ConfigFile::None).expect("resolves");
        rate_limiter(&config).expect("Redis connects on first use");
    }
}

//! The adapter against Vercel's own offline emulator (`emulator`) and against the
//! fault-injecting fake for what the emulator lacks (`fake`).

mod emulator;
mod fake;

use std::sync::Arc;

use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};
use jobs_core::Clock;

/// An adapter configured for `base_url`, consuming as `group`.
pub(crate) fn adapter(base_url: &str, group: &str, clock: Arc<dyn Clock>) -> VercelQueues {
    let config = VercelQueuesConfig::new(Region::new("iad1").unwrap(), StaticToken::new("test"))
        .base_url_override(base_url)
        .unwrap()
        .consumer_group(group)
        .unwrap();
    VercelQueues::with_clock(config, clock).unwrap()
}

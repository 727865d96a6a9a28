//! The in-memory queue and store: the embedded default transport and the test double of every
//! other.
//!
//! [`MemoryQueue`] implements both sides of the queue ports with the semantics the real
//! transports share: delayed and scheduled delivery, leases that expire and redeliver, a
//! delivery count per message, deduplication by key within a window, depth per queue, and fair
//! dequeue across tenants when a worker asks for it
//! ([`PullPort::share_by_tenant`](jobs_core::PullPort::share_by_tenant)). Time comes from a
//! [`Clock`](jobs_core::Clock), so a test moves a [`jobs_core::ManualClock`] instead of
//! sleeping. [`MemoryStore`] holds `processed_jobs` and dead letters with the same semantics as
//! the SQL stores; its [`MemoryWorkTx`] is a [`GroupTransaction`](jobs_core::GroupTransaction),
//! and the queue settles inside it ([`SettleInTransaction`](jobs_core::SettleInTransaction)),
//! so a grouped worker runs in memory too. [`MemoryRateLimiter`] keeps token buckets with the
//! semantics of the Redis limiter. Nothing survives the process: use them for tests, demos and
//! single-process tools.
//!
//! The modules depend one way: `grouped` uses `queue` and `tx`, and `tx` uses `store`. A
//! transaction keeps the messages it took behind a trait of its own, so that neither `tx` nor
//! `store` names the queue.

mod grouped;
mod queue;
mod rate;
mod store;
mod tenants;
mod tx;

pub use queue::{DEFAULT_DEDUP_WINDOW, MemoryQueue};
pub use rate::MemoryRateLimiter;
pub use store::MemoryStore;
pub use tenants::MemoryTenantDirectory;
pub use tx::MemoryWorkTx;

//! The PostgreSQL adapter against a real PostgreSQL: the store contract suite, the tenant
//! directory and partition pre-creation, and with the feature `queue` the queue contract suite,
//! the runtime's model on the queue and the outbox. One test binary, one shared database helper.

mod db;
#[cfg(feature = "queue")]
mod depth;
#[cfg(feature = "queue")]
mod effects;
#[cfg(feature = "queue")]
mod grouped;
#[cfg(feature = "queue")]
mod mark;
#[cfg(feature = "queue")]
mod outbox;
#[cfg(feature = "queue")]
mod oversized;
mod partitions;
mod processed;
#[cfg(feature = "queue")]
mod queue;
mod snapshots;
mod store;
mod tenants;
#[cfg(feature = "test-util")]
mod test_util;

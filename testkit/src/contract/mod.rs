//! Contract suites: what every implementation of a port must do, whatever the engine.
//!
//! Each suite is an async function taking a factory for fresh instances. It runs its checks
//! one after another, each on a fresh instance and its own queue names, and panics with the
//! name of the first check that fails. Ordering of deliveries is never assumed.

pub mod fairness;
pub mod listing;
pub mod queue;
pub mod rate;
pub mod store;

//! Local fakes of the HTTP vendors the adapters talk to.
//!
//! Each fake is a small axum server bound to `127.0.0.1` on an ephemeral port, started by an
//! async `start` and stopped when dropped. It reproduces the vendor's wire format (paths,
//! authentication, status codes, error bodies) closely enough for an adapter's tests to run
//! against it instead of the real service, records what it accepted for assertions, and has
//! fault hooks (`fail_next`) to make the next requests answer an error status.
//!
//! The fakes know nothing of the adapters: they speak HTTP and JSON, so this crate still depends
//! on `jobs-core` only.
//!
//! - [`betterstack`]: BetterStack Uptime's create-incident endpoint.

pub mod betterstack;
pub mod resend;

pub use betterstack::FakeBetterStack;

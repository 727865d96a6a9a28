//! The ports and the validated envelope of softcrum-jobs.
//!
//! Everything else in the workspace depends on this crate and on nothing else of the
//! workspace: the worker runtime, notifications and cron see transports only through the
//! traits defined here, and adapters implement them. It does no I/O of its own.
//!
//! - [`Envelope`]: `{ job_id, tenant_id, correlation_id, kind, data }`, decoded only through
//!   the strict [`Envelope::decode`], whose errors name the field at fault.
//! - [`QueuePort`]: publish and schedule. [`SettlePort`]: ack, retry at a time, defer,
//!   extend, what every consuming transport offers; [`PullPort`]: receive with a lease and the
//!   wake-up hint; [`ConsumerPort`]: both, a pull transport. [`QueueDepth`]: an optional capability. [`SettleInTransaction`]:
//!   the capability of a queue in the store's own database, settling inside the work
//!   transaction.
//! - [`WorkStore`] and [`WorkTransaction`]: the idempotent work transaction over
//!   `core.processed_jobs`; [`GroupTransaction`], one holding a group of jobs.
//!   [`DeadLetterStore`]: `core.dead_letters`. [`BulkRuns`]: the journal of bulk replays and
//!   discards, shared by every operator's tool. [`ProcessedJobs`]: TTL cleanup.
//! - [`RateLimiter`]: token buckets per provider and per tenant. [`TenantDirectory`]: the
//!   tenants a cron fan-out reaches.
//! - [`Alerter`]: raising alerts. [`Clock`]: time as a port, with [`ManualClock`] for tests.
//!
//! With the `mock` feature, every port has a `mockall` mock (`MockQueuePort`, …) for the unit
//! tests of downstream modules.

mod alert;
mod clock;
mod depth;
mod email;
mod envelope;
mod error;
mod id;
mod name;
mod queue;
mod rate;
mod retry_after;
pub mod schema;
mod store;
mod tenants;

#[cfg(feature = "mock")]
pub use alert::MockAlerter;
pub use alert::{Alert, AlertError, Alerter};
pub use clock::{Clock, ManualClock, SystemClock};
#[cfg(feature = "mock")]
pub use depth::MockQueueDepth;
pub use depth::{Depth, DepthCounts, QueueDepth};
#[cfg(feature = "mock")]
pub use email::MockEmailProvider;
pub use email::{Email, EmailError, EmailProvider};
pub use envelope::{
    DEFAULT_MAX_ENVELOPE_BYTES, DataError, DecodeLimits, Envelope, EnvelopeError, Field, Issue,
    JobKind, Problem, TypedError, kind_of,
};
pub use error::ErrorClass;
pub use id::{CorrelationId, JobId, TenantId, UUID_PATTERN, UUIDV7_PATTERN, UuidError};
pub use name::{
    ConsumerName, Kind, MAX_NAME_LEN, NAME_PATTERN, NameError, PROCESSED_JOBS_CLEANUP_KIND,
    QueueName,
};
pub use queue::{
    ConsumerPort, Delivery, Lease, LeaseLimits, MAX_WAIT, PublishOptions, PullPort, QueueError,
    QueuePort, Receipt, SettleInTransaction, SettlePort, Settlement, TenantFairness, TenantWeights,
    Unsupported, later,
};
#[cfg(feature = "mock")]
pub use queue::{MockPullPort, MockQueuePort, MockSettlePort, MockTenantWeights};
#[cfg(feature = "mock")]
pub use rate::MockRateLimiter;
pub use rate::{Acquired, Bucket, BucketKey, RateLimitError, RateLimiter};
pub use retry_after::{MAX_RETRY_AFTER, parse_http_date, parse_retry_after};
pub use store::{
    BulkRun, BulkRunId, BulkRuns, Claim, DeadLetter, DeadLetterEvent, DeadLetterFilter,
    DeadLetterId, DeadLetterReason, DeadLetterStatus, DeadLetterStore, GroupTransaction,
    ListedLetter, NewDeadLetter, ProcessedJobs, Recorded, Resolution, StoreError, Transition,
    UnreadableLetter, WorkStore, WorkTransaction,
};
#[cfg(feature = "mock")]
pub use store::{MockBulkRuns, MockDeadLetterStore, MockProcessedJobs};
#[cfg(feature = "mock")]
pub use tenants::MockTenantDirectory;
pub use tenants::{DirectoryError, Tenant, TenantDirectory, TenantPage};

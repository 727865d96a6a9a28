//! Upstash QStash as a transport of softcrum-jobs: publishing through its REST API, and
//! consuming its signed push deliveries with the worker runtime.
//!
//! - [`QStashQueue`] is the [`QueuePort`]: `publish` and `schedule` are
//!   `POST /v2/publish/{url}` (or `/v2/enqueue/{queue}/{url}` for a QStash queue) to the
//!   [`Destination`] configured for the [`QueueName`](jobs_core::QueueName), with
//!   `Upstash-Deduplication-Id` = the dedup key, `Upstash-Delay` / `Upstash-Not-Before`, and
//!   `Upstash-Retries` / `Upstash-Retry-Delay` from the queue's [`RetrySchedule`]; a
//!   duplicate (202) is a duplicate receipt. [`QStashQueue::publish_batch`] uses `/v2/batch`.
//!   It is also the [`QueueDepth`] of QStash queues (their `lag`), and has QStash's DLQ
//!   (`dlq_list`, `dlq_retry`, `dlq_delete`) and schedules (`schedule_upsert`, `schedules`,
//!   `schedule_delete`) as extra operations; our `core.dead_letters` stays the source of truth.
//! - [`Receiver`] verifies a delivery's `Upstash-Signature` before anything else
//!   ([`verify_signature`]), turns it into one leased delivery of a [`PushConsumer`] (the
//!   worker's [`SettlePort`](jobs_core::SettlePort)), and answers with the runtime's
//!   settlement: 2xx, 489 with `Upstash-NonRetryable-Error`, or 5xx with `Retry-After`.
//!
//! QStash pushes each message when it chooses, so a worker over it cannot fetch fairly across
//! tenants: one asked to (`WorkerBuilder::fair` in `jobs-consumers`) fails to build, saying
//! so. QStash's own per-key limit, flow control, caps one tenant's deliveries under way
//! instead: [`Destination::tenant_parallelism`].
//!
//! Nothing here depends on a web framework; `examples/axum_receiver.rs` mounts the receiver on
//! an axum route. See `docs/adr/0010-qstash-adapter.md`.
//!
//! [`QueuePort`]: jobs_core::QueuePort
//! [`QueueDepth`]: jobs_core::QueueDepth

mod client;
mod config;
mod error;
mod receiver;
mod signature;

pub use client::{BatchItem, DlqMessage, DlqPage, QStashQueue, Schedule};
pub use config::{
    DEFAULT_BASE_URL, DEFAULT_DELIVERY_TIMEOUT, DEFAULT_TIMEOUT, Destination, QStashConfig,
    QUEUE_PLACEHOLDER, RetrySchedule,
};
pub use error::QStashError;
pub use receiver::{
    NON_RETRYABLE_STATUS, Processed, PushConsumer, PushRequest, PushResponse, Receiver,
};
pub use signature::{
    Claims, DEFAULT_CLOCK_TOLERANCE, ISSUER, KeyUsed, SignatureError, SigningKeys, Verified,
    body_hash, verify_signature,
};

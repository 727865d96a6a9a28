//! The queue ports: publishing jobs, and the consuming side a worker runtime drives.
//!
//! Both sides are small object-safe traits so that crates hold `Arc<dyn QueuePort>` and the
//! composition root alone decides which transport is behind it. Optional capabilities (queue
//! depth) are traits of their own: a transport that cannot report depth
//! simply does not implement [`QueueDepth`](crate::QueueDepth).

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use thiserror::Error;

use crate::envelope::{DecodeLimits, Envelope};
use crate::error::ErrorClass;
use crate::id::{JobId, TenantId};
use crate::name::{ConsumerName, QueueName};
use crate::store::{Claim, GroupTransaction, StoreError, WorkStore};

/// The longest any job may wait or be leased: a hundred years, beyond every transport's
/// retention. Times asked for beyond it are refused ([`later`]).
pub const MAX_WAIT: Duration = Duration::from_secs(36_500 * 86_400);

/// `now + by` for a time a caller asked for (`what`: a delay, a lease), or
/// [`QueueError::Rejected`] naming it when `by` is beyond [`MAX_WAIT`], so that no value,
/// however absurd, overflows the clock.
pub fn later(
    queue: &QueueName,
    now: SystemTime,
    by: Duration,
    what: &str,
) -> Result<SystemTime, QueueError> {
    match now.checked_add(by) {
        Some(at) if by <= MAX_WAIT => Ok(at),
        _ => Err(QueueError::Rejected {
            queue: queue.clone(),
            reason: format!("a {what} of {by:?} is beyond the longest wait, {MAX_WAIT:?}"),
        }),
    }
}

/// How a job is published.
///
/// ```
/// use jobs_core::PublishOptions;
/// use std::time::Duration;
///
/// let opts = PublishOptions::default().delay(Duration::from_secs(60)).dedup_key("invoice-42");
/// assert_eq!(opts.delay_value(), Some(Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishOptions {
    delay: Option<Duration>,
    run_at: Option<SystemTime>,
    dedup_key: Option<String>,
}

impl PublishOptions {
    /// Delivers the job no earlier than `delay` from now.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Delivers the job no earlier than `run_at` (at once when it is past): the standard's
    /// `schedule`. A publish given both this and a delay is refused.
    pub fn run_at(mut self, run_at: SystemTime) -> Self {
        self.run_at = Some(run_at);
        self
    }

    /// The requested time, if any ([`PublishOptions::run_at`]).
    pub fn run_at_value(&self) -> Option<SystemTime> {
        self.run_at
    }

    /// How long after `now` (a transport's clock) the job becomes visible, for transports
    /// that take a delay: the delay asked for, or the time until `run_at`; `None` for at once.
    /// Refuses both at once, and a delay beyond [`MAX_WAIT`].
    pub fn delay_from(
        &self,
        queue: &QueueName,
        now: SystemTime,
    ) -> Result<Option<Duration>, QueueError> {
        let at = self.visible_at(queue, now)?;
        Ok(match (self.delay, self.run_at) {
            (None, None) => None,
            _ => Some(at.duration_since(now).unwrap_or_default()),
        })
    }

    /// Overrides the deduplication key (by default the job id): a second publish with the same
    /// key within the transport's window is dropped and answered with the first receipt.
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// The requested delay, if any.
    pub fn delay_value(&self) -> Option<Duration> {
        self.delay
    }

    /// When a job published at `now` with these options becomes visible: `now` plus the delay,
    /// or `run_at` (`now` when it is past); [`QueueError::Rejected`] for both at once, or for a
    /// delay or a time beyond [`MAX_WAIT`] (an absurd delay is refused, never an overflow).
    pub fn visible_at(&self, queue: &QueueName, now: SystemTime) -> Result<SystemTime, QueueError> {
        match (self.delay, self.run_at) {
            (Some(_), Some(_)) => Err(QueueError::Rejected {
                queue: queue.clone(),
                reason: "a publish takes a delay or a run_at, not both".to_owned(),
            }),
            (_, Some(at)) => {
                let wait = at.duration_since(now).unwrap_or_default();
                later(queue, now, wait, "run_at")
            }
            (delay, None) => later(queue, now, delay.unwrap_or_default(), "delay"),
        }
    }

    /// The deduplication key set with [`PublishOptions::dedup_key`], if any.
    pub fn dedup_key_value(&self) -> Option<&str> {
        self.dedup_key.as_deref()
    }

    /// The deduplication key for `envelope`: the one set, or the job id.
    pub fn dedup_key_for<'a, T>(&'a self, envelope: &Envelope<T>) -> Cow<'a, str> {
        match &self.dedup_key {
            Some(key) => Cow::Borrowed(key),
            None => Cow::Owned(envelope.job_id.to_string()),
        }
    }
}

/// What a transport answered to a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Receipt {
    /// The transport's message id, when it gives one (Vercel's "deferred" answer does not).
    pub message_id: Option<String>,
    /// `true` when the deduplication key matched an earlier publish and nothing new was queued.
    pub duplicate: bool,
}

impl Receipt {
    /// A receipt for a newly queued message.
    pub fn queued(message_id: Option<String>) -> Self {
        Receipt {
            message_id,
            duplicate: false,
        }
    }

    /// A receipt for a publish dropped as a duplicate of `message_id`.
    pub fn duplicate_of(message_id: Option<String>) -> Self {
        Receipt {
            message_id,
            duplicate: true,
        }
    }
}

/// Publishing jobs: the standard's `publish(queue, payload, opts)` and
/// `schedule(queue, payload, runAt)`.
///
/// Delivery is at least once; consumers make it effectively once through `processed_jobs`.
/// Implementations must be cheap to share (`Arc<dyn QueuePort>`) and safe to call
/// concurrently.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait QueuePort: Send + Sync {
    /// Queues `envelope` on `queue`, now or after `opts`' delay.
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError>;

    /// Queues `envelope` on `queue` for delivery at `run_at` (immediately if it is past),
    /// deduplicated by its job id: a publish with [`PublishOptions::run_at`], which each
    /// transport turns into a delay on its own clock where it takes one.
    async fn schedule(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        run_at: SystemTime,
    ) -> Result<Receipt, QueueError> {
        self.publish(queue, envelope, PublishOptions::default().run_at(run_at))
            .await
    }
}

/// The right to settle one delivery, held until it expires.
///
/// The token is opaque (a receipt handle, a row id with a fencing generation): only the
/// transport that issued it can interpret it, and a token whose lease expired or was settled is
/// refused with [`QueueError::LeaseLost`].
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    queue: QueueName,
    token: String,
    expires_at: SystemTime,
}

impl Lease {
    /// A lease on a message of `queue`, for transports to hand out.
    pub fn new(queue: QueueName, token: impl Into<String>, expires_at: SystemTime) -> Self {
        Lease {
            queue,
            token: token.into(),
            expires_at,
        }
    }

    /// The queue the message came from.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The transport's token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// When the message becomes visible to other workers unless settled or extended.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("queue", &self.queue.as_str())
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// One delivery of a message to a worker.
///
/// The payload is the raw bytes as published: the runtime decodes them, and keeps them intact
/// in the dead letter when they are poison.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// The bytes as published.
    pub payload: Vec<u8>,
    /// 1 on the first delivery; counted by the transport so it survives worker restarts.
    /// Deferrals ([`SettlePort::defer`]) do not count.
    pub attempt: u32,
    /// The transport's message id, when it has one.
    pub message_id: Option<String>,
    /// The right to settle this delivery.
    pub lease: Lease,
    /// The previous delivery was not settled before its lease ran out: its worker was too
    /// slow, or died on it. A runtime runs such a delivery on its own, so that a job that
    /// crashes its process cannot take other jobs with it. `false` where the transport cannot
    /// tell.
    pub expired: bool,
    /// The tenant the transport stored beside the message, where it keeps one (the PostgreSQL
    /// and memory queues, from the publish): what a dead letter of a payload that cannot say
    /// its tenant keeps, so that tenant's operators see it.
    pub tenant_id: Option<TenantId>,
}

impl Delivery {
    /// A delivery, for transports to hand out.
    pub fn new(payload: Vec<u8>, attempt: u32, message_id: Option<String>, lease: Lease) -> Self {
        Delivery {
            payload,
            attempt,
            message_id,
            lease,
            expired: false,
            tenant_id: None,
        }
    }

    /// The same delivery, with the tenant the transport stored beside its message.
    pub fn with_tenant(mut self, tenant_id: Option<TenantId>) -> Self {
        self.tenant_id = tenant_id;
        self
    }

    /// The same delivery, marked as coming after a lease that expired unsettled when
    /// `expired` says so.
    pub fn after_expiry(mut self, expired: bool) -> Self {
        self.expired = expired;
        self
    }

    /// The queue the message came from.
    pub fn queue(&self) -> &QueueName {
        self.lease.queue()
    }
}

/// Settling deliveries: what every consuming transport offers, pull or push.
///
/// Push transports (an HTTP callback per message) implement only this, over the one delivery a
/// request carries, turning the runtime's settlement into the HTTP answer. Every settlement
/// must be made while the lease is held; a message whose lease expires unsettled is delivered
/// again, which the idempotent runtime then skips or retries.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait SettlePort: Send + Sync {
    /// Settles the delivery for good: the message is never delivered again.
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError>;

    /// Releases the message for another attempt at `at`; the next delivery counts one attempt
    /// more.
    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError>;

    /// Releases the message until `until` without spending an attempt (rate limited, not
    /// failed): the next delivery carries the same attempt number.
    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError>;

    /// Keeps the message invisible for `by` from now, for handlers that outlive their lease.
    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError>;

    /// How long this transport lets a delivery be held, so that a worker refuses at build a
    /// lease or a time limit it could not keep. Unbounded by default.
    fn lease_limits(&self) -> LeaseLimits {
        LeaseLimits::default()
    }
}

/// How long a transport lets one delivery be held ([`SettlePort::lease_limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseLimits {
    /// The longest lease one receive or extension can set (Vercel Queues: 1 h); `None`
    /// when any lease up to [`MAX_WAIT`] can be set.
    pub per_lease: Option<Duration>,
    /// The longest a delivery can be held in all, however often it is extended (a QStash
    /// push: the request's `Upstash-Timeout`, after which QStash gives up on the answer);
    /// `None` when extensions can go on.
    pub per_delivery: Option<Duration>,
}

impl LeaseLimits {
    /// No lease longer than `limit`, extensions unbounded.
    pub fn per_lease(limit: Duration) -> Self {
        LeaseLimits {
            per_lease: Some(limit),
            per_delivery: None,
        }
    }

    /// No delivery held longer than `limit` in all.
    pub fn per_delivery(limit: Duration) -> Self {
        LeaseLimits {
            per_lease: Some(limit),
            per_delivery: Some(limit),
        }
    }
}

/// Fair dequeue across the tenants of one queue, opt-in (oldest first is the default): a
/// tenant that floods a queue, or a large tenant's nightly export, must not make every other
/// tenant wait behind its backlog.
///
/// Among the tenants with ready jobs, a receive serves each in turn, as many jobs per turn as
/// its weight (1 unless the transport holds another for it: deficit round-robin), and never
/// has more than [`limit`](TenantFairness::limit) jobs of one tenant in flight at once,
/// across every worker of the queue: the fetch passes over a tenant at its limit, so the
/// others' jobs still flow. Within a tenant, oldest first. A message without a tenant (raw
/// bytes) is served as one tenant of its own.
///
/// A worker asks its transport for it when it is built ([`PullPort::share_by_tenant`]).
///
/// ```
/// use jobs_core::TenantFairness;
/// use std::num::NonZeroU32;
///
/// let fair = TenantFairness::round_robin().limit(NonZeroU32::new(4).expect("not zero"));
/// assert_eq!(fair.limit_value().map(NonZeroU32::get), Some(4));
/// assert_eq!(fair.to_string(), "tenant round-robin, at most 4 in flight per tenant");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantFairness {
    limit: Option<NonZeroU32>,
}

impl TenantFairness {
    /// Tenants in turn, no limit on how many of one tenant's jobs run at once.
    pub fn round_robin() -> Self {
        TenantFairness::default()
    }

    /// At most `jobs` of one tenant's jobs in flight at once (leased and not yet settled, the
    /// lease unexpired), across every worker of the queue.
    pub fn limit(mut self, jobs: NonZeroU32) -> Self {
        self.limit = Some(jobs);
        self
    }

    /// The per-tenant limit, if any.
    pub fn limit_value(&self) -> Option<NonZeroU32> {
        self.limit
    }
}

impl fmt::Display for TenantFairness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tenant round-robin")?;
        match self.limit {
            Some(limit) => write!(f, ", at most {limit} in flight per tenant"),
            None => Ok(()),
        }
    }
}

/// The weights of [`TenantFairness`]: a tenant of weight 3 gets three turns to a tenant of
/// weight 1's one while both have ready jobs. Kept by the transport where its fetch reads them
/// (a table beside the queue's, for a database), so that a composition root fills them from
/// the tenants' entitlements; every tenant weighs 1 until set.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait TenantWeights: Send + Sync {
    /// Gives `tenant` `weight` on `queue`, from the next fetch on.
    async fn set_weight(
        &self,
        queue: &QueueName,
        tenant: TenantId,
        weight: NonZeroU32,
    ) -> Result<(), QueueError>;
}

/// The pull capability: leasing ready messages, and a hint that some may have arrived.
///
/// The deliveries it hands out are settled through the transport's [`SettlePort`], so a layer
/// that only decides what to fetch (a priority gate) implements this alone and wraps the pull
/// side of the transport it gates.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait PullPort: Send + Sync {
    /// Leases up to `max` ready messages of `queue` for `lease` each. An empty answer means
    /// nothing is ready now; it never waits for messages to arrive.
    ///
    /// It need not be cancel-safe, and no transport's is (a lease applied on the server is
    /// lost with a dropped answer, its message away until the lease expires): the worker
    /// never drops a receive it started, but lets it finish (at shutdown, within the grace)
    /// and gives back what it brought.
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError>;

    /// Resolves when work may have arrived on `queue`, so that a worker idle after an empty
    /// [`PullPort::receive`] receives again at once instead of at its next poll.
    ///
    /// The contract, for callers: it is a hint, never a promise. It may resolve with nothing
    /// ready (another worker took the message, or the transport wakes every waiter), and it may
    /// never resolve, so a caller always races it against its own poll interval, which also
    /// covers delays and retries falling due. For transports that override it: a publish made
    /// after the caller's empty `receive` must make this resolve, even when the publish lands
    /// before the call (keep the wake-up for the next waiter); resolving spuriously is allowed.
    ///
    /// The default never resolves: polling alone, for transports that cannot tell. It does no
    /// timing of its own, so this crate stays free of a runtime.
    async fn wait_for_work(&self, queue: &QueueName) {
        let _ = queue;
        std::future::pending::<()>().await;
    }

    /// Makes every later [`receive`](PullPort::receive) on `queue`, by this transport and its
    /// clones, share ready messages out among tenants as `fairness` says instead of oldest
    /// first; a second call replaces the first. A worker asks it once, when it is built
    /// (`WorkerBuilder::fair` in `jobs-consumers`), so that a transport or a layer that cannot
    /// do it fails the build instead of serving oldest first at run time: the default refuses,
    /// and a layer forwards it to what it wraps.
    fn share_by_tenant(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), Unsupported> {
        let _ = (queue, fairness);
        Err(Unsupported::new("this transport fetches oldest first only"))
    }
}

/// The consuming side of a pull transport, as the worker runtime drives it: [`PullPort`] and
/// [`SettlePort`] on one object. Implemented for every type that implements both.
pub trait ConsumerPort: SettlePort + PullPort {}

impl<T: SettlePort + PullPort + ?Sized> ConsumerPort for T {}

/// How a grouped worker settles one delivery inside the work transaction
/// ([`SettleInTransaction::settle`]). A dead letter is an [`Settlement::Ack`] in the transaction
/// that records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Done for good: processed, a duplicate, or dead-lettered in the same transaction.
    Ack,
    /// Another attempt at this time; the next delivery counts one attempt more.
    RetryAt(SystemTime),
    /// Back at this time without spending an attempt.
    Defer(SystemTime),
}

/// The capability of a queue kept in the store's own database: deliveries are held and
/// settled by statements inside the work transaction, so a job's ack commits with its claim
/// and its handler's writes, and one transaction can carry a whole group of jobs.
///
/// A worker is given it by type when it is built (`WorkerBuilder::grouped` in
/// `jobs-consumers`), never discovered at run time, so a layer that does not forward it cannot
/// drop it silently: such a layer simply does not implement this trait. The leases themselves
/// come from the queue's [`PullPort::receive`], committed on their own, so a crash still
/// counts the attempt.
#[async_trait]
pub trait SettleInTransaction<S: WorkStore>: SettlePort {
    /// `Ok` when `store`'s transactions run on this queue's database, so that a statement of
    /// this queue inside them is atomic with the claim; else why not, for the worker's build to
    /// refuse.
    fn shares_transactions_with(&self, store: &S) -> Result<(), Unsupported>;

    /// Takes the messages of `leases` into `tx`, answering for each whether its lease still
    /// holds (the delivery is the message's latest and is unsettled). A message taken cannot
    /// be delivered to anyone else while `tx` is open, even past its lease's expiry; a message
    /// not taken must not be handled. Every message taken must be settled in `tx`
    /// ([`settle`](Self::settle)) before it commits: a queue may take it out for good already
    /// (so that an ack costs nothing more), and refuses the commit of a transaction that left
    /// one unsettled.
    async fn hold(&self, tx: &mut S::Tx, leases: &[&Lease]) -> Result<Vec<bool>, StoreError>;

    /// [`hold`](Self::hold) each lease, then [`claim_all`](GroupTransaction::claim_all) for
    /// `consumer` the jobs of those held: per delivery, `None` when its lease does not hold
    /// (its job is not claimed), else its job's claim. A queue that can do both in one round
    /// trip overrides it; the two calls by default.
    async fn hold_and_claim(
        &self,
        tx: &mut S::Tx,
        deliveries: &[(&Lease, JobId)],
        consumer: &ConsumerName,
        at: SystemTime,
    ) -> Result<Vec<Option<Claim>>, StoreError>
    where
        S::Tx: GroupTransaction,
    {
        let leases: Vec<&Lease> = deliveries.iter().map(|(lease, _)| *lease).collect();
        let held = self.hold(tx, &leases).await?;
        let job_ids: Vec<JobId> = deliveries
            .iter()
            .zip(&held)
            .filter(|(_, held)| **held)
            .map(|((_, job_id), _)| *job_id)
            .collect();
        let mut claims = tx.claim_all(&job_ids, consumer, at).await?.into_iter();
        Ok(held
            .into_iter()
            .map(|held| if held { claims.next() } else { None })
            .collect())
    }

    /// Settles the deliveries [`hold`](Self::hold) took in `tx`, every one of them: each
    /// settlement takes effect if and only if `tx` commits. Fails, and the transaction must
    /// then be rolled back, if a delivery was not taken. A retry or a deferral puts the
    /// message back with the delivery's bytes.
    async fn settle(
        &self,
        tx: &mut S::Tx,
        settlements: &[(&Delivery, Settlement)],
    ) -> Result<(), StoreError>;
}

/// A capability a worker asks of its transport when it is built, which the transport cannot
/// give: fetching fairly across tenants ([`PullPort::share_by_tenant`]), settling inside a
/// store's transactions ([`SettleInTransaction::shares_transactions_with`]). The build fails
/// with it, so that the worker never runs without what it was configured for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{reason}")]
#[non_exhaustive]
pub struct Unsupported {
    /// Why not, and where possible what to do instead.
    pub reason: String,
}

impl Unsupported {
    /// A refusal saying `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Unsupported {
            reason: reason.into(),
        }
    }
}

/// A failure of a queue port.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The lease expired, was settled already, or passed to another worker: this worker must
    /// not settle the message. It is delivered again (or was settled) elsewhere.
    #[error("lease on `{queue}` is no longer held (expired, already settled, or taken over)")]
    LeaseLost {
        /// The queue of the message.
        queue: QueueName,
    },
    /// The transport refused the request and will refuse it again (invalid, unauthorised,
    /// too large, beyond retention).
    #[error("`{queue}` refused the request: {reason}")]
    Rejected {
        /// The queue concerned.
        queue: QueueName,
        /// The transport's explanation.
        reason: String,
    },
    /// The transport asked us to slow down.
    #[error("`{queue}` is rate limited{}", retry_after.map(|d| format!("; retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        /// The queue concerned.
        queue: QueueName,
        /// When the transport said to come back, if it said.
        retry_after: Option<Duration>,
    },
    /// The transport could not be reached or failed transiently (timeouts, 5xx, I/O).
    #[error("`{queue}` is unavailable: {message}")]
    Unavailable {
        /// The queue concerned.
        queue: QueueName,
        /// What failed.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The envelope is longer than the limit the consumers decode with
    /// ([`DecodeLimits`](crate::DecodeLimits)): publishing it would only make a dead letter, so
    /// nothing is written.
    #[error("`{queue}` refused an envelope of {size} bytes: the limit is {limit} bytes")]
    TooLarge {
        /// The queue the envelope was for.
        queue: QueueName,
        /// The encoded envelope's length in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The envelope could not be encoded (a typed `data` that serde refuses).
    #[error("encoding the envelope failed: {0}")]
    Encode(#[from] serde_json::Error),
}

/// The publish side of the envelope limit, beside the error it raises.
impl Envelope {
    /// The wire form for a publish to `queue`, refused with [`QueueError::TooLarge`] when it is
    /// longer than `limits` allow: the check every adapter makes at publish, so that nothing
    /// the consumers would refuse is written.
    pub fn encode_for(
        &self,
        queue: &QueueName,
        limits: &DecodeLimits,
    ) -> Result<Vec<u8>, QueueError> {
        let bytes = self.to_json_bytes()?;
        let limit = limits.max_envelope_bytes();
        if bytes.len() > limit {
            let (queue, size) = (queue.clone(), bytes.len());
            return Err(QueueError::TooLarge { queue, size, limit });
        }
        Ok(bytes)
    }
}

impl QueueError {
    /// Whether the same call may succeed later.
    pub fn class(&self) -> ErrorClass {
        match self {
            QueueError::RateLimited { .. } | QueueError::Unavailable { .. } => {
                ErrorClass::Retryable
            }
            QueueError::LeaseLost { .. }
            | QueueError::Rejected { .. }
            | QueueError::TooLarge { .. }
            | QueueError::Encode(_) => ErrorClass::Permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_takes_a_delay_or_a_time_and_refuses_both() {
        let queue: QueueName = "billing.invoices".parse().expect("a queue");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let minute = Duration::from_secs(60);
        let at = PublishOptions::default().run_at(now + minute);
        assert_eq!(at.visible_at(&queue, now).expect("a time"), now + minute);
        assert_eq!(at.delay_from(&queue, now).expect("a time"), Some(minute));
        let past = PublishOptions::default().run_at(now - minute);
        assert_eq!(past.visible_at(&queue, now).expect("past"), now, "at once");
        assert_eq!(
            past.delay_from(&queue, now).expect("past"),
            Some(Duration::ZERO)
        );
        assert_eq!(
            PublishOptions::default()
                .delay_from(&queue, now)
                .expect("now"),
            None
        );
        let both = PublishOptions::default().delay(minute).run_at(now + minute);
        let refused = both.visible_at(&queue, now).expect_err("both");
        assert!(
            refused
                .to_string()
                .contains("a delay or a run_at, not both"),
            "{refused}"
        );
        assert!(both.delay_from(&queue, now).is_err());
        let absurd = PublishOptions::default().run_at(now + MAX_WAIT + minute);
        assert!(
            absurd.visible_at(&queue, now).is_err(),
            "beyond the longest wait"
        );
    }
}

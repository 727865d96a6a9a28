//! An approximate queue depth kept in Redis, for transports that report none (Vercel Queues).
//!
//! [`CountedQueue`] wraps a transport's publishing and consuming sides: every publish adds the
//! job id to a sorted set per queue, scored by when the job becomes visible; every ack removes
//! it (the runtime acks after dead-lettering too). [`QueueDepth::depth`] counts the members
//! visible now (`ready`, which includes the in-flight ones the transport cannot tell apart) and
//! the ones still delayed.
//!
//! It is approximate, and safe to be so: a publish counted twice is one member (the set is
//! keyed by job id), and a lost decrement (a worker dying between its ack and the removal)
//! only lasts until the member has been visible for the `horizon`, after which every read
//! drops it. So a priority gate fed by this depth can pause a rail for at most the horizon on
//! a count that never comes down, never forever. A Redis failure never fails a publish or an
//! ack (the count just misses it, and the horizon repairs it); it fails `depth`, which the
//! gate treats as unknown.
//!
//! The script (`src/depth.lua`) uses only `TIME`, `ZADD NX`, `ZREM`, `ZCOUNT`,
//! `ZREMRANGEBYSCORE`, `PTTL` and `PEXPIRE` on the one key it is given, all of which Upstash
//! supports; the key expires once every member would have been dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    Clock, ConsumerPort, Delivery, Depth, Envelope, Lease, PublishOptions, PullPort, QueueDepth,
    QueueError, QueueName, QueuePort, Receipt, SettlePort, SystemClock,
};
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Deserialize;
use tokio::sync::OnceCell;

use crate::DEFAULT_TIMEOUT;

/// The Lua source of the depth script.
pub const DEPTH_SCRIPT: &str = include_str!("depth.lua");

/// How long a published job counts without an ack, by default: the retry policy's cap.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(3600);

/// A transport whose publishes and acks are counted in Redis, giving it [`QueueDepth`].
#[derive(Clone)]
pub struct CountedQueue {
    publisher: Arc<dyn QueuePort>,
    consumer: Arc<dyn ConsumerPort>,
    ledger: Arc<Ledger>,
    clock: Arc<dyn Clock>,
}

struct Ledger {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    prefix: String,
    horizon: Duration,
    script: Script,
    /// The job id behind each lease handed out and not yet acked, with the lease's expiry:
    /// a lease never settled here (the worker died, the ack failed) is forgotten once it has
    /// expired, so the map holds at most the leases still live.
    leased: Mutex<HashMap<String, (String, SystemTime)>>,
}

impl CountedQueue {
    /// Counts what goes through `publisher` and `consumer` (the two sides of one transport) in
    /// Redis at `client`, under keys `<prefix>:depth:<queue>`, forgetting a job once it has
    /// been visible for `horizon` without an ack.
    pub fn new(
        publisher: Arc<dyn QueuePort>,
        consumer: Arc<dyn ConsumerPort>,
        client: redis::Client,
        prefix: impl Into<String>,
        horizon: Duration,
    ) -> CountedQueue {
        CountedQueue {
            publisher,
            consumer,
            ledger: Arc::new(Ledger {
                client,
                connection: OnceCell::new(),
                prefix: prefix.into(),
                horizon,
                script: Script::new(DEPTH_SCRIPT),
                leased: Mutex::default(),
            }),
            clock: Arc::new(SystemClock),
        }
    }

    /// Takes time from `clock` (default: the system clock), for scheduled publishes' delays
    /// and the leases' expiry.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How many leases it tracks, for tests of its bound.
    pub fn tracked_leases(&self) -> usize {
        self.leased().len()
    }

    /// The Redis key of `queue`'s count.
    pub fn redis_key(&self, queue: &QueueName) -> String {
        format!("{}:depth:{queue}", self.ledger.prefix)
    }

    async fn run(
        &self,
        queue: &QueueName,
        mode: &str,
        member: &str,
        delay_ms: u128,
    ) -> Result<Vec<u64>, String> {
        let ledger = &self.ledger;
        let mut connection = ledger
            .connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(DEFAULT_TIMEOUT))
                    .set_response_timeout(Some(DEFAULT_TIMEOUT))
                    .set_number_of_retries(0);
                ConnectionManager::new_lazy_with_config(ledger.client.clone(), config)
            })
            .await
            .cloned()
            .map_err(|e| e.to_string())?;
        ledger
            .script
            .key(self.redis_key(queue))
            .arg(mode)
            .arg(ledger.horizon.as_millis().to_string())
            .arg(member)
            .arg(delay_ms.to_string())
            .invoke_async(&mut connection)
            .await
            .map_err(|e| e.to_string())
    }

    /// Counts a publish; a failure only costs accuracy.
    async fn count(&self, queue: &QueueName, job_id: &str, delay: Duration) {
        if let Err(error) = self.run(queue, "add", job_id, delay.as_millis()).await {
            tracing::warn!(%queue, job_id, %error, "counting a publish in Redis failed; the depth misses it");
        }
    }

    fn leased(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, SystemTime)>> {
        self.ledger.leased.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl QueuePort for CountedQueue {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let delay = opts
            .delay_from(queue, self.clock.now())?
            .unwrap_or_default();
        let receipt = self.publisher.publish(queue, envelope, opts).await?;
        self.count(queue, &envelope.job_id.to_string(), delay).await;
        Ok(receipt)
    }
}

/// The job id of a delivery's payload, without decoding the rest.
fn job_id(payload: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        job_id: String,
    }
    serde_json::from_slice::<Id>(payload)
        .ok()
        .map(|id| id.job_id)
}

#[async_trait]
impl PullPort for CountedQueue {
    async fn receive(
        &self,
        queue: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let deliveries = self.consumer.receive(queue, max, lease).await?;
        let now = self.clock.now();
        let mut leased = self.leased();
        leased.retain(|_, (_, expires)| *expires > now);
        for delivery in &deliveries {
            if let Some(id) = job_id(&delivery.payload) {
                let expires = delivery.lease.expires_at();
                leased.insert(delivery.lease.token().to_owned(), (id, expires));
            }
        }
        Ok(deliveries)
    }

    async fn wait_for_work(&self, queue: &QueueName) {
        self.consumer.wait_for_work(queue).await;
    }
}

#[async_trait]
impl SettlePort for CountedQueue {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.consumer.ack(lease).await?;
        let id = self.leased().remove(lease.token());
        if let Some((id, _)) = id
            && let Err(error) = self.run(lease.queue(), "remove", &id, 0).await
        {
            let queue = lease.queue();
            tracing::warn!(%queue, job_id = id, %error, "uncounting an ack in Redis failed; the horizon will");
        }
        Ok(())
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.leased().remove(lease.token());
        self.consumer.retry_at(lease, at).await
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.leased().remove(lease.token());
        self.consumer.defer(lease, until).await
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let extended = self.consumer.extend(lease, by).await?;
        let mut leased = self.leased();
        if let Some((id, _)) = leased.remove(lease.token()) {
            leased.insert(extended.token().to_owned(), (id, extended.expires_at()));
        }
        Ok(extended)
    }

    fn lease_limits(&self) -> jobs_core::LeaseLimits {
        self.consumer.lease_limits()
    }
}

#[async_trait]
impl QueueDepth for CountedQueue {
    async fn depth(&self, queue: &QueueName) -> Result<Depth, QueueError> {
        let counts =
            self.run(queue, "count", "", 0)
                .await
                .map_err(|message| QueueError::Unavailable {
                    queue: queue.clone(),
                    message: format!("reading the depth from Redis failed: {message}"),
                    source: None,
                })?;
        match counts[..] {
            [ready, delayed] => Ok(Depth::in_flight_as_ready(ready, delayed)),
            _ => Err(QueueError::Unavailable {
                queue: queue.clone(),
                message: format!("the depth script answered {counts:?}"),
                source: None,
            }),
        }
    }
}

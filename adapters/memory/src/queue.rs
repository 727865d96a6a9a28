//! The in-memory queue: both sides of the queue ports over one shared state, on a [`Clock`].

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use jobs_core::{
    Clock, DecodeLimits, Delivery, Depth, Envelope, Lease, MAX_WAIT, PublishOptions, PullPort,
    QueueDepth, QueueError, QueueName, QueuePort, Receipt, SettlePort, SystemClock, TenantFairness,
    TenantId, TenantWeights, later,
};
use tokio::sync::Notify;

/// How long a deduplication key is remembered by default: as long as Vercel Queues does.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// An in-process queue; clones share the same queues.
///
/// ```
/// use jobs_adapter_memory::MemoryQueue;
/// use jobs_core::{Envelope, PublishOptions, PullPort, QueueName, QueuePort, SettlePort};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let queue = MemoryQueue::default();
/// let name: QueueName = "billing.invoices".parse()?;
/// let envelope = Envelope::new(
///     "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?,
///     "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19".parse()?,
///     "billing.invoice_issued".parse()?,
///     serde_json::json!({"invoice": 42}),
/// );
/// queue.publish(&name, &envelope, PublishOptions::default()).await?;
///
/// let deliveries = queue.receive(&name, 10, Duration::from_secs(30)).await?;
/// assert_eq!(deliveries.len(), 1);
/// assert_eq!(deliveries[0].attempt, 1);
/// queue.ack(&deliveries[0].lease).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemoryQueue {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    dedup_window: Duration,
    limits: DecodeLimits,
}

impl Default for MemoryQueue {
    /// On the system clock, with [`DEFAULT_DEDUP_WINDOW`].
    fn default() -> Self {
        MemoryQueue::new(Arc::new(SystemClock))
    }
}

impl MemoryQueue {
    /// A queue on `clock`, with [`DEFAULT_DEDUP_WINDOW`].
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryQueue {
            state: Arc::default(),
            clock,
            dedup_window: DEFAULT_DEDUP_WINDOW,
            limits: DecodeLimits::default(),
        }
    }

    /// Refuses at publish, with [`QueueError::TooLarge`], envelopes longer than `limits` allow:
    /// give it the limits the consumers decode with (the default matches theirs).
    pub fn with_envelope_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Remembers deduplication keys for `window` after their first publish.
    pub fn with_dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Queues raw bytes, valid envelope or not: how tests and demos inject poison messages.
    /// The envelope limit does not apply, so an oversized message can be injected too.
    ///
    /// Deduplicated only when `opts` carries a key, since there is no job id to fall back on.
    pub fn publish_bytes(
        &self,
        queue: &QueueName,
        payload: Vec<u8>,
        opts: &PublishOptions,
    ) -> Receipt {
        let now = self.clock.now();
        // An absurd delay waits as long as any may: this helper has no error to return.
        let visible_at = opts
            .visible_at(queue, now)
            .unwrap_or_else(|_| now.checked_add(MAX_WAIT).unwrap_or(now));
        let key = opts.dedup_key_value().map(str::to_owned);
        let message = Message::new(payload, None, visible_at);
        self.lock()
            .enqueue(queue, message, key, now, self.dedup_window)
    }

    /// The names of every queue that has held a message.
    pub fn queue_names(&self) -> Vec<QueueName> {
        let mut names: Vec<QueueName> = self.lock().queues.keys().cloned().collect();
        names.sort();
        names
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation below leaves the state consistent before it can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn settle(
        &self,
        lease: &Lease,
        settle: impl FnOnce(&mut Queue, u64, SystemTime),
    ) -> Result<(), QueueError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let lost = || QueueError::LeaseLost {
            queue: lease.queue().clone(),
        };
        let (id, generation) = parse_token(lease.token()).ok_or_else(lost)?;
        let queue = state.queues.get_mut(lease.queue()).ok_or_else(lost)?;
        if !queue.holds(id, generation, now) {
            return Err(lost());
        }
        settle(queue, id, now);
        Ok(())
    }

    /// Whether `other` is this queue or a clone of it, sharing its messages.
    pub(crate) fn same_queues(&self, other: &MemoryQueue) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    /// Takes the message of `lease` out of everyone's reach if the lease still holds, as
    /// [`SettlePort`] checks it: until [`give_back`](Self::give_back),
    /// [`ack_held`](Self::ack_held) or [`release_held`](Self::release_held), no receive
    /// delivers it, even past its lease's expiry, and the settle port refuses its lease.
    /// Answers its id and generation.
    pub(crate) fn take_leased(&self, lease: &Lease) -> Option<(u64, u64)> {
        let now = self.clock.now();
        let (id, generation) = parse_token(lease.token())?;
        let mut state = self.lock();
        let queue = state.queues.get_mut(lease.queue())?;
        if !queue.holds(id, generation, now) {
            return None;
        }
        queue.hold(id);
        Some((id, generation))
    }

    /// Puts a held message back as it was when taken: leased until its lease's expiry, so
    /// that it is delivered again after it, marked expired. Wakes waiters when that is past.
    pub(crate) fn give_back(&self, name: &QueueName, id: u64) {
        let now = self.clock.now();
        let mut state = self.lock();
        let Some(queue) = state.queues.get_mut(name) else {
            return;
        };
        let ready = queue.unhold(id).is_some_and(|at| at <= now);
        if ready {
            state.wake(name);
        }
    }

    /// Removes a held message for good.
    pub(crate) fn ack_held(&self, name: &QueueName, id: u64) {
        if let Some(queue) = self.lock().queues.get_mut(name)
            && queue.unhold(id).is_some()
        {
            queue.remove(id);
        }
    }

    /// Makes a held message visible at `at` (at once when it is past), no longer leased:
    /// [`SettlePort::retry_at`] when `spent`, else [`SettlePort::defer`], giving back the
    /// attempt. Wakes waiters when it is ready now, as a publish does.
    pub(crate) fn release_held(&self, name: &QueueName, id: u64, at: SystemTime, spent: bool) {
        let now = self.clock.now();
        let mut state = self.lock();
        let Some(queue) = state.queues.get_mut(name) else {
            return;
        };
        if queue.unhold(id).is_none() {
            return;
        }
        queue.make_visible_at(id, at.max(now), false);
        if !spent && let Some(message) = queue.messages.get_mut(&id) {
            message.deliveries = message.deliveries.saturating_sub(1);
        }
        if at <= now {
            state.wake(name);
        }
    }
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<QueueName, Queue>,
    next_id: u64,
    /// Per queue, the wake-up of [`PullPort::wait_for_work`].
    wakers: HashMap<QueueName, Arc<Notify>>,
}

impl State {
    fn waker(&mut self, name: &QueueName) -> Arc<Notify> {
        self.wakers.entry(name.clone()).or_default().clone()
    }

    /// Wakes every waiter on `name` and keeps a wake-up for the next one, so a message made
    /// ready between a worker's empty receive and its wait is not missed.
    fn wake(&mut self, name: &QueueName) {
        let waker = self.waker(name);
        waker.notify_waiters();
        waker.notify_one();
    }
}

#[derive(Debug, Default)]
struct Queue {
    messages: HashMap<u64, Message>,
    /// Every unacked message by the time it (next) becomes visible: its ready time, or the
    /// expiry of its lease.
    visibility: BTreeSet<(SystemTime, u64)>,
    /// [`Queue::visibility`] per tenant, for the fair fetch; a tenant without messages has no
    /// entry, so the fetch's cost does not grow with idle tenants.
    lanes: HashMap<Option<TenantId>, BTreeSet<(SystemTime, u64)>>,
    /// Set by [`PullPort::share_by_tenant`]; oldest first when `None`.
    fairness: Option<TenantFairness>,
    /// The tenant the last fair fetch served last, and what is left of its turn: the next
    /// fetch goes on with it, or starts after it when its turn is over.
    cursor: Option<(Option<TenantId>, usize)>,
    weights: HashMap<TenantId, NonZeroU32>,
    /// Per tenant, the messages held in work transactions: in flight, though out of the lanes.
    held: HashMap<Option<TenantId>, usize>,
    dedup: HashMap<String, u64>,
    /// Deduplication keys in the order they expire.
    dedup_expiry: VecDeque<(SystemTime, String)>,
}

#[derive(Debug)]
struct Message {
    payload: Vec<u8>,
    tenant: Option<TenantId>,
    /// Deliveries so far that spent an attempt.
    deliveries: u32,
    visible_at: SystemTime,
    leased: bool,
    /// Taken into a work transaction ([`MemoryQueue::take_leased`]): out of the visibility
    /// indexes, so that no receive finds it, until the transaction ends.
    held: bool,
    /// Bumped on every delivery, so a lease from an earlier delivery is refused.
    generation: u64,
}

impl Message {
    fn new(payload: Vec<u8>, tenant: Option<TenantId>, visible_at: SystemTime) -> Self {
        Message {
            payload,
            tenant,
            deliveries: 0,
            visible_at,
            leased: false,
            held: false,
            generation: 0,
        }
    }
}

impl State {
    fn enqueue(
        &mut self,
        name: &QueueName,
        message: Message,
        key: Option<String>,
        now: SystemTime,
        window: Duration,
    ) -> Receipt {
        let queue = self.queues.entry(name.clone()).or_default();
        while let Some((expiry, _)) = queue.dedup_expiry.front() {
            if *expiry > now {
                break;
            }
            if let Some((_, key)) = queue.dedup_expiry.pop_front() {
                queue.dedup.remove(&key);
            }
        }
        if let Some(key) = &key
            && let Some(id) = queue.dedup.get(key)
        {
            return Receipt::duplicate_of(Some(message_id(*id)));
        }
        self.next_id += 1;
        let id = self.next_id;
        if let Some(key) = key {
            queue.dedup.insert(key.clone(), id);
            queue.dedup_expiry.push_back((now + window, key));
        }
        let visible_at = message.visible_at;
        queue
            .lanes
            .entry(message.tenant)
            .or_default()
            .insert((visible_at, id));
        queue.messages.insert(id, message);
        queue.visibility.insert((visible_at, id));
        if visible_at <= now {
            self.wake(name);
        }
        Receipt::queued(Some(message_id(id)))
    }
}

impl Queue {
    fn make_visible_at(&mut self, id: u64, at: SystemTime, leased: bool) {
        if let Some(message) = self.messages.get_mut(&id) {
            self.visibility.remove(&(message.visible_at, id));
            if let Some(lane) = self.lanes.get_mut(&message.tenant) {
                lane.remove(&(message.visible_at, id));
                lane.insert((at, id));
            }
            message.visible_at = at;
            message.leased = leased;
            self.visibility.insert((at, id));
        }
    }

    /// Whether the delivery `generation` of message `id` is still leased at `now`: the latest,
    /// unsettled, unexpired and not held in a work transaction.
    fn holds(&self, id: u64, generation: u64, now: SystemTime) -> bool {
        self.messages.get(&id).is_some_and(|m| {
            m.leased && !m.held && m.generation == generation && now < m.visible_at
        })
    }

    /// Takes message `id` out of the visibility indexes and counts it held.
    fn hold(&mut self, id: u64) {
        let Some(message) = self.messages.get_mut(&id) else {
            return;
        };
        if message.held {
            return;
        }
        message.held = true;
        self.visibility.remove(&(message.visible_at, id));
        if let Some(lane) = self.lanes.get_mut(&message.tenant) {
            lane.remove(&(message.visible_at, id));
            if lane.is_empty() {
                self.lanes.remove(&message.tenant);
            }
        }
        *self.held.entry(message.tenant).or_default() += 1;
    }

    /// Puts held message `id` back in the visibility indexes as it stands; answers when it
    /// becomes visible, `None` when it was not held.
    fn unhold(&mut self, id: u64) -> Option<SystemTime> {
        let message = self.messages.get_mut(&id).filter(|m| m.held)?;
        message.held = false;
        let (at, tenant) = (message.visible_at, message.tenant);
        self.visibility.insert((at, id));
        self.lanes.entry(tenant).or_default().insert((at, id));
        if let Some(count) = self.held.get_mut(&tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.held.remove(&tenant);
            }
        }
        Some(at)
    }

    fn remove(&mut self, id: u64) {
        let Some(message) = self.messages.remove(&id) else {
            return;
        };
        self.visibility.remove(&(message.visible_at, id));
        if let Some(lane) = self.lanes.get_mut(&message.tenant) {
            lane.remove(&(message.visible_at, id));
            if lane.is_empty() {
                self.lanes.remove(&message.tenant);
            }
        }
    }

    /// Up to `max` messages due at `now`: the oldest, or shared out among tenants when the
    /// queue is fair.
    fn due(&mut self, now: SystemTime, max: usize) -> Vec<u64> {
        match self.fairness {
            None => self
                .visibility
                .iter()
                .take_while(|(at, _)| *at <= now)
                .take(max)
                .map(|(_, id)| *id)
                .collect(),
            Some(fairness) => self.fair_due(fairness, now, max),
        }
    }

    /// Deficit round-robin over the tenants with messages, going on where the last fetch
    /// stopped: each turn takes up to the tenant's weight of its oldest due messages, passing
    /// over a tenant with `fairness`' limit of messages in flight, until `max` are taken or
    /// every tenant has had a turn that took none. A turn cut short by `max` goes on at the
    /// next fetch, so that weights hold across fetches of any size.
    fn fair_due(&mut self, fairness: TenantFairness, now: SystemTime, max: usize) -> Vec<u64> {
        struct Turn {
            tenant: Option<TenantId>,
            due: VecDeque<u64>,
            room: usize,
            weight: usize,
        }
        let mut tenants: Vec<Option<TenantId>> = self.lanes.keys().copied().collect();
        tenants.sort_unstable();
        let mut carried = 0;
        if let Some((last, left)) = self.cursor {
            let from = if left > 0 {
                tenants.partition_point(|t| *t < last)
            } else {
                tenants.partition_point(|t| *t <= last)
            };
            if tenants.get(from) == Some(&last) {
                carried = left;
            }
            tenants.rotate_left(from);
        }
        let limit = fairness
            .limit_value()
            .map(|l| usize::try_from(l.get()).unwrap_or(usize::MAX));
        let mut turns: Vec<Turn> = tenants
            .into_iter()
            .filter_map(|tenant| {
                let lane = self.lanes.get(&tenant)?;
                // One more than a fetch can take, to tell whether a turn left some behind.
                let due: VecDeque<u64> = lane
                    .iter()
                    .take_while(|(at, _)| *at <= now)
                    .take(max.saturating_add(1))
                    .map(|(_, id)| *id)
                    .collect();
                let room = limit.map_or(usize::MAX, |limit| {
                    let in_flight = lane
                        .iter()
                        .skip_while(|(at, _)| *at <= now)
                        .filter(|(_, id)| self.messages.get(id).is_some_and(|m| m.leased))
                        .count();
                    let held = self.held.get(&tenant).copied().unwrap_or(0);
                    limit.saturating_sub(in_flight.saturating_add(held))
                });
                let weight = tenant
                    .and_then(|t| self.weights.get(&t))
                    .map_or(1, |w| usize::try_from(w.get()).unwrap_or(usize::MAX));
                Some(Turn {
                    tenant,
                    due,
                    room,
                    weight,
                })
            })
            .collect();
        let mut taken = Vec::with_capacity(max);
        let (mut i, mut idle) = (0, 0);
        while taken.len() < max && idle < turns.len() {
            let turn = &mut turns[i];
            let quota = if carried > 0 {
                std::mem::take(&mut carried)
            } else {
                turn.weight
            };
            let share = quota.min(turn.room).min(max - taken.len());
            let before = taken.len();
            while taken.len() - before < share {
                let Some(id) = turn.due.pop_front() else {
                    break;
                };
                taken.push(id);
            }
            let took = taken.len() - before;
            turn.room -= took;
            if took == 0 {
                idle += 1;
            } else {
                idle = 0;
                let more = !turn.due.is_empty() && turn.room > 0;
                let left = if more { quota - took } else { 0 };
                self.cursor = Some((turn.tenant, left));
            }
            i = (i + 1) % turns.len();
        }
        taken
    }
}

fn message_id(id: u64) -> String {
    format!("mem-{id}")
}

fn token(id: u64, generation: u64) -> String {
    format!("{id}.{generation}")
}

/// The message id and generation of a lease token of this queue.
pub(crate) fn parse_token(token: &str) -> Option<(u64, u64)> {
    let (id, generation) = token.split_once('.')?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

#[async_trait]
impl QueuePort for MemoryQueue {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let payload = envelope.encode_for(queue, &self.limits)?;
        let now = self.clock.now();
        let visible_at = opts.visible_at(queue, now)?;
        let key = opts.dedup_key_for(envelope).into_owned();
        let message = Message::new(payload, Some(envelope.tenant_id), visible_at);
        Ok(self
            .lock()
            .enqueue(queue, message, Some(key), now, self.dedup_window))
    }
}

#[async_trait]
impl PullPort for MemoryQueue {
    async fn receive(
        &self,
        name: &QueueName,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Delivery>, QueueError> {
        let now = self.clock.now();
        let expires_at = later(name, now, lease, "lease")?;
        let mut state = self.lock();
        let Some(queue) = state.queues.get_mut(name) else {
            return Ok(vec![]);
        };
        let due = queue.due(now, max);
        let mut deliveries = Vec::with_capacity(due.len());
        for id in due {
            // Still leased when due again: its lease expired unsettled.
            let expired = queue.messages.get(&id).is_some_and(|m| m.leased);
            queue.make_visible_at(id, expires_at, true);
            let Some(message) = queue.messages.get_mut(&id) else {
                continue;
            };
            message.deliveries += 1;
            message.generation += 1;
            deliveries.push(
                Delivery::new(
                    message.payload.clone(),
                    message.deliveries,
                    Some(message_id(id)),
                    Lease::new(name.clone(), token(id, message.generation), expires_at),
                )
                .after_expiry(expired)
                .with_tenant(message.tenant),
            );
        }
        Ok(deliveries)
    }

    /// Resolves when a message is published ready, or was since the last wait (a wake-up
    /// nobody awaited is kept for the next call). Delayed messages and retries falling due do
    /// not wake: the caller's poll covers them.
    async fn wait_for_work(&self, queue: &QueueName) {
        let waker = self.lock().waker(queue);
        waker.notified().await;
    }

    /// Shares `queue` out among tenants in process: the tenants' weights are those set with
    /// [`TenantWeights::set_weight`], the limit counts this queue's (and its clones')
    /// deliveries in flight.
    fn share_by_tenant(
        &self,
        queue: &QueueName,
        fairness: TenantFairness,
    ) -> Result<(), jobs_core::Unsupported> {
        self.lock()
            .queues
            .entry(queue.clone())
            .or_default()
            .fairness = Some(fairness);
        Ok(())
    }
}

#[async_trait]
impl SettlePort for MemoryQueue {
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.settle(lease, |queue, id, _| queue.remove(id))
    }

    async fn retry_at(&self, lease: &Lease, at: SystemTime) -> Result<(), QueueError> {
        self.settle(lease, |queue, id, now| {
            queue.make_visible_at(id, at.max(now), false);
        })
    }

    async fn defer(&self, lease: &Lease, until: SystemTime) -> Result<(), QueueError> {
        self.settle(lease, |queue, id, now| {
            queue.make_visible_at(id, until.max(now), false);
            if let Some(message) = queue.messages.get_mut(&id) {
                message.deliveries -= 1;
            }
        })
    }

    async fn extend(&self, lease: &Lease, by: Duration) -> Result<Lease, QueueError> {
        let extended = later(lease.queue(), self.clock.now(), by, "lease extension")?;
        let mut expires_at = None;
        self.settle(lease, |queue, id, _| {
            queue.make_visible_at(id, extended, true);
            expires_at = Some(extended);
        })?;
        Ok(Lease::new(
            lease.queue().clone(),
            lease.token(),
            expires_at.unwrap_or_else(|| lease.expires_at()),
        ))
    }
}

/// Weights of this queue's fair fetch, in process.
#[async_trait]
impl TenantWeights for MemoryQueue {
    async fn set_weight(
        &self,
        queue: &QueueName,
        tenant: TenantId,
        weight: NonZeroU32,
    ) -> Result<(), QueueError> {
        self.lock()
            .queues
            .entry(queue.clone())
            .or_default()
            .weights
            .insert(tenant, weight);
        Ok(())
    }
}

/// A message held in a work transaction counts as in flight, whatever its lease; one whose
/// lease expired is ready since the lease's end.
#[async_trait]
impl QueueDepth for MemoryQueue {
    async fn depth(&self, name: &QueueName) -> Result<Depth, QueueError> {
        let now = self.clock.now();
        let state = self.lock();
        let Some(queue) = state.queues.get(name) else {
            return Ok(Depth::default());
        };
        let (mut ready, mut delayed, mut in_flight) = (0, 0, 0);
        let mut oldest: Option<SystemTime> = None;
        for message in queue.messages.values() {
            if message.held {
                in_flight += 1;
            } else if message.visible_at <= now {
                ready += 1;
                oldest = Some(oldest.map_or(message.visible_at, |o| o.min(message.visible_at)));
            } else if message.leased {
                in_flight += 1;
            } else {
                delayed += 1;
            }
        }
        Ok(Depth::new(ready, delayed, in_flight).oldest_ready_at(oldest))
    }

    async fn queues(&self) -> Result<Option<Vec<QueueName>>, QueueError> {
        let state = self.lock();
        let mut names: Vec<QueueName> = state
            .queues
            .iter()
            .filter(|(_, queue)| !queue.messages.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        Ok(Some(names))
    }
}

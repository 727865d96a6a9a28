//! Queue depth, the optional capability of the transports whose engine can count: how many
//! messages wait in each state and, where the transport can tell, since when the oldest ready
//! one has waited. Priority gates read it, operators see it, and autoscalers scale on it.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::name::QueueName;
use crate::queue::QueueError;

/// How many messages a queue holds, for priority decisions, operators and autoscaling.
///
/// Not every transport can count every state: [`Depth::counts`] says what these figures are,
/// and [`Depth::delayed_known`], [`Depth::in_flight_known`] and [`Depth::waited`] answer
/// `None` for what the transport cannot tell, so that nobody reads an unknown as zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Depth {
    /// Ready for delivery now (a lease that expired counts here: its message is deliverable
    /// again).
    pub ready: u64,
    /// Waiting for their delay or retry time.
    pub delayed: u64,
    /// Leased to a worker and not yet settled.
    pub in_flight: u64,
    /// When the ready message that has waited longest became ready (its delay's or lease's
    /// end, or its publish): `None` when none is ready, or when the transport does not date
    /// its messages ([`DepthCounts::Apart`] does).
    pub oldest_ready: Option<SystemTime>,
    /// What the transport counted.
    pub counts: DepthCounts,
}

/// What a transport's [`Depth`] counts, so that a reader tells a zero from an unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DepthCounts {
    /// Ready, delayed and in flight apart, and the oldest ready message dated: the queues
    /// that hold their messages themselves (in memory, PostgreSQL).
    #[default]
    Apart,
    /// Ready and delayed, with in-flight messages among the ready ones and nothing dated: a
    /// depth kept beside a transport that reports none (a Redis count of publishes and acks).
    InFlightAsReady,
    /// Only the messages waiting for delivery, in `ready` (QStash's queue lag): delayed and
    /// in flight are unknown and read 0.
    ReadyOnly,
}

impl Depth {
    /// A depth counted apart by state ([`DepthCounts::Apart`]), for transports to report; with
    /// [`Depth::oldest_ready_at`] for the oldest ready message's time.
    pub fn new(ready: u64, delayed: u64, in_flight: u64) -> Self {
        Depth {
            ready,
            delayed,
            in_flight,
            oldest_ready: None,
            counts: DepthCounts::Apart,
        }
    }

    /// A depth that counts `ready` (in-flight messages among them) and `delayed` only
    /// ([`DepthCounts::InFlightAsReady`]).
    pub fn in_flight_as_ready(ready: u64, delayed: u64) -> Self {
        Depth {
            counts: DepthCounts::InFlightAsReady,
            ..Depth::new(ready, delayed, 0)
        }
    }

    /// A depth that knows only how many messages wait for delivery ([`DepthCounts::ReadyOnly`]).
    pub fn ready_only(ready: u64) -> Self {
        Depth {
            counts: DepthCounts::ReadyOnly,
            ..Depth::new(ready, 0, 0)
        }
    }

    /// The same depth, its oldest ready message ready since `at` (`None`: none is ready).
    pub fn oldest_ready_at(mut self, at: Option<SystemTime>) -> Self {
        self.oldest_ready = at;
        self
    }

    /// Work waiting now or under way: `ready + in_flight`.
    pub fn pending(&self) -> u64 {
        self.ready + self.in_flight
    }

    /// Every message not yet acked.
    pub fn total(&self) -> u64 {
        self.ready + self.delayed + self.in_flight
    }

    /// The delayed messages, when the transport counts them apart.
    pub fn delayed_known(&self) -> Option<u64> {
        match self.counts {
            DepthCounts::Apart | DepthCounts::InFlightAsReady => Some(self.delayed),
            DepthCounts::ReadyOnly => None,
        }
    }

    /// The messages in flight, when the transport counts them apart.
    pub fn in_flight_known(&self) -> Option<u64> {
        match self.counts {
            DepthCounts::Apart => Some(self.in_flight),
            DepthCounts::InFlightAsReady | DepthCounts::ReadyOnly => None,
        }
    }

    /// How long the oldest ready message has waited at `now` (zero when none is ready, or for
    /// a time after `now`, another clock's): the latency an autoscaler scales on. `None`
    /// when the transport does not date its messages.
    pub fn waited(&self, now: SystemTime) -> Option<Duration> {
        match self.counts {
            DepthCounts::Apart => Some(
                self.oldest_ready
                    .and_then(|at| now.duration_since(at).ok())
                    .unwrap_or_default(),
            ),
            DepthCounts::InFlightAsReady | DepthCounts::ReadyOnly => None,
        }
    }
}

/// The capability of reporting queue depth, for the transports whose engine knows it.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait QueueDepth: Send + Sync {
    /// The depth of `queue` now (zero for a queue never used).
    async fn depth(&self, queue: &QueueName) -> Result<Depth, QueueError>;

    /// The queues that hold messages now, for an operator's overview; `None` when the
    /// transport cannot list them (the default).
    async fn queues(&self) -> Result<Option<Vec<QueueName>>, QueueError> {
        Ok(None)
    }

    /// The depth of every queue [`QueueDepth::queues`] lists and of each of `also`, by name:
    /// what an overview shows. A transport that can read them all at once overrides it (the
    /// PostgreSQL queue: one statement, however many queues); the default asks `queues`, then
    /// `depth` of each.
    async fn depths(&self, also: &[QueueName]) -> Result<Vec<(QueueName, Depth)>, QueueError> {
        let mut names = also.to_vec();
        if let Some(listed) = self.queues().await? {
            names.extend(listed);
        }
        names.sort();
        names.dedup();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let depth = self.depth(&name).await?;
            out.push((name, depth));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_transport_cannot_count_is_unknown_not_zero() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let now = at + Duration::from_secs(42);

        let apart = Depth::new(3, 2, 1).oldest_ready_at(Some(at));
        assert_eq!(
            (
                apart.delayed_known(),
                apart.in_flight_known(),
                apart.waited(now)
            ),
            (Some(2), Some(1), Some(Duration::from_secs(42)))
        );
        let idle = Depth::new(0, 2, 1);
        assert_eq!(
            idle.waited(now),
            Some(Duration::ZERO),
            "nothing ready waits"
        );
        let skewed = Depth::new(1, 0, 0).oldest_ready_at(Some(now + Duration::from_secs(5)));
        assert_eq!(
            skewed.waited(now),
            Some(Duration::ZERO),
            "another clock ahead"
        );

        let counted = Depth::in_flight_as_ready(4, 2).oldest_ready_at(Some(at));
        assert_eq!(
            (
                counted.delayed_known(),
                counted.in_flight_known(),
                counted.waited(now)
            ),
            (Some(2), None, None)
        );
        let lag = Depth::ready_only(7);
        assert_eq!(
            (lag.delayed_known(), lag.in_flight_known(), lag.waited(now)),
            (None, None, None)
        );
        assert_eq!((lag.pending(), lag.total()), (7, 7));
        assert_eq!(Depth::default(), Depth::new(0, 0, 0));
    }
}

//! A worker's tuning, the limits `build` holds it to, and why a worker cannot be built.

use std::collections::HashMap;
use std::time::Duration;

use jobs_core::{ConsumerName, DecodeLimits, Kind, QueueName};
use thiserror::Error;

use crate::delivery::Limits;

/// A worker that cannot be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A worker with no handler could only dead-letter.
    #[error("worker `{0}` has no handler registered")]
    NoHandlers(ConsumerName),
    /// Two handlers for one kind.
    #[error("kind `{0}` has two handlers")]
    DuplicateKind(Kind),
    /// A [`JobKind::KIND`](jobs_core::JobKind::KIND) given to
    /// [`WorkerBuilder::job`](crate::WorkerBuilder::job) is not a valid kind.
    #[error("{0}")]
    InvalidKind(String),
    /// A setting that cannot work (a worker with no concurrency, a lease too short to extend,
    /// a zero poll interval or time limit, a lease or a time limit longer than the transport
    /// can hold a delivery), named as in [`WorkerConfig`].
    #[error("{field} = {value} cannot work: {why}")]
    Config {
        /// The setting, e.g. `concurrency`, or `timeout of kind ...`.
        field: String,
        /// Its value.
        value: String,
        /// What it must be.
        why: String,
    },
    /// A grouped worker ([`Worker::grouped_builder`](crate::Worker::grouped_builder)) was given
    /// a queue whose statements cannot join the store's transactions.
    #[error("worker `{consumer}` cannot run grouped: {reason}")]
    NotInStore {
        /// The worker's consumer.
        consumer: ConsumerName,
        /// Why the queue and the store do not share transactions.
        reason: String,
    },
    /// A group size outside 1 to [`MAX_GROUP_SIZE`].
    #[error("group_size {0} is outside 1 to {MAX_GROUP_SIZE}")]
    GroupSize(usize),
    /// An override for a queue this worker does not consume.
    #[error("retry policy override for `{policy}` given to the worker of `{queue}`")]
    PolicyForOtherQueue {
        /// The worker's queue.
        queue: QueueName,
        /// The override's queue.
        policy: QueueName,
    },
}

/// Tuning of a worker. The defaults suit handlers that take milliseconds to seconds.
///
/// Every setting, its default, what `WorkerBuilder::build` accepts (anything else is refused
/// with a [`WorkerError::Config`] naming the field), and what it does per job
/// ([`Worker::builder_on`](crate::Worker::builder_on)) and grouped
/// ([`Worker::grouped_builder`](crate::Worker::grouped_builder)):
///
/// | setting | default | accepted | per job | grouped |
/// |---|---|---|---|---|
/// | `concurrency` | 8 | at least 1 | jobs running at once; the worker leases no more | groups running at once, each one work transaction of up to `group_size` jobs run one after another; the worker leases those groups' jobs and up to two groups more, fetched ahead |
/// | `lease` | 60 s | 1 s to a day, and no longer than the transport allows ([`LeaseLimits::per_lease`](jobs_core::LeaseLimits::per_lease)) | how long a job stays leased; extended every third of it while it runs | the same for jobs waiting in a group; a running group's rows are locked by its transaction |
/// | `handler_timeout` | 60 s | above zero, and no longer than the transport holds a delivery ([`LeaseLimits::per_delivery`](jobs_core::LeaseLimits::per_delivery)) | the handler's time limit (per kind: `WorkerBuilder::timeout`) | the same, per job of the group |
/// | `poll_interval` | 500 ms | above zero | the wait before polling an empty queue again, unless woken | the same |
/// | `shutdown_grace` | 30 s | any | how long running jobs may finish after a stop; fetched jobs not started are given back | the same; a group commits after the job it is running and gives back the rest |
/// | `decode_limits` | 1 MiB envelopes | any [`DecodeLimits`] | the longest envelope decoded | the same |
/// | `error_values` | off | on or off | whether a data error quotes the values | the same |
/// | `group_size` | 64 | 1 to [`MAX_GROUP_SIZE`] | unused | the most jobs one group carries |
/// | `group_linger` | 0 | any | unused | how long a short group waits for more jobs |
/// | `group_time` | 100 ms (30 ms at most when fair) | above zero | unused | how long a group's handlers should take in all: groups hold at most this over the handlers' recent mean |
///
/// A worker's pool needs [`connections`](Self::connections) connections: one per running job
/// or group, and three more.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Per job, jobs running at once; grouped, groups running at once (each up to
    /// `group_size` jobs, one after another in one work transaction). See the table above.
    pub concurrency: usize,
    /// How long a delivery stays leased before another worker may take it; extended every
    /// third of it for as long as the delivery's work runs (waiting for a connection, the
    /// handler within its time limit, the commit). A grouped job's row is locked by its
    /// group's transaction instead, which no expiry can take away.
    pub lease: Duration,
    /// How long a handler may run (one minute by default; per kind,
    /// [`WorkerBuilder::timeout`](crate::WorkerBuilder::timeout)). Past it the handler is stopped, its writes are rolled
    /// back and the job is retried, spending an attempt, with an error that says it timed
    /// out. A time limit stops only code that yields: a handler that blocks its thread is not
    /// stopped by it. A store that can bound each statement of the work transaction by the
    /// limit does ([`WorkStore::begin_within`](jobs_core::WorkStore::begin_within); PostgreSQL does, SQLite runs a statement to
    /// its end), so a handler stopped in the middle of a statement leaves nothing running.
    pub handler_timeout: Duration,
    /// How long to wait before polling an empty queue again, unless the transport's wake-up
    /// ([`PullPort::wait_for_work`](jobs_core::PullPort::wait_for_work)) comes first. With a transport that notifies, this
    /// bounds only the latency of delays and retries falling due.
    pub poll_interval: Duration,
    /// How long in-flight jobs may finish after shutdown is asked; the rest are left unacked
    /// and come back to another worker.
    pub shutdown_grace: Duration,
    /// Limits applied when decoding payloads.
    pub decode_limits: DecodeLimits,
    /// Whether the error of a job whose `data` does not fit its handler quotes the values
    /// serde found (`DataError::with_values`) in `last_error`, the logs and the alerts. Off by
    /// default: a payload's contents are the producer's, not the operator's; on only while
    /// debugging.
    pub error_values: bool,
    /// In grouped mode ([`Worker::grouped_builder`](crate::Worker::grouped_builder)), the most jobs one work transaction
    /// carries (1 to [`MAX_GROUP_SIZE`]). Larger groups commit less often; each job of a group
    /// waits for the ones before it, since they share one connection. A group whose jobs
    /// write needs a checkpoint per job, and a transaction takes only so many
    /// ([`GroupTransaction::checkpoint_budget`](jobs_core::GroupTransaction::checkpoint_budget),
    /// 31 on PostgreSQL): past them a group gives its other jobs back, unrun and their attempts
    /// unspent, and the next groups are made that much smaller, growing back while they need
    /// fewer.
    pub group_size: usize,
    /// In grouped mode, how long a group that found fewer than `group_size` jobs ready waits
    /// for more before it starts. Zero by default: a job published to an idle worker starts at
    /// once, and groups fill only under load.
    pub group_linger: Duration,
    /// In grouped mode, about how long a group's handlers should take in all (100 ms by
    /// default; 30 ms at most for a worker that fetches fairly across tenants): groups hold no
    /// more jobs than this over the handlers' recent mean time (at least one). A group's jobs
    /// commit when the last has run, and each waits for the ones before it, so groups of fast
    /// handlers are large and slow handlers run few to a transaction (a 10 ms handler ten, a
    /// 100 ms one alone) rather than holding their connection, locks and results back for
    /// seconds. A fair worker's light tenant should not wait behind a group of another's
    /// jobs, hence its tighter bound. Under a saturated database every handler takes longer,
    /// so too tight a bound makes groups smaller just when their overhead costs most.
    pub group_time: Duration,
}

/// The largest group: its jobs run one after another on one connection and its rows stay
/// locked until its commit, so a larger one mostly makes its jobs wait.
pub const MAX_GROUP_SIZE: usize = 64;

/// The shortest lease a worker accepts.
const MIN_LEASE: Duration = Duration::from_secs(1);

/// The longest lease a worker accepts.
const MAX_LEASE: Duration = Duration::from_secs(86_400);

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 8,
            lease: Duration::from_secs(60),
            handler_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            shutdown_grace: Duration::from_secs(30),
            decode_limits: DecodeLimits::default(),
            error_values: false,
            group_size: 64,
            group_linger: Duration::ZERO,
            group_time: Duration::from_millis(100),
        }
    }
}

impl WorkerConfig {
    /// Holds the configuration to the limits of the table on [`WorkerConfig`].
    pub(crate) fn check(&self) -> Result<(), WorkerError> {
        let refuse = |field: &str, value: String, why: &str| {
            Err(WorkerError::Config {
                field: field.to_owned(),
                value,
                why: why.to_owned(),
            })
        };
        if self.concurrency == 0 {
            return refuse(
                "concurrency",
                "0".to_owned(),
                "a worker must run at least one job",
            );
        }
        if self.lease < MIN_LEASE {
            return refuse(
                "lease",
                format!("{:?}", self.lease),
                "at least 1 s, or extending it would be a storm of requests",
            );
        }
        if self.lease > MAX_LEASE {
            return refuse(
                "lease",
                format!("{:?}", self.lease),
                "at most a day: a crashed worker's jobs come back only after it",
            );
        }
        if self.handler_timeout.is_zero() {
            return refuse(
                "handler_timeout",
                "0s".to_owned(),
                "a handler needs some time to run",
            );
        }
        if self.poll_interval.is_zero() {
            return refuse(
                "poll_interval",
                "0s".to_owned(),
                "a zero interval polls an empty queue in a busy loop",
            );
        }
        if self.group_time.is_zero() {
            return refuse(
                "group_time",
                "0s".to_owned(),
                "a group needs some time for its jobs",
            );
        }
        Ok(())
    }

    /// The connections a worker with this configuration needs from a pool it shares with its
    /// queue: one per concurrent job (or group), one for fetching, one for settlements and
    /// lease extensions made outside a work transaction, and one for the queue's wake-ups
    /// (LISTEN). A smaller pool makes jobs wait for connections held by their neighbours.
    pub fn connections(&self) -> u32 {
        u32::try_from(self.concurrency)
            .unwrap_or(u32::MAX)
            .saturating_add(3)
    }

    /// What running a delivery reads of this configuration, with the kinds' own time limits.
    pub(crate) fn limits(&self, timeouts: HashMap<Kind, Duration>) -> Limits {
        Limits {
            concurrency: self.concurrency,
            lease: self.lease,
            handler_timeout: self.handler_timeout,
            timeouts,
            poll_interval: self.poll_interval,
            shutdown_grace: self.shutdown_grace,
            decode_limits: self.decode_limits,
            error_values: self.error_values,
        }
    }
}

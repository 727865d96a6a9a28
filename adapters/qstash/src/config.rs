//! Where QStash is, the token, and where each of our queues is delivered.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use jobs_core::QueueName;

use crate::error::QStashError;

/// QStash's global endpoint, the default base URL. Regions:
/// `https://qstash-eu-central-1.upstash.io`, `https://qstash-us-east-1.upstash.io`.
pub const DEFAULT_BASE_URL: &str = "https://qstash.upstash.io";

/// How long one API request may take, connection included, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long QStash waits for our endpoint (`Upstash-Timeout`) by default: the lease of a push
/// delivery. Handlers must finish within it.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// The retry policy QStash's own schedule should follow for a queue: the standard's shape,
/// `max_attempts` in total and `min(cap, base · 2^(n-1))` after failed attempt `n`.
///
/// It mirrors the worker's policy (which lives in `jobs-consumers`, out of an adapter's reach):
/// configure both alike. QStash's expression language has no random function, so QStash's
/// retries use the ceiling without jitter; see ADR 0010.
///
/// ```
/// use jobs_adapter_qstash::RetrySchedule;
///
/// let standard = RetrySchedule::default();
/// assert_eq!(standard.retries_header(), "4");
/// assert_eq!(standard.retry_delay_expression(), "min(3600000, 30000 * pow(2, retried))");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySchedule {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
}

impl Default for RetrySchedule {
    /// The standard's: 5 attempts, base 30 s, cap 1 h.
    fn default() -> Self {
        RetrySchedule {
            max_attempts: 5,
            base: Duration::from_secs(30),
            cap: Duration::from_secs(3600),
        }
    }
}

impl RetrySchedule {
    /// `max_attempts` in total (at least 1), backing off from `base` (above zero, at least a
    /// millisecond) to `cap` (not below `base`).
    pub fn new(max_attempts: u32, base: Duration, cap: Duration) -> Result<Self, QStashError> {
        if max_attempts == 0 || base.as_millis() == 0 || cap < base {
            return Err(QStashError::InvalidRetrySchedule {
                max_attempts,
                base,
                cap,
            });
        }
        Ok(RetrySchedule {
            max_attempts,
            base,
            cap,
        })
    }

    /// Attempts in total.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `Upstash-Retries`: the deliveries after the first.
    pub fn retries_header(&self) -> String {
        (self.max_attempts - 1).to_string()
    }

    /// `Upstash-Retry-Delay`, in milliseconds over `retried` (0 on the first retry, which
    /// follows failed attempt 1): `min(cap, base · 2^retried)`.
    pub fn retry_delay_expression(&self) -> String {
        format!(
            "min({}, {} * pow(2, retried))",
            self.cap.as_millis(),
            self.base.as_millis()
        )
    }
}

/// Where QStash delivers the messages of one of our queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub(crate) url: String,
    pub(crate) qstash_queue: Option<String>,
    pub(crate) retry: RetrySchedule,
    pub(crate) tenant_parallelism: Option<NonZeroU32>,
}

impl Destination {
    /// Delivers to `url`, the public URL of the consumer endpoint (also the `sub` its
    /// signatures carry), with the standard retry schedule.
    pub fn new(url: impl Into<String>) -> Self {
        Destination {
            url: url.into(),
            qstash_queue: None,
            retry: RetrySchedule::default(),
            tenant_parallelism: None,
        }
    }

    /// At most `deliveries` of one tenant's messages to this destination under way at once,
    /// through QStash's flow control: each publish carries `Upstash-Flow-Control-Key` (the
    /// queue and the envelope's tenant) and `Upstash-Flow-Control-Value: parallelism=N`, and
    /// QStash holds a key's further messages back until one is answered. QStash pushes in its
    /// own order, so this caps one tenant's share of the consumer; it does not take turns
    /// among tenants (a worker asked for [`TenantFairness`](jobs_core::TenantFairness) over a
    /// QStash queue fails to build).
    pub fn tenant_parallelism(mut self, deliveries: NonZeroU32) -> Self {
        self.tenant_parallelism = Some(deliveries);
        self
    }

    /// The per-tenant parallelism, if set ([`Destination::tenant_parallelism`]).
    pub fn tenant_parallelism_value(&self) -> Option<NonZeroU32> {
        self.tenant_parallelism
    }

    /// Publishes through the QStash queue `name` (`/v2/enqueue/{name}/{url}`): ordered at
    /// parallelism 1, and its `lag` is the depth.
    pub fn via_queue(mut self, name: impl Into<String>) -> Self {
        self.qstash_queue = Some(name.into());
        self
    }

    /// Replaces the retry schedule.
    pub fn with_retry(mut self, retry: RetrySchedule) -> Self {
        self.retry = retry;
        self
    }

    /// The endpoint URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The QStash queue, if any.
    pub fn qstash_queue(&self) -> Option<&str> {
        self.qstash_queue.as_deref()
    }

    /// The retry schedule.
    pub fn retry(&self) -> RetrySchedule {
        self.retry
    }
}

/// How the adapter reaches QStash: base URL, token, timeouts, and the destination of each
/// queue. A queue without a destination cannot be published to.
///
/// The token is a secret: `Debug` prints `<redacted>`.
///
/// ```
/// use jobs_adapter_qstash::{Destination, QStashConfig};
///
/// let queue = "billing.invoices".parse().unwrap();
/// let config = QStashConfig::new("qstash-token")
///     .with_destination(queue, Destination::new("https://app.example.com/qstash/invoices"));
/// assert!(!format!("{config:?}").contains("qstash-token"));
/// ```
#[derive(Clone)]
pub struct QStashConfig {
    pub(crate) base_url: String,
    pub(crate) token: String,
    pub(crate) timeout: Duration,
    pub(crate) delivery_timeout: Duration,
    pub(crate) destinations: HashMap<QueueName, Destination>,
    pub(crate) template: Option<Destination>,
}

/// The placeholder a destination template replaces with the queue's name.
pub const QUEUE_PLACEHOLDER: &str = "{queue}";

impl QStashConfig {
    /// A configuration with the token `token` and the defaults.
    pub fn new(token: impl Into<String>) -> Self {
        QStashConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            token: token.into(),
            timeout: DEFAULT_TIMEOUT,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            destinations: HashMap::new(),
            template: None,
        }
    }

    /// Sends API requests to `base_url` instead of [`DEFAULT_BASE_URL`]: a region, or a fake.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Bounds each API request to `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Asks QStash to wait `timeout` for our endpoint (`Upstash-Timeout`, whole seconds).
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Delivers the messages of `queue` to `destination`.
    pub fn with_destination(mut self, queue: QueueName, destination: Destination) -> Self {
        self.destinations.insert(queue, destination);
        self
    }

    /// Delivers every queue without its own [`with_destination`](Self::with_destination) to
    /// `template` with [`QUEUE_PLACEHOLDER`] replaced by the queue's name
    /// (`https://app.example.com/qstash/{queue}`), so a composition root need not know every
    /// queue in advance. A QStash queue name in the template (`via_queue`) gets the same
    /// replacement. Refused without the placeholder: every queue would share one endpoint, and
    /// the receiver could not tell them apart.
    ///
    /// ```
    /// use jobs_adapter_qstash::{Destination, QStashConfig};
    ///
    /// let config = QStashConfig::new("token")
    ///     .with_destination_template(Destination::new("https://app.example.com/q/{queue}"))?;
    /// let queue = "billing.invoices".parse().unwrap();
    /// assert_eq!(config.destination(&queue).unwrap().url(), "https://app.example.com/q/billing.invoices");
    /// # Ok::<(), jobs_adapter_qstash::QStashError>(())
    /// ```
    pub fn with_destination_template(mut self, template: Destination) -> Result<Self, QStashError> {
        if !template.url.contains(QUEUE_PLACEHOLDER) {
            return Err(QStashError::InvalidDestination(format!(
                "the destination template `{}` has no {QUEUE_PLACEHOLDER} placeholder",
                template.url
            )));
        }
        self.template = Some(template);
        Ok(self)
    }

    /// The destination of `queue`: its own, else the template's, else `None`.
    pub fn destination(&self, queue: &QueueName) -> Option<Cow<'_, Destination>> {
        if let Some(own) = self.destinations.get(queue) {
            return Some(Cow::Borrowed(own));
        }
        let template = self.template.as_ref()?;
        Some(Cow::Owned(Destination {
            url: template.url.replace(QUEUE_PLACEHOLDER, queue.as_str()),
            qstash_queue: template
                .qstash_queue
                .as_ref()
                .map(|q| q.replace(QUEUE_PLACEHOLDER, queue.as_str())),
            retry: template.retry,
            tenant_parallelism: template.tenant_parallelism,
        }))
    }

    /// The lease a push delivery gets: the delivery timeout.
    pub fn delivery_timeout(&self) -> Duration {
        self.delivery_timeout
    }
}

impl fmt::Debug for QStashConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QStashConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("destinations", &self.destinations)
            .finish()
    }
}

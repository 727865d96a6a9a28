//! The standard's notification queues: `notif.{channel}.{transactional|marketing}`.

use jobs_core::{NameError, QueueName};

/// The two notification rails of a channel. Transactional traffic always has priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rail {
    /// Messages a user is waiting for (password resets, receipts).
    Transactional,
    /// Bulk sends that may wait (campaigns, digests).
    Marketing,
}

impl Rail {
    /// The rail's segment in a queue name.
    pub fn as_str(self) -> &'static str {
        match self {
            Rail::Transactional => "transactional",
            Rail::Marketing => "marketing",
        }
    }

    /// The standard's notification queue of `channel` on this rail, `notif.{channel}.{rail}`.
    ///
    /// ```
    /// use jobs_notifications::Rail;
    ///
    /// let q = Rail::Transactional.queue("email")?;
    /// assert_eq!(q.as_str(), "notif.email.transactional");
    /// assert_eq!(Rail::of(&q), Some(("email", Rail::Transactional)));
    /// # Ok::<(), jobs_core::NameError>(())
    /// ```
    pub fn queue(self, channel: &str) -> Result<QueueName, NameError> {
        if let Some(at) = channel.find('.') {
            return Err(NameError::BadChar {
                found: '.',
                position: at + 1,
            });
        }
        format!("notif.{channel}.{}", self.as_str()).parse()
    }

    /// The channel and rail of `queue`, when it is a notification queue.
    pub fn of(queue: &QueueName) -> Option<(&str, Rail)> {
        let mut parts = queue.as_str().split('.');
        let (Some("notif"), Some(channel), Some(rail), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let rail = match rail {
            "transactional" => Rail::Transactional,
            "marketing" => Rail::Marketing,
            _ => return None,
        };
        Some((channel, rail))
    }
}

/// `notif.{channel}.transactional`.
pub fn transactional(channel: &str) -> Result<QueueName, NameError> {
    Rail::Transactional.queue(channel)
}

/// `notif.{channel}.marketing`.
pub fn marketing(channel: &str) -> Result<QueueName, NameError> {
    Rail::Marketing.queue(channel)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_name_their_queues_and_are_read_back_from_them() {
        for (rail, name) in [
            (Rail::Transactional, "notif.sms.transactional"),
            (Rail::Marketing, "notif.sms.marketing"),
        ] {
            let queue = rail.queue("sms").expect("valid");
            assert_eq!(queue.as_str(), name);
            assert_eq!(Rail::of(&queue), Some(("sms", rail)));
        }
        for other in [
            "notif.sms.urgent",
            "billing.sms.transactional",
            "notif.sms.transactional.x",
            "notif.sms",
        ] {
            let queue: QueueName = other.parse().expect("a queue name");
            assert_eq!(Rail::of(&queue), None, "{other}");
        }
        assert_eq!(
            Rail::Marketing.queue("a.b"),
            Err(NameError::BadChar {
                found: '.',
                position: 2
            }),
            "the dot's 1-based position in the channel"
        );
    }
}

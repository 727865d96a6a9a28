//! Our dotted queue names as Vercel topic names, and Vercel's name rules.

use jobs_core::QueueName;
use thiserror::Error;

/// A name Vercel refuses as a topic or consumer group: the API accepts `^[A-Za-z0-9_-]+$` only.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "`{name}` is not a valid Vercel {what}: use only A-Z, a-z, 0-9, `_` and `-`, at least one character"
)]
pub struct NameError {
    what: &'static str,
    name: String,
}

/// Checks `name` against Vercel's pattern for topics and consumer groups.
pub(crate) fn check_vercel_name(what: &'static str, name: &str) -> Result<(), NameError> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(NameError {
            what,
            name: name.to_owned(),
        })
    }
}

/// The Vercel topic of a queue: the queue name with each `.` written `-`.
///
/// Queue names are dotted segments of `[a-z0-9_]`, which never contain `-`, so the mapping is
/// one to one and [`queue_of_topic`] reverses it: `notif.email.transactional` is the topic
/// `notif-email-transactional`.
///
/// ```
/// use jobs_adapter_vercel_queues::{queue_of_topic, topic_of};
/// use jobs_core::QueueName;
///
/// let queue: QueueName = "notif.email.transactional".parse().unwrap();
/// assert_eq!(topic_of(&queue), "notif-email-transactional");
/// assert_eq!(queue_of_topic("notif-email-transactional").unwrap(), queue);
/// ```
pub fn topic_of(queue: &QueueName) -> String {
    queue.as_str().replace('.', "-")
}

/// The queue whose topic is `topic`, or why no queue maps to it.
pub fn queue_of_topic(topic: &str) -> Result<QueueName, TopicError> {
    topic
        .replace('-', ".")
        .parse()
        .map_err(|source| TopicError {
            topic: topic.to_owned(),
            source,
        })
}

/// A topic that is not the image of any queue name (see [`topic_of`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("topic `{topic}` does not name a queue of ours: {source}")]
pub struct TopicError {
    topic: String,
    #[source]
    source: jobs_core::NameError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_topic_of_a_queue_is_a_valid_vercel_name_and_maps_back() {
        for name in [
            "a",
            "core.processed_jobs_cleanup",
            "notif.sms.marketing",
            "x1.y_2.z",
        ] {
            let queue: QueueName = name.parse().unwrap();
            let topic = topic_of(&queue);
            check_vercel_name("topic", &topic).unwrap();
            assert_eq!(queue_of_topic(&topic).unwrap(), queue);
        }
    }

    #[test]
    fn foreign_topics_and_bad_names_are_refused_with_the_name() {
        assert!(queue_of_topic("Upper-case").is_err());
        assert!(queue_of_topic("a--b").is_err());
        let err = check_vercel_name("consumer group", "workers.eu").unwrap_err();
        assert!(err.to_string().contains("`workers.eu`"), "{err}");
        assert!(check_vercel_name("topic", "").is_err());
        check_vercel_name("consumer group", "Workers_1-eu").unwrap();
    }
}

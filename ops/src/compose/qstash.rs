//! QStash (`qstash:` or `qstash://REGION`): a publish-only transport, its deliveries pushed to
//! the destination's endpoint, whose signing keys a worker process and `jobsctl qstash
//! verify` check.

use std::sync::Arc;

use futures_util::FutureExt;
use jobs_adapter_qstash::{Destination, QStashConfig, QStashQueue, SigningKeys};

use super::{
    Adapter, ComposeError, Config, QSTASH_BASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_DESTINATION,
    QSTASH_NEXT_SIGNING_KEY, QSTASH_TOKEN, QUEUE_URL, Queue, envelope_limits, scheme,
};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "qstash",
    store: None,
    queue: Some(|config, url| std::future::ready(queue(config, url)).boxed()),
    rate_limiter: None,
    alerter: None,
    depth: None,
};

/// Publishing and QStash queues' depth; no pull side: QStash calls an endpoint.
fn queue(config: &Config, url: &str) -> Result<Queue, ComposeError> {
    let qstash = qstash(config, url)?;
    Ok(Queue {
        scheme: scheme(url).to_owned(),
        publisher: Arc::new(qstash.clone()),
        consumer: None,
        depth: Some(Arc::new(qstash)),
        durable: true,
    })
}

/// `qstash:` (the global endpoint) or `qstash://REGION` (`eu-central-1`, `us-east-1`), the
/// token from [`QSTASH_TOKEN`], every queue delivered to [`QSTASH_DESTINATION`].
fn qstash(config: &Config, url: &str) -> Result<QStashQueue, ComposeError> {
    let region = url
        .strip_prefix("qstash:")
        .map(|rest| rest.trim_start_matches("//").trim_end_matches('/'))
        .unwrap_or_default();
    if !region
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(QUEUE_URL
            .invalid(format_args!(
                "`{region}` is not a QStash region such as eu-central-1 or us-east-1"
            ))
            .into());
    }
    let base_url = match (config.get(&QSTASH_BASE_URL), region) {
        (Some(base), _) => base.to_owned(),
        (None, "") => jobs_adapter_qstash::DEFAULT_BASE_URL.to_owned(),
        (None, region) => format!("https://qstash-{region}.upstash.io"),
    };
    let settings = QStashConfig::new(config.require(&QSTASH_TOKEN)?)
        .with_base_url(base_url)
        .with_destination_template(Destination::new(config.require(&QSTASH_DESTINATION)?))
        .map_err(|e| QSTASH_DESTINATION.invalid(e))?;
    let qstash = QStashQueue::new(settings).map_err(|e| QUEUE_URL.invalid(e))?;
    Ok(qstash.with_envelope_limits(envelope_limits(config)?))
}

/// The QStash transport [`QUEUE_URL`] names (`qstash:` or `qstash://REGION`), as its own
/// type: a worker process also needs it to republish deferrals.
pub fn qstash_queue(config: &Config) -> Result<QStashQueue, ComposeError> {
    qstash(config, config.require(&QUEUE_URL)?)
}

/// The keys QStash signs deliveries with, from [`QSTASH_CURRENT_SIGNING_KEY`] and
/// [`QSTASH_NEXT_SIGNING_KEY`]; both are needed, as a rotation may be under way.
pub fn qstash_signing_keys(config: &Config) -> Result<SigningKeys, ComposeError> {
    Ok(SigningKeys::new(
        config.require(&QSTASH_CURRENT_SIGNING_KEY)?,
        config.require(&QSTASH_NEXT_SIGNING_KEY)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::Queue;
    use super::super::tests::with_queue_url as with;

    #[tokio::test]
    async fn a_bad_region_or_a_missing_destination_is_refused_by_name() {
        let region = Queue::connect(&with("qstash://EU!", &[("QSTASH_TOKEN", "t")]))
            .await
            .expect_err("no such region");
        assert!(
            region.to_string().contains("not a QStash region"),
            "{region}"
        );
        let destination = Queue::connect(&with("qstash:", &[("QSTASH_TOKEN", "t")]))
            .await
            .expect_err("no destination");
        assert!(destination.is_configuration());
        assert!(
            destination.to_string().contains("QSTASH_DESTINATION"),
            "{destination}"
        );
        let qstash = Queue::connect(&with(
            "qstash://eu-central-1",
            &[
                ("QSTASH_TOKEN", "t"),
                ("QSTASH_DESTINATION", "https://app.example.com/q/{queue}"),
            ],
        ))
        .await
        .expect("composes without a request");
        assert!(qstash.durable && qstash.consumer.is_none(), "QStash pushes");
    }
}

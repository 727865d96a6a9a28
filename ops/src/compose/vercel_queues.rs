//! Vercel Queues (`vercel-queues://REGION`), counted in Redis when
//! [`DEPTH_URL`](super::DEPTH_URL) is set.

use std::sync::Arc;

use futures_util::FutureExt;
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig};

use super::{
    Adapter, ComposeError, Config, DEPTH_URL, Port, QUEUE_URL, Queue, VERCEL_DEPLOYMENT_ID,
    VERCEL_QUEUES_BASE_URL, VERCEL_QUEUES_CONSUMER_GROUP, VERCEL_QUEUES_TOKEN,
    VERCEL_QUEUES_TRUST_PUSHED, envelope_limits, pick, scheme, unsupported,
};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "vercel-queues",
    store: None,
    queue: Some(|config, url| std::future::ready(queue(config, url)).boxed()),
    rate_limiter: None,
    alerter: None,
    depth: None,
};

/// The transport, counted where [`DEPTH_URL`] says (Vercel Queues reports no depth).
fn queue(config: &Config, url: &str) -> Result<Queue, ComposeError> {
    let vercel = vercel_queues(config, url)?;
    if let Some(depth_url) = config.get(&DEPTH_URL) {
        let Some(count) = pick(config, &DEPTH_URL, Port::Depth, |a| a.depth)? else {
            return Err(unsupported(config, &DEPTH_URL, Port::Depth));
        };
        let both = Arc::new(vercel);
        return count(depth_url, scheme(url), both.clone(), both);
    }
    Ok(Queue {
        scheme: scheme(url).to_owned(),
        publisher: Arc::new(vercel.clone()),
        consumer: Some(Arc::new(vercel)),
        depth: None,
        durable: true,
    })
}

/// `vercel-queues://REGION`, the token from [`VERCEL_QUEUES_TOKEN`].
fn vercel_queues(config: &Config, url: &str) -> Result<VercelQueues, ComposeError> {
    let region = url
        .strip_prefix("vercel-queues://")
        .ok_or_else(|| {
            QUEUE_URL.invalid("expected vercel-queues://REGION, e.g. vercel-queues://iad1")
        })?
        .trim_end_matches('/');
    let region = Region::new(region).map_err(|e| QUEUE_URL.invalid(e))?;
    let token = StaticToken::new(config.require(&VERCEL_QUEUES_TOKEN)?);
    let mut settings = VercelQueuesConfig::new(region, token)
        .consumer_group(config.require(&VERCEL_QUEUES_CONSUMER_GROUP)?)
        .map_err(|e| VERCEL_QUEUES_CONSUMER_GROUP.invalid(e))?;
    if let Some(base) = config.get(&VERCEL_QUEUES_BASE_URL) {
        settings = settings
            .base_url_override(base)
            .map_err(|e| VERCEL_QUEUES_BASE_URL.invalid(e))?;
    }
    if let Some(id) = config.get(&VERCEL_DEPLOYMENT_ID) {
        settings = settings.deployment_id(id);
    }
    if config.get(&VERCEL_QUEUES_TRUST_PUSHED) == Some("on") {
        settings = settings.trust_pushed_payload();
    }
    let vercel = VercelQueues::new(settings).map_err(|e| QUEUE_URL.invalid(e))?;
    Ok(vercel.with_envelope_limits(envelope_limits(config)?))
}

/// The Vercel Queues transport [`QUEUE_URL`] names, as its own type (a worker process
/// answers its callbacks with it).
pub fn vercel_queues_of(config: &Config) -> Result<VercelQueues, ComposeError> {
    vercel_queues(config, config.require(&QUEUE_URL)?)
}

#[cfg(test)]
mod tests {
    use super::super::Queue;
    use super::super::tests::with_queue_url as with;

    #[tokio::test]
    async fn a_bad_region_or_a_missing_token_is_refused_by_name_and_nothing_is_asked_of_vercel() {
        let region = Queue::connect(&with(
            "vercel-queues://Mars!",
            &[("VERCEL_OIDC_TOKEN", "t")],
        ))
        .await
        .expect_err("no such region");
        assert!(region.is_configuration() && region.to_string().contains("--queue-url"));
        let token = Queue::connect(&with("vercel-queues://iad1", &[]))
            .await
            .expect_err("no token");
        assert!(token.to_string().contains("VERCEL_OIDC_TOKEN"), "{token}");
        let vercel = Queue::connect(&with("vercel-queues://iad1", &[("VERCEL_OIDC_TOKEN", "t")]))
            .await
            .expect("composes without a request");
        assert!(vercel.durable && vercel.consumer.is_some() && vercel.depth.is_none());
    }

    #[test]
    fn the_default_consumer_group_is_the_adapters() {
        assert_eq!(
            super::super::VERCEL_QUEUES_CONSUMER_GROUP.default,
            Some(jobs_adapter_vercel_queues::DEFAULT_CONSUMER_GROUP)
        );
    }
}

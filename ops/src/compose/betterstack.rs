//! BetterStack (`alerter = betterstack`): dead-letter alerts as incidents.

use std::sync::Arc;

use jobs_adapter_betterstack::{BetterStackAlerter, BetterStackConfig};
use jobs_core::Alerter;

use super::{
    Adapter, BETTERSTACK_BASE_URL, BETTERSTACK_REQUESTER_EMAIL, BETTERSTACK_TOKEN, ComposeError,
    Config,
};

pub(super) const ADAPTER: Adapter = Adapter {
    feature: "betterstack",
    store: None,
    queue: None,
    rate_limiter: None,
    alerter: Some(alerter),
    depth: None,
};

/// Incidents raised on behalf of [`BETTERSTACK_REQUESTER_EMAIL`] with [`BETTERSTACK_TOKEN`].
fn alerter(config: &Config) -> Result<Arc<dyn Alerter>, ComposeError> {
    let settings = BetterStackConfig::new(
        config.require(&BETTERSTACK_TOKEN)?,
        config.require(&BETTERSTACK_REQUESTER_EMAIL)?,
    )
    .with_base_url(config.require(&BETTERSTACK_BASE_URL)?);
    Ok(Arc::new(
        BetterStackAlerter::new(settings).map_err(ComposeError::BetterStack)?,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{ConfigFile, alerter};

    #[test]
    fn an_alerter_missing_its_token_names_the_variable() {
        let env = BTreeMap::from([
            ("JOBS_ALERTER", "betterstack"),
            ("BETTERSTACK_REQUESTER_EMAIL", "a@b.c"),
        ]);
        let config = super::Config::resolve(
            &BTreeMap::new(),
            &|name| env.get(name).map(|v| (*v).to_owned()),
            &ConfigFile::None,
        )
        .expect("resolves");
        let missing = alerter(&config).err().expect("no token");
        assert!(
            missing.to_string().contains("BETTERSTACK_TOKEN"),
            "{missing}"
        );
    }

    #[test]
    fn the_default_base_url_is_the_adapters() {
        assert_eq!(
            super::super::BETTERSTACK_BASE_URL.default,
            Some(jobs_adapter_betterstack::DEFAULT_BASE_URL)
        );
    }
}

//! What the alerter needs to know: where BetterStack is, who we are, and whom to page how.

use std::fmt;
use std::time::Duration;

/// The BetterStack Uptime API, the default [`BetterStackConfig`] base URL.
pub const DEFAULT_BASE_URL: &str = "https://uptime.betterstack.com";

/// How long one incident request may take, connection included, by default.
///
/// The dead letter is recorded before the alert is raised, but the worker awaits the alert
/// inline, so this bounds how long a BetterStack outage can stall a worker per alert; ten
/// seconds is generous for one small POST.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How incidents are created: the endpoint, the team token, the requester and the channels.
///
/// Built with [`BetterStackConfig::new`] and the `with_*` methods. Defaults: the production
/// [`DEFAULT_BASE_URL`], e-mail and push notifications on, call, SMS and critical alerts off,
/// the team's default escalation policy, and [`DEFAULT_TIMEOUT`].
///
/// The token is a secret: `Debug` prints `<redacted>` in its place.
///
/// ```
/// use jobs_adapter_betterstack::BetterStackConfig;
///
/// let config = BetterStackConfig::new("team-token", "oncall@example.com")
///     .with_call(true)
///     .with_policy_id("12345");
/// assert!(!format!("{config:?}").contains("team-token"));
/// ```
#[derive(Clone)]
pub struct BetterStackConfig {
    pub(crate) base_url: String,
    pub(crate) token: String,
    pub(crate) requester_email: String,
    pub(crate) call: bool,
    pub(crate) sms: bool,
    pub(crate) email: bool,
    pub(crate) push: bool,
    pub(crate) critical_alert: bool,
    pub(crate) team_wait: Option<Duration>,
    pub(crate) policy_id: Option<String>,
    pub(crate) team_name: Option<String>,
    pub(crate) timeout: Duration,
}

impl BetterStackConfig {
    /// A configuration for the Uptime team whose API `token` this is, raising incidents on behalf
    /// of `requester_email` (a user of that team), with the defaults above.
    pub fn new(token: impl Into<String>, requester_email: impl Into<String>) -> Self {
        BetterStackConfig {
            base_url: DEFAULT_BASE_URL.to_owned(),
            token: token.into(),
            requester_email: requester_email.into(),
            call: false,
            sms: false,
            email: true,
            push: true,
            critical_alert: false,
            team_wait: None,
            policy_id: None,
            team_name: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sends requests to `base_url` (scheme, host and optional path prefix) instead of
    /// [`DEFAULT_BASE_URL`]: for a local fake in tests, or a proxy.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Whether BetterStack phones the on-call person (off by default: dead letters can wait for
    /// working hours unless a queue says otherwise).
    pub fn with_call(mut self, call: bool) -> Self {
        self.call = call;
        self
    }

    /// Whether BetterStack sends the on-call person an SMS (off by default).
    pub fn with_sms(mut self, sms: bool) -> Self {
        self.sms = sms;
        self
    }

    /// Whether BetterStack e-mails the on-call person (on by default).
    pub fn with_email(mut self, email: bool) -> Self {
        self.email = email;
        self
    }

    /// Whether BetterStack sends the on-call person a push notification (on by default).
    pub fn with_push(mut self, push: bool) -> Self {
        self.push = push;
        self
    }

    /// Whether the push notification is a critical alert that ignores the mute switch and
    /// Do Not Disturb (off by default).
    pub fn with_critical_alert(mut self, critical_alert: bool) -> Self {
        self.critical_alert = critical_alert;
        self
    }

    /// Escalates to the whole team if nobody acknowledges within `wait` (whole seconds on the
    /// wire). Unset by default: no escalation to the team.
    pub fn with_team_wait(mut self, wait: Duration) -> Self {
        self.team_wait = Some(wait);
        self
    }

    /// Routes the incident through this escalation policy instead of the team's default one.
    pub fn with_policy_id(mut self, policy_id: impl Into<String>) -> Self {
        self.policy_id = Some(policy_id.into());
        self
    }

    /// Names the team that owns the incident: required by BetterStack when the token is a
    /// global API token rather than a team token.
    pub fn with_team_name(mut self, team_name: impl Into<String>) -> Self {
        self.team_name = Some(team_name.into());
        self
    }

    /// Bounds each request, connection included, to `timeout` instead of [`DEFAULT_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl fmt::Debug for BetterStackConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BetterStackConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("requester_email", &self.requester_email)
            .field("call", &self.call)
            .field("sms", &self.sms)
            .field("email", &self.email)
            .field("push", &self.push)
            .field("critical_alert", &self.critical_alert)
            .field("team_wait", &self.team_wait)
            .field("policy_id", &self.policy_id)
            .field("team_name", &self.team_name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

//! Who may use the console: tokens from the configuration, exchanged at sign-in for a session
//! cookie (HttpOnly, SameSite=Strict), each session with its own token against cross-site
//! requests; a token may be scoped to one tenant.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::{COOKIE, HOST, ORIGIN};
use jobs_core::TenantId;

use crate::hosts::{AllowedHosts, PublicUrl};

/// The session cookie's name over plain http.
pub(crate) const COOKIE_NAME: &str = "jobs_console";
/// Its name when the console is reached over https: the prefix makes browsers refuse it
/// unless it is `Secure`, for the whole host (`Path=/`, no `Domain`).
pub(crate) const SECURE_COOKIE_NAME: &str = "__Host-jobs_console";

/// How long a session lasts after sign-in.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// A sign-in token: the secret an operator types, the one tenant it is limited to, if any,
/// and the name the dead letters' history records for what its sessions do, if given.
///
/// Parsed from `[NAME=]SECRET[@TENANT_ID]` (`JOBS_CONSOLE_TOKENS` holds several,
/// comma-separated; [`ConsoleToken::parse_list`]). A secret must be at least 16 characters; a
/// name is 1 to 64 letters, digits, `.`, `_` or `-`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConsoleToken {
    secret: String,
    tenant: Option<TenantId>,
    name: Option<String>,
}

impl fmt::Debug for ConsoleToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsoleToken")
            .field("secret", &"…")
            .field("tenant", &self.tenant)
            .field("name", &self.name)
            .finish()
    }
}

/// The longest name a token may have.
const MAX_NAME_LEN: usize = 64;

/// The shortest secret a token may have.
pub const MIN_SECRET_LEN: usize = 16;

impl ConsoleToken {
    /// A token that sees every tenant's data.
    pub fn operator(secret: impl Into<String>) -> Result<Self, String> {
        Self::checked(secret.into(), None)
    }

    /// A token that sees `tenant`'s data only, everywhere in the console.
    pub fn tenant(secret: impl Into<String>, tenant: TenantId) -> Result<Self, String> {
        Self::checked(secret.into(), Some(tenant))
    }

    fn checked(secret: String, tenant: Option<TenantId>) -> Result<Self, String> {
        if secret.chars().count() < MIN_SECRET_LEN {
            return Err(format!(
                "a console token's secret needs at least {MIN_SECRET_LEN} characters"
            ));
        }
        Ok(ConsoleToken {
            secret,
            tenant,
            name: None,
        })
    }

    /// The same token, whose sessions the history records as `name` (an operator's, say).
    pub fn named(mut self, name: &str) -> Result<Self, String> {
        let valid = (1..=MAX_NAME_LEN).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid {
            return Err(format!(
                "`{name}` before = is not a token name (1 to {MAX_NAME_LEN} letters, digits, \
                 `.`, `_` or `-`)"
            ));
        }
        self.name = Some(name.to_owned());
        Ok(self)
    }

    /// The tenant it is limited to, if any.
    pub fn tenant_scope(&self) -> Option<TenantId> {
        self.tenant
    }

    /// The name it was given, if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The tokens of a comma-separated list (blank entries skipped), or the first entry's
    /// problem.
    pub fn parse_list(list: &str) -> Result<Vec<ConsoleToken>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::parse)
            .collect()
    }
}

impl FromStr for ConsoleToken {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = match s.split_once('=') {
            Some((name, rest)) => (Some(name), rest),
            None => (None, s),
        };
        let token = match rest.rsplit_once('@') {
            Some((secret, tenant)) => {
                let tenant = tenant
                    .parse()
                    .map_err(|e| format!("`{tenant}` after @ is not a tenant id: {e}"))?;
                ConsoleToken::tenant(secret, tenant)
            }
            None => ConsoleToken::operator(rest),
        }
        .map_err(|e| format!("{e} (a token is [NAME=]SECRET[@TENANT_ID])"))?;
        match name {
            Some(name) => token.named(name),
            None => Ok(token),
        }
    }
}

/// One signed-in browser.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The tenant it is limited to.
    pub(crate) tenant: Option<TenantId>,
    /// The name of the token it signed in with, if it had one.
    pub(crate) name: Option<String>,
    /// The token every state-changing form carries.
    pub(crate) csrf: String,
    /// Whether it signed in with a token (a console without sign-in has one open session that
    /// cannot sign out).
    pub(crate) signed_in: bool,
    expires: Instant,
}

/// The tokens and the live sessions.
pub(crate) struct Gate {
    tokens: Vec<ConsoleToken>,
    /// Where operators reach the console, when not at the listener's own address.
    public: Option<PublicUrl>,
    /// No sign-in at all: for a console on a loopback address, asked for explicitly.
    open: Option<Session>,
    sessions: Mutex<HashMap<String, Session>>,
}

impl Gate {
    pub(crate) fn new(tokens: Vec<ConsoleToken>) -> Self {
        Gate {
            tokens,
            public: None,
            open: None,
            sessions: Mutex::default(),
        }
    }

    /// Makes this the gate of a console reached at `public`.
    pub(crate) fn reached_at(&mut self, public: PublicUrl) {
        self.public = Some(public);
    }

    fn secure(&self) -> bool {
        self.public.as_ref().is_some_and(PublicUrl::secure)
    }

    fn cookie_name(&self) -> &'static str {
        if self.secure() {
            SECURE_COOKIE_NAME
        } else {
            COOKIE_NAME
        }
    }

    /// The Set-Cookie value of session `id`: `Secure` and `__Host-` over https.
    pub(crate) fn session_cookie(&self, id: &str) -> String {
        let secure = if self.secure() { "; Secure" } else { "" };
        format!(
            "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
            self.cookie_name(),
            SESSION_LIFETIME.as_secs()
        )
    }

    /// The Set-Cookie value that ends the session.
    pub(crate) fn cleared_cookie(&self) -> String {
        let secure = if self.secure() { "; Secure" } else { "" };
        format!(
            "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}",
            self.cookie_name()
        )
    }

    /// Whether a state-changing request comes from the console's own pages: `Sec-Fetch-Site`,
    /// when sent, does not say cross-site, and `Origin` (which browsers send on every POST)
    /// is an allowed origin: the public URL's, or `http://` with a `Host` that `hosts`
    /// allows and the request was sent to. Scheme, host and port are all compared, so
    /// `https://127.0.0.1:PORT` is no origin of an http listener. A request with neither
    /// header is no browser's, and the form's token still has to match.
    pub(crate) fn same_origin(&self, headers: &HeaderMap, hosts: &AllowedHosts) -> bool {
        let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        if matches!(fetch_site, Some("cross-site" | "same-site")) {
            return false;
        }
        let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) else {
            return true;
        };
        let origin = origin.to_ascii_lowercase();
        if self.public.as_ref().is_some_and(|p| p.origin() == origin) {
            return true;
        }
        let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        origin.strip_prefix("http://") == Some(host.to_ascii_lowercase().as_str())
            && hosts.allows(host)
    }

    pub(crate) fn open() -> Self {
        Gate {
            tokens: vec![],
            public: None,
            open: Some(Session {
                tenant: None,
                name: None,
                csrf: random_hex(),
                signed_in: false,
                expires: Instant::now() + Duration::from_secs(100 * 365 * 86_400),
            }),
            sessions: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // Every mutation leaves the map consistent before it can panic.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new session for `secret`, and its cookie value; `None` when no token has it. Every
    /// token is compared, in time independent of where they differ.
    pub(crate) fn sign_in(&self, secret: &str) -> Option<String> {
        let token = self.tokens.iter().fold(None, |found, token| {
            if constant_time_eq(token.secret.as_bytes(), secret.as_bytes()) {
                Some(token)
            } else {
                found
            }
        })?;
        let id = random_hex();
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.retain(|_, s| s.expires > now);
        sessions.insert(
            id.clone(),
            Session {
                tenant: token.tenant,
                name: token.name.clone(),
                csrf: random_hex(),
                signed_in: true,
                expires: now + SESSION_LIFETIME,
            },
        );
        Some(id)
    }

    pub(crate) fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, self.cookie_name()) {
            self.lock().remove(&id);
        }
    }

    /// The session of the request, if it has a live one.
    pub(crate) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        if let Some(open) = &self.open {
            return Some(open.clone());
        }
        let id = cookie(headers, self.cookie_name())?;
        let sessions = self.lock();
        sessions
            .get(&id)
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }
}

/// The value of the cookie `cookie_name` in `headers`.
fn cookie(headers: &HeaderMap, cookie_name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == cookie_name)
        .map(|(_, value)| value.to_owned())
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 32 random bytes from the operating system, as hex.
fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    // Without the OS's randomness no session can be trusted: refuse to go on.
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_parse_with_or_without_a_tenant_and_refuse_short_secrets() {
        let operator: ConsoleToken = "0123456789abcdef".parse().expect("a token");
        assert_eq!(operator.tenant_scope(), None);
        let tenant: ConsoleToken = "0123456789abcdef@00000000-0000-4000-8000-000000000001"
            .parse()
            .expect("a token");
        assert!(tenant.tenant_scope().is_some());
        assert!("short".parse::<ConsoleToken>().is_err());
        assert!("0123456789abcdef@nobody".parse::<ConsoleToken>().is_err());
        assert!(
            !format!("{operator:?}").contains("0123"),
            "the secret is not shown"
        );
    }

    #[test]
    fn a_token_may_carry_a_name_for_the_history() {
        let alice: ConsoleToken = "alice=0123456789abcdef".parse().expect("a token");
        assert_eq!(alice.name(), Some("alice"));
        assert_eq!(alice.tenant_scope(), None);
        let bob: ConsoleToken = "bob.ops=0123456789abcdef@00000000-0000-4000-8000-000000000001"
            .parse()
            .expect("a token");
        assert_eq!(bob.name(), Some("bob.ops"));
        assert!(bob.tenant_scope().is_some());
        let e = "no one=0123456789abcdef"
            .parse::<ConsoleToken>()
            .expect_err("a space");
        assert!(e.contains("`no one` before = is not a token name"), "{e}");
        let e = "=0123456789abcdef"
            .parse::<ConsoleToken>()
            .expect_err("empty");
        assert!(e.contains("token name"), "{e}");
        // A secret ending in base64 padding reads as a name and a short secret: refused,
        // saying the shape, never signed in with half the secret.
        let e = "c2VjcmV0LXNlY3JldC1zZWNyZXQ="
            .parse::<ConsoleToken>()
            .expect_err("padded");
        assert!(e.contains("[NAME=]SECRET[@TENANT_ID]"), "{e}");
        let list = ConsoleToken::parse_list(
            " alice=0123456789abcdef, ,0123456789abcdef@00000000-0000-4000-8000-000000000001 ",
        )
        .expect("two tokens");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].name(), Some("alice"));
        assert!(ConsoleToken::parse_list("short").is_err());
    }

    #[test]
    fn a_cross_site_post_is_refused() {
        let (gate, hosts) = (Gate::new(vec![]), AllowedHosts::new());
        let same = |origin: Option<&'static str>, host: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, HeaderValue::from_static(host));
            if let Some(origin) = origin {
                headers.insert(ORIGIN, HeaderValue::from_static(origin));
            }
            gate.same_origin(&headers, &hosts)
        };
        assert!(
            same(None, "127.0.0.1:8080"),
            "no browser headers: the token decides"
        );
        assert!(same(Some("http://127.0.0.1:8080"), "127.0.0.1:8080"));
        assert!(!same(Some("https://evil.example"), "127.0.0.1:8080"));
        assert!(
            !same(Some("https://127.0.0.1:8080"), "127.0.0.1:8080"),
            "the scheme counts"
        );
        assert!(
            !same(Some("http://127.0.0.1:8081"), "127.0.0.1:8080"),
            "the port counts"
        );
        assert!(
            !same(
                Some("http://rebind.evil.example:8080"),
                "rebind.evil.example:8080"
            ),
            "a Host that is not allowed makes no origin"
        );
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1:8080"));
        headers.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!gate.same_origin(&headers, &hosts));
    }

    #[test]
    fn behind_tls_the_public_origin_is_allowed_and_the_cookie_is_secure_and_host_prefixed() {
        let public = PublicUrl::parse("HTTPS://Jobs.Example.com:443/console").expect("a URL");
        let mut gate = Gate::new(vec![]);
        gate.reached_at(public);
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("10.0.0.5:9464"));
        headers.insert(ORIGIN, HeaderValue::from_static("https://jobs.example.com"));
        assert!(gate.same_origin(&headers, &AllowedHosts::new()));
        headers.insert(ORIGIN, HeaderValue::from_static("http://jobs.example.com"));
        assert!(
            !gate.same_origin(&headers, &AllowedHosts::new()),
            "not over http"
        );
        let cookie = gate.session_cookie("abc");
        assert!(
            cookie.starts_with("__Host-jobs_console=abc;") && cookie.ends_with("; Secure"),
            "{cookie}"
        );
        assert!(gate.cleared_cookie().contains("Secure"));
        let plain = Gate::new(vec![]).session_cookie("abc");
        assert!(
            plain.starts_with("jobs_console=abc;") && !plain.contains("Secure"),
            "{plain}"
        );
        for bad in [
            "ftp://x",
            "jobs.example.com",
            "https://",
            "https://user@host",
        ] {
            assert!(PublicUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sign_in_needs_a_configured_secret() {
        let gate = Gate::new(vec![
            ConsoleToken::operator("0123456789abcdef").expect("a token"),
        ]);
        assert!(gate.sign_in("0123456789abcdeX").is_none());
        let id = gate.sign_in("0123456789abcdef").expect("signed in");
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE_NAME}={id}")).expect("a header"),
        );
        assert!(gate.session(&headers).is_some());
        gate.sign_out(&headers);
        assert!(gate.session(&headers).is_none());
    }
}

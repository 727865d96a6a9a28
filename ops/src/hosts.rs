//! Which `Host` a listener of this crate answers: the defence against DNS rebinding, where a
//! page on another site, in an operator's browser, names its own domain for an address of
//! ours (a console on loopback, a worker's endpoints) and reads or posts there.
//!
//! A rebinding request always carries a DNS name in `Host`, so an IP literal (`127.0.0.1:9464`,
//! `[::1]:8080`, a pod's address) and `localhost` are answered, and so is any name the
//! operator allows ([`AllowedHosts::with`], `JOBS_ALLOWED_HOSTS`); any other request, or one
//! without `Host`, gets `421 Misdirected Request` before a handler runs. The model is Django's
//! `ALLOWED_HOSTS` with the loopback servers' rule (Jupyter's, Grafana's) built in.

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::HOST;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

/// The address operators reach the console at when it is not the listener's own: behind a
/// TLS-terminating proxy, `https://jobs.example.com`. Its origin is the one a browser's
/// `Origin` then names, and an https one makes the session cookie `Secure` with the
/// `__Host-` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// `scheme://host[:port]`, lower-case, without a default port.
    origin: String,
    secure: bool,
}

impl PublicUrl {
    /// `url` (`https://jobs.example.com`, `http://console.internal:8080`, a path allowed and
    /// ignored), or why it is not one.
    pub fn parse(url: &str) -> Result<PublicUrl, String> {
        let refused = || format!("`{url}` is not an http:// or https:// URL of a host");
        let (scheme, rest) = url.split_once("://").ok_or_else(refused)?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "https" => "443",
            "http" => "80",
            _ => return Err(refused()),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.is_empty() || authority.contains('@') {
            return Err(refused());
        }
        let authority = authority.to_ascii_lowercase();
        let authority = authority
            .strip_suffix(&format!(":{default_port}"))
            .unwrap_or(&authority);
        Ok(PublicUrl {
            origin: format!("{scheme}://{authority}"),
            secure: scheme == "https",
        })
    }

    /// `scheme://host[:port]`, as a browser's `Origin` names it.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether it is reached over https.
    pub fn secure(&self) -> bool {
        self.secure
    }
}

/// The names a listener answers besides IP literals and `localhost`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lower-case names, each with the one port it is allowed on, or any port.
    names: Vec<(String, Option<u16>)>,
}

impl AllowedHosts {
    /// IP literals and `localhost` only.
    pub fn new() -> Self {
        AllowedHosts::default()
    }

    /// `list`, comma-separated (`jobs.example.com`, `console.internal:8443`): a name alone is
    /// allowed on any port, `name:port` on that port. Refuses an entry that is no host name,
    /// naming it.
    pub fn parse_list(list: &str) -> Result<AllowedHosts, String> {
        let mut hosts = AllowedHosts::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, port) = split_port(entry)
                .filter(|(name, _)| is_name(name))
                .ok_or_else(|| format!("`{entry}` is not a host name or name:port"))?;
            hosts = hosts.with(name, port);
        }
        Ok(hosts)
    }

    /// The same, also answering `name` (on `port`, or any port when `None`).
    pub fn with(mut self, name: &str, port: Option<u16>) -> Self {
        self.names.push((name.to_ascii_lowercase(), port));
        self
    }

    /// These names and `other`'s.
    pub fn merged(mut self, other: AllowedHosts) -> Self {
        self.names.extend(other.names);
        self
    }

    /// Whether a request whose `Host` is `host` is answered.
    pub fn allows(&self, host: &str) -> bool {
        let Some((name, port)) = split_port(host) else {
            return false;
        };
        let name = name.to_ascii_lowercase();
        if name == "localhost" || bare(&name).parse::<IpAddr>().is_ok() {
            return true;
        }
        (self.names.iter())
            .any(|(allowed, on)| *allowed == name && on.is_none_or(|p| Some(p) == port))
    }

    /// `router` with every request checked first: `421` for a `Host` these do not allow.
    pub fn guard(self, router: Router) -> Router {
        router.layer(middleware::from_fn_with_state(Arc::new(self), check))
    }
}

/// An IPv6 literal without its brackets.
fn bare(name: &str) -> &str {
    name.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name)
}

/// `host[:port]` as the name and the port; `None` for a port that is not a number.
fn split_port(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = match host.rsplit_once(':') {
        // `[::1]:80` has a port; `::1` alone is not a valid Host and stays whole.
        Some((name, port)) if !name.contains(':') || name.ends_with(']') => (name, Some(port)),
        _ => (host, None),
    };
    let port = port.map(str::parse).transpose().ok()?;
    (!name.is_empty()).then_some((name, port))
}

/// Whether `name` is a DNS name: labels of letters, digits and hyphens.
fn is_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

async fn check(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    let host = (request.headers().get(HOST))
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match host {
        Some(host) if hosts.allows(host) => next.run(request).await,
        _ => {
            tracing::warn!(host = ?host, path = %request.uri().path(), "request for another host refused");
            (
                StatusCode::MISDIRECTED_REQUEST,
                "this server does not answer for that host: add it to JOBS_ALLOWED_HOSTS\n",
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_and_localhost_are_answered_and_names_only_when_allowed() {
        let hosts =
            AllowedHosts::parse_list("Jobs.Example.com, console.internal:8443").expect("valid");
        for ok in [
            "127.0.0.1:9464",
            "10.1.2.3",
            "[::1]:8080",
            "localhost:9464",
            "LOCALHOST",
            "jobs.example.com",
            "jobs.example.com:443",
            "console.internal:8443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "rebind.evil.example:9464",
            "console.internal:8444",
            "console.internal",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
            ":80",
            "jobs.example.com:notaport",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
    }

    #[test]
    fn a_list_entry_that_is_no_host_name_is_refused_by_name() {
        for bad in ["http://jobs.example.com", "jobs example", "a..b", "x:99999"] {
            let error = AllowedHosts::parse_list(bad).expect_err(bad);
            assert!(error.contains(bad), "{error}");
        }
    }
}

//! Preflight for the local services tests need: fail early with a clear message instead of a
//! pile of connection errors from individual tests.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A local service some tests connect to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Service {
    /// Human name, e.g. `PostgreSQL`.
    pub(crate) name: &'static str,
    /// The environment variable holding its URL.
    pub(crate) env: &'static str,
    /// The URL used when `env` is unset or empty.
    pub(crate) default_url: &'static str,
    /// The port used when the URL names none.
    pub(crate) default_port: u16,
    /// Whether CI needs it; services not required are not checked.
    pub(crate) required: bool,
    /// How to start it locally, for the failure message.
    pub(crate) start: &'static str,
}

/// The services CI may need. Flip `required` once an adapter's tests use the service.
pub(crate) const SERVICES: &[Service] = &[
    Service {
        name: "PostgreSQL",
        env: "DATABASE_URL",
        default_url: "postgres://postgres@127.0.0.1:5432/postgres",
        default_port: 5432,
        required: true,
        start: "pg_ctlcluster --skip-systemctl-redirect <version> main start \
                (`.ci/run` does this when the server is down)",
    },
    Service {
        name: "Redis",
        env: "REDIS_URL",
        default_url: "redis://127.0.0.1:6379",
        default_port: 6379,
        required: true,
        start: "redis-server --daemonize yes, or docker run -d -p 6379:6379 redis",
    },
];

/// How long one TCP connect may take before the service counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(2);

/// One message per required service that cannot be reached; `var` reads the environment.
pub(crate) fn problems(services: &[Service], var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    services
        .iter()
        .filter(|service| service.required)
        .filter_map(|service| problem(service, &var))
        .collect()
}

fn problem(service: &Service, var: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let Service { name, env, .. } = service;
    let (url, source) = match var(env).filter(|url| !url.is_empty()) {
        Some(url) => (url, format!("from {env}")),
        None => (
            service.default_url.to_owned(),
            format!("default; {env} is unset"),
        ),
    };
    // The URL may hold a password, so messages show only host and port.
    let (host, port) = match host_port(&url, service.default_port) {
        Ok(address) => address,
        Err(why) => {
            return Some(format!(
                "{name}: {env} is not a scheme://[user[:password]@]host[:port][/...] URL: {why}. \
                 Fix {env}."
            ));
        }
    };
    let error = connect(&host, port, TIMEOUT).err()?;
    let shown = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Some(format!(
        "{name} is unreachable at {shown} ({source}): {}. Start it ({}) or set {env}.",
        describe(&error),
        service.start,
    ))
}

/// The host (IPv6 without brackets) and port of `scheme://[user[:password]@]host[:port][/...]`.
pub(crate) fn host_port(url: &str, default_port: u16) -> Result<(String, u16), &'static str> {
    let (_, rest) = url.split_once("://").ok_or("no `scheme://`")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host_port)| host_port);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or("no `]` after an IPv6 host")?;
            match after {
                "" => (host, None),
                after => (host, Some(after.strip_prefix(':').ok_or("junk after `]`")?)),
            }
        }
        None => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err("no host");
    }
    let port = match port {
        None | Some("") => default_port,
        Some(port) => port
            .parse()
            .map_err(|_| "the port is not a number up to 65535")?,
    };
    Ok((host.to_owned(), port))
}

/// Ok when a TCP connection to any address of `host:port` opens within `timeout`.
pub(crate) fn connect(host: &str, port: u16, timeout: Duration) -> io::Result<()> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(_) => return Ok(()),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// `connection refused` rather than `Connection refused (os error 111)` where the kind says it all.
fn describe(error: &io::Error) -> String {
    use io::ErrorKind::*;
    match error.kind() {
        ConnectionRefused | TimedOut | HostUnreachable | NetworkUnreachable | AddrNotAvailable => {
            error.kind().to_string()
        }
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn parses_host_and_port() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/postgres",
                ("127.0.0.1", 5432),
            ),
            (
                "postgres://u:p%40ss@db.example:6543/x?sslmode=off",
                ("db.example", 6543),
            ),
            ("postgresql://localhost/db", ("localhost", 5432)),
            ("redis://127.0.0.1:6379", ("127.0.0.1", 6379)),
            ("redis://:secret@cache:7000/0", ("cache", 7000)),
            ("postgres://u@[::1]:5433/db", ("::1", 5433)),
            ("postgres://[fe80::1]/db", ("fe80::1", 5432)),
            ("redis://host:", ("host", 5432)),
        ];
        for (url, (host, port)) in cases {
            assert_eq!(host_port(url, 5432), Ok((host.to_owned(), port)), "{url}");
        }
    }

    #[test]
    fn rejects_urls_without_a_usable_host_or_port() {
        assert!(host_port("127.0.0.1:5432", 5432).is_err());
        assert!(host_port("postgres:///db", 5432).is_err());
        assert!(host_port("postgres://u@/db", 5432).is_err());
        assert!(host_port("postgres://[::1/db", 5432).is_err());
        assert!(host_port("postgres://[::1]x/db", 5432).is_err());
        assert!(host_port("postgres://h:99999/db", 5432).is_err());
        assert!(host_port("postgres://h:abc/db", 5432).is_err());
    }

    #[test]
    fn defaults_parse() {
        for service in SERVICES {
            assert!(host_port(service.default_url, service.default_port).is_ok());
        }
    }

    #[test]
    fn connect_sees_a_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(connect("127.0.0.1", port, TIMEOUT).is_ok());
    }

    #[test]
    fn connect_fails_on_a_closed_port() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert!(connect("127.0.0.1", port, TIMEOUT).is_err());
    }

    #[test]
    fn only_required_unreachable_services_are_problems() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap().port();
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let service = Service {
            name: "PostgreSQL",
            env: "DATABASE_URL",
            default_url: "postgres://127.0.0.1:1/x",
            default_port: 5432,
            required: true,
            start: "pg_ctlcluster 16 main start",
        };
        let with = |port: u16| move |_: &str| Some(format!("postgres://u:pw@127.0.0.1:{port}/x"));

        assert!(problems(&[service], with(open)).is_empty());
        assert_eq!(
            problems(&[service], with(closed)),
            [format!(
                "PostgreSQL is unreachable at 127.0.0.1:{closed} (from DATABASE_URL): \
                 connection refused. Start it (pg_ctlcluster 16 main start) or set DATABASE_URL."
            )]
        );
        let optional = Service {
            required: false,
            ..service
        };
        assert!(problems(&[optional], with(closed)).is_empty());
        let unset = problems(&[service], |_: &str| None);
        assert!(
            unset[0].contains("(default; DATABASE_URL is unset)"),
            "{unset:?}"
        );
        let bad = problems(&[service], |_: &str| Some("not a url".to_owned()));
        assert!(
            bad[0].starts_with("PostgreSQL: DATABASE_URL is not a"),
            "{bad:?}"
        );
    }
}

//! `jobs-fakes`: run a vendor fake as a local development stack.
//!
//! ```sh
//! cargo run -p jobs-testkit --bin jobs-fakes -- betterstack --port 8787
//! ```
//!
//! Prints the base URL and the credentials to configure, then serves until interrupted.
//! Exit codes: 0 after an interrupt, 1 when the port cannot be bound, 2 for usage errors.
//!
//! The Resend fake enforces the rate it advertises in its `ratelimit-*` headers, Resend's
//! 5 requests per second unless `--rate-limit N` says otherwise (`0` enforces none), and
//! answers control endpoints under `/_fake/` (a prefix Resend never uses) so that tests in
//! another process can inject faults: `POST /_fake/fail-next` `{"status": 429|500|503,
//! "count": n}` answers the next `n` batch requests with that status (any of 400 to 599, a
//! Resend error body; `429` with `retry-after`, `"retry_after": s`, default 1),
//! `POST /_fake/drop-next`
//! `{"count": n}` accepts and records the next `n` batches but never answers them,
//! `POST /_fake/lose-answer-next` `{"count": n}` accepts and records them but answers `500`,
//! and `GET /_fake/sent` lists the emails accepted (`FakeResend::enable_control` has the
//! details).
//!
//! The QStash fake signs deliveries with the current signing key, or with `--sign-with-next-key`
//! with the next one, as QStash does after a key rotation: a receiver's fallback to the next key
//! can then be checked from another process (the conformance suite in `conformance/` does).

use jobs_testkit::fakes::qstash::{DEV_CURRENT_KEY, DEV_NEXT_KEY, DEV_TOKEN, FakeQStash};
use std::process::ExitCode;
use std::time::Duration;

use jobs_testkit::fakes::betterstack::FakeBetterStack;
use jobs_testkit::fakes::resend::{FakeResend, RATE_LIMIT_PER_SECOND};
use jobs_testkit::fakes::vercel_queues::FakeVercelQueues;

const USAGE: &str = "\
usage: jobs-fakes <vendor> [--port N]
       jobs-fakes resend [--port N] [--rate-limit N]
       jobs-fakes qstash [--port N] [--sign-with-next-key]

vendors:
  betterstack   BetterStack Uptime incidents API (POST /api/v3/incidents)
  resend        Resend batch emails API (POST /emails/batch)
  vercel-queues Vercel Queues v3 API (/api/v3/topic/...)
  qstash        Upstash QStash (publish, signed deliveries, queues, schedules, DLQ),
                with the published local-development token and signing keys

resend options:
  --rate-limit N  batch requests admitted per second, 429 beyond (default 5, Resend's;
                  0 enforces none)
qstash options:
  --sign-with-next-key  sign deliveries with the next signing key, as after a rotation
resend control endpoints (not Resend's; no API key; JSON bodies, count defaults to 1):
  POST /_fake/fail-next         {\"status\": 429|500|503, \"count\": n, \"retry_after\": s}
                                the next n batch requests answer that status (any of
                                400-599, a Resend error body; 429 with retry-after: s)
  POST /_fake/drop-next         {\"count\": n}: the next n batches are recorded, never answered
  POST /_fake/lose-answer-next  {\"count\": n}: the next n batches are recorded, answered 500
  GET  /_fake/sent              {\"data\": [...]}: the emails accepted so far";

fn parse(args: &[String]) -> Result<(String, u16), String> {
    let mut vendor = None;
    let mut port = 0;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--port" => {
                let value = rest.next().ok_or("--port needs a number")?;
                port = value
                    .parse()
                    .map_err(|_| format!("--port: `{value}` is not a port number"))?;
            }
            "-h" | "--help" => return Err(String::new()),
            v if vendor.is_none() && !v.starts_with('-') => vendor = Some(v.to_owned()),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok((vendor.ok_or("which vendor?")?, port))
}

/// Takes the flag `flag` out of `args`: the rest, and whether it was there.
fn take_flag(args: Vec<String>, flag: &str) -> (Vec<String>, bool) {
    let before = args.len();
    let rest: Vec<String> = args.into_iter().filter(|arg| arg != flag).collect();
    let found = rest.len() != before;
    (rest, found)
}

/// Takes the Resend fake's `--rate-limit N` out of `args`, leaving the rest to [`parse`].
fn take_rate_limit(args: Vec<String>) -> Result<(Vec<String>, Option<usize>), String> {
    let mut rest = Vec::with_capacity(args.len());
    let mut rate_limit = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--rate-limit" {
            let value = args.next().ok_or("--rate-limit needs a number")?;
            let limit = value.parse().map_err(|_| {
                format!("--rate-limit: `{value}` is not a number of requests per second")
            })?;
            rate_limit = Some(limit);
        } else {
            rest.push(arg);
        }
    }
    Ok((rest, rate_limit))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (args, sign_with_next) = take_flag(args, "--sign-with-next-key");
    let parsed = take_rate_limit(args).and_then(|(args, rate_limit)| {
        let (vendor, port) = parse(&args)?;
        if rate_limit.is_some() && vendor != "resend" {
            return Err("--rate-limit applies to the resend fake only".to_owned());
        }
        if sign_with_next && vendor != "qstash" {
            return Err("--sign-with-next-key applies to the qstash fake only".to_owned());
        }
        Ok((vendor, port, rate_limit))
    });
    let (vendor, port, rate_limit) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("error: {message}\n");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if message.is_empty() { 0 } else { 2 });
        }
    };
    let fake = match vendor.as_str() {
        "betterstack" => FakeBetterStack::start_on(port, "local-betterstack-token").await,
        "resend" => return serve_resend(port, rate_limit).await,
        "vercel-queues" => return serve_vercel_queues(port).await,
        "qstash" => return serve_qstash(port, sign_with_next).await,
        other => {
            eprintln!("error: no fake for `{other}` yet\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let fake = match fake {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("BetterStack fake listening");
    println!("  base URL: {}", fake.base_url());
    println!("  token:    {}", fake.token());
    println!("Ctrl-C to stop.");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("error: waiting for Ctrl-C: {e}");
    }
    for incident in fake.incidents() {
        println!("incident received: {incident}");
    }
    fake.shutdown().await;
    ExitCode::SUCCESS
}

/// Serves the Resend fake until interrupted, then prints the emails it accepted.
///
/// `rate_limit` is in batch requests per second, `None` for Resend's, `Some(0)` for none.
async fn serve_resend(port: u16, rate_limit: Option<usize>) -> ExitCode {
    let fake = match FakeResend::start_on(port, "re_local_resend_key").await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rate_limit = rate_limit.unwrap_or(RATE_LIMIT_PER_SECOND);
    if rate_limit > 0 {
        fake.limit_rate(rate_limit, Duration::from_secs(1));
    }
    fake.enable_control();
    println!("Resend fake listening");
    println!("  base URL: {}", fake.base_url());
    println!("  API key:  {}", fake.api_key());
    if rate_limit > 0 {
        println!("  rate:     {rate_limit} requests/s enforced (429 beyond)");
    } else {
        println!("  rate:     not enforced");
    }
    println!("  control:  {}/_fake/ (see --help)", fake.base_url());
    println!("Ctrl-C to stop.");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("error: waiting for Ctrl-C: {e}");
    }
    for email in fake.sent() {
        println!("email accepted: {email}");
    }
    fake.shutdown().await;
    ExitCode::SUCCESS
}

/// Serves the Vercel Queues fake until interrupted, then prints the messages it accepted.
async fn serve_vercel_queues(port: u16) -> ExitCode {
    let fake = match FakeVercelQueues::start_with_token(port, "local-vercel-oidc-token").await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("Vercel Queues fake listening");
    println!("  base URL: {}", fake.base_url());
    println!("  token:    {}", fake.token());
    println!("Ctrl-C to stop.");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("error: waiting for Ctrl-C: {e}");
    }
    for message in fake.sent() {
        println!(
            "message accepted: topic {} id {} ({} bytes)",
            message.topic,
            message.message_id.as_deref().unwrap_or("(deferred)"),
            message.body.len()
        );
    }
    fake.shutdown().await;
    ExitCode::SUCCESS
}

/// Serves the QStash fake until interrupted, then prints the deliveries it made; with
/// `sign_with_next` it signs them with the next signing key.
async fn serve_qstash(port: u16, sign_with_next: bool) -> ExitCode {
    let fake = match FakeQStash::start_on(port, DEV_TOKEN, DEV_CURRENT_KEY, DEV_NEXT_KEY).await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    fake.sign_with_next_key(sign_with_next);
    println!("QStash fake listening");
    println!("  QSTASH_URL:                 {}", fake.base_url());
    println!("  QSTASH_TOKEN:               {}", fake.token());
    println!(
        "  QSTASH_CURRENT_SIGNING_KEY: {}",
        fake.current_signing_key()
    );
    println!("  QSTASH_NEXT_SIGNING_KEY:    {}", fake.next_signing_key());
    if sign_with_next {
        println!("  signing with:               the next key (as after a rotation)");
    }
    println!("Ctrl-C to stop.");
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("error: waiting for Ctrl-C: {e}");
    }
    for attempt in fake.attempts() {
        println!(
            "delivered {} (retried {}): answered {:?}",
            attempt.message_id, attempt.retried, attempt.status
        );
    }
    fake.shutdown().await;
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::{parse, take_flag};

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments_name_the_vendor_and_an_optional_port() {
        assert_eq!(
            parse(&args(&["betterstack"])),
            Ok(("betterstack".into(), 0))
        );
        assert_eq!(
            parse(&args(&["betterstack", "--port", "8787"])),
            Ok(("betterstack".into(), 8787))
        );
        assert!(parse(&args(&["betterstack", "--port", "http"])).is_err());
        assert!(parse(&args(&["--port", "1"])).is_err());
        assert!(parse(&args(&["a", "b"])).is_err());
    }

    #[test]
    fn a_flag_is_taken_out_wherever_it_stands() {
        assert_eq!(
            take_flag(
                args(&["qstash", "--sign-with-next-key", "--port", "1"]),
                "--sign-with-next-key"
            ),
            (args(&["qstash", "--port", "1"]), true)
        );
        assert_eq!(
            take_flag(args(&["qstash", "--port", "1"]), "--sign-with-next-key"),
            (args(&["qstash", "--port", "1"]), false)
        );
    }
}

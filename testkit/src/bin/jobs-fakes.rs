//! `jobs-fakes`: run a vendor fake as a local development stack.
//!
//! ```sh
//! cargo run -p jobs-testkit --bin jobs-fakes -- betterstack --port 8787
//! ```
//!
//! Prints the base URL and the credentials to configure, then serves until interrupted.
//! Exit codes: 0 after an interrupt, 1 when the port cannot be bound, 2 for usage errors.

use jobs_testkit::fakes::qstash::{DEV_CURRENT_KEY, DEV_NEXT_KEY, DEV_TOKEN, FakeQStash};
use std::process::ExitCode;

use jobs_testkit::fakes::betterstack::FakeBetterStack;
use jobs_testkit::fakes::resend::FakeResend;
use jobs_testkit::fakes::vercel_queues::FakeVercelQueues;

const USAGE: &str = "\
usage: jobs-fakes <vendor> [--port N]

vendors:
  betterstack   BetterStack Uptime incidents API (POST /api/v3/incidents)
  resend        Resend batch emails API (POST /emails/batch)
  vercel-queues Vercel Queues v3 API (/api/v3/topic/...)
  qstash        Upstash QStash (publish, signed deliveries, queues, schedules, DLQ),
                with the published local-development token and signing keys";

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

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (vendor, port) = match parse(&args) {
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
        "resend" => return serve_resend(port).await,
        "vercel-queues" => return serve_vercel_queues(port).await,
        "qstash" => return serve_qstash(port).await,
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
async fn serve_resend(port: u16) -> ExitCode {
    let fake = match FakeResend::start_on(port, "re_local_resend_key").await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("Resend fake listening");
    println!("  base URL: {}", fake.base_url());
    println!("  API key:  {}", fake.api_key());
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

/// Serves the QStash fake until interrupted, then prints the deliveries it made.
async fn serve_qstash(port: u16) -> ExitCode {
    let fake = match FakeQStash::start_on(port, DEV_TOKEN, DEV_CURRENT_KEY, DEV_NEXT_KEY).await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("QStash fake listening");
    println!("  QSTASH_URL:                 {}", fake.base_url());
    println!("  QSTASH_TOKEN:               {}", fake.token());
    println!(
        "  QSTASH_CURRENT_SIGNING_KEY: {}",
        fake.current_signing_key()
    );
    println!("  QSTASH_NEXT_SIGNING_KEY:    {}", fake.next_signing_key());
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
    use super::parse;

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
}

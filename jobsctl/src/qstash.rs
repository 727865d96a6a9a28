//! `jobsctl qstash verify`: why a QStash delivery was refused, checked the way the receiver
//! checks it.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use clap::Args;
use jobs_adapter_qstash::{DEFAULT_CLOCK_TOLERANCE, KeyUsed, SigningKeys, verify_signature};
use serde_json::json;

/// One delivery to check.
#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    /// The Upstash-Signature header's value (a JWT).
    #[arg(long, value_name = "JWT")]
    signature: String,
    /// The URL QStash delivered to, exactly as the receiver is configured (the `sub` claim).
    #[arg(long)]
    url: String,
    /// The raw request body, byte for byte (`-` for standard input).
    #[arg(long, value_name = "FILE")]
    body: PathBuf,
    /// Check as of this time, RFC 3339, e.g. when the delivery was refused [default: now].
    #[arg(long, value_parser = crate::values::parse_time)]
    at: Option<SystemTime>,
    /// Clock skew allowed on exp and nbf: a number with a unit, several largest first (ms, s,
    /// m, h, d), e.g. 5s or 1500ms; up to 36500d.
    #[arg(long, value_parser = crate::values::tolerance, default_value = "5s")]
    tolerance: Duration,
    /// A JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The receiver's default tolerance, which `--tolerance`'s default repeats.
const _: () = assert!(DEFAULT_CLOCK_TOLERANCE.as_secs() == 5);

/// Verifies the delivery `args` describes, printing `valid: …` or `invalid: REASON`;
/// `Ok(false)` when invalid (exit 1).
pub(crate) fn verify(keys: &SigningKeys, args: &VerifyArgs, out: &mut impl Write) -> Result<bool> {
    let (signature, url, body_file, tolerance, as_json) = (
        &args.signature,
        &args.url,
        &args.body,
        args.tolerance,
        args.json,
    );
    let at = args.at.unwrap_or_else(SystemTime::now);
    // A body is an envelope: no longer than the longest a worker accepts.
    let limit = *jobs_ops::compose::MAX_ENVELOPE_BYTES_RANGE.end();
    let given = format!("--body {}", body_file.display());
    let body = crate::values::read_bounded(&given, body_file, limit)?;
    let verdict = verify_signature(signature, Some(url), &body, at, keys, tolerance);
    match (&verdict, as_json) {
        (Ok(verified), true) => writeln!(
            out,
            "{}",
            json!({
                "valid": true,
                "key": key_name(verified.key),
                "sub": verified.claims.sub,
                "exp": verified.claims.exp,
                "nbf": verified.claims.nbf,
                "jti": verified.claims.jti,
            })
        )?,
        (Ok(verified), false) => writeln!(
            out,
            "valid: signed with the {} signing key for {}, valid until {} (jti {})",
            key_name(verified.key),
            verified.claims.sub,
            crate::values::rfc3339(
                SystemTime::UNIX_EPOCH + Duration::from_secs(verified.claims.exp)
            ),
            verified.claims.jti
        )?,
        (Err(e), true) => writeln!(
            out,
            "{}",
            json!({ "valid": false, "reason": e.to_string() })
        )?,
        (Err(e), false) => writeln!(out, "invalid: {e}")?,
    }
    Ok(verdict.is_ok())
}

fn key_name(key: KeyUsed) -> &'static str {
    match key {
        KeyUsed::Current => "current",
        KeyUsed::Next => "next",
    }
}

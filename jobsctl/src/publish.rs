//! `jobsctl publish`: one job, validated as consumers will validate it, through the configured
//! queue.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Args;
use jobs_core::{
    CorrelationId, DecodeLimits, Envelope, JobId, Kind, PublishOptions, QueueName, TenantId,
};
use jobs_ops::compose::Queue;
use serde::de::IgnoredAny;
use serde_json::json;

use crate::Usage;

/// What to publish.
#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The queue, e.g. billing.invoices.
    #[arg(long)]
    queue: QueueName,
    /// The job's kind, which selects its handler, e.g. billing.invoice_issued.
    #[arg(long)]
    kind: Kind,
    /// The tenant, a UUID.
    #[arg(long)]
    tenant: TenantId,
    /// The business operation the job belongs to, a UUID [default: the new job id].
    #[arg(long)]
    correlation: Option<CorrelationId>,
    /// The job's data: JSON, or @FILE to read it from a file (@- for standard input)
    /// [default: {}].
    #[arg(long, value_name = "JSON|@FILE")]
    data: Option<String>,
    /// Deliver at this time, RFC 3339 (e.g. 2026-12-01T03:00:00Z); a past time is now.
    #[arg(long, value_parser = crate::values::parse_time, conflicts_with = "delay")]
    at: Option<SystemTime>,
    /// Deliver after this long: a number with a unit, several largest first (ms, s, m, h, d),
    /// e.g. 90s, 10m, 1h30m; up to 36500d.
    #[arg(long, value_parser = crate::values::delay)]
    delay: Option<Duration>,
    /// Print the job id with the transport's receipt as JSON.
    #[arg(long)]
    json: bool,
}

/// The text of `--data`, read from its file or standard input up to `limit` bytes: no
/// envelope carrying more is published anyway.
fn read_data(spec: Option<&str>, limit: usize) -> Result<String> {
    let bytes = match spec {
        None => return Ok("{}".to_owned()),
        Some(spec) => match spec.strip_prefix('@') {
            Some(path) => {
                let given = format!("--data @{path}");
                crate::values::read_bounded(&given, Path::new(path), limit)?
            }
            None => return Ok(spec.to_owned()),
        },
    };
    String::from_utf8(bytes).map_err(|_| Usage("--data is not UTF-8 text".to_owned()).into())
}

/// Builds, validates (with `limits`, the configured envelope limit) and publishes the job,
/// printing its id (and receipt with `--json`).
pub(crate) async fn run(
    queue: &Queue,
    limits: &DecodeLimits,
    args: PublishArgs,
    out: &mut impl Write,
) -> Result<()> {
    let data = read_data(args.data.as_deref(), limits.max_envelope_bytes())?;
    // One JSON value and nothing after it, so that the text cannot add fields beside `data`.
    serde_json::from_str::<IgnoredAny>(&data)
        .map_err(|e| Usage(format!("--data is not JSON: {e}")))?;
    let job_id = JobId::generate();
    let correlation_id = match args.correlation {
        Some(id) => id,
        // A job that starts a business operation correlates with itself.
        None => job_id.into(),
    };
    // The envelope as bytes around the data as given, checked by the decoder every consumer
    // uses (size limit and duplicate keys included): refuse here what would only become a
    // dead letter there.
    let bytes = format!(
        r#"{{"job_id":"{job_id}","tenant_id":"{}","correlation_id":"{correlation_id}","kind":{},"data":{data}}}"#,
        args.tenant,
        json!(args.kind.as_str()),
    );
    let envelope = match Envelope::decode_with(bytes.as_bytes(), limits) {
        Ok(envelope) => envelope,
        Err(e) => {
            let problems: Vec<String> = e
                .issues()
                .iter()
                .map(|issue| format!("{}: {}", issue.field, issue.problem))
                .collect();
            anyhow::bail!("the job is not a valid envelope: {}", problems.join("; "));
        }
    };
    let receipt = match (args.at, args.delay) {
        (Some(at), _) => queue.publisher.schedule(&args.queue, &envelope, at).await,
        (None, Some(delay)) => {
            let opts = PublishOptions::default().delay(delay);
            queue.publisher.publish(&args.queue, &envelope, opts).await
        }
        (None, None) => {
            queue
                .publisher
                .publish(&args.queue, &envelope, PublishOptions::default())
                .await
        }
    }
    .with_context(|| format!("publishing to {}", args.queue))?;
    if args.json {
        let line = json!({
            "job_id": envelope.job_id.to_string(),
            "queue": args.queue.as_str(),
            "kind": envelope.kind.as_str(),
            "tenant_id": envelope.tenant_id.to_string(),
            "correlation_id": envelope.correlation_id.to_string(),
            "at": args.at.map(crate::values::rfc3339),
            "delay_ms": args.delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            "transport": queue.scheme,
            "receipt": {
                "message_id": receipt.message_id,
                "duplicate": receipt.duplicate,
            },
        });
        writeln!(out, "{line}")?;
    } else {
        writeln!(out, "{}", envelope.job_id)?;
    }
    Ok(())
}

//! `jobsctl dead-letters` and `jobsctl cleanup`: reviewing what the runtime gave up on.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use jobs_core::{DeadLetter, DeadLetterFilter, DeadLetterId, QueueName};
use serde_json::{Value, json};

use jobs_ops::compose::{Queue, Store};

use crate::values;

/// What a letter recorded before reasons were kept shows as its reason.
const NOT_RECORDED: &str = "not recorded";

/// Prints the letters matching `filter`, as a table or JSON Lines. A row the store cannot
/// read as a letter is left out with a warning on `err` naming its id and why, so one bad row
/// costs its line, not the listing.
pub(crate) async fn list(
    store: &Store,
    filter: &DeadLetterFilter,
    as_json: bool,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<()> {
    let rows = store.dead_letters().listing(filter).await?;
    let mut letters = Vec::with_capacity(rows.len());
    for row in &rows {
        match row {
            Ok(letter) => letters.push(letter),
            Err(unreadable) => writeln!(
                err,
                "warning: dead letter {} cannot be read and is not listed: {}",
                unreadable.id, unreadable.why
            )?,
        }
    }
    if as_json {
        for letter in &letters {
            writeln!(out, "{}", to_json(letter))?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:>6}  {:<14}  {:<24}  {:<24}  {:>8}  {:<13}  last error",
        "id", "status", "queue", "kind", "attempts", "reason"
    )?;
    for letter in &letters {
        let l = &letter.letter;
        writeln!(
            out,
            "{:>6}  {:<14}  {:<24}  {:<24}  {:>8}  {:<13}  {}",
            letter.id,
            letter.status.as_str(),
            l.queue.as_str(),
            l.kind.as_ref().map_or("-", |k| k.as_str()),
            l.attempts,
            l.reason.map_or(NOT_RECORDED, |r| r.as_str()),
            first_line(&l.last_error, 60)
        )?;
    }
    if rows.len() == usize::try_from(filter.limit).unwrap_or(usize::MAX)
        && let Some(last) = rows.last()
    {
        let last = last.as_ref().map_or_else(|u| u.id, |l| l.id);
        writeln!(out, "(more may follow: --after {last})")?;
    }
    Ok(())
}

/// Prints one letter in full, then its history (who replayed or discarded it, and when): as
/// text, or as JSON with `as_json`.
pub(crate) async fn show(
    store: &Store,
    id: DeadLetterId,
    as_json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let letters = store.dead_letters();
    let letter = letters
        .get(id)
        .await?
        .with_context(|| format!("dead letter {id} not found"))?;
    let history = letters
        .history(id)
        .await
        .with_context(|| format!("reading the history of dead letter {id}"))?;
    let mut value = to_json(&letter);
    value["history"] = history
        .iter()
        .map(|event| {
            json!({
                "at": values::rfc3339(event.at),
                "from": event.from.as_str(),
                "to": event.to.as_str(),
                "by": event.by,
            })
        })
        .collect();
    if as_json {
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    for field in [
        "id",
        "status",
        "queue",
        "kind",
        "job_id",
        "tenant_id",
        "correlation_id",
        "attempts",
        "reason",
        "created_at",
        "updated_at",
    ] {
        let text = match &value[field] {
            Value::Null if field == "reason" => NOT_RECORDED.to_owned(),
            Value::Null => "-".to_owned(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        writeln!(out, "{field:<15} {text}")?;
    }
    if history.is_empty() {
        writeln!(out, "{:<15} -", "history")?;
    } else {
        writeln!(out, "history:")?;
        for event in &history {
            writeln!(
                out,
                "  {}  {} -> {}  {}",
                values::rfc3339(event.at),
                event.from,
                event.to,
                event.by
            )?;
        }
    }
    let indent = |text: &str| text.replace('\n', "\n  ");
    writeln!(out, "last error:\n  {}", indent(&letter.letter.last_error))?;
    match std::str::from_utf8(&letter.letter.payload) {
        Ok(text) => writeln!(out, "payload (utf-8):\n  {}", indent(text))?,
        Err(_) => writeln!(
            out,
            "payload (hex):\n  {}",
            value["payload"]["hex"].as_str().unwrap_or_default()
        )?,
    }
    Ok(())
}

/// Prints the depth of each queue in `names`, and how long its oldest ready job has waited:
/// `-` in the table, `null` in JSON, for what the transport cannot tell.
pub(crate) async fn queues(
    queue: &Queue,
    names: &[QueueName],
    as_json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let Some(depth) = &queue.depth else {
        bail!("the {}: transport cannot report queue depth", queue.scheme);
    };
    if !as_json {
        writeln!(
            out,
            "{:<32} {:>8} {:>8} {:>9} {:>8} {:>9}",
            "queue", "ready", "delayed", "in flight", "total", "waited"
        )?;
    }
    let cell = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    for name in names {
        let d = depth
            .depth(name)
            .await
            .with_context(|| format!("reading the depth of {name}"))?;
        let waited = d.waited(SystemTime::now());
        if as_json {
            let line = json!({
                "queue": name.as_str(),
                "ready": d.ready,
                "delayed": d.delayed_known(),
                "in_flight": d.in_flight_known(),
                "total": d.total(),
                "oldest_ready_seconds": waited.map(|w| w.as_secs_f64()),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{:<32} {:>8} {:>8} {:>9} {:>8} {:>9}",
                name.as_str(),
                d.ready,
                cell(d.delayed_known()),
                cell(d.in_flight_known()),
                d.total(),
                waited.map_or_else(|| "-".to_owned(), |w| format!("{}s", w.as_secs())),
            )?;
        }
    }
    Ok(())
}

/// Deletes `processed_jobs` rows older than `older_than`: at least the floor
/// ([`jobs_consumers::MIN_JOB_TTL`]) unless `below_floor`.
pub(crate) async fn cleanup(
    store: &Store,
    older_than: Duration,
    below_floor: bool,
    as_json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let mut cleanup = jobs_consumers::ProcessedCleanup::new(store.processed());
    if below_floor {
        cleanup = cleanup.below_floor();
    }
    let deleted = cleanup.purge(Some(older_than)).await?;
    if as_json {
        let line = json!({ "deleted": deleted, "older_than_s": older_than.as_secs() });
        writeln!(out, "{line}")?;
    } else {
        writeln!(
            out,
            "deleted {deleted} processed_jobs rows older than {older_than:?}"
        )?;
    }
    Ok(())
}

fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_owned()
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn to_json(letter: &DeadLetter) -> Value {
    let l = &letter.letter;
    let payload = match std::str::from_utf8(&l.payload) {
        Ok(text) => json!({ "encoding": "utf-8", "text": text }),
        Err(_) => json!({
            "encoding": "hex",
            "hex": l.payload.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        }),
    };
    json!({
        "id": letter.id.0,
        "status": letter.status.as_str(),
        "queue": l.queue.as_str(),
        "job_id": l.job_id.map(|id| id.to_string()),
        "tenant_id": l.tenant_id.map(|id| id.to_string()),
        "correlation_id": l.correlation_id.map(|id| id.to_string()),
        "kind": l.kind.as_ref().map(|k| k.as_str()),
        "attempts": l.attempts,
        "reason": l.reason.map(|r| r.as_str()),
        "last_error": l.last_error,
        "created_at_ms": millis(l.at),
        "updated_at_ms": millis(letter.updated_at),
        "created_at": values::rfc3339(l.at),
        "updated_at": values::rfc3339(letter.updated_at),
        "payload": payload,
    })
}

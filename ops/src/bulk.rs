//! `jobsctl dead-letters replay|discard`: by id, or every letter matching a filter.
//!
//! A filtered run acts on a snapshot of the matching ids kept in a journal ([`crate::journal`]),
//! not on a fresh query: a replay marks a letter `replayed` before publishing it, so after an
//! interruption between the two, a new query over `pending_review` would no longer see that
//! letter and it would never be published. Resuming the snapshot publishes it (replaying a
//! `replayed` letter republishes under the same dedup key, harmlessly), and letters the journal
//! records as settled are not touched again.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow, bail};
use jobs_adapter_memory::MemoryQueue;
use jobs_consumers::{DeadLetters, ReplayError, Replayed};
use jobs_core::{DeadLetterFilter, DeadLetterId, DeadLetterStatus, TenantId, Transition};
use jobs_ops::compose::{self, Config, Queue, Store};
use serde_json::json;

use crate::journal::{self, Header, Journal};
use crate::{NotConfirmed, Selection};

/// What a bulk command does to each letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Replay,
    Discard,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Replay => "replay",
            Action::Discard => "discard",
        }
    }
}

/// What happened to one letter.
struct Outcome {
    /// A stable word for scripts: `replayed`, `already_replayed`, `discarded`,
    /// `already_discarded`, `not_found`, `conflict`, `not_an_envelope` or `failed`.
    result: &'static str,
    message: String,
    /// Whether the letter reached its end state (a re-run need not act on it again).
    ok: bool,
    /// Whether a re-run of the same command would find nothing more to do for it: done, or
    /// refused for a reason a retry does not change. Transient failures are not settled.
    settled: bool,
}

async fn act(
    action: Action,
    ops: &DeadLetters,
    id: DeadLetterId,
    tenant: Option<TenantId>,
) -> Outcome {
    let outcome = |result, message: String, ok, settled| Outcome {
        result,
        message,
        ok,
        settled,
    };
    match action {
        Action::Replay => match ops.replay(id, tenant).await {
            Ok(Replayed::Done) => outcome("replayed", "replayed".into(), true, true),
            Ok(Replayed::AlreadyDone) => outcome(
                "already_replayed",
                format!("already replayed; published again under dead-letter-{id}"),
                true,
                true,
            ),
            Err(e @ ReplayError::NotFound(_)) => outcome("not_found", e.to_string(), false, true),
            Err(e @ ReplayError::Conflict { .. }) => {
                outcome("conflict", e.to_string(), false, true)
            }
            Err(e @ ReplayError::NotAnEnvelope { .. }) => {
                outcome("not_an_envelope", e.to_string(), false, true)
            }
            Err(e) => outcome("failed", e.to_string(), false, false),
        },
        Action::Discard => match ops.discard(id, tenant).await {
            Ok(Transition::Done) => outcome("discarded", "discarded".into(), true, true),
            Ok(Transition::AlreadyDone) => {
                outcome("already_discarded", "already discarded".into(), true, true)
            }
            Ok(Transition::Conflict(status)) => outcome(
                "conflict",
                format!("not discarded: it is {status}"),
                false,
                true,
            ),
            Ok(Transition::NotFound) => outcome("not_found", "not found".into(), false, true),
            Err(e) => outcome("failed", e.to_string(), false, false),
        },
    }
}

/// Runs `action` over the selected letters; `queue` is where replays publish.
pub(crate) async fn run(
    action: Action,
    store: &Store,
    queue: Option<&Queue>,
    config: &Config,
    selection: Selection,
    out: &mut impl Write,
) -> Result<()> {
    // Discarding publishes nothing; the port is only there to satisfy DeadLetters.
    let publisher = queue.map_or_else(
        || Arc::new(MemoryQueue::default()) as Arc<dyn jobs_core::QueuePort>,
        |q| q.publisher.clone(),
    );
    let ops = DeadLetters::new(store.dead_letters(), publisher)
        .acting_as(format!("jobsctl ({})", crate::operator()));
    let tenant = selection.tenant;
    let (ids, mut journal) = if selection.all {
        let filter = DeadLetterFilter {
            status: Some(selection.status.unwrap_or(DeadLetterStatus::PendingReview)),
            queue: selection.queue.clone(),
            tenant_id: tenant,
            kind: selection.kind.clone(),
            limit: 500,
            ..DeadLetterFilter::default()
        };
        let described = describe(&filter);
        let store_url = config.get(&compose::DATABASE_URL).unwrap_or_default();
        let dir = config.require(&compose::JOURNAL_DIR)?;
        let path = journal::path_for(
            std::path::Path::new(dir),
            action.name(),
            &format!("{store_url}\n{described}"),
        );
        let journal = match Journal::open_unfinished(&path)? {
            Some(journal) => {
                let left = journal.remaining().len();
                confirm(
                    &format!(
                        "Resume the interrupted {} of dead letters matching {described}: {left} \
                         of {} left?",
                        action.name(),
                        journal.header.ids.len()
                    ),
                    selection.yes,
                )?;
                eprintln!("resuming {}", journal.path().display());
                journal
            }
            None => {
                let ids = ops.matching(&filter).await?;
                if ids.is_empty() {
                    eprintln!("no dead letters match {described}: nothing to do");
                    return Ok(());
                }
                confirm(
                    &format!(
                        "{} {} dead letters matching {described}?",
                        capitalised(action.name()),
                        ids.len()
                    ),
                    selection.yes,
                )?;
                let header = Header {
                    action: action.name().to_owned(),
                    filter: described,
                    ids: ids.iter().map(|id| id.0).collect(),
                    started_at_ms: SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                };
                let journal = Journal::create(&path, header)?;
                eprintln!(
                    "journal {} (re-run the same command to resume after an interruption)",
                    journal.path().display()
                );
                journal
            }
        };
        (journal.remaining(), Some(journal))
    } else {
        (
            selection.ids.iter().map(|&id| DeadLetterId(id)).collect(),
            None,
        )
    };

    let terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let progress = Progress::new(ids.len(), action.name(), terminal && !selection.json);
    let (mut succeeded, mut failed, mut unsettled) = (0usize, 0usize, 0usize);
    for (n, &id) in ids.iter().enumerate() {
        if selection.stop_after == Some(n) {
            progress.clear();
            bail!(
                "stopped after {n} of {} letters (--stop-after); re-run the same command to resume",
                ids.len()
            );
        }
        let outcome = act(action, &ops, id, tenant).await;
        progress.clear();
        if selection.json {
            let line = json!({ "id": id.0, "result": outcome.result, "message": outcome.message });
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{id}: {}", outcome.message)?;
        }
        out.flush()?;
        if outcome.settled {
            if let Some(journal) = journal.as_mut() {
                journal.settle(id, outcome.result)?;
            }
        } else {
            unsettled += 1;
        }
        if outcome.ok {
            succeeded += 1;
        } else {
            failed += 1;
        }
        progress.draw(n + 1);
    }
    progress.clear();
    let summary = format!(
        "{}: {succeeded} done, {failed} failed, of {}",
        action.name(),
        ids.len()
    );
    if selection.json {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}")?;
    }
    if let Some(journal) = journal {
        if unsettled == 0 {
            journal.finish()?;
        } else {
            eprintln!(
                "{unsettled} failed for a reason that may pass: re-run the same command to retry \
                 them (journal {})",
                journal.path().display()
            );
        }
    }
    if failed > 0 {
        return Err(anyhow!(
            "{failed} of {} dead letters could not be {}ed",
            ids.len(),
            action.name().trim_end_matches('e')
        ));
    }
    Ok(())
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

fn describe(filter: &DeadLetterFilter) -> String {
    let mut parts = vec![format!(
        "status={}",
        filter.status.map_or("any", DeadLetterStatus::as_str)
    )];
    if let Some(queue) = &filter.queue {
        parts.push(format!("queue={}", queue.as_str()));
    }
    if let Some(tenant) = filter.tenant_id {
        parts.push(format!("tenant={tenant}"));
    }
    if let Some(kind) = &filter.kind {
        parts.push(format!("kind={}", kind.as_str()));
    }
    parts.join(" ")
}

/// Asks on the terminal unless `yes`; refuses to guess when standard input is not one.
fn confirm(question: &str, yes: bool) -> Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(NotConfirmed(format!(
            "{question} Pass --yes to go ahead: standard input is not a terminal, so jobsctl \
             cannot ask"
        ))
        .into());
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        Err(NotConfirmed("not confirmed: nothing was done".into()).into())
    }
}

/// A one-line progress bar on standard error, drawn only on a terminal.
struct Progress {
    total: usize,
    label: &'static str,
    enabled: bool,
}

impl Progress {
    fn new(total: usize, label: &'static str, enabled: bool) -> Progress {
        Progress {
            total,
            label,
            enabled: enabled && total > 1,
        }
    }

    fn draw(&self, done: usize) {
        if !self.enabled {
            return;
        }
        const WIDTH: usize = 30;
        let filled = done * WIDTH / self.total.max(1);
        eprint!(
            "\r[{}{}] {done}/{} {}",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            self.total,
            self.label
        );
        let _ = std::io::stderr().flush();
    }

    fn clear(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}

//! `jobsctl dead-letters replay|discard`: by id, or every letter matching a filter.
//!
//! A filtered run acts on a snapshot of the matching ids journaled in the store
//! ([`BulkRuns`]), not on a fresh query: a replay marks a letter `replayed` before publishing
//! it, so after an interruption between the two, a new query over `pending_review` would no
//! longer see that letter and it would never be published. Resuming the snapshot publishes it
//! (replaying a `replayed` letter republishes under the same dedup key, harmlessly), and
//! letters the run records as settled are not touched again. The run lives in the store, so
//! every `jobsctl` and console on it sees the run and its progress, and resumes the same one:
//! its key is the action and the filter, as the console writes it.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Context, Result, anyhow, bail};
use jobs_adapter_memory::MemoryQueue;
use jobs_consumers::{DeadLetters, ReplayError, Replayed};
use jobs_core::{
    BulkRun, BulkRuns, DeadLetterFilter, DeadLetterId, DeadLetterStatus, Kind, QueueName,
    Resolution, TenantId, Transition,
};
use jobs_ops::compose::{Config, Queue, Store};
use jobs_ops::console::{capitalised, describe_filter};
use serde_json::json;

use crate::NotConfirmed;

/// Which dead letters a bulk command selects.
#[derive(Debug, clap::Args)]
pub(crate) struct Selection {
    /// The dead letters' ids.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) ids: Vec<i64>,
    /// Every dead letter matching the filters (asks for confirmation unless --yes).
    #[arg(long)]
    all: bool,
    /// With --all: only this status [default: pending_review].
    #[arg(long, value_parser = crate::values::parse_status, requires = "all")]
    status: Option<DeadLetterStatus>,
    /// With --all: only this queue.
    #[arg(long, requires = "all")]
    queue: Option<QueueName>,
    /// Only this tenant's letters (with ids: refuse the others).
    #[arg(long)]
    tenant: Option<TenantId>,
    /// With --all: only this kind.
    #[arg(long, requires = "all")]
    kind: Option<Kind>,
    /// Act without asking (required when standard input is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// One JSON object per letter instead of text lines.
    #[arg(long)]
    json: bool,
    /// Test hook: stop after this many letters, as an interruption would.
    #[arg(long, hide = true)]
    stop_after: Option<usize>,
}

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

    fn resolution(self) -> Resolution {
        match self {
            Action::Replay => Resolution::Replay,
            Action::Discard => Resolution::Discard,
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

impl Outcome {
    /// The outcome as a bulk run records it, in the words the console records too.
    fn recorded(&self) -> String {
        match self.result {
            "replayed" | "discarded" => "done".to_owned(),
            "already_replayed" | "already_discarded" => "already done".to_owned(),
            "not_found" => "not found".to_owned(),
            "conflict" | "not_an_envelope" => format!("conflict: {}", self.message),
            _ => self.message.clone(),
        }
    }
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

/// Runs `action` over the selected letters; `queue` is where replays publish. A filtered run
/// is journaled in the store's [`BulkRuns`] (the configuration no longer says where).
pub(crate) async fn run(
    action: Action,
    store: &Store,
    queue: Option<&Queue>,
    _config: &Config,
    selection: Selection,
    out: &mut impl Write,
) -> Result<()> {
    // Discarding publishes nothing; the port is only there to satisfy DeadLetters.
    let publisher = queue.map_or_else(
        || Arc::new(MemoryQueue::default()) as Arc<dyn jobs_core::QueuePort>,
        |q| q.publisher.clone(),
    );
    let by = format!("jobsctl ({})", crate::operator());
    let ops = DeadLetters::new(store.dead_letters(), publisher).acting_as(by.clone());
    let tenant = selection.tenant;
    let runs = store.bulk_runs();
    let (ids, run) = if selection.all {
        let filter = DeadLetterFilter {
            status: Some(selection.status.unwrap_or(DeadLetterStatus::PendingReview)),
            queue: selection.queue.clone(),
            tenant_id: tenant,
            kind: selection.kind.clone(),
            limit: 500,
            ..DeadLetterFilter::default()
        };
        let described = describe_filter(&filter);
        let key = format!("{} {described}", action.name());
        let Some(run) = start(action, &*runs, &ops, &filter, &key, &by, selection.yes).await?
        else {
            return Ok(());
        };
        (run.pending().collect::<Vec<_>>(), Some(run))
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
            if let Some(run) = &run {
                runs.record_settled(run.id, id, &outcome.recorded())
                    .await
                    .with_context(|| {
                        format!(
                            "recording dead letter {id} as settled in bulk run {}",
                            run.id
                        )
                    })?;
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
    if let Some(run) = run {
        if unsettled == 0 {
            runs.finish_run(run.id, SystemTime::now())
                .await
                .with_context(|| format!("closing bulk run {}", run.id))?;
        } else {
            eprintln!(
                "{unsettled} failed for a reason that may pass: re-run the same command to retry \
                 them (bulk run {})",
                run.id
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

/// The run of `key`: the unfinished one, resumed once the operator confirms, else a new one
/// over a snapshot of what `filter` matches now. `None` when nothing matches.
async fn start(
    action: Action,
    runs: &dyn BulkRuns,
    ops: &DeadLetters,
    filter: &DeadLetterFilter,
    key: &str,
    by: &str,
    yes: bool,
) -> Result<Option<BulkRun>> {
    let described = describe_filter(filter);
    if let Some(run) = runs.unfinished(key).await? {
        confirm(
            &format!(
                "Resume the interrupted {} of dead letters matching {described}: {} of {} left?",
                action.name(),
                run.pending().count(),
                run.total()
            ),
            yes,
        )?;
        eprintln!("resuming bulk run {} (started by {})", run.id, run.by);
        return Ok(Some(run));
    }
    let ids = ops.matching(filter).await?;
    if ids.is_empty() {
        eprintln!("no dead letters match {described}: nothing to do");
        return Ok(None);
    }
    confirm(
        &format!(
            "{} {} dead letters matching {described}?",
            capitalised(action.name()),
            ids.len()
        ),
        yes,
    )?;
    let run = runs
        .start_run(key, action.resolution(), &ids, by, SystemTime::now())
        .await?;
    if run.ids == ids && run.done() == 0 {
        eprintln!(
            "bulk run {} (re-run the same command to resume after an interruption)",
            run.id
        );
    } else {
        // Another operator started the same run meanwhile: this one joins it.
        eprintln!(
            "resuming bulk run {} (started by {} meanwhile)",
            run.id, run.by
        );
    }
    Ok(Some(run))
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

//! `jobsctl dead-letters replay|discard`: by id, or every letter matching a filter.
//!
//! A filtered run acts on a snapshot of the matching ids journaled in the store
//! ([`BulkRuns`]), not on a fresh query: a replay marks a letter `replayed` before publishing
//! it, so after an interruption between the two, a new query over `pending_review` would no
//! longer see that letter and it would never be published. Resuming the snapshot publishes it
//! (replaying a `replayed` letter republishes under the same dedup key, harmlessly), and
//! letters the run records as settled are not touched again. The run lives in the store, so
//! every `jobsctl` and console on it sees the run and its progress, and resumes the same one.
//! How a run is keyed, settled and journaled is `jobs_ops::bulk`'s, shared with the console;
//! this module is the command line's front to it: confirmation, output, progress.

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use jobs_adapter_memory::MemoryQueue;
use jobs_consumers::DeadLetters;
use jobs_core::{
    BulkRun, BulkRuns, DeadLetterFilter, DeadLetterId, DeadLetterStatus, Kind, QueueName,
    Resolution, TenantId,
};
use jobs_ops::bulk::{Resolver, action_name, describe_filter, run_key};
use jobs_ops::compose::{Queue, Store};
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

/// Runs `resolution` over the selected letters; `queue` is where replays publish. A filtered
/// run is journaled in the store's [`BulkRuns`], so a re-run resumes it.
pub(crate) async fn run(
    resolution: Resolution,
    store: &Store,
    queue: Option<&Queue>,
    selection: Selection,
    out: &mut impl Write,
) -> Result<()> {
    // Discarding publishes nothing; the port is only there to satisfy DeadLetters.
    let publisher = queue.map_or_else(
        || Arc::new(MemoryQueue::default()) as Arc<dyn jobs_core::QueuePort>,
        |q| q.publisher.clone(),
    );
    let letters = DeadLetters::new(store.dead_letters(), publisher);
    let resolver = Resolver::new(
        &letters,
        format!("jobsctl ({})", crate::operator()),
        selection.tenant,
    );
    let runs = store.bulk_runs();
    let action = action_name(resolution);
    let (mut ids, run) = if selection.all {
        let filter = DeadLetterFilter {
            status: Some(selection.status.unwrap_or(DeadLetterStatus::PendingReview)),
            queue: selection.queue.clone(),
            tenant_id: selection.tenant,
            kind: selection.kind.clone(),
            limit: 500,
            ..DeadLetterFilter::default()
        };
        let Some(run) = start(resolution, &*runs, &resolver, &filter, selection.yes).await? else {
            return Ok(());
        };
        (run.pending().collect::<Vec<_>>(), Some(run))
    } else {
        (
            selection.ids.iter().map(|&id| DeadLetterId(id)).collect(),
            None,
        )
    };
    let total = ids.len();
    // The test hook stands for an interruption after that many letters.
    let interrupted = selection.stop_after.filter(|&n| n < total);
    if let Some(n) = interrupted {
        ids.truncate(n);
    }

    let terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let progress = Progress::new(total, action, terminal && !selection.json);
    let (mut written, mut done) = (Ok(()), 0);
    let journal = run.as_ref().map(|run| (&*runs, run.id));
    let tally = resolver
        .settle(resolution, &ids, journal, Duration::ZERO, |id, resolved| {
            progress.clear();
            written = if selection.json {
                let line = json!({
                    "id": id.0,
                    "result": resolved.result(),
                    "message": resolved.message(),
                });
                writeln!(out, "{line}")
            } else {
                writeln!(out, "{id}: {}", resolved.message())
            }
            .and_then(|()| out.flush());
            done += 1;
            progress.draw(done);
            if written.is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .await
        .with_context(|| match &run {
            Some(run) => format!("journaling bulk run {}", run.id),
            None => "acting on the dead letters".to_owned(),
        })?;
    progress.clear();
    written?;
    if let Some(n) = interrupted {
        bail!(
            "stopped after {n} of {total} letters (--stop-after); re-run the same command to resume"
        );
    }
    let summary = format!(
        "{action}: {} done, {} failed, of {total}",
        tally.done, tally.failed
    );
    if selection.json {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}")?;
    }
    if let (Some(run), false) = (&run, tally.finished) {
        eprintln!(
            "{} failed for a reason that may pass: re-run the same command to retry them (bulk \
             run {})",
            tally.unsettled, run.id
        );
    }
    if tally.failed > 0 {
        return Err(anyhow!(
            "{} of {total} dead letters could not be {}ed",
            tally.failed,
            action.trim_end_matches('e')
        ));
    }
    Ok(())
}

/// The run of `resolution` over `filter`: the unfinished one, resumed once the operator
/// confirms, else a new one over a snapshot of what `filter` matches now. `None` when nothing
/// matches.
async fn start(
    resolution: Resolution,
    runs: &dyn BulkRuns,
    resolver: &Resolver,
    filter: &DeadLetterFilter,
    yes: bool,
) -> Result<Option<BulkRun>> {
    let (action, described) = (action_name(resolution), describe_filter(filter));
    if let Some(run) = runs.unfinished(&run_key(resolution, filter)).await? {
        confirm(
            &format!(
                "Resume the interrupted {action} of dead letters matching {described}: {} of {} \
                 left?",
                run.pending().count(),
                run.total()
            ),
            yes,
        )?;
        eprintln!("resuming bulk run {} (started by {})", run.id, run.by);
        return Ok(Some(run));
    }
    let ids = resolver.matching(filter).await?;
    if ids.is_empty() {
        eprintln!("no dead letters match {described}: nothing to do");
        return Ok(None);
    }
    let verb = match resolution {
        Resolution::Replay => "Replay",
        Resolution::Discard => "Discard",
    };
    confirm(
        &format!("{verb} {} dead letters matching {described}?", ids.len()),
        yes,
    )?;
    let run = resolver.start(runs, resolution, filter, &ids).await?;
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

//! Bulk actions: replay or discard every letter waiting for review that a filter matches, as a
//! run journaled in the store ([`BulkRuns`]), so that every console instance and `jobsctl`
//! see it, its progress, and can resume it where it stopped.
//!
//! The operator asks from the list page; a confirmation page states how many letters the run
//! will touch; the run snapshots their ids, settles them one by one in the background
//! (replays spread over time at [`Console::replay_rate`] a second, so a thousand replays do
//! not land on the queue at once) and records each; its page shows the progress until it
//! finishes. A run whose process stopped half-way is resumed from its page, or by starting
//! the same action on the same filter again. What a run is and how it settles is
//! [`crate::bulk`]'s, shared with `jobsctl`; this module is the console's front to it.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jobs_core::{
    BulkRun, BulkRunId, BulkRuns, DeadLetterFilter, DeadLetterId, DeadLetterStatus, Resolution,
};
use serde::Deserialize;

use super::auth::Session;
use maud::{Markup, html};

use super::html::{csrf_field, page};
use super::{
    Console, ListQuery, Shared, authorised_post, filter_of, html_page, problem, redirect, resolver,
    time, unauthorised,
};
use crate::bulk::{Resolver, action_name, run_key};

/// The runs this console instance is executing now, so that a resume does not start a
/// second executor beside the first.
#[derive(Default)]
pub(crate) struct Executing(Mutex<HashSet<BulkRunId>>);

impl Executing {
    fn claim(&self, run: BulkRunId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run)
    }

    fn release(&self, run: BulkRunId) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&run);
    }

    fn contains(&self, run: BulkRunId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&run)
    }
}

/// A bulk request: the action, the list's filter, the form token.
#[derive(Deserialize)]
pub(crate) struct BulkForm {
    action: String,
    csrf: String,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

impl BulkForm {
    fn resolution(&self) -> Option<Resolution> {
        match self.action.as_str() {
            "replay" => Some(Resolution::Replay),
            "discard" => Some(Resolution::Discard),
            _ => None,
        }
    }

    /// The letters waiting for review that the form's filter matches, as `session` may
    /// touch them.
    fn filter(&self, session: &Session) -> Result<DeadLetterFilter, String> {
        let query = ListQuery {
            status: Some(DeadLetterStatus::PendingReview.as_str().to_owned()),
            queue: self.queue.clone(),
            tenant: self.tenant.clone(),
            kind: self.kind.clone(),
            reason: self.reason.clone(),
            ..ListQuery::default()
        };
        let mut filter = filter_of(&query, session)?;
        filter.newest_first = false;
        filter.before = None;
        filter.limit = 500;
        Ok(filter)
    }
}

/// Whether `session` may see `run`: a tenant's session, only the runs over its own letters.
fn visible(session: &Session, run: &BulkRun) -> bool {
    session
        .tenant
        .is_none_or(|t| run.key.split(' ').any(|part| part == format!("tenant={t}")))
}

fn hidden_fields(form: &BulkForm, csrf: &str) -> Markup {
    html! {
        (csrf_field(csrf))
        input type="hidden" name="action" value=(form.action);
        @for (name, value) in [
            ("queue", &form.queue),
            ("tenant", &form.tenant),
            ("kind", &form.kind),
            ("reason", &form.reason),
        ] {
            @if let Some(value) = value {
                input type="hidden" name=(name) value=(value);
            }
        }
    }
}

/// What a bulk request asks for: who, which action, over which filter, and the ids that
/// filter matches now.
struct Asked {
    session: Session,
    resolution: Resolution,
    runs: Arc<dyn BulkRuns>,
    filter: DeadLetterFilter,
    ids: Vec<DeadLetterId>,
}

/// The request a bulk form makes, or the answer refusing it.
async fn asked(
    console: &Console,
    headers: &HeaderMap,
    form: &BulkForm,
) -> Result<Asked, Box<Response>> {
    let session = authorised_post(console, headers, &form.csrf)?;
    let refuse = |status, why: &str| Box::new(problem(status, &session, why));
    let (Some(resolution), Some(runs)) = (form.resolution(), console.runs.clone()) else {
        return Err(refuse(StatusCode::BAD_REQUEST, "no such bulk action here"));
    };
    let filter = form
        .filter(&session)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, &e))?;
    let ids = resolver(console, &session)
        .matching(&filter)
        .await
        .map_err(|e| refuse(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()))?;
    Ok(Asked {
        session,
        resolution,
        runs,
        filter,
        ids,
    })
}

/// `POST /bulk`: the confirmation, stating how many letters the run will touch.
pub(crate) async fn ask(
    State(console): Shared,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> Response {
    let Asked {
        session,
        resolution,
        filter,
        ids,
        ..
    } = match asked(&console, &headers, &form).await {
        Ok(asked) => asked,
        Err(answer) => return *answer,
    };
    let described = run_key(resolution, &filter);
    let action = capitalised(action_name(resolution));
    let body = if ids.is_empty() {
        html! { p.note { "No letter waiting for review matches: nothing to do." } }
    } else {
        html! {
            p #confirm-count {
                (action) " " (ids.len()) " letters waiting for review that match "
                code { (described) } "?"
            }
            @if resolution == Resolution::Replay {
                p.note { "Replays are published at " (console.replay_rate) " a second." }
            }
            form method="post" action="/bulk/confirm" {
                (hidden_fields(&form, &session.csrf))
                button #confirm .danger { (action) " " (ids.len()) " letters" }
            }
            p { a href="/letters" { "Cancel" } }
        }
    };
    html_page(
        StatusCode::OK,
        page("Confirm a bulk action", Some(&session), body),
    )
}

/// `word` with its first letter upper-case.
fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `POST /bulk/confirm`: the run started (or the unfinished one of the same key resumed), and
/// its page.
pub(crate) async fn start(
    State(console): Shared,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> Response {
    let Asked {
        session,
        resolution,
        runs,
        filter,
        ids,
    } = match asked(&console, &headers, &form).await {
        Ok(asked) => asked,
        Err(answer) => return *answer,
    };
    let run = match resolver(&console, &session)
        .start(&*runs, resolution, &filter, &ids)
        .await
    {
        Ok(run) => run,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    tracing::info!(run = %run.id, key = %run.key, letters = run.total(), "bulk run started from the console");
    execute(console.clone(), run.id, session);
    redirect(&format!("/runs/{}", run.id))
}

/// Settles the run's pending letters in the background, unless this instance already is.
fn execute(console: Arc<Console>, id: BulkRunId, session: Session) {
    if !console.executing.claim(id) {
        return;
    }
    tokio::spawn(async move {
        if let Err(e) = settle(&console, id, &session).await {
            tracing::warn!(run = %id, error = %e, "bulk run stopped; resume it from its page");
        }
        console.executing.release(id);
    });
}

async fn settle(console: &Console, id: BulkRunId, session: &Session) -> Result<(), String> {
    let runs = console.runs.clone().ok_or("no bulk runs here")?;
    let run = runs
        .run(id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the run is gone")?;
    let resolver: Resolver = resolver(console, session);
    let pending: Vec<_> = run.pending().collect();
    let pace = Duration::from_secs(1) / console.replay_rate.max(1);
    let mut failure = None;
    let tally = resolver
        .settle(
            run.action,
            &pending,
            Some((&*runs, id)),
            pace,
            |_, resolved| {
                // The store or the transport failed: stop here, the run resumes from this letter.
                if resolved.is_settled() {
                    ControlFlow::Continue(())
                } else {
                    failure = Some(resolved.message().to_owned());
                    ControlFlow::Break(())
                }
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    if let Some(why) = failure {
        return Err(why);
    }
    if tally.finished {
        tracing::info!(run = %id, "bulk run finished");
    }
    Ok(())
}

/// `GET /runs/{id}`: the run's progress, refreshing itself while it runs.
pub(crate) async fn run_page(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let Some(runs) = &console.runs else {
        return problem(StatusCode::NOT_FOUND, &session, "no bulk runs here");
    };
    let run = match runs.run(BulkRunId(id)).await {
        Ok(Some(run)) if visible(&session, &run) => run,
        Ok(_) => {
            return problem(
                StatusCode::NOT_FOUND,
                &session,
                &format!("run {id} not found"),
            );
        }
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    let running = console.executing.contains(run.id);
    let state = if run.is_finished() {
        "finished"
    } else if running {
        "running"
    } else {
        "stopped before the end"
    };
    let mut outcomes: std::collections::BTreeMap<&str, usize> = Default::default();
    for outcome in run.settled.values() {
        *outcomes.entry(outcome.as_str()).or_default() += 1;
    }
    let (total, done) = (run.total(), run.done());
    let body = html! {
        p { code { (run.key) } ", started by " (run.by) " at " (time(run.started_at)) }
        p {
            progress #progress max=(total) value=(done) {} " "
            span #done { (done) } " of " (total) " letters, " span #state { (state) }
            @if let Some(at) = run.finished_at { " at " (time(at)) }
        }
        @if !run.is_finished() && !running {
            form method="post" action={ "/runs/" (id) "/resume" } {
                (csrf_field(&session.csrf))
                button { "Resume" }
            }
        }
        @if !outcomes.is_empty() {
            table {
                tr { th { "outcome" } th { "letters" } }
                @for (outcome, n) in outcomes { tr { td { (outcome) } td.n { (n) } } }
            }
        }
    };
    let mut answer = html_page(
        StatusCode::OK,
        page(&format!("Bulk run {id}"), Some(&session), body),
    );
    if running {
        answer
            .headers_mut()
            .insert("refresh", axum::http::HeaderValue::from_static("1"));
    }
    answer
}

/// `POST /runs/{id}/resume`: the run's pending letters settled again.
pub(crate) async fn resume(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<super::Csrf>,
) -> Response {
    let session = match authorised_post(&console, &headers, &form.csrf) {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    let Some(runs) = &console.runs else {
        return problem(StatusCode::NOT_FOUND, &session, "no bulk runs here");
    };
    match runs.run(BulkRunId(id)).await {
        Ok(Some(run)) if visible(&session, &run) => {
            if !run.is_finished() {
                execute(console.clone(), run.id, session);
            }
            redirect(&format!("/runs/{id}"))
        }
        Ok(_) => problem(
            StatusCode::NOT_FOUND,
            &session,
            &format!("run {id} not found"),
        ),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    }
}

/// `GET /runs`: the newest runs.
pub(crate) async fn runs_page(State(console): Shared, headers: HeaderMap) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let Some(runs) = &console.runs else {
        return problem(StatusCode::NOT_FOUND, &session, "no bulk runs here");
    };
    let listed = match runs.runs(50).await {
        Ok(listed) => listed,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    let body = html! {
        table {
            tr {
                th { "run" } th { "action and filter" } th { "by" } th { "started" }
                th { "progress" }
            }
            @for run in listed.iter().filter(|run| visible(&session, run)) {
                tr {
                    td { a href={ "/runs/" (run.id) } { (run.id) } }
                    td { code { (run.key) } }
                    td { (run.by) }
                    td { (time(run.started_at)) }
                    td {
                        (run.done()) " of " (run.total())
                        @if run.is_finished() { ", finished" }
                    }
                }
            }
        }
    };
    html_page(StatusCode::OK, page("Bulk runs", Some(&session), body))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_word_is_capitalised_once() {
        assert_eq!(super::capitalised("replay"), "Replay");
        assert_eq!(super::capitalised(""), "");
        assert_eq!(super::capitalised("élan"), "Élan");
    }
}

//! The dead letters' pages: the list with its filters (and the bulk actions over what it
//! matches), one letter in full with its history, and replay or discard of that letter.

use std::time::{Duration, SystemTime};

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jobs_core::{
    DeadLetter, DeadLetterFilter, DeadLetterId, DeadLetterReason, DeadLetterStatus, ListedLetter,
    Resolution, UnreadableLetter,
};

use maud::{Markup, html};

use super::html::{self, csrf_field, link, page};
use super::{
    Console, Csrf, ListQuery, Session, Shared, authorised_post, filter_of, html_page, problem,
    redirect, resolver, set, time, unauthorised,
};
use crate::bulk::Verdict;
use crate::config::DurationRange;

/// How far back the list's `since` reaches: a hundred years, a time every clock holds.
const SINCE: DurationRange = DurationRange::up_to(Duration::from_secs(36_500 * 86_400));

/// The letters since `since` (`1h`, `24h`, `7d`: the one duration grammar), newest first,
/// stop at the first older one.
fn since_of(query: &ListQuery) -> Result<Option<SystemTime>, String> {
    let Some(since) = set(&query.since) else {
        return Ok(None);
    };
    let span = SINCE.parse(since).map_err(|e| format!("since {e}"))?;
    Ok(SystemTime::now().checked_sub(span))
}

fn status_badge(status: DeadLetterStatus) -> Markup {
    html! { span class={ "status status-" (status.as_str()) } { (status.as_str()) } }
}

pub(super) async fn letters(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let (filter, since) = match (filter_of(&query, &session), since_of(&query)) {
        (Ok(filter), Ok(since)) => (filter, since),
        (Err(e), _) | (_, Err(e)) => return problem(StatusCode::BAD_REQUEST, &session, &e),
    };
    let mut shown = match console.dead_letters.listing(&filter).await {
        Ok(letters) => letters,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    let full_page = shown.len() == filter.limit as usize;
    let mut older_hidden = false;
    if let Some(since) = since {
        let before = shown.len();
        // A row that cannot be read has no time to judge by: it stays.
        shown.retain(|row| row.as_ref().map_or(true, |l| l.letter.at >= since));
        older_hidden = shown.len() < before;
    }
    let value = |v: &Option<String>| set(v).unwrap_or("").to_owned();
    let status = set(&query.status).unwrap_or("");
    let older = (full_page && !older_hidden)
        .then(|| shown.last())
        .flatten()
        .map(|last| {
            let before = listed_id(last).0.to_string();
            link(
                "/letters",
                [
                    ("before", Some(before.as_str())),
                    ("status", set(&query.status)),
                    ("queue", set(&query.queue)),
                    ("tenant", set(&query.tenant)),
                    ("kind", set(&query.kind)),
                    ("reason", set(&query.reason)),
                    ("since", set(&query.since)),
                    ("q", set(&query.q)),
                ],
            )
        });
    let body = html! {
        form.filters method="get" action="/letters" {
            label {
                "status "
                select name="status" {
                    @for s in ["", "pending_review", "replayed", "discarded"] {
                        option value=(s) selected[s == status] {
                            @if s.is_empty() { "any" } @else { (s) }
                        }
                    }
                }
            }
            label { "queue " input name="queue" value=(value(&query.queue)); }
            label {
                "tenant "
                input name="tenant" value=(value(&query.tenant)) disabled[session.tenant.is_some()];
            }
            label { "kind " input name="kind" value=(value(&query.kind)); }
            label {
                "reason "
                select name="reason" {
                    @let reason = set(&query.reason).unwrap_or("");
                    option value="" selected[reason.is_empty()] { "any" }
                    @for r in DeadLetterReason::ALL {
                        option value=(r.as_str()) selected[r.as_str() == reason] { (r.as_str()) }
                    }
                }
            }
            label {
                "since " input name="since" value=(value(&query.since)) placeholder="24h" size="5";
            }
            label { "job or correlation id " input name="q" value=(value(&query.q)) size="38"; }
            button { "Filter" }
        }
        @if console.runs.is_some() && set(&query.q).is_none() && set(&query.since).is_none() {
            (bulk_forms(&query, &session))
        }
        @if shown.is_empty() {
            p.note { "No dead letter matches." }
        } @else {
            table #letters {
                tr {
                    th { "id" } th { "status" } th { "queue" } th { "kind" } th { "tenant" }
                    th { "attempts" } th { "reason" } th { "dead-lettered" } th { "last error" }
                }
                @for row in &shown {
                    @match row {
                        Ok(letter) => (letter_row(letter)),
                        Err(unreadable) => (unreadable_row(unreadable)),
                    }
                }
            }
        }
        @if let Some(older) = older {
            p { a href=(older) { "Older letters" } }
        }
    };
    html_page(StatusCode::OK, page("Dead letters", Some(&session), body))
}

/// The list's bulk actions: over the letters waiting for review that its filter matches; each
/// goes to a confirmation stating the count first.
fn bulk_forms(query: &ListQuery, session: &Session) -> Markup {
    let fields = html! {
        (csrf_field(&session.csrf))
        @for (name, value) in [
            ("queue", &query.queue),
            ("tenant", &query.tenant),
            ("kind", &query.kind),
            ("reason", &query.reason),
        ] {
            @if let Some(value) = set(value) {
                input type="hidden" name=(name) value=(value);
            }
        }
    };
    html! {
        p {
            "Every letter waiting for review that this filter matches: "
            form method="post" action="/bulk" class="inline" {
                (fields)
                input type="hidden" name="action" value="replay";
                button #bulk-replay { "Replay all…" }
            }
            form method="post" action="/bulk" class="inline" {
                (fields)
                input type="hidden" name="action" value="discard";
                button #bulk-discard .danger { "Discard all…" }
            }
        }
    }
}

fn letter_row(letter: &DeadLetter) -> Markup {
    let l = &letter.letter;
    let id = letter.id.0;
    html! {
        tr data-id=(id) {
            td { a href={ "/letters/" (id) } { (id) } }
            td { (status_badge(letter.status)) }
            td { (l.queue.as_str()) }
            td { (l.kind.as_ref().map_or("-", |k| k.as_str())) }
            td { (l.tenant_id.map_or_else(|| "-".to_owned(), |t| t.to_string())) }
            td.n { (l.attempts) }
            td.reason { (reason_of(l.reason)) }
            td { (time(l.at)) }
            td { (html::first_line(&l.last_error, 200)) }
        }
    }
}

/// A letter's reason as pages show it; letters from before reasons were kept have none.
fn reason_of(reason: Option<DeadLetterReason>) -> &'static str {
    reason.map_or("not recorded", DeadLetterReason::as_str)
}

/// A row the store could not read, in its place in the list: its id and why, across the
/// other columns (it has no page of its own: the store cannot read it).
fn unreadable_row(row: &UnreadableLetter) -> Markup {
    html! {
        tr.unreadable data-id=(row.id.0) {
            td { (row.id.0) }
            td { span.status { "unreadable" } }
            td.error colspan="7" { (row.why) }
        }
    }
}

/// A listed row's id, readable or not: where the next page starts.
pub(super) fn listed_id(row: &ListedLetter) -> DeadLetterId {
    row.as_ref().map_or_else(|u| u.id, |l| l.id)
}

/// The letter `id` as `session` may see it: another tenant's is no letter at all.
async fn visible(
    console: &Console,
    session: &Session,
    id: i64,
) -> Result<DeadLetter, Box<Response>> {
    match console.dead_letters.get(DeadLetterId(id)).await {
        Ok(Some(letter))
            if session
                .tenant
                .is_none_or(|t| letter.letter.tenant_id == Some(t)) =>
        {
            Ok(letter)
        }
        Ok(_) => Err(Box::new(problem(
            StatusCode::NOT_FOUND,
            session,
            &format!("dead letter {id} not found"),
        ))),
        Err(e) => Err(Box::new(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            session,
            &e.to_string(),
        ))),
    }
}

pub(super) async fn letter(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let letter = match visible(&console, &session, id).await {
        Ok(letter) => letter,
        Err(answer) => return *answer,
    };
    let l = &letter.letter;
    let fields = [
        ("queue", l.queue.as_str().to_owned()),
        (
            "kind",
            l.kind.as_ref().map_or("-".into(), |k| k.to_string()),
        ),
        ("job id", l.job_id.map_or("-".into(), |j| j.to_string())),
        ("tenant", l.tenant_id.map_or("-".into(), |t| t.to_string())),
        (
            "correlation id",
            l.correlation_id.map_or("-".into(), |c| c.to_string()),
        ),
        (
            "consumer",
            l.consumer.as_ref().map_or("-".into(), |c| c.to_string()),
        ),
        ("attempts", l.attempts.to_string()),
        ("reason", reason_of(l.reason).to_owned()),
        ("dead-lettered", time(l.at)),
        ("status since", time(letter.updated_at)),
    ];
    let payload = match serde_json::from_slice::<serde_json::Value>(&l.payload) {
        Ok(value) => html! {
            h2 { "Envelope" }
            pre #envelope { (serde_json::to_string_pretty(&value).unwrap_or_default()) }
        },
        Err(_) => {
            let (text, shown) = html::raw_bytes(&l.payload);
            html! {
                h2 {
                    "Raw bytes (" (l.payload.len()) " bytes, "
                    (if text { "as text" } else { "in hex" }) ")"
                }
                pre #raw { (shown) }
            }
        }
    };
    let history = match console.dead_letters.history(letter.id).await {
        Ok(events) if events.is_empty() => {
            html! { p.note { "Dead-lettered; not reviewed yet." } }
        }
        Ok(events) => html! {
            table #history {
                tr { th { "when" } th { "change" } th { "by" } }
                @for event in events {
                    tr {
                        td { (time(event.at)) }
                        td { (event.from.as_str()) " → " (event.to.as_str()) }
                        td { (event.by) }
                    }
                }
            }
        },
        Err(e) => html! { p.error { "The history could not be read: " (e) } },
    };
    let same_job = same_job(&console, &session, &letter).await;
    let body = html! {
        p { (status_badge(letter.status)) }
        dl {
            @for (name, value) in fields { dt { (name) } dd { (value) } }
        }
        h2 { "Last error" }
        pre #error { (l.last_error) }
        (payload)
        h2 { "History" }
        (history)
        (same_job)
        @if letter.status == DeadLetterStatus::PendingReview {
            h2 { "Put it back" }
            form method="post" action={ "/letters/" (id) "/replay" } class="inline" {
                (csrf_field(&session.csrf))
                button #replay { "Replay to " (l.queue.as_str()) }
            }
            form method="post" action={ "/letters/" (id) "/discard" } class="inline" {
                (csrf_field(&session.csrf))
                button #discard .danger { "Discard" }
            }
        }
    };
    html_page(
        StatusCode::OK,
        page(&format!("Dead letter {id}"), Some(&session), body),
    )
}

/// The other letters of `letter`'s job (its earlier dead letters, or the one its replay
/// became), newest first, as `session` may see them: a replay's outcome is one click away.
async fn same_job(console: &Console, session: &Session, letter: &DeadLetter) -> Markup {
    let Some(job) = letter.letter.job_id else {
        return html! {};
    };
    let filter = DeadLetterFilter {
        job_id: Some(job),
        tenant_id: session.tenant,
        newest_first: true,
        limit: 20,
        ..DeadLetterFilter::default()
    };
    let others: Vec<DeadLetter> = match console.dead_letters.list(&filter).await {
        Ok(listed) => listed.into_iter().filter(|l| l.id != letter.id).collect(),
        Err(e) => return html! { p.error { "The job's other letters could not be read: " (e) } },
    };
    if others.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Other letters of this job" }
        table #same-job {
            tr { th { "id" } th { "status" } th { "reason" } th { "dead-lettered" } }
            @for other in &others {
                tr {
                    td { a href={ "/letters/" (other.id.0) } { (other.id.0) } }
                    td { (status_badge(other.status)) }
                    td { (reason_of(other.letter.reason)) }
                    td { (time(other.letter.at)) }
                }
            }
        }
    }
}

/// A POST of `resolution` on letter `id`: done, it goes back to the letter's page.
async fn resolve(
    console: &Console,
    headers: &HeaderMap,
    id: i64,
    csrf: &str,
    resolution: Resolution,
) -> Response {
    let session = match authorised_post(console, headers, csrf) {
        Ok(session) => session,
        Err(refused) => return *refused,
    };
    let resolved = resolver(console, &session)
        .resolve(resolution, DeadLetterId(id))
        .await;
    match resolved.verdict() {
        Verdict::Done | Verdict::AlreadyDone => {
            tracing::info!(dead_letter = id, tenant = ?session.tenant, ?resolution, "resolved from the console");
            redirect(&format!("/letters/{id}"))
        }
        Verdict::NotFound => problem(
            StatusCode::NOT_FOUND,
            &session,
            &format!("dead letter {id} not found"),
        ),
        Verdict::Conflict | Verdict::NotAnEnvelope => {
            problem(StatusCode::CONFLICT, &session, resolved.message())
        }
        Verdict::Failed => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            &session,
            resolved.message(),
        ),
    }
}

pub(super) async fn replay(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Csrf>,
) -> Response {
    resolve(&console, &headers, id, &form.csrf, Resolution::Replay).await
}

pub(super) async fn discard(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Csrf>,
) -> Response {
    resolve(&console, &headers, id, &form.csrf, Resolution::Discard).await
}

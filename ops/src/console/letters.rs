//! The dead letters' pages: the list with its filters (and the bulk actions over what it
//! matches), one letter in full with its history, and replay or discard of that letter.

use std::time::{Duration, SystemTime};

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jobs_core::{DeadLetter, DeadLetterId, DeadLetterStatus, Resolution};

use super::html::{self, escape, page, query_value};
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

fn status_badge(status: DeadLetterStatus) -> String {
    format!(
        "<span class=\"status status-{s}\">{s}</span>",
        s = status.as_str()
    )
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
    let mut shown = match console.dead_letters.list(&filter).await {
        Ok(letters) => letters,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    let full_page = shown.len() == filter.limit as usize;
    let mut older_hidden = false;
    if let Some(since) = since {
        let before = shown.len();
        shown.retain(|l| l.letter.at >= since);
        older_hidden = shown.len() < before;
    }
    let value = |v: &Option<String>| escape(set(v).unwrap_or(""));
    let status_options: String = ["", "pending_review", "replayed", "discarded"]
        .iter()
        .map(|s| {
            let selected = if set(&query.status) == Some(*s)
                || (s.is_empty() && set(&query.status).is_none())
            {
                " selected"
            } else {
                ""
            };
            let label = if s.is_empty() { "any" } else { s };
            format!("<option value=\"{s}\"{selected}>{label}</option>")
        })
        .collect();
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/letters\">\
         <label>status <select name=\"status\">{status_options}</select></label>\
         <label>queue <input name=\"queue\" value=\"{}\"></label>\
         <label>tenant <input name=\"tenant\" value=\"{}\"{}></label>\
         <label>kind <input name=\"kind\" value=\"{}\"></label>\
         <label>since <input name=\"since\" value=\"{}\" placeholder=\"24h\" size=\"5\"></label>\
         <label>job or correlation id <input name=\"q\" value=\"{}\" size=\"38\"></label>\
         <button>Filter</button></form>",
        value(&query.queue),
        value(&query.tenant),
        if session.tenant.is_some() {
            " disabled"
        } else {
            ""
        },
        value(&query.kind),
        value(&query.since),
        value(&query.q),
    );
    if console.runs.is_some() && set(&query.q).is_none() && set(&query.since).is_none() {
        body.push_str(&bulk_forms(&query, &session));
    }
    if shown.is_empty() {
        body.push_str("<p class=\"note\">No dead letter matches.</p>");
    } else {
        body.push_str(
            "<table id=\"letters\"><tr><th>id</th><th>status</th><th>queue</th><th>kind</th>\
             <th>tenant</th><th>attempts</th><th>dead-lettered</th><th>last error</th></tr>",
        );
        for l in &shown {
            body.push_str(&letter_row(l));
        }
        body.push_str("</table>");
    }
    if full_page
        && !older_hidden
        && let Some(last) = shown.last()
    {
        let mut next = format!("/letters?before={}", last.id.0);
        for (name, v) in [
            ("status", &query.status),
            ("queue", &query.queue),
            ("tenant", &query.tenant),
            ("kind", &query.kind),
            ("since", &query.since),
            ("q", &query.q),
        ] {
            if let Some(v) = set(v) {
                next.push_str(&format!("&{name}={}", query_value(v)));
            }
        }
        body.push_str(&format!(
            "<p><a href=\"{}\">Older letters</a></p>",
            escape(&next)
        ));
    }
    html_page(
        StatusCode::OK,
        page("Dead letters", Some(&session.csrf), &body),
    )
}

/// The list's bulk actions: over the letters waiting for review that its filter matches; each
/// goes to a confirmation stating the count first.
fn bulk_forms(query: &ListQuery, session: &Session) -> String {
    let mut fields = format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        escape(&session.csrf)
    );
    for (name, value) in [
        ("queue", &query.queue),
        ("tenant", &query.tenant),
        ("kind", &query.kind),
    ] {
        if let Some(value) = set(value) {
            fields.push_str(&format!(
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                escape(value)
            ));
        }
    }
    format!(
        "<p>Every letter waiting for review that this filter matches: \
         <form method=\"post\" action=\"/bulk\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"action\" value=\"replay\">\
         <button id=\"bulk-replay\">Replay all…</button></form>\
         <form method=\"post\" action=\"/bulk\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"action\" value=\"discard\">\
         <button id=\"bulk-discard\" class=\"danger\">Discard all…</button></form></p>"
    )
}

fn letter_row(letter: &DeadLetter) -> String {
    let l = &letter.letter;
    format!(
        "<tr data-id=\"{id}\"><td><a href=\"/letters/{id}\">{id}</a></td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
        status_badge(letter.status),
        escape(l.queue.as_str()),
        escape(l.kind.as_ref().map_or("-", |k| k.as_str())),
        escape(
            &l.tenant_id
                .map_or_else(|| "-".to_owned(), |t| t.to_string())
        ),
        l.attempts,
        time(l.at),
        escape(&html::normalise_error(&l.last_error)),
        id = letter.id.0,
    )
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
    let field =
        |name: &str, value: String| format!("<dt>{}</dt><dd>{}</dd>", escape(name), escape(&value));
    let mut body = format!("<p>{}</p><dl>", status_badge(letter.status));
    for (name, value) in [
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
        ("dead-lettered", time(l.at)),
        ("status since", time(letter.updated_at)),
    ] {
        body.push_str(&field(name, value));
    }
    body.push_str("</dl><h2>Last error</h2>");
    body.push_str(&format!(
        "<pre id=\"error\">{}</pre>",
        escape(&l.last_error)
    ));
    match serde_json::from_slice::<serde_json::Value>(&l.payload) {
        Ok(value) => {
            let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
            body.push_str(&format!(
                "<h2>Envelope</h2><pre id=\"envelope\">{}</pre>",
                escape(&pretty)
            ));
        }
        Err(_) => {
            let (text, shown) = html::raw_bytes(&l.payload);
            body.push_str(&format!(
                "<h2>Raw bytes ({} bytes, {})</h2><pre id=\"raw\">{}</pre>",
                l.payload.len(),
                if text { "as text" } else { "in hex" },
                escape(&shown)
            ));
        }
    }
    body.push_str("<h2>History</h2>");
    match console.dead_letters.history(letter.id).await {
        Ok(events) if events.is_empty() => {
            body.push_str("<p class=\"note\">Dead-lettered; not reviewed yet.</p>");
        }
        Ok(events) => {
            body.push_str("<table id=\"history\"><tr><th>when</th><th>change</th><th>by</th></tr>");
            for event in events {
                body.push_str(&format!(
                    "<tr><td>{}</td><td>{} → {}</td><td>{}</td></tr>",
                    time(event.at),
                    event.from.as_str(),
                    event.to.as_str(),
                    escape(&event.by)
                ));
            }
            body.push_str("</table>");
        }
        Err(e) => body.push_str(&format!(
            "<p class=\"error\">The history could not be read: {}</p>",
            escape(&e.to_string())
        )),
    }
    if letter.status == DeadLetterStatus::PendingReview {
        let csrf = escape(&session.csrf);
        body.push_str(&format!(
            "<h2>Put it back</h2>\
             <form method=\"post\" action=\"/letters/{id}/replay\" class=\"inline\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <button id=\"replay\">Replay to {}</button></form>\
             <form method=\"post\" action=\"/letters/{id}/discard\" class=\"inline\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <button id=\"discard\" class=\"danger\">Discard</button></form>",
            escape(l.queue.as_str()),
        ));
    }
    html_page(
        StatusCode::OK,
        page(&format!("Dead letter {id}"), Some(&session.csrf), &body),
    )
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

//! The overview: every queue's depth by state and how long its oldest ready job has waited,
//! the busiest first and paged, refreshed by the page's script from `/queues.json`; and the
//! pending dead letters counted by queue and by error.

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::header::CACHE_CONTROL;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use jobs_core::{DeadLetterFilter, DeadLetterStatus, QueueName};
use maud::{Markup, PreEscaped, html};
use serde::Deserialize;
use serde_json::json;

use super::html::{self, link, page};
use super::{COUNTED, Console, Shared, html_page, letters, unauthorised};

/// How many queues a page of the overview shows, the busiest first.
const QUEUES_PER_PAGE: usize = 100;

/// Every queue's figures, the busiest first (then by name), read in one call
/// ([`QueueDepth::depths`]: one statement on PostgreSQL, however many queues); `None` where
/// the transport could not tell.
pub(super) async fn queue_rows(console: &Console) -> Vec<(QueueName, Option<jobs_core::Depth>)> {
    let Some(depth) = &console.depth else {
        return vec![];
    };
    let mut also = console.queues.clone();
    for queue in console.recent() {
        if !also.contains(&queue) {
            also.push(queue);
        }
    }
    match depth.depths(&also).await {
        Ok(mut rows) => {
            rows.sort_by(|a, b| (b.1.total().cmp(&a.1.total())).then_with(|| a.0.cmp(&b.0)));
            rows.into_iter().map(|(name, d)| (name, Some(d))).collect()
        }
        Err(e) => {
            tracing::warn!(error = %e, "the queues' depth could not be read");
            console
                .queues
                .iter()
                .map(|name| (name.clone(), None))
                .collect()
        }
    }
}

/// The overview's query: which page of queues (from 0; anything else is the first).
#[derive(Deserialize, Default)]
pub(super) struct OverviewQuery {
    page: Option<String>,
}

/// How long `depth`'s oldest ready job has waited, in whole seconds; `None` when the transport
/// does not tell.
fn waited_secs(depth: jobs_core::Depth) -> Option<u64> {
    depth.waited(SystemTime::now()).map(|w| w.as_secs())
}

pub(super) async fn queues_json(State(console): Shared, headers: HeaderMap) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if session.tenant.is_some() {
        return axum::Json(json!([])).into_response();
    }
    let rows: Vec<serde_json::Value> = queue_rows(&console)
        .await
        .into_iter()
        .map(|(name, d)| {
            json!({
                "queue": name.as_str(),
                "ready": d.map(|d| d.ready),
                "delayed": d.and_then(|d| d.delayed_known()),
                "in_flight": d.and_then(|d| d.in_flight_known()),
                "waited": d.and_then(waited_secs),
                "history": console.history(&name),
            })
        })
        .collect();
    let mut answer = axum::Json(rows).into_response();
    answer
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    answer
}

pub(super) async fn overview(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<OverviewQuery>,
) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let at_page = (query.page.as_deref())
        .and_then(|page| page.parse::<usize>().ok())
        .unwrap_or(0);
    console.sample();
    let queues = if session.tenant.is_some() {
        html! {
            p.note {
                "Queue figures are not kept per tenant, so a tenant's token shows none."
            }
        }
    } else if console.depth.is_none() {
        html! { p.note { "This transport does not report queue depth." } }
    } else {
        queues_table(&console, at_page).await
    };
    let filter = DeadLetterFilter {
        status: Some(DeadLetterStatus::PendingReview),
        tenant_id: session.tenant,
        newest_first: true,
        limit: 500,
        ..DeadLetterFilter::default()
    };
    let letters = match counts(&console, filter).await {
        Ok(Counts {
            seen,
            by_queue,
            by_error,
            unreadable,
        }) => {
            let mut errors: Vec<(String, usize)> = by_error.into_iter().collect();
            errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            html! {
                h2 { "Dead letters waiting for review" }
                p.note {
                    (seen) " counted"
                    @if seen >= COUNTED as usize { " (the newest " (COUNTED) ")" }
                    "."
                }
                @if unreadable > 0 {
                    p.error #unreadable {
                        (unreadable) " of them cannot be read as letters: "
                        a href="/letters?status=pending_review" { "the list" } " says why."
                    }
                }
                table {
                    tr { th { "queue" } th { "letters" } }
                    @for (queue, n) in by_queue {
                        @let href = link("/letters", [("status", Some("pending_review")), ("queue", Some(queue.as_str()))]);
                        tr { td { a href=(href) { (queue) } } td.n { (n) } }
                    }
                }
                h2 { "By error" }
                table {
                    tr { th { "error" } th { "letters" } }
                    @for (error, n) in errors.into_iter().take(50) {
                        tr { td { (error) } td.n { (n) } }
                    }
                }
            }
        }
        Err(e) => html! { p.error { "The store did not answer: " (e) } },
    };
    let body = html! { (queues) (letters) };
    html_page(StatusCode::OK, page("Overview", Some(&session), body))
}

/// The overview's table of queues: page `at_page` of them, the busiest first, refreshed by
/// the script from `/queues.json`.
async fn queues_table(console: &Console, at_page: usize) -> Markup {
    let rows = queue_rows(console).await;
    let shown = at_page.saturating_mul(QUEUES_PER_PAGE).min(rows.len());
    let pages = rows.len().div_ceil(QUEUES_PER_PAGE);
    let cell = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    html! {
        h2 { "Queues" }
        table #queues {
            tr {
                th { "queue" } th { "ready" } th { "delayed" } th { "in flight" }
                th title="How long the oldest ready job has waited" { "waited, s" }
                th { "depth, last 10 minutes" }
            }
            @for (name, d) in rows.iter().skip(shown).take(QUEUES_PER_PAGE) {
                tr data-queue=(name.as_str()) {
                    td { a href=(link("/letters", [("queue", Some(name.as_str()))])) { (name.as_str()) } }
                    td.n data-field="ready" { (cell(d.map(|d| d.ready))) }
                    td.n data-field="delayed" { (cell(d.and_then(|d| d.delayed_known()))) }
                    td.n data-field="in_flight" { (cell(d.and_then(|d| d.in_flight_known()))) }
                    td.n data-field="waited" { (cell(d.and_then(waited_secs))) }
                    td {
                        svg.spark viewBox="0 0 100 30" preserveAspectRatio="none" {
                            polyline points=(html::spark(&console.history(name))) {}
                        }
                    }
                }
            }
        }
        @if pages > 1 {
            p.note #queue-pages {
                "Queues " (shown + 1) (PreEscaped("&ndash;"))
                ((shown + QUEUES_PER_PAGE).min(rows.len())) " of " (rows.len())
                ", the busiest first."
                @if at_page > 0 {
                    " " a href={ "/?page=" ((at_page - 1).min(pages - 1)) } { "previous" }
                }
                @if at_page + 1 < pages {
                    " " a href={ "/?page=" (at_page + 1) } { "next" }
                }
            }
        }
        p.note { "Refreshed every 5 s, last at " span #refreshed { "load" } "." }
    }
}

/// What the overview counts over the newest pending letters.
#[derive(Default)]
struct Counts {
    /// Rows read, at most [`COUNTED`] (and a page more).
    seen: usize,
    by_queue: BTreeMap<String, usize>,
    by_error: BTreeMap<String, usize>,
    /// Rows the store could not read as letters (listed, with why, on the letters page).
    unreadable: usize,
}

/// Pending letters counted by queue and by normalised error, over at most [`COUNTED`].
async fn counts(
    console: &Console,
    mut filter: DeadLetterFilter,
) -> Result<Counts, jobs_core::StoreError> {
    let mut counts = Counts::default();
    loop {
        let rows = console.dead_letters.listing(&filter).await?;
        for row in &rows {
            counts.seen += 1;
            let Ok(letter) = row else {
                counts.unreadable += 1;
                continue;
            };
            *counts
                .by_queue
                .entry(letter.letter.queue.as_str().to_owned())
                .or_insert(0) += 1;
            *counts
                .by_error
                .entry(html::normalise_error(&letter.letter.last_error))
                .or_insert(0) += 1;
        }
        match rows.last() {
            Some(last) if rows.len() == filter.limit as usize && counts.seen < COUNTED as usize => {
                filter.before = Some(letters::listed_id(last));
            }
            _ => return Ok(counts),
        }
    }
}

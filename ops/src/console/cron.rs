//! The cron page: the standard periodic tasks with their next slots, and per tenant the
//! freshness tier its entitlement gives it and when its next recompute falls.
//!
//! Tenants come from the [`TenantDirectory`] the console is given ([`Console::tenants`]),
//! page by page in id order, or one by id. A tenant-scoped session sees its own tenant only.

use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jobs_core::{Tenant, TenantId};
use jobs_cron::{CronTask, FanOut, TierRule};
use serde::Deserialize;

use maud::{Markup, html};

use super::html::{link, page};
use super::{Shared, html_page, problem, set, time, unauthorised};

/// Tenants the page lists at a time.
const TENANTS_PER_PAGE: u32 = 50;

/// `/cron?tenant=ID` finds one tenant; `/cron?after=ID` pages on.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct CronQuery {
    tenant: Option<String>,
    after: Option<String>,
}

pub(crate) async fn cron(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<CronQuery>,
) -> Response {
    let Some(session) = console.gate.session(&headers) else {
        return unauthorised();
    };
    let now = SystemTime::now();
    let tasks = jobs_cron::standard_tasks();
    let tasks_table = html! {
        p.note { "The standard periodic tasks, fanned out per tenant at each slot." }
        table #tasks {
            tr {
                th { "task" } th { "queue" } th { "schedule" } th { "next slot" } th { "tenants" }
            }
            @for task in &tasks {
                tr {
                    td { (task.kind.as_str()) }
                    td { (task.queue.as_str()) }
                    td { (task.schedule) }
                    td { (task.schedule.next_after(now).map_or_else(|| "-".to_owned(), time)) }
                    td {
                        (match (task.fan_out, &task.tier) {
                            (FanOut::Single, _) => "one job for the system",
                            (FanOut::PerTenant, Some(_)) => {
                                "those due at the slot by their freshness tier"
                            }
                            (FanOut::PerTenant, None) => "every tenant",
                        })
                    }
                }
            }
        }
    };
    let cron_page = |tiers: Markup| {
        let body = html! { (tasks_table) (tiers) };
        html_page(StatusCode::OK, page("Cron", Some(&session), body))
    };
    let tiered: Vec<&CronTask> = tasks.iter().filter(|t| t.tier.is_some()).collect();
    if tiered.is_empty() {
        return cron_page(html! {});
    }
    let Some(directory) = &console.tenants else {
        return cron_page(html! {
            h2 { "Freshness tiers by tenant" }
            p.note {
                "This console has no tenant directory (the store keeps no tenants), so \
                 tenants' tiers are not shown."
            }
        });
    };
    let parse = |field: &str, value: &Option<String>| -> Result<Option<TenantId>, String> {
        set(value)
            .map(|v| v.parse().map_err(|e| format!("{field}: `{v}`: {e}")))
            .transpose()
    };
    let (wanted, after) = match (parse("tenant", &query.tenant), parse("after", &query.after)) {
        (Ok(wanted), Ok(after)) => (wanted, after),
        (Err(e), _) | (_, Err(e)) => return problem(StatusCode::BAD_REQUEST, &session, &e),
    };
    // A scoped session is its tenant, whatever the query asks.
    let wanted = session.tenant.or(wanted);
    let listed = match wanted {
        Some(id) => directory
            .tenant(id)
            .await
            .map(|t| (t.into_iter().collect(), None)),
        None => directory
            .page(after, TENANTS_PER_PAGE)
            .await
            .map(|page| (page.tenants, page.next)),
    };
    let (tenants, next): (Vec<Tenant>, Option<TenantId>) = match listed {
        Ok(listed) => listed,
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &session, &e.to_string()),
    };
    let more = match (wanted, next) {
        (None, Some(next)) => Some(link("/cron", [("after", Some(next.to_string().as_str()))])),
        _ => None,
    };
    cron_page(html! {
        h2 { "Freshness tiers by tenant" }
        @if session.tenant.is_none() {
            form.filters method="get" action="/cron" {
                label {
                    "tenant " input name="tenant" value=(set(&query.tenant).unwrap_or("")) size="38";
                }
                button { "Find" }
            }
        }
        @if tenants.is_empty() {
            p.note {
                @match wanted {
                    Some(id) => { "The directory holds no tenant " (id) "." }
                    None => { "The directory holds no tenant." }
                }
            }
        } @else {
            table #tiers {
                tr {
                    th { "tenant" }
                    @for task in &tiered {
                        th { (task.kind.as_str()) ": tier" }
                        th { (task.kind.as_str()) ": next" }
                    }
                }
                @for tenant in &tenants {
                    tr {
                        td.id { (tenant.id) }
                        @for task in &tiered {
                            @let (tier, said) = task
                                .tier
                                .as_ref()
                                .map(|rule| tier_cell(rule, tenant))
                                .unwrap_or_default();
                            td { (said) }
                            td { (task.next_slot_for(tier, now).map_or_else(|| "-".to_owned(), time)) }
                        }
                    }
                }
            }
            @if let Some(more) = more {
                p { a href=(more) { "More tenants" } }
            }
        }
    })
}

/// The tenant's tier under `rule` and how the page says it: the entitlement's value, or the
/// default with why it applies.
fn tier_cell(rule: &TierRule, tenant: &Tenant) -> (Option<jobs_cron::Tier>, String) {
    match (
        tenant.entitlements.get(&rule.entitlement),
        rule.tier_of(tenant),
    ) {
        (Some(_), Ok(tier)) => (Some(tier), tier.to_string()),
        (None, _) => (
            Some(rule.default),
            format!("{} (default: no {})", rule.default, rule.entitlement),
        ),
        (Some(_), Err(e)) => (
            Some(rule.default),
            format!("{} (default: {e})", rule.default),
        ),
    }
}

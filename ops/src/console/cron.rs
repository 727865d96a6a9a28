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

use super::html::{escape, page, query_value};
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
    let mut body = String::from(
        "<p class=\"note\">The standard periodic tasks, fanned out per tenant at each slot.</p>\
         <table id=\"tasks\"><tr><th>task</th><th>queue</th><th>schedule</th><th>next slot</th>\
         <th>tenants</th></tr>",
    );
    for task in &tasks {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(task.kind.as_str()),
            escape(task.queue.as_str()),
            escape(&task.schedule.to_string()),
            task.schedule
                .next_after(now)
                .map_or_else(|| "-".to_owned(), time),
            match (task.fan_out, &task.tier) {
                (FanOut::Single, _) => "one job for the system",
                (FanOut::PerTenant, Some(_)) => "those due at the slot by their freshness tier",
                (FanOut::PerTenant, None) => "every tenant",
            }
        ));
    }
    body.push_str("</table>");
    let tiered: Vec<&CronTask> = tasks.iter().filter(|t| t.tier.is_some()).collect();
    if tiered.is_empty() {
        return html_page(StatusCode::OK, page("Cron", Some(&session.csrf), &body));
    }
    body.push_str("<h2>Freshness tiers by tenant</h2>");
    let Some(directory) = &console.tenants else {
        body.push_str(
            "<p class=\"note\">This console has no tenant directory (the store keeps no \
             tenants), so tenants' tiers are not shown.</p>",
        );
        return html_page(StatusCode::OK, page("Cron", Some(&session.csrf), &body));
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
    if session.tenant.is_none() {
        body.push_str(&format!(
            "<form class=\"filters\" method=\"get\" action=\"/cron\">\
             <label>tenant <input name=\"tenant\" value=\"{}\" size=\"38\"></label>\
             <button>Find</button></form>",
            escape(set(&query.tenant).unwrap_or(""))
        ));
    }
    if tenants.is_empty() {
        body.push_str(&match wanted {
            Some(id) => format!(
                "<p class=\"note\">The directory holds no tenant {}.</p>",
                escape(&id.to_string())
            ),
            None => "<p class=\"note\">The directory holds no tenant.</p>".to_owned(),
        });
        return html_page(StatusCode::OK, page("Cron", Some(&session.csrf), &body));
    }
    body.push_str("<table id=\"tiers\"><tr><th>tenant</th>");
    for task in &tiered {
        body.push_str(&format!(
            "<th>{k}: tier</th><th>{k}: next</th>",
            k = escape(task.kind.as_str())
        ));
    }
    body.push_str("</tr>");
    for tenant in &tenants {
        body.push_str(&format!(
            "<tr><td class=\"id\">{}</td>",
            escape(&tenant.id.to_string())
        ));
        for task in &tiered {
            let (tier, said) = task
                .tier
                .as_ref()
                .map(|rule| tier_cell(rule, tenant))
                .unwrap_or_default();
            body.push_str(&format!(
                "<td>{}</td><td>{}</td>",
                escape(&said),
                task.next_slot_for(tier, now)
                    .map_or_else(|| "-".to_owned(), time)
            ));
        }
        body.push_str("</tr>");
    }
    body.push_str("</table>");
    if let (None, Some(next)) = (wanted, next) {
        body.push_str(&format!(
            "<p><a href=\"/cron?after={}\">More tenants</a></p>",
            query_value(&next.to_string())
        ));
    }
    html_page(StatusCode::OK, page("Cron", Some(&session.csrf), &body))
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

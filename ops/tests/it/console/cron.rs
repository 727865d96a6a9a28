//! The console's cron page: the standard tasks, and each tenant's freshness tier and next
//! recompute, a tenant's token seeing its own only.

use super::*;

/// The cron page's rows of tenants: (tenant, tier as said, next recompute).
fn tier_rows(page: &str) -> Vec<(String, String, String)> {
    let table = page.split("<table id=\"tiers\">").nth(1).unwrap_or("");
    let row = regex::Regex::new(
        r#"<tr><td class="id">([^<]+)</td><td>([^<]*)</td><td>([^<]*)</td></tr>"#,
    )
    .expect("a regex");
    row.captures_iter(table)
        .map(|c| (c[1].to_owned(), c[2].to_owned(), c[3].to_owned()))
        .collect()
}

#[tokio::test]
async fn the_cron_page_shows_each_tenants_freshness_tier_and_next_recompute() {
    let s = serve().await;
    let cookie = s.sign_in(OPERATOR).await;
    let freshness = jobs_cron::standard_tasks()
        .into_iter()
        .find(|t| t.kind.as_str() == jobs_cron::DATA_FRESHNESS_KIND)
        .expect("the freshness task");
    let next = |tier: jobs_cron::Tier| {
        let at = freshness
            .next_slot_for(Some(tier), SystemTime::now())
            .expect("a slot");
        chrono::DateTime::<chrono::Utc>::from(at)
            .format("%Y-%m-%d %H:%M:%S UTC")
            .to_string()
    };
    let (status, first) = s.get(Some(&cookie), "/cron").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        first.contains(jobs_cron::DATA_FRESHNESS_KIND),
        "the tasks are listed"
    );
    let rows = tier_rows(&first);
    assert_eq!(rows.len(), 50, "one page of tenants");
    assert_eq!(
        rows[0],
        (
            fixtures::tenant(1).to_string(),
            "6h".to_owned(),
            next(jobs_cron::Tier::Every6Hours)
        )
    );
    assert_eq!(
        rows[1],
        (
            fixtures::tenant(2).to_string(),
            "nightly (default: no data_freshness)".to_owned(),
            next(jobs_cron::Tier::Nightly)
        )
    );
    assert!(
        rows[2]
            .1
            .starts_with("nightly (default: `&lt;b&gt;2h&lt;/b&gt;` is not"),
        "{:?}",
        rows[2]
    );
    // The next page holds the other ten, each once.
    let more = regex::Regex::new(r#"href="(/cron\?after=[^"]+)">More tenants"#)
        .expect("a regex")
        .captures(&first)
        .map(|c| c[1].to_owned())
        .expect("a link to more tenants");
    let (_, second) = s.get(Some(&cookie), &more).await;
    let mut seen: Vec<String> = rows
        .into_iter()
        .chain(tier_rows(&second))
        .map(|r| r.0)
        .collect();
    assert!(!second.contains("More tenants"), "the last page");
    seen.dedup();
    assert_eq!(
        seen,
        (1..=60)
            .map(|n| fixtures::tenant(n).to_string())
            .collect::<Vec<_>>()
    );
    // One tenant by id; a bad id is named.
    let (_, found) = s
        .get(
            Some(&cookie),
            &format!("/cron?tenant={}", fixtures::tenant(3)),
        )
        .await;
    assert_eq!(tier_rows(&found).len(), 1);
    assert_eq!(tier_rows(&found)[0].0, fixtures::tenant(3).to_string());
    let (status, refused) = s.get(Some(&cookie), "/cron?tenant=someone").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused.contains("tenant: `someone`"), "{refused}");
}

#[tokio::test]
async fn a_tenant_token_sees_its_own_tier_only_on_the_cron_page() {
    let s = serve().await;
    let cookie = s.sign_in(TENANT_ONE).await;
    for path in [
        "/cron".to_owned(),
        format!("/cron?tenant={}", fixtures::tenant(2)),
        format!("/cron?after={}", fixtures::tenant(1)),
    ] {
        let (status, page) = s.get(Some(&cookie), &path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let rows = tier_rows(&page);
        assert_eq!(rows.len(), 1, "{path}");
        assert_eq!(rows[0].0, fixtures::tenant(1).to_string(), "{path}");
        assert_eq!(rows[0].1, "6h", "{path}");
        assert!(!page.contains("More tenants"), "{path}");
        assert!(!page.contains(&fixtures::tenant(2).to_string()), "{path}");
    }
}

//! The tenants a per-tenant fan-out reaches, with their entitlements.

use std::collections::BTreeMap;

use crate::id::TenantId;
use async_trait::async_trait;

/// A tenant and what its plan entitles it to, e.g. `data_freshness = "6h"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant.
    pub id: TenantId,
    /// Entitlement name → value, as the billing system states them.
    pub entitlements: BTreeMap<String, String>,
}

/// One page of tenants, in id order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TenantPage {
    /// The tenants of this page.
    pub tenants: Vec<Tenant>,
    /// The cursor for the next page; `None` on the last one.
    pub next: Option<TenantId>,
}

/// Lists tenants page by page, so a fan-out over 100,000 tenants holds one page in memory.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait TenantDirectory: Send + Sync {
    /// Up to `limit` tenants with ids after `after` (from the first when `None`), in id order.
    async fn page(&self, after: Option<TenantId>, limit: u32)
    -> Result<TenantPage, DirectoryError>;

    /// The tenant with id `id`, or `None` when the directory does not hold it. The default
    /// walks the pages; a directory that can look one tenant up directly should.
    async fn tenant(&self, id: TenantId) -> Result<Option<Tenant>, DirectoryError> {
        let mut after = None;
        loop {
            let page = self.page(after, 1000).await?;
            if let Some(found) = page.tenants.iter().find(|t| t.id == id) {
                return Ok(Some(found.clone()));
            }
            match page.next {
                // Pages come in id order: past `id`, it is not there.
                Some(next) if next < id => after = Some(next),
                _ => return Ok(None),
            }
        }
    }
}

crate::error::port_error! {
    /// The directory could not be read.
    pub enum DirectoryError {
        /// It could not be reached or failed transiently: a later page may succeed.
        Unavailable => "tenant directory unavailable: {message}", Retryable;
        /// It refused the read or returned a row that is not a tenant: trying again cannot help.
        Failed => "tenant directory failed: {message}", Permanent;
    }
}

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

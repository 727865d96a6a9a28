//! The tenants a per-tenant fan-out reaches, with their entitlements.

use std::collections::BTreeMap;

use async_trait::async_trait;
use thiserror::Error;

use crate::error::ErrorClass;
use crate::id::TenantId;

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

/// The directory could not be read.
#[derive(Debug, Error)]
#[error("tenant directory: {message}")]
pub struct DirectoryError {
    /// What failed.
    pub message: String,
    /// Whether a later try may succeed.
    pub class: ErrorClass,
    /// The underlying error.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

//! The in-memory tenant directory.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use jobs_core::{DirectoryError, Tenant, TenantDirectory, TenantId, TenantPage};

/// An in-process [`TenantDirectory`]; clones share the same tenants.
///
/// Tenants are kept in a `Vec` sorted by id, so pages are keyset slices found by binary
/// search, exactly as a SQL directory pages by `id > cursor order by id`.
///
/// ```
/// use jobs_adapter_memory::MemoryTenantDirectory;
/// use jobs_core::{Tenant, TenantDirectory};
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let directory = MemoryTenantDirectory::default();
/// directory.insert(Tenant {
///     id: "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90".parse()?,
///     entitlements: [("data_freshness".to_owned(), "6h".to_owned())].into(),
/// });
/// let page = directory.page(None, 100).await?;
/// assert_eq!(page.tenants.len(), 1);
/// assert_eq!(page.next, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryTenantDirectory {
    tenants: Arc<Mutex<Vec<Tenant>>>,
}

impl MemoryTenantDirectory {
    /// A directory holding `tenants` (a later duplicate id replaces an earlier one).
    pub fn with_tenants(tenants: impl IntoIterator<Item = Tenant>) -> Self {
        let directory = MemoryTenantDirectory::default();
        for tenant in tenants {
            directory.insert(tenant);
        }
        directory
    }

    /// Adds `tenant`, or replaces the entitlements of the tenant with its id.
    pub fn insert(&self, tenant: Tenant) {
        let mut tenants = self.lock();
        match tenants.binary_search_by_key(&tenant.id, |t| t.id) {
            Ok(at) => tenants[at] = tenant,
            Err(at) => tenants.insert(at, tenant),
        }
    }

    /// Removes the tenant with id `id`; returns whether it was there.
    pub fn remove(&self, id: TenantId) -> bool {
        let mut tenants = self.lock();
        match tenants.binary_search_by_key(&id, |t| t.id) {
            Ok(at) => {
                tenants.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// How many tenants it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no tenant.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Tenant>> {
        // Inserts and removals leave the Vec sorted before they could panic.
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl TenantDirectory for MemoryTenantDirectory {
    /// A `limit` of 0 is treated as 1, so that every page but the last makes progress.
    async fn page(
        &self,
        after: Option<TenantId>,
        limit: u32,
    ) -> Result<TenantPage, DirectoryError> {
        let tenants = self.lock();
        let start = after.map_or(0, |after| tenants.partition_point(|t| t.id <= after));
        let limit = usize::try_from(limit.max(1)).unwrap_or(usize::MAX);
        let end = start.saturating_add(limit).min(tenants.len());
        let page = tenants[start..end].to_vec();
        let next = if end < tenants.len() {
            page.last().map(|t| t.id)
        } else {
            None
        };
        Ok(TenantPage {
            tenants: page,
            next,
        })
    }

    async fn tenant(&self, id: TenantId) -> Result<Option<Tenant>, DirectoryError> {
        let tenants = self.lock();
        Ok(tenants
            .binary_search_by_key(&id, |t| t.id)
            .ok()
            .map(|at| tenants[at].clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(n: u8) -> Tenant {
        Tenant {
            id: format!("00000000-0000-4000-8000-0000000000{n:02x}")
                .parse()
                .expect("a v4 UUID"),
            entitlements: Default::default(),
        }
    }

    #[tokio::test]
    async fn pages_reach_every_tenant_once_in_id_order() {
        let directory = MemoryTenantDirectory::with_tenants([4, 1, 5, 3, 2].map(tenant));
        directory.insert(tenant(3)); // a replacement, not a second copy
        let mut seen = vec![];
        let mut after = None;
        loop {
            let page = directory.page(after, 2).await.expect("in memory");
            assert!(page.tenants.len() <= 2);
            seen.extend(page.tenants.iter().map(|t| t.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, [1, 2, 3, 4, 5].map(|n| tenant(n).id));
    }

    /// Only pages, so lookups take the port's default walk.
    struct PagesOnly(MemoryTenantDirectory);

    #[async_trait]
    impl TenantDirectory for PagesOnly {
        async fn page(
            &self,
            after: Option<TenantId>,
            limit: u32,
        ) -> Result<TenantPage, DirectoryError> {
            self.0.page(after, limit).await
        }
    }

    #[tokio::test]
    async fn one_tenant_is_found_by_id_directly_and_by_the_default_walk() {
        fn id(n: u32) -> TenantId {
            format!("00000000-0000-4000-8000-{n:012x}")
                .parse()
                .expect("a v4 UUID")
        }
        // Every even id up to 5000: the walk crosses pages of 1000.
        let directory = MemoryTenantDirectory::with_tenants((1..=2500).map(|n| Tenant {
            id: id(2 * n),
            entitlements: [("n".to_owned(), n.to_string())].into(),
        }));
        let walked = PagesOnly(directory.clone());
        for n in [2, 1000, 2002, 4998, 5000] {
            let found = directory.tenant(id(n)).await.expect("in memory");
            assert_eq!(found.as_ref().map(|t| t.id), Some(id(n)));
            assert_eq!(
                found.map(|t| t.entitlements["n"].clone()),
                Some((n / 2).to_string())
            );
            assert_eq!(
                walked.tenant(id(n)).await.expect("in memory").map(|t| t.id),
                Some(id(n))
            );
        }
        for n in [1, 2001, 5001, 9999] {
            assert_eq!(directory.tenant(id(n)).await.expect("in memory"), None);
            assert_eq!(walked.tenant(id(n)).await.expect("in memory"), None);
        }
    }

    #[tokio::test]
    async fn the_last_page_has_no_cursor_even_when_full() {
        let directory = MemoryTenantDirectory::with_tenants([1, 2].map(tenant));
        let page = directory.page(None, 2).await.expect("in memory");
        assert_eq!(page.tenants.len(), 2);
        assert_eq!(page.next, None);
        assert!(directory.remove(tenant(1).id));
        assert!(!directory.remove(tenant(1).id));
        assert_eq!(directory.len(), 1);
    }
}

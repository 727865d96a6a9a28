//! The tenant directory over `core.tenants`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use jobs_core::{DirectoryError, Tenant, TenantDirectory, TenantId, TenantPage};
use sqlx::PgPool;
use sqlx::types::Uuid;

use crate::error::is_transient;

/// A [`TenantDirectory`] over `core.tenants (id uuid primary key, entitlements jsonb)`,
/// created by [`PgStore::migrate`](crate::PgStore::migrate).
///
/// Pages by keyset (`id > cursor order by id limit n`) on the primary key, so every page costs
/// the same however deep the fan-out is, and a tenant added or removed during a fan-out never
/// makes another be listed twice or skipped. Entitlement values are read as text: strings as
/// they are, numbers and booleans as their JSON text, `null` as absent.
///
/// ```no_run
/// use jobs_adapter_postgres::PgTenantDirectory;
/// use jobs_core::TenantDirectory;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let directory = PgTenantDirectory::new(pool);
/// let first = directory.page(None, 1000).await?;
/// if let Some(cursor) = first.next {
///     let _second = directory.page(Some(cursor), 1000).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PgTenantDirectory {
    pool: PgPool,
}

impl PgTenantDirectory {
    /// A directory reading `core.tenants` through `pool`.
    pub fn new(pool: PgPool) -> Self {
        PgTenantDirectory { pool }
    }
}

/// A tenant's id and its entitlements as parallel key and value arrays, in key order.
macro_rules! tenant_columns {
    () => {
        "select t.id, \
            array(select e.key from jsonb_each_text(t.entitlements) e \
                  where e.value is not null order by e.key) as keys, \
            array(select e.value from jsonb_each_text(t.entitlements) e \
                  where e.value is not null order by e.key) as vals \
         from core.tenants t "
    };
}

/// One page plus one row, so the page knows whether another follows.
const PAGE: &str = concat!(
    tenant_columns!(),
    "where $1::uuid is null or t.id > $1 order by t.id limit $2"
);

/// One tenant by id.
const ONE: &str = concat!(tenant_columns!(), "where t.id = $1");

/// A row of [`PAGE`] or [`ONE`].
type Row = (Uuid, Vec<String>, Vec<String>);

fn tenant((id, keys, values): Row) -> Result<Tenant, DirectoryError> {
    Ok(Tenant {
        id: tenant_id(id)?,
        entitlements: keys.into_iter().zip(values).collect::<BTreeMap<_, _>>(),
    })
}

#[async_trait]
impl TenantDirectory for PgTenantDirectory {
    /// A `limit` of 0 is treated as 1, so that every page but the last makes progress.
    async fn page(
        &self,
        after: Option<TenantId>,
        limit: u32,
    ) -> Result<TenantPage, DirectoryError> {
        let limit = limit.max(1);
        let rows: Vec<Row> = sqlx::query_as(PAGE)
            .bind(after.map(|a| a.as_uuid()))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| directory_error("read core.tenants", e))?;
        let more = rows.len() > limit as usize;
        let tenants = rows
            .into_iter()
            .take(limit as usize)
            .map(tenant)
            .collect::<Result<Vec<Tenant>, DirectoryError>>()?;
        let next = if more {
            tenants.last().map(|t| t.id)
        } else {
            None
        };
        Ok(TenantPage { tenants, next })
    }

    async fn tenant(&self, id: TenantId) -> Result<Option<Tenant>, DirectoryError> {
        let row: Option<Row> = sqlx::query_as(ONE)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| directory_error("read core.tenants", e))?;
        row.map(tenant).transpose()
    }
}

/// The stored id as a [`TenantId`]; the table's check constraint makes a failure a corrupt
/// row (the constraint dropped or bypassed), which retrying cannot fix.
fn tenant_id(id: Uuid) -> Result<TenantId, DirectoryError> {
    id.hyphenated()
        .to_string()
        .parse()
        .map_err(|e| DirectoryError::Failed {
            message: format!("corrupt row: core.tenants id `{id}`: {e}"),
            source: Some(Box::new(e)),
        })
}

/// `what` failed with `e`, classified as the store classifies its errors.
fn directory_error(what: &str, e: sqlx::Error) -> DirectoryError {
    let message = format!("{what}: {e}");
    let transient = is_transient(&e);
    let source = Some(Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
    if transient {
        DirectoryError::Unavailable { message, source }
    } else {
        DirectoryError::Failed { message, source }
    }
}

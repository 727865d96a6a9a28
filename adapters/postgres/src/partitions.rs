//! Monthly partition pre-creation: the reference handler of `core.partitions_precreate`.

use std::fmt;
use std::time::SystemTime;

use chrono::{DateTime, Datelike, NaiveDate, SecondsFormat, Utc};
use jobs_core::ErrorClass;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

use crate::convert::to_timestamp;
use crate::error::is_transient;

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`); longer ones are silently
/// truncated, which could give two months the same partition name.
const MAX_IDENTIFIER: usize = 63;

/// First key of the two-key advisory lock taken per partitioned table (`jobs` in ASCII), so
/// concurrent pre-creations of one table queue up instead of racing on the catalog.
const LOCK_CLASS: i32 = 0x6a6f_6273;

/// Pre-creates the monthly partitions of a set of tables; a composition root registers it as
/// the handler of `core.partitions_precreate` and calls [`PartitionPrecreation::run`] on the
/// work transaction's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPrecreation {
    tables: Vec<String>,
    months: u32,
}

impl PartitionPrecreation {
    /// Keeps `months` monthly partitions (the current month first) of each of `tables`.
    pub fn new(months: u32, tables: impl IntoIterator<Item = impl Into<String>>) -> Self {
        PartitionPrecreation {
            tables: tables.into_iter().map(Into::into).collect(),
            months,
        }
    }

    /// Runs [`precreate_monthly_partitions`] for every table, in order, stopping at the first
    /// error; returns every partition of every table.
    pub async fn run(
        &self,
        conn: &mut PgConnection,
        now: SystemTime,
    ) -> Result<Vec<MonthlyPartition>, PartitionError> {
        let mut all = vec![];
        for table in &self.tables {
            all.extend(precreate_monthly_partitions(conn, table, self.months, now).await?);
        }
        Ok(all)
    }
}

/// One monthly partition, created now or found already there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonthlyPartition {
    /// Its schema (the parent's).
    pub schema: String,
    /// Its name: `<parent>_pYYYY_MM`.
    pub name: String,
    /// Its lower bound, inclusive: the first instant of the month, UTC.
    pub from: SystemTime,
    /// Its upper bound, exclusive: the first instant of the next month, UTC.
    pub to: SystemTime,
    /// Whether this call created it.
    pub created: bool,
}

/// Creates the partitions of `table` for the `months` months starting with the one that
/// contains `now` (UTC), those that do not exist yet; idempotent.
///
/// `table` is written as in SQL and resolved on the connection's `search_path`
/// (`events`, `billing.events`, `"Events"`). It must be partitioned by range on a single
/// `timestamptz` column. Partitions are named `<table>_pYYYY_MM` in the table's schema and
/// created with `create table if not exists … partition of … for values from (…) to (…)`,
/// every identifier quoted by PostgreSQL's own `format('%I')`.
///
/// Runs in a transaction of its own, or in a savepoint when `conn` is already in one (a work
/// transaction): on error nothing is created and the outer transaction stays usable. It takes
/// a transaction-scoped advisory lock on the table, so concurrent runs wait for each other
/// rather than race. A month already covered by a partition of another name makes
/// PostgreSQL refuse the overlapping one: the error says which.
///
/// ```no_run
/// use jobs_adapter_postgres::{PgWorkTx, precreate_monthly_partitions};
/// use std::time::SystemTime;
///
/// # async fn handle(tx: &mut PgWorkTx) -> Result<(), Box<dyn std::error::Error>> {
/// let partitions = precreate_monthly_partitions(tx.conn(), "billing.events", 3, SystemTime::now()).await?;
/// assert_eq!(partitions.len(), 3);
/// # Ok(())
/// # }
/// ```
pub async fn precreate_monthly_partitions(
    conn: &mut PgConnection,
    table: &str,
    months: u32,
    now: SystemTime,
) -> Result<Vec<MonthlyPartition>, PartitionError> {
    let now = to_timestamp(now).map_err(|_| PartitionError::OutOfRange { now })?;
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| PartitionError::database("begin", e))?;
    let parent = resolve(&mut tx, table).await?;
    sqlx::query("select pg_advisory_xact_lock($1, $2::int8::oid::int4)")
        .bind(LOCK_CLASS)
        .bind(parent.oid)
        .execute(&mut *tx)
        .await
        .map_err(|e| PartitionError::database("lock the table", e))?;

    let mut partitions = vec![];
    for i in 0..months {
        let (from, to) = month_bounds(now, i).ok_or(PartitionError::OutOfRange {
            now: SystemTime::from(now),
        })?;
        let name = format!("{}_p{:04}_{:02}", parent.name, from.year(), from.month());
        if name.len() > MAX_IDENTIFIER {
            return Err(PartitionError::NameTooLong { name });
        }
        let existing: Option<(Option<bool>,)> = sqlx::query_as(
            "select bool_or(i.inhparent = $3::int8::oid) \
             from pg_class c left join pg_inherits i on i.inhrelid = c.oid \
             where c.relnamespace = $1::int8::oid and c.relname = $2 \
             group by c.oid",
        )
        .bind(parent.namespace)
        .bind(&name)
        .bind(parent.oid)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| PartitionError::database("look up existing partitions", e))?;
        let created = match existing {
            Some((Some(true),)) => false,
            Some(_) => {
                return Err(PartitionError::NameTaken {
                    name: qualified(&parent.schema, &name),
                    table: parent.qualified(),
                });
            }
            None => {
                let ddl: String = sqlx::query_scalar(
                    "select format('create table if not exists %I.%I partition of %I.%I \
                     for values from (%L) to (%L)', $1, $2, $1, $3, $4, $5)",
                )
                .bind(&parent.schema)
                .bind(&name)
                .bind(&parent.name)
                .bind(from.to_rfc3339_opts(SecondsFormat::Secs, true))
                .bind(to.to_rfc3339_opts(SecondsFormat::Secs, true))
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| PartitionError::database("quote the partition's DDL", e))?;
                // Quoted by the server's `format()` (%I, %L) just above.
                (&mut *tx).execute(AssertSqlSafe(ddl)).await.map_err(|e| {
                    PartitionError::database(
                        &format!("create partition {}", qualified(&parent.schema, &name)),
                        e,
                    )
                })?;
                true
            }
        };
        partitions.push(MonthlyPartition {
            schema: parent.schema.clone(),
            name,
            from: SystemTime::from(from),
            to: SystemTime::from(to),
            created,
        });
    }
    tx.commit()
        .await
        .map_err(|e| PartitionError::database("commit", e))?;
    Ok(partitions)
}

/// The first instants of the month `offset` months after `now`'s and of the one after it.
fn month_bounds(now: DateTime<Utc>, offset: u32) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let first = |index: i64| {
        let year = i32::try_from(index.div_euclid(12)).ok()?;
        let month = u32::try_from(index.rem_euclid(12)).ok()? + 1;
        Some(
            NaiveDate::from_ymd_opt(year, month, 1)?
                .and_hms_opt(0, 0, 0)?
                .and_utc(),
        )
    };
    let index = i64::from(now.year()) * 12 + i64::from(now.month0()) + i64::from(offset);
    Some((first(index)?, first(index + 1)?))
}

/// The partitioned table, as the catalog names it.
struct Parent {
    oid: i64,
    namespace: i64,
    schema: String,
    name: String,
}

impl Parent {
    fn qualified(&self) -> String {
        qualified(&self.schema, &self.name)
    }
}

/// `schema.name`, for messages.
fn qualified(schema: &str, name: &str) -> String {
    format!("{schema}.{name}")
}

/// Finds `table` and checks it is range-partitioned on one `timestamptz` column.
async fn resolve(conn: &mut PgConnection, table: &str) -> Result<Parent, PartitionError> {
    type Row = (
        i64,
        i64,
        String,
        String,
        String,
        Option<String>,
        Option<i16>,
        Option<String>,
        Option<bool>,
    );
    let row: Option<Row> = sqlx::query_as(
        "select c.oid::int8, n.oid::int8, n.nspname::text, c.relname::text, c.relkind::text, \
                pt.partstrat::text, pt.partnatts, \
                case when pt.partrelid is null then null \
                     when pt.partattrs[0] = 0 then 'an expression' \
                     else format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)) end, \
                a.atttypid = 'timestamptz'::regtype \
         from pg_class c \
         join pg_namespace n on n.oid = c.relnamespace \
         left join pg_partitioned_table pt on pt.partrelid = c.oid \
         left join pg_attribute a on a.attrelid = c.oid and a.attnum = pt.partattrs[0] \
         where c.oid = to_regclass($1)",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| PartitionError::database(&format!("resolve table `{table}`"), e))?;
    let Some((oid, namespace, schema, name, relkind, strategy, columns, key, timestamptz)) = row
    else {
        return Err(PartitionError::NoSuchTable {
            table: table.to_owned(),
        });
    };
    let parent = Parent {
        oid,
        namespace,
        schema,
        name,
    };
    if relkind != "p" {
        return Err(PartitionError::NotPartitioned {
            table: parent.qualified(),
        });
    }
    if strategy.as_deref() != Some("r") || columns != Some(1) || timestamptz != Some(true) {
        let strategy = match strategy.as_deref() {
            Some("r") => "range",
            Some("l") => "list",
            Some("h") => "hash",
            _ => "an unknown strategy",
        };
        let key = match columns {
            Some(1) => key.unwrap_or_else(|| "an unknown key".to_owned()),
            Some(n) => format!("{n} columns"),
            None => "an unknown key".to_owned(),
        };
        return Err(PartitionError::NotRangeByTimestamptz {
            table: parent.qualified(),
            found: format!("by {strategy} on {key}"),
        });
    }
    Ok(parent)
}

/// Why partitions could not be pre-created.
#[derive(Debug)]
#[non_exhaustive]
pub enum PartitionError {
    /// No table of that name on the `search_path`.
    NoSuchTable {
        /// The name as given.
        table: String,
    },
    /// The table exists but is not partitioned (or is not a table).
    NotPartitioned {
        /// The table, schema-qualified.
        table: String,
    },
    /// Partitioned, but not by range on one `timestamptz` column.
    NotRangeByTimestamptz {
        /// The table, schema-qualified.
        table: String,
        /// How it is partitioned, e.g. `by list on region text`.
        found: String,
    },
    /// `<table>_pYYYY_MM` would exceed PostgreSQL's 63-byte identifiers and be truncated.
    NameTooLong {
        /// The name it would have.
        name: String,
    },
    /// A relation with the partition's name exists but is not a partition of the table.
    NameTaken {
        /// The partition's name, schema-qualified.
        name: String,
        /// The table, schema-qualified.
        table: String,
    },
    /// `now` or a month after it is outside the calendar PostgreSQL and chrono share.
    OutOfRange {
        /// The time given.
        now: SystemTime,
    },
    /// A statement failed (including PostgreSQL refusing a partition that overlaps another).
    Database {
        /// What was being done.
        what: String,
        /// The error.
        source: sqlx::Error,
    },
}

impl PartitionError {
    fn database(what: &str, source: sqlx::Error) -> Self {
        PartitionError::Database {
            what: what.to_owned(),
            source,
        }
    }

    /// Whether a later try may succeed: only transient database failures (connection,
    /// deadlock, serialization) may; the others need a change of schema or configuration.
    pub fn class(&self) -> ErrorClass {
        match self {
            PartitionError::Database { source, .. } if is_transient(source) => {
                ErrorClass::Retryable
            }
            _ => ErrorClass::Permanent,
        }
    }
}

impl fmt::Display for PartitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionError::NoSuchTable { table } => {
                write!(f, "no table `{table}` on the search_path")
            }
            PartitionError::NotPartitioned { table } => write!(
                f,
                "`{table}` is not a partitioned table; monthly partitions need \
                 `partition by range (<timestamptz column>)`"
            ),
            PartitionError::NotRangeByTimestamptz { table, found } => write!(
                f,
                "`{table}` is partitioned {found}; monthly partitions need \
                 `partition by range (<timestamptz column>)`"
            ),
            PartitionError::NameTooLong { name } => write!(
                f,
                "partition name `{name}` is longer than PostgreSQL's {MAX_IDENTIFIER} bytes \
                 and would be truncated"
            ),
            PartitionError::NameTaken { name, table } => {
                write!(f, "`{name}` exists but is not a partition of `{table}`")
            }
            PartitionError::OutOfRange { now } => {
                write!(f, "{now:?} is out of range for monthly partitions")
            }
            PartitionError::Database { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for PartitionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PartitionError::Database { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_roll_over_the_year() {
        let now = DateTime::from_timestamp(1_796_000_000, 0).expect("in range"); // 2026-11-30
        let (from, to) = month_bounds(now, 0).expect("in range");
        assert_eq!(from.to_rfc3339(), "2026-11-01T00:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        let (from, to) = month_bounds(now, 2).expect("in range");
        assert_eq!(from.to_rfc3339(), "2027-01-01T00:00:00+00:00");
        assert_eq!(to.to_rfc3339(), "2027-02-01T00:00:00+00:00");
    }

    /// Compiles only if the futures are `Send`, so handlers can run them on spawned tasks (some
    /// sqlx APIs, `raw_sql` among them, make an async fn's future not provably `Send`).
    #[allow(dead_code)]
    fn futures_are_send(conn: &mut PgConnection, handler: &PartitionPrecreation) {
        fn assert_send<T: Send>(_: T) {}
        assert_send(precreate_monthly_partitions(
            conn,
            "t",
            1,
            SystemTime::now(),
        ));
        assert_send(handler.run(conn, SystemTime::now()));
    }
}

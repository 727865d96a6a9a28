//! What every benchmark needs: an async runtime, a count from the environment, and a throwaway
//! PostgreSQL database.

use std::str::FromStr;

use anyhow::{Context, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

/// Runs `work` to completion on a multi-threaded runtime, as a deployment would.
pub(crate) fn block_on(work: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(work)
}

/// The number in the environment variable `var`, or `default` when it is unset.
pub(crate) fn count(var: &str, default: u64) -> Result<u64> {
    std::env::var(var)
        .ok()
        .map(|n| n.parse())
        .transpose()
        .with_context(|| format!("{var} must be a number"))
        .map(|n| n.unwrap_or(default))
}

/// Runs `work` on a fresh database named after `prefix` on the server `DATABASE_URL` names
/// (default the local one), dropping it afterwards whatever `work` returned.
pub(crate) async fn with_database<F, Fut>(prefix: &str, work: F) -> Result<()>
where
    F: FnOnce(PgConnectOptions) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let server = PgConnectOptions::from_str(&url)?.disable_statement_logging();
    let name = format!("{prefix}_{}", std::process::id());
    let mut admin = PgConnection::connect_with(&server)
        .await
        .context("connecting to PostgreSQL")?;
    sqlx::query(&format!("create database \"{name}\""))
        .execute(&mut admin)
        .await?;
    let result = work(server.clone().database(&name)).await;
    sqlx::query(&format!("drop database if exists \"{name}\" with (force)"))
        .execute(&mut admin)
        .await?;
    result
}

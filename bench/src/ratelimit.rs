//! Token acquisition on Redis: `RedisRateLimiter::acquire` over a provider and a tenant bucket
//! against raw `EVALSHA` of a trivial script (`return 1`) on the same kind of connection (one
//! multiplexed connection shared by every caller), at 1, 16 and 64 concurrent callers. The
//! buckets are big enough never to deny, so every acquisition runs the whole script and writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use jobs_adapter_redis::RedisRateLimiter;
use jobs_core::{Acquired, Bucket, BucketKey, RateLimiter, TenantId};
use redis::aio::MultiplexedConnection;

const CONCURRENCY: [usize; 3] = [1, 16, 64];

/// Alternating rounds per concurrency; each side reports its best.
const ROUNDS: usize = 3;

/// Tenants the callers spread over, each with its own bucket next to the provider's.
const TENANTS: usize = 4;

pub(crate) fn run() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> Result<()> {
    let acquisitions: u64 = std::env::var("JOBS_BENCH_ACQUISITIONS")
        .ok()
        .map(|n| n.parse())
        .transpose()
        .context("JOBS_BENCH_ACQUISITIONS must be a number")?
        .unwrap_or(20_000);
    let url = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("jobs-bench:{}", std::process::id());
    let client = redis::Client::open(url.as_str())?;
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis")?;
    let result = compare(&client, &prefix, acquisitions).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut admin)
        .await?;
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(keys)
            .query_async::<()>(&mut admin)
            .await?;
    }
    result
}

async fn compare(client: &redis::Client, prefix: &str, acquisitions: u64) -> Result<()> {
    println!(
        "token acquisition on Redis, {acquisitions} per run, provider + tenant bucket, \
         one multiplexed connection"
    );
    println!(
        "{:>11}  {:>18}  {:>18}  {:>6}",
        "concurrency", "raw EVALSHA/s", "acquisitions/s", "ratio"
    );
    let trivial = redis::Script::new("return 1");
    for concurrency in CONCURRENCY {
        let connection = client.get_multiplexed_async_connection().await?;
        let limiter = Arc::new(RedisRateLimiter::from_client(client.clone(), prefix));
        // Warm the script caches and the connections before either side is timed, then
        // alternate the two, keeping each one's best round: the machine is shared and noisy.
        raw(&connection, &trivial, concurrency, acquisitions / 10).await?;
        limited(&limiter, concurrency, acquisitions / 10).await?;
        let (mut baseline, mut measured) = (0f64, 0f64);
        for _ in 0..ROUNDS {
            baseline = baseline.max(raw(&connection, &trivial, concurrency, acquisitions).await?);
            measured = measured.max(limited(&limiter, concurrency, acquisitions).await?);
        }
        println!(
            "{concurrency:>11}  {baseline:>18.0}  {measured:>18.0}  {:>6.2}",
            measured / baseline
        );
    }
    Ok(())
}

/// The baseline: `concurrency` tasks sending `EVALSHA` of `return 1` on one shared connection.
async fn raw(
    connection: &MultiplexedConnection,
    script: &redis::Script,
    concurrency: usize,
    total: u64,
) -> Result<f64> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (mut connection, script, next) = (connection.clone(), script.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let one: i64 = script.invoke_async(&mut connection).await?;
                    anyhow::ensure!(one == 1, "the trivial script returned {one}");
                }
                Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// The limiter: `concurrency` tasks acquiring one token from the provider and a tenant bucket.
async fn limited(limiter: &Arc<RedisRateLimiter>, concurrency: usize, total: u64) -> Result<f64> {
    // A billion tokens, refilled every millisecond: never denies.
    let huge = Bucket::new(1_000_000_000, 1_000_000_000, Duration::from_millis(1))?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tenants: Vec<TenantId> = (0..TENANTS)
        .map(|n| format!("0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d9{n}").parse())
        .collect::<Result<_, _>>()?;
    let tasks: Vec<_> = (0..concurrency)
        .map(|n| {
            let (limiter, next) = (limiter.clone(), next.clone());
            let tenant = tenants[n % TENANTS];
            let buckets = [
                (BucketKey::provider("bench"), huge),
                (BucketKey::tenant(tenant, "bench"), huge),
            ];
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let got = limiter.acquire(&buckets, 1).await?;
                    anyhow::ensure!(got == Acquired::Granted, "a huge bucket denied: {got:?}");
                }
                Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

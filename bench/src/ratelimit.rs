//! Token acquisition on Redis: `RedisRateLimiter::acquire` over a provider and a tenant bucket
//! against raw `EVALSHA` of a trivial script (`return 1`) on the same kind of connection (one
//! multiplexed connection shared by every caller), at 1, 16 and 64 concurrent callers. The
//! buckets are big enough never to deny, so every acquisition is decided by the whole script
//! and writes. The baseline sends one `EVALSHA` per call; the limiter coalesces the
//! acquisitions of concurrent callers into shared script calls (ADR 0007), which is what a
//! worker with many sends in flight gets. Each side is one client object shared by every
//! caller, made before the timing, and warmed (connection open, script cached) before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use anyhow::{Context, Result};
use jobs_adapter_redis::{DEFAULT_TIMEOUT, RedisRateLimiter, SCRIPT};
use jobs_core::{Acquired, Bucket, BucketKey, RateLimiter, TenantId};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};

/// The caller counts measured unless `JOBS_BENCH_CALLERS` lists others (`16` or `1,64`).
const CONCURRENCY: [usize; 3] = [1, 16, 64];

/// Alternating rounds per concurrency; each side reports its best.
const ROUNDS: usize = 3;

/// Tenants the callers spread over, each with its own bucket next to the provider's.
const TENANTS: usize = 4;

pub(crate) fn run() -> Result<()> {
    support::block_on(bench())
}

async fn bench() -> Result<()> {
    let acquisitions: u64 = support::count("JOBS_BENCH_ACQUISITIONS", 20_000)?;
    let callers = match std::env::var("JOBS_BENCH_CALLERS") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().ok().filter(|&n| n > 0))
            .collect::<Option<Vec<usize>>>()
            .with_context(|| format!("JOBS_BENCH_CALLERS must list positive counts: {list}"))?,
        Err(_) => CONCURRENCY.to_vec(),
    };
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
    let result = compare(&client, &prefix, acquisitions, &callers).await;
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

async fn compare(
    client: &redis::Client,
    prefix: &str,
    acquisitions: u64,
    callers: &[usize],
) -> Result<()> {
    println!(
        "token acquisition on Redis, {acquisitions} per run, provider + tenant bucket; both sides \
         on one multiplexed connection managed as the limiter's (reconnection, {}s timeouts)",
        DEFAULT_TIMEOUT.as_secs()
    );
    println!(
        "{:>11}  {:>18}  {:>18}  {:>6}   {:>18}  {:>20}",
        "concurrency",
        "raw EVALSHA/s",
        "acquisitions/s",
        "ratio",
        "(unmanaged raw/s)",
        "(uncoalesced script/s)"
    );
    let trivial = Call {
        script: redis::Script::new("return 1"),
        keys: vec![],
        args: vec![],
    };
    // The limiter's own script for one acquisition per call, as the limiter sent it before
    // coalescing: where the time goes.
    let bucket_args = |tenant: &str| Call {
        script: redis::Script::new(SCRIPT),
        keys: vec![
            format!("{prefix}:provider:raw"),
            format!("{prefix}:tenant:{tenant}:raw"),
        ],
        args: ["acquire", "\u{1}"]
            .into_iter()
            .chain(["1000000000", "1000000000", "1"].repeat(2))
            .chain(["1", "2", "1", "2"])
            .map(str::to_owned)
            .collect(),
    };
    let uncoalesced = bucket_args("0");
    for &concurrency in callers {
        let managed = ConnectionManager::new_with_config(client.clone(), limiter_config()).await?;
        let unmanaged = client.get_multiplexed_async_connection().await?;
        let limiter = Arc::new(RedisRateLimiter::from_client(client.clone(), prefix));
        // Warm the script caches and the connections before any side is timed, then alternate
        // the sides, keeping each one's best round: the machine is shared and noisy.
        raw(&managed, &trivial, concurrency, acquisitions / 10).await?;
        raw(&unmanaged, &trivial, concurrency, acquisitions / 10).await?;
        raw(&managed, &uncoalesced, concurrency, acquisitions / 10).await?;
        limited(&limiter, concurrency, acquisitions / 10).await?;
        let mut best = [0f64; 4];
        for _ in 0..ROUNDS {
            best[0] = best[0].max(raw(&managed, &trivial, concurrency, acquisitions).await?);
            best[1] = best[1].max(limited(&limiter, concurrency, acquisitions).await?);
            best[2] = best[2].max(raw(&unmanaged, &trivial, concurrency, acquisitions).await?);
            best[3] = best[3].max(raw(&managed, &uncoalesced, concurrency, acquisitions).await?);
        }
        let [baseline, measured, unmanaged, uncoalesced] = best;
        println!(
            "{concurrency:>11}  {baseline:>18.0}  {measured:>18.0}  {:>6.2}   {unmanaged:>18.0}  \
             {uncoalesced:>20.0}",
            measured / baseline
        );
        support::rate_row(
            "ratelimit",
            "acquire",
            "limiter",
            concurrency,
            measured,
            baseline,
        );
    }
    Ok(())
}

/// The connection settings of `RedisRateLimiter`, so that the baseline pays what it pays.
fn limiter_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(DEFAULT_TIMEOUT))
        .set_response_timeout(Some(DEFAULT_TIMEOUT))
        .set_number_of_retries(0)
}

/// A script call sent as is, every time.
struct Call {
    script: redis::Script,
    keys: Vec<String>,
    args: Vec<String>,
}

/// `concurrency` tasks sending `call` with `EVALSHA` on one shared connection: the baseline
/// (`return 1`), and the breakdown columns.
async fn raw<C>(connection: &C, call: &Call, concurrency: usize, total: u64) -> Result<f64>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (mut connection, next) = (connection.clone(), next.clone());
            let (script, keys, args) = (call.script.clone(), call.keys.clone(), call.args.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let mut invocation = script.prepare_invoke();
                    for key in &keys {
                        invocation.key(key);
                    }
                    for arg in &args {
                        invocation.arg(arg);
                    }
                    let reply: redis::Value = invocation.invoke_async(&mut connection).await?;
                    anyhow::ensure!(
                        !matches!(reply, redis::Value::ServerError(_)),
                        "the script failed: {reply:?}"
                    );
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

//! The Redis rate limiter against a real Redis (`REDIS_URL`, default `redis://127.0.0.1:6379`):
//! the rate contract, a rate bound under concurrent callers, fairness between tenants, TTLs,
//! prefixes, and what happens when Redis is away.
//!
//! Every test writes under its own key prefix and deletes its keys at the end, pass or fail.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use jobs_adapter_redis::RedisRateLimiter;
use jobs_adapter_redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use jobs_core::{Acquired, Bucket, BucketKey, ErrorClass, RateLimitError, RateLimiter, TenantId};
use jobs_testkit::TimeTravel;
use jobs_testkit::contract::rate;
use jobs_testkit::fixtures;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

mod common;

use common::{unique_prefix, url};

async fn admin() -> MultiplexedConnection {
    redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at {} is unreachable: {e}", url()))
}

/// Every key under `prefix`.
async fn keys_under(prefix: &str) -> Vec<String> {
    let mut conn = admin().await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            keys.sort();
            return keys;
        }
        cursor = next;
    }
}

/// Runs `body` with a fresh prefix, then deletes every key under it, whether `body` passed or
/// panicked.
async fn with_prefix<F, Fut>(test: &str, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let prefix = unique_prefix(test);
    let outcome = tokio::spawn(body(prefix.clone())).await;
    let keys = keys_under(&prefix).await;
    if !keys.is_empty() {
        let _: () = admin().await.del(keys).await.unwrap();
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

fn limiter(prefix: &str) -> RedisRateLimiter {
    RedisRateLimiter::new(url(), prefix).unwrap()
}

/// Redis keeps its own time: time passes by sleeping, a little longer than asked so that the
/// server's clock, read later, is past the target too.
struct RealTime;

#[async_trait]
impl TimeTravel for RealTime {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by + Duration::from_millis(5)).await;
    }
}

fn bucket(capacity: u32, refill: u32, interval_ms: u64) -> Bucket {
    Bucket::new(capacity, refill, Duration::from_millis(interval_ms)).unwrap()
}

/// Sleeps until `at`, or until `deadline` if that comes first.
async fn sleep_until(at: SystemTime, deadline: Instant) {
    let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::sleep(wait.min(left)).await;
}

#[tokio::test]
async fn redis_rate_limiter_passes_the_rate_contract() {
    with_prefix("contract", |root| async move {
        let made = AtomicU32::new(0);
        rate::run(|| {
            let prefix = format!("{root}:{}", made.fetch_add(1, Ordering::Relaxed));
            async move { (limiter(&prefix), Arc::new(RealTime) as Arc<dyn TimeTravel>) }
        })
        .await;
    })
    .await;
}

/// 16 callers, each on its own connection, never get more grants from one provider bucket than
/// its burst plus its rate times the time elapsed, at every grant of a 10 s run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_never_exceed_the_provider_rate() {
    with_prefix("concurrent", |prefix| async move {
        const CALLERS: usize = 16;
        const WINDOW: Duration = Duration::from_secs(10);
        // 50 tokens per second, in refills of 5 every 100 ms, with a burst of 10.
        let provider = (BucketKey::provider("resend"), bucket(10, 5, 100));
        let burst = f64::from(provider.1.capacity());
        let rate = f64::from(provider.1.refill()) / provider.1.interval().as_secs_f64();

        let limiters: Vec<RedisRateLimiter> = (0..CALLERS).map(|_| limiter(&prefix)).collect();
        let grants = Arc::new(Mutex::new(Vec::<Instant>::new()));
        // Every grant's server time is after `start` (no call was sent before it) and before
        // the instant its reply was read, recorded below.
        let start = Instant::now();
        let deadline = start + WINDOW;
        let callers: Vec<_> = limiters
            .into_iter()
            .map(|limiter| {
                let (provider, grants) = (provider.clone(), grants.clone());
                tokio::spawn(async move {
                    let buckets = [provider];
                    while Instant::now() < deadline {
                        match limiter.acquire(&buckets, 1).await.unwrap() {
                            Acquired::Granted => grants.lock().unwrap().push(Instant::now()),
                            Acquired::Denied { retry_at } => sleep_until(retry_at, deadline).await,
                        }
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.unwrap();
        }
        let mut grants = grants.lock().unwrap().clone();
        grants.sort();
        for (n, at) in grants.iter().enumerate() {
            let elapsed = at.duration_since(start).as_secs_f64();
            let bound = burst + rate * elapsed;
            assert!(
                (n + 1) as f64 <= bound,
                "{} grants by {elapsed:.3} s, above the burst plus the rate: {bound:.1}",
                n + 1
            );
        }
        assert!(
            grants.len() > provider.1.capacity() as usize,
            "only {} grants in {WINDOW:?}: tokens never came back",
            grants.len()
        );
    })
    .await;
}

/// Tenant A hammers its own bucket; tenant B, with the same provider, still gets every token of
/// its own bucket, because A's denied calls take nothing from the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_cannot_starve_another() {
    with_prefix("noisy", |prefix| async move {
        const WINDOW: Duration = Duration::from_millis(1200);
        // The provider refills 100 tokens/s; each tenant 25/s, and a tenant's bucket takes
        // 800 ms to fill up, so that B keeps what refilled even when it is scheduled late. The
        // provider cannot run dry while both tenants stay within their buckets.
        let provider = (BucketKey::provider("resend"), bucket(50, 10, 100));
        let tenant_bucket = bucket(20, 5, 200);
        let tenant = |t: TenantId| (BucketKey::tenant(t, "resend"), tenant_bucket);
        let a = [provider.clone(), tenant(fixtures::tenant(1))];
        let b = [provider, tenant(fixtures::tenant(2))];

        let start = Instant::now();
        let deadline = start + WINDOW;
        let noisy: Vec<_> = (0..4)
            .map(|_| {
                let (limiter, a) = (limiter(&prefix), a.clone());
                tokio::spawn(async move {
                    let (mut granted, mut denied) = (0u32, 0u32);
                    while Instant::now() < deadline {
                        match limiter.acquire(&a, 1).await.unwrap() {
                            Acquired::Granted => granted += 1,
                            Acquired::Denied { .. } => denied += 1,
                        }
                    }
                    (granted, denied)
                })
            })
            .collect();

        let quiet = limiter(&prefix);
        let mut b_granted = 0u32;
        // Takes every token B's bucket has, until a denial.
        let take_all = async |granted: &mut u32| {
            while quiet.acquire(&b, 1).await.unwrap() == Acquired::Granted {
                *granted += 1;
            }
        };
        take_all(&mut b_granted).await;
        let first_reply = Instant::now();
        let mut last_round;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            last_round = Instant::now();
            take_all(&mut b_granted).await;
            if last_round >= deadline {
                break;
            }
        }

        let (mut a_granted, mut a_denied) = (0, 0);
        for task in noisy {
            let (granted, denied) = task.await.unwrap();
            a_granted += granted;
            a_denied += denied;
        }
        assert!(a_denied > 0, "tenant A never reached its limit");
        let elapsed = start.elapsed().as_secs_f64();
        let a_bound = 20.0 + 25.0 * elapsed;
        assert!(
            f64::from(a_granted) <= a_bound,
            "tenant A got {a_granted}, above its own bucket's {a_bound:.1}"
        );
        // B's bucket was created by its first call, before `first_reply`, and its last call was
        // sent after `last_round`: it refilled at least once per whole interval in between
        // (less a few ms for the two clocks' readings).
        let between = last_round
            .duration_since(first_reply)
            .saturating_sub(Duration::from_millis(5));
        let refills = (between.as_millis() / 200) as u32;
        let b_bound = 20 + 5 * refills;
        assert!(
            b_granted >= b_bound,
            "tenant B got {b_granted} of the {b_bound} tokens its bucket refilled while A hammered"
        );
    })
    .await;
}

/// The tokens `bucket` holds now, taken one at a time until it denies (a bucket that does not
/// refill within the test).
async fn tokens_left(limiter: &RedisRateLimiter, bucket: &(BucketKey, Bucket)) -> usize {
    let mut left = 0;
    while limiter
        .acquire(std::slice::from_ref(bucket), 1)
        .await
        .unwrap()
        == Acquired::Granted
    {
        left += 1;
    }
    left
}

/// Many callers of one limiter, whose acquisitions coalesce into shared script calls: each is
/// still decided all or none, so the provider hands out exactly its tokens, the small tenant no
/// more than its own, and a denied acquisition burns nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_acquisitions_are_each_all_or_none() {
    with_prefix("coalesced", |prefix| async move {
        const CALLS: usize = 200;
        // No refill within the test: an hour per token.
        let provider = (BucketKey::provider("resend"), bucket(30, 1, 3_600_000));
        let small = (
            BucketKey::tenant(fixtures::tenant(1), "resend"),
            bucket(5, 1, 3_600_000),
        );
        let large = (
            BucketKey::tenant(fixtures::tenant(2), "resend"),
            bucket(1_000, 1, 3_600_000),
        );
        let limiter = Arc::new(limiter(&prefix));
        let calls: Vec<_> = (0..CALLS)
            .map(|n| {
                let tenant = if n % 2 == 0 {
                    small.clone()
                } else {
                    large.clone()
                };
                let (limiter, provider) = (limiter.clone(), provider.clone());
                tokio::spawn(async move {
                    let got = limiter.acquire(&[provider, tenant], 1).await.unwrap();
                    (n % 2 == 0, got)
                })
            })
            .collect();
        let (mut small_granted, mut granted) = (0, 0);
        for call in calls {
            let (is_small, got) = call.await.unwrap();
            match got {
                Acquired::Granted => {
                    granted += 1;
                    small_granted += usize::from(is_small);
                }
                Acquired::Denied { retry_at } => assert!(retry_at > SystemTime::now()),
            }
        }
        assert_eq!(granted, 30, "the provider's 30 tokens, no more, no fewer");
        assert!(
            small_granted <= 5,
            "the small tenant got {small_granted} of its 5"
        );
        // What the small tenant did not get is still in its bucket: denials burned nothing.
        assert_eq!(tokens_left(&limiter, &small).await, 5 - small_granted);
        assert!(matches!(
            limiter.acquire(&[provider], 1).await.unwrap(),
            Acquired::Denied { .. }
        ));
    })
    .await;
}

/// A coalesced call carries acquisitions of different costs and bucket sets (the script names
/// each distinct one once): every one is still charged its own cost from its own buckets, and a
/// bucket ends holding exactly what it had minus what its granted acquisitions cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_acquisitions_of_different_costs_charge_their_own() {
    with_prefix("mixed", |prefix| async move {
        const CALLS: usize = 120;
        let hour = 3_600_000;
        let provider = (BucketKey::provider("resend"), bucket(100, 1, hour));
        let tenants: Vec<_> = (0..3)
            .map(|n| {
                let key = BucketKey::tenant(fixtures::tenant(n), "resend");
                (key, bucket(20 + 10 * n, 1, hour))
            })
            .collect();
        let limiter = Arc::new(limiter(&prefix));
        let calls: Vec<_> = (0..CALLS)
            .map(|n| {
                let tenant = tenants[n % 3].clone();
                // Costs 1, 2 and 3, and the tenant's bucket alone, before or after the
                // provider's: six distinct requests.
                let cost = 1 + (n / 3 % 3) as u32;
                let buckets = match n % 4 {
                    0 => vec![tenant],
                    1 => vec![tenant, provider.clone()],
                    _ => vec![provider.clone(), tenant],
                };
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let got = limiter.acquire(&buckets, cost).await.unwrap();
                    (n, cost, buckets.len() == 2, got)
                })
            })
            .collect();
        let mut spent_provider = 0;
        let mut spent_tenant = [0u32; 3];
        for call in calls {
            let (n, cost, with_provider, got) = call.await.unwrap();
            if got == Acquired::Granted {
                spent_tenant[n % 3] += cost;
                spent_provider += if with_provider { cost } else { 0 };
            }
        }
        assert!(spent_provider <= 100);
        // What is left in each bucket is what the granted acquisitions did not take.
        assert_eq!(
            tokens_left(&limiter, &provider).await,
            (100 - spent_provider) as usize
        );
        for (n, tenant) in tenants.iter().enumerate() {
            assert_eq!(
                tokens_left(&limiter, tenant).await,
                (tenant.1.capacity() - spent_tenant[n]) as usize,
                "tenant {n}"
            );
        }
    })
    .await;
}

/// Callers that give up mid-call (their future dropped, as a worker shutting down does) leave
/// the limiter working: the acquisitions queued behind them are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_acquisitions_do_not_stall_the_others() {
    with_prefix("abandoned", |prefix| async move {
        let limiter = Arc::new(limiter(&prefix));
        let provider = (BucketKey::provider("resend"), bucket(1_000, 1_000, 1_000));
        for _ in 0..5 {
            let calls: Vec<_> = (0..40)
                .map(|_| {
                    let (limiter, provider) = (limiter.clone(), provider.clone());
                    tokio::spawn(async move { limiter.acquire(&[provider], 1).await })
                })
                .collect();
            for (n, call) in calls.iter().enumerate() {
                if n % 3 == 0 {
                    call.abort();
                }
            }
            for call in calls {
                match call.await {
                    Ok(answer) => assert!(answer.is_ok(), "{answer:?}"),
                    Err(e) => assert!(e.is_cancelled()),
                }
            }
        }
        // A deadlock guard, not a timing assertion: a stalled queue never answers.
        let last = tokio::time::timeout(
            Duration::from_secs(30),
            limiter.acquire(std::slice::from_ref(&provider), 1),
        )
        .await
        .expect("the limiter still answers");
        assert!(last.is_ok());
    })
    .await;
}

#[tokio::test]
async fn buckets_expire_when_full_again() {
    with_prefix("ttl", |prefix| async move {
        let limiter = limiter(&prefix);
        let mut conn = admin().await;

        let charged = BucketKey::provider("charged");
        let slow = bucket(10, 1, 1000);
        let got = limiter.acquire(&[(charged.clone(), slow)], 3).await;
        assert_eq!(got.unwrap(), Acquired::Granted);
        let ttl: i64 = conn.pttl(limiter.redis_key(&charged)).await.unwrap();
        assert!(
            ttl > 0 && ttl <= 3000,
            "3 tokens at 1/s come back within 3 s: PTTL {ttl}"
        );

        let drained = BucketKey::provider("drained");
        let until = SystemTime::now() + Duration::from_secs(5);
        limiter
            .drain_until(&drained, bucket(4, 2, 1000), until)
            .await
            .unwrap();
        let ttl: i64 = conn.pttl(limiter.redis_key(&drained)).await.unwrap();
        // Empty until `until`, then 2 tokens per second: full 1 s after `until`.
        assert!(
            ttl > 4000 && ttl <= 6001,
            "a bucket drained for 5 s with 1 s more to refill: PTTL {ttl}"
        );

        let quick = BucketKey::provider("quick");
        let got = limiter
            .acquire(&[(quick.clone(), bucket(2, 2, 100))], 1)
            .await;
        assert_eq!(got.unwrap(), Acquired::Granted);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let exists: bool = conn.exists(limiter.redis_key(&quick)).await.unwrap();
        assert!(!exists, "a bucket full again is still stored");
    })
    .await;
}

#[tokio::test]
async fn prefixes_isolate_limiters() {
    with_prefix("prefix", |prefix| async move {
        let (one, two) = (format!("{prefix}:one"), format!("{prefix}:two"));
        let (first, second) = (limiter(&one), limiter(&two));
        let key = [(BucketKey::provider("resend"), bucket(1, 1, 3_600_000))];
        assert_eq!(first.acquire(&key, 1).await.unwrap(), Acquired::Granted);
        assert!(matches!(
            first.acquire(&key, 1).await.unwrap(),
            Acquired::Denied { .. }
        ));
        assert_eq!(
            second.acquire(&key, 1).await.unwrap(),
            Acquired::Granted,
            "another prefix has its own buckets"
        );
        assert_eq!(keys_under(&one).await, [format!("{one}:provider:resend")]);
        assert_eq!(first.redis_key(&key[0].0), format!("{one}:provider:resend"));
    })
    .await;
}

fn assert_unavailable<T: std::fmt::Debug>(what: &str, got: Result<T, RateLimitError>) {
    match got {
        Err(e @ RateLimitError::Unavailable { .. }) => {
            assert_eq!(e.class(), ErrorClass::Retryable, "{what}");
        }
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_unavailable() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let limiter =
        RedisRateLimiter::new(format!("redis://{closed}"), "x").expect("built while Redis is down");
    let key = (BucketKey::provider("resend"), bucket(5, 5, 1000));
    for _ in 0..2 {
        assert_unavailable(
            "acquire",
            limiter.acquire(std::slice::from_ref(&key), 1).await,
        );
    }
    assert_unavailable(
        "drain_until",
        limiter.drain_until(&key.0, key.1, SystemTime::now()).await,
    );
    assert!(RedisRateLimiter::new("http://127.0.0.1:6379", "x").is_err());
}

/// A TCP proxy to Redis whose connections can be cut, as a failover or a network blip would.
struct Proxy {
    addr: std::net::SocketAddr,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    async fn start() -> Proxy {
        let target = {
            let info = redis::Client::open(url()).unwrap();
            info.get_connection_info().addr().to_string()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(Mutex::new(Vec::<AbortHandle>::new()));
        let accepted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                accepted.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy { addr, connections }
    }

    fn cut(&self) {
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

#[tokio::test]
async fn reconnects_after_the_connection_drops() {
    with_prefix("reconnect", |prefix| async move {
        let proxy = Proxy::start().await;
        let limiter = RedisRateLimiter::new(format!("redis://{}", proxy.addr), prefix).unwrap();
        let key = [(BucketKey::provider("resend"), bucket(3, 1, 3_600_000))];
        assert_eq!(limiter.acquire(&key, 1).await.unwrap(), Acquired::Granted);
        proxy.cut();
        // The call that finds the connection gone may fail; a later one reconnects.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match limiter.acquire(&key, 1).await {
                Ok(got) => {
                    assert_eq!(got, Acquired::Granted);
                    break;
                }
                Err(e) => {
                    assert_unavailable("after the cut", Err::<(), _>(e));
                    assert!(attempts < 50, "never reconnected");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        // The bucket survived the reconnection: one token of three is left.
        assert_eq!(limiter.acquire(&key, 1).await.unwrap(), Acquired::Granted);
        assert!(matches!(
            limiter.acquire(&key, 1).await.unwrap(),
            Acquired::Denied { .. }
        ));
    })
    .await;
}

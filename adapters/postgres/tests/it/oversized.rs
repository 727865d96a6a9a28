//! Rows of `core.jobs` over the envelope limit, written by direct SQL: the fetch leases them
//! without reading their payload and moves them to `core.dead_letters` with their bytes, on the
//! oldest-first fetch and the fair one alike; what is within the limit is delivered whole.

use std::time::Duration;

use jobs_adapter_postgres::{PgQueue, sqlx};
use jobs_core::{
    DecodeLimits, Envelope, PublishOptions, PullPort, QueueError, QueueName, QueuePort, SettlePort,
    TenantFairness,
};
use jobs_testkit::fixtures;
use sqlx::PgPool;

use crate::db::with_databases;

/// A small limit, so that rows over it are cheap to write.
const LIMIT: usize = 4_096;

fn queue() -> QueueName {
    "limits.jobs".parse().expect("valid")
}

/// Writes `n` rows of `bytes` distinct bytes each (no two alike) into `core.jobs` by SQL, as a
/// version without the publish check would, and keeps a copy of each in `originals`.
async fn write_oversized(pool: &PgPool, n: i32, bytes: i32) {
    sqlx::query(
        "create table if not exists originals (n integer primary key, payload bytea not null)",
    )
    .execute(pool)
    .await
    .expect("create originals");
    sqlx::query(
        "insert into originals select n, \
             substring(decode(repeat(md5(n::text), $2 / 16 + 1), 'hex') from 1 for $2) \
         from generate_series(1, $1) as n",
    )
    .bind(n)
    .bind(bytes)
    .execute(pool)
    .await
    .expect("originals");
    sqlx::query(
        "insert into core.jobs (queue, dedup_key, payload, tenant_id, visible_at, created_at) \
         select $1, 'raw-' || n, payload, $2, now(), now() from originals order by n",
    )
    .bind(queue().as_str())
    .bind(fixtures::tenant(1).as_uuid())
    .execute(pool)
    .await
    .expect("rows over the limit");
}

/// The pending letters whose payload is one of the originals byte for byte, with the tenant
/// the row carried and a reason naming the size and the limit.
async fn faithful_letters(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from core.dead_letters d join originals o on d.payload = o.payload \
         where d.queue = $1 and d.tenant_id = $2 and d.status = 'pending_review' \
           and d.reason = 'too_large' \
           and d.last_error like 'the envelope is ' || octet_length(o.payload) \
               || ' bytes, over the limit of ' || $3 || ' bytes%'",
    )
    .bind(queue().as_str())
    .bind(fixtures::tenant(1).as_uuid())
    .bind(i64::try_from(LIMIT).expect("small"))
    .fetch_one(pool)
    .await
    .expect("count letters")
}

async fn jobs_left(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from core.jobs")
        .fetch_one(pool)
        .await
        .expect("count jobs")
}

/// Receives and acks until nothing is ready; the envelopes received.
async fn drain(pg: &PgQueue) -> Vec<Envelope> {
    let mut got = vec![];
    for _ in 0..100 {
        let batch = pg
            .receive(&queue(), 10, Duration::from_secs(30))
            .await
            .expect("receive");
        if batch.is_empty() {
            return got;
        }
        for delivery in batch {
            got.push(Envelope::decode(&delivery.payload).expect("a delivered payload decodes"));
            pg.ack(&delivery.lease).await.expect("ack");
        }
    }
    panic!("the queue still delivers after 100 batches");
}

async fn rows_over_the_limit_become_letters(fair: bool) {
    with_databases(move |dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let limits = DecodeLimits::default().max_bytes(LIMIT);
        let pg = PgQueue::new(pool.clone()).with_envelope_limits(limits);
        if fair {
            pg.make_fair(&queue(), TenantFairness::round_robin())
                .await
                .expect("fair");
        }
        let jobs: Vec<Envelope> = (0..3).map(|n| fixtures::envelope(1, n)).collect();
        for job in &jobs[..2] {
            pg.publish(&queue(), job, PublishOptions::default())
                .await
                .expect("publish");
        }
        write_oversized(&pool, 24, 64 * 1024).await;
        pg.publish(&queue(), &jobs[2], PublishOptions::default())
            .await
            .expect("publish");

        let got = drain(&pg).await;
        assert_eq!(got, jobs, "every job within the limit, and nothing else");
        assert_eq!(
            faithful_letters(&pool).await,
            24,
            "each row a faithful letter"
        );
        assert_eq!(jobs_left(&pool).await, 0, "no row left leased");
    })
    .await;
}

#[tokio::test]
async fn rows_over_the_limit_become_dead_letters_byte_identical_on_the_oldest_first_fetch() {
    rows_over_the_limit_become_letters(false).await;
}

#[tokio::test]
async fn rows_over_the_limit_become_dead_letters_byte_identical_on_the_fair_fetch() {
    rows_over_the_limit_become_letters(true).await;
}

#[tokio::test]
async fn a_publish_over_the_limit_writes_nothing_and_one_at_it_is_delivered_whole() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let job = fixtures::envelope(1, 1);
        let size = job.to_json_bytes().expect("encodes").len();
        let exact = PgQueue::new(pool.clone())
            .with_envelope_limits(DecodeLimits::default().max_bytes(size));
        let under = PgQueue::new(pool.clone())
            .with_envelope_limits(DecodeLimits::default().max_bytes(size - 1));

        let refused = under.publish(&queue(), &job, PublishOptions::default()).await;
        assert!(
            matches!(refused, Err(QueueError::TooLarge { size: s, limit, .. }) if s == size && limit == size - 1),
            "{refused:?}"
        );
        let batch = [jobs_adapter_postgres::NewJob {
            envelope: job.clone(),
            opts: PublishOptions::default(),
        }];
        let mut tx = pool.begin().await.expect("begin");
        let refused = under.publish_batch_in(&mut tx, &queue(), &batch).await;
        assert!(matches!(refused, Err(QueueError::TooLarge { .. })), "{refused:?}");
        drop(tx);
        assert_eq!(jobs_left(&pool).await, 0, "nothing written");

        exact
            .publish(&queue(), &job, PublishOptions::default())
            .await
            .expect("at the limit");
        assert_eq!(drain(&exact).await, [job], "delivered whole");
        let letters: i64 = sqlx::query_scalar("select count(*) from core.dead_letters")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(letters, 0, "a row at the limit is no letter");
    })
    .await;
}

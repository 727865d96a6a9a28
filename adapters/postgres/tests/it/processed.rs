//! `core.processed_jobs` in slices (ADR 0014): every kind of job id claims once and is
//! recognised again, the cleanup empties the expired slices and keeps what it must, leaves a
//! slice in use to the batches, and the migration moves every claim of the unsliced table.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::with_databases;
use jobs_adapter_postgres::PgStore;
use jobs_core::{
    Claim, ConsumerName, DeadLetterReason, JobId, NewDeadLetter, ProcessedJobs, WorkStore,
    WorkTransaction,
};
use jobs_testkit::fixtures;
use sqlx::types::Uuid;

const DAY: Duration = Duration::from_secs(86_400);

/// The default TTL's cutoff, seen from `now`.
const TTL: Duration = Duration::from_secs(30 * 86_400);

fn consumer(name: &str) -> ConsumerName {
    format!("test.{name}")
        .parse()
        .expect("a valid consumer name")
}

fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis(),
    )
    .expect("within u64")
}

/// The `n`th id minted at `t`.
fn id_at(t: SystemTime, n: u128) -> JobId {
    JobId::from_parts(unix_ms(t), n)
}

/// Claims `job` for `consumer` as processed at `at`, committed.
async fn claim_at(store: &PgStore, job: JobId, consumer: &ConsumerName, at: SystemTime) -> Claim {
    let mut tx = store.begin().await.expect("begin");
    let claim = tx.claim(job, consumer, at).await.expect("claim");
    tx.commit().await.expect("commit");
    claim
}

/// Claims `job` again in a transaction rolled back: what a redelivered copy would be told.
async fn redelivered(store: &PgStore, job: JobId, consumer: &ConsumerName) -> Claim {
    let mut tx = store.begin().await.expect("begin");
    let claim = tx
        .claim(job, consumer, SystemTime::now())
        .await
        .expect("claim");
    tx.rollback().await.expect("rollback");
    claim
}

/// Has every connection of the store's pool send its pending statistics now (a backend sends
/// its row counts at most once a second otherwise), and waits until they count every claim,
/// so that the figure the cleanup reports for an emptied slice, read from them, counts every
/// claim written before. A backend sends them just before it says it is ready for the next
/// query, which a client may not have waited for: hence the wait.
async fn flush_statistics(store: &PgStore) {
    let pool = store.pool();
    let mut held = Vec::new();
    for _ in 0..pool.size() {
        let mut conn = pool.acquire().await.expect("a connection");
        sqlx::query("select pg_stat_force_next_flush()")
            .execute(&mut *conn)
            .await
            .expect("flush the statistics");
        held.push(conn);
    }
    drop(held);
    for _ in 0..200 {
        let (counted, live): (i64, i64) = sqlx::query_as(
            "select (select count(*) from core.processed_jobs), \
                    (select coalesce(sum(pg_stat_get_live_tuples(c.oid)), 0)::bigint \
                     from pg_inherits i join pg_class c on c.oid = i.inhrelid \
                     where i.inhparent = 'core.processed_jobs'::regclass)",
        )
        .fetch_one(pool)
        .await
        .expect("count the claims");
        if counted == live {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the statistics never counted every claim");
}

/// The name of the table of the slice `job` belongs to.
async fn slice_table(store: &PgStore, job: JobId) -> String {
    sqlx::query_scalar(
        "select format('core.processed_jobs_%s', lpad(core.processed_slot($1)::text, 3, '0'))",
    )
    .bind(job.as_uuid())
    .fetch_one(store.pool())
    .await
    .expect("the slice's name")
}

/// The rows of the slice `job` belongs to, and the bytes of its table.
async fn slice_of(store: &PgStore, job: JobId) -> (i64, i64) {
    let table = slice_table(store, job).await;
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select (select count(*) from {table}), pg_relation_size('{table}')"
    )))
    .fetch_one(store.pool())
    .await
    .expect("the slice's size")
}

#[tokio::test]
async fn every_kind_of_id_claims_once_and_is_recognised_after_the_cleanup() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let c = consumer("odd_ids");
        let now = SystemTime::now();
        let ids = [
            ("minted now", id_at(now, 1)),
            ("the epoch", JobId::from_parts(0, 2)),
            (
                "a delayed publish, run a hundred years from now",
                id_at(now + 36_500 * DAY, 3),
            ),
            ("a producer whose clock is a day ahead", id_at(now + DAY, 4)),
            ("a replay under a 60-day-old id", id_at(now - 60 * DAY, 5)),
            (
                "a cron slot's id, on the hour",
                JobId::from_parts(unix_ms(now) / 3_600_000 * 3_600_000, 6),
            ),
            (
                "the last millisecond a UUIDv7 holds",
                JobId::from_parts(0xFFFF_FFFF_FFFF, 7),
            ),
        ];
        for (what, id) in ids {
            assert_eq!(
                claim_at(&store, id, &c, now).await,
                Claim::Claimed,
                "{what}"
            );
        }
        // All were processed now: the cleanup at the default TTL leaves every one.
        let gone = store
            .purge_expired_slices(now - TTL)
            .await
            .expect("empty the expired slices");
        let batches = store
            .purge_processed(now - TTL, 1_000)
            .await
            .expect("purge");
        assert_eq!((gone, batches), (0, 0), "nothing expired");
        for (what, id) in ids {
            assert_eq!(
                redelivered(&store, id, &c).await,
                Claim::AlreadyProcessed,
                "{what}: a redelivered copy"
            );
            assert!(store.is_processed(id, &c).await.expect("read"), "{what}");
        }
        let placed: i64 = sqlx::query_scalar(
            "select count(*) from core.processed_jobs where slot = core.processed_slot(job_id)",
        )
        .fetch_one(store.pool())
        .await
        .expect("count");
        assert_eq!(placed, ids.len() as i64, "each claim in its id's slice");
    })
    .await;
}

#[tokio::test]
async fn the_cleanup_empties_expired_slices_keeping_fresh_and_pending_claims() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let (c, other) = (consumer("sliced"), consumer("sliced.other"));
        let now = SystemTime::now();
        // Three days far enough apart to be three slices, all past the TTL.
        let (day_a, day_b, day_c) = (now - 100 * DAY, now - 90 * DAY, now - 80 * DAY);
        let expired_a: Vec<JobId> = (0..50).map(|n| id_at(day_a, n)).collect();
        let expired_b: Vec<JobId> = (0..50).map(|n| id_at(day_b, n)).collect();
        for &id in &expired_a {
            claim_at(&store, id, &c, day_a + Duration::from_secs(60)).await;
        }
        for &id in &expired_b {
            claim_at(&store, id, &c, day_b).await;
        }
        // Day B's slice also holds a job published then and delayed until now.
        let delayed = id_at(day_b, 99);
        claim_at(&store, delayed, &c, now).await;
        // Day C's slice holds a dead-lettered job, and the same job's claim by another consumer.
        let dead = id_at(day_c, 1);
        let mut tx = store.begin().await.expect("begin");
        assert_eq!(
            tx.claim(dead, &c, day_c).await.expect("claim"),
            Claim::Claimed
        );
        tx.record_dead_letter(NewDeadLetter {
            job_id: Some(dead),
            queue: "test.sliced".parse().expect("a queue name"),
            consumer: Some(c.clone()),
            tenant_id: Some(fixtures::tenant(1)),
            kind: Some(fixtures::kind("test.job")),
            correlation_id: Some(fixtures::correlation()),
            payload: b"{}".to_vec(),
            attempts: 5,
            last_error: "failed".to_owned(),
            reason: Some(DeadLetterReason::Exhausted),
            dedup_key: Some(dead.to_string()),
            at: day_c,
        })
        .await
        .expect("record the dead letter");
        tx.commit().await.expect("commit");
        claim_at(&store, dead, &other, day_c).await;
        // Today's slice is not expired.
        let today = id_at(now, 1);
        claim_at(&store, today, &c, now).await;

        flush_statistics(&store).await;
        let gone = store
            .purge_expired_slices(now - TTL)
            .await
            .expect("empty the expired slices");
        assert_eq!(
            gone,
            50 + 50 + 1,
            "days A and B, and the other consumer's claim"
        );
        assert_eq!(
            slice_of(&store, expired_a[0]).await,
            (0, 0),
            "day A: empty, its space returned"
        );
        assert_eq!(
            slice_of(&store, delayed).await.0,
            1,
            "day B keeps the delayed job"
        );
        assert_eq!(
            slice_of(&store, dead).await.0,
            1,
            "day C keeps the dead letter's claim"
        );
        assert_eq!(
            slice_of(&store, today).await.0,
            1,
            "today's slice untouched"
        );
        assert_eq!(
            redelivered(&store, delayed, &c).await,
            Claim::AlreadyProcessed
        );
        assert_eq!(redelivered(&store, dead, &c).await, Claim::DeadLettered);
        assert_eq!(
            redelivered(&store, today, &c).await,
            Claim::AlreadyProcessed
        );
        assert_eq!(
            redelivered(&store, expired_a[7], &c).await,
            Claim::Claimed,
            "an expired claim is gone, as with the batches"
        );
        assert_eq!(
            store
                .purge_processed(now - TTL, 1_000)
                .await
                .expect("purge"),
            0,
            "nothing expired is left to the batches"
        );
    })
    .await;
}

#[tokio::test]
async fn a_slice_in_use_is_left_to_the_batches() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let c = consumer("in_use");
        let now = SystemTime::now();
        let day = now - 100 * DAY;
        let ids: Vec<JobId> = (0..10).map(|n| id_at(day, n)).collect();
        for &id in &ids {
            claim_at(&store, id, &c, day).await;
        }
        // A report reads the table and stays open (what `pg_dump` does).
        let mut report = store.pool().begin().await.expect("begin the report");
        let read: i64 = sqlx::query_scalar("select count(*) from core.processed_jobs")
            .fetch_one(&mut *report)
            .await
            .expect("read");
        assert_eq!(read, 10);
        let gone = store
            .purge_expired_slices(now - TTL)
            .await
            .expect("a slice in use is no error");
        assert_eq!(gone, 0, "the slice in use is left");
        assert_eq!(slice_of(&store, ids[0]).await.0, 10);
        // The batches delete beside the report.
        assert_eq!(
            store
                .purge_processed(now - TTL, 1_000)
                .await
                .expect("purge"),
            10
        );
        report.rollback().await.expect("end the report");
    })
    .await;
}

#[tokio::test]
async fn the_migration_moves_every_claim_into_its_slice() {
    with_databases(|dbs| async move {
        let pool = dbs.pool().await;
        sqlx::migrate!("./migrations")
            .run_to(20261207000002, &pool)
            .await
            .expect("the schema before the slices");
        let c = consumer("migrated");
        let now = SystemTime::now();
        let jobs: Vec<JobId> = (0..1_000u32)
            .map(|n| id_at(now - (n % 200) * DAY, u128::from(n)))
            .collect();
        // Two ids no UUIDv7 minted, written by hand.
        let ids: Vec<Uuid> = jobs
            .iter()
            .map(|id| id.as_uuid())
            .chain([Uuid::nil(), Uuid::from_u128(u128::MAX)])
            .collect();
        sqlx::query(
            "insert into core.processed_jobs (job_id, consumer, processed_at) \
             select id, $2, now() from unnest($1::uuid[]) as id",
        )
        .bind(&ids)
        .bind(c.as_str())
        .execute(&pool)
        .await
        .expect("claims of the unsliced table");
        let store = PgStore::from_pool(pool.clone());
        store.migrate().await.expect("migrate to the slices");
        let (rows, placed, distinct): (i64, i64, i64) = sqlx::query_as(
            "select count(*), count(*) filter (where slot = core.processed_slot(job_id)), \
             count(distinct job_id) from core.processed_jobs",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(
            (rows, placed, distinct),
            (1_002, 1_002, 1_002),
            "none lost or doubled"
        );
        for n in [0, 199, 999] {
            assert_eq!(
                redelivered(&store, jobs[n], &c).await,
                Claim::AlreadyProcessed
            );
        }
        let old: Option<String> =
            sqlx::query_scalar("select to_regclass('core.processed_jobs_unsliced')::text")
                .fetch_one(&pool)
                .await
                .expect("look up");
        assert_eq!(old, None, "the unsliced table is gone");
    })
    .await;
}

/// Writes `n` claims of ids minted at `minted` (numbered from `from`) as processed at `at`,
/// in one statement.
async fn claims_by_sql(
    store: &PgStore,
    c: &ConsumerName,
    minted: SystemTime,
    from: u128,
    n: u128,
    at: SystemTime,
) -> Vec<JobId> {
    let jobs: Vec<JobId> = (from..from + n).map(|k| id_at(minted, k)).collect();
    let ids: Vec<Uuid> = jobs.iter().map(|id| id.as_uuid()).collect();
    sqlx::query(
        "insert into core.processed_jobs (job_id, consumer, processed_at, slot) \
         select id, $2, $3, core.processed_slot(id) from unnest($1::uuid[]) as id",
    )
    .bind(&ids)
    .bind(c.as_str())
    .bind(sqlx::types::chrono::DateTime::<sqlx::types::chrono::Utc>::from(at))
    .execute(store.pool())
    .await
    .expect("claims by SQL");
    jobs
}

#[tokio::test]
async fn a_slice_keeping_more_than_ten_thousand_claims_is_left_whole_to_the_batches() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let c = consumer("kept");
        let now = SystemTime::now();
        // Two expired days, each with five expired claims and many claims of jobs published
        // then and run only now (delayed), which the slice must keep: 10,000 on day A (put
        // back), 10,001 on day B (more than a slice puts back: left as it is).
        let (day_a, day_b) = (now - 100 * DAY, now - 90 * DAY);
        let expired_a = claims_by_sql(&store, &c, day_a, 0, 5, day_a).await;
        let kept_a = claims_by_sql(&store, &c, day_a, 5, 10_000, now).await;
        let expired_b = claims_by_sql(&store, &c, day_b, 0, 5, day_b).await;
        let kept_b = claims_by_sql(&store, &c, day_b, 5, 10_001, now).await;

        flush_statistics(&store).await;
        let gone = store
            .purge_expired_slices(now - TTL)
            .await
            .expect("empty the expired slices");
        assert_eq!(gone, 5, "day A's expired claims; day B's slice left");
        assert_eq!(
            slice_of(&store, kept_a[0]).await.0,
            10_000,
            "day A keeps all"
        );
        assert_eq!(
            slice_of(&store, kept_b[0]).await.0,
            10_006,
            "day B untouched: none of its kept claims lost"
        );
        for (id, claim) in [
            (expired_a[0], Claim::Claimed),
            (kept_a[9_999], Claim::AlreadyProcessed),
            (expired_b[0], Claim::AlreadyProcessed),
            (kept_b[10_000], Claim::AlreadyProcessed),
        ] {
            assert_eq!(redelivered(&store, id, &c).await, claim, "{id}");
        }
        assert_eq!(
            store
                .purge_processed(now - TTL, 1_000)
                .await
                .expect("purge"),
            5,
            "the batches take day B's expired claims"
        );
    })
    .await;
}

#[tokio::test]
async fn a_batch_across_slices_removes_at_most_its_size() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let c = consumer("batched");
        let now = SystemTime::now();
        for day in [now - 100 * DAY, now - 90 * DAY] {
            claims_by_sql(&store, &c, day, 0, 5, day).await;
        }
        let batch = |size| store.purge_processed(now - TTL, size);
        assert_eq!(
            batch(7).await.expect("purge"),
            7,
            "five from one slice, two from the next"
        );
        assert_eq!(batch(7).await.expect("purge"), 3, "the rest");
    })
    .await;
}

#[tokio::test]
async fn a_slice_that_fails_to_empty_is_an_error_not_a_slice_in_use() {
    with_databases(|dbs| async move {
        let store = dbs.store().await;
        let c = consumer("refused");
        let now = SystemTime::now();
        let day = now - 100 * DAY;
        let ids = claims_by_sql(&store, &c, day, 0, 3, day).await;
        let table = slice_table(&store, ids[0]).await;
        sqlx::query(
            "create function refuse() returns trigger language plpgsql as \
             $$ begin raise exception 'truncate refused'; end $$",
        )
        .execute(store.pool())
        .await
        .expect("a function refusing");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "create trigger refuse before truncate on {table} \
             for each statement execute function refuse()"
        )))
        .execute(store.pool())
        .await
        .expect("a trigger refusing the truncate");
        let err = store
            .purge_expired_slices(now - TTL)
            .await
            .expect_err("a failed truncate is reported");
        assert!(err.to_string().contains("truncate refused"), "{err}");
        assert_eq!(slice_of(&store, ids[0]).await.0, 3, "nothing lost");
    })
    .await;
}

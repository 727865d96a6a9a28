//! The store contract: [`WorkStore`] and its [`WorkTransaction`], [`ProcessedJobs`] and
//! [`DeadLetterStore`] together, as every SQL engine (and the in-memory double) must provide
//! them.
//!
//! The work transaction is what makes consumption exactly-once in effect: a claim becomes
//! visible only with the commit that carries the handler's writes, and a second transaction
//! claiming the same job waits for the first to end. Dead letters are deduplicated while
//! pending, so a dead letter that was written but whose message was not acked does not become a
//! second pending letter when the message comes back.
//!
//! [`run_bulk_runs`] checks [`BulkRuns`], the journal of bulk replays and discards that every
//! operator's tool shares: a run keeps its snapshot, resumes by key until finished, and counts
//! each letter once.
//!
//! Times are compared at millisecond precision: that is what every engine keeps at least.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobs_core::{
    BulkRun, BulkRunId, BulkRuns, Claim, ConsumerName, DeadLetter, DeadLetterEvent,
    DeadLetterFilter, DeadLetterId, DeadLetterReason, DeadLetterStatus, DeadLetterStore, JobId,
    NewDeadLetter, ProcessedJobs, QueueName, Recorded, Resolution, StoreError, Transition,
    WorkStore, WorkTransaction,
};

use crate::fixtures;

/// How long a check waits for a claim blocked behind another transaction before failing: a
/// broken store fails the check instead of hanging the test run.
const WAIT: Duration = Duration::from_secs(10);

/// Runs every check of the store contract, each on a fresh, migrated, empty store from `make`.
pub async fn run<S, F, Fut>(make: F)
where
    S: WorkStore + DeadLetterStore + ProcessedJobs,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    claim_is_visible_after_commit(make().await).await;
    rollback_discards_the_claim(make().await).await;
    consumers_claim_independently(make().await).await;
    concurrent_claim_waits_for_commit(make().await).await;
    concurrent_claim_after_rollback_claims(make().await).await;
    records_and_gets_dead_letters_exactly(make().await).await;
    deduplicates_pending_dead_letters(make().await).await;
    lists_dead_letters_by_filter_in_id_order(make().await).await;
    paginates_dead_letters_with_a_cursor(make().await).await;
    lists_dead_letters_newest_first_and_finds_them_by_id(make().await).await;
    transitions_dead_letters_once(make().await).await;
    records_the_history_of_each_transition(make().await).await;
    transitions_only_the_tenants_dead_letters(make().await).await;
    purges_processed_jobs_in_bounded_batches(make().await).await;
    a_dead_letter_settles_the_claim_until_replayed(make().await).await;
    purges_keep_the_claims_of_pending_dead_letters(make().await).await;
}

/// Runs every check of the bulk-run journal ([`BulkRuns`]), each on a fresh, migrated, empty
/// store from `make`: for the stores that journal bulk runs, beside [`run`].
pub async fn run_bulk_runs<S, F, Fut>(make: F)
where
    S: BulkRuns,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    journals_bulk_runs_for_every_operator(make().await).await;
    concurrent_starts_of_a_key_get_one_run(make().await).await;
    records_only_the_letters_of_a_known_run(make().await).await;
}

/// A fixed instant with sub-millisecond digits, `secs` seconds after the base, so that engines
/// that keep only milliseconds are exercised.
fn time(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::new(1_800_000_000 + secs, 123_456_789)
}

fn truncate_ms(t: SystemTime) -> SystemTime {
    let since = t
        .duration_since(UNIX_EPOCH)
        .expect("contract times are after the epoch");
    UNIX_EPOCH
        + Duration::from_millis(
            u64::try_from(since.as_millis()).expect("contract times fit in u64 milliseconds"),
        )
}

/// A dead letter with its times truncated to milliseconds, for comparison.
fn at_ms(mut letter: DeadLetter) -> DeadLetter {
    letter.letter.at = truncate_ms(letter.letter.at);
    letter.updated_at = truncate_ms(letter.updated_at);
    letter
}

fn queue(name: &str) -> QueueName {
    format!("contract.{name}")
        .parse()
        .expect("a valid queue name")
}

fn consumer(name: &str) -> ConsumerName {
    format!("contract.{name}")
        .parse()
        .expect("a valid consumer name")
}

/// A complete dead letter on `q`, numbered `n` (which shows in its payload and error).
fn letter(q: &QueueName, n: u32, dedup_key: Option<&str>) -> NewDeadLetter {
    NewDeadLetter {
        job_id: Some(JobId::generate()),
        queue: q.clone(),
        consumer: Some(consumer("letters")),
        tenant_id: Some(fixtures::tenant(1)),
        kind: Some(fixtures::kind("test.job")),
        correlation_id: Some(fixtures::correlation()),
        payload: format!("{{\"n\":{n}}}").into_bytes(),
        attempts: 5,
        last_error: format!("handler failed on letter {n}"),
        reason: Some(DeadLetterReason::Exhausted),
        dedup_key: dedup_key.map(str::to_owned),
        at: time(u64::from(n)),
    }
}

/// [`letter`] numbered `n` of `job` as `consumer` ran it: what the runtime records in the work
/// transaction holding the job's claim.
fn job_letter(q: &QueueName, consumer: &ConsumerName, job: JobId, n: u32) -> NewDeadLetter {
    let mut letter = letter(q, n, Some(job.to_string().as_str()));
    letter.job_id = Some(job);
    letter.consumer = Some(consumer.clone());
    letter
}

async fn begin<S: WorkStore>(check: &str, store: &S) -> S::Tx {
    store
        .begin()
        .await
        .unwrap_or_else(|e| panic!("{check}: begin: {e}"))
}

async fn claim<T: WorkTransaction>(
    check: &str,
    tx: &mut T,
    job_id: JobId,
    consumer: &ConsumerName,
) -> Claim {
    tx.claim(job_id, consumer, time(0))
        .await
        .unwrap_or_else(|e| panic!("{check}: claim: {e}"))
}

async fn commit<T: WorkTransaction>(check: &str, tx: T) {
    tx.commit()
        .await
        .unwrap_or_else(|e| panic!("{check}: commit: {e}"));
}

async fn rollback<T: WorkTransaction>(check: &str, tx: T) {
    tx.rollback()
        .await
        .unwrap_or_else(|e| panic!("{check}: rollback: {e}"));
}

async fn is_processed<S: ProcessedJobs>(
    check: &str,
    store: &S,
    job_id: JobId,
    consumer: &ConsumerName,
) -> bool {
    store
        .is_processed(job_id, consumer)
        .await
        .unwrap_or_else(|e| panic!("{check}: is_processed: {e}"))
}

async fn record<S: DeadLetterStore>(check: &str, store: &S, letter: NewDeadLetter) -> Recorded {
    store
        .record(letter)
        .await
        .unwrap_or_else(|e| panic!("{check}: record: {e}"))
}

async fn get<S: DeadLetterStore>(check: &str, store: &S, id: DeadLetterId) -> DeadLetter {
    store
        .get(id)
        .await
        .unwrap_or_else(|e| panic!("{check}: get: {e}"))
        .unwrap_or_else(|| panic!("{check}: dead letter {id} not found"))
}

async fn list<S: DeadLetterStore>(
    check: &str,
    store: &S,
    filter: &DeadLetterFilter,
) -> Vec<DeadLetterId> {
    store
        .list(filter)
        .await
        .unwrap_or_else(|e| panic!("{check}: list {filter:?}: {e}"))
        .iter()
        .map(|d| d.id)
        .collect()
}

async fn pending<S: DeadLetterStore>(
    check: &str,
    store: &S,
    q: &QueueName,
    key: &str,
) -> Option<DeadLetterId> {
    store
        .pending(q, key)
        .await
        .unwrap_or_else(|e| panic!("{check}: pending: {e}"))
}

async fn transition<S: DeadLetterStore>(
    check: &str,
    store: &S,
    id: DeadLetterId,
    to: DeadLetterStatus,
    tenant: Option<u32>,
    at: SystemTime,
) -> Transition {
    transition_by(check, store, id, to, tenant, at, "contract").await
}

/// [`transition`] on behalf of `by`.
async fn transition_by<S: DeadLetterStore>(
    check: &str,
    store: &S,
    id: DeadLetterId,
    to: DeadLetterStatus,
    tenant: Option<u32>,
    at: SystemTime,
    by: &str,
) -> Transition {
    let to = jobs_core::Resolution::try_from(to)
        .unwrap_or_else(|s| panic!("{check}: {s:?} is no resolution"));
    store
        .transition(id, to, tenant.map(fixtures::tenant), at, by)
        .await
        .unwrap_or_else(|e| panic!("{check}: transition: {e}"))
}

/// The history of a letter, its times truncated to milliseconds.
async fn history<S: DeadLetterStore>(
    check: &str,
    store: &S,
    id: DeadLetterId,
) -> Vec<DeadLetterEvent> {
    store
        .history(id)
        .await
        .unwrap_or_else(|e| panic!("{check}: history of {id}: {e}"))
        .into_iter()
        .map(|mut event| {
            event.at = truncate_ms(event.at);
            event
        })
        .collect()
}

/// The event of a move out of `PendingReview` to `to`, at `at` (in milliseconds) by `by`.
fn moved(to: DeadLetterStatus, at: SystemTime, by: &str) -> DeadLetterEvent {
    DeadLetterEvent {
        at: truncate_ms(at),
        from: DeadLetterStatus::PendingReview,
        to,
        by: by.to_owned(),
    }
}

fn new_id(check: &str, recorded: Recorded) -> DeadLetterId {
    match recorded {
        Recorded::New(id) => id,
        Recorded::Existing(id) => panic!("{check}: expected a new dead letter, got existing {id}"),
    }
}

/// A claim is invisible until commit; once committed the job is processed for good, and a
/// later transaction's claim answers `AlreadyProcessed`.
pub async fn claim_is_visible_after_commit<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "claim_is_visible_after_commit";
    let job = JobId::generate();
    let c = consumer("mailer");
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, job, &c).await,
        Claim::Claimed,
        "{check}: a new job must be claimed"
    );
    assert!(
        !is_processed(check, &store, job, &c).await,
        "{check}: an uncommitted claim must not be visible"
    );
    commit(check, tx).await;
    assert!(
        is_processed(check, &store, job, &c).await,
        "{check}: a committed claim must be processed"
    );
    let mut again = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut again, job, &c).await,
        Claim::AlreadyProcessed,
        "{check}: a committed job must not be claimed again"
    );
    rollback(check, again).await;
    assert!(
        is_processed(check, &store, job, &c).await,
        "{check}: rolling back a duplicate must not undo the first commit"
    );
}

/// A rolled-back claim leaves nothing behind: the job can be claimed again.
pub async fn rollback_discards_the_claim<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "rollback_discards_the_claim";
    let job = JobId::generate();
    let c = consumer("mailer");
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, job, &c).await,
        Claim::Claimed,
        "{check}: first claim"
    );
    rollback(check, tx).await;
    assert!(
        !is_processed(check, &store, job, &c).await,
        "{check}: a rolled-back claim must not be processed"
    );
    let mut retry = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut retry, job, &c).await,
        Claim::Claimed,
        "{check}: a rolled-back job must be claimable again"
    );
    commit(check, retry).await;
    assert!(
        is_processed(check, &store, job, &c).await,
        "{check}: the retried claim must be processed after commit"
    );
}

/// `(job_id, consumer)` is the key: two consumers of one job each process it once.
pub async fn consumers_claim_independently<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "consumers_claim_independently";
    let job = JobId::generate();
    let (mailer, ledger) = (consumer("mailer"), consumer("ledger"));
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, job, &mailer).await,
        Claim::Claimed,
        "{check}: first consumer"
    );
    commit(check, tx).await;
    assert!(
        !is_processed(check, &store, job, &ledger).await,
        "{check}: another consumer's claim must not count"
    );
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, job, &ledger).await,
        Claim::Claimed,
        "{check}: the second consumer must claim the same job"
    );
    commit(check, tx).await;
    for c in [&mailer, &ledger] {
        assert!(
            is_processed(check, &store, job, c).await,
            "{check}: {c} must have processed the job"
        );
    }
}

/// Two transactions claim one `(job, consumer)`; the second must wait for the first (a unique
/// insert blocks on PostgreSQL, the write lock on SQLite) and answer as the first ended.
async fn race<S: WorkStore>(check: &str, store: S, first_commits: bool) -> (Arc<S>, JobId, Claim) {
    let store = Arc::new(store);
    let job = JobId::generate();
    let c = consumer("racer");
    let mut first = begin(check, &*store).await;
    assert_eq!(
        claim(check, &mut first, job, &c).await,
        Claim::Claimed,
        "{check}: first claim"
    );

    let second = tokio::spawn({
        let store = Arc::clone(&store);
        let c = c.clone();
        async move {
            let mut tx = store.begin().await?;
            let claim = tx.claim(job, &c, time(1)).await?;
            match claim {
                Claim::Claimed => tx.commit().await?,
                _ => tx.rollback().await?,
            }
            Ok::<Claim, StoreError>(claim)
        }
    });
    // Give the second transaction every chance to start and block on the first.
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
    if second.is_finished() {
        let early = second.await;
        panic!("{check}: the second claim returned {early:?} while the first was still open");
    }

    if first_commits {
        commit(check, first).await;
    } else {
        rollback(check, first).await;
    }
    let outcome = tokio::time::timeout(WAIT, second)
        .await
        .unwrap_or_else(|_| {
            panic!("{check}: the second claim still waits {WAIT:?} after the first ended")
        })
        .unwrap_or_else(|e| panic!("{check}: the second claim's task failed: {e}"))
        .unwrap_or_else(|e| panic!("{check}: the second claim failed: {e}"));
    (store, job, outcome)
}

/// While one transaction holds a claim, a second claim of the same job waits; when the first
/// commits, the second sees `AlreadyProcessed`, never a second `Claimed`.
pub async fn concurrent_claim_waits_for_commit<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "concurrent_claim_waits_for_commit";
    let (store, job, outcome) = race(check, store, true).await;
    assert_eq!(
        outcome,
        Claim::AlreadyProcessed,
        "{check}: the job was claimed twice"
    );
    assert!(
        is_processed(check, &*store, job, &consumer("racer")).await,
        "{check}: the first commit must stand"
    );
}

/// While one transaction holds a claim, a second claim of the same job waits; when the first
/// rolls back, the second claims the job.
pub async fn concurrent_claim_after_rollback_claims<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "concurrent_claim_after_rollback_claims";
    let (store, job, outcome) = race(check, store, false).await;
    assert_eq!(
        outcome,
        Claim::Claimed,
        "{check}: the job must be claimable once the first transaction rolled back"
    );
    assert!(
        is_processed(check, &*store, job, &consumer("racer")).await,
        "{check}: the second transaction's commit must stand"
    );
}

/// A recorded dead letter comes back field for field: payload bytes that are not UTF-8, absent
/// envelope fields of a poison message, times to the millisecond, status `PendingReview`.
pub async fn records_and_gets_dead_letters_exactly<S: DeadLetterStore>(store: S) {
    let check = "records_and_gets_dead_letters_exactly";
    let q = queue("exact");
    let full = letter(&q, 1, Some("job-1"));
    let poison = NewDeadLetter {
        job_id: None,
        queue: q.clone(),
        consumer: None,
        tenant_id: None,
        kind: None,
        correlation_id: None,
        payload: vec![0xff, 0x00, 0xfe],
        attempts: 1,
        last_error: "job_id: must be a UUID version 7".to_owned(),
        reason: Some(DeadLetterReason::Poison),
        dedup_key: None,
        at: time(2),
    };
    // A row from before reasons were kept reads back without one.
    let unrecorded = NewDeadLetter {
        reason: None,
        ..letter(&q, 3, Some("job-3"))
    };
    for sent in [full, poison, unrecorded] {
        let id = new_id(check, record(check, &store, sent.clone()).await);
        let got = get(check, &store, id).await;
        let expected = DeadLetter {
            id,
            updated_at: sent.at,
            letter: sent,
            status: DeadLetterStatus::PendingReview,
        };
        assert_eq!(
            at_ms(got),
            at_ms(expected),
            "{check}: the dead letter changed in the store"
        );
    }
    let unknown = DeadLetterId(i64::MAX);
    let missing = store
        .get(unknown)
        .await
        .unwrap_or_else(|e| panic!("{check}: get unknown: {e}"));
    assert!(
        missing.is_none(),
        "{check}: an unknown id must be None, got {missing:?}"
    );
}

/// While a dead letter with a dedup key is pending, recording the same queue and key again
/// answers `Existing` and changes nothing; without a key nothing is deduplicated; once the
/// letter leaves `PendingReview`, the key is free again.
pub async fn deduplicates_pending_dead_letters<S: DeadLetterStore>(store: S) {
    let check = "deduplicates_pending_dead_letters";
    let q = queue("dedup");
    let other_q = queue("dedup_other");
    let first = new_id(
        check,
        record(check, &store, letter(&q, 1, Some("k1"))).await,
    );
    assert_eq!(
        pending(check, &store, &q, "k1").await,
        Some(first),
        "{check}: pending must find the letter"
    );
    assert_eq!(
        pending(check, &store, &q, "k2").await,
        None,
        "{check}: pending must not find another key"
    );
    assert_eq!(
        pending(check, &store, &other_q, "k1").await,
        None,
        "{check}: pending must not find another queue's key"
    );

    let mut redelivered = letter(&q, 2, Some("k1"));
    redelivered.attempts = 6;
    assert_eq!(
        record(check, &store, redelivered).await,
        Recorded::Existing(first),
        "{check}: a pending letter with the same key must be reused"
    );
    let kept = get(check, &store, first).await;
    assert_eq!(
        (kept.letter.attempts, kept.letter.payload.as_slice()),
        (5, b"{\"n\":1}".as_slice()),
        "{check}: a duplicate record must not change the pending letter"
    );
    let same_key_other_queue = new_id(
        check,
        record(check, &store, letter(&other_q, 3, Some("k1"))).await,
    );
    assert_ne!(same_key_other_queue, first, "{check}: keys are per queue");

    let a = new_id(check, record(check, &store, letter(&q, 4, None)).await);
    let b = new_id(check, record(check, &store, letter(&q, 4, None)).await);
    assert_ne!(
        a, b,
        "{check}: letters without a key must never be deduplicated"
    );

    let on_q = DeadLetterFilter {
        queue: Some(q.clone()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        list(check, &store, &on_q).await,
        vec![first, a, b],
        "{check}: exactly one letter per pending key"
    );

    assert_eq!(
        transition(
            check,
            &store,
            first,
            DeadLetterStatus::Replayed,
            None,
            time(10)
        )
        .await,
        Transition::Done,
        "{check}: replay"
    );
    assert_eq!(
        pending(check, &store, &q, "k1").await,
        None,
        "{check}: a replayed letter is no longer pending"
    );
    let second = new_id(
        check,
        record(check, &store, letter(&q, 5, Some("k1"))).await,
    );
    assert!(
        second > first,
        "{check}: a new letter must get a larger id ({second} after {first})"
    );
    assert_eq!(
        pending(check, &store, &q, "k1").await,
        Some(second),
        "{check}: pending must find the new letter"
    );
}

/// The seven letters of the listing checks, and their statuses once set up: queues, tenants,
/// kinds and statuses vary so that every filter selects a different subset.
async fn seed_listing<S: DeadLetterStore>(check: &str, store: &S) -> Vec<DeadLetter> {
    let queues = [queue("list_a"), queue("list_b")];
    let tenants = [Some(1), Some(2), Some(1), Some(2), Some(1), None, Some(2)];
    let kinds = [
        Some("test.job"),
        Some("test.job"),
        Some("test.other"),
        Some("test.other"),
        Some("test.job"),
        None,
        Some("test.other"),
    ];
    // Every reason a letter can carry, and none (a row from before reasons were kept).
    let reasons = [
        Some(DeadLetterReason::Exhausted),
        Some(DeadLetterReason::Poison),
        Some(DeadLetterReason::Permanent),
        None,
        Some(DeadLetterReason::UnknownKind),
        Some(DeadLetterReason::TooLarge),
        Some(DeadLetterReason::Exhausted),
    ];
    let mut seeded = vec![];
    for n in 0..7u32 {
        let i = usize::try_from(n).expect("small index");
        let mut sent = letter(&queues[i % 2], n, None);
        sent.tenant_id = tenants[i].map(fixtures::tenant);
        sent.kind = kinds[i].map(fixtures::kind);
        sent.reason = reasons[i];
        let id = new_id(check, record(check, store, sent.clone()).await);
        if let Some(last) = seeded.last().map(|d: &DeadLetter| d.id) {
            assert!(id > last, "{check}: ids must increase ({id} after {last})");
        }
        seeded.push(DeadLetter {
            id,
            updated_at: sent.at,
            letter: sent,
            status: DeadLetterStatus::PendingReview,
        });
    }
    for (i, to) in [
        (1, DeadLetterStatus::Replayed),
        (2, DeadLetterStatus::Discarded),
        (4, DeadLetterStatus::Replayed),
    ] {
        let d = &mut seeded[i];
        assert_eq!(
            transition(check, store, d.id, to, None, time(100)).await,
            Transition::Done,
            "{check}: setting up statuses"
        );
        d.status = to;
        d.updated_at = time(100);
    }
    seeded
}

fn selects(filter: &DeadLetterFilter, d: &DeadLetter) -> bool {
    filter.status.is_none_or(|s| d.status == s)
        && filter.queue.as_ref().is_none_or(|q| d.letter.queue == *q)
        && filter
            .tenant_id
            .is_none_or(|t| d.letter.tenant_id == Some(t))
        && filter
            .kind
            .as_ref()
            .is_none_or(|k| d.letter.kind.as_ref() == Some(k))
        && filter.job_id.is_none_or(|j| d.letter.job_id == Some(j))
        && filter
            .correlation_id
            .is_none_or(|c| d.letter.correlation_id == Some(c))
        && filter.reason.is_none_or(|r| d.letter.reason == Some(r))
        && filter.after.is_none_or(|after| d.id > after)
        && filter.before.is_none_or(|before| d.id < before)
}

/// `list` applies every given criterion (status, queue, tenant, kind, alone or together, and
/// each reason with or without a status) and
/// answers in id order, with complete letters.
pub async fn lists_dead_letters_by_filter_in_id_order<S: DeadLetterStore>(store: S) {
    let check = "lists_dead_letters_by_filter_in_id_order";
    let seeded = seed_listing(check, &store).await;
    let all = DeadLetterFilter::default();
    let got = store
        .list(&all)
        .await
        .unwrap_or_else(|e| panic!("{check}: list: {e}"));
    assert_eq!(
        got.into_iter().map(at_ms).collect::<Vec<_>>(),
        seeded.iter().cloned().map(at_ms).collect::<Vec<_>>(),
        "{check}: an unfiltered list must return every letter as stored, in id order"
    );

    let pending = Some(DeadLetterStatus::PendingReview);
    let replayed = Some(DeadLetterStatus::Replayed);
    let (a, b) = (Some(queue("list_a")), Some(queue("list_b")));
    let (t1, t2) = (Some(fixtures::tenant(1)), Some(fixtures::tenant(2)));
    let (job, other) = (
        Some(fixtures::kind("test.job")),
        Some(fixtures::kind("test.other")),
    );
    let filters = [
        (pending, None, None, None),
        (replayed, None, None, None),
        (Some(DeadLetterStatus::Discarded), None, None, None),
        (None, a.clone(), None, None),
        (None, b.clone(), None, None),
        (None, None, t1, None),
        (None, None, t2, None),
        (None, None, Some(fixtures::tenant(3)), None),
        (None, None, None, job.clone()),
        (None, None, None, other.clone()),
        (pending, a.clone(), None, None),
        (None, b.clone(), t2, None),
        (None, None, t1, job.clone()),
        (replayed, None, None, job.clone()),
        (pending, b.clone(), t2, other.clone()),
        (replayed, a.clone(), t1, job.clone()),
        (pending, a, t1, other),
    ];
    let by_reason = DeadLetterReason::ALL
        .into_iter()
        .flat_map(|reason| [(None, reason), (pending, reason)]);
    let filters = (filters.into_iter())
        .map(|(status, queue, tenant_id, kind)| DeadLetterFilter {
            status,
            queue,
            tenant_id,
            kind,
            ..DeadLetterFilter::default()
        })
        .chain(by_reason.map(|(status, reason)| DeadLetterFilter {
            status,
            reason: Some(reason),
            ..DeadLetterFilter::default()
        }));
    for filter in filters {
        let expected: Vec<DeadLetterId> = seeded
            .iter()
            .filter(|d| selects(&filter, d))
            .map(|d| d.id)
            .collect();
        assert_eq!(
            list(check, &store, &filter).await,
            expected,
            "{check}: wrong letters for {filter:?}"
        );
    }
}

/// Keyset pagination: pages of `limit` after the last id seen return every letter exactly
/// once, in order, then nothing; the cursor also combines with a filter.
pub async fn paginates_dead_letters_with_a_cursor<S: DeadLetterStore>(store: S) {
    let check = "paginates_dead_letters_with_a_cursor";
    let seeded = seed_listing(check, &store).await;
    let mut filter = DeadLetterFilter {
        limit: 3,
        ..DeadLetterFilter::default()
    };
    let mut pages = vec![];
    loop {
        let page = list(check, &store, &filter).await;
        assert!(
            pages.len() <= seeded.len(),
            "{check}: pagination does not end"
        );
        let Some(last) = page.last().copied() else {
            break;
        };
        pages.push(page);
        filter.after = Some(last);
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 3, 1],
        "{check}: page sizes"
    );
    assert_eq!(
        pages.concat(),
        seeded.iter().map(|d| d.id).collect::<Vec<_>>(),
        "{check}: every letter exactly once, in id order"
    );

    let pending_after_first = DeadLetterFilter {
        status: Some(DeadLetterStatus::PendingReview),
        after: Some(seeded[0].id),
        limit: 2,
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        list(check, &store, &pending_after_first).await,
        vec![seeded[3].id, seeded[5].id],
        "{check}: the cursor must combine with a filter and the limit"
    );
    let none = DeadLetterFilter {
        limit: 0,
        ..DeadLetterFilter::default()
    };
    assert!(
        list(check, &store, &none).await.is_empty(),
        "{check}: a limit of 0 must return nothing"
    );
}

/// Newest first is id order reversed, with every filter and with `limit` taken after ordering;
/// pages `before` the last id seen return every letter exactly once; `after` and `before`
/// together bound a window in either order. `job_id` and `correlation_id` find exactly their
/// letters (a job dead-lettered twice, a correlation spanning tenants), also with a tenant.
pub async fn lists_dead_letters_newest_first_and_finds_them_by_id<S: DeadLetterStore>(store: S) {
    let check = "lists_dead_letters_newest_first_and_finds_them_by_id";
    let mut seeded = seed_listing(check, &store).await;
    // The job of letter 2 dead-lettered again, for another tenant; a letter of tenant 1 in the
    // correlation of letter 1 (tenant 2); a letter with neither id, which no search may find.
    let job = seeded[2]
        .letter
        .job_id
        .expect("seeded letters have a job id");
    let correlation = seeded[1]
        .letter
        .correlation_id
        .expect("seeded letters have a correlation id");
    let q = queue("list_a");
    let mut again = letter(&q, 7, None);
    again.job_id = Some(job);
    again.tenant_id = Some(fixtures::tenant(2));
    let mut related = letter(&q, 8, None);
    related.correlation_id = Some(correlation);
    let mut anonymous = letter(&q, 9, None);
    anonymous.job_id = None;
    anonymous.correlation_id = None;
    for sent in [again, related, anonymous] {
        let id = new_id(check, record(check, &store, sent.clone()).await);
        seeded.push(DeadLetter {
            id,
            updated_at: sent.at,
            letter: sent,
            status: DeadLetterStatus::PendingReview,
        });
    }
    let ids: Vec<DeadLetterId> = seeded.iter().map(|d| d.id).collect();
    let newest: Vec<DeadLetterId> = ids.iter().rev().copied().collect();

    let newest_first = DeadLetterFilter {
        newest_first: true,
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        list(check, &store, &newest_first).await,
        newest,
        "{check}: newest first must be id order reversed"
    );
    let top = DeadLetterFilter {
        limit: 3,
        ..newest_first.clone()
    };
    assert_eq!(
        list(check, &store, &top).await,
        newest[..3],
        "{check}: the limit must apply after ordering (the newest 3)"
    );
    for (status, tenant) in [
        (Some(DeadLetterStatus::PendingReview), None),
        (Some(DeadLetterStatus::Replayed), None),
        (None, Some(fixtures::tenant(1))),
        (
            Some(DeadLetterStatus::PendingReview),
            Some(fixtures::tenant(2)),
        ),
    ] {
        let filter = DeadLetterFilter {
            status,
            tenant_id: tenant,
            ..newest_first.clone()
        };
        let expected: Vec<DeadLetterId> = seeded
            .iter()
            .rev()
            .filter(|d| selects(&filter, d))
            .map(|d| d.id)
            .collect();
        assert!(expected.len() >= 2, "{check}: {filter:?} shows no order");
        assert_eq!(
            list(check, &store, &filter).await,
            expected,
            "{check}: wrong letters or order for {filter:?}"
        );
    }

    let mut page_filter = top.clone();
    let mut pages = vec![];
    loop {
        let page = list(check, &store, &page_filter).await;
        assert!(
            pages.len() <= seeded.len(),
            "{check}: pagination does not end"
        );
        let Some(last) = page.last().copied() else {
            break;
        };
        pages.push(page);
        page_filter.before = Some(last);
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 3, 3, 1],
        "{check}: page sizes"
    );
    assert_eq!(
        pages.concat(),
        newest,
        "{check}: pages before the last id must return every letter exactly once, newest first"
    );

    let window = DeadLetterFilter {
        after: Some(ids[1]),
        before: Some(ids[5]),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        list(check, &store, &window).await,
        ids[2..5],
        "{check}: after and before together bound the ids, exclusively"
    );
    let window_newest = DeadLetterFilter {
        newest_first: true,
        limit: 2,
        ..window.clone()
    };
    assert_eq!(
        list(check, &store, &window_newest).await,
        vec![ids[4], ids[3]],
        "{check}: a window newest first, limited after ordering"
    );
    let empty = DeadLetterFilter {
        after: Some(ids[4]),
        before: Some(ids[5]),
        ..DeadLetterFilter::default()
    };
    assert!(
        list(check, &store, &empty).await.is_empty(),
        "{check}: no id lies strictly between neighbours"
    );

    let (t1, t2) = (Some(fixtures::tenant(1)), Some(fixtures::tenant(2)));
    let unknown_job = Some(JobId::generate());
    let unknown_correlation = Some(fixtures::correlation());
    let searches = [
        (Some(job), None, None, vec![ids[2], ids[7]]),
        (Some(job), None, t1, vec![ids[2]]),
        (Some(job), None, t2, vec![ids[7]]),
        (Some(job), None, Some(fixtures::tenant(3)), vec![]),
        (None, Some(correlation), None, vec![ids[1], ids[8]]),
        (None, Some(correlation), t1, vec![ids[8]]),
        (None, Some(correlation), t2, vec![ids[1]]),
        (
            Some(job),
            seeded[2].letter.correlation_id,
            None,
            vec![ids[2]],
        ),
        (Some(job), Some(correlation), None, vec![]),
        (unknown_job, None, None, vec![]),
        (None, unknown_correlation, None, vec![]),
    ];
    for (job_id, correlation_id, tenant_id, expected) in searches {
        let filter = DeadLetterFilter {
            job_id,
            correlation_id,
            tenant_id,
            ..DeadLetterFilter::default()
        };
        assert_eq!(
            list(check, &store, &filter).await,
            expected,
            "{check}: wrong letters for {filter:?}"
        );
        let reversed: Vec<DeadLetterId> = expected.iter().rev().copied().collect();
        let filter = DeadLetterFilter {
            newest_first: true,
            ..filter
        };
        assert_eq!(
            list(check, &store, &filter).await,
            reversed,
            "{check}: wrong letters for {filter:?}"
        );
    }
}

/// A letter leaves `PendingReview` once: repeating the command is `AlreadyDone`, the other final
/// status is a `Conflict`, an unknown id is `NotFound`; `updated_at` is the time of the change.
pub async fn transitions_dead_letters_once<S: DeadLetterStore>(store: S) {
    let check = "transitions_dead_letters_once";
    let q = queue("transition");
    let id = new_id(check, record(check, &store, letter(&q, 1, Some("k"))).await);
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Replayed,
            None,
            time(60)
        )
        .await,
        Transition::Done,
        "{check}: pending to replayed"
    );
    let replayed = get(check, &store, id).await;
    assert_eq!(
        (replayed.status, truncate_ms(replayed.updated_at)),
        (DeadLetterStatus::Replayed, truncate_ms(time(60))),
        "{check}: status and updated_at after the change"
    );
    assert_eq!(
        truncate_ms(replayed.letter.at),
        truncate_ms(time(1)),
        "{check}: the time of the dead-lettering must not change"
    );
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Replayed,
            None,
            time(70)
        )
        .await,
        Transition::AlreadyDone,
        "{check}: repeating the change"
    );
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Discarded,
            None,
            time(80)
        )
        .await,
        Transition::Conflict(DeadLetterStatus::Replayed),
        "{check}: a replayed letter cannot be discarded"
    );
    assert_eq!(
        at_ms(get(check, &store, id).await),
        at_ms(replayed),
        "{check}: refused changes must not touch the letter"
    );

    let other = new_id(check, record(check, &store, letter(&q, 2, None)).await);
    assert_eq!(
        transition(
            check,
            &store,
            other,
            DeadLetterStatus::Discarded,
            None,
            time(90)
        )
        .await,
        Transition::Done,
        "{check}: pending to discarded"
    );
    assert_eq!(
        transition(
            check,
            &store,
            other,
            DeadLetterStatus::Replayed,
            None,
            time(91)
        )
        .await,
        Transition::Conflict(DeadLetterStatus::Discarded),
        "{check}: a discarded letter cannot be replayed"
    );
    let unknown = DeadLetterId(i64::MAX);
    assert_eq!(
        transition(
            check,
            &store,
            unknown,
            DeadLetterStatus::Replayed,
            None,
            time(92)
        )
        .await,
        Transition::NotFound,
        "{check}: unknown id"
    );
}

/// Every change of status is in the letter's history, with its time and who asked, and only
/// the changes: a repeated command, a conflict, another tenant's attempt and an unknown id
/// record nothing. Events come oldest first; a letter leaves `PendingReview` once, so it has at
/// most one, and the check compares whole histories so a duplicate would show.
pub async fn records_the_history_of_each_transition<S: DeadLetterStore>(store: S) {
    let check = "records_the_history_of_each_transition";
    let q = queue("history");
    let replayed = new_id(check, record(check, &store, letter(&q, 1, None)).await);
    let discarded = new_id(check, record(check, &store, letter(&q, 2, None)).await);
    let scoped = new_id(check, record(check, &store, letter(&q, 3, None)).await);
    assert_eq!(
        history(check, &store, replayed).await,
        [],
        "{check}: a pending letter has no history"
    );

    let alice = "jobsctl (alice)";
    assert_eq!(
        transition_by(
            check,
            &store,
            replayed,
            DeadLetterStatus::Replayed,
            None,
            time(60),
            alice
        )
        .await,
        Transition::Done,
        "{check}: pending to replayed"
    );
    assert_eq!(
        transition_by(
            check,
            &store,
            replayed,
            DeadLetterStatus::Replayed,
            None,
            time(70),
            "jobsctl (bob)"
        )
        .await,
        Transition::AlreadyDone,
        "{check}: a repeated replay"
    );
    let replay_event = || moved(DeadLetterStatus::Replayed, time(60), alice);
    assert_eq!(
        history(check, &store, replayed).await,
        [replay_event()],
        "{check}: one event for a replay, none for its repeat"
    );

    let operator = "console (operator)";
    assert_eq!(
        transition_by(
            check,
            &store,
            discarded,
            DeadLetterStatus::Discarded,
            None,
            time(80),
            operator
        )
        .await,
        Transition::Done,
        "{check}: pending to discarded"
    );
    let discard_event = || moved(DeadLetterStatus::Discarded, time(80), operator);
    assert_eq!(
        history(check, &store, discarded).await,
        [discard_event()],
        "{check}: one event for a discard"
    );

    for (id, to, current) in [
        (
            replayed,
            DeadLetterStatus::Discarded,
            DeadLetterStatus::Replayed,
        ),
        (
            discarded,
            DeadLetterStatus::Replayed,
            DeadLetterStatus::Discarded,
        ),
    ] {
        assert_eq!(
            transition_by(check, &store, id, to, None, time(90), "jobsctl (mallory)").await,
            Transition::Conflict(current),
            "{check}: {current} letter {id} moved to {to}"
        );
    }
    assert_eq!(
        history(check, &store, replayed).await,
        [replay_event()],
        "{check}: a conflict records nothing"
    );
    assert_eq!(
        history(check, &store, discarded).await,
        [discard_event()],
        "{check}: a conflict records nothing"
    );

    assert_eq!(
        transition_by(
            check,
            &store,
            scoped,
            DeadLetterStatus::Discarded,
            Some(2),
            time(100),
            "console (tenant 2)"
        )
        .await,
        Transition::NotFound,
        "{check}: another tenant's letter"
    );
    assert_eq!(
        history(check, &store, scoped).await,
        [],
        "{check}: another tenant's attempt records nothing"
    );
    assert_eq!(
        transition_by(
            check,
            &store,
            scoped,
            DeadLetterStatus::Discarded,
            Some(1),
            time(110),
            "console (tenant 1)"
        )
        .await,
        Transition::Done,
        "{check}: the tenant's own letter"
    );
    assert_eq!(
        history(check, &store, scoped).await,
        [moved(
            DeadLetterStatus::Discarded,
            time(110),
            "console (tenant 1)"
        )],
        "{check}: the tenant's own change is recorded"
    );

    let unknown = DeadLetterId(i64::MAX);
    assert_eq!(
        transition_by(
            check,
            &store,
            unknown,
            DeadLetterStatus::Replayed,
            None,
            time(120),
            alice
        )
        .await,
        Transition::NotFound,
        "{check}: unknown id"
    );
    assert_eq!(
        history(check, &store, unknown).await,
        [],
        "{check}: an unknown id has no history"
    );
}

/// With a tenant, only that tenant's letters can change: anyone else's, or one without a
/// tenant, is `NotFound` (whatever its status) and stays as it was.
pub async fn transitions_only_the_tenants_dead_letters<S: DeadLetterStore>(store: S) {
    let check = "transitions_only_the_tenants_dead_letters";
    let q = queue("tenant");
    let id = new_id(check, record(check, &store, letter(&q, 1, None)).await);
    let before = get(check, &store, id).await;
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Discarded,
            Some(2),
            time(50)
        )
        .await,
        Transition::NotFound,
        "{check}: another tenant's letter"
    );
    assert_eq!(
        at_ms(get(check, &store, id).await),
        at_ms(before),
        "{check}: another tenant must change nothing"
    );
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Discarded,
            Some(1),
            time(60)
        )
        .await,
        Transition::Done,
        "{check}: the tenant's own letter"
    );
    assert_eq!(
        truncate_ms(get(check, &store, id).await.updated_at),
        truncate_ms(time(60)),
        "{check}: updated_at after the tenant's change"
    );
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Discarded,
            Some(2),
            time(70)
        )
        .await,
        Transition::NotFound,
        "{check}: a settled letter of another tenant must not be revealed"
    );
    assert_eq!(
        transition(
            check,
            &store,
            id,
            DeadLetterStatus::Discarded,
            Some(1),
            time(70)
        )
        .await,
        Transition::AlreadyDone,
        "{check}: the tenant repeating its change"
    );

    let mut poison = letter(&q, 2, None);
    poison.tenant_id = None;
    let poison = new_id(check, record(check, &store, poison).await);
    assert_eq!(
        transition(
            check,
            &store,
            poison,
            DeadLetterStatus::Replayed,
            Some(1),
            time(80)
        )
        .await,
        Transition::NotFound,
        "{check}: a letter without a tenant is no tenant's"
    );
    assert_eq!(
        get(check, &store, poison).await.status,
        DeadLetterStatus::PendingReview,
        "{check}: a tenant must not change a letter without a tenant"
    );
}

/// `purge_processed` deletes only rows processed strictly before the cutoff, at most `batch`
/// per call, so a caller loops until a call returns fewer than `batch`.
pub async fn purges_processed_jobs_in_bounded_batches<S: WorkStore + ProcessedJobs>(store: S) {
    let check = "purges_processed_jobs_in_bounded_batches";
    let c = consumer("purged");
    let cutoff = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let old: Vec<JobId> = (0..25).map(|_| JobId::generate()).collect();
    let new: Vec<JobId> = (0..5).map(|_| JobId::generate()).collect();
    let mut tx = begin(check, &store).await;
    for (i, job) in old.iter().enumerate() {
        let secs = u64::try_from(i + 1).expect("small index");
        let at = cutoff - Duration::from_secs(secs);
        let got = tx
            .claim(*job, &c, at)
            .await
            .unwrap_or_else(|e| panic!("{check}: claim: {e}"));
        assert_eq!(got, Claim::Claimed, "{check}: seeding old rows");
    }
    for (i, job) in new.iter().enumerate() {
        // The first new row is exactly at the cutoff: not older than it.
        let at = cutoff + Duration::from_secs(u64::try_from(i).expect("small index"));
        let got = tx
            .claim(*job, &c, at)
            .await
            .unwrap_or_else(|e| panic!("{check}: claim: {e}"));
        assert_eq!(got, Claim::Claimed, "{check}: seeding new rows");
    }
    commit(check, tx).await;

    let mut deleted = vec![];
    for _ in 0..4 {
        deleted.push(
            store
                .purge_processed(cutoff, 10)
                .await
                .unwrap_or_else(|e| panic!("{check}: purge: {e}")),
        );
    }
    assert_eq!(
        deleted,
        vec![10, 10, 5, 0],
        "{check}: rows deleted per call"
    );
    for job in &old {
        assert!(
            !is_processed(check, &store, *job, &c).await,
            "{check}: an old row survived"
        );
    }
    for job in &new {
        assert!(
            is_processed(check, &store, *job, &c).await,
            "{check}: a row at or after the cutoff was purged"
        );
    }
}

/// A dead letter recorded in a work transaction holding the job's claim settles the job: a
/// later claim answers `DeadLettered`; a rolled-back record leaves nothing; replaying the letter
/// releases the claim, discarding it does not.
pub async fn a_dead_letter_settles_the_claim_until_replayed<S: WorkStore + DeadLetterStore>(
    store: S,
) {
    let check = "a_dead_letter_settles_the_claim_until_replayed";
    let q = queue("settles");
    let consumer = consumer("settles");
    let for_job = |job: JobId, n: u32| job_letter(&q, &consumer, job, n);

    let rolled_back = JobId::generate();
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, rolled_back, &consumer).await,
        Claim::Claimed
    );
    tx.record_dead_letter(for_job(rolled_back, 1))
        .await
        .unwrap_or_else(|e| panic!("{check}: record in the transaction: {e}"));
    rollback(check, tx).await;
    let key = rolled_back.to_string();
    assert_eq!(
        pending(check, &store, &q, &key).await,
        None,
        "{check}: a rolled-back dead letter was kept"
    );

    let replayed = JobId::generate();
    let discarded = JobId::generate();
    let mut ids = vec![];
    for (job, n) in [(replayed, 2), (discarded, 3)] {
        let mut tx = begin(check, &store).await;
        assert_eq!(claim(check, &mut tx, job, &consumer).await, Claim::Claimed);
        let recorded = tx
            .record_dead_letter(for_job(job, n))
            .await
            .unwrap_or_else(|e| panic!("{check}: record in the transaction: {e}"));
        commit(check, tx).await;
        ids.push(new_id(check, recorded));
        let mut tx = begin(check, &store).await;
        assert_eq!(
            claim(check, &mut tx, job, &consumer).await,
            Claim::DeadLettered,
            "{check}: a dead-lettered job was claimable"
        );
        rollback(check, tx).await;
    }
    transition(
        check,
        &store,
        ids[0],
        DeadLetterStatus::Replayed,
        None,
        time(5),
    )
    .await;
    transition(
        check,
        &store,
        ids[1],
        DeadLetterStatus::Discarded,
        None,
        time(5),
    )
    .await;

    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, replayed, &consumer).await,
        Claim::Claimed,
        "{check}: a replay must release the claim"
    );
    assert_eq!(
        claim(check, &mut tx, discarded, &consumer).await,
        Claim::AlreadyProcessed,
        "{check}: a discarded job stays settled"
    );
    commit(check, tx).await;
}

/// Neither purge (through the store, or in a work transaction) deletes the claim of a job whose
/// dead letter is pending review, however old: it is what answers a republished copy
/// `DeadLettered`. The same job's claim for another consumer, a plain claim and the claim of a
/// discarded letter go.
pub async fn purges_keep_the_claims_of_pending_dead_letters<
    S: WorkStore + DeadLetterStore + ProcessedJobs,
>(
    store: S,
) {
    let check = "purges_keep_the_claims_of_pending_dead_letters";
    let q = queue("kept");
    let (reviewed, other) = (consumer("kept"), consumer("kept.other"));
    let (pending, plain, discarded) = (JobId::generate(), JobId::generate(), JobId::generate());
    let mut letters = vec![];
    for (job, n) in [(pending, 1), (discarded, 2)] {
        let mut tx = begin(check, &store).await;
        assert_eq!(claim(check, &mut tx, job, &reviewed).await, Claim::Claimed);
        let recorded = tx
            .record_dead_letter(job_letter(&q, &reviewed, job, n))
            .await
            .unwrap_or_else(|e| panic!("{check}: record in the transaction: {e}"));
        commit(check, tx).await;
        letters.push(new_id(check, recorded));
    }
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, plain, &reviewed).await,
        Claim::Claimed
    );
    assert_eq!(claim(check, &mut tx, pending, &other).await, Claim::Claimed);
    commit(check, tx).await;
    transition(
        check,
        &store,
        letters[1],
        DeadLetterStatus::Discarded,
        None,
        time(5),
    )
    .await;

    // Every claim is older than the cutoff; three of the four may go.
    let cutoff = time(10);
    let mut tx = begin(check, &store).await;
    let in_tx = tx
        .purge_processed(cutoff, 10)
        .await
        .unwrap_or_else(|e| panic!("{check}: purge in a transaction: {e}"));
    rollback(check, tx).await;
    assert_eq!(in_tx, 3, "{check}: rows a work transaction's purge deleted");
    let deleted = store
        .purge_processed(cutoff, 10)
        .await
        .unwrap_or_else(|e| panic!("{check}: purge: {e}"));
    assert_eq!(deleted, 3, "{check}: rows the store's purge deleted");
    assert!(
        is_processed(check, &store, pending, &reviewed).await,
        "{check}: the claim of a pending dead letter was purged"
    );
    for (job, consumer) in [
        (plain, &reviewed),
        (discarded, &reviewed),
        (pending, &other),
    ] {
        assert!(
            !is_processed(check, &store, job, consumer).await,
            "{check}: a claim without a pending letter survived"
        );
    }
    let mut tx = begin(check, &store).await;
    assert_eq!(
        claim(check, &mut tx, pending, &reviewed).await,
        Claim::DeadLettered,
        "{check}: a republished copy must still find its dead letter"
    );
    rollback(check, tx).await;
}

fn ids(ns: &[i64]) -> Vec<DeadLetterId> {
    ns.iter().copied().map(DeadLetterId).collect()
}

async fn start_run<S: BulkRuns>(
    check: &str,
    store: &S,
    key: &str,
    action: Resolution,
    snapshot: &[DeadLetterId],
    by: &str,
    at: SystemTime,
) -> BulkRun {
    store
        .start_run(key, action, snapshot, by, at)
        .await
        .unwrap_or_else(|e| panic!("{check}: start_run {key:?}: {e}"))
}

async fn record_settled<S: BulkRuns>(
    check: &str,
    store: &S,
    run: BulkRunId,
    n: i64,
    outcome: &str,
) {
    store
        .record_settled(run, DeadLetterId(n), outcome)
        .await
        .unwrap_or_else(|e| panic!("{check}: record_settled {n} in run {run}: {e}"));
}

async fn bulk_run<S: BulkRuns>(check: &str, store: &S, run: BulkRunId) -> BulkRun {
    store
        .run(run)
        .await
        .unwrap_or_else(|e| panic!("{check}: run {run}: {e}"))
        .unwrap_or_else(|| panic!("{check}: run {run} not found"))
}

async fn bulk_runs<S: BulkRuns>(check: &str, store: &S, limit: u32) -> Vec<BulkRunId> {
    store
        .runs(limit)
        .await
        .unwrap_or_else(|e| panic!("{check}: runs({limit}): {e}"))
        .iter()
        .map(|run| run.id)
        .collect()
}

/// Every operator's tool sees the same runs: a start answers the run with its snapshot in
/// order and nothing settled; another start of the same key resumes that run unchanged, even
/// with other ids; another key is another run. Each letter is recorded once, so progress
/// counts letters, not records, and `pending` shrinks in snapshot order. A finished run is no
/// longer resumed: its key starts a new one. `runs` lists the newest first within its limit;
/// an unknown run is `None`.
pub async fn journals_bulk_runs_for_every_operator<S: BulkRuns>(store: S) {
    let check = "journals_bulk_runs_for_every_operator";
    let key = "replay status=pending_review queue=contract.bulk";
    let snapshot = ids(&[7, 3, 12, 5]);
    let alice = "jobsctl (alice)";
    let first = start_run(
        check,
        &store,
        key,
        Resolution::Replay,
        &snapshot,
        alice,
        time(1),
    )
    .await;
    assert_eq!(
        (
            first.key.as_str(),
            first.action,
            &first.ids,
            first.by.as_str(),
            truncate_ms(first.started_at),
            first.finished_at,
        ),
        (
            key,
            Resolution::Replay,
            &snapshot,
            alice,
            truncate_ms(time(1)),
            None
        ),
        "{check}: the new run, its snapshot in the order given"
    );
    assert_eq!(
        (first.total(), first.done(), first.is_finished()),
        (4, 0, false),
        "{check}: nothing settled yet"
    );
    assert_eq!(
        first.pending().collect::<Vec<_>>(),
        snapshot,
        "{check}: all pending, in order"
    );
    assert_eq!(
        store
            .unfinished(key)
            .await
            .unwrap_or_else(|e| panic!("{check}: unfinished: {e}"))
            .map(|run| run.id),
        Some(first.id),
        "{check}: the unfinished run of the key"
    );

    let resumed = start_run(
        check,
        &store,
        key,
        Resolution::Replay,
        &ids(&[99, 3]),
        "console (operator)",
        time(2),
    )
    .await;
    assert_eq!(
        at_ms_run(resumed),
        at_ms_run(first.clone()),
        "{check}: the same key resumes the unfinished run, unchanged, whatever the ids now"
    );
    let other_key = "discard status=pending_review queue=contract.bulk";
    let other = start_run(
        check,
        &store,
        other_key,
        Resolution::Discard,
        &ids(&[3]),
        alice,
        time(3),
    )
    .await;
    assert_ne!(other.id, first.id, "{check}: another key is another run");
    assert_eq!(
        (other.action, other.ids.clone()),
        (Resolution::Discard, ids(&[3])),
        "{check}: the other run's own action and snapshot"
    );

    record_settled(check, &store, first.id, 3, "done").await;
    record_settled(check, &store, first.id, 3, "conflict: discarded").await;
    record_settled(check, &store, first.id, 7, "already done").await;
    let progressed = bulk_run(check, &store, first.id).await;
    assert_eq!(
        (progressed.total(), progressed.done()),
        (4, 2),
        "{check}: a letter recorded twice counts once"
    );
    assert_eq!(
        progressed.settled,
        [
            (DeadLetterId(3), "done".to_owned()),
            (DeadLetterId(7), "already done".to_owned())
        ]
        .into(),
        "{check}: the first outcome of each letter is kept"
    );
    assert_eq!(
        progressed.pending().collect::<Vec<_>>(),
        ids(&[12, 5]),
        "{check}: pending shrinks, in snapshot order"
    );
    assert_eq!(
        bulk_run(check, &store, other.id).await.done(),
        0,
        "{check}: records belong to their run only"
    );
    let resumed = start_run(
        check,
        &store,
        key,
        Resolution::Replay,
        &snapshot,
        alice,
        time(4),
    )
    .await;
    assert_eq!(
        (resumed.id, resumed.settled.clone()),
        (first.id, progressed.settled.clone()),
        "{check}: a resumed run answers its progress"
    );

    record_settled(check, &store, first.id, 12, "done").await;
    record_settled(check, &store, first.id, 5, "not found").await;
    store
        .finish_run(first.id, time(5))
        .await
        .unwrap_or_else(|e| panic!("{check}: finish_run: {e}"));
    let finished = bulk_run(check, &store, first.id).await;
    assert_eq!(
        (
            finished.is_finished(),
            finished.finished_at.map(truncate_ms),
            finished.done(),
            finished.pending().count()
        ),
        (true, Some(truncate_ms(time(5))), 4, 0),
        "{check}: finished, every letter settled"
    );
    assert!(
        store
            .unfinished(key)
            .await
            .unwrap_or_else(|e| panic!("{check}: unfinished: {e}"))
            .is_none(),
        "{check}: a finished run is not the unfinished one of its key"
    );
    let again = start_run(
        check,
        &store,
        key,
        Resolution::Replay,
        &ids(&[40, 41]),
        alice,
        time(6),
    )
    .await;
    assert_ne!(
        again.id, first.id,
        "{check}: a finished run's key starts a new run"
    );
    assert_eq!(
        (again.ids.clone(), again.done(), again.is_finished()),
        (ids(&[40, 41]), 0, false),
        "{check}: the new run's own snapshot"
    );

    assert_eq!(
        bulk_runs(check, &store, 10).await,
        [again.id, other.id, first.id],
        "{check}: the newest runs first"
    );
    assert_eq!(
        bulk_runs(check, &store, 2).await,
        [again.id, other.id],
        "{check}: at most the limit"
    );
    let listed = store
        .runs(10)
        .await
        .unwrap_or_else(|e| panic!("{check}: runs: {e}"));
    assert_eq!(
        listed.iter().map(|run| run.done()).collect::<Vec<_>>(),
        [0, 0, 4],
        "{check}: listed runs carry their progress"
    );
    let unknown = BulkRunId(again.id.0 + 1_000);
    assert_eq!(
        store
            .run(unknown)
            .await
            .unwrap_or_else(|e| panic!("{check}: run {unknown}: {e}")),
        None,
        "{check}: an unknown run"
    );
}

/// A run with its times truncated to milliseconds, for comparison.
fn at_ms_run(mut run: BulkRun) -> BulkRun {
    run.started_at = truncate_ms(run.started_at);
    run.finished_at = run.finished_at.map(truncate_ms);
    run
}

/// Two operators starting the same run at once get the same run: at most one unfinished run
/// per key, whoever wins the race.
pub async fn concurrent_starts_of_a_key_get_one_run<S: BulkRuns>(store: S) {
    let check = "concurrent_starts_of_a_key_get_one_run";
    let key = "discard status=pending_review kind=contract.race";
    let (alices, bobs) = (ids(&[1, 2]), ids(&[1, 2, 3]));
    let (a, b) = tokio::join!(
        store.start_run(
            key,
            Resolution::Discard,
            &alices,
            "jobsctl (alice)",
            time(1)
        ),
        store.start_run(key, Resolution::Discard, &bobs, "console (bob)", time(1)),
    );
    let (a, b) = (
        a.unwrap_or_else(|e| panic!("{check}: alice's start: {e}")),
        b.unwrap_or_else(|e| panic!("{check}: bob's start: {e}")),
    );
    assert_eq!(at_ms_run(a), at_ms_run(b), "{check}: one run for both");
    assert_eq!(
        bulk_runs(check, &store, 10).await.len(),
        1,
        "{check}: no second run of the key"
    );
}

/// A record names a letter of a known run's snapshot: anything else is refused, so a caller
/// that mixed up its runs learns it rather than corrupting another run's progress.
pub async fn records_only_the_letters_of_a_known_run<S: BulkRuns>(store: S) {
    let check = "records_only_the_letters_of_a_known_run";
    let run = start_run(
        check,
        &store,
        "replay status=pending_review tenant=contract",
        Resolution::Replay,
        &ids(&[10, 11]),
        "contract",
        time(1),
    )
    .await;
    let foreign = store.record_settled(run.id, DeadLetterId(12), "done").await;
    assert!(
        matches!(foreign, Err(StoreError::Failed { .. })),
        "{check}: an id outside the snapshot: {foreign:?}"
    );
    let unknown = BulkRunId(run.id.0 + 1_000);
    let missing = store
        .record_settled(unknown, DeadLetterId(10), "done")
        .await;
    assert!(
        matches!(missing, Err(StoreError::Failed { .. })),
        "{check}: an unknown run: {missing:?}"
    );
    let unfinishable = store.finish_run(unknown, time(2)).await;
    assert!(
        matches!(unfinishable, Err(StoreError::Failed { .. })),
        "{check}: finishing an unknown run: {unfinishable:?}"
    );
    assert_eq!(
        bulk_run(check, &store, run.id).await.done(),
        0,
        "{check}: nothing was recorded"
    );
}

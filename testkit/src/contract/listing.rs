//! The listing for people ([`DeadLetterStore::listing`]) against a row the store cannot read:
//! for the stores whose rows can be written around the adapter (by SQL), each of which passes
//! the way to spoil a row.

use std::future::Future;

use jobs_core::{DeadLetterFilter, DeadLetterId, DeadLetterStore, NewDeadLetter};

use crate::fixtures;

/// Records three letters, has `spoil` make the middle one unreadable (say, a queue name with a
/// space, written by SQL), then checks that [`DeadLetterStore::listing`] returns all three in
/// order, the middle one as an `UnreadableLetter` whose reason names `column`; that
/// [`DeadLetterStore::list`] still refuses the page, naming the row; and that the other two
/// read alone. Before the row is spoiled, `listing` is `list` row for row.
pub async fn reads_around_an_unreadable_letter<S, F, Fut>(store: S, column: &str, spoil: F)
where
    S: DeadLetterStore,
    F: FnOnce(DeadLetterId) -> Fut,
    Fut: Future<Output = ()>,
{
    let check = "reads_around_an_unreadable_letter";
    let queue: jobs_core::QueueName = "listing.unreadable".parse().expect("a valid queue name");
    let mut ids = vec![];
    for n in 0..3u32 {
        let letter = NewDeadLetter {
            job_id: Some(jobs_core::JobId::generate()),
            queue: queue.clone(),
            consumer: None,
            tenant_id: Some(fixtures::tenant(1)),
            kind: Some(fixtures::kind("test.job")),
            correlation_id: None,
            payload: format!("{{\"n\":{n}}}").into_bytes(),
            attempts: 1,
            last_error: format!("failed {n}"),
            reason: None,
            dedup_key: None,
            at: std::time::SystemTime::now(),
        };
        let recorded = store.record(letter).await;
        ids.push(
            recorded
                .unwrap_or_else(|e| panic!("{check}: record: {e}"))
                .id(),
        );
    }
    let all = DeadLetterFilter::default();
    let listed = (store.listing(&all).await).unwrap_or_else(|e| panic!("{check}: listing: {e}"));
    let strict = (store.list(&all).await).unwrap_or_else(|e| panic!("{check}: list: {e}"));
    assert_eq!(
        listed,
        strict.into_iter().map(Ok).collect::<Vec<_>>(),
        "{check}: with every row readable, listing is list"
    );

    spoil(ids[1]).await;
    let listed = (store.listing(&all).await).unwrap_or_else(|e| panic!("{check}: listing: {e}"));
    let order: Vec<DeadLetterId> = listed
        .iter()
        .map(|row| row.as_ref().map_or_else(|u| u.id, |l| l.id))
        .collect();
    assert_eq!(order, ids, "{check}: every row listed, in order");
    assert!(
        listed[0].is_ok() && listed[2].is_ok(),
        "{check}: {listed:?}"
    );
    let unreadable = listed[1]
        .as_ref()
        .expect_err("the spoiled row is unreadable");
    assert!(
        unreadable.why.contains(column),
        "{check}: the reason names the column {column}: {}",
        unreadable.why
    );
    let refused = store.list(&all).await.expect_err("list refuses the page");
    assert!(
        refused.to_string().contains(&ids[1].to_string()),
        "{check}: list names the row: {refused}"
    );
    for id in [ids[0], ids[2]] {
        let letter = store.get(id).await;
        assert!(
            matches!(letter, Ok(Some(_))),
            "{check}: letter {id} reads alone: {letter:?}"
        );
    }
}
